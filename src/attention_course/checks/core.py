"""Checks of the attention core: softmax, attention for one query, scaled
dot-product attention (NumPy chapter 1, PyTorch, TensorFlow, einsum)."""

from __future__ import annotations

import contextlib
import math

import numpy as np

from .. import numpy_ref
from . import hidden
from .cases import sdpa_cases, to_framework, with_neg_inf
from .diagnosis import core_variants, diagnose, sdpa_variant
from .questions import choice_question, number_question
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


def _fused_attention_calls(framework, expected):
    """:class:`.observe.FusedAttentionCalls` for PyTorch code; NumPy and
    TensorFlow code calls no PyTorch kernel, and its check (chapter 1's, graded
    in a process of its own) then never imports PyTorch (about 1.5 s)."""
    if framework != "torch":
        return contextlib.nullcontext()
    from . import observe

    return observe.FusedAttentionCalls(expected)


def _observable(fn) -> bool:
    from . import observe

    return observe.observable(fn)


def sdpa_check_body(
    fn,
    framework,
    fully_masked_rows,
    label,
    atol,
    rtol,
    name=None,
    float_mask=False,
):
    """``label`` names the function in failure messages (the contract's name);
    ``name`` in the success line. When the hidden cases are on, the first of
    them is sent once more in the dtype the public cases do not use. The
    student's calls of ``F.scaled_dot_product_attention`` return NaN in rows
    that may attend nothing, as older kernels do
    (:class:`.observe.FusedAttentionCalls`): the guard must be the student's.
    With ``float_mask``, every case with a mask must reach that function with a
    float ``attn_mask`` (chapter 4's rule)."""
    cases = [(*case, None) for case in sdpa_cases(fully_masked_rows)]
    dtype = hidden.other_dtype(framework)
    if dtype is not None:
        first_hidden = cases[-len(hidden.sdpa_shapes(fully_masked_rows))]
        cases.append(
            (*first_hidden[:4], f"{first_hidden[4]}, as {dtype}", dtype)
        )
    for i, (q, k, v, mask, desc, dtype) in enumerate(cases, 1):
        case = f"case {i} of {len(cases)}: {desc}"
        args = {
            "q": to_framework(q, framework, dtype),
            "k": to_framework(k, framework, dtype),
            "v": to_framework(v, framework, dtype),
            "mask": to_framework(mask, framework),
        }
        # NumPy code computing in float32: float32's tolerance, not float64's
        if dtype == "float32":
            atol, rtol = max(atol, 2e-5), max(rtol, 1e-4)
        expected = (
            None
            if not float_mask or mask is None
            else np.broadcast_to(mask, ref_scores_shape(q, k, mask))
        )
        with _fused_attention_calls(framework, expected) as fused:
            result = call(fn, args, label, positional=3)
        if float_mask and mask is not None and _observable(fn):
            _require_float_mask(fused.mask_dtypes, case)
        out_s, w_s = split_result(result, case)
        out_s = as_array(
            out_s, "output" if w_s is not None else "result", case
        )
        w_s = None if w_s is None else as_array(w_s, "weights", case)
        ref_out, ref_w = numpy_ref.scaled_dot_product_attention(q, k, v, mask)
        if close(out_s, ref_out, atol, rtol) and (
            w_s is None or close(w_s, ref_w, atol, rtol)
        ):
            if (
                float_mask
                and mask is not None
                and _observable(fn)
                and not any(e is not False for e in fused.encodes)
            ):
                raise fail("float-mask-not-used", case=case)
            continue
        tq, dk = q.shape[-2:]
        tk, dv = v.shape[-2:]
        variants = core_variants(
            dk, dv, tq, tk, q.ndim, mask is not None, fully_masked_rows
        )
        candidates = [
            (c, d, lambda kw=kw: sdpa_variant(q, k, v, mask, **kw))
            for c, d, kw in variants
        ]
        diagnose(
            out_s, w_s, candidates, case, ref_out, ref_w, atol=atol, rtol=rtol
        )
    extras = "Tq != Tk, masks, batch dims" + (
        ", fully masked rows" if fully_masked_rows else ""
    )
    return (
        f"✓ {name or label}: {len(cases)} random cases ({extras}) match "
        "the reference"
    )


