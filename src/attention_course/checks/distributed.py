"""Checks of chapter 13: the row-parallel output projection, the ring merge step, the causal mask of a ring block.

The ranks are simulated in one process (a list with one entry per rank; the all-reduce is a sum over the list),
so the checks take milliseconds; the chapter runs the same computations on real processes.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .. import numpy_ref
from .diagnosis import diagnose
from .questions import choice_question, number_question
from .runner import (
    DEFAULT_TIMEOUT,
    as_array,
    call,
    display_name,
    fail,
    run_check,
    shape_text,
)

# ----------------------------------------------------------------------------------------------------------
# Exercise: the row-parallel output projection (where the all-reduce goes)
# ----------------------------------------------------------------------------------------------------------

# (B, T, D, H, P): D / P features (H / P heads) per rank
_ROW_PARALLEL_CASES = [(2, 3, 8, 4, 2), (1, 5, 12, 6, 3), (2, 4, 16, 8, 4), (3, 2, 6, 2, 1), (1, 3, 16, 4, 2)]


def _row_parallel_variants(heads: list[np.ndarray], w_o: np.ndarray, b_o: np.ndarray):
    """(code, detail, thunk) for the known mistakes; the thunks return (output, None)."""
    p, width = len(heads), heads[0].shape[-1]
    cols = [slice(r * width, (r + 1) * width) for r in range(p)]
    summed = sum(heads)  # all-reduce of the heads themselves
    out = []
    for r in range(p):
        detail = (f"rank {r} summed the heads of all ranks, (B, T, D / P), and then applied its own slice of W_o" if
                  p > 1 else "")
        out.append(("allreduce-before-output-projection", detail, lambda r=r: (summed @ w_o[:, cols[r]].T + b_o,
                                                                               None)))
    right = sum(h @ w_o[:, c].T for h, c in zip(heads, cols, strict=True))
    out.append(("tp-bias-per-rank", str(p), lambda: (right + p * b_o, None)))
    wrong_slice = sum(h @ w_o[c, :] for h, c in zip(heads, cols, strict=True))  # rows of weight: OUTPUT features of W_o
    out.append(("row-parallel-wrong-slice", "", lambda: (wrong_slice + b_o, None)))
    return out


def check_row_parallel_output(fn, *, timeout: float = DEFAULT_TIMEOUT):
    """Check ``fn(local_heads, w_o, b_o)`` -> the output of tensor-parallel attention, (B, T, D).

    ``local_heads`` is a list of P float64 torch tensors (B, T, D / P): rank r's merged heads (heads
    r*H/P .. (r+1)*H/P - 1). ``w_o`` (D, D) and ``b_o`` (D,) are the output projection in nn.Linear's layout
    (y = x @ w_o.T + b_o). The all-reduce is simulated by a sum over the ranks. Diagnoses
    ``[allreduce-before-output-projection]``, ``[tp-bias-per-rank]``, ``[row-parallel-wrong-slice]``.
    """
    label = "row_parallel_output"

    def body():
        rng = np.random.default_rng(13)
        for i, (b, t, d, h, p) in enumerate(_ROW_PARALLEL_CASES, 1):
            heads = [rng.standard_normal((b, t, d // p)) for _ in range(p)]
            w_o, b_o = rng.standard_normal((d, d)) / math.sqrt(d), rng.standard_normal(d)
            case = (f"case {i} of {len(_ROW_PARALLEL_CASES)}: P={p} ranks, H={h} heads, local_heads = {p} tensors "
                    f"{shape_text((b, t, d // p))}, w_o {shape_text(w_o.shape)}")
            args = {"local_heads": [torch.from_numpy(x) for x in heads], "w_o": torch.from_numpy(w_o),
                    "b_o": torch.from_numpy(b_o)}
            out = as_array(call(fn, args, label), "result", case)
            merged = np.concatenate(heads, axis=-1)  # (B, T, D): what one process would have
            expected = merged @ w_o.T + b_o
            if out.shape == expected.shape and np.allclose(out, expected, atol=1e-10, rtol=1e-8):
                continue
            diagnose(out, None, _row_parallel_variants(heads, w_o, b_o), case, expected, None, atol=1e-10,
                     rtol=1e-8)
        return (f"✓ {display_name(fn, label)}: {len(_ROW_PARALLEL_CASES)} random cases (P from 1 to 4 ranks) give "
                "the single-process output")

    run_check(body, timeout)


# ----------------------------------------------------------------------------------------------------------
# Exercise: the ring merge step
# ----------------------------------------------------------------------------------------------------------

# (B, H, n queries, block size, P blocks, Dk, Dv, causal, kind): "large" scores (hundreds to thousands: exp of a
# raw score overflows float64 past 709), or a "future" block first, in which every key is masked (m stays -inf)
_MERGE_CASES = [(2, 2, 4, 4, 3, 8, 6, False, ""), (1, 3, 3, 3, 4, 4, 4, True, ""), (2, 1, 5, 5, 2, 6, 3, False, ""),
                (1, 2, 4, 4, 4, 8, 8, True, ""), (1, 1, 2, 2, 1, 4, 5, False, ""),
                (2, 2, 4, 4, 3, 8, 6, False, "large"), (1, 2, 3, 3, 3, 4, 4, True, "future")]
_LARGE = 100.0  # the scale of the "large" case's scores


def _merge_reference(m, l, acc, s, v, rescale=True):
    """The right merge (rescale=True) or the merge without rescaling, float64 NumPy."""
    m_new = np.maximum(m, s.max(axis=-1, keepdims=True))
    m_safe = np.where(np.isfinite(m_new), m_new, 0.0)
    p = np.exp(s - m_safe)
    alpha = np.exp(m - m_safe) if rescale else np.ones_like(m)
    return m_new, l * alpha + p.sum(axis=-1, keepdims=True), acc * alpha + p @ v


def _merge_no_rescale(m, l, acc, s, v):
    """The new block's terms relative to the new maximum, added to l and acc WITHOUT rescaling them."""
    return _merge_reference(m, l, acc, s, v, rescale=False)


