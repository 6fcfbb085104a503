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
