"""Ring attention (Liu et al. 2023): context parallelism, each of P ranks
holding T / P positions.

(Megatron-LM calls this split of attention over the sequence *context
parallelism*; its *sequence parallelism*, Korthikanti et al. 2022, splits only
the layers outside attention along the sequence.)

Rank r keeps its block of queries for the whole computation. The key/value
blocks travel around the ring: at step s rank r holds the keys and values of
rank (r - s) mod P, attends its queries to them, sends them on to rank r + 1
and receives the next block from rank r - 1. After P steps every query has seen
every key, although no rank ever held more than two key/value blocks (the one
it computes with and the one arriving).

The partial results are merged exactly as chapter 9 merges key tiles, with the
same accumulator (:func:`attention_course.online_softmax.merge`): a running
maximum and sum per query row, and the running weighted sum of values rescaled
by ``alpha = exp(old_max - new_max)`` whenever a block brings a larger maximum.

Causal attention: query position i may attend key position j iff j <= i, in
GLOBAL positions, so a rank must offset its local indices by where its blocks
start (:func:`block_causal_mask`). Blocks entirely in the future of a query
block are skipped. With the contiguous layout (rank r holds positions r*T/P ..
(r+1)*T/P - 1) rank r then computes r + 1 blocks and rank P - 1 does P times
the work of rank 0. The zig-zag layout cuts the sequence into 2P chunks and
gives rank r chunks r and 2P - 1 - r (one early, one late): every rank computes
2P + 1 of the (T / 2P)^2 tiles. :func:`causal_work_per_rank` counts the work of
these layouts and of the striped one (rank r holds positions r, r + P, r + 2P,
...), which balances the entries the mask keeps but not whole tiles.

:func:`ring_attention` runs on a real process group (point-to-point sends);
:func:`ring_attention_simulated` runs the same steps for all ranks in one
process (fast, and differentiable with autograd). Lengths must divide
evenly (T by P, or by 2P for zig-zag): nothing is padded.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor

from .. import online_softmax
from ..tiles import SKIP, block_state
from ..validation import check_attention_inputs, check_int, check_world_size

LAYOUTS = ("contiguous", "zigzag")


# -----------------------------------------------------------------------------
# Which positions each rank holds
# -----------------------------------------------------------------------------


def sequence_layout(
    seq_len: int, world_size: int, layout: str = "contiguous"
) -> list[list[tuple[int, int]]]:
    """The chunks of global positions [start, stop) that each rank holds, in
    the order it stores them.

    ``"contiguous"``: rank r holds one chunk of T / P positions. ``"zigzag"``:
    2P chunks of T / (2P); rank r holds chunks r and 2P - 1 - r. Raises
    ValueError unless the chunks are whole (nothing is padded).
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    check_int(seq_len, "seq_len")
    check_world_size(world_size)
    chunks = world_size if layout == "contiguous" else 2 * world_size
    if seq_len < chunks or seq_len % chunks:
        raise ValueError(
            f"sequence length T={seq_len} is not divisible by {chunks} "
            f"({layout} layout, world_size="
            f"{world_size}); pad the sequence (and mask the padding) to a "
            f"multiple of {chunks}"
        )
    size = seq_len // chunks
    if layout == "contiguous":
        return [[(r * size, (r + 1) * size)] for r in range(world_size)]
    return [
        [
            (r * size, (r + 1) * size),
            ((chunks - 1 - r) * size, (chunks - r) * size),
        ]
        for r in range(world_size)
    ]


def kv_source(rank: int, step: int, world_size: int) -> int:
    """The rank whose key/value block ``rank`` holds at ``step`` of the ring:
    its own at step 0, then the one its left neighbour held a step earlier,
    (rank - step) mod P."""
    return (rank - step) % world_size


def shard_sequence(x: Tensor, chunks: list[tuple[int, int]]) -> Tensor:
    """(..., T, F) -> (..., T / P, F): one rank's positions, its chunks side by
    side."""
    return torch.cat([x[..., start:stop, :] for start, stop in chunks], dim=-2)


def unshard_sequence(
    parts: list[Tensor], layout: list[list[tuple[int, int]]]
) -> Tensor:
    """The inverse of :func:`shard_sequence` over all ranks: P tensors (..., T
    / P, F) -> (..., T, F)."""
    pieces = []
    for part, chunks in zip(parts, layout, strict=True):
        offset = 0
        for start, stop in chunks:
            pieces.append(
                (start, part[..., offset : offset + stop - start, :])
            )
            offset += stop - start
    return torch.cat(
        [piece for _, piece in sorted(pieces, key=lambda item: item[0])],
        dim=-2,
    )


