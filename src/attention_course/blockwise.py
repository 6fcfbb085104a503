"""Blockwise ("flash-style") attention in plain PyTorch: exact attention
without a (Tq, Tk) score matrix.

The naive implementation ``softmax(q k^T / sqrt(Dk)) v`` materialises the
scores and the weights, two (..., Tq, Tk) tensors: memory grows with T^2.
:func:`blockwise_attention` instead walks over tiles: for each block of queries
it loops over blocks of keys/values and keeps, per query row, only

* ``m``   (..., bq, 1)  the running maximum of the scores seen so far,
* ``l``   (..., bq, 1)  the running sum of ``exp(score - m)`` (the softmax
  denominator),
* ``acc`` (..., bq, Dv) the running sum of ``exp(score - m) * v`` (the
  unnormalised output).

When a new key block raises the maximum, ``l`` and ``acc`` are rescaled by
``exp(m_old - m_new)``: the online softmax's accumulator
(:func:`attention_course.online_softmax.merge`), which ring attention (chapter
13) merges with too; after the last block the output row is ``acc / l``
(:func:`~attention_course.online_softmax.finish`). The largest temporary is one
(..., bq, bk) tile, so the extra memory is O(T) (the output and the statistics)
instead of O(T^2). This is the algorithm of FlashAttention; real kernels also
fuse the loop into one GPU/CPU kernel, which plain PyTorch cannot do, so this
module is about the *memory* argument and exactness.

Causal masks are bottom-right aligned (query i may attend key j iff j <= i +
(Tk - Tq)), as everywhere in the course. With ``is_causal=True`` key blocks
that lie entirely in the future of a query block are never computed (about half
the work for Tq == Tk), and only the tiles on the diagonal need a mask at all.
"""

from __future__ import annotations

import ctypes
import os
import re
from pathlib import Path

import torch

from . import functional, online_softmax
from .functional import apply_score_mod
from .tiles import causal_block_range
from .validation import broadcast_shape, check_attention_inputs


def _batch_shape(q, k, v, mask) -> tuple[int, ...]:
    """Validate the inputs (clear errors naming the shapes) and return the
    broadcast batch shape (...)."""
    check_attention_inputs(q, k, v, mask)
    return broadcast_shape(q.shape[:-2], k.shape[:-2], v.shape[:-2])


