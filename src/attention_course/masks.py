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

from .validation import INTEGER_DTYPES, check_combinable, check_int, check_lengths


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


def prefix_lm_mask(t_q: int, t_k: int | None, prefix_lengths: int | Tensor, device=None) -> Tensor:
    """Causal mask whose first ``prefix_lengths`` keys every query may see: (Tq, Tk), or (B, 1, Tq, Tk) per example.

    A prefix LM (T5's and PaLI's "prefix" objective) reads its prompt bidirectionally and generates the rest
    causally: key j is allowed iff j < prefix or j <= i + (Tk - Tq) (bottom-right aligned, as :func:`causal_mask`).
    ``prefix_lengths`` is an int (one prefix for all) or a (B,) integer tensor (one per example). Chapter 15
    writes it as a FlexAttention ``mask_mod``.
    """
    t_k = t_q if t_k is None else t_k
    causal = causal_mask(t_q, t_k, device)
    if isinstance(prefix_lengths, int) and not isinstance(prefix_lengths, bool):
        check_int(prefix_lengths, "prefix_lengths", minimum=0)
        return causal | (torch.arange(t_k, device=device) < prefix_lengths)
    prefix = torch.as_tensor(prefix_lengths, device=device)
    check_lengths(prefix, t_k)
    in_prefix = torch.arange(t_k, device=device) < prefix[:, None]  # (B, Tk)
    return causal | in_prefix[:, None, None, :]  # (B, 1, Tq, Tk)


def document_mask(doc_ids: Tensor, t_q: int | None = None, causal: bool = True) -> Tensor:
    """Mask of several documents packed into one row: a query attends only keys of its own document.

    ``doc_ids`` (T,) or (B, T) integers, the document of each key position; the queries are the last ``t_q``
    positions (bottom-right aligned, as :func:`causal_mask`; default all T). Query i (at position i' = i + T - Tq)
    may attend key j iff doc_ids[i'] == doc_ids[j] and, if ``causal``, j <= i'. Returns (Tq, T), or (B, 1, Tq, T).
    Packing documents without padding is how real training runs fill their batches; chapter 15 writes this
    mask as a FlexAttention ``mask_mod``.
    """
    check_doc_ids(doc_ids)
    t_k = doc_ids.size(-1)
    t_q = t_k if t_q is None else t_q
    check_int(t_q, "t_q")
    if t_q > t_k:
        raise ValueError(f"t_q={t_q} is longer than the {t_k} document ids: the queries are the last positions")
    query_docs = doc_ids[..., t_k - t_q:, None]  # (..., Tq, 1)
    same = query_docs == doc_ids[..., None, :]  # (..., Tq, Tk)
    if causal:
        same = same & causal_mask(t_q, t_k, doc_ids.device)
    return same if doc_ids.dim() == 1 else same[:, None]  # (Tq, Tk) or (B, 1, Tq, Tk)


def check_doc_ids(doc_ids) -> None:
    """Raise unless doc_ids is a (T,) or (B, T) integer tensor with T >= 1."""
    if not isinstance(doc_ids, Tensor) or doc_ids.dtype not in INTEGER_DTYPES:
        got = doc_ids.dtype if isinstance(doc_ids, Tensor) else type(doc_ids).__name__
        raise TypeError(f"doc_ids must be an integer tensor (T,) or (B, T), got {got}")
    if doc_ids.dim() not in (1, 2) or doc_ids.size(-1) == 0:
        raise ValueError(f"doc_ids must be (T,) or (B, T) with T >= 1, got shape {tuple(doc_ids.shape)}")
