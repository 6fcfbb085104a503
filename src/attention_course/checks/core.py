"""Checks of the attention core: softmax, attention for one query, scaled dot-product attention (NumPy chapter 1,
PyTorch, TensorFlow, einsum)."""

from __future__ import annotations

import numpy as np

from .. import numpy_ref
from . import hidden
from .cases import sdpa_cases, to_framework, with_neg_inf
from .diagnosis import core_variants, diagnose, sdpa_variant
from .runner import DEFAULT_TIMEOUT, as_array, call, close, display_name, run_check, shape_text, split_result


def sdpa_check_body(fn, framework, fully_masked_rows, label, atol, rtol, name=None):
    """``label`` names the function in failure messages (the contract's name); ``name`` in the success line."""
    cases = list(sdpa_cases(fully_masked_rows))
    for i, (q, k, v, mask, desc) in enumerate(cases, 1):
        case = f"case {i} of {len(cases)}: {desc}"
        args = {"q": to_framework(q, framework), "k": to_framework(k, framework), "v": to_framework(v, framework),
                "mask": to_framework(mask, framework)}
        result = call(fn, args, label, positional=3)
        out_s, w_s = split_result(result, case)
        out_s = as_array(out_s, "output" if w_s is not None else "result", case)
        w_s = None if w_s is None else as_array(w_s, "weights", case)
        ref_out, ref_w = numpy_ref.scaled_dot_product_attention(q, k, v, mask)
        if close(out_s, ref_out, atol, rtol) and (w_s is None or close(w_s, ref_w, atol, rtol)):
            continue
        tq, dk = q.shape[-2:]
        tk, dv = v.shape[-2:]
        variants = core_variants(dk, dv, tq, tk, q.ndim, mask is not None, fully_masked_rows)
        candidates = [(c, d, lambda kw=kw: sdpa_variant(q, k, v, mask, **kw)) for c, d, kw in variants]
        diagnose(out_s, w_s, candidates, case, ref_out, ref_w, atol=atol, rtol=rtol)
    extras = "Tq != Tk, masks, batch dims" + (", fully masked rows" if fully_masked_rows else "")
    return f"✓ {name or label}: {len(cases)} random cases ({extras}) match the reference"


_FRAMEWORKS = ("torch", "tf", "numpy")


def _check_framework(framework: str) -> None:
    if framework not in _FRAMEWORKS:
        raise ValueError(f"framework must be one of {', '.join(map(repr, _FRAMEWORKS))}, got {framework!r}")


def check_scaled_dot_product_attention(fn, *, fully_masked_rows: bool = True, framework: str = "torch",
                                       timeout: float = DEFAULT_TIMEOUT):
    """Check ``fn(q, k, v, mask=None)`` against the reference.

    q (..., Tq, Dk), k (..., Tk, Dk), v (..., Tk, Dv) are float32 tensors of ``framework``: ``"torch"`` (default),
    ``"tf"`` (TensorFlow, imported only then) or ``"numpy"`` (float64 arrays, compared more tightly); ``mask`` is
    None or a boolean tensor broadcastable to (..., Tq, Tk), True = may attend. ``fn`` returns out (..., Tq, Dv) or
    (out, weights), as tensors or arrays of any of these frameworks. With ``fully_masked_rows`` (default) some
    query rows may attend no key: they must give zero weights and a zero output.
    """
    _check_framework(framework)
    label = "scaled_dot_product_attention"
    atol, rtol = (1e-8, 1e-6) if framework == "numpy" else (2e-5, 1e-4)
    run_check(lambda: sdpa_check_body(fn, framework, fully_masked_rows, label, atol, rtol, display_name(fn, label)),
               timeout)


def check_numpy_attention(fn, *, fully_masked_rows: bool = False, timeout: float = DEFAULT_TIMEOUT):
    """Chapter 1: check ``fn(q, k, v, mask=None)`` on NumPy float64 arrays (same contract as
    :func:`check_scaled_dot_product_attention`). Fully masked rows are only tested if ``fully_masked_rows``."""
    label = "attention (NumPy)"
    run_check(lambda: sdpa_check_body(fn, "numpy", fully_masked_rows, label, 1e-8, 1e-6, display_name(fn, label)), timeout)