# -----------------------------------------------------------------------------
# One rank's computation: merge key/value blocks into running statistics
# -----------------------------------------------------------------------------


def block_causal_mask(
    q_start: int, q_len: int, k_start: int, k_len: int, device=None
) -> Tensor:
    """(q_len, k_len) causal mask of a query chunk starting at GLOBAL position
    ``q_start`` against a key chunk starting at ``k_start``: True where key
    position <= query position."""
    q_pos = torch.arange(q_start, q_start + q_len, device=device)
    k_pos = torch.arange(k_start, k_start + k_len, device=device)
    return k_pos[None, :] <= q_pos[:, None]  # (q_len, k_len)


@dataclass
class RankStats:
    """What one rank did: ``bytes_sent`` (keys and values handed to the ring),
    ``tiles`` (query-chunk x key-chunk score tiles computed; skipped ones not
    counted), ``score_entries`` (per batch entry and head), ``largest_tile``
    (entries of the largest score tile in memory, per batch entry and head)."""

    bytes_sent: int = 0
    tiles: int = 0
    score_entries: int = 0
    largest_tile: int = 0


def attend_tile(
    rows: online_softmax.Accumulator,
    q_blk: Tensor,
    k_blk: Tensor,
    v_blk: Tensor,
    q0: int,
    k0: int,
    causal: bool,
) -> online_softmax.Accumulator:
    """Merge one tile: scaled queries (..., bq, Dk) at global positions q0..,
    keys (..., bk, Dk) and values (..., bk, Dv) at k0... Only a tile that
    crosses the causal diagonal needs a mask."""
    scores = q_blk @ k_blk.transpose(-2, -1)  # (..., bq, bk)
    bq, bk = scores.shape[-2:]
    if causal and k0 + bk - 1 > q0:  # some key lies after some query
        scores = scores.masked_fill(
            ~block_causal_mask(q0, bq, k0, bk, device=scores.device),
            float("-inf"),
        )
    return online_softmax.merge(rows, scores, v_blk)


def attend_block(
    rows: list[online_softmax.Accumulator],
    q: Tensor,
    q_chunks,
    k: Tensor,
    v: Tensor,
    k_chunks,
    causal: bool,
    stats: RankStats,
) -> list[online_softmax.Accumulator]:
    """Attend a rank's queries q (..., n, Dk), holding the global chunks
    ``q_chunks`` ([start, stop) each), to one key/value block k (..., m, Dk), v
    (..., m, Dv) holding ``k_chunks``; returns the updated row states (one per
    query chunk). Causal: a chunk pair whose keys all lie after its queries is
    skipped.
    """
    scale = 1.0 / math.sqrt(q.size(-1))
    q_offsets, k_offsets = _offsets(q_chunks), _offsets(k_chunks)
    out = []
    for state, (q0, q1), qo in zip(rows, q_chunks, q_offsets, strict=True):
        q_blk = q[..., qo : qo + q1 - q0, :] * scale  # (..., bq, Dk)
        for (k0, k1), ko in zip(k_chunks, k_offsets, strict=True):
            # every key after the last query: nothing visible, skip the tile
            if causal and k0 >= q1:
                continue
            state = attend_tile(
                state,
                q_blk,
                k[..., ko : ko + k1 - k0, :],
                v[..., ko : ko + k1 - k0, :],
                q0,
                k0,
                causal,
            )
            stats.tiles += 1
            stats.score_entries += (q1 - q0) * (k1 - k0)
            stats.largest_tile = max(stats.largest_tile, (q1 - q0) * (k1 - k0))
        out.append(state)
    return out


def _offsets(chunks) -> list[int]:
    """Where each chunk starts in the rank's local tensor (its chunks are
    stored side by side)."""
    return list(
        itertools.accumulate(
            (stop - start for start, stop in chunks), initial=0
        )
    )[:-1]


def _finish(rows: list[online_softmax.Accumulator]) -> Tensor:
    # (..., n, Dv)
    return torch.cat([online_softmax.finish(state) for state in rows], dim=-2)


def _init(q: Tensor, q_chunks, d_v: int) -> list[online_softmax.Accumulator]:
    """One accumulator per query chunk (..., stop - start rows): nothing seen
    yet."""
    return [
        online_softmax.init(
            (*q.shape[:-2], stop - start), d_v, q.dtype, q.device
        )
        for start, stop in q_chunks
    ]


# -----------------------------------------------------------------------------
# All ranks in one process, and the real thing on a process group
# -----------------------------------------------------------------------------


def _check_inputs(q: Tensor, k: Tensor, v: Tensor) -> None:
    check_attention_inputs(q, k, v)
    if q.size(-2) != k.size(-2):
        raise ValueError(
            "ring attention is self-attention over one sequence: query "
            f"length {q.size(-2)} != key "
            f"length {k.size(-2)}"
        )