def _merge_own_max(m, l, acc, s, v):
    """Each block exponentiated against its OWN maximum, the block sums added as they are."""
    m_blk = s.max(axis=-1, keepdims=True)
    m_safe = np.where(np.isfinite(m_blk), m_blk, 0.0)
    p = np.exp(s - m_safe)
    return np.maximum(m, m_blk), l + p.sum(axis=-1, keepdims=True), acc + p @ v


def _run_merges(merge, blocks, shape_rows, d_v):
    m = np.full((*shape_rows, 1), -np.inf)
    l, acc = np.zeros((*shape_rows, 1)), np.zeros((*shape_rows, d_v))
    for s, v in blocks:
        m, l, acc = merge(m, l, acc, s, v)
    with np.errstate(all="ignore"):  # a NaN or infinite l or acc stays in the output, to be diagnosed
        return np.where(l == 0, 0.0, acc / np.where(l == 0, 1.0, l))


def _merge_case(rng, b, h, n, blk, p, dk, dv, causal, kind=""):
    """Queries of the LAST rank and the P key/value blocks it receives, in ring order (its own block first, then
    the earlier ranks' blocks from the nearest back), with later blocks given larger scores so the max moves;
    ``kind``: "large" scales the scores by _LARGE, "future" first brings a block that is all in the queries'
    future (every score -inf, as for a rank whose ring starts with a later rank's keys)."""
    q = rng.standard_normal((b, h, n, dk))
    ks = [rng.standard_normal((b, h, blk, dk)) * (1 + j) for j in range(p)]
    vs = [rng.standard_normal((b, h, blk, dv)) for _ in range(p)]
    blocks, order = [], [p - 1, *range(p - 2, -1, -1)]  # at step s the last rank holds block (P - 1 - s)
    for step, src in enumerate(order):
        s = q @ ks[src].swapaxes(-1, -2) / math.sqrt(dk)
        if causal and src == p - 1:  # its own block: the diagonal block of the causal mask
            s = np.where(numpy_ref.causal_mask(n, blk), s, -np.inf)
        blocks.append((s * (1 + step) * (_LARGE if kind == "large" else 1.0), vs[src]))  # the max must move
    if kind == "future":
        blocks.insert(0, (np.full((b, h, n, blk), -np.inf), rng.standard_normal((b, h, blk, dv))))
    return blocks


_KIND_TEXT = {"": "", "large": f", scores up to {_LARGE:g} times larger (hundreds to thousands)",
              "future": ", the first block entirely masked (-inf) for every query"}
_NOT_FINITE = {"large": "merge-without-max", "future": "merge-nan-on-empty-row"}


