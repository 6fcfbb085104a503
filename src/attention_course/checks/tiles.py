"""Check of chapter 9's challenge: blockwise attention over a sliding window that computes only the tiles it needs.

Query i may attend keys j with i - window < j <= i (itself and the window - 1 keys before it). The student's
function cuts queries and keys into blocks, skips every (query block, key block) tile that holds no allowed pair,
and returns the output with the number of tiles it computed. The output is compared with the float64 reference
under the same mask; the count with the number of tiles that hold at least one allowed pair.
"""

from __future__ import annotations

import numpy as np

from .. import numpy_ref
from . import hidden
from .cases import to_framework
from .diagnosis import diagnose
from .runner import DEFAULT_TIMEOUT, as_array, as_number, call, close, display_name, fail, run_check, shape_text

# (batch dims, T, Dk, Dv, window, block size): a window smaller, equal to and larger than a block, T not a multiple
# of the block, a window of one key, and a window as long as the sequence (plain causal attention).
_CASES = [((), 8, 4, 4, 3, 4), ((2,), 12, 8, 6, 4, 4), ((2,), 13, 6, 5, 5, 3), ((2, 3), 10, 4, 4, 1, 4),
          ((), 9, 8, 8, 9, 4), ((3,), 16, 4, 8, 6, 5)]


def window_mask(t: int, window: int) -> np.ndarray:
    """(t, t) boolean: query i may attend key j when i - window < j <= i."""
    i, j = np.arange(t)[:, None], np.arange(t)[None, :]
    return (j <= i) & (j > i - window)


def tiles_needed(t: int, window: int, block: int) -> int:
    """The number of (query block, key block) tiles that hold at least one allowed pair."""
    allowed = window_mask(t, window)
    starts = range(0, t, block)
    return sum(bool(allowed[a:a + block, b:b + block].any()) for a in starts for b in starts)


def _cases():
    rng = np.random.default_rng(19)
    sizes = list(_CASES)
    for t, window, block in hidden.window_sizes():
        sizes.append(((5,), t, 8, 8, window, block))
    for batch, t, dk, dv, window, block in sizes:
        q, k = rng.standard_normal((2, *batch, t, dk))
        v = rng.standard_normal((*batch, t, dv))
        desc = (f"q and k {shape_text(q.shape)}, v {shape_text(v.shape)}, window={window}, "
                f"block_size={block}")
        yield q, k, v, window, block, desc


def _candidates(q, k, v, window):
    t = q.shape[-2]
    out = [("window-off-by-one", f"each query sees {window + 1} keys (j >= i - window)", window + 1)]
    if window > 1:
        out.append(("window-off-by-one", f"each query sees {window - 1} keys (j > i - window + 1)", window - 1))
    if window < t:
        out.append(("window-ignored", "", t))
    return [(code, detail, lambda w=w: numpy_ref.scaled_dot_product_attention(q, k, v, window_mask(t, w)))
            for code, detail, w in out]


def _body(fn, label):
    cases = list(_cases())
    for n, (q, k, v, window, block, desc) in enumerate(cases, 1):
        case = f"case {n} of {len(cases)}: {desc}"
        args = {"q": to_framework(q, "torch"), "k": to_framework(k, "torch"), "v": to_framework(v, "torch"),
                "window": window, "block_size": block}
        result = call(fn, args, label, positional=3)
        if not isinstance(result, (tuple, list)) or len(result) != 2:
            raise fail("wrong-type", f"Your function returned a {type(result).__name__}; return a pair (out, tiles): "
                       "the output and the number of tiles you computed.", case=case)
        out = as_array(result[0], "output", case)
        ref, _ = numpy_ref.scaled_dot_product_attention(q, k, v, window_mask(q.shape[-2], window))
        if not close(out, ref, 2e-5, 1e-4):
            diagnose(out, None, _candidates(q, k, v, window), case, ref, None, atol=2e-5, rtol=1e-4)
        tiles, t = as_number(result[1]), q.shape[-2]
        needed, total = tiles_needed(t, window, block), len(range(0, t, block)) ** 2
        if tiles == needed:
            continue
        causal = tiles_needed(t, t, block)
        if tiles in (total, causal) and needed < tiles:
            what = "every tile" if tiles == total else "every tile on or below the diagonal (the causal ones)"
            raise fail("tiles-not-skipped", detail=f"you computed {what}: {tiles} tiles", case=case)
        raise fail("wrong-value", f"Your output is right, but you report {result[1]!r} tiles: the tiles that hold at "
                   f"least one allowed (query, key) pair number {needed} of {total}.", case=case)
    return (f"✓ {display_name(fn, label)}: {len(cases)} random cases (windows smaller and larger than a block, T not "
            "a multiple of the block, batch dims) match the reference, with only the needed tiles computed")


def check_sliding_window_attention(fn, *, timeout: float = DEFAULT_TIMEOUT):
    """Chapter 9: check ``fn(q, k, v, window, block_size)`` -> ``(out, tiles)``: causal self-attention over a
    sliding window (query i attends keys i - window < j <= i) computed block by block; q and k (..., T, Dk), v
    (..., T, Dv) float32 tensors; ``out`` (..., T, Dv); ``tiles`` the number of (query block, key block) tiles
    computed, which must be exactly those holding an allowed pair. Diagnoses ``[window-off-by-one]``,
    ``[window-ignored]`` and ``[tiles-not-skipped]``."""
    run_check(lambda: _body(fn, "sliding_window_attention"), timeout)
