"""Check of chapter 9's challenge: blockwise attention over a sliding window
that computes only the tiles it needs.

Query i may attend keys j with i - window < j <= i (itself and the window - 1
keys before it). The student's function cuts queries and keys into blocks,
skips every (query block, key block) tile that holds no allowed pair, and
returns the output, which is compared with the float64 reference under the same
mask. The check counts the tiles itself: on cases without batch axes it counts
the query-key dot products the function computes
(:class:`.observe.ScoreCounter`), which must not exceed those of the tiles that
hold an allowed pair. A count the function reported about itself would prove
nothing: dense attention returns the same output.
"""

from __future__ import annotations

import contextlib
import math

import numpy as np

from .. import numpy_ref, tiles
from ..masks import sliding_window
from . import hidden, observe
from .cases import to_framework
from .diagnosis import diagnose
from .runner import (
    DEFAULT_TIMEOUT,
    as_array,
    call,
    close,
    display_name,
    fail,
    run_check,
    shape_text,
)

# (batch dims, T, Dk, Dv, window, block size): a window smaller, equal to and
# larger than a block, T not a multiple of the block, a window of one key, and
# a window as long as the sequence (plain causal attention); the last two,
# without batch axes and with a feature width (17) that no other size shares,
# are where the tiles are counted.
_CASES = [
    ((), 8, 4, 4, 3, 4),
    ((2,), 12, 8, 6, 4, 4),
    ((2,), 13, 6, 5, 5, 3),
    ((2, 3), 10, 4, 4, 1, 4),
    ((), 9, 8, 8, 9, 4),
    ((3,), 16, 4, 8, 6, 5),
    ((), 48, 17, 5, 9, 6),
    ((), 40, 17, 3, 4, 4),
]
# wider than any band of keys a query block needs: only q @ k.T contracts over
# it
_COUNTED_DK = 17


def window_mask(t: int, window: int) -> np.ndarray:
    """(t, t) boolean: query i may attend key j when i - window < j <= i."""
    i, j = np.arange(t)[:, None], np.arange(t)[None, :]
    return (j <= i) & (j > i - window)


def _tiles(t: int, window: int, block: int) -> list[tuple[int, int]]:
    """(query block start, key block start) of the tiles that hold at least one
    allowed pair."""
    states = tiles.tile_states(sliding_window(window, t), t, t, block)[0, 0]
    return [(a * block, c * block) for a, c in tiles.computed_tiles(states)]


def tiles_needed(t: int, window: int, block: int) -> int:
    """The number of (query block, key block) tiles that hold at least one
    allowed pair."""
    return tiles.tiles_computed(
        tiles.tile_states(sliding_window(window, t), t, t, block)
    )


def _scores_in_tiles(t: int, window: int, block: int) -> int:
    """The number of (query, key) scores in the tiles that hold an allowed pair
    (the last blocks may be shorter)."""
    return sum(
        min(block, t - a) * min(block, t - c)
        for a, c in _tiles(t, window, block)
    )


def _blockwise(q, k, v, window, block, rescale="both", normalize=True):
    """Chapter 9's blockwise online softmax over the window, float64, right or
    with one of its mistakes: ``rescale`` "both" (right), "none" (what was
    accumulated is never rescaled when the maximum rises) or "sum" (the sum is
    rescaled, the accumulator is not); ``normalize=False`` returns the
    accumulator without dividing by the sum."""
    t = q.shape[-2]
    mask = window_mask(t, window)
    out = np.zeros((*q.shape[:-1], v.shape[-1]))
    for a in range(0, t, block):
        rows = slice(a, a + block)
        m = np.full((*q.shape[:-2], len(range(t)[rows]), 1), -np.inf)
        total, acc = np.zeros_like(m), np.zeros((*m.shape[:-1], v.shape[-1]))
        for c in range(0, t, block):
            cols = slice(c, c + block)
            if not mask[rows, cols].any():
                continue
            s = np.where(
                mask[rows, cols],
                q[..., rows, :]
                @ np.swapaxes(k[..., cols, :], -1, -2)
                / math.sqrt(q.shape[-1]),
                -np.inf,
            )
            m_new = np.maximum(m, s.max(-1, keepdims=True))
            m_new = np.where(np.isfinite(m_new), m_new, 0.0)
            alpha, p = np.exp(m - m_new), np.exp(s - m_new)
            total = total * (1.0 if rescale == "none" else alpha) + p.sum(
                -1, keepdims=True
            )
            acc = (
                acc * (alpha if rescale == "both" else 1.0)
                + p @ v[..., cols, :]
            )
            m = m_new
        out[..., rows, :] = acc / total if normalize else acc
    return out, None


def _cases():
    rng = np.random.default_rng(19)
    sizes = list(_CASES)
    for t, window, block in hidden.window_sizes():
        sizes += [
            ((5,), t, 8, 8, window, block),
            ((), t, _COUNTED_DK, 5, window, block),
        ]
    for batch, t, dk, dv, window, block in sizes:
        # spread scores: a missing rescale shows
        q, k = rng.standard_normal((2, *batch, t, dk)) * 2
        v = rng.standard_normal((*batch, t, dv))
        desc = (
            f"q and k {shape_text(q.shape)}, v {shape_text(v.shape)}, "
            f"window={window}, block_size={block}"
        )
        yield q, k, v, window, block, desc