def ring_attention_simulated(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    world_size: int,
    causal: bool = False,
    layout: str = "contiguous",
    stats: list | None = None,
) -> Tensor:
    """Ring attention with all P ranks simulated in one process: q (..., T,
    Dk), k (..., T, Dk), v (..., T, Dv) -> (..., T, Dv), equal to ordinary
    attention (with a causal mask if ``causal``). Differentiable.

    The ranks run the same steps as :func:`ring_attention`: rank r holds the
    chunks ``sequence_layout(...)[r]`` and at step s attends to the key/value
    block of rank (r - s) mod P. If ``stats`` is a list, it receives one
    :class:`RankStats` per rank (bytes that rank would send, tiles computed).
    """
    _check_inputs(q, k, v)
    chunks = sequence_layout(q.size(-2), world_size, layout)
    qs, ks, vs = ([shard_sequence(x, c) for c in chunks] for x in (q, k, v))
    rank_stats = [RankStats() for _ in range(world_size)]
    rows = [_init(qs[r], chunks[r], v.size(-1)) for r in range(world_size)]
    for step in range(world_size):
        for r in range(world_size):
            # whose keys and values rank r holds at this step
            src = kv_source(r, step, world_size)
            rows[r] = attend_block(
                rows[r],
                qs[r],
                chunks[r],
                ks[src],
                vs[src],
                chunks[src],
                causal,
                rank_stats[r],
            )
            if step < world_size - 1:  # pass the block on to rank r + 1
                rank_stats[r].bytes_sent += ks[src].nbytes + vs[src].nbytes
    if stats is not None:
        stats.extend(rank_stats)
    return unshard_sequence([_finish(r) for r in rows], chunks)


def check_same_shapes_on_all_ranks(*tensors: Tensor) -> None:
    """Raise ValueError on every rank if some rank's tensors differ in shape
    from rank 0's (naming the rank)."""
    shapes = torch.tensor(
        [[len(t.shape), *t.shape] for t in tensors], dtype=torch.int64
    ).flatten()
    sizes = torch.tensor([shapes.numel()])
    all_sizes = [torch.zeros_like(sizes) for _ in range(dist.get_world_size())]
    dist.all_gather(all_sizes, sizes)
    if len({int(s) for s in all_sizes}) > 1:
        raise ValueError(
            "ranks pass different numbers of dimensions: "
            f"{[int(s) for s in all_sizes]}"
        )
    gathered = [torch.zeros_like(shapes) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, shapes)
    for rank, other in enumerate(gathered):
        if not torch.equal(other, gathered[0]):
            raise ValueError(
                f"mismatched shapes across ranks: rank {rank} has "
                f"{_shape_text(other, len(tensors))}, "
                f"rank 0 has {_shape_text(gathered[0], len(tensors))}"
            )


def _shape_text(flat: Tensor, count: int) -> str:
    values, out = flat.tolist(), []
    for _ in range(count):
        ndim, values = values[0], values[1:]
        out.append(tuple(values[:ndim]))
        values = values[ndim:]
    return ", ".join(map(str, out))


