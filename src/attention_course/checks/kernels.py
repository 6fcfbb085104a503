"""Checks of chapter 16: the pieces of FlashAttention's kernels that the
exercises ask for.

The student writes Triton kernels and the Python functions that launch them, on
one head: q, k, v (T, Dh) float32 tensors, tiles of ``BLOCK`` = 16 rows. Each
check calls the launcher and compares what it returns with float64 references
computed here (NumPy, no Triton: this module never imports it). A wrong result
is compared with :func:`tiled_forward` or :func:`dk_variant`, the same tile
loop with one deliberate mistake, and named; the simulation tries tiles of 16,
32 and 64 so that a student who chose other tiles is still diagnosed.

What the exercises are about, beyond the returned values, is observed: every
call runs inside a :class:`.observe.ScoreCounter` (a Triton kernel, compiled or
interpreted, computes its scores outside PyTorch, so an answer whose scores
PyTorch computes, SDPA, ``q @ k.T``, autograd, is no kernel), with the
library's own kernels disarmed where the call runs in this process (the grader
reads the submission for calls of the library); one case has scores large
enough that ``exp`` overflows float32 without the running maximum; and the
causal check poisons the values of one key tile with ``inf``, which only a
program that loads that tile can see.
"""

from __future__ import annotations

import contextlib
import math
import sys

import numpy as np

from .. import tiles
from . import hidden, observe
from .cases import to_framework
from .diagnosis import diagnose
from .questions import number_question
from .runner import (
    DEFAULT_TIMEOUT,
    as_array,
    call,
    close,
    display_name,
    fail,
    run_check,
    shape_text,
    split_result,
)

ATOL, RTOL = 2e-5, 1e-4  # float32 kernels against a float64 reference
# under Triton's interpreter every program is Python
TIMEOUT = 6 * DEFAULT_TIMEOUT
BLOCKS = (16, 32, 64)


