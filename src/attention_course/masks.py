"""Boolean attention masks. One convention throughout the package: True = may
attend.

Each pattern is written once, as a mask function of indices ``mod(b, h, q_idx,
kv_idx) -> bool`` (FlexAttention's ``mask_mod``, chapter 15): :func:`causal`,
:func:`sliding_window`, :func:`padding`, :func:`prefix_lm`, :func:`document`,
:func:`chunked`, combined by :func:`and_masks` / :func:`or_masks`.
:func:`materialize` evaluates one on every pair and gives chapter 4's tensor;
chapter 4's builders (:func:`causal_mask`, ...) remain the teaching face, and
the tests assert that each equals ``materialize`` of its function.

A mask broadcasts to the attention scores (..., Tq, Tk): entry [i, j] says
whether query i may look at key j. Functions on (..., Tq, Tk) scores broadcast
masks as PyTorch does. Multi-head modules read a mask by its rank: (Tq, Tk) for
every example and head, (B, Tq, Tk) per example and the same for every head (as
Keras), (B, H, Tq, Tk) per example and head (``nn.MultiheadAttention`` reads a
3-D mask as (B * H, Tq, Tk) instead). ``torch.nn.MultiheadAttention``'s
``attn_mask`` and ``key_padding_mask`` use the opposite convention (True = NOT
allowed): pass them ``~mask``.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from .validation import (
    INTEGER_DTYPES,
    check_combinable,
    check_int,
    check_lengths,
)

MaskMod = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]


def index_grid(
    batch: int,
    heads: int,
    t_q: int,
    t_k: int,
    *,
    q_start: int = 0,
    k_start: int = 0,
    device=None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Index tensors b (B, 1, 1, 1), h (1, H, 1, 1), q_idx (1, 1, Tq, 1),
    kv_idx (1, 1, 1, Tk) that broadcast to (B, H, Tq, Tk): what a mask function
    or a score mod reads for every pair at once (a tile starts at q_start,
    k_start)."""
    starts = (0, 0, q_start, k_start)
    return tuple(
        torch.arange(start, start + n, device=device).view(
            [n if a == axis else 1 for a in range(4)]
        )
        for axis, (start, n) in enumerate(
            zip(starts, (batch, heads, t_q, t_k), strict=True)
        )
    )


def causal_mask(t_q: int, t_k: int | None = None, device=None) -> Tensor:
    """Boolean (Tq, Tk) mask in which query i may attend key j iff j <= i + (Tk
    - Tq).

    With Tq == Tk this is the lower triangle: each token sees itself and the
    past. With Tq < Tk the queries are the *last* Tq positions of the sequence
    (bottom-right aligned), as when decoding with a KV cache.
    """
    t_k = t_q if t_k is None else t_k
    return torch.ones(t_q, t_k, dtype=torch.bool, device=device).tril(
        diagonal=t_k - t_q
    )


def sliding_window_mask(
    t_q: int, t_k: int | None, window: int, device=None
) -> Tensor:
    """Boolean (Tq, Tk) causal mask that also forgets: query i may attend key j
    iff 0 <= i' - j < window.

    i' = i + (Tk - Tq) is the query's position (bottom-right aligned, as
    :func:`causal_mask`). Each query sees itself and the window - 1 keys before
    it (Mistral, Gemma's local layers, GPT-OSS's sliding layers), so a layer
    never needs more than ``window`` cached keys; a window as long as the
    sequence is plain causal attention.
    """
    check_int(window, "window")
    t_k = t_q if t_k is None else t_k
    allowed = causal_mask(t_q, t_k, device)
    # drop the keys with j <= i' - window
    return allowed & ~allowed.tril(diagonal=t_k - t_q - window)