def _candidates(q, k, v, window, block):
    t = q.shape[-2]
    out = [
        (
            "window-off-by-one",
            f"each query sees {window + 1} keys (j >= i - window)",
            window + 1,
        )
    ]
    if window > 1:
        out.append(
            (
                "window-off-by-one",
                f"each query sees {window - 1} keys (j > i - window + 1)",
                window - 1,
            )
        )
    if window < t:
        out.append(("window-ignored", "", t))
    windows = [
        (
            code,
            detail,
            lambda w=w: numpy_ref.scaled_dot_product_attention(
                q, k, v, window_mask(t, w)
            ),
        )
        for code, detail, w in out
    ]
    streams = [
        (
            "stream-not-rescaled",
            "the running sum and accumulator are never rescaled when a tile "
            "raises the maximum",
            {"rescale": "none"},
        ),
        (
            "stream-not-rescaled",
            "the running sum is rescaled when a tile raises the maximum, "
            "the accumulator is not",
            {"rescale": "sum"},
        ),
        (
            "weights-not-normalized",
            "you return the accumulator without dividing it by the running "
            "sum",
            {"normalize": False},
        ),
    ]
    return windows + [
        (code, detail, lambda kw=kw: _blockwise(q, k, v, window, block, **kw))
        for code, detail, kw in streams
    ]


def _require_tiles_skipped(counted, t, window, block, case):
    """The dot products the function computed, against those of the tiles it
    needs (measured, not reported)."""
    needed = _scores_in_tiles(t, window, block)
    if counted > needed:
        causal = _scores_in_tiles(t, t, block)
        what = (
            "every tile"
            if counted >= t * t
            else "every tile on or below the diagonal (the causal ones)"
            if counted >= causal
            else "tiles that hold no allowed pair"
        )
        raise fail(
            "tiles-not-skipped",
            detail=f"your function computed {counted} query-key scores, "
            "where the "
            f"{tiles_needed(t, window, block)} tiles that hold an allowed "
            f"pair have {needed}: it computes "
            f"{what}",
            case=case,
        )
    if counted < int(window_mask(t, window).sum()):
        raise fail(
            "wrong-type",
            "The check counts the query-key scores your function computes "
            "with torch "
            f"operations and found {counted}, fewer than the allowed pairs "
            "alone: compute with torch "
            "tensors (not NumPy), so that the tiles you compute can be "
            "counted.",
            case=case,
        )


def _body(fn, label):
    cases = list(_cases())
    for n, (q, k, v, window, block, desc) in enumerate(cases, 1):
        case = f"case {n} of {len(cases)}: {desc}"
        args = {
            "q": to_framework(q, "torch"),
            "k": to_framework(k, "torch"),
            "v": to_framework(v, "torch"),
            "window": window,
            "block_size": block,
        }
        counted = (
            q.ndim == 2
            and q.shape[-1] == _COUNTED_DK
            and observe.observable(fn)
        )
        counter = observe.ScoreCounter(q.shape[-1])
        with counter if counted else contextlib.nullcontext():
            result = call(fn, args, label, positional=3)
        if isinstance(result, (tuple, list)):
            raise fail(
                "wrong-type",
                f"Your function returned a {type(result).__name__}; return "
                "only the output: "
                "the check counts the tiles you compute itself.",
                case=case,
            )
        out = as_array(result, "result", case)
        ref, _ = numpy_ref.scaled_dot_product_attention(
            q, k, v, window_mask(q.shape[-2], window)
        )
        if not close(out, ref, 2e-5, 1e-4):
            diagnose(
                out,
                None,
                _candidates(q, k, v, window, block),
                case,
                ref,
                None,
                atol=2e-5,
                rtol=1e-4,
            )
        if counted:
            _require_tiles_skipped(
                counter.scores, q.shape[-2], window, block, case
            )
    return (
        f"✓ {display_name(fn, label)}: {len(cases)} random cases (windows "
        "smaller and larger than a block, T not "
        "a multiple of the block, batch dims) match the reference, "
        "computing only the tiles that hold an "
        "allowed pair (counted by the check)"
    )


def check_sliding_window_attention(
    fn, *, timeout: float = 3 * DEFAULT_TIMEOUT
):
    """Chapter 9: check ``fn(q, k, v, window, block_size)`` -> ``out``: causal
    self-attention over a sliding window (query i attends keys i - window < j
    <= i) computed block by block; q and k (..., T, Dk), v (..., T, Dv) float32
    tensors; ``out`` (..., T, Dv). The check counts the query-key scores the
    function computes, which must be no more than those of the tiles holding an
    allowed pair. Diagnoses ``[window-off-by-one]``, ``[window-ignored]``,
    ``[stream-not-rescaled]`` and ``[tiles-not-skipped]``. The longer default
    time limit leaves room for a Python loop over the tiles while the scores
    are counted."""
    observe.warm_up()
    run_check(lambda: _body(fn, "sliding_window_attention"), timeout)