def check_ring_merge(fn, *, timeout: float = DEFAULT_TIMEOUT):
    """Check the ring merge step ``fn(m, l, acc, scores, v_block)`` -> ``(m, l, acc)``.

    Float64 torch tensors: ``m`` (..., n, 1) running maximum (``-inf`` before any block), ``l`` (..., n, 1)
    running sum of exp(score - m), ``acc`` (..., n, Dv) running sum of exp(score - m) * value; ``scores``
    (..., n, bk) one block of (already scaled, possibly -inf masked) scores and ``v_block`` (..., bk, Dv).
    The checker merges the blocks of a simulated ring one after the other and compares ``acc / l`` with
    softmax attention over all of them, on scores of every scale (up to thousands: exp of a raw score overflows)
    and with a first block in which every key is masked. Diagnoses ``[merge-without-rescale]``,
    ``[merge-without-max]`` and ``[merge-nan-on-empty-row]``.
    """
    label = "merge_block"

    def student(m, l, acc, s, v):
        args = {"m": torch.from_numpy(m), "l": torch.from_numpy(l), "acc": torch.from_numpy(acc),
                "scores": torch.from_numpy(s), "v_block": torch.from_numpy(v)}
        result = call(fn, args, label)
        if not isinstance(result, (tuple, list)) or len(result) != 3:
            raise fail("wrong-type", "Return the three updated statistics as a tuple (m, l, acc).")
        return tuple(as_array(x, name, label) for x, name in zip(result, ("m", "l", "acc"), strict=True))

    def body():
        rng = np.random.default_rng(31)
        for i, (b, h, n, blk, p, dk, dv, causal, kind) in enumerate(_MERGE_CASES, 1):
            blocks = _merge_case(rng, b, h, n, blk, p, dk, dv, causal, kind)
            case = (f"case {i} of {len(_MERGE_CASES)}: {len(blocks)} key/value blocks of {blk} keys, scores "
                    f"{shape_text(blocks[0][0].shape)}{', causal' if causal else ''}{_KIND_TEXT[kind]}")
            out = _run_merges(student, blocks, (b, h, n), dv)
            scores = np.concatenate([s for s, _ in blocks], axis=-1)
            values = np.concatenate([v for _, v in blocks], axis=-2)
            expected = numpy_ref.softmax(scores) @ values
            if out.shape == expected.shape and np.allclose(out, expected, atol=1e-9, rtol=1e-7):
                continue
            if out.shape == expected.shape and not np.isfinite(out).all() and kind:
                raise fail(_NOT_FINITE[kind], detail=f"{np.mean(~np.isfinite(out)):.0%} of the outputs are NaN or "
                           "infinite", case=case)
            rows = (b, h, n)
            candidates = [
                ("merge-without-rescale", "acc and l are not multiplied by exp(m_old - m_new)",
                 lambda blocks=blocks, rows=rows, dv=dv: (_run_merges(_merge_no_rescale, blocks, rows, dv), None)),
                ("merge-without-rescale", "each block is exponentiated against its own maximum and simply added",
                 lambda blocks=blocks, rows=rows, dv=dv: (_run_merges(_merge_own_max, blocks, rows, dv), None)),
            ]
            diagnose(out, None, candidates, case, expected, None, atol=1e-9, rtol=1e-7)
        return (f"✓ {display_name(fn, label)}: {len(_MERGE_CASES)} simulated rings (1 to 4 blocks, causal and not, "
                "scores up to thousands, a first block with every key masked) give softmax attention over all the "
                "keys")

    run_check(body, timeout)


# ----------------------------------------------------------------------------------------------------------
# Exercise: the causal mask of one block pair
# ----------------------------------------------------------------------------------------------------------

_MASK_CASES = [(4, 3), (2, 5), (3, 1), (1, 4)]  # (P ranks, positions per rank)


