"""Checks of chapter 14: soft-capping, QK-norm before RoPE (per head and over
all heads), sinks in a sliding window, MLA's absorbed scores and absorbed
output, and the chapter's questions.

Every reference is float64 NumPy written for the checker; each ``*_variant``
builder is the reference with one deliberate deviation, the mistake whose code
it is listed under.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math

import numpy as np
import torch

from ..modern.cache import (
    PUBLISHED,
    published_cache_bytes,
    scheme_bytes_per_token,
)
from . import hidden, observe
from .cases import to_framework
from .diagnosis import diagnose
from .positions import rope_variant
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

ATOL, RTOL = 2e-5, 1e-4  # float32 inputs against a float64 reference


def _softmax(scores: np.ndarray) -> np.ndarray:
    e = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def window_mask(t: int, window: int | None) -> np.ndarray:
    """(T, T) boolean: causal, and 0 <= i - j < window when a window is
    given."""
    i, j = np.arange(t)[:, None], np.arange(t)[None, :]
    return (j <= i) & (True if window is None else i - j < window)


def attention_variant(
    q, k, v, *, cap=None, cap_on="scores", sinks=None, sink="ok", window=None
):
    """Causal attention, float64, q k (..., H, T, Dk), v (..., H, T, Dv) ->
    (out, weights).

    ``cap_on``: scores (cap * tanh(s / cap) before the mask and the softmax) |
    after-mask (the masked -inf capped to -cap too) | probabilities (applied to
    the weights);
    ``sink``: ok (an extra logit with no value) | value (its weight goes to the
        first token's value) | ignored.
    """
    t = q.shape[-2]
    scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    if cap is not None and cap_on == "scores":
        scores = cap * np.tanh(scores / cap)
    scores = np.where(window_mask(t, window), scores, -np.inf)
    if cap is not None and cap_on == "after-mask":
        scores = cap * np.tanh(scores / cap)
    if sinks is None or sink == "ignored":
        weights = _softmax(scores)
        sink_weight = np.zeros((*scores.shape[:-1], 1))
    else:
        column = np.broadcast_to(
            np.asarray(sinks)[:, None, None], (*scores.shape[:-1], 1)
        )
        full = _softmax(np.concatenate([scores, column], axis=-1))
        weights, sink_weight = full[..., :-1], full[..., -1:]
    if cap is not None and cap_on == "probabilities":
        weights = cap * np.tanh(weights / cap)
    out = weights @ v
    if sink == "value":
        out = out + sink_weight * v[..., :1, :]
    return out, weights


# -----------------------------------------------------------------------------
# Soft-capping (Gemma 2)
# -----------------------------------------------------------------------------

_CAP_CASES = [
    ((2, 6, 4), 5.0, 3.0),
    ((1, 2, 5, 8), 2.0, 4.0),
    ((3, 7, 6), 1.0, 2.0),
    ((2, 3, 9, 16), 50.0, 20.0),
]


def check_softcap_attention(fn, *, timeout: float = DEFAULT_TIMEOUT):
    """Check ``fn(q, k, v, cap)`` -> (out, weights) or out: causal attention
    (q, k, v (..., T, D) float32 tensors, scale 1 / sqrt(D)) whose scores s are
    soft-capped to ``cap * tanh(s / cap)`` before the mask and the softmax
    (Gemma 2). Diagnoses ``[cap-on-probabilities]`` and
    ``[cap-after-mask]``."""
    label = "softcap_attention"

    def body():
        rng = np.random.default_rng(14)
        for i, (shape, cap, spread) in enumerate(_CAP_CASES, 1):
            q, k, v = (spread * rng.standard_normal(shape) for _ in range(3))
            case = (
                f"case {i} of {len(_CAP_CASES)}: q, k, v of shape "
                f"{shape_text(shape)}, cap={cap}"
            )
            args = {
                "q": to_framework(q, "torch"),
                "k": to_framework(k, "torch"),
                "v": to_framework(v, "torch"),
                "cap": cap,
            }
            out, weights = _student_result(
                call(fn, args, label, positional=4), case
            )
            ref_out, ref_w = attention_variant(q, k, v, cap=cap)
            if close(out, ref_out, ATOL, RTOL) and (
                weights is None or close(weights, ref_w, ATOL, RTOL)
            ):
                continue
            candidates = [
                (
                    code,
                    "",
                    lambda q=q, k=k, v=v, c=cap, on=on: attention_variant(
                        q, k, v, cap=c, cap_on=on
                    ),
                )
                for code, on in (
                    ("cap-on-probabilities", "probabilities"),
                    ("cap-after-mask", "after-mask"),
                )
            ]
            diagnose(
                out,
                weights,
                candidates,
                case,
                ref_out,
                ref_w,
                atol=ATOL,
                rtol=RTOL,
            )
        return (
            f"✓ {display_name(fn, label)}: {len(_CAP_CASES)} random cases "
            "(caps from 1 to 50, scores well "
            "beyond the cap) match causal attention with soft-capped scores"
        )

    run_check(body, timeout)


def _student_result(result, case):
    out, weights = split_result(result, case)
    out = as_array(out, "output" if weights is not None else "result", case)
    return out, None if weights is None else as_array(weights, "weights", case)


# -----------------------------------------------------------------------------
# QK-norm before RoPE (Qwen3, OLMo 2, Gemma 3)
# -----------------------------------------------------------------------------


def qk_norm_variant(
    x, positions, weight, eps, *, order="norm-first", pairing="halves"
):
    """RMSNorm(x) * weight, then RoPE (halves pairing); ``order="rope-first"``
    rotates before normalising."""

    def norm(y):
        return y / np.sqrt((y**2).mean(axis=-1, keepdims=True) + eps) * weight

    if order == "rope-first":
        return norm(rope_variant(x, positions, pairing=pairing))
    return rope_variant(norm(x), positions, pairing=pairing)


# (shape (..., T, Dh), first position)
_NORM_CASES = [
    ((5, 8), 0),
    ((2, 3, 6, 4), 3),
    ((1, 2, 7, 16), 20),
    ((2, 9, 6), 0),
]


def check_qk_norm_rope(fn, *, timeout: float = DEFAULT_TIMEOUT):
    """Check ``fn(x, positions, weight, eps)``: x (..., T, Dh) float32 queries
    or keys of one head, positions (T,) int64, weight (Dh,) -> RMSNorm of each
    vector (``x / sqrt(mean(x^2) + eps) * weight``) THEN RoPE in the halves
    pairing (feature i with i + Dh/2, base 10000), as Qwen3. Diagnoses
    ``[norm-after-rope]`` and ``[rope-wrong-pairing]``."""
    label = "qk_norm_rope"

    def body():
        rng = np.random.default_rng(15)
        for i, (shape, start) in enumerate(_NORM_CASES, 1):
            # features of unequal sizes
            x = rng.standard_normal(shape) * rng.uniform(
                0.5, 3.0, size=shape[-1]
            )
            weight, eps = rng.uniform(0.5, 2.0, size=shape[-1]), 1e-6
            positions = np.arange(start, start + shape[-2])
            case = (
                f"case {i} of {len(_NORM_CASES)}: x of shape "
                f"{shape_text(shape)}, positions "
                f"{start}..{positions[-1]}"
            )
            args = {
                "x": to_framework(x, "torch"),
                "positions": torch.from_numpy(positions),
                "weight": to_framework(weight, "torch"),
                "eps": eps,
            }
            out = as_array(call(fn, args, label, positional=4), "result", case)
            ref = qk_norm_variant(x, positions, weight, eps)
            if close(out, ref, ATOL, RTOL):
                continue
            candidates = [
                (
                    "norm-after-rope",
                    "",
                    lambda x=x, p=positions, w=weight: (
                        qk_norm_variant(x, p, w, eps, order="rope-first"),
                        None,
                    ),
                ),
                (
                    "rope-wrong-pairing",
                    "you pair neighbours (x_2i, x_2i+1); Qwen3's "
                    "checkpoints pair feature i with "
                    "feature i + Dh/2 (rotate_half)",
                    lambda x=x, p=positions, w=weight: (
                        qk_norm_variant(x, p, w, eps, pairing="interleaved"),
                        None,
                    ),
                ),
            ]
            diagnose(
                out,
                None,
                candidates,
                case,
                ref,
                None,
                what="result",
                atol=ATOL,
                rtol=RTOL,
            )
        return (
            f"✓ {display_name(fn, label)}: {len(_NORM_CASES)} random cases "
            "(one head and batched heads, "
            "positions from 0 and later) match RMSNorm then halves RoPE"
        )

    run_check(body, timeout)


# -----------------------------------------------------------------------------
# Attention sinks in a sliding window (GPT-OSS)
# -----------------------------------------------------------------------------

# (B, H, T, Dh, window)
_SINK_CASES = [
    (1, 2, 6, 4, 3),
    (2, 3, 8, 8, 4),
    (1, 1, 5, 4, 5),
    (2, 2, 9, 6, 1),
    (1, 4, 7, 8, 20),
]


def check_sink_attention(fn, *, timeout: float = DEFAULT_TIMEOUT):
    """Check ``fn(q, k, v, sinks, window)`` -> (out, weights) or out: GPT-OSS's
    attention core. q, k, v (B, H, T, Dh) float32 tensors, sinks (H,) one logit
    per head; query i may attend key j when 0 <= i - j < window; scale 1 /
    sqrt(Dh); the sink joins each softmax as one more logit and contributes no
    value (weights returned without the sink's column). Diagnoses
    ``[sink-given-value]``, ``[sink-ignored]`` and ``[window-off-by-one]``."""
    label = "sink_attention"

    def body():
        rng = np.random.default_rng(16)
        sizes = list(_SINK_CASES) + [
            (2, h, t, 8, w) for h, t, w in hidden.sink_sizes()
        ]
        for i, (b, h, t, dh, window) in enumerate(sizes, 1):
            q, k, v = (rng.standard_normal((b, h, t, dh)) for _ in range(3))
            sinks = rng.uniform(-1.0, 2.0, size=h)
            case = (
                f"case {i} of {len(sizes)}: q, k, v of shape "
                f"{shape_text(q.shape)}, window={window}"
            )
            args = {
                "q": to_framework(q, "torch"),
                "k": to_framework(k, "torch"),
                "v": to_framework(v, "torch"),
                "sinks": to_framework(sinks, "torch"),
                "window": window,
            }
            out, weights = _student_result(
                call(fn, args, label, positional=5), case
            )
            ref_out, ref_w = attention_variant(
                q, k, v, sinks=sinks, window=window
            )
            if close(out, ref_out, ATOL, RTOL) and (
                weights is None or close(weights, ref_w, ATOL, RTOL)
            ):
                continue
            candidates = [
                (
                    "sink-given-value",
                    "",
                    lambda q=q, k=k, v=v, s=sinks, w=window: attention_variant(
                        q, k, v, sinks=s, sink="value", window=w
                    ),
                ),
                (
                    "sink-ignored",
                    "",
                    lambda q=q, k=k, v=v, w=window: attention_variant(
                        q, k, v, window=w
                    ),
                ),
                (
                    "window-off-by-one",
                    f"each query sees {window + 1} keys (j >= i - window)",
                    lambda q=q, k=k, v=v, s=sinks, w=window: attention_variant(
                        q, k, v, sinks=s, window=w + 1
                    ),
                ),
            ]
            if window > 1:
                candidates.append(
                    (
                        "window-off-by-one",
                        f"each query sees {window - 1} keys (j > i - window "
                        "+ 1)",
                        lambda q=q, k=k, v=v, s=sinks, w=window: (
                            attention_variant(q, k, v, sinks=s, window=w - 1)
                        ),
                    )
                )
            diagnose(
                out,
                weights,
                candidates,
                case,
                ref_out,
                ref_w,
                atol=ATOL,
                rtol=RTOL,
            )
        return (
            f"✓ {display_name(fn, label)}: {len(sizes)} random cases "
            "(windows from 1 key to longer than the "
            "sequence, 1 to 4 heads) match sliding-window attention with a "
            "sink logit per head"
        )

    run_check(body, timeout)


# -----------------------------------------------------------------------------
# MLA: scores from the latent cache (weight absorption)
# -----------------------------------------------------------------------------

# (B, H, T, N (no-RoPE query features), C (latent width)): a square N == C
# first, where a transposed W_uk fits
_MLA_CASES = [
    (2, 3, 4, 4, 4),
    (1, 2, 5, 4, 6),
    (1, 1, 6, 8, 3),
    (2, 2, 7, 6, 6),
]


def check_absorbed_scores(fn, *, timeout: float = DEFAULT_TIMEOUT):
    """Check ``fn(q_nope, c, w_uk)`` -> (B, H, T, T) scores ``q_nope . k_nope``
    (unscaled, unmasked) where head h's keys are ``k_nope = c @ w_uk[h].T``,
    computed without forming the keys: q_nope (B, H, T, N), the latent cache c
    (B, T, C), w_uk (H, N, C). The rule is enforced: every tensor the code
    creates is watched
    (:class:`~attention_course.checks.observe.FormedTensors`) for the keys,
    whole or a head's or a sequence's. Diagnoses ``[absorption-transposed]``
    and ``[keys-formed]``."""
    label = "absorbed_scores"
    watched = observe.observable(fn)
    if watched:
        observe.warm_up()  # before the time limit starts

    def body():
        rng = np.random.default_rng(17)
        for i, (b, h, t, n, c_dim) in enumerate(_MLA_CASES, 1):
            q = rng.standard_normal((b, h, t, n))
            c = rng.standard_normal((b, t, c_dim))
            w_uk = rng.standard_normal((h, n, c_dim))
            case = (
                f"case {i} of {len(_MLA_CASES)}: q_nope "
                f"{shape_text(q.shape)}, c {shape_text(c.shape)}"
            )
            args = {
                "q_nope": to_framework(q, "torch"),
                "c": to_framework(c, "torch"),
                "w_uk": to_framework(w_uk, "torch"),
            }
            # (B, H, T, N): what absorption avoids forming
            keys = c[:, None] @ np.swapaxes(w_uk, -1, -2)
            with contextlib.ExitStack() as stack:
                formed = (
                    stack.enter_context(observe.FormedTensors(keys))
                    if watched
                    else None
                )
                leaves = (
                    stack.enter_context(observe.LeavesTorch())
                    if watched
                    else None
                )
                result = call(fn, args, label, positional=3)
            out = as_array(result, "result", case)
            ref = q @ np.swapaxes(keys, -1, -2)
            if close(out, ref, 1e-4, RTOL):
                if leaves is not None and leaves.left:
                    raise fail("left-torch", detail=leaves.left, case=case)
                if formed is not None and formed.formed:
                    raise fail(
                        "keys-formed",
                        detail=f"a tensor of the {shape_text(keys.shape)} "
                        "keys' numbers",
                        case=case,
                    )
                continue
            candidates = [
                (
                    "absorption-transposed",
                    "",
                    lambda q=q, c=c, w=w_uk: (
                        (q @ np.swapaxes(w, -1, -2))
                        @ np.swapaxes(c[:, None], -1, -2),
                        None,
                    ),
                )
            ]
            diagnose(
                out,
                None,
                candidates,
                case,
                ref,
                None,
                what="scores",
                atol=1e-4,
                rtol=RTOL,
            )
        return (
            f"✓ {display_name(fn, label)}: {len(_MLA_CASES)} random cases "
            "(latent narrower, wider and as wide "
            "as the head) match the scores of the expanded keys"
        )

    run_check(body, timeout)


# -----------------------------------------------------------------------------
# QK-norm over all heads at once (OLMo 2), then RoPE
# -----------------------------------------------------------------------------


def olmo2_qk_variant(
    x,
    positions,
    weight,
    n_heads,
    eps,
    *,
    norm="whole",
    order="norm-first",
    pairing="halves",
):
    """x (B, T, H * Dh) -> (B, H, T, Dh): RMSNorm over the H * Dh features with
    ``weight`` (H * Dh,), then the split into heads and RoPE;
    ``norm="per-head"`` normalises each head's Dh features apart (Qwen3's
    form)."""
    b, t, width = x.shape

    def rms(y):
        return y / np.sqrt((y**2).mean(axis=-1, keepdims=True) + eps)

    def heads(y):
        return y.reshape(b, t, n_heads, width // n_heads).transpose(0, 2, 1, 3)

    if order == "rope-first":
        rotated = rope_variant(heads(x), positions, pairing=pairing)
        return heads(
            rms(rotated.transpose(0, 2, 1, 3).reshape(b, t, width)) * weight
        )
    if norm == "per-head":
        normed = heads(x).transpose(0, 2, 1, 3)  # (B, T, H, Dh)
        normed = (rms(normed) * weight.reshape(n_heads, -1)).reshape(
            b, t, width
        )
    else:
        normed = rms(x) * weight
    return rope_variant(heads(normed), positions, pairing=pairing)


# (B, T, H, Dh, first position)
_OLMO_CASES = [
    (1, 5, 2, 4, 0),
    (2, 4, 3, 8, 2),
    (1, 6, 4, 6, 0),
    (2, 7, 1, 16, 9),
]


def check_olmo2_qk_norm(fn, *, timeout: float = DEFAULT_TIMEOUT):
    """Check ``fn(x, positions, weight, n_heads, eps)`` -> (B, H, T, Dh): OLMo
    2's QK-norm. x (B, T, H * Dh) float32 projected queries (or keys),
    positions (T,) int64, weight (H * Dh,): an RMSNorm over all H * Dh features
    of a token (``x / sqrt(mean(x^2) + eps) * weight``), THEN the split into
    heads (head-major: head h owns features h * Dh to (h + 1) * Dh), THEN RoPE
    in the halves pairing (base 10000). Diagnoses ``[norm-per-head]``,
    ``[norm-after-rope]`` and ``[rope-wrong-pairing]``."""
    label = "olmo2_qk_norm"

    def body():
        rng = np.random.default_rng(18)
        sizes = list(_OLMO_CASES) + [
            (2, t, h, 8, 1) for h, t, _ in hidden.sink_sizes()
        ]
        for i, (b, t, h, dh, start) in enumerate(sizes, 1):
            width = h * dh
            # heads of unequal sizes, so that one norm over all heads differs
            # from a norm per head
            x = rng.standard_normal((b, t, width)) * np.repeat(
                rng.uniform(0.3, 3.0, size=h), dh
            )
            weight, eps = rng.uniform(0.5, 2.0, size=width), 1e-6
            positions = np.arange(start, start + t)
            case = (
                f"case {i} of {len(sizes)}: x of shape "
                f"{shape_text(x.shape)}, n_heads={h}, positions "
                f"{start}..{positions[-1]}"
            )
            args = {
                "x": to_framework(x, "torch"),
                "positions": torch.from_numpy(positions),
                "weight": to_framework(weight, "torch"),
                "n_heads": h,
                "eps": eps,
            }
            out = as_array(call(fn, args, label, positional=5), "result", case)
            ref = olmo2_qk_variant(x, positions, weight, h, eps)
            if close(out, ref, ATOL, RTOL):
                continue

            def variant(x=x, p=positions, w=weight, h=h, **how):
                return olmo2_qk_variant(x, p, w, h, eps, **how), None

            candidates = [
                ("norm-per-head", "", lambda: variant(norm="per-head")),
                ("norm-after-rope", "", lambda: variant(order="rope-first")),
                (
                    "rope-wrong-pairing",
                    "you pair neighbours (x_2i, x_2i+1); OLMo 2's "
                    "checkpoints pair feature i with "
                    "feature i + Dh/2 (rotate_half)",
                    lambda: variant(pairing="interleaved"),
                ),
            ]
            diagnose(
                out,
                None,
                candidates,
                case,
                ref,
                None,
                what="result",
                atol=ATOL,
                rtol=RTOL,
            )
        return (
            f"✓ {display_name(fn, label)}: {len(sizes)} random cases (1 to "
            "4 heads of unequal sizes, positions "
            "from 0 and later) match one RMSNorm over all heads, then "
            "halves RoPE per head"
        )

    run_check(body, timeout)


# -----------------------------------------------------------------------------
# MLA: W_uv absorbed into the output projection
# -----------------------------------------------------------------------------

# (B, H, T, C (latent width), V (value features per head), D (model width))
_MLA_OUT_CASES = [
    (1, 2, 4, 6, 3, 5),
    (2, 3, 5, 4, 4, 7),
    (1, 1, 6, 3, 5, 4),
    (2, 4, 3, 8, 2, 6),
]


def mla_output_variant(weights, c, w_uv, w_o, *, split="head-major"):
    """(B, T, D) = the heads' outputs weights @ (c @ w_uv[h].T), concatenated,
    @ w_o.T; ``split="feature-major"`` reads w_o's columns as (V, H) instead of
    (H, V)."""
    h, v_dim, _ = w_uv.shape
    values = c[:, None] @ np.swapaxes(w_uv, -1, -2)  # (B, H, T, V)
    heads = weights @ values  # (B, H, T, V)
    if split == "feature-major":
        w_o = (
            w_o.reshape(-1, v_dim, h).transpose(0, 2, 1).reshape(-1, h * v_dim)
        )
    b, _, t, _ = heads.shape
    return heads.transpose(0, 2, 1, 3).reshape(b, t, h * v_dim) @ w_o.T


def check_absorbed_output(fn, *, timeout: float = DEFAULT_TIMEOUT):
    """Check ``fn(weights, c, w_uv, w_o)`` -> (B, T, D): MLA's output with W_uv
    folded into the output projection. weights (B, H, T, T) attention weights,
    the latent cache c (B, T, C), w_uv (H, V, C) (head h's values would be ``c
    @ w_uv[h].T``), w_o (D, H * V) the output projection's weight (heads
    concatenated head-major, out = merged @ w_o.T). The rule is enforced:
    neither the values (B, H, T, V) nor the heads' outputs (B, H, T, V) may be
    formed (every tensor the code creates is watched). Diagnoses
    ``[values-formed]`` and ``[heads-split-wrong]``."""
    label = "absorbed_output"
    watched = observe.observable(fn)
    if watched:
        observe.warm_up()  # before the time limit starts

    def body():
        rng = np.random.default_rng(19)
        sizes = list(_MLA_OUT_CASES) + [
            (2, h, t, 6, 3, 5) for h, t, _ in hidden.sink_sizes()
        ]
        for i, (b, h, t, c_dim, v_dim, d) in enumerate(sizes, 1):
            weights = _softmax(rng.standard_normal((b, h, t, t)))
            c = rng.standard_normal((b, t, c_dim))
            w_uv, w_o = (
                rng.standard_normal((h, v_dim, c_dim)),
                rng.standard_normal((d, h * v_dim)),
            )
            case = (
                f"case {i} of {len(sizes)}: weights "
                f"{shape_text(weights.shape)}, c {shape_text(c.shape)}, "
                f"w_uv {shape_text(w_uv.shape)}, w_o {shape_text(w_o.shape)}"
            )
            args = {
                name: to_framework(a, "torch")
                for name, a in (
                    ("weights", weights),
                    ("c", c),
                    ("w_uv", w_uv),
                    ("w_o", w_o),
                )
            }
            # (B, H, T, V): what absorption avoids forming
            values = c[:, None] @ np.swapaxes(w_uv, -1, -2)
            with contextlib.ExitStack() as stack:
                watches = [
                    stack.enter_context(observe.FormedTensors(target))
                    for target in (
                        (values, weights @ values) if watched else ()
                    )
                ]
                leaves = (
                    stack.enter_context(observe.LeavesTorch())
                    if watched
                    else None
                )
                result = call(fn, args, label, positional=4)
            out = as_array(result, "result", case)
            ref = mla_output_variant(weights, c, w_uv, w_o)
            if close(out, ref, 1e-4, RTOL):
                if leaves is not None and leaves.left:
                    raise fail("left-torch", detail=leaves.left, case=case)
                for watch, what in zip(
                    watches, ("values", "heads' outputs"), strict=False
                ):
                    if watch.formed:
                        raise fail(
                            "values-formed",
                            detail="a tensor holding the "
                            f"{shape_text(values.shape)} {what}",
                            case=case,
                        )
                continue
            candidates = [
                (
                    "heads-split-wrong",
                    "",
                    lambda a=weights, c=c, u=w_uv, o=w_o: (
                        mla_output_variant(a, c, u, o, split="feature-major"),
                        None,
                    ),
                )
            ]
            diagnose(
                out,
                None,
                candidates,
                case,
                ref,
                None,
                what="result",
                atol=1e-4,
                rtol=RTOL,
            )
        return (
            f"✓ {display_name(fn, label)}: {len(sizes)} random cases (1 to "
            "4 heads, latent wider and narrower "
            "than the model) match the output of the expanded values, none "
            "of them formed"
        )

    run_check(body, timeout)


# -----------------------------------------------------------------------------
# Questions
# -----------------------------------------------------------------------------

_GEMMA3 = next(c for c in PUBLISHED if c.name == "Gemma-3-12B")


def _window_bytes(window: int) -> float:
    """Gemma-3-12B's cache in MiB at 32768 tokens with ``window`` tokens kept
    per local layer (a near miss)."""
    return (
        published_cache_bytes(
            dataclasses.replace(_GEMMA3, local_span=window), 32768
        )
        / 1024**2
    )


number_question(
    # rtol 1e-5 (0.02 MiB): a window off by one key changes the answer by 0.3
    # MiB, within 1e-3 of it
    "14.gemma3-cache",
    answer=lambda: published_cache_bytes(_GEMMA3, 32768) / 1024**2,
    rtol=1e-5,
    why="8 global layers keep all 32768 tokens and 40 local layers only 1024: "
    "2 * 8 * 256 * 2 bytes * (8 * 32768 + 40 * 1024) = 2368 MiB, a fifth of "
    "the 12288 MiB of 48 global layers.",
    known=lambda: {
        scheme_bytes_per_token(_GEMMA3, "GQA") * 32768 / 1024**2: (
            "window-ignored",
            "that counts all 48 layers as global; the 40 local layers keep "
            "only 1024 tokens.",
        ),
        scheme_bytes_per_token(_GEMMA3, "GQA") * 32768 / 1024**2 / 2: (
            "cache-keys-only",
            "that is half the cache: count keys AND values (the factor 2).",
        ),
        **{
            _window_bytes(window): (
                "cache-window-off-by-one",
                f"that keeps {window} tokens per local layer; "
                "count again how many tokens a window of 1024 holds.",
            )
            for window in (1023, 1025)
        },
    },
    hint="Count the global and the local layers apart: bytes per layer "
    "and token = 2 (K, V) * 8 heads * 256 * 2.",
)

number_question(
    # rtol 5e-3: the 0.0099 the explanation prints is right too (0.3 % from
    # 0.009866)
    "14.softcap-gradient",
    answer=lambda: 1 - math.tanh(3.0) ** 2,
    rtol=5e-3,
    why="d/ds [50 tanh(s / 50)] = 1 - tanh(s / 50)^2 (the 50 and the 1 "
    "/ 50 cancel): at s = 150, 1 - tanh(3)^2 "
    "= 0.0099, a hundred times flatter than the gradient 1 at s = 0.",
    known=lambda: {
        1 - math.tanh(3.0): (
            "wrong-answer",
            "that is 1 - tanh(3): the derivative of tanh is 1 - tanh^2, "
            "squared.",
        ),
        50 * (1 - math.tanh(3.0) ** 2): (
            "wrong-answer",
            "the cap's 50 cancels with the 1 / 50 of the chain rule.",
        ),
        1 / math.cosh(3.0): (
            "wrong-answer",
            "that is sech(3); the derivative of tanh is sech^2 = 1 - tanh^2.",
        ),
        50 * math.tanh(3.0): (
            "wrong-answer",
            "that is the capped score itself, not its gradient.",
        ),
    },
    hint="Differentiate cap * tanh(s / cap) with respect to s with the "
    "chain rule, then put s = 150, cap = 50.",
)

_SINK_SCORES, _SINK_SHARE = (1.0, 2.0, 0.5), 0.6


def _logsumexp(values) -> float:
    return math.log(sum(math.exp(v) for v in values))


number_question(
    "14.sink-logit",
    answer=lambda: (
        _logsumexp(_SINK_SCORES) + math.log((1 - _SINK_SHARE) / _SINK_SHARE)
    ),
    rtol=1e-3,
    why="the keys' weights sum to S / (S + e^z) with S = sum(e^s): so "
    "e^z = S (1 - 0.6) / 0.6 and "
    "z = logsumexp(1, 2, 0.5) + log(0.4 / 0.6) = 2.46 - 0.41 = 2.06.",
    known=lambda: {
        math.log((1 - _SINK_SHARE) / _SINK_SHARE): (
            "wrong-answer",
            "that forgets the keys' scores: the sink competes with "
            "sum(e^s), not with 1.",
        ),
        _logsumexp(_SINK_SCORES) + math.log(_SINK_SHARE / (1 - _SINK_SHARE)): (
            "wrong-answer",
            "the ratio is upside down: 0.6 is the keys' share, the sink's "
            "is 0.4.",
        ),
        _logsumexp(_SINK_SCORES) + math.log(1 - _SINK_SHARE): (
            "wrong-answer",
            "e^z / (S + e^z) = 0.4 has S + e^z, not S, in its denominator.",
        ),
        math.log(sum(_SINK_SCORES))
        + math.log((1 - _SINK_SHARE) / _SINK_SHARE): (
            "wrong-answer",
            "sum the exponentials of the scores, not the scores.",
        ),
    },
    hint="Write the keys' total weight S / (S + e^z) with S = sum of "
    "e^score, set it to 0.6 and solve for z.",
)
