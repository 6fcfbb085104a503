"""Recomputing what each known mistake would give, and naming the one the
student's result matches.

A checker that finds a wrong result builds a list of *candidates* ``(code,
detail, thunk)``: ``thunk()`` returns the (output, weights) that the mistake
``code`` of :mod:`attention_course.mistakes` would produce on the failing case
(float64 NumPy, computed by the ``*_variant`` builders below: the reference
with one deliberate deviation). :func:`diagnose` raises :class:`CheckFailed`
with the first candidate that matches, else ``[wrong-output]`` (or
``[wrong-shape]`` / ``[nan-output]``).
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from .. import numpy_ref
from .runner import close, fail, shape_text


def sdpa_variant(
    q,
    k,
    v,
    mask=None,
    *,
    scale=None,
    axis=-1,
    transposed=False,
    mask_mode="ok",
    rows="zero",
    normalize=True,
    values="v",
):
    """Scaled dot-product attention with one deliberate deviation; returns
    (out, weights), float64.

    mask_mode: ok | ignored | inverted | zero (masked scores = 0) | after
        (softmax, then zero masked weights)
    | added01 (the boolean mask cast to 0/1 and added to the scores)
    | plus-blocked (a huge positive number added to the blocked scores: uniform
      over the blocked keys).
    rows: what a fully masked row gets: zero | nan | uniform (over all keys).
    """
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = (
        k @ np.swapaxes(q, -1, -2)
        if transposed
        else q @ np.swapaxes(k, -1, -2)
    ) * scale
    m = (
        None
        if mask is None or mask_mode == "ignored"
        else np.broadcast_to(np.asarray(mask, bool), scores.shape)
    )
    if m is not None and mask_mode == "inverted":
        m = ~m
    if m is None:
        weights = (
            numpy_ref.softmax(scores, axis=axis)
            if normalize
            else np.exp(scores)
        )
    elif mask_mode in ("ok", "inverted"):
        masked = np.where(m, scores, -np.inf)
        weights = (
            numpy_ref.softmax(masked, axis=axis)
            if normalize
            else np.exp(masked)
        )
        empty = ~m.any(axis=-1, keepdims=True)
        if rows == "nan":
            weights = np.where(empty, np.nan, weights)
        elif rows == "uniform":
            weights = np.where(empty, 1.0 / scores.shape[-1], weights)
    # the boolean mask cast to 0/1 and ADDED: +1 on the allowed scores hides
    # nothing
    elif mask_mode == "added01":
        weights = numpy_ref.softmax(scores + m, axis=axis)
    elif mask_mode == "zero":
        weights = numpy_ref.softmax(np.where(m, scores, 0.0), axis=axis)
    elif mask_mode == "after":
        weights = numpy_ref.softmax(scores, axis=axis) * m
    # plus-blocked: in float32, s + 1e10 == 1e10, so the blocked keys share the
    # weight evenly
    else:
        boosted = ~m
        count = boosted.sum(axis=-1, keepdims=True)
        weights = np.where(
            count > 0,
            boosted / np.maximum(count, 1),
            numpy_ref.softmax(scores, axis=axis),
        )
    return weights @ (k if values == "k" else v), weights


_BLOCK_TRUE = (
    "you block the keys where the mask is True and let the others through"
)


def core_variants(
    dk, dv, tq, tk, ndim, has_mask, fully_masked, extra_scales=()
):
    """(code, detail, kwargs for sdpa_variant) for every known mistake in the
    attention core."""
    right = 1.0 / math.sqrt(dk)
    out = [("missing-scale", "", {"scale": 1.0})]
    scales = [
        (1.0 / dk, "they are divided by d_k instead of sqrt(d_k)"),
        (math.sqrt(dk), "they are multiplied by sqrt(d_k) instead of divided"),
        (
            1.0 / math.sqrt(tk),
            "they are divided by sqrt(Tk), the number of keys, instead of "
            "sqrt(d_k)",
        ),
        (
            1.0 / math.sqrt(tq),
            "they are divided by sqrt(Tq), the number of queries, instead "
            "of sqrt(d_k)",
        ),
        (
            1.0 / math.sqrt(dv),
            "they are divided by sqrt(d_v), the value size, instead of "
            "sqrt(d_k)",
        ),
        (
            1.0 / tk,
            "they are divided by Tk, the number of keys, instead of sqrt(d_k)",
        ),
        *extra_scales,
    ]
    seen = {right, 1.0}
    for scale, detail in scales:
        if not any(math.isclose(scale, s) for s in seen):
            seen.add(scale)
            out.append(("wrong-scale", detail, {"scale": scale}))
    for axis in range(-2, -ndim - 1, -1):
        detail = (
            "over the queries (axis -2)"
            if axis == -2
            else f"along axis {axis + ndim}, a batch axis"
        )
        out.append(
            ("softmax-wrong-axis", f"you normalised {detail}", {"axis": axis})
        )
    if tq == tk:
        out.append(("transposed-scores", "", {"transposed": True}))
    out.append(("values-from-keys", "", {"values": "k"}))
    out.append(
        (
            "weights-not-normalized",
            "you take exp() without dividing by the sum",
            {"normalize": False},
        )
    )
    if has_mask:
        out += [
            ("mask-ignored", "", {"mask_mode": "ignored"}),
            ("mask-inverted", _BLOCK_TRUE, {"mask_mode": "inverted"}),
            (
                "mask-inverted",
                _BLOCK_TRUE,
                {"mask_mode": "inverted", "rows": "nan"},
            ),
            (
                "mask-inverted",
                _BLOCK_TRUE,
                {"mask_mode": "inverted", "rows": "uniform"},
            ),
            (
                "mask-wrong-sign",
                "they are boosted, e.g. by + 1e10",
                {"mask_mode": "plus-blocked"},
            ),
            ("mask-zero-before-softmax", "", {"mask_mode": "zero"}),
            (
                "float-mask-not-additive",
                "1 where a key may be attended, 0 where not",
                {"mask_mode": "added01"},
            ),
            (
                "weights-not-normalized",
                "you zero the blocked weights AFTER the softmax",
                {"mask_mode": "after"},
            ),
        ]
        if fully_masked:
            out += [
                ("nan-on-masked-row", "", {"rows": "nan"}),
                ("masked-row-not-zero", "", {"rows": "uniform"}),
            ]
    return out


def diagnose(
    out_s,
    w_s,
    candidates,
    case: str,
    expected_out,
    expected_w,
    what="output",
    atol=1e-5,
    rtol=1e-4,
    second="attention weights",
):
    """Raise CheckFailed naming the known mistake that explains (out_s, w_s);
    candidates are lazy. ``second`` names the second result in messages (the
    attention weights, or a chunk's new state)."""
    weights_right = w_s is None or close(w_s, expected_w, atol, rtol)
    for code, detail, thunk in candidates:
        try:
            with np.errstate(all="ignore"):
                c_out, c_w = thunk()
        # this mistake cannot produce a result for this case's shapes
        except (ValueError, IndexError):
            continue
        if close(out_s, c_out, atol, rtol) and (
            w_s is None or c_w is None or close(w_s, c_w, atol, rtol)
        ):
            raise fail(code, detail=detail, case=case)
        if (
            close(out_s, expected_out, atol, rtol)
            and c_w is not None
            and w_s is not None
            and close(w_s, c_w, atol, rtol)
        ):
            raise fail(
                code,
                detail=detail,
                case=case
                + f" (your output is right; your returned {second} is not)",
            )
    _generic_failure(
        out_s,
        expected_out,
        case,
        what,
        atol,
        rtol,
        w_s,
        expected_w,
        weights_right,
        second,
    )


def _generic_failure(
    out_s,
    expected,
    case,
    what,
    atol,
    rtol,
    w_s=None,
    expected_w=None,
    weights_right=True,
    second="attention weights",
):
    if out_s.shape != expected.shape:
        raise fail(
            "wrong-shape",
            f"Your {what} has shape {shape_text(out_s.shape)}; expected "
            f"{shape_text(expected.shape)}.",
            case=case,
        )
    if w_s is not None and w_s.shape != expected_w.shape:
        axes = " (..., Tq, Tk)" if second == "attention weights" else ""
        raise fail(
            "wrong-shape",
            f"Your {second} has shape {shape_text(w_s.shape)}; expected "
            f"{shape_text(expected_w.shape)}{axes}.",
            case=case,
        )
    if not np.all(np.isfinite(out_s)) and np.all(np.isfinite(expected)):
        raise fail("nan-output", case=case)
    if close(out_s, expected, atol, rtol) and not weights_right:
        diff = np.abs(w_s - expected_w)
        raise fail(
            "wrong-output",
            f"Your output is right, but the {second} you return differs "
            "from the "
            f"reference (largest difference {np.nanmax(diff):.2g}).",
            case=case,
        )
    diff = np.abs(out_s - expected)
    diff = np.where(np.isnan(diff), np.inf, diff)
    idx = (
        tuple(int(i) for i in np.unravel_index(np.argmax(diff), diff.shape))
        if diff.size
        else ()
    )
    raise fail(
        "wrong-output",
        f"Your {what} differs from the reference (largest difference "
        f"{np.max(diff):.2g} at index {idx}) and matches "
        "none of the mistakes this checker knows. Compare your steps with "
        "the chapter, one intermediate result at "
        "a time.",
        case=case,
    )


# -----------------------------------------------------------------------------
# Multi-head and single-head attention modules
# -----------------------------------------------------------------------------


def mha_variant(
    query,
    key,
    value,
    p,
    num_heads,
    mask,
    *,
    split="ok",
    merge="ok",
    out_proj=True,
    value_src="value",
    w_v="w_v",
    transposed="",
    core=None,
):
    """numpy_ref.multi_head_attention with one deliberate deviation; returns
    (out, weights).

    ``transposed``: the projections (letters of "qkvo") whose weight is used
    transposed, i.e. a (d_in, d_out) matrix read as (d_out, d_in); only runs
    when those weights are square (else ValueError: not applicable).
    """
    d = p["w_q"].shape[1]
    h, dh = num_heads, d // num_heads

    def w(name):
        return p[name].T if name[-1] in transposed else p[name]

    def sp(x):
        b, t, _ = x.shape
        return (
            numpy_ref.split_heads(x, h)
            if split == "ok"
            else x.reshape(b, h, t, dh)
        )

    q = sp(query @ w("w_q") + p["b_q"])
    k = sp(key @ w("w_k") + p["b_k"])
    v = sp((key if value_src == "key" else value) @ w(w_v) + p["b" + w_v[1:]])
    heads, weights = sdpa_variant(q, k, v, mask, **(core or {}))
    b, _, t, _ = heads.shape
    if merge == "ok":
        merged = numpy_ref.merge_heads(heads)
    elif merge == "reshape":
        merged = heads.reshape(b, t, d)
    else:
        merged = heads.transpose(0, 2, 3, 1).reshape(b, t, d)
    return (merged @ w("w_o") + p["b_o"] if out_proj else merged), weights


def _layout_subsets():
    """(letters, description) for every non-empty set of projections whose
    weight may be read transposed; the likeliest first: all four, then three,
    two, one."""
    out = []
    for size in (4, 3, 2, 1):
        for letters in itertools.combinations("qkvo", size):
            names = [f"w_{x}" for x in letters]
            text = (
                names[0]
                if size == 1
                else f"{', '.join(names[:-1])} and {names[-1]}"
            )
            out.append(
                (
                    "".join(letters),
                    "all four weights (w_q, w_k, w_v and w_o)"
                    if size == 4
                    else text,
                )
            )
    return out


LAYOUT_SUBSETS = _layout_subsets()


def mha_candidates(
    query,
    key,
    value,
    p,
    num_heads,
    mask,
    fully_masked,
    layout_code="weight-layout-transposed",
):
    """The known multi-head mistakes. ``layout_code`` names a weight used
    transposed: "weight-not-transposed" when the checker loaded the weights
    into nn.Linear layers itself (the forward computes x @ linear.weight), else
    "weight-layout-transposed" (the student's loader or function reads the
    (d_in, d_out) matrices as (d_out, d_in))."""
    d = p["w_q"].shape[1]
    dh = d // num_heads
    tq, tk = query.shape[1], key.shape[1]
    structural = [
        (layout_code, detail, {"transposed": letters})
        for letters, detail in LAYOUT_SUBSETS
    ]
    structural += [
        (
            "values-from-keys",
            " (the values are projected from the key input)",
            {"value_src": "key"},
        ),
        (
            "values-from-keys",
            " (the values go through w_k instead of w_v)",
            {"w_v": "w_k"},
        ),
        ("heads-split-without-transpose", "", {"split": "reshape"}),
        (
            "heads-split-without-transpose",
            "",
            {"split": "reshape", "merge": "reshape"},
        ),
        ("merge-heads-wrong-order", "", {"merge": "reshape"}),
        ("merge-heads-wrong-order", "", {"merge": "permute"}),
        ("missing-output-projection", "", {"out_proj": False}),
    ]
    extra = [
        (
            1.0 / math.sqrt(d),
            "they are divided by sqrt(d_model) instead of sqrt(d_k) = "
            "sqrt(d_model / H)",
        ),
        (
            1.0 / d,
            "they are divided by d_model instead of sqrt(d_k) = "
            "sqrt(d_model / H)",
        ),
    ]
    core = core_variants(
        dh, dh, tq, tk, 4, mask is not None, fully_masked, extra_scales=extra
    )
    out = [
        (
            c,
            det,
            lambda kw=kw: mha_variant(
                query, key, value, p, num_heads, mask, **kw
            ),
        )
        for c, det, kw in structural
    ]
    out += [
        (
            c,
            det,
            lambda kw=kw: mha_variant(
                query, key, value, p, num_heads, mask, core=kw
            ),
        )
        for c, det, kw in core
        if c != "values-from-keys"
    ]
    return out


def single_head_variant(
    query,
    key,
    value,
    p,
    mask,
    *,
    value_src="value",
    w_v="w_v",
    transposed=False,
    core=None,
):
    """Single-head attention with one deliberate deviation; returns (out,
    weights), float64."""

    def project(x, name):
        # x @ linear.weight: only runs when d_in == d_out
        w = p[name].T if transposed else p[name]
        return x @ w + p["b" + name[1:]]

    q, k = project(query, "w_q"), project(key, "w_k")
    v = project(key if value_src == "key" else value, w_v)
    return sdpa_variant(q, k, v, mask, **(core or {}))


def single_head_candidates(query, key, value, p, mask, layout_code):
    """The known single-head mistakes; ``layout_code`` as for
    :func:`mha_candidates`."""
    d_in, d_out = p["w_q"].shape
    structural = [
        (layout_code, "w_q, w_k and w_v", {"transposed": True}),
        (
            "values-from-keys",
            " (the values are projected from the key input)",
            {"value_src": "key"},
        ),
        (
            "values-from-keys",
            " (the values go through w_k instead of w_v)",
            {"w_v": "w_k"},
        ),
    ]
    extra = [
        (
            1.0 / math.sqrt(d_in),
            "they are divided by sqrt(d_in), the input size, instead of "
            "sqrt(d_k) = "
            "sqrt(d_out)",
        ),
        (
            1.0 / d_in,
            "they are divided by d_in, the input size, instead of sqrt(d_k) "
            "= sqrt(d_out)",
        ),
    ]
    core = core_variants(
        d_out,
        d_out,
        query.shape[1],
        key.shape[1],
        3,
        mask is not None,
        True,
        extra_scales=extra,
    )
    out = [
        (
            c,
            det,
            lambda kw=kw: single_head_variant(
                query, key, value, p, mask, **kw
            ),
        )
        for c, det, kw in structural
    ]
    out += [
        (
            c,
            det,
            lambda kw=kw: single_head_variant(
                query, key, value, p, mask, core=kw
            ),
        )
        for c, det, kw in core
    ]
    return out