def blockwise_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    is_causal: bool = False,
    block_size: int = 256,
    q_block_size: int | None = None,
    *,
    scale: float | None = None,
    score_mod=None,
    return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Exact scaled dot-product attention computed tile by tile, never storing
    all (Tq, Tk) scores.

    Args:
        q: (..., Tq, Dk) queries, e.g. (B, H, Tq, Dh).
        k: (..., Tk, Dk) keys.
        v: (..., Tk, Dv) values.
        mask: optional boolean, broadcastable to (..., Tq, Tk); True = may
            attend. It is only ever sliced tile by tile (a broadcast (Tq, Tk)
            or (B, 1, 1, Tk) mask costs nothing extra).
        is_causal: apply the bottom-right aligned causal mask (combined with
            ``mask`` if both are given); key tiles entirely in the future are
            skipped.
        block_size: number of keys per tile (bk).
        q_block_size: number of queries per tile (bq); defaults to
            ``block_size``.
        scale, score_mod: as :func:`~attention_course.functional.attend` (the
            mod sees each tile's indices).
        return_lse: also return the log-sum-exp of each row (..., Tq), ``max +
            log(sum)`` of the online softmax.

    Returns:
        (..., Tq, Dv) output, equal to the reference ``softmax(q k^T /
        sqrt(Dk)) v`` up to float rounding. Query rows that may attend no key
        get a zero output row (and lse -inf).
    """
    batch = _batch_shape(q, k, v, mask)
    bk = int(block_size)
    bq = bk if q_block_size is None else int(q_block_size)
    if bk < 1 or bq < 1:
        raise ValueError(
            f"block sizes must be >= 1, got block_size={block_size}, "
            f"q_block_size={q_block_size}"
        )
    t_q, t_k, d_v = q.shape[-2], k.shape[-2], v.shape[-1]
    dtype = q.dtype

    scale = q.shape[-1] ** -0.5 if scale is None else scale
    k_t = k.transpose(-1, -2)  # (..., Dk, Tk), a view
    if mask is not None:
        mask = mask.expand(*batch, t_q, t_k)  # a view: nothing is copied
    out = torch.zeros((*batch, t_q, d_v), dtype=dtype, device=q.device)
    lse = torch.full(
        (*batch, t_q), float("-inf"), dtype=dtype, device=q.device
    )
    k_index = torch.arange(t_k, device=q.device)
    q_index = torch.arange(t_q, device=q.device)

    for q0 in range(0, t_q, bq):
        q1 = min(q0 + bq, t_q)
        k_stop, k_free = (
            causal_block_range(q0, q1, t_q, t_k) if is_causal else (t_k, t_k)
        )
        if k_stop == 0:
            # every query of this block is fully masked: output rows stay 0
            continue
        # (..., bq, Dk); (q / sqrt(Dk)) k^T == q k^T / sqrt(Dk)
        q_blk = q[..., q0:q1, :] * scale
        # running max, sum, sum of p @ v
        rows = online_softmax.init((*batch, q1 - q0), d_v, dtype, q.device)
        for k0 in range(0, k_stop, bk):
            k1 = min(k0 + bk, k_stop)
            # (..., bq, bk): the only score tile in memory
            s = torch.matmul(q_blk, k_t[..., k0:k1])
            # v has more batch entries than q and k: give the tile the full
            # shape
            if s.shape[:-2] != batch:
                s = s.expand(*batch, *s.shape[-2:]).clone()
            if score_mod is not None:
                s = apply_score_mod(score_mod, s, q0, k0)
            tile_mask = None
            if is_causal and k1 > k_free:  # the tile crosses the diagonal
                # (bq, bk)
                tile_mask = k_index[k0:k1] <= (
                    q_index[q0:q1, None] + (t_k - t_q)
                )
            if mask is not None:
                user = mask[..., q0:q1, k0:k1]
                tile_mask = user if tile_mask is None else user & tile_mask
            if tile_mask is not None:
                s.masked_fill_(~tile_mask, float("-inf"))
            # in place: rescale what came before, add this tile
            online_softmax.merge(rows, s, v[..., k0:k1, :])
        out[..., q0:q1, :] = online_softmax.finish(rows)
        lse[..., q0:q1] = online_softmax.log_sum_exp(rows)
    return (out, lse) if return_lse else out


def blockwise_backend(
    q, k, v, mask, *, is_causal, scale, score_mod, dropout_p, need_lse
):
    """:func:`blockwise_attention` as
    :func:`~attention_course.functional.attend`'s backend "blockwise"."""
    if dropout_p > 0.0:
        raise ValueError(
            "backend 'blockwise' has no dropout (it never forms the "
            "weights): use backend='eager' "
            "or 'sdpa' to train with attention dropout"
        )
    out, lse = blockwise_attention(
        q,
        k,
        v,
        mask,
        is_causal,
        scale=scale,
        score_mod=score_mod,
        return_lse=True,
    )
    return out, None, lse


functional.register("blockwise", blockwise_backend)


def naive_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask=None,
    is_causal: bool = False,
):
    """The textbook matmul-softmax-matmul, materialising the (..., Tq, Tk)
    scores (for comparisons/benchmarks):
    :func:`~attention_course.functional.attend`'s eager backend.

    Same semantics as :func:`blockwise_attention` (bottom-right causal mask,
    fully masked rows -> 0).
    """
    return functional.attend(q, k, v, mask, is_causal=is_causal)[0]


def _rss_bytes() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf(
        "SC_PAGE_SIZE"
    )


def measure_peak_memory(fn, *args, **kwargs):
    """Run ``fn(*args, **kwargs)`` once and measure the extra memory it needed
    at its peak (Linux only).

    torch allocates outside Python's allocator (``tracemalloc`` sees nothing),
    so this reads the process's resident
    memory: it returns memory freed earlier to the OS (glibc's
    ``malloc_trim``), resets the kernel's peak-RSS counter
    (``/proc/self/clear_refs``), runs ``fn``, and returns ``(result, peak RSS
    during the call - RSS before it)`` in bytes. Expect noise of a few MiB
    (memory the allocators keep around); large temporaries such as a (B, H, T,
    T) score tensor are measured well.
    """
    # give memory freed earlier back to the OS first, so that fn's allocations
    # show up as new RSS
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # pragma: no cover - not glibc
        pass
    try:
        before = _rss_bytes()
        # peak RSS (VmHWM) := current RSS
        Path("/proc/self/clear_refs").write_text("5")
    except OSError as err:  # pragma: no cover - not Linux
        raise RuntimeError(
            "measure_peak_memory needs Linux (/proc/self/clear_refs)"
        ) from err
    result = fn(*args, **kwargs)
    peak_kib = int(
        re.search(
            r"VmHWM:\s+(\d+)\s+kB", Path("/proc/self/status").read_text()
        ).group(1)
    )
    return result, max(0, peak_kib * 1024 - before)