def padding_mask(lengths: Sequence[int] | Tensor, t: int) -> Tensor:
    """Boolean (B, 1, 1, T) key mask: key j of sequence b may be attended iff j
    < lengths[b].

    The two singleton axes broadcast over heads and query positions of (B, H,
    Tq, Tk) scores.
    """
    lengths = torch.as_tensor(lengths)
    check_lengths(lengths, t)
    positions = torch.arange(t, device=lengths.device)  # (T,)
    # (B, T) -> (B, 1, 1, T)
    return (positions < lengths[:, None])[:, None, None, :]


def combine_masks(*masks: Tensor | None) -> Tensor | None:
    """Logical AND of boolean masks with broadcasting; ``None`` entries are
    ignored, all ``None`` gives None.

    A key may be attended only if every mask allows it, e.g.
    ``combine_masks(causal_mask(T), padding_mask(lengths, T))`` gives a (B, 1,
    T, T) mask.
    """
    masks = [m for m in masks if m is not None]
    if not masks:
        return None
    check_combinable(masks)
    return functools.reduce(torch.logical_and, masks)


def prefix_lm_mask(
    t_q: int, t_k: int | None, prefix_lengths: int | Tensor, device=None
) -> Tensor:
    """Causal mask whose first ``prefix_lengths`` keys every query may see:
    (Tq, Tk), or (B, 1, Tq, Tk) per example.

    A prefix LM (T5's and PaLI's "prefix" objective) reads its prompt
    bidirectionally and generates the rest
    causally: key j is allowed iff j < prefix or j <= i + (Tk - Tq)
    (bottom-right aligned, as :func:`causal_mask`). ``prefix_lengths`` is an
    int (one prefix for all) or a (B,) integer tensor (one per example).
    Chapter 15 writes it as a FlexAttention ``mask_mod``.
    """
    t_k = t_q if t_k is None else t_k
    causal = causal_mask(t_q, t_k, device)
    if isinstance(prefix_lengths, int) and not isinstance(
        prefix_lengths, bool
    ):
        check_int(prefix_lengths, "prefix_lengths", minimum=0)
        return causal | (torch.arange(t_k, device=device) < prefix_lengths)
    prefix = torch.as_tensor(prefix_lengths, device=device)
    check_lengths(prefix, t_k)
    in_prefix = torch.arange(t_k, device=device) < prefix[:, None]  # (B, Tk)
    return causal | in_prefix[:, None, None, :]  # (B, 1, Tq, Tk)


def document_mask(
    doc_ids: Tensor, t_q: int | None = None, causal: bool = True
) -> Tensor:
    """Mask of several documents packed into one row: a query attends only keys
    of its own document.

    ``doc_ids`` (T,) or (B, T) integers, the document of each key position; the
    queries are the last ``t_q`` positions (bottom-right aligned, as
    :func:`causal_mask`; default all T). Query i (at position i' = i + T - Tq)
    may attend key j iff doc_ids[i'] == doc_ids[j] and, if ``causal``, j <= i'.
    Returns (Tq, T), or (B, 1, Tq, T). Packing documents without padding is how
    real training runs fill their batches; chapter 15 writes this mask as a
    FlexAttention ``mask_mod``.
    """
    check_doc_ids(doc_ids)
    t_k = doc_ids.size(-1)
    t_q = t_k if t_q is None else t_q
    check_int(t_q, "t_q")
    if t_q > t_k:
        raise ValueError(
            f"t_q={t_q} is longer than the {t_k} document ids: the queries "
            "are the last positions"
        )
    query_docs = doc_ids[..., t_k - t_q :, None]  # (..., Tq, 1)
    same = query_docs == doc_ids[..., None, :]  # (..., Tq, Tk)
    if causal:
        same = same & causal_mask(t_q, t_k, doc_ids.device)
    # (Tq, Tk) or (B, 1, Tq, Tk)
    return same if doc_ids.dim() == 1 else same[:, None]