def ref_scores_shape(q, k, mask) -> tuple[int, ...]:
    """The shape of the scores of q (..., Tq, Dk) and k (..., Tk, Dk), with the
    mask's batch axes."""
    return np.broadcast_shapes(q.shape[:-2], k.shape[:-2], mask.shape[:-2]) + (
        q.shape[-2],
        k.shape[-2],
    )


def _require_float_mask(mask_dtypes, case):
    """Chapter 4's rule: the boolean mask turned into an additive float mask,
    passed to the fused function."""
    if not mask_dtypes:
        raise fail(
            "float-mask-not-passed",
            detail="your function never calls F.scaled_dot_product_attention",
            case=case,
        )
    if any(
        dtype is None or not dtype.is_floating_point for dtype in mask_dtypes
    ):
        passed = ", ".join(
            "no attn_mask" if d is None else f"an attn_mask of dtype {d}"
            for d in mask_dtypes
        )
        raise fail(
            "float-mask-not-passed",
            detail=f"your function passes {passed}",
            case=case,
        )


_FRAMEWORKS = ("torch", "tf", "numpy")


def _check_framework(framework: str) -> None:
    if framework not in _FRAMEWORKS:
        raise ValueError(
            f"framework must be one of {', '.join(map(repr, _FRAMEWORKS))}, "
            f"got {framework!r}"
        )


def check_scaled_dot_product_attention(
    fn,
    *,
    fully_masked_rows: bool = True,
    framework: str = "torch",
    timeout: float = DEFAULT_TIMEOUT,
):
    """Check ``fn(q, k, v, mask=None)`` against the reference.

    q (..., Tq, Dk), k (..., Tk, Dk), v (..., Tk, Dv) are float32 tensors of
    ``framework``: ``"torch"`` (default), ``"tf"`` (TensorFlow, imported only
    then) or ``"numpy"`` (float64 arrays, compared more tightly); ``mask`` is
    None or a boolean tensor broadcastable to (..., Tq, Tk), True = may attend.
    ``fn`` returns out (..., Tq, Dv) or (out, weights), as tensors or arrays of
    any of these frameworks. With ``fully_masked_rows`` (default) some query
    rows may attend no key: they must give zero weights and a zero output.
    """
    _check_framework(framework)
    label = "scaled_dot_product_attention"
    atol, rtol = (1e-8, 1e-6) if framework == "numpy" else (2e-5, 1e-4)
    run_check(
        lambda: sdpa_check_body(
            fn,
            framework,
            fully_masked_rows,
            label,
            atol,
            rtol,
            display_name(fn, label),
        ),
        timeout,
    )


def check_float_mask_attention(fn, *, timeout: float = DEFAULT_TIMEOUT):
    """Chapter 4: check ``fn(q, k, v, mask=None)`` as
    :func:`check_scaled_dot_product_attention` (torch, fully masked rows), for
    code that turns the boolean ``mask`` into an additive float mask and passes
    THAT to
    ``F.scaled_dot_product_attention``: every call with a mask must reach that
    function with a floating-point ``attn_mask`` (``[float-mask-not-passed]``),
    one of them the mask made additive, 0 where it allows a key and -1e4 or
    less where it blocks one (``[float-mask-not-used]``: a float mask passed,
    the output computed otherwise), and the rows that may attend nothing must
    be zero whatever the kernel returns there (it returns NaN inside this
    check, as older kernels do: ``[nan-on-masked-row]``)."""
    label = "attention_float_mask"
    name = display_name(fn, label)
    run_check(
        lambda: sdpa_check_body(
            fn, "torch", True, label, 2e-5, 1e-4, name, float_mask=True
        ).replace(
            " match the reference",
            " match the reference, each through "
            "F.scaled_dot_product_attention with a float "
            "mask",
        ),
        timeout,
    )


def check_numpy_attention(
    fn, *, fully_masked_rows: bool = False, timeout: float = DEFAULT_TIMEOUT
):
    """Chapter 1: check ``fn(q, k, v, mask=None)`` on NumPy float64 arrays
    (same contract as :func:`check_scaled_dot_product_attention`). Fully masked
    rows are only tested if ``fully_masked_rows``."""
    label = "attention (NumPy)"
    name = display_name(fn, label)
    run_check(
        lambda: sdpa_check_body(
            fn, "numpy", fully_masked_rows, label, 1e-8, 1e-6, name
        ),
        timeout,
    )


