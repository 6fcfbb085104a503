"""Which tiles a mask needs: chapter 9's idea, in one place for blockwise
attention (9), ring attention (13), FlexAttention's block masks (15), the
Triton kernel (16) and the checks.

Attention cut into tiles of ``bq`` queries by ``bk`` keys needs a tile only if
the mask allows one of its pairs, and needs no mask inside a tile whose pairs
are all allowed. Each tile is in one of three states: :data:`SKIP` (0, no
allowed pair: never computed), :data:`PARTIAL` (1, computed and masked inside),
:data:`FULL` (2, computed without a mask). The last row and column of tiles may
be shorter; a pair outside the matrix counts as neither allowed nor hidden.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor
from torch.nn import functional as F

from .masks import MaskMod, materialize
from .validation import check_int

SKIP, PARTIAL, FULL = 0, 1, 2


def tile_states(
    mask: MaskMod | Tensor,
    t_q: int,
    t_k: int,
    bq: int,
    bk: int | None = None,
    *,
    batch: int = 1,
    heads: int = 1,
) -> Tensor:
    """(..., n_q, n_k) integers, one per tile: 0 skip, 1 partial, 2 full.

    ``mask`` is a mask function of indices (:mod:`attention_course.masks`;
    evaluated for ``batch`` examples and ``heads`` heads, giving (B, H, n_q,
    n_k)) or a boolean tensor (..., Tq, Tk) (giving (..., n_q, n_k)).
    """
    for name, n in (("t_q", t_q), ("t_k", t_k), ("bq", bq)):
        check_int(n, name)
    bk = bq if bk is None else bk
    check_int(bk, "bk")
    allowed = (
        materialize(mask, batch, heads, t_q, t_k) if callable(mask) else mask
    )
    if (
        not isinstance(allowed, Tensor)
        or allowed.dtype != torch.bool
        or allowed.shape[-2:] != (t_q, t_k)
    ):
        raise TypeError(
            f"mask must be a mask function or a boolean (..., {t_q}, {t_k}) "
            "tensor, got "
            f"{getattr(allowed, 'shape', type(allowed).__name__)}"
        )
    # a tile with an allowed pair is computed
    some = _per_tile(allowed, bq, bk, outside=False).any(dim=(-3, -1))
    # ... and needs no mask if all are
    every = _per_tile(allowed, bq, bk, outside=True).all(dim=(-3, -1))
    return some.long() + every.long()


def _per_tile(allowed: Tensor, bq: int, bk: int, outside: bool) -> Tensor:
    """(..., n_q, bq, n_k, bk): the mask padded with ``outside`` to whole
    tiles, one tile per (n_q, n_k)."""
    t_q, t_k = allowed.shape[-2:]
    n_q, n_k = math.ceil(t_q / bq), math.ceil(t_k / bk)
    padded = F.pad(
        allowed, (0, n_k * bk - t_k, 0, n_q * bq - t_q), value=outside
    )
    return padded.reshape(*allowed.shape[:-2], n_q, bq, n_k, bk)


def tiles_computed(states: Tensor) -> int:
    """How many tiles are computed (partial or full), summed over every example
    and head."""
    return int((states != SKIP).sum())


def computed_tiles(states: Tensor) -> list[tuple[int, int]]:
    """(query tile, key tile) indices of the computed tiles of (n_q, n_k)
    states, row by row."""
    return [tuple(index) for index in (states != SKIP).nonzero().tolist()]


def block_state(allowed: Tensor) -> int:
    """The state of one tile from its boolean block of pairs (any shape, e.g.
    the pairs of two ring shards)."""
    return SKIP if not allowed.any() else FULL if allowed.all() else PARTIAL


def causal_block_range(
    q_start: int, q_stop: int, t_q: int, t_k: int
) -> tuple[int, int]:
    """Keys that a block of queries [q_start, q_stop) may see under the
    bottom-right causal mask.

    Returns ``(k_stop, k_free)``: keys ``j >= k_stop`` are invisible to every
    query of the block (those key blocks are skipped), keys ``j < k_free`` are
    visible to every query of the block (no mask needed there).
    """
    offset = t_k - t_q
    # last query sees j <= q_stop - 1 + offset
    k_stop = max(0, min(t_k, q_stop + offset))
    # first query sees j <= q_start + offset
    k_free = max(0, min(t_k, q_start + offset + 1))
    return k_stop, k_free


def kernel_key_range(
    start_m: int,
    t_q: int,
    t_k: int,
    block_m: int,
    block_n: int,
    is_causal: bool,
    window: int | None = None,
    length: int | None = None,
) -> tuple[int, int, int, int]:
    """Chapter 16's kernel bounds (its ``_key_range``, in Python) for the
    query tile at ``start_m``: ``(lo, full_lo, full_hi, hi)``. Keys [lo, hi)
    hold every key a row of the tile may see; the key tiles in [full_lo,
    full_hi) are seen whole by every row; lo, full_lo and full_hi are
    multiples of block_n."""
    # the positions of the tile's first and last query among the keys
    first = start_m + t_k - t_q
    last = first + block_m - 1
    hi = free_hi = t_k if length is None else min(length, t_k)
    lo = free_lo = 0
    if is_causal:
        hi = min(hi, max(last + 1, 0))
        free_hi = min(free_hi, max(first + 1, 0))
    if window is not None:
        lo, free_lo = max(first - window + 1, 0), max(last - window + 1, 0)
    lo = lo // block_n * block_n
    full_lo = max(-(-free_lo // block_n) * block_n, lo)
    return lo, full_lo, max(free_hi // block_n * block_n, full_lo), hi


def kernel_tile_states(
    t_q: int,
    t_k: int,
    block_m: int,
    block_n: int,
    is_causal: bool,
    window: int | None = None,
    length: int | None = None,
) -> Tensor:
    """(n_q, n_k) states of what chapter 16's forward kernel does with each
    tile, by its own bounds: :data:`SKIP` never loaded, :data:`FULL` loaded
    without a mask (in [full_lo, full_hi)), :data:`PARTIAL` loaded with the
    mask (a mask's edge, the ragged end). :func:`tile_states` gives the states
    the mask itself asks for."""
    rows = []
    for start_m in range(0, t_q, block_m):
        lo, full_lo, full_hi, hi = kernel_key_range(
            start_m, t_q, t_k, block_m, block_n, is_causal, window, length
        )
        rows.append(
            [
                FULL
                if full_lo <= start_n < full_hi
                else PARTIAL
                if lo <= start_n < hi
                else SKIP
                for start_n in range(0, t_k, block_n)
            ]
        )
    return torch.tensor(rows, dtype=torch.long)


def key_tiles_visited(
    query_tile: int,
    t_q: int,
    t_k: int,
    block_m: int,
    block_n: int,
    is_causal: bool,
    window: int | None = None,
    length: int | None = None,
) -> int:
    """How many key tiles chapter 16's forward program of query tile
    ``query_tile`` loads."""
    lo, _, _, hi = kernel_key_range(
        query_tile * block_m,
        t_q,
        t_k,
        block_m,
        block_n,
        is_causal,
        window,
        length,
    )
    return max(0, -(-(hi - lo) // block_n))