def check_doc_ids(doc_ids) -> None:
    """Raise unless doc_ids is a (T,) or (B, T) integer tensor with T >= 1."""
    if not isinstance(doc_ids, Tensor) or doc_ids.dtype not in INTEGER_DTYPES:
        got = (
            doc_ids.dtype
            if isinstance(doc_ids, Tensor)
            else type(doc_ids).__name__
        )
        raise TypeError(
            f"doc_ids must be an integer tensor (T,) or (B, T), got {got}"
        )
    if doc_ids.dim() not in (1, 2) or doc_ids.size(-1) == 0:
        raise ValueError(
            "doc_ids must be (T,) or (B, T) with T >= 1, got shape "
            f"{tuple(doc_ids.shape)}"
        )


# ---------------------------------------------------------------- mask
# functions (b, h, q_idx, kv_idx) -> bool The arguments are integer tensors
# (0-d inside a FlexAttention kernel), so a mod uses tensor operations, & | and
# torch.where, never a Python ``if`` on them. Queries are the last Tq
# positions: query i sits at i + (Tk - Tq).


def query_key_lengths(t_q, t_k) -> tuple[int, int]:
    """(Tq, Tk), Tk defaulting to Tq; both checked to be ints >= 1."""
    t_k = t_q if t_k is None else t_k
    check_int(t_q, "t_q")
    check_int(t_k, "t_k")
    return t_q, t_k


def causal(t_q: int, t_k: int | None = None) -> MaskMod:
    """Query i may attend key j iff j <= i + (Tk - Tq): :func:`causal_mask` as
    a function of indices."""
    t_q, t_k = query_key_lengths(t_q, t_k)
    offset = t_k - t_q

    def causal_mod(b, h, q_idx, kv_idx):
        return kv_idx <= q_idx + offset

    return causal_mod


def sliding_window(window: int, t_q: int, t_k: int | None = None) -> MaskMod:
    """Query i (at i' = i + Tk - Tq) may attend key j iff 0 <= i' - j < window:
    :func:`sliding_window_mask` (Mistral, Gemma's local layers), the band of
    chapter 9's tiles."""
    check_int(window, "window")
    t_q, t_k = query_key_lengths(t_q, t_k)
    offset = t_k - t_q

    def window_mod(b, h, q_idx, kv_idx):
        distance = q_idx + offset - kv_idx  # how far back the key is
        return (distance >= 0) & (distance < window)

    return window_mod


def padding(lengths: Tensor, t_k: int) -> MaskMod:
    """Key j of example b may be attended iff j < lengths[b]:
    :func:`padding_mask`. ``lengths`` (B,) integers."""
    lengths = torch.as_tensor(lengths)
    check_int(t_k, "t_k")
    check_lengths(lengths, t_k)

    def padding_mod(b, h, q_idx, kv_idx):
        return kv_idx < lengths[b]

    return padding_mod


def prefix_lm(
    prefix_lengths: int | Tensor, t_q: int, t_k: int | None = None
) -> MaskMod:
    """Causal, plus the first ``prefix_lengths`` keys for every query (an int,
    or (B,) integers: one prefix per example): :func:`prefix_lm_mask`, the
    causal mask opened on a prompt."""
    t_q, t_k = query_key_lengths(t_q, t_k)
    is_causal = causal(t_q, t_k)
    if isinstance(prefix_lengths, int) and not isinstance(
        prefix_lengths, bool
    ):
        check_int(prefix_lengths, "prefix_lengths", minimum=0)

        def prefix_mod(b, h, q_idx, kv_idx):
            return (kv_idx < prefix_lengths) | is_causal(b, h, q_idx, kv_idx)

        return prefix_mod
    prefix = torch.as_tensor(prefix_lengths)
    check_lengths(prefix, t_k)

    def prefix_per_example_mod(b, h, q_idx, kv_idx):
        return (kv_idx < prefix[b]) | is_causal(b, h, q_idx, kv_idx)

    return prefix_per_example_mod