def _one_query_candidates(q, k, v):
    """The known mistakes of attention for one query (the attention core's,
    without a softmax over queries)."""
    dk, dv, tk = q.shape[-1], v.shape[-1], k.shape[0]
    variants = [
        c
        for c in core_variants(dk, dv, 1, tk, 2, False, False)
        if c[0] != "softmax-wrong-axis"
    ]
    return [
        (
            c,
            d,
            lambda kw=kw: tuple(
                a[0] for a in sdpa_variant(q[None], k, v, None, **kw)
            ),
        )
        for c, d, kw in variants
    ]


def _one_query_body(fn, label, cases, candidates):
    """``cases``: (q, k, v, description, large) tuples; ``candidates(q, k,
    v)``: the mistakes to name."""
    for i, (q, k, v, text, large) in enumerate(cases, 1):
        shapes_text = (
            f"q {shape_text(q.shape)}, k {shape_text(k.shape)}, v "
            f"{shape_text(v.shape)}"
        )
        case = f"case {i} of {len(cases)}: {shapes_text}{text}"
        result = call(fn, {"q": q.copy(), "k": k.copy(), "v": v.copy()}, label)
        out_s, w_s = split_result(result, case)
        out_s = as_array(
            out_s, "output" if w_s is not None else "result", case
        )
        w_s = None if w_s is None else as_array(w_s, "weights", case)
        ref_out, ref_w = (
            a[0] for a in numpy_ref.scaled_dot_product_attention(q[None], k, v)
        )
        if close(out_s, ref_out, 1e-8, 1e-6) and (
            w_s is None or close(w_s, ref_w, 1e-8, 1e-6)
        ):
            continue
        if (
            large
            and out_s.shape == ref_out.shape
            and not np.all(np.isfinite(out_s))
        ):
            raise fail(
                "softmax-overflow",
                "Your output has NaN or inf when the scores reach about "
                "+-1000: e^1000 "
                "overflows to inf (and e^-1000 underflows to 0, so a sum of "
                "them is 0). Never exponentiate a "
                "raw score: keep the log-sum-exp in log space, "
                "np.logaddexp(a, b) = log(e^a + e^b), and "
                "exponentiate only differences such as s - lse, which are "
                "never positive.",
                case=case,
            )
        diagnose(
            out_s,
            w_s,
            candidates(q, k, v),
            case,
            ref_out,
            ref_w,
            atol=1e-8,
            rtol=1e-6,
        )


def _one_query_cases(shapes, rng):
    return [
        (
            rng.standard_normal(dk),
            rng.standard_normal((tk, dk)),
            rng.standard_normal((tk, dv)),
            "",
            False,
        )
        for tk, dk, dv in shapes
    ]


def check_attention_one_query(fn, *, timeout: float = DEFAULT_TIMEOUT):
    """Chapter 1: check ``fn(q, k, v)`` for ONE query: q (Dk,), k (Tk, Dk), v
    (Tk, Dv) NumPy arrays -> output (Dv,) or (output, weights (Tk,))."""

    def body():
        rng = np.random.default_rng(1)
        shapes = [
            (4, 6, 6),
            (1, 3, 3),
            (5, 8, 3),
            (7, 4, 10),
            (3, 16, 16),
            (9, 2, 5),
            *hidden.one_query_shapes(),
        ]
        cases = _one_query_cases(shapes, rng)
        _one_query_body(
            fn, "attention_one_query", cases, _one_query_candidates
        )
        return (
            f"✓ {display_name(fn, 'attention for one query')}: "
            f"{len(shapes)} random cases (one query; several Tk, "
            "d_k != d_v) match the reference"
        )

    run_check(body, timeout)


def _stream(q, k, v, rescale="right", form="lse", normalize=True):
    """Chapter 9's streams over the keys of one query, right or wrong, float64:
    ``form`` "lse" keeps the log-sum-exp and the running output, "max" the
    running maximum, sum and accumulator; ``rescale`` "right", "none" (what was
    accumulated is never rescaled) or "inverted" (rescaled by the inverse
    factor); with ``normalize=False`` the "max" form returns its accumulator
    without dividing by the sum."""
    scores = k @ q / math.sqrt(q.shape[-1])
    # ref: the running lse or maximum
    ref, total, out = -np.inf, 0.0, np.zeros(v.shape[-1])
    for s, v_j in zip(scores, v, strict=True):
        new = np.logaddexp(ref, s) if form == "lse" else max(ref, s)
        factor = (
            0.0
            if ref == -np.inf
            else {
                "right": math.exp(ref - new),
                "none": 1.0,
                "inverted": math.exp(new - ref),
            }[rescale]
        )
        p = math.exp(s - new)
        total = total * factor + p
        out = out * factor + p * v_j
        ref = new
    if form == "max" and normalize:
        out = out / total
    return out, None