def tiled_forward(
    q,
    k,
    v,
    block,
    *,
    causal=False,
    rescale="both",
    ragged_mask=True,
    normalize=True,
    bounds="ok",
):
    """Chapter 16's forward tile loop on one head, float64: (out (T, Dv), lse
    (T,)), right or with one mistake.

    ``rescale``: both | none (neither the sum nor the accumulator is rescaled)
    | sum (only the sum) | acc (only the accumulator); ``ragged_mask=False``:
    the padding of the last key tile (zero keys and values) is let in;
    ``normalize=False``: the accumulator is returned undivided; ``bounds``
    (causal): ok | diagonal-unmasked (the diagonal tile goes through the
    unmasked loop) | diagonal-skipped (the loop stops before it) | ignored
    (every tile, unmasked but for the padding). Rows that saw no key give NaN,
    as the kernel's acc / l does.
    """
    t, d = q.shape
    padded = -(-t // block) * block
    k_pad = np.zeros((padded, d))
    v_pad = np.zeros((padded, v.shape[1]))
    k_pad[:t], v_pad[:t] = k, v
    out, lse = np.zeros((t, v.shape[1])), np.zeros(t)
    for start in range(0, t, block):
        rows = np.arange(start, min(start + block, t))
        free, stop = (
            {
                "ok": (start, start + block),
                "diagonal-unmasked": (start + block, start + block),
                "diagonal-skipped": (start, start),
                "ignored": (padded, padded),
            }[bounds]
            if causal
            else (0, t)
        )
        m, total, acc = (
            np.full(len(rows), -np.inf),
            np.zeros(len(rows)),
            np.zeros((len(rows), v.shape[1])),
        )
        for k0 in range(0, min(stop, padded), block):
            cols = np.arange(k0, k0 + block)
            s = q[rows] @ k_pad[cols].T / math.sqrt(d)
            visible = np.ones_like(s, dtype=bool)
            if k0 >= free or not causal:
                if ragged_mask:
                    visible &= cols[None, :] < t
                if causal and bounds != "ignored":
                    visible &= cols[None, :] <= rows[:, None]
            s = np.where(visible, s, -np.inf)
            m_new = np.maximum(m, s.max(axis=1))
            safe = np.where(np.isfinite(m_new), m_new, 0.0)
            alpha, p = np.exp(m - safe), np.exp(s - safe[:, None])
            total = total * (
                alpha if rescale in ("both", "sum") else 1.0
            ) + p.sum(axis=1)
            acc = (
                acc * (alpha[:, None] if rescale in ("both", "acc") else 1.0)
                + p @ v_pad[cols]
            )
            m = m_new
        with np.errstate(all="ignore"):
            out[rows] = acc / total[:, None] if normalize else acc
            lse[rows] = m + np.log(total)
    return out, lse


def _match(out, candidates, case, ref, what):
    """Name the first mistake whose result ``out`` matches (NaN where it has
    NaN too), else a generic failure."""
    for code, detail, thunk in candidates:
        with np.errstate(all="ignore"):
            guess = thunk()
        if close(out, guess, ATOL, RTOL):
            raise fail(code, detail=detail, case=case)
    diagnose(out, None, [], case, ref, None, what=what, atol=ATOL, rtol=RTOL)


def _inputs(rng, t, d, spread=2.0):
    """q, k spread so that row maxima rise from tile to tile (a missing rescale
    shows), v plain."""
    return (
        rng.standard_normal((t, d)) * spread,
        rng.standard_normal((t, d)) * spread,
        rng.standard_normal((t, d)),
    )


def _torch_args(**arrays):
    return {name: to_framework(a, "torch") for name, a in arrays.items()}


def _forward_candidates(q, k, v, causal=False):
    out = []
    if causal:
        out.append(
            (
                "mask-ignored",
                "",
                lambda: tiled_forward(
                    q, k, v, BLOCKS[0], causal=True, bounds="ignored"
                )[0],
            )
        )
    for block in BLOCKS:
        if not causal:
            out += [
                (
                    "sum-not-rescaled",
                    "the accumulator is rescaled when a tile raises the "
                    "maximum, the running sum l "
                    "is not",
                    lambda b=block: tiled_forward(q, k, v, b, rescale="acc")[
                        0
                    ],
                ),
                (
                    "stream-not-rescaled",
                    "neither the running sum nor the accumulator is "
                    "rescaled when a tile raises "
                    "the maximum",
                    lambda b=block: tiled_forward(q, k, v, b, rescale="none")[
                        0
                    ],
                ),
                (
                    "stream-not-rescaled",
                    "the running sum is rescaled when a tile raises the "
                    "maximum, the "
                    "accumulator is not",
                    lambda b=block: tiled_forward(q, k, v, b, rescale="sum")[
                        0
                    ],
                ),
                (
                    "ragged-tile-unmasked",
                    f"the {-q.shape[0] % block} padding columns of the last "
                    f"tile of {block} "
                    "keys get the score 0",
                    lambda b=block: tiled_forward(
                        q, k, v, b, ragged_mask=False
                    )[0],
                ),
            ]
        else:
            out += [
                (
                    "causal-bound-off-by-one-tile",
                    "the diagonal tile goes through the loop WITHOUT the "
                    "mask (the "
                    "unmasked loop stops one tile late): queries see the "
                    "later keys of their own tile",
                    lambda b=block: tiled_forward(
                        q, k, v, b, causal=True, bounds="diagonal-unmasked"
                    )[0],
                ),
                (
                    "causal-bound-off-by-one-tile",
                    "the loop stops one tile early, before the diagonal "
                    "tile: queries "
                    "miss their own tile's keys (the first tile's rows see "
                    "no key at all)",
                    lambda b=block: tiled_forward(
                        q, k, v, b, causal=True, bounds="diagonal-skipped"
                    )[0],
                ),
            ]
    out.append(
        (
            "weights-not-normalized",
            "you return the accumulator without dividing it by the running "
            "sum",
            lambda: tiled_forward(
                q, k, v, BLOCKS[0], causal=causal, normalize=False
            )[0],
        )
    )
    return out


# -----------------------------------------------------------------------------
# The tile loop (forward, not causal) and the causal stopping point
# -----------------------------------------------------------------------------

# (T, Dh): one tile, ragged last tiles, shorter than one
_FORWARD_CASES = [(16, 16), (37, 16), (50, 32), (5, 16)]
# multiples of the tile, as the exercise's kernel needs; several tiles first
# (one tile cannot tell a diagonal tile without its mask from no mask at all)
_CAUSAL_CASES = [(48, 16), (16, 16), (64, 32)]


# q, k entries of standard deviation 8: scores of standard deviation 64, row
# maxima above 88
LARGE_SPREAD = 8.0
# (T, Dh, first key of the poisoned tile): a multiple of every tile in BLOCKS
_POISONED = (128, 16, 64)


class _LibraryKernelCalled(Exception):
    """Raised by a disarmed library kernel: the answer launched the course's
    kernel instead of its own."""


class _Disarmed:
    """Stands in for one of :mod:`attention_course.flash_triton`'s kernels
    during a check: launching it raises."""

    def __getitem__(self, grid):
        raise _LibraryKernelCalled


@contextlib.contextmanager
def _library_kernels_disarmed():
    """While the student's call runs in this process, the library's kernels
    cannot be launched (its launchers read them from the module at each call).
    Under the grader the call runs in the sandbox, and the grader rejects a
    submission that uses the library (``calls-reference``) before any check
    runs."""
    library = sys.modules.get("attention_course.flash_triton")
    names = (
        [
            name
            for name in dir(library)
            if name.startswith("_") and name.endswith("_kernel")
        ]
        if library
        else []
    )
    saved = {name: getattr(library, name) for name in names}
    try:
        for name in names:
            setattr(library, name, _Disarmed())
        yield
    finally:
        for name, kernel in saved.items():
            setattr(library, name, kernel)


def _call_kernel(
    fn,
    args: dict,
    label: str,
    positional: int,
    case: str,
    dk: int,
    stores=None,
):
    """The student's launcher called as the exercise's kernel must be: no
    query-key score computed by PyTorch (counted where the call can be
    observed) and no kernel of the library launched. ``stores``: a
    :class:`.observe.KernelStores` that records what the kernels launched
    store, where the call can be observed."""
    counter = observe.ScoreCounter(dk)
    watched = observe.observable(fn)
    try:
        with (
            _library_kernels_disarmed(),
            counter if watched else contextlib.nullcontext(),
            stores
            if watched and stores is not None
            else contextlib.nullcontext(),
        ):
            result = call(fn, args, label, positional=positional)
    # call() wraps the student's exceptions; find ours inside
    except Exception as err:  # noqa: BLE001
        if isinstance(
            err, _LibraryKernelCalled
        ) or "_LibraryKernelCalled" in str(err):
            raise fail(
                "kernel-not-written",
                detail="launches the course's own kernel (attention_course."
                "flash_triton)",
                case=case,
            ) from None
        raise
    if counter.scores:
        raise fail(
            "kernel-not-written",
            detail=f"computes {counter.scores} query-key scores with PyTorch "
            "(a matrix product, SDPA or autograd), which a Triton kernel "
            "never does",
            case=case,
        )
    return result


def _kernel_stores(fn):
    """A fresh :class:`.observe.KernelStores` for one call, or None where the
    call cannot be observed."""
    return observe.KernelStores() if observe.observable(fn) else None


def _stored(value, stores) -> bool:
    """Whether every entry of ``value`` (-inf included) is among the numbers
    one kernel launch wrote into one tensor (True where the call cannot be
    observed)."""
    if stores is None:
        return True
    values = np.asarray(value, dtype=np.float64).ravel()
    return any(
        np.isin(values, np.asarray(written)).all()
        for written in stores.written
    )


def _require_stored(out, stores, case, what="output"):
    """The result returned must be what a kernel stored: not computed by the
    launcher (in NumPy, out of the score counter's sight) before or after the
    launch, nor stored by the kernel and changed afterwards."""
    if not _stored(out, stores):
        raise fail(
            "kernel-not-written",
            detail=f"returns {what} that no launch of a kernel stored "
            "(computed "
            "outside the kernel)",
            case=case,
        )


def _require_lse_stored(lse, stores, case):
    """The log-sum-exp returned must be numbers a kernel stored."""
    if not _stored(lse, stores):
        raise fail("lse-not-stored", case=case)


def _overflow_failure(out, ref, q, k, case, what):
    """A non-finite result where the reference is finite, on scores past exp's
    float32 range: the running maximum is missing or stops following the scores
    (or, for the log-sum-exp, exp(m) is formed)."""
    top = float(np.max(q @ k.T / math.sqrt(q.shape[1])))
    if (
        np.isfinite(out).all()
        or not np.isfinite(ref).all()
        or top < math.log(np.finfo(np.float32).max)
    ):
        # not an overflow: other mistakes give NaN too (a row that sees no key)
        return None
    code = "lse-overflows" if what == "log-sum-exp" else "scores-overflow"
    return fail(code, detail=f"scores up to {top:.0f}", case=case)


def _forward_sizes(causal: bool) -> list[tuple[int, int, float]]:
    """(T, Dh, spread) of each case: the fixed ones, the grader's hidden ones,
    then one with large scores."""
    fixed = _CAUSAL_CASES if causal else _FORWARD_CASES
    sizes = fixed + hidden.triton_sizes(BLOCKS[0] if causal else None)
    return [(t, d, 2.0) for t, d in sizes] + [(48, 16, LARGE_SPREAD)]


def _forward_body(fn, label, causal):
    rng = np.random.default_rng(160 + causal)
    sizes = _forward_sizes(causal)
    for n, (t, d, spread) in enumerate(sizes, 1):
        q, k, v = _inputs(rng, t, d, spread)
        case = (
            f"case {n} of {len(sizes)}: q, k, v of shape "
            f"{shape_text(q.shape)}, scores of std {spread**2:.0f}"
        )
        stores = _kernel_stores(fn)
        out = as_array(
            _call_kernel(
                fn, _torch_args(q=q, k=k, v=v), label, 3, case, d, stores
            ),
            "result",
            case,
        )
        ref = tiled_forward(q, k, v, BLOCKS[0], causal=causal)[0]
        if not close(out, ref, ATOL, RTOL):
            overflow = _overflow_failure(out, ref, q, k, case, "output")
            if overflow:
                raise overflow
            _match(
                out, _forward_candidates(q, k, v, causal), case, ref, "output"
            )
        _require_stored(out, stores, case, "an output")
    if causal:
        _require_tiles_skipped(fn, label, rng, len(sizes) + 1)
    what = (
        "causal attention, T a multiple of the tile"
        if causal
        else "attention, T ragged and shorter than a tile"
    )
    extra = ", loading no key tile past the diagonal" if causal else ""
    return (
        f"✓ {display_name(fn, label)}: {len(sizes) + causal} random cases "
        f"({what}; large scores) match the "
        f"float64 reference{extra}"
    )


def _require_tiles_skipped(fn, label, rng, n):
    """The values of key tile [64, 80) are inf: a row before 64 may not see it,
    and only a program that loads it reads an inf (0 * inf is NaN, so even
    masked scores do not hide it). Rows 0..63 must come out finite and
    right."""
    t, d, first = _POISONED
    q, k, v = _inputs(rng, t, d)
    v[first : first + BLOCKS[0]] = np.inf
    case = (
        f"case {n} of {n}: q, k, v of shape {shape_text(q.shape)}, the "
        f"values of keys {first}..."
        f"{first + BLOCKS[0] - 1} set to inf"
    )
    out = as_array(
        _call_kernel(fn, _torch_args(q=q, k=k, v=v), label, 3, case, d),
        "result",
        case,
    )
    ref = tiled_forward(
        q[:first], k[:first], v[:first], BLOCKS[0], causal=True
    )[0]
    if not np.isfinite(out[:first]).all():
        rows = np.flatnonzero(~np.isfinite(out[:first]).all(axis=1))
        raise fail(
            "causal-tiles-not-skipped",
            detail=f"rows {rows.min()}..{rows.max()}",
            case=case,
        )
    if not close(out[:first], ref, ATOL, RTOL):
        diagnose(
            out[:first],
            None,
            [],
            case,
            ref,
            None,
            what="output rows 0..63",
            atol=ATOL,
            rtol=RTOL,
        )


def check_tile_loop(fn, *, timeout: float = TIMEOUT):
    """Chapter 16: check ``fn(q, k, v)`` -> out (T, Dh): attention of one head
    (scale 1 / sqrt(Dh), no mask) by a Triton kernel that walks over key tiles
    with the online softmax. q, k, v (T, Dh) float32 tensors; T is not a
    multiple of the tile in some cases, and one case has scores past exp's
    float32 range. Diagnoses ``[sum-not-rescaled]``, ``[stream-not-rescaled]``,
    ``[ragged-tile-unmasked]``, ``[weights-not-normalized]``,
    ``[scores-overflow]`` and ``[kernel-not-written]``."""
    observe.warm_up()
    run_check(
        lambda: _forward_body(fn, "attention_forward", causal=False), timeout
    )


def check_causal_tiles(fn, *, timeout: float = TIMEOUT):
    """Chapter 16: check ``fn(q, k, v)`` -> out (T, Dh): causal attention of
    one head (query i sees keys j <= i) by a kernel whose unmasked loop covers
    the tiles below the diagonal and whose masked loop covers the diagonal
    tile, then stops. T is a multiple of the tile of 16. Diagnoses
    ``[causal-bound-off-by-one-tile]``, ``[mask-ignored]``,
    ``[causal-tiles-not-skipped]`` (a tile past the diagonal loaded, seen
    through values set to inf), ``[scores-overflow]`` and
    ``[kernel-not-written]``."""
    observe.warm_up()
    run_check(
        lambda: _forward_body(fn, "causal_forward", causal=True), timeout
    )


# -----------------------------------------------------------------------------
# The log-sum-exp
# -----------------------------------------------------------------------------


def _lse_body(fn, label):
    rng = np.random.default_rng(162)
    sizes = _forward_sizes(causal=False)
    for n, (t, d, spread) in enumerate(sizes, 1):
        q, k, v = _inputs(rng, t, d, spread)
        case = (
            f"case {n} of {len(sizes)}: q, k, v of shape "
            f"{shape_text(q.shape)}, scores of std {spread**2:.0f}"
        )
        stores = _kernel_stores(fn)
        result = _call_kernel(
            fn, _torch_args(q=q, k=k, v=v), label, 3, case, d, stores
        )
        out, lse = split_result(result, case, ("out", "lse"))
        if lse is None:
            raise fail(
                "wrong-type",
                "Return the output AND the log-sum-exp of each row: (out, "
                "lse).",
                case=case,
            )
        out, lse = as_array(out, "out", case), as_array(lse, "lse", case)
        ref_out, ref_lse = tiled_forward(q, k, v, BLOCKS[0])
        if not close(out, ref_out, ATOL, RTOL):
            overflow = _overflow_failure(out, ref_out, q, k, case, "output")
            if overflow:
                raise overflow
            _match(out, _forward_candidates(q, k, v), case, ref_out, "output")
        _require_stored(out, stores, case, "an output")
        if close(lse, ref_lse, ATOL, RTOL):
            _require_lse_stored(lse, stores, case)
            continue
        overflow = _overflow_failure(lse, ref_lse, q, k, case, "log-sum-exp")
        if overflow:
            raise overflow
        row_max = np.max(q @ k.T / math.sqrt(d), axis=1)
        candidates = [
            ("lse-without-max", "", lambda m=row_max, r=ref_lse: r - m),
            ("lse-without-sum", "", lambda m=row_max: m),
        ]
        _match(lse, candidates, case, ref_lse, "log-sum-exp")
    return (
        f"✓ {display_name(fn, label)}: {len(sizes)} random cases match the "
        "float64 reference in the output and "
        "the log-sum-exp of each row"
    )


def check_lse(fn, *, timeout: float = TIMEOUT):
    """Chapter 16: check ``fn(q, k, v)`` -> (out (T, Dh), lse (T,)): the
    forward kernel's output and, per row, the log-sum-exp of its scaled scores,
    log(sum_j exp(q_i . k_j / sqrt(Dh))). Diagnoses ``[lse-without-max]`` and
    ``[lse-without-sum]``, ``[lse-overflows]``, ``[kernel-not-written]``,
    ``[lse-not-stored]`` (numbers no launch stored) and the tile loop's
    mistakes in the output."""
    observe.warm_up()
    run_check(lambda: _lse_body(fn, "forward_with_lse"), timeout)


# -----------------------------------------------------------------------------
# One term of the backward: dK
# -----------------------------------------------------------------------------


def dk_variant(q, k, v, do, *, subtract_d=True, scaled=True):
    """dK (T, Dh) of non-causal attention, float64: scale * dS^T Q with dS = P
    * (dP - D), D = rowsum(dO * O); ``subtract_d=False``: dS = P * dP;
    ``scaled=False``: without the scale."""
    scale = 1.0 / math.sqrt(q.shape[1])
    s = q @ k.T * scale
    p = np.exp(s - s.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    dp = do @ v.T
    d = np.sum(do * (p @ v), axis=1, keepdims=True) if subtract_d else 0.0
    return (scale if scaled else 1.0) * (p * (dp - d)).T @ q


def _dk_body(fn, label):
    rng = np.random.default_rng(163)
    sizes = _FORWARD_CASES + hidden.triton_sizes()
    for n, (t, d) in enumerate(sizes, 1):
        q, k, v = _inputs(rng, t, d, spread=1.0)
        do = rng.standard_normal((t, d))
        o, lse = tiled_forward(q, k, v, BLOCKS[0])
        case = (
            f"case {n} of {len(sizes)}: q, k, v, o, do of shape "
            f"{shape_text(q.shape)}, lse ({t},)"
        )
        args = _torch_args(q=q, k=k, v=v, o=o, lse=lse, do=do)
        stores = _kernel_stores(fn)
        dk = as_array(
            _call_kernel(fn, args, label, 6, case, d, stores), "dk", case
        )
        ref = dk_variant(q, k, v, do)
        if close(dk, ref, 1e-4, RTOL):
            _require_stored(dk, stores, case, "a dK")
            continue
        candidates = [
            (
                "ds-without-d",
                "",
                lambda: dk_variant(q, k, v, do, subtract_d=False),
            ),
            (
                "dk-missing-scale",
                "",
                lambda: dk_variant(q, k, v, do, scaled=False),
            ),
        ]
        _match(dk, candidates, case, ref, "dk")
    return (
        f"✓ {display_name(fn, label)}: {len(sizes)} random cases match "
        "dK of the float64 reference"
    )


def check_dk(fn, *, timeout: float = TIMEOUT):
    """Chapter 16: check ``fn(q, k, v, o, lse, do)`` -> dK (T, Dh): the
    gradient of the keys of non-causal attention of one head, from the
    forward's output o and log-sum-exp lse (T,) and the output's gradient do.
    Diagnoses ``[ds-without-d]``, ``[dk-missing-scale]`` and
    ``[kernel-not-written]``."""
    observe.warm_up()
    run_check(lambda: _dk_body(fn, "attention_dk"), timeout)


# -----------------------------------------------------------------------------
# The whole forward kernel
# -----------------------------------------------------------------------------


def flash_forward_reference(q, k, v, causal, *, top_left=False):
    """(out (Tq, Dv), lse (Tq,)) of one head, float64: the causal mask
    bottom-right (query i sees keys j <= i + Tk - Tq; ``top_left``: j <= i, the
    mistake), and rows that may attend no key give out 0, lse -inf."""
    t_q, t_k = len(q), len(k)
    s = q @ k.T / math.sqrt(q.shape[1])
    if causal:
        s = np.where(
            np.arange(t_k)[None, :]
            <= np.arange(t_q)[:, None] + (0 if top_left else t_k - t_q),
            s,
            -np.inf,
        )
    m = s.max(axis=1)
    seen = np.isfinite(m)
    safe = np.where(seen, m, 0.0)
    p = np.exp(s - safe[:, None])
    total = np.where(seen, p.sum(axis=1), 1.0)
    return np.where(seen[:, None], p @ v / total[:, None], 0.0), np.where(
        seen, safe + np.log(total), -np.inf
    )


# (Tq, Tk, Dh, causal): square and not, Tq > Tk (causal: the first rows see no
# key), T no multiple of a tile
_FLASH_CASES = [
    (37, 37, 16, False),
    (21, 50, 32, True),
    (50, 21, 16, True),
    (5, 40, 16, False),
    (32, 32, 16, True),
]


def _flash_case(fn, label, q, k, v, causal, case):
    """Run one case and compare the output, then the log-sum-exp (its -inf rows
    exactly)."""
    args = {**_torch_args(q=q, k=k, v=v), "is_causal": causal}
    stores = _kernel_stores(fn)
    out, lse = split_result(
        _call_kernel(fn, args, label, 3, case, q.shape[1], stores),
        case,
        ("out", "lse"),
    )
    if lse is None:
        raise fail(
            "wrong-type",
            "Return the output AND the log-sum-exp of each row: (out, lse).",
            case=case,
        )
    out, lse = as_array(out, "out", case), as_array(lse, "lse", case)
    ref_out, ref_lse = flash_forward_reference(q, k, v, causal)
    if not close(out, ref_out, ATOL, RTOL):
        blind = ~np.isfinite(ref_lse)  # rows that may attend no key
        if (
            blind.any()
            and not np.isfinite(out[blind]).all()
            and close(out[~blind], ref_out[~blind], ATOL, RTOL)
        ):
            raise fail("nan-on-masked-row", case=case)
        overflow = _overflow_failure(out, ref_out, q, k, case, "output")
        if overflow:
            raise overflow
        candidates = (
            [
                (
                    "mask-ignored",
                    "",
                    lambda: flash_forward_reference(q, k, v, False)[0],
                )
            ]
            if causal
            else []
        )
        if causal and len(q) != len(k):
            candidates.append(
                (
                    "causal-top-left-aligned",
                    "",
                    lambda: flash_forward_reference(
                        q, k, v, True, top_left=True
                    )[0],
                )
            )
        _match(out, candidates, case, ref_out, "output")
    _require_stored(out, stores, case, "an output")
    seen = np.isfinite(ref_lse)
    if (
        np.array_equal(np.isfinite(lse), seen)
        and close(lse[seen], ref_lse[seen], ATOL, RTOL)
        and (np.isneginf(lse[~seen]).all())
    ):
        _require_lse_stored(lse, stores, case)
        return
    overflow = _overflow_failure(
        lse[seen], ref_lse[seen], q[seen], k, case, "log-sum-exp"
    )
    if overflow:
        raise overflow
    row_max = np.max(
        np.where(
            np.isfinite(ref_lse)[:, None], q @ k.T / math.sqrt(q.shape[1]), 0.0
        ),
        axis=1,
    )
    _match(
        lse,
        [
            ("lse-without-max", "", lambda: ref_lse - row_max),
            ("lse-without-sum", "", lambda: row_max),
        ],
        case,
        ref_lse,
        "log-sum-exp",
    )


def _flash_body(fn, label):
    rng = np.random.default_rng(164)
    sizes = (
        _FLASH_CASES
        + [(t, t, d, True) for t, d in hidden.triton_sizes()]
        + [(48, 40, 16, True)]
    )
    for n, (t_q, t_k, d, causal) in enumerate(sizes, 1):
        spread = LARGE_SPREAD if n == len(sizes) else 2.0
        q = rng.standard_normal((t_q, d)) * spread
        k, v = (
            rng.standard_normal((t_k, d)) * spread,
            rng.standard_normal((t_k, d)),
        )
        case = (
            f"case {n} of {len(sizes)}: q {shape_text(q.shape)}, k and v "
            f"{shape_text(k.shape)}, "
            f"is_causal={causal}, scores of std {spread**2:.0f}"
        )
        _flash_case(fn, label, q, k, v, causal, case)
    _require_tiles_skipped(
        lambda q, k, v: split_result(fn(q, k, v, True), "", ("out", "lse"))[0],
        label,
        rng,
        len(sizes) + 1,
    )
    return (
        f"✓ {display_name(fn, label)}: {len(sizes) + 1} random cases (Tq != "
        "Tk, causal bottom-right and not, "
        "rows that see no key, large scores) match the float64 reference in "
        "the output and the log-sum-exp, "
        "loading no key tile past the diagonal"
    )


def check_flash_forward(fn, *, timeout: float = TIMEOUT):
    """Chapter 16: check ``fn(q, k, v, is_causal)`` -> (out (Tq, Dv), lse
    (Tq,)): the whole forward kernel of one head, q (Tq, Dh), k and v (Tk, Dh)
    float32, causal bottom-right (query i sees keys j <= i + Tk - Tq), rows
    that may attend no key giving out 0 and lse -inf. Diagnoses
    ``[causal-top-left-aligned]``, ``[mask-ignored]``, ``[nan-on-masked-row]``,
    ``[scores-overflow]``, ``[lse-overflows]``, ``[lse-without-max]``,
    ``[lse-without-sum]``, ``[lse-not-stored]``, ``[causal-tiles-not-skipped]``
    and ``[kernel-not-written]``."""
    observe.warm_up()
    run_check(lambda: _flash_body(fn, "flash_forward"), timeout)


# -----------------------------------------------------------------------------
# Question
# -----------------------------------------------------------------------------


number_question(
    "16.tiles-visited",
    answer=lambda: tiles.key_tiles_visited(7, 1000, 1000, 64, 64, True),
    why="query tile 7 holds rows 448..511; its last row sees keys "
    "0..511, which fill key tiles 0..7: 8 tiles, the "
    "last one (the diagonal) with the mask, and key tiles 8..15 are never "
    "loaded.",
    known={
        7: (
            "causal-bound-off-by-one-tile",
            "that leaves out the diagonal tile, which holds each row's own "
            "key.",
        ),
        9: (
            "causal-bound-off-by-one-tile",
            "key tile 8 starts at key 512, after the tile's last row (511): "
            "no "
            "row sees any of it.",
        ),
        16: "that is every key tile of the sequence: the causal loop "
        "stops at the diagonal.",
    },
    hint="Which keys does the LAST row of the query tile see, and which "
    "key tiles hold them?",
)
