"""Checks of chapter 4's masks: the causal mask and the padding mask. Correct code in several styles passes with one
line; each planted wrong answer (PLANTED) gets its own code."""

import numpy as np
import torch

import attention_course as ac
from attention_course import checks
from attention_impls import causal_numpy


def causal_float(t_q, t_k=None):
    return torch.ones(t_q, t_q if t_k is None else t_k).tril(diagonal=(t_k or t_q) - t_q)


def causal_square_only(t_q, t_k=None):
    return np.tril(np.ones((t_q, t_q), dtype=bool))


CORRECT = [
    # (check, a correct implementation in some style)
    (checks.check_causal_mask, causal_numpy),
    (checks.check_causal_mask, ac.causal_mask),
    (checks.check_padding_mask, ac.padding_mask),
]


PLANTED = [
    # (check, a wrong implementation, the code it must get)
    (checks.check_causal_mask, causal_float, "wrong-type"),
    (checks.check_causal_mask, causal_square_only, "wrong-shape"),
    (checks.check_causal_mask, lambda t_q, t_k=None: ac.causal_mask(t_q, t_k)[None], "wrong-shape"),
    (checks.check_padding_mask, lambda lengths, t: ~ac.padding_mask(lengths, t), "mask-inverted"),
    (checks.check_padding_mask, lambda lengths, t: ac.padding_mask(lengths, t).float(), "wrong-type"),
    (checks.check_padding_mask, lambda lengths, t: torch.ones(2, 7, dtype=torch.bool), "wrong-shape"),
]
