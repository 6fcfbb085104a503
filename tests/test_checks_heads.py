"""Checks of chapter 3's head reshapes: split_heads and merge_heads. Correct code in several styles passes with one
line; each planted wrong answer (PLANTED) gets its own code."""


import attention_course as ac
from attention_course import checks


def split_forgot_reshape(x, num_heads):
    return x


CORRECT = [
    # (check, a correct implementation in some style)
    (checks.check_split_heads, ac.split_heads),
    (checks.check_merge_heads, ac.merge_heads),
]


PLANTED = [
    # (check, a wrong implementation, the code it must get)
    (checks.check_split_heads, split_forgot_reshape, "wrong-shape"),
    (checks.check_merge_heads, lambda x: x.permute(0, 2, 3, 1).reshape(x.shape[0], x.shape[2], -1),
     "merge-heads-wrong-order"),
]