def _pass_on(
    k: Tensor, v: Tensor, stats: RankStats
) -> tuple[list, Tensor, Tensor]:
    """Start sending (k, v) to rank + 1 and receiving the next block from rank
    - 1; returns (requests, k, v)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    k_next, v_next = torch.empty_like(k), torch.empty_like(v)
    ops = [
        dist.P2POp(dist.isend, k, (rank + 1) % world),
        dist.P2POp(dist.isend, v, (rank + 1) % world),
        dist.P2POp(dist.irecv, k_next, (rank - 1) % world),
        dist.P2POp(dist.irecv, v_next, (rank - 1) % world),
    ]
    stats.bytes_sent += k.nbytes + v.nbytes
    return dist.batch_isend_irecv(ops), k_next, v_next


def ring_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    causal: bool = False,
    layout: str = "contiguous",
    stats: RankStats | None = None,
) -> Tensor:
    """This rank's part of ring attention on the default process group.

    Args:
        q, k, v: this rank's positions, ``shard_sequence(x, sequence_layout(T,
        P, layout)[rank])``:
            (..., T / P, Dk), (..., T / P, Dk), (..., T / P, Dv); the same
            shapes on every rank.
        causal: query position i attends key positions j <= i (global
            positions).
        stats: if given, filled with what this rank sent and computed.

    Returns:
        (..., T / P, Dv): the attention output of this rank's queries. Not
        differentiable across ranks (point-to-point sends carry no gradient);
        gradients are checked on :func:`ring_attention_simulated`.
    """
    _check_inputs(q, k, v)
    check_same_shapes_on_all_ranks(q, k, v)
    rank, world = dist.get_rank(), dist.get_world_size()
    chunks = sequence_layout(q.size(-2) * world, world, layout)
    stats = RankStats() if stats is None else stats
    rows = _init(q, chunks[rank], v.size(-1))
    k, v = k.contiguous(), v.contiguous()
    for step in range(world):
        # the transfer overlaps the compute
        pending = _pass_on(k, v, stats) if step < world - 1 else None
        rows = attend_block(
            rows,
            q,
            chunks[rank],
            k,
            v,
            chunks[kv_source(rank, step, world)],
            causal,
            stats,
        )
        if pending is not None:
            requests, k, v = pending
            for request in requests:
                request.wait()
    return _finish(rows)


# -----------------------------------------------------------------------------
# Formulas: communication, memory and work per rank
# -----------------------------------------------------------------------------


def ring_bytes_per_rank(
    batch_heads: int,
    seq_len: int,
    d_k: int,
    d_v: int,
    world_size: int,
    bytes_per_element: int = 4,
) -> int:
    """Bytes each rank sends: P - 1 key/value blocks of T / P positions, for
    ``batch_heads`` = B * H rows."""
    return (
        (world_size - 1)
        * batch_heads
        * (seq_len // world_size)
        * (d_k + d_v)
        * bytes_per_element
    )


def ring_memory_per_rank(
    batch_heads: int,
    seq_len: int,
    d_k: int,
    d_v: int,
    world_size: int,
    layout: str = "contiguous",
    bytes_per_element: int = 4,
) -> int:
    """Bytes of attention tensors one rank holds at its peak: its queries,
    output accumulator and statistics (max, sum), two key/value blocks (the one
    in use, the one arriving) and one score tile."""
    n = seq_len // world_size
    tile = n if layout == "contiguous" else n // 2
    numbers = n * d_k + n * d_v + 2 * n + 2 * n * (d_k + d_v) + tile * tile
    return batch_heads * numbers * bytes_per_element


@dataclass
class CausalWork:
    """One rank's causal work over the whole ring, per batch entry and head:
    ``computed`` score entries when every tile that holds a visible (query,
    key) pair is computed whole, and ``needed`` entries (those the causal mask
    keeps)."""

    computed: int
    needed: int


WORK_LAYOUTS = (*LAYOUTS, "striped")


def rank_tiles(
    seq_len: int, world_size: int, layout: str
) -> list[list[Tensor]]:
    """The tiles each rank stores, as 1-D tensors of global positions: one
    chunk for ``"contiguous"``, chunks r and 2P - 1 - r for ``"zigzag"``, and
    for ``"striped"`` one strided block r, r + P, r + 2P, ... (counted here
    only: :func:`ring_attention` runs the first two)."""
    if layout == "striped":
        # the same size checks as the contiguous layout
        sequence_layout(seq_len, world_size)
        return [
            [torch.arange(r, seq_len, world_size)] for r in range(world_size)
        ]
    return [
        [torch.arange(start, stop) for start, stop in rank]
        for rank in sequence_layout(seq_len, world_size, layout)
    ]


def causal_work_per_rank(
    seq_len: int, world_size: int, layout: str = "contiguous"
) -> list[CausalWork]:
    """What each rank computes in causal ring attention: every (query tile, key
    tile) pair of the ring that holds at least one visible pair is computed
    whole (the diagonal ones then masked), the others skipped."""
    if layout not in WORK_LAYOUTS:
        raise ValueError(
            f"layout must be one of {WORK_LAYOUTS}, got {layout!r}"
        )
    tiles = rank_tiles(seq_len, world_size, layout)
    # every key tile visits every rank
    key_tiles = [tile for rank in tiles for tile in rank]
    work = []
    for rank in tiles:
        computed = needed = 0
        for q_tile in rank:
            for k_tile in key_tiles:
                # (tile, tile) causal pairs of the two shards
                visible = k_tile[None, :] <= q_tile[:, None]
                needed += int(visible.sum())
                computed += (
                    visible.numel() if block_state(visible) != SKIP else 0
                )
        work.append(CausalWork(computed, needed))
    return work


def causal_tiles_per_rank(
    world_size: int, layout: str = "contiguous"
) -> list[int]:
    """Score tiles each rank computes in causal ring attention (tiles of T/P x
    T/P positions for the contiguous layout, of T/2P x T/2P for zig-zag): r + 1
    for rank r, or 2P + 1 for every rank."""
    if layout == "contiguous":
        return [r + 1 for r in range(world_size)]
    return [2 * world_size + 1] * world_size