def check_ring_causal_mask(fn, *, timeout: float = DEFAULT_TIMEOUT):
    """Check ``fn(q_rank, k_rank, block)`` -> the (block, block) boolean causal mask between the queries of rank
    ``q_rank`` and the keys of rank ``k_rank``, contiguous layout (rank r holds positions r*block ..
    (r+1)*block - 1); True = may attend. Every rank pair is compared with the block of the full causal mask.
    Diagnoses ``[causal-wrong-rank-offset]`` and ``[causal-excludes-diagonal]``.
    """
    label = "ring_causal_mask"

    def body():
        for p, blk in _MASK_CASES:
            full = numpy_ref.causal_mask(p * blk, p * blk)
            for qr in range(p):
                for kr in range(p):
                    case = f"P={p} ranks of {blk} positions, q_rank={qr}, k_rank={kr}"
                    got = call(fn, {"q_rank": qr, "k_rank": kr, "block": blk}, label)
                    out = as_array(got, "result", case, kind="bool")
                    expected = full[qr * blk : (qr + 1) * blk, kr * blk : (kr + 1) * blk]
                    if out.shape == expected.shape and np.array_equal(out, expected):
                        continue
                    _diagnose_mask(out, expected, qr, kr, blk, case)
        return (f"✓ {display_name(fn, label)}: every (q_rank, k_rank) pair of {len(_MASK_CASES)} rings matches the "
                "block of the full causal mask")

    run_check(body, timeout)


def _diagnose_mask(out, expected, qr, kr, blk, case):
    local = np.tril(np.ones((blk, blk), dtype=bool))
    q_pos = np.arange(qr * blk, (qr + 1) * blk)[:, None]
    k_pos = np.arange(kr * blk, (kr + 1) * blk)[None, :]
    swapped = (np.arange(qr * blk, (qr + 1) * blk)[None, :] <= np.arange(kr * blk, (kr + 1) * blk)[:, None])
    known = [
        (local, "causal-wrong-rank-offset", "you compared LOCAL positions (0 .. block - 1) for every pair of ranks"),
        (swapped, "causal-wrong-rank-offset", "the query and key offsets are swapped"),
        (np.broadcast_to(k_pos < q_pos, expected.shape), "causal-excludes-diagonal", ""),
    ]
    if out.shape == expected.shape:
        for mask, code, detail in known:
            if np.array_equal(out, mask) and not np.array_equal(mask, expected):
                raise fail(code, detail=detail, case=case)
    else:
        raise fail("wrong-shape", f"Your mask has shape {shape_text(out.shape)}; expected (block, block) = "
                   f"{shape_text(expected.shape)}.", case=case)
    raise fail("wrong-output", "Your mask differs from the block of the full causal mask and matches none of the "
               "mistakes this checker knows. Query position i may attend key position j iff j <= i, in GLOBAL "
               "positions.", case=case)


# ----------------------------------------------------------------------------------------------------------
# Checked questions
# ----------------------------------------------------------------------------------------------------------

choice_question(
    "13.allreduce-place",
    answer="C",
    why="each rank's heads times its rows of W_o is one term of a sum over the ranks: one all-reduce completes "
        "it, and the bias is added once, afterwards.",
    wrong={
        "A": ("each rank computes Q, K and V for its own heads only, from the full input it already has: nothing "
              "needs to be exchanged before attention."),
        "B": ("allreduce-before-output-projection", ("the heads of different ranks are different features, not "
                                                    "parts of a sum: adding them mixes head 0 with head H/P.")),
        "D": ("after its own rows of W_o a rank holds only a partial sum; without the all-reduce each rank's "
              "output misses the other ranks' heads."),
    },
)


def _ring_bytes(p=8, b=1, h=32, t=32768, dh=128, bytes_per=2):
    return (p - 1) * b * h * (t // p) * 2 * dh * bytes_per


number_question(
    "13.ring-bytes",
    answer=_ring_bytes(),
    why="P - 1 = 7 steps, each sending one key block and one value block of B * H * (T / P) * Dh numbers of "
        "2 bytes.",
    known={
        _ring_bytes() // 2: "that counts the keys only: the values travel around the ring too.",
        _ring_bytes() * 8 // 7: "after P - 1 steps every rank has seen every block: the last step sends nothing.",
        _ring_bytes() * 8: "each rank sends blocks of T / P positions, not the whole sequence.",
    },
    hint="Count the steps, the tensors sent per step, and the numbers and bytes in each.",
)

number_question(
    "13.causal-imbalance",
    answer=8,
    why="with the contiguous layout rank r computes r + 1 blocks (the blocks of the ranks before it and its own "
        "diagonal block): the last of 8 ranks computes 8, the first 1.",
    known={1: "that is what the zig-zag layout achieves; the contiguous layout skips future blocks, and rank 0 "
              "has all its keys' blocks in its future except its own.",
           4.5: "that is the average number of blocks per rank, not the ratio between the busiest and the "
                "least busy rank."},
)