def check_attention_one_query(fn, *, timeout: float = DEFAULT_TIMEOUT):
    """Chapter 1: check ``fn(q, k, v)`` for ONE query: q (Dk,), k (Tk, Dk), v (Tk, Dv) NumPy arrays ->
    output (Dv,) or (output, weights (Tk,))."""

    def body():
        rng = np.random.default_rng(1)
        shapes = [(4, 6, 6), (1, 3, 3), (5, 8, 3), (7, 4, 10), (3, 16, 16), (9, 2, 5), *hidden.one_query_shapes()]
        for i, (tk, dk, dv) in enumerate(shapes, 1):
            q, k, v = rng.standard_normal(dk), rng.standard_normal((tk, dk)), rng.standard_normal((tk, dv))
            case = f"case {i} of {len(shapes)}: q {shape_text(q.shape)}, k {shape_text(k.shape)}, v {shape_text(v.shape)}"
            result = call(fn, {"q": q.copy(), "k": k.copy(), "v": v.copy()}, "attention_one_query")
            out_s, w_s = split_result(result, case)
            out_s = as_array(out_s, "output" if w_s is not None else "result", case)
            w_s = None if w_s is None else as_array(w_s, "weights", case)
            ref_out, ref_w = (a[0] for a in numpy_ref.scaled_dot_product_attention(q[None], k, v))
            if close(out_s, ref_out, 1e-8, 1e-6) and (w_s is None or close(w_s, ref_w, 1e-8, 1e-6)):
                continue
            variants = [c for c in core_variants(dk, dv, 1, tk, 2, False, False) if c[0] != "softmax-wrong-axis"]
            candidates = [
                (c, d, lambda kw=kw: tuple(a[0] for a in sdpa_variant(q[None], k, v, None, **kw)))
                for c, d, kw in variants
            ]
            diagnose(out_s, w_s, candidates, case, ref_out, ref_w, atol=1e-8, rtol=1e-6)
        return (f"✓ {display_name(fn, 'attention for one query')}: {len(shapes)} random cases (one query; several Tk, "
                "d_k != d_v) match the reference")

    run_check(body, timeout)


def check_softmax(fn, *, timeout: float = DEFAULT_TIMEOUT):
    """Chapter 1: check a NumPy ``fn(x)`` = softmax along the last axis: any shape, large values, -inf entries
    (every row keeps at least one finite entry); the input must not be modified."""

    def body():
        rng = np.random.default_rng(2)
        xs = [
            ("a vector of 5 values", rng.standard_normal(5) * 3),
            ("a (3, 4) matrix", rng.standard_normal((3, 4)) * 3),
            ("a (2, 3, 5) array", rng.standard_normal((2, 3, 5)) * 3),
            ("a (4, 4) matrix", rng.standard_normal((4, 4))),
            ("a vector of large values (about 1000)", 1000 + rng.standard_normal(6)),
            ("a (3, 5) matrix of large values (up to 800)", rng.standard_normal((3, 5)) * 300),
            ("a (2, 6) matrix of very negative values (about -1000)", -1000 + rng.standard_normal((2, 6))),
            ("a (4, 5) matrix with -inf entries", with_neg_inf(rng, (4, 5))),
            ("a (2, 2, 6) array with -inf entries", with_neg_inf(rng, (2, 2, 6))),
            ("a (5, 1) matrix (one entry per row)", rng.standard_normal((5, 1))),
            *hidden.softmax_inputs(),
        ]
        for i, (text, x) in enumerate(xs, 1):
            case = f"case {i} of {len(xs)}: {text}"
            out_s = as_array(call(fn, {"x": x.copy()}, "softmax"), "result", case)
            ref = numpy_ref.softmax(x)
            if close(out_s, ref, 1e-8, 1e-6):
                continue
            candidates = [
                ("softmax-overflow", "", lambda x=x: (numpy_ref.softmax_unstable(x), None)),
                ("softmax-global-max", "", lambda x=x: (_global_max_softmax(x), None)),
                ("weights-not-normalized", "you take exp() without dividing by the sum",
                 lambda x=x: (np.exp(x), None)),
                ("weights-not-normalized", "you take exp() without dividing by the sum",
                 lambda x=x: (np.exp(x - x.max(axis=-1, keepdims=True)), None)),
                ("weights-not-normalized", "you divide by the sum of the inputs instead of the sum of exp()",
                 lambda x=x: (np.exp(x) / x.sum(axis=-1, keepdims=True), None)),
                ("softmax-wrong-axis", "you normalised over the whole array at once",
                 lambda x=x: (np.exp(x - x.max()) / np.exp(x - x.max()).sum(), None)),
            ]
            for axis in range(x.ndim - 1):
                candidates.append(("softmax-wrong-axis", f"you normalised along axis {axis}",
                                   lambda x=x, axis=axis: (numpy_ref.softmax(x, axis=axis), None)))
                candidates.append(("softmax-wrong-axis", f"you normalised along axis {axis} (no max subtraction)",
                                   lambda x=x, axis=axis: (numpy_ref.softmax_unstable(x, axis=axis), None)))
            diagnose(out_s, None, candidates, case, ref, None, what="result", atol=1e-8, rtol=1e-6)
        return (f"✓ {display_name(fn, 'softmax')}: {len(xs)} random cases (1-D to 3-D, large values, -inf entries) match "
                "the reference; the input is left unchanged")

    run_check(body, timeout)


def _global_max_softmax(x: np.ndarray) -> np.ndarray:
    """The mistake of subtracting the maximum of the whole array instead of each row's: rows far below it
    underflow to 0 / 0."""
    e = np.exp(x - np.max(x))
    return e / e.sum(axis=-1, keepdims=True)
