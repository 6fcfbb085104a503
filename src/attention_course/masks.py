"""Boolean attention masks. One convention throughout the package: True = may attend.

A mask broadcasts to the attention scores (..., Tq, Tk): entry [i, j] says whether query i may look at key j.
Functions on (..., Tq, Tk) scores broadcast masks as PyTorch does. Multi-head modules read a mask by its rank:
(Tq, Tk) for every example and head, (B, Tq, Tk) per example and the same for every head (as Keras), (B, H, Tq, Tk)
per example and head (``nn.MultiheadAttention`` reads a 3-D mask as (B * H, Tq, Tk) instead).
``torch.nn.MultiheadAttention``'s ``attn_mask`` and ``key_padding_mask`` use the opposite convention
(True = NOT allowed): pass them ``~mask``.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch
from torch import Tensor

from .validation import check_combinable, check_int, check_lengths


def causal_mask(t_q: int, t_k: int | None = None, device=None) -> Tensor:
    """Boolean (Tq, Tk) mask in which query i may attend key j iff j <= i + (Tk - Tq).

    With Tq == Tk this is the lower triangle: each token sees itself and the past. With Tq < Tk the queries
    are the *last* Tq positions of the sequence (bottom-right aligned), as when decoding with a KV cache.
    """
    t_k = t_q if t_k is None else t_k
    return torch.ones(t_q, t_k, dtype=torch.bool, device=device).tril(diagonal=t_k - t_q)


def sliding_window_mask(t_q: int, t_k: int | None, window: int, device=None) -> Tensor:
    """Boolean (Tq, Tk) causal mask that also forgets: query i may attend key j iff 0 <= i' - j < window.

    i' = i + (Tk - Tq) is the query's position (bottom-right aligned, as :func:`causal_mask`). Each query sees
    itself and the window - 1 keys before it (Mistral, Gemma's local layers, GPT-OSS's sliding layers), so a layer
    never needs more than ``window`` cached keys; a window as long as the sequence is plain causal attention.
    """
    check_int(window, "window")
    t_k = t_q if t_k is None else t_k
    allowed = causal_mask(t_q, t_k, device)
    return allowed & ~allowed.tril(diagonal=t_k - t_q - window)  # drop the keys with j <= i' - window


def padding_mask(lengths: Sequence[int] | Tensor, t: int) -> Tensor:
    """Boolean (B, 1, 1, T) key mask: key j of sequence b may be attended iff j < lengths[b].

    The two singleton axes broadcast over heads and query positions of (B, H, Tq, Tk) scores.
    """
    lengths = torch.as_tensor(lengths)
    check_lengths(lengths, t)
    positions = torch.arange(t, device=lengths.device)  # (T,)
    return (positions < lengths[:, None])[:, None, None, :]  # (B, T) -> (B, 1, 1, T)


def combine_masks(*masks: Tensor | None) -> Tensor | None:
    """Logical AND of boolean masks with broadcasting; ``None`` entries are ignored, all ``None`` gives None.

    A key may be attended only if every mask allows it, e.g. ``combine_masks(causal_mask(T), padding_mask(lengths, T))``
    gives a (B, 1, T, T) mask.
    """
    masks = [m for m in masks if m is not None]
    if not masks:
        return None
    check_combinable(masks)
    return functools.reduce(torch.logical_and, masks)