def _streaming_candidates(q, k, v):
    """The streams' own mistakes first (they are what this exercise is about),
    then the attention core's."""
    stream = [
        (
            "stream-not-rescaled",
            "the running output is never rescaled: the old keys keep their "
            "full weight when a "
            "new key arrives",
            {"rescale": "none"},
        ),
        (
            "stream-not-rescaled",
            "the running sum and accumulator are never rescaled when the "
            "maximum rises",
            {"rescale": "none", "form": "max"},
        ),
        (
            "stream-not-rescaled",
            "the running output is rescaled by the inverse factor, "
            "e^(lse_new - lse_old): it "
            "grows where it should shrink",
            {"rescale": "inverted"},
        ),
        (
            "stream-not-rescaled",
            "the running sum and accumulator are rescaled by the inverse "
            "factor, "
            "e^(m_new - m_old)",
            {"rescale": "inverted", "form": "max"},
        ),
        (
            "weights-not-normalized",
            "you return the accumulator without dividing it by the running "
            "sum",
            {"form": "max", "normalize": False},
        ),
    ]
    return [
        (c, d, lambda kw=kw: _stream(q, k, v, **kw)) for c, d, kw in stream
    ] + _one_query_candidates(q, k, v)


# the memory case's keys: a score for each is 32 KiB in float64; a stream holds
# about 1 KiB
LONG_KEYS = 4096


def _require_streamed(fn, rng, n):
    """The stream's own case: many keys, and what the call holds at once.
    A first call runs inside :class:`.observe.PerKeyTensors` (in PyTorch, a
    tensor with an axis of one entry per key holds a score per key), then two
    inside :class:`.observe.PeakMemory` alone, whose smaller measurement
    counts (a first call may fill caches that stay): a stream holds its
    running values only, code that holds a score per key needs 8 bytes a key
    or more. Every call counts the key rows read
    (:class:`.observe.RowReads`), which tells no loop from a loop that stores,
    and one pass from several."""
    q, k, v = (
        rng.standard_normal(4),
        rng.standard_normal((LONG_KEYS, 4)),
        rng.standard_normal((LONG_KEYS, 3)),
    )
    case = (
        f"case {n} of {n}: q {shape_text(q.shape)}, k "
        f"{shape_text(k.shape)}, v {shape_text(v.shape)}"
    )
    from . import observe

    here, peaks, per_key = observe.runs_here(fn), [], False
    for run in range(3):
        watch = (
            observe.PerKeyTensors(LONG_KEYS, (4, 3))
            if run == 0
            else observe.PeakMemory()
        )
        reads = observe.RowReads(1)

        def measured(q, k, v, watch=watch, reads=reads):
            with watch, reads:
                return fn(q, reads.wrap(k) if here else k, v)

        out_s, w_s = split_result(
            call(measured, {"q": q, "k": k, "v": v}, "streaming_attend"), case
        )
        out_s = as_array(
            out_s, "output" if w_s is not None else "result", case
        )
        ref_out = numpy_ref.scaled_dot_product_attention(q[None], k, v)[0][0]
        if not close(out_s, ref_out, 1e-8, 1e-6):
            diagnose(
                out_s,
                None,
                _streaming_candidates(q, k, v),
                case,
                ref_out,
                None,
                atol=1e-8,
                rtol=1e-6,
            )
        if run == 0:
            per_key = watch.per_key
        else:
            peaks.append(watch.peak)
    # a quarter of a float64 per key, or a tensor of them
    if min(peaks) > 2 * LONG_KEYS or per_key:
        detail = (
            f"it held {min(peaks) / 1024:.0f} KiB at once for the "
            f"{LONG_KEYS} keys of this case"
            if min(peaks) > 2 * LONG_KEYS
            else f"it formed a tensor of one number per key ({LONG_KEYS})"
        )
        raise fail(
            "not-streamed" if reads.reads < LONG_KEYS else "scores-stored",
            detail=detail,
            case=case,
        )
    if reads.reads >= 2 * LONG_KEYS:
        raise fail(
            "keys-read-twice",
            detail=f"{reads.reads} key rows for {LONG_KEYS} keys",
            case=case,
        )


