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
    (checks.check_split_heads, lambda x, num_heads: x.unflatten(-1, (num_heads, -1)).transpose(1, 2)),
    (checks.check_merge_heads, lambda x: x.transpose(1, 2).flatten(2)),
]


PLANTED = [
    # (check, a wrong implementation, the code it must get)
    (checks.check_split_heads, split_forgot_reshape, "wrong-shape"),
    (checks.check_merge_heads, lambda x: x.permute(0, 2, 3, 1).reshape(x.shape[0], x.shape[2], -1),
     "merge-heads-wrong-order"),
    (checks.check_split_heads, lambda x, num_heads: x.view(x.shape[0], x.shape[1], num_heads, -1),
     "heads-split-without-transpose"),  # (B, T, H, Dh): the transpose forgotten
    (checks.check_split_heads, lambda x, num_heads: x.unflatten(-1, (-1, num_heads)).permute(0, 3, 1, 2),
     "wrong-output"),  # heads interleaved: head h gets features h, h + H, ...
    (checks.check_merge_heads, lambda x: x.reshape(x.shape[0], x.shape[2], -1), "merge-heads-wrong-order"),
    (checks.check_merge_heads, lambda x: x.transpose(1, 2).reshape(x.shape[0], -1, x.shape[-1]), "wrong-shape"),
]
