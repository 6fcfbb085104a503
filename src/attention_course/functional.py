"""Scaled dot-product attention: written out from scratch, and through PyTorch's fused kernel.

``softmax(q k^T / sqrt(Dk)) v`` for q (..., Tq, Dk), k (..., Tk, Dk), v (..., Tk, Dv). A boolean mask
broadcastable to (..., Tq, Tk) says which keys each query may attend (True = may attend); a query that may
attend no key gets all-zero weights and a zero output.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from .masks import causal_mask, combine_masks
from .validation import check_attention_inputs


def masked_softmax(scores: Tensor, mask: Tensor | None = None) -> Tensor:
    """Softmax over the keys (last axis) of (..., Tq, Tk) scores, giving masked keys exactly zero weight.

    Masked scores become -inf, and exp(-inf) = 0. A query that may attend no key has a row of -inf, whose
    softmax is 0/0 = NaN: filling the masked entries with 0 afterwards turns such rows into zeros and leaves
    the other rows untouched (their masked entries are 0 already). The backward pass stays NaN-free too,
    because masked_fill passes no gradient to the entries it fills.
    """
    if mask is None:
        return torch.softmax(scores, dim=-1)
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1).masked_fill(~mask, 0.0)


def scaled_dot_product_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, dropout_p: float = 0.0
) -> tuple[Tensor, Tensor]:
    """Attention from scratch: q (..., Tq, Dk), k (..., Tk, Dk), v (..., Tk, Dv) -> (out, weights).

    Args:
        mask: optional boolean tensor broadcastable to (..., Tq, Tk); True = may attend.
        dropout_p: probability of dropping each attention weight (the survivors are scaled by 1 / (1 - p)).
            Modules pass ``self.dropout if self.training else 0.0``.

    Returns:
        out (..., Tq, Dv) and weights (..., Tq, Tk); each row of weights sums to 1 (before dropout), or is
        all zeros where the mask allows no key.
    """
    check_attention_inputs(q, k, v, mask, dropout_p)
    # Dividing by sqrt(Dk) keeps the scores' variance near 1 whatever the width, so softmax does not saturate.
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (..., Tq, Tk)
    weights = masked_softmax(scores, mask)  # (..., Tq, Tk)
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p, training=True)
    return weights @ v, weights  # (..., Tq, Dv), (..., Tq, Tk)


def sdpa_fast(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, dropout_p: float = 0.0, is_causal: bool = False
) -> Tensor:
    """The same attention through ``torch.nn.functional.scaled_dot_product_attention`` (fused kernels).

    Shapes and mask convention as :func:`scaled_dot_product_attention` (PyTorch's boolean ``attn_mask`` also
    means True = may attend); returns only out (..., Tq, Dv), since fused kernels never form the weights.
    ``is_causal=True`` adds the bottom-right aligned :func:`~attention_course.masks.causal_mask`.
    """
    check_attention_inputs(q, k, v, mask, dropout_p)
    t_q, t_k = q.size(-2), k.size(-2)
    if is_causal and (mask is not None or t_q != t_k):
        # torch's is_causal is top-left aligned and refuses an extra attn_mask: build our causal mask instead.
        mask, is_causal = combine_masks(mask, causal_mask(t_q, t_k, device=q.device)), False
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal)
    if mask is None:
        return out  # (..., Tq, Dv)
    # Depending on the kernel, a query that may attend no key gets NaN: give it a zero output row instead.
    return torch.where(mask.any(dim=-1, keepdim=True), out, 0.0)  # (..., Tq, Dv)
