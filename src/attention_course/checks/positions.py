"""Checks of chapter 10: RoPE in the halves form, ALiBi after a cache, RoPE in
a left-padded batch, RoPE weights between the two pairings, and the chapter's
checked questions.

Every reference here is float64 NumPy written for the checker; each
``*_variant`` builder is the reference with one deliberate deviation, the
mistake whose code it is listed under.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ..positions import alibi_bias
from . import hidden
from .cases import to_framework
from .diagnosis import core_variants, diagnose
from .questions import choice_question, number_question
from .runner import (
    DEFAULT_TIMEOUT,
    as_array,
    call,
    close,
    display_name,
    run_check,
    shape_text,
    split_result,
)

# -----------------------------------------------------------------------------
# Rotary position embedding: the reference of every RoPE check below
# -----------------------------------------------------------------------------


def rope_variant(
    x, positions, *, pairing="interleaved", angles="ok", base=10000.0
) -> np.ndarray:
    """RoPE on x (..., T, Dh) as complex multiplication, float64; ``angles``:
    ok | no-two | features | positive
    | no-position | reversed."""
    d = x.shape[-1]
    pair = np.arange(d // 2, dtype=np.float64)
    power = {
        "no-two": -pair / d,
        "features": -4 * pair / d,
        "positive": 2 * pair / d,
    }.get(angles, -2 * pair / d)
    theta = base**power  # (Dh/2,)
    m = (
        np.ones_like(positions, dtype=np.float64)
        if angles == "no-position"
        else np.asarray(positions, float)
    )
    # (T, Dh/2)
    phase = m[..., None] * theta * (-1.0 if angles == "reversed" else 1.0)
    rotation = np.exp(1j * phase)
    if pairing == "interleaved":
        z = (x[..., 0::2] + 1j * x[..., 1::2]) * rotation
        out = np.empty(np.broadcast_shapes(x.shape, (*z.shape[:-1], d)))
        out[..., 0::2], out[..., 1::2] = z.real, z.imag
        return out
    z = (x[..., : d // 2] + 1j * x[..., d // 2 :]) * rotation
    return np.concatenate([z.real, z.imag], axis=-1)


_ROPE_ANGLES = [
    ("no-two", "pair i turns by m * base^(-i/Dh), without the factor 2"),
    (
        "features",
        "pair i turns by m * base^(-4i/Dh): the exponent counts features "
        "(2i) and doubles them again",
    ),
    ("positive", "the exponent has the wrong sign: base^(+2i/Dh)"),
    (
        "no-position",
        "every position turns by theta_i: the angle must be m * theta_i, "
        "growing with the position m",
    ),
    (
        "reversed",
        "you rotate the other way, by -m * theta_i: x_2i' = x_2i cos + "
        "x_2i+1 sin",
    ),
]
# (shape of x (..., T, Dh), first position): the first case already tells every
# mistake apart
_ROPE_CASES = [
    ((6, 8), 0),
    ((2, 3, 5, 4), 0),
    ((1, 2, 7, 16), 3),
    ((4, 2), 0),
    ((2, 2, 9, 6), 10),
    ((3, 12), 100),
]


# -----------------------------------------------------------------------------
# Checked questions
# -----------------------------------------------------------------------------


def _alibi_bias_answer() -> float:
    """The bias head 2 of 8 adds to the score of query 10 for key 2: what the
    library computes."""
    return alibi_bias(8, 11, dtype=torch.float64)[2, 10, 2].item()


number_question(
    "10.alibi-bias",
    answer=_alibi_bias_answer,
    rtol=1e-6,
    why="head 2 (the third, counting from 0) has the slope 2^-3 = 1/8, "
    "and the key is 10 - 2 = 8 positions back: "
    "-8/8 = -1.",
    known={
        1.0: "the bias is a penalty: it is subtracted from the score, so "
        "it is negative.",
        -2.0: "heads are counted from 0: head 2 is the third head, whose "
        "slope is 2^-3, not 2^-2.",
        -0.5: "heads are counted from 0: head 2 is the third head, whose "
        "slope is 2^-3, not 2^-4.",
        -1.25: "the penalty grows with the distance between query and key, "
        "10 - 2 = 8, not with the query's position.",
    },
    hint="The bias of head h is -slope_h * (i - j) for query i and key "
    "j; with 8 heads the slopes are 2^-1, 2^-2, ...",
)


# -----------------------------------------------------------------------------
# RoPE in the halves form (Hugging Face's rotate_half), what the chapter does
# not print
# -----------------------------------------------------------------------------


def rope_halves_repeat_layout(x, positions, base=10000.0) -> np.ndarray:
    """Halves RoPE whose cos/sin tables give feature j the angle of pair j // 2
    (repeat_interleave, the layout of neighbour pairs) instead of pair j mod
    Dh/2: x cos + rotate_half(x) sin with the wrong tables."""
    d = x.shape[-1]
    # (Dh,): theta_0, theta_0, theta_1, ...
    theta = np.repeat(base ** (-2 * np.arange(d // 2) / d), 2)
    angle = np.asarray(positions, float)[..., None] * theta  # (T, Dh)
    rotated_half = np.concatenate(
        [-x[..., d // 2 :], x[..., : d // 2]], axis=-1
    )
    return x * np.cos(angle) + rotated_half * np.sin(angle)


def check_rope_halves(fn, *, timeout: float = DEFAULT_TIMEOUT):
    """Check ``fn(x, positions)``: x a float32 torch tensor (..., T, Dh),
    positions an int64 tensor (T,) -> x with feature pair (i, i + Dh/2) of
    position m rotated by m * theta_i, theta_i = 10000^(-2i/Dh) (the
    ``"halves"`` pairing of GPT-NeoX and Hugging Face's ``rotate_half``).
    Hidden cases: more heads, longer rows, wider heads. Diagnoses
    ``[rope-wrong-pairing]`` (neighbour pairs), ``[rope-angle-layout]`` and
    ``[rope-wrong-frequencies]``."""
    label = "rope_halves"

    def body():
        rng = np.random.default_rng(12)
        cases = _ROPE_CASES + hidden.rope_sizes()
        for i, (shape, start) in enumerate(cases, 1):
            x = rng.standard_normal(shape)
            positions = np.arange(start, start + shape[-2])
            case = (
                f"case {i} of {len(cases)}: x of shape "
                f"{shape_text(shape)}, positions "
                f"{start}..{positions[-1]}"
            )
            args = {
                "x": to_framework(x, "torch"),
                "positions": torch.from_numpy(positions),
            }
            out = as_array(call(fn, args, label, positional=2), "result", case)
            ref = rope_variant(x, positions, pairing="halves")
            if close(out, ref, 2e-5, 1e-4):
                continue
            candidates = [
                (
                    "rope-wrong-pairing",
                    "you pair neighbours (x_2i, x_2i+1); here feature i "
                    "pairs with "
                    "feature i + Dh/2 (the halves form)",
                    lambda x=x, p=positions: (rope_variant(x, p), None),
                ),
                (
                    "rope-angle-layout",
                    "feature j turns by the angle of pair j // 2, as if the "
                    "pairs were "
                    "neighbours",
                    lambda x=x, p=positions: (
                        rope_halves_repeat_layout(x, p),
                        None,
                    ),
                ),
            ]
            candidates += [
                (
                    "rope-wrong-frequencies",
                    detail,
                    lambda x=x, p=positions, a=a: (
                        rope_variant(x, p, pairing="halves", angles=a),
                        None,
                    ),
                )
                for a, detail in _ROPE_ANGLES
            ]
            diagnose(
                out,
                None,
                candidates,
                case,
                ref,
                None,
                what="result",
                atol=2e-5,
                rtol=1e-4,
            )
        return (
            f"✓ {display_name(fn, label)}: {len(cases)} random cases ((T, "
            "Dh) and batched (B, H, T, Dh) inputs, "
            "positions starting at 0 and later) match RoPE with pairs (i, i "
            "+ Dh/2)"
        )

    run_check(body, timeout)


# -----------------------------------------------------------------------------
# ALiBi for the last Tq of Tk positions (decoding with a cache)
# -----------------------------------------------------------------------------


def alibi_attention_variant(
    q,
    k,
    v,
    slopes,
    *,
    query="last",
    mask="bottom-right",
    sign=-1.0,
    scaled=False,
    scale=None,
    distance="abs",
):
    """Causal attention with ALiBi, float64: q (B, H, Tq, Dh), k and v (B, H,
    Tk, Dh), slopes (H,) -> (out, weights). ``query``: last (query i at i + Tk
    - Tq) | first (at i); ``mask``: bottom-right | top-left | none; ``sign`` of
    the bias; ``scaled``: the bias added before dividing by sqrt(Dh);
    ``distance``: abs | signed."""
    t_q, t_k = q.shape[-2], k.shape[-2]
    # (Tq, 1)
    query_pos = np.arange(t_q)[:, None] + (t_k - t_q if query == "last" else 0)
    dist = query_pos - np.arange(t_k)  # (Tq, Tk)
    dist = np.abs(dist) if distance == "abs" else dist
    # (H, Tq, Tk)
    bias = sign * np.asarray(slopes, float)[:, None, None] * dist
    s = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    raw = q @ np.swapaxes(k, -1, -2)  # (B, H, Tq, Tk)
    scores = (raw + bias) * s if scaled else raw * s + bias
    if mask != "none":
        allowed = np.tril(
            np.ones((t_q, t_k), dtype=bool),
            k=t_k - t_q if mask == "bottom-right" else 0,
        )
        scores = np.where(allowed, scores, -np.inf)
    scores = scores - scores.max(axis=-1, keepdims=True)
    weights = np.exp(scores)
    weights = weights / weights.sum(axis=-1, keepdims=True)
    return weights @ v, weights


_ALIBI_ATTENTION_MISTAKES = [
    ("alibi-query-offset", "", {"query": "first"}),
    # whatever the bias's offset: one constant per row
    ("causal-top-left-aligned", "", {"mask": "top-left"}),
    ("alibi-bias-sign", "", {"sign": 1.0}),
    (
        "alibi-bias-sign",
        ", and your queries sit at positions 0..Tq-1",
        {"sign": 1.0, "query": "first"},
    ),
    ("alibi-bias-scaled", "", {"scaled": True}),
    ("mask-ignored", "", {"mask": "none"}),
    ("mask-ignored", "", {"mask": "none", "distance": "signed"}),
]
# (B, H, Tq, Tk, Dh): the first case (Tq < Tk) already tells every mistake
# apart
_ALIBI_ATTENTION_CASES = [
    (1, 2, 3, 7, 4),
    (2, 4, 1, 9, 8),
    (1, 3, 5, 5, 6),
    (2, 8, 4, 10, 8),
]


def check_alibi_attention(fn, *, timeout: float = DEFAULT_TIMEOUT):
    """Check ``fn(q, k, v, slopes)`` -> out (B, H, Tq, Dh) or (out, weights):
    causal attention with ALiBi, the queries the last Tq of Tk positions (new
    tokens after a cache). q (B, H, Tq, Dh), k and v (B, H, Tk, Dh) float32
    torch tensors, slopes (H,) any positive numbers (not the paper's). Query i
    sits at position i + Tk - Tq; head h adds -slopes[h] * (its position - j)
    to the scaled score of key j; future keys are masked. Hidden cases: larger
    batches, more heads, longer caches. Diagnoses ``[alibi-query-offset]``,
    ``[causal-top-left-aligned]``, ``[alibi-bias-sign]``,
    ``[alibi-bias-scaled]``, ``[mask-ignored]`` and a missing or wrong
    scale."""
    label = "alibi_attention"
    atol, rtol = 2e-5, 1e-4

    def body():
        rng = np.random.default_rng(13)
        cases = _ALIBI_ATTENTION_CASES + hidden.alibi_sizes()
        for i, (b, h, t_q, t_k, dh) in enumerate(cases, 1):
            q = rng.standard_normal((b, h, t_q, dh))
            k, v = (rng.standard_normal((b, h, t_k, dh)) for _ in range(2))
            slopes = rng.uniform(0.1, 1.0, h)
            case = (
                f"case {i} of {len(cases)}: B={b}, H={h}, Dh={dh}, {t_q} "
                f"new queries after {t_k - t_q} cached "
                f"positions (Tq={t_q}, Tk={t_k}), slopes "
                f"{np.round(slopes, 2).tolist()}"
            )
            args = {
                "q": to_framework(q, "torch"),
                "k": to_framework(k, "torch"),
                "v": to_framework(v, "torch"),
                "slopes": to_framework(slopes, "torch"),
            }
            out_s, w_s = split_result(
                call(fn, args, label, positional=4), case
            )
            out_s = as_array(
                out_s, "output" if w_s is not None else "result", case
            )
            w_s = None if w_s is None else as_array(w_s, "weights", case)
            ref_out, ref_w = alibi_attention_variant(q, k, v, slopes)
            if close(out_s, ref_out, atol, rtol) and (
                w_s is None or close(w_s, ref_w, atol, rtol)
            ):
                continue
            inputs = (q, k, v, slopes)
            candidates = [
                (
                    code,
                    detail,
                    lambda kw=kw, a=inputs: alibi_attention_variant(*a, **kw),
                )
                for code, detail, kw in _ALIBI_ATTENTION_MISTAKES
            ]
            candidates += [
                (
                    code,
                    detail,
                    lambda kw=kw, a=inputs: alibi_attention_variant(
                        *a, scale=kw["scale"]
                    ),
                )
                for code, detail, kw in core_variants(
                    dh, dh, t_q, t_k, 4, False, False
                )
                if set(kw) == {"scale"}
            ]
            diagnose(
                out_s,
                w_s,
                candidates,
                case,
                ref_out,
                ref_w,
                atol=atol,
                rtol=rtol,
            )
        return (
            f"✓ {display_name(fn, label)}: {len(cases)} random cases (new "
            "queries after a cache, and "
            "square; each head its own slope) match causal attention with "
            "ALiBi"
        )

    run_check(body, timeout)


# -----------------------------------------------------------------------------
# RoPE in a left-padded batch: each row's positions start at its first real
# token
# -----------------------------------------------------------------------------


def left_padded_variant(
    x, pads, *, positions="ok", pairing="halves"
) -> np.ndarray:
    """Halves RoPE on x (B, H, T, Dh) whose row b holds pads[b] padding slots
    first, float64. ``positions``: ok (slot t is position t - pads[b]) | slots
    (t) | added (t + pads[b]) | row-<r> (t - pads[r] for every row)."""
    slots = np.arange(x.shape[-2])
    pads = np.asarray(pads)
    if positions == "ok":
        pos = slots - pads[:, None]
    elif positions == "slots":
        pos = np.broadcast_to(slots, (len(pads), len(slots)))
    elif positions == "added":
        pos = slots + pads[:, None]
    else:
        pos = np.broadcast_to(
            slots - pads[int(positions.split("-")[1])], (len(pads), len(slots))
        )
    # positions (B, 1, T) broadcast over the heads
    return rope_variant(x, pos[:, None, :], pairing=pairing)


def _real_slots(out, pads):
    """out (B, H, T, Dh) with every padding slot set to 0: what is compared."""
    # (B, T)
    real = np.arange(out.shape[-2])[None, :] >= np.asarray(pads)[:, None]
    return np.where(real[:, None, :, None], out, 0.0)


# (B, H, T, Dh, padding per row)
_PADDED_CASES = [
    (3, 2, 6, 8, [2, 0, 3]),
    (2, 1, 5, 4, [0, 4]),
    (4, 3, 7, 6, [1, 0, 6, 3]),
]


def check_rope_left_padded(fn, *, timeout: float = DEFAULT_TIMEOUT):
    """Check ``fn(x, pad)``: x a float32 torch tensor (B, H, T, Dh) of a
    left-padded batch, pad an int64 tensor (B,) of padding slots per row -> x
    rotated by halves RoPE (base 10000), slot t of row b at position t -
    pad[b]. Only the real tokens (t >= pad[b]) are compared. Hidden cases:
    batches of 5 to 7, longer rows. Diagnoses ``[rope-padding-ignored]``,
    ``[rope-offset-one-row]`` and ``[rope-wrong-pairing]``."""
    label = "rope_left_padded"

    def body():
        rng = np.random.default_rng(14)
        cases = _PADDED_CASES + [
            (len(pads), h, t, dh, pads)
            for h, t, dh, pads in hidden.left_padded_batches()
        ]
        for i, (b, h, t, dh, pads) in enumerate(cases, 1):
            x = rng.standard_normal((b, h, t, dh))
            case = (
                f"case {i} of {len(cases)}: x of shape "
                f"{shape_text(x.shape)}, padding slots per row {pads}"
            )
            args = {"x": to_framework(x, "torch"), "pad": torch.tensor(pads)}
            out = as_array(call(fn, args, label, positional=2), "result", case)
            ref = _real_slots(left_padded_variant(x, pads), pads)
            if out.shape == ref.shape:
                out = _real_slots(out, pads)
            if close(out, ref, 2e-5, 1e-4):
                continue
            wrong = [
                (
                    "rope-padding-ignored",
                    "slot t is rotated as position t whatever the padding",
                    "slots",
                ),
                (
                    "rope-padding-ignored",
                    "you add the padding (t + pad) instead of subtracting it",
                    "added",
                ),
            ]
            wrong += [
                ("rope-offset-one-row", f"{r} (pad = {pads[r]})", f"row-{r}")
                for r in range(b)
            ]
            candidates = [
                (
                    code,
                    detail,
                    lambda x=x, p=pads, pos=pos: (
                        _real_slots(
                            left_padded_variant(x, p, positions=pos), p
                        ),
                        None,
                    ),
                )
                for code, detail, pos in wrong
            ]
            candidates.append(
                (
                    "rope-wrong-pairing",
                    "you pair neighbours (x_2i, x_2i+1); here feature i "
                    "pairs with "
                    "feature i + Dh/2 (the halves form)",
                    lambda x=x, p=pads: (
                        _real_slots(
                            left_padded_variant(x, p, pairing="interleaved"), p
                        ),
                        None,
                    ),
                )
            )
            diagnose(
                out,
                None,
                candidates,
                case,
                ref,
                None,
                what="result",
                atol=2e-5,
                rtol=1e-4,
            )
        return (
            f"✓ {display_name(fn, label)}: {len(cases)} left-padded batches "
            "(rows with and without padding) "
            "rotate each real token by its position in its own row"
        )

    run_check(body, timeout)


# -----------------------------------------------------------------------------
# Weights between the two RoPE pairings: a Hugging Face (halves) checkpoint
# into neighbour-pair code
# -----------------------------------------------------------------------------


def _halves_order(d: int) -> np.ndarray:
    """p = [0, 2, 4, ..., 1, 3, 5, ...]: rope_halves(x[p]) ==
    rope_interleaved(x)[p]."""
    return np.concatenate([np.arange(0, d, 2), np.arange(1, d, 2)])


def rope_rows_variant(
    w,
    num_heads: int,
    *,
    order="inverse",
    per_head=True,
    columns=False,
    heads_last=False,
) -> np.ndarray:
    """The rows (H * Dh, ...) of a halves-layout projection reordered for
    neighbour pairs, float64: row j of head h <- row p^-1[j]
    (``order="inverse"``, right) or p[j] (``"forward"``). ``per_head=False``:
    one permutation over all rows; ``columns``: the columns permuted instead
    (per head of columns if ``per_head``);
    ``heads_last``: rows read as (Dh, H) instead of (H, Dh)."""
    w = np.asarray(w, float)
    axis_len = w.shape[1] if columns else w.shape[0]
    if columns and w.ndim != 2:
        raise ValueError("a bias has no columns")
    groups = num_heads if per_head else 1
    if axis_len % groups or (axis_len // groups) % 2:
        raise ValueError("not a whole number of even groups")
    d = axis_len // groups
    perm = _halves_order(d)
    perm = np.argsort(perm) if order == "inverse" else perm
    moved = w.T if columns else w
    shape = (
        (d, groups, *moved.shape[1:])
        if heads_last
        else (groups, d, *moved.shape[1:])
    )
    blocks = moved.reshape(shape)
    blocks = blocks[perm] if heads_last else blocks[:, perm]
    out = blocks.reshape(moved.shape)
    return out.T if columns else out


_ROPE_ROWS_MISTAKES = [
    ("rope-permutation-inverted", "", {"order": "forward"}),
    (
        "rope-permutation-not-per-head",
        "one permutation over all H * Dh rows",
        {"per_head": False},
    ),
    (
        "rope-permutation-not-per-head",
        "one permutation over all H * Dh rows (in the other direction too)",
        {"per_head": False, "order": "forward"},
    ),
    (
        "rope-permutation-not-per-head",
        "you read the rows as (Dh, H), the heads last, instead of (H, Dh)",
        {"heads_last": True},
    ),
    (
        "rope-permutation-not-per-head",
        "you read the rows as (Dh, H), the heads last, instead of (H, Dh)",
        {"heads_last": True, "order": "forward"},
    ),
    ("rope-permutation-on-columns", "", {"columns": True}),
    ("rope-permutation-on-columns", "", {"columns": True, "order": "forward"}),
    ("rope-permutation-on-columns", "", {"columns": True, "per_head": False}),
    (
        "rope-permutation-on-columns",
        "",
        {"columns": True, "per_head": False, "order": "forward"},
    ),
]
# (H, Dh, D; None: a bias (H * Dh,)): Dh >= 6, where p is not its own inverse
_ROPE_ROWS_CASES = [(2, 8, 6), (3, 6, 12), (1, 12, 5), (4, 8, None)]


def check_rope_to_interleaved(fn, *, timeout: float = DEFAULT_TIMEOUT):
    """Check ``fn(weight, num_heads)`` -> the weight (H * Dh, D) or bias (H *
    Dh,) of a query or key projection trained with halves RoPE (Hugging Face's
    layout), its rows reordered so that neighbour-pair RoPE gives the same
    attention: in every head, row j comes from row p^-1[j], p = [0, 2, 4, ...,
    1, 3, 5, ...]. Hidden cases: more heads, wider heads. Diagnoses
    ``[rope-permutation-inverted]``, ``[rope-permutation-not-per-head]`` and
    ``[rope-permutation-on-columns]``."""
    label = "halves_to_interleaved"

    def body():
        rng = np.random.default_rng(15)
        cases = _ROPE_ROWS_CASES + hidden.rope_weight_sizes()
        for i, (h, dh, d) in enumerate(cases, 1):
            shape = (h * dh,) if d is None else (h * dh, d)
            w = rng.standard_normal(shape)
            what = "bias" if d is None else "weight"
            case = (
                f"case {i} of {len(cases)}: a {what} of shape "
                f"{shape_text(shape)}, num_heads={h} (Dh = {dh})"
            )
            args = {"weight": to_framework(w, "torch"), "num_heads": h}
            out = as_array(call(fn, args, label, positional=2), "result", case)
            ref = rope_rows_variant(w, h)
            if close(out, ref, 1e-6, 1e-5):
                continue
            candidates = [
                (
                    code,
                    detail,
                    lambda w=w, h=h, kw=kw: (
                        rope_rows_variant(w, h, **kw),
                        None,
                    ),
                )
                for code, detail, kw in _ROPE_ROWS_MISTAKES
            ]
            diagnose(
                out,
                None,
                candidates,
                case,
                ref,
                None,
                what="result",
                atol=1e-6,
                rtol=1e-5,
            )
        return (
            f"✓ {display_name(fn, label)}: {len(cases)} projections "
            "(weights and a bias, several heads) "
            "reordered for neighbour pairs"
        )

    run_check(body, timeout)


# -----------------------------------------------------------------------------
# Read the plot: which rotation made these scores?
# -----------------------------------------------------------------------------


def score_mystery(
    num_positions: int = 24, dim: int = 16, seed: int = 3
) -> np.ndarray:
    """Chapter 10, read-the-plot: (T, T) scores q_m . k_n of one query and one
    key placed at every position, under the rotation that question
    ``10.which-rotation`` asks about."""
    rng = np.random.default_rng(seed)
    q, k = rng.standard_normal((1, dim)), rng.standard_normal((1, dim))
    positions = np.arange(num_positions)
    # the hidden choice: queries rotated, keys not
    q_m = rope_variant(np.repeat(q, num_positions, 0), positions)
    return q_m @ np.repeat(k, num_positions, 0).T


choice_question(
    "10.which-rotation",
    answer="B",
    why="every row is constant: the score of query position m does not "
    "change with the key position n, so the keys "
    "carry no position. Only the queries were rotated.",
    wrong={
        "A": "with queries and keys both rotated, the score depends on m "
        "- n: each DIAGONAL would be constant. Here "
        "each row is.",
        "C": "ALiBi subtracts slope * |m - n|: constant diagonals again, "
        "falling away from the main diagonal. Here "
        "each row is constant.",
        "D": "sinusoids added to q and k give q.k + q.PE_n + PE_m.k + "
        "PE_m.PE_n: terms in m, in n and in both, so "
        "neither rows, columns nor diagonals would be constant.",
    },
)
