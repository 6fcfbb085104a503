"""Checks of chapter 13: the row-parallel output projection, the zig-zag
layout, the communication operators f and g (on real processes).

Most checks simulate the ranks in one process (a list with one entry per rank;
the all-reduce is a sum over the list), so they take milliseconds.
:func:`check_copy_and_sum` is given a function that runs the student's f and g
on real gloo processes
(:func:`attention_course.distributed.demos.run_copy_and_sum`) and compares what
every rank returns with one process; the known mistakes are simulated here, in
one process.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ..distributed.ring_attention import causal_work_per_rank, sequence_layout
from ..distributed.tensor_parallel import TensorParallelAttention
from ..multi_head import MultiHeadAttention
from .diagnosis import diagnose
from .questions import number_question
from .runner import (
    DEFAULT_TIMEOUT,
    as_array,
    call,
    display_name,
    fail,
    run_check,
    shape_text,
)

# -----------------------------------------------------------------------------
# Exercise: the row-parallel output projection (where the all-reduce goes)
# -----------------------------------------------------------------------------

# (B, T, D, H, P): D / P features (H / P heads) per rank
_ROW_PARALLEL_CASES = [
    (2, 3, 8, 4, 2),
    (1, 5, 12, 6, 3),
    (2, 4, 16, 8, 4),
    (3, 2, 6, 2, 1),
    (1, 3, 16, 4, 2),
]


def _row_parallel_variants(
    heads: list[np.ndarray], w_o: np.ndarray, b_o: np.ndarray
):
    """(code, detail, thunk) for the known mistakes; the thunks return (output,
    None)."""
    p, width = len(heads), heads[0].shape[-1]
    cols = [slice(r * width, (r + 1) * width) for r in range(p)]
    summed = sum(heads)  # all-reduce of the heads themselves
    out = []
    for r in range(p):
        detail = (
            f"rank {r} summed the heads of all ranks, (B, T, D / P), and "
            "then applied its own slice of W_o"
            if p > 1
            else ""
        )
        out.append(
            (
                "allreduce-before-output-projection",
                detail,
                lambda r=r: (summed @ w_o[:, cols[r]].T + b_o, None),
            )
        )
    right = sum(h @ w_o[:, c].T for h, c in zip(heads, cols, strict=True))
    out.append(("tp-bias-per-rank", str(p), lambda: (right + p * b_o, None)))
    # rows of weight: OUTPUT features of W_o
    wrong_slice = sum(h @ w_o[c, :] for h, c in zip(heads, cols, strict=True))
    out.append(
        ("row-parallel-wrong-slice", "", lambda: (wrong_slice + b_o, None))
    )
    return out


def check_row_parallel_output(fn, *, timeout: float = DEFAULT_TIMEOUT):
    """Check ``fn(local_heads, w_o, b_o)`` -> the output of tensor-parallel
    attention, (B, T, D).

    ``local_heads`` is a list of P float64 torch tensors (B, T, D / P): rank
    r's merged heads (heads r*H/P .. (r+1)*H/P - 1). ``w_o`` (D, D) and ``b_o``
    (D,) are the output projection in nn.Linear's layout (y = x @ w_o.T + b_o).
    The all-reduce is simulated by a sum over the ranks. Diagnoses
    ``[allreduce-before-output-projection]``, ``[tp-bias-per-rank]``,
    ``[row-parallel-wrong-slice]``.
    """
    label = "row_parallel_output"

    def body():
        rng = np.random.default_rng(13)
        for i, (b, t, d, h, p) in enumerate(_ROW_PARALLEL_CASES, 1):
            heads = [rng.standard_normal((b, t, d // p)) for _ in range(p)]
            w_o, b_o = (
                rng.standard_normal((d, d)) / math.sqrt(d),
                rng.standard_normal(d),
            )
            case = (
                f"case {i} of {len(_ROW_PARALLEL_CASES)}: P={p} ranks, "
                f"H={h} heads, local_heads = {p} tensors "
                f"{shape_text((b, t, d // p))}, w_o {shape_text(w_o.shape)}"
            )
            args = {
                "local_heads": [torch.from_numpy(x) for x in heads],
                "w_o": torch.from_numpy(w_o),
                "b_o": torch.from_numpy(b_o),
            }
            out = as_array(call(fn, args, label), "result", case)
            # (B, T, D): what one process would have
            merged = np.concatenate(heads, axis=-1)
            expected = merged @ w_o.T + b_o
            if out.shape == expected.shape and np.allclose(
                out, expected, atol=1e-10, rtol=1e-8
            ):
                continue
            diagnose(
                out,
                None,
                _row_parallel_variants(heads, w_o, b_o),
                case,
                expected,
                None,
                atol=1e-10,
                rtol=1e-8,
            )
        return (
            f"✓ {display_name(fn, label)}: {len(_ROW_PARALLEL_CASES)} "
            "random cases (P from 1 to 4 ranks) give "
            "the single-process output"
        )

    run_check(body, timeout)


# -----------------------------------------------------------------------------
# Exercise: the zig-zag layout
# -----------------------------------------------------------------------------

_ZIGZAG_CASES = [(8, 2), (24, 3), (16, 4), (40, 4), (6, 1), (64, 8)]  # (T, P)


def _zigzag_variants(seq_len: int, world_size: int):
    """(code, detail, thunk) of the known wrong layouts, each (P, T / P) sorted
    positions."""
    p, n = world_size, seq_len // (2 * world_size)

    def rows(chunks_of):
        return lambda: (
            np.array(
                [
                    np.concatenate(
                        [np.arange(c * n, (c + 1) * n) for c in chunks_of(r)]
                    )
                    for r in range(p)
                ],
                dtype=np.float64,
            ),
            None,
        )

    return [
        ("zigzag-contiguous", "", rows(lambda r: [2 * r, 2 * r + 1])),
        (
            "zigzag-not-mirrored",
            "chunks r and P + r",
            rows(lambda r: [r, p + r]),
        ),
        (
            "zigzag-striped",
            "",
            lambda: (
                np.array(
                    [np.arange(r, seq_len, p) for r in range(p)],
                    dtype=np.float64,
                ),
                None,
            ),
        ),
    ]


def check_zigzag_layout(fn, *, timeout: float = DEFAULT_TIMEOUT):
    """Check ``fn(seq_len, world_size)`` -> the positions each rank holds in
    the zig-zag layout: an integer array (P, T / P), row r = the global
    positions of rank r, in any order within the row (a nested list, or (P, 2,
    T / 2P) chunks, are fine too). Diagnoses ``[zigzag-contiguous]``,
    ``[zigzag-not-mirrored]`` and ``[zigzag-striped]``; the success line
    reports the balance of the causal work."""
    label = "zigzag_positions"

    def body():
        for i, (t, p) in enumerate(_ZIGZAG_CASES, 1):
            case = (
                f"case {i} of {len(_ZIGZAG_CASES)}: seq_len={t}, "
                f"world_size={p}"
            )
            out = as_array(
                call(fn, {"seq_len": t, "world_size": p}, label),
                "result",
                case,
            )
            if out.size == t:
                out = np.sort(
                    out.reshape(p, -1)
                    if out.size % p == 0
                    else out.reshape(1, -1),
                    axis=-1,
                )
            expected = np.array(
                [
                    np.concatenate([np.arange(a, b) for a, b in rank])
                    for rank in sequence_layout(t, p, "zigzag")
                ],
                dtype=np.float64,
            )
            expected = np.sort(expected, axis=-1)
            if out.shape == expected.shape and np.array_equal(out, expected):
                continue
            diagnose(
                out,
                None,
                _zigzag_variants(t, p),
                case,
                expected,
                None,
                what="layout",
                atol=0,
                rtol=0,
            )
        work = [w.computed for w in causal_work_per_rank(64, 8, "zigzag")]
        return (
            f"✓ {display_name(fn, label)}: {len(_ZIGZAG_CASES)} layouts (P "
            "from 1 to 8) are right; causal "
            f"work per rank, T=64, P=8: {work}"
        )

    run_check(body, timeout)


# -----------------------------------------------------------------------------
# Exercise: the communication operators f and g, on real processes
# -----------------------------------------------------------------------------

# (B, Tq, Tk, D, kdim, vdim, H, P, seed): cross-attention with Tq != Tk and
# key/value widths != D, and one square and 3 processes (a sum written for two
# ranks is right at P = 2 only)
_COPY_SUM_CASES = [
    (2, 5, 7, 16, 12, 10, 4, 2, 3),
    (1, 6, 6, 12, 12, 12, 3, 3, 7),
]
# float64: two processes and one sum the same numbers in a different order
_COPY_SUM_ATOL = 1e-10


def _copy_sum_inputs(rng, b, tq, tk, d, kdim, vdim):
    shapes = ((b, tq, d), (b, tk, kdim), (b, tk, vdim), (b, tq, d))
    # query, key, value, grad_out
    return [torch.from_numpy(rng.standard_normal(shape)) for shape in shapes]


def _copy_sum_module(query, key, value, num_heads, seed) -> MultiHeadAttention:
    """The same module as ``demos.copy_and_sum_problem``: built under
    ``torch.manual_seed(seed)``, float64."""
    torch.manual_seed(seed)
    return MultiHeadAttention(
        query.size(-1), num_heads, kdim=key.size(-1), vdim=value.size(-1)
    ).double()


def _flat(parts) -> np.ndarray:
    return np.concatenate(
        [np.asarray(x, dtype=np.float64).ravel() for x in parts]
    )


def _copy_sum_reference(mha, inputs, grad_out, world_size) -> np.ndarray:
    """One process: the output and input gradients, repeated for every rank,
    flattened."""
    leaves = [x.clone().requires_grad_(True) for x in inputs]
    out = mha(*leaves)
    grads = torch.autograd.grad((out * grad_out).sum(), leaves)
    return _flat(
        [out.detach().expand(world_size, *out.shape).numpy()]
        + [g.expand(world_size, *g.shape).numpy() for g in grads]
    )


def _copy_sum_simulated(
    mha, inputs, grad_out, world_size, f_fwd, f_bwd, g_fwd, g_bwd, summed=None
) -> np.ndarray:
    """What the ranks return when f all-reduces forward (``f_fwd``) and/or
    backward (``f_bwd``), and g forward (``g_fwd``) and/or backward
    (``g_bwd``), simulated in one process (right: ``f_bwd`` and ``g_fwd``
    only); with ``summed``, the reductions add the first ``summed`` ranks'
    parts only (a sum written for that many ranks)."""
    p = world_size
    summed = p if summed is None else summed
    shards = [TensorParallelAttention(mha, r, p) for r in range(p)]
    ins = [
        [(x * p if f_fwd else x).detach().requires_grad_(True) for x in inputs]
        for _ in range(p)
    ]
    # (B, Tq, D) each
    partials = [
        shard.partial_output(*xs)
        for shard, xs in zip(shards, ins, strict=True)
    ]
    total = sum(part.detach() for part in partials[:summed])
    outs = [
        (total if g_fwd else part.detach()) + mha.w_o.bias.detach()
        for part in partials
    ]
    local = [
        torch.autograd.grad(part, xs, grad_out * (p if g_bwd else 1))
        for part, xs in zip(partials, ins, strict=True)
    ]
    grads = [
        [
            sum(rank[i] for rank in local[:summed]) if f_bwd else local[r][i]
            for r in range(p)
        ]
        for i in range(3)
    ]
    return _flat(
        [torch.stack(outs).numpy()] + [torch.stack(g).numpy() for g in grads]
    )


# code, what the operators do: (f forward, f backward, g forward, g backward)
# all-reduce
_COPY_SUM_MISTAKES = [
    ("f-backward-not-reduced", (False, False, True, False)),
    ("g-backward-reduced", (False, True, True, True)),
    ("g-forward-not-reduced", (False, True, False, False)),
    ("f-forward-reduced", (True, True, True, False)),
    ("f-and-g-swapped", (True, False, False, True)),
    ("sum-of-two-ranks", (False, True, True, False, 2)),
]


def check_copy_and_sum(fn, *, timeout: float = 60.0):
    """Check ``fn(query, key, value, grad_out, num_heads, world_size, seed)``
    -> ``(out, grad_query, grad_key, grad_value)``, each with a leading axis of
    one entry per rank: tensor-parallel attention run on ``world_size`` real
    processes with the student's f and g (``demos.run_copy_and_sum`` does the
    running). Every rank's output and input gradients must equal one process's.
    Diagnoses ``[f-backward-not-reduced]``, ``[g-backward-reduced]``,
    ``[g-forward-not-reduced]``, ``[f-forward-reduced]``, ``[f-and-g-swapped]``
    and, on 3 processes, ``[sum-of-two-ranks]`` (a sum that adds two ranks'
    parts, right on 2 processes only).
    """
    label = "tp_on_processes"

    def body():
        rng = np.random.default_rng(29)
        for i, (b, tq, tk, d, kdim, vdim, h, p, seed) in enumerate(
            _COPY_SUM_CASES, 1
        ):
            query, key, value, grad_out = _copy_sum_inputs(
                rng, b, tq, tk, d, kdim, vdim
            )
            case = (
                f"case {i} of {len(_COPY_SUM_CASES)}: P={p} processes, "
                f"H={h} heads, query "
                f"{shape_text(query.shape)}, key {shape_text(key.shape)}, "
                f"value {shape_text(value.shape)}"
            )
            args = {
                "query": query,
                "key": key,
                "value": value,
                "grad_out": grad_out,
                "num_heads": h,
                "world_size": p,
                "seed": seed,
            }
            result = call(fn, args, label)
            if not isinstance(result, (tuple, list)) or len(result) != 4:
                raise fail(
                    "wrong-type",
                    "Return the four tensors (out, grad_query, grad_key, "
                    "grad_value) that "
                    "run_copy_and_sum returns.",
                    case=case,
                )
            out = _flat(
                [
                    as_array(x, name, case)
                    for x, name in zip(
                        result,
                        ("out", "grad_query", "grad_key", "grad_value"),
                        strict=True,
                    )
                ]
            )
            mha = _copy_sum_module(query, key, value, h, seed)
            expected = _copy_sum_reference(
                mha, (query, key, value), grad_out, p
            )
            if out.shape == expected.shape and np.allclose(
                out, expected, atol=_COPY_SUM_ATOL, rtol=0
            ):
                continue
            qkv = (query, key, value)
            candidates = [
                (
                    code,
                    "",
                    lambda flags=flags, mha=mha, qkv=qkv, g=grad_out, p=p: (
                        _copy_sum_simulated(mha, qkv, g, p, *flags),
                        None,
                    ),
                )
                for code, flags in _COPY_SUM_MISTAKES
            ]
            diagnose(
                out,
                None,
                candidates,
                case,
                expected,
                None,
                what="output and gradients",
                atol=_COPY_SUM_ATOL,
                rtol=0,
            )
        return (
            f"✓ {display_name(fn, label)}: {len(_COPY_SUM_CASES)} problems "
            "on real processes: every rank's "
            "output and input gradients equal one process"
        )

    run_check(body, timeout)


# -----------------------------------------------------------------------------
# Checked questions
# -----------------------------------------------------------------------------

number_question(
    "13.hide-block",
    answer=8000,
    why="per step a rank sends 2 * H * n * Dh numbers of 2 bytes (a key "
    "and a value block) and computes "
    "4 * H * n^2 * Dh FLOPs (scores, then weights @ values): compute / "
    "transfer = (4 H n^2 Dh / F) / "
    "(4 H n Dh / BW) = n * BW / F, which is 1 at n = F / BW = 400e12 / 50e9 "
    "= 8000 positions per rank, "
    "whatever H and Dh.",
    known={
        4000: "that sends half the bytes: a key block AND a value block "
        "travel, 2 bytes per number.",
        16000: "that counts only the scores (2 n^2 Dh FLOPs per head): "
        "weights @ values costs as much again.",
    },
    hint="Write the time of one step's computation and of one step's "
    "transfer as functions of n = T / P; H and "
    "Dh appear in both.",
)