def check_streaming_attention(fn, *, timeout: float = DEFAULT_TIMEOUT):
    """Chapter 9: check ``fn(q, k, v)`` for ONE query, as
    :func:`check_attention_one_query`, for code that streams over the keys.
    Cases with scores of about +-1000 are added (exponentiating a raw score
    overflows there: ``[softmax-overflow]``), and the streams' own mistakes are
    named: what was accumulated not rescaled, or rescaled by the inverse
    factor, when a key arrives (``[stream-not-rescaled]``), an accumulator
    returned without its division by the running sum
    (``[weights-not-normalized]``). A last case of 4096 keys measures the
    memory the call needs: a score (or weight) held for every key is no stream,
    whether computed at once (``[not-streamed]``: the keys never read one at a
    time) or in a loop (``[scores-stored]``), and counts the key rows read: a
    stream reads each once (``[keys-read-twice]``: a pass for the maximum, then
    the sums)."""

    def body():
        rng = np.random.default_rng(9)
        shapes = [
            (6, 4, 3),
            (1, 3, 3),
            (9, 8, 5),
            (4, 2, 6),
            *hidden.one_query_shapes(),
        ]
        cases = _one_query_cases(shapes, rng)
        q = rng.standard_normal(4)
        cases.append(
            (
                q * 30,
                rng.standard_normal((7, 4)) * 30,
                rng.standard_normal((7, 3)),
                ", scores of about +-1000",
                True,
            )
        )
        # every score about -1000 (q . k / sqrt(4) = -1000 before the noise)
        far = -q * 1000 / (q @ q) * 2
        cases.append(
            (
                q,
                far + rng.standard_normal((5, 4)),
                rng.standard_normal((5, 2)),
                ", every score about -1000",
                True,
            )
        )
        _one_query_body(fn, "streaming_attend", cases, _streaming_candidates)
        _require_streamed(fn, rng, len(cases) + 1)
        return (
            f"✓ {display_name(fn, 'streaming attention')}: {len(cases) + 1} "
            "random cases (one query; several "
            "Tk, d_k != d_v, scores up to +-1000) match the reference; "
            f"{LONG_KEYS} keys streamed, no score "
            "kept per key"
        )

    run_check(body, timeout)


