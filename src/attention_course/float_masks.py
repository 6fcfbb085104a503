"""Additive float masks: the other way to hide keys, used by PyTorch's SDPA and
nn.MultiheadAttention.

A boolean mask (this course: True = may attend) *selects* scores; a float mask
is *added* to them before the
softmax: 0 where attending is allowed, -inf (or a large negative number) where
it is not. PyTorch reads ``attn_mask`` by its dtype: a bool tensor is a
selection (for SDPA True = may attend, for nn.MultiheadAttention True = NOT
allowed), a float tensor is always added. Shapes: masks broadcast to the scores
(B, H, Tq, Tk).
"""

from __future__ import annotations

import torch


def additive_mask(
    mask: torch.Tensor, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """The boolean ``mask`` (True = may attend) as an additive float mask: 0.0
    where allowed, -inf where hidden.

    Adding it to the scores before the softmax gives the hidden keys exactly
    zero weight; SDPA's and nn.MultiheadAttention's float ``attn_mask`` are
    added this way. Same shape as ``mask``.
    """
    if not isinstance(mask, torch.Tensor):
        raise TypeError(
            f"mask must be a torch.Tensor, got {type(mask).__name__}"
        )
    if mask.dtype != torch.bool:
        raise TypeError(
            "mask must be a boolean tensor (True = may attend), got dtype "
            f"{mask.dtype}"
        )
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(
            f"dtype must be a floating-point torch.dtype, got {dtype!r}"
        )
    return torch.zeros(
        mask.shape, dtype=dtype, device=mask.device
    ).masked_fill(~mask, float("-inf"))