def document(
    doc_ids: Tensor, t_q: int | None = None, is_causal: bool = True
) -> MaskMod:
    """Documents packed into one row: query i may attend key j iff both belong
    to the same document (and, with ``is_causal``, j <= i'):
    :func:`document_mask`. ``doc_ids`` (T,) or (B, T) integers, the document of
    each key position; the queries are the last ``t_q``."""
    check_doc_ids(doc_ids)
    t_k = doc_ids.size(-1)
    t_q, _ = query_key_lengths(t_k if t_q is None else t_q, t_k)
    if t_q > t_k:
        raise ValueError(
            f"t_q={t_q} is longer than the {t_k} document ids: the queries "
            "are the last positions"
        )
    offset = t_k - t_q

    # the query's document is read at ITS position, i' = i + offset
    def same_document(b, q_idx, kv_idx):
        if doc_ids.dim() == 1:
            return doc_ids[q_idx + offset] == doc_ids[kv_idx]
        return doc_ids[b, q_idx + offset] == doc_ids[b, kv_idx]

    def document_mod(b, h, q_idx, kv_idx):
        same = same_document(b, q_idx, kv_idx)
        return same & (kv_idx <= q_idx + offset) if is_causal else same

    return document_mod


def chunked(chunk: int, t_q: int, t_k: int | None = None) -> MaskMod:
    """Causal within fixed chunks of ``chunk`` positions (Llama 4's local
    layers): query i (at i') may attend key j iff j <= i' and both lie in the
    same chunk, i' // chunk == j // chunk."""
    check_int(chunk, "chunk")
    t_q, t_k = query_key_lengths(t_q, t_k)
    offset = t_k - t_q

    def chunked_mod(b, h, q_idx, kv_idx):
        position = q_idx + offset
        return (kv_idx <= position) & (kv_idx // chunk == position // chunk)

    return chunked_mod


def and_masks(*mods: MaskMod) -> MaskMod:
    """A pair is allowed iff every mod allows it (:func:`combine_masks` for
    mask functions)."""
    return _combined(operator.and_, mods, "and_masks")


def or_masks(*mods: MaskMod) -> MaskMod:
    """A pair is allowed iff some mod allows it (a prefix-LM is causal or-ed
    with the prefix)."""
    return _combined(operator.or_, mods, "or_masks")


def _combined(op, mods, name: str) -> MaskMod:
    if not mods or not all(callable(m) for m in mods):
        raise TypeError(f"{name} needs one or more mask_mod functions")

    def combined_mod(b, h, q_idx, kv_idx):
        return functools.reduce(op, (mod(b, h, q_idx, kv_idx) for mod in mods))

    return combined_mod


def tensor_mod(mask: Tensor) -> MaskMod:
    """A boolean mask tensor broadcastable to (B, H, Tq, Tk) as a mask function
    (it indexes the tensor)."""
    # (B or 1, H or 1, Tq, Tk)
    full = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))

    def tensor_mask_mod(b, h, q_idx, kv_idx):
        return full[b % full.size(0), h % full.size(1), q_idx, kv_idx]

    return tensor_mask_mod


def materialize(
    mod: MaskMod, batch: int, heads: int, t_q: int, t_k: int, device=None
) -> Tensor:
    """The (B, H, Tq, Tk) boolean mask a mask function describes, evaluated on
    every pair at once (broadcasting):
    chapter 4's tensor of chapter 15's mod."""
    for name, n in (
        ("batch", batch),
        ("heads", heads),
        ("t_q", t_q),
        ("t_k", t_k),
    ):
        check_int(n, name)
    allowed = mod(*index_grid(batch, heads, t_q, t_k, device=device))
    if not isinstance(allowed, Tensor) or allowed.dtype != torch.bool:
        raise TypeError(
            "a mask_mod must return a boolean tensor (True = may attend), "
            "got "
            f"{getattr(allowed, 'dtype', type(allowed).__name__)}"
        )
    return allowed.expand(batch, heads, t_q, t_k)