def check_softmax(fn, *, timeout: float = DEFAULT_TIMEOUT):
    """Chapter 1: check a NumPy ``fn(x)`` = softmax along the last axis: any
    shape, large values, -inf entries (every row keeps at least one finite
    entry); the input must not be modified."""

    def body():
        rng = np.random.default_rng(2)
        xs = [
            ("a vector of 5 values", rng.standard_normal(5) * 3),
            ("a (3, 4) matrix", rng.standard_normal((3, 4)) * 3),
            ("a (2, 3, 5) array", rng.standard_normal((2, 3, 5)) * 3),
            ("a (4, 4) matrix", rng.standard_normal((4, 4))),
            (
                "a vector of large values (about 1000)",
                1000 + rng.standard_normal(6),
            ),
            (
                "a (3, 5) matrix of large values (up to 800)",
                rng.standard_normal((3, 5)) * 300,
            ),
            (
                "a (2, 6) matrix of very negative values (about -1000)",
                -1000 + rng.standard_normal((2, 6)),
            ),
            ("a (4, 5) matrix with -inf entries", with_neg_inf(rng, (4, 5))),
            (
                "a (2, 2, 6) array with -inf entries",
                with_neg_inf(rng, (2, 2, 6)),
            ),
            (
                "a (5, 1) matrix (one entry per row)",
                rng.standard_normal((5, 1)),
            ),
            *hidden.softmax_inputs(),
        ]
        for i, (text, x) in enumerate(xs, 1):
            case = f"case {i} of {len(xs)}: {text}"
            out_s = as_array(
                call(fn, {"x": x.copy()}, "softmax"), "result", case
            )
            atol, rtol = (
                _FLOAT32_TOLERANCE if x.dtype == np.float32 else (1e-8, 1e-6)
            )
            # the reference and the mistakes in float64, whatever the input's
            # dtype
            x = x.astype(np.float64)
            ref = numpy_ref.softmax(x)
            if close(out_s, ref, atol, rtol):
                continue
            candidates = [
                (
                    "softmax-overflow",
                    "",
                    lambda x=x: (numpy_ref.softmax_unstable(x), None),
                ),
                (
                    "softmax-global-max",
                    "",
                    lambda x=x: (_global_max_softmax(x), None),
                ),
                (
                    "weights-not-normalized",
                    "you take exp() without dividing by the sum",
                    lambda x=x: (np.exp(x), None),
                ),
                (
                    "weights-not-normalized",
                    "you take exp() without dividing by the sum",
                    lambda x=x: (
                        np.exp(x - x.max(axis=-1, keepdims=True)),
                        None,
                    ),
                ),
                (
                    "weights-not-normalized",
                    "you divide by the sum of the inputs instead of the sum "
                    "of exp()",
                    lambda x=x: (
                        np.exp(x) / x.sum(axis=-1, keepdims=True),
                        None,
                    ),
                ),
                (
                    "softmax-wrong-axis",
                    "you normalised over the whole array at once",
                    lambda x=x: (
                        np.exp(x - x.max()) / np.exp(x - x.max()).sum(),
                        None,
                    ),
                ),
            ]
            for axis in range(x.ndim - 1):
                candidates.append(
                    (
                        "softmax-wrong-axis",
                        f"you normalised along axis {axis}",
                        lambda x=x, axis=axis: (
                            numpy_ref.softmax(x, axis=axis),
                            None,
                        ),
                    )
                )
                candidates.append(
                    (
                        "softmax-wrong-axis",
                        f"you normalised along axis {axis} (no max "
                        "subtraction)",
                        lambda x=x, axis=axis: (
                            numpy_ref.softmax_unstable(x, axis=axis),
                            None,
                        ),
                    )
                )
            diagnose(
                out_s,
                None,
                candidates,
                case,
                ref,
                None,
                what="result",
                atol=1e-8,
                rtol=1e-6,
            )
        return (
            f"✓ {display_name(fn, 'softmax')}: {len(xs)} random cases (1-D "
            "to 3-D, large values, -inf entries) "
            "match the reference; the input is left unchanged"
        )

    run_check(body, timeout)


# (atol, rtol) of a softmax computed in float32
_FLOAT32_TOLERANCE = (2e-6, 2e-5)


def _global_max_softmax(x: np.ndarray) -> np.ndarray:
    """The mistake of subtracting the maximum of the whole array instead of
    each row's: rows far below it underflow to 0 / 0."""
    e = np.exp(x - np.max(x))
    return e / e.sum(axis=-1, keepdims=True)


# -----------------------------------------------------------------------------
# Checked questions of chapters 1, 7 and 9 (see .questions); the read-the-plot
# data is drawn from a seeded hidden choice
# -----------------------------------------------------------------------------


def scale_mystery(d_k: int = 64, t: int = 8, seed: int = 1) -> np.ndarray:
    """Chapter 1, read-the-plot: the (t, t) attention weights of random queries
    and keys of width ``d_k`` (entries of mean 0, variance 1), with the scores
    scaled in a way question ``1.which-scale`` asks about."""
    q, k = np.random.default_rng(seed).standard_normal((2, t, d_k))
    return numpy_ref.softmax(q @ k.T)  # the hidden choice: no scaling at all


def bug_mystery(t: int = 6, seed: int = 7) -> np.ndarray:
    """Chapter 7, read-the-plot: the (t, t) weights of causal self-attention
    computed by one of the bugs that question ``7.which-bug`` lists."""
    x = np.random.default_rng(seed).standard_normal((t, 8))
    mask = np.tril(np.ones((t, t), dtype=bool))
    scores = np.where(mask, x @ x.T / np.sqrt(8), -np.inf)
    # the hidden choice: softmax over the queries (axis -2)
    return numpy_ref.softmax(scores.T).T


choice_question(
    "1.shift",
    answer="A",
    why="softmax(x + c) = softmax(x): the factor e^c cancels between "
    "numerator and denominator, and the chapter's "
    "softmax subtracts the row maximum, so nothing overflows.",
    wrong={
        "B": "adding the same number to every score keeps their "
        "differences, and only differences matter to softmax.",
        "C": (
            "softmax-overflow",
            "only a softmax that exponentiates the raw scores overflows "
            "(e^1000 = inf); the "
            "chapter's softmax subtracts the row maximum first.",
        ),
    },
)
number_question(
    "1.score-std",
    answer=8.0,
    rtol=0.1,
    why="q . k is a sum of d_k = 64 products of variance 1: its "
    "variance is 64, its standard deviation sqrt(64) = 8.",
    known={
        64.0: "64 is the VARIANCE of the sum of 64 unit-variance "
        "products; its standard deviation is the square root.",
        1.0: (
            "missing-scale",
            "about 1 is the spread AFTER dividing by sqrt(d_k); the "
            "question asks about the raw "
            "dot product.",
        ),
    },
    hint="The score is a sum of d_k independent products, each of mean 0 "
    "and variance 1.",
)
choice_question(
    "1.which-scale",
    answer="B",
    why="almost every row puts nearly all its weight on one key: raw "
    "dot products of width 64 spread over about +-8, "
    "and softmax saturates. That is what dividing by sqrt(d_k) prevents.",
    wrong={
        "A": "with 1/sqrt(d_k) the scores have a spread of about 1 and "
        "the rows spread their weight over several keys.",
        "C": (
            "wrong-scale",
            "dividing by d_k = 64 shrinks the scores to about +-0.1: the "
            "rows would be nearly "
            "uniform, not one-hot.",
        ),
    },
)
number_question(
    "7.scale-by-d",
    answer=8.0,
    rtol=1e-3,
    why="the muP model's scores are q . k / 64; divided by sqrt(64) = 8 "
    "instead, they are 64 / 8 = 8 times larger, "
    "and every row of weights is much sharper than the one the model was "
    "trained with.",
    known={
        64.0: "64 is d_k itself: the scores are divided by sqrt(64) = 8 "
        "instead of 64, a factor 64 / 8.",
        0.125: (
            "wrong-scale",
            "dividing by 8 instead of 64 makes the scores LARGER, not "
            "smaller.",
        ),
        1.0: (
            "wrong-scale",
            "the scale is part of the function the model learned: 1/d_k and "
            "1/sqrt(d_k) differ.",
        ),
    },
    hint="Write both scores as q . k divided by something, and take "
    "their ratio.",
)
choice_question(
    "7.which-bug",
    answer="B",
    why="each COLUMN sums to 1: the last key has a single allowed query "
    "(the last one), which gets weight 1, so the "
    "bottom-right entry is 1; the softmax was taken over the queries "
    "instead of the keys.",
    wrong={
        "A": (
            "mask-inverted",
            "an inverted causal mask would put the weight ABOVE the "
            "diagonal (the future).",
        ),
        "C": (
            "missing-scale",
            "without the scale the ROWS still sum to 1, the first row has "
            "its single weight 1 on "
            "key 0, and the rows are sharper; here the first row does not "
            "sum to 1.",
        ),
        "D": (
            "transposed-scores",
            "transposed scores with a causal mask are still normalised over "
            "each row; here "
            "the rows do not sum to 1.",
        ),
    },
)
number_question(
    "9.scores-memory",
    answer=4.0,
    rtol=1e-3,
    why="16 heads x 8192 x 8192 scores x 4 bytes = 2^32 bytes = 4 GiB, "
    "for one layer of one sequence.",
    known={
        2.0: "that is float16 (2 bytes per score); the question asks "
        "about float32.",
        0.25: "that is ONE head; all 16 heads' scores exist at the same time.",
    },
    hint="Count heads x T_q x T_k numbers, times the bytes of one "
    "float32, and divide by 2^30.",
)
number_question(
    "9.rescale",
    answer=math.exp(-3.0),
    rtol=1e-3,
    why="l was a sum of e^(s - 2); measured from the new maximum 5 each "
    "term is e^(s - 5) = e^(s - 2) e^(-3).",
    known={
        math.exp(
            3.0
        ): "e^3 would be the factor from the new maximum back to the "
        "old one: the sum must shrink, not "
        "grow, when the maximum rises.",
        1.0: "the old terms were measured from the old maximum 2: they "
        "must be rescaled to the new maximum 5.",
        0.0: "the old keys do not disappear: their terms are rescaled, "
        "not dropped.",
    },
    hint="Write one old term e^(s - m_old) in terms of e^(s - m_new).",
)
