"""Checks of chapter 10: sinusoidal encodings, rotary embeddings (RoPE), ALiBi slopes, RoPE while decoding.

Every reference here is float64 NumPy written for the checker; each ``*_variant`` builder is the reference with
one deliberate deviation, the mistake whose code it is listed under.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ..positions import alibi_bias
from .cases import to_framework
from .diagnosis import core_variants, diagnose, sdpa_variant
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

# ----------------------------------------------------------------------------------------------------------
# Sinusoidal encodings
# ----------------------------------------------------------------------------------------------------------


def sinusoid_variant(t: int, d: int, *, exponent="ok", swapped=False) -> np.ndarray:
    """(T, D) sinusoids; ``exponent``: ok | no-two | features | per-feature | positive; ``swapped``: cos, sin."""
    pos = np.arange(t, dtype=np.float64)[:, None]  # (T, 1)
    pair = np.arange(d // 2, dtype=np.float64)  # (D/2,)
    power = {"ok": -2 * pair / d, "no-two": -pair / d, "features": -4 * pair / d, "positive": 2 * pair / d}
    even_exp = power.get(exponent, -2 * pair / d)
    odd_exp = -(2 * pair + 1) / d if exponent == "per-feature" else even_exp
    even, odd = np.sin(pos * 10000.0**even_exp), np.cos(pos * 10000.0**odd_exp)
    if swapped:
        even, odd = np.cos(pos * 10000.0**even_exp), np.sin(pos * 10000.0**odd_exp)
    pe = np.empty((t, d))
    pe[:, 0::2], pe[:, 1::2] = even, odd
    return pe


_SINUSOID_EXPONENTS = [
    ("no-two", "pair i uses 10000^(-i/D), without the factor 2"),
    ("features", "pair i uses 10000^(-4i/D): the exponent counts features (2i) and then doubles them again"),
    ("per-feature", "the cosine of pair i uses 10000^(-(2i+1)/D), another frequency from its sine"),
    ("positive", "the exponent has the wrong sign: 10000^(+2i/D) grows instead of falling"),
]
_SINUSOID_CASES = [(10, 8), (50, 16), (7, 6), (1, 2), (33, 64)]


def check_sinusoidal_positions(fn, *, timeout: float = DEFAULT_TIMEOUT):
    """Check ``fn(num_positions, dim)`` -> (T, D) sinusoidal encodings of Vaswani et al.:
    PE[p, 2i] = sin(p theta_i), PE[p, 2i+1] = cos(p theta_i), theta_i = 10000^(-2i/D) (as
    :func:`attention_course.positions.sinusoidal_positions`). Diagnoses ``[sinusoid-wrong-exponent]`` and
    ``[sin-cos-swapped]``."""
    label = "sinusoidal_positions"

    def body():
        for i, (t, d) in enumerate(_SINUSOID_CASES, 1):
            case = f"case {i} of {len(_SINUSOID_CASES)}: {label}({t}, {d})"
            out = as_array(call(fn, {"num_positions": t, "dim": d}, label, positional=2), "result", case)
            ref = sinusoid_variant(t, d)
            if close(out, ref, 1e-5, 1e-4):
                continue
            candidates = [("sin-cos-swapped", "", lambda t=t, d=d: (sinusoid_variant(t, d, swapped=True), None))]
            candidates += [("sinusoid-wrong-exponent", detail,
                            lambda t=t, d=d, e=e: (sinusoid_variant(t, d, exponent=e), None))
                           for e, detail in _SINUSOID_EXPONENTS]
            diagnose(out, None, candidates, case, ref, None, what="encoding", atol=1e-5, rtol=1e-4)
        return (f"✓ {display_name(fn, label)}: {len(_SINUSOID_CASES)} sizes (T up to 50, D from 2 to 64) match "
                "the sinusoids of Vaswani et al.")

    run_check(body, timeout)


# ----------------------------------------------------------------------------------------------------------
# Rotary position embedding
# ----------------------------------------------------------------------------------------------------------


def rope_variant(x, positions, *, pairing="interleaved", angles="ok", base=10000.0) -> np.ndarray:
    """RoPE on x (..., T, Dh) as complex multiplication, float64; ``angles``: ok | no-two | features | positive
    | no-position | reversed."""
    d = x.shape[-1]
    pair = np.arange(d // 2, dtype=np.float64)
    power = {"no-two": -pair / d, "features": -4 * pair / d, "positive": 2 * pair / d}.get(angles, -2 * pair / d)
    theta = base**power  # (Dh/2,)
    m = np.ones_like(positions, dtype=np.float64) if angles == "no-position" else np.asarray(positions, float)
    phase = m[..., None] * theta * (-1.0 if angles == "reversed" else 1.0)  # (T, Dh/2)
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
    ("features", "pair i turns by m * base^(-4i/Dh): the exponent counts features (2i) and doubles them again"),
    ("positive", "the exponent has the wrong sign: base^(+2i/Dh)"),
    ("no-position", "every position turns by theta_i: the angle must be m * theta_i, growing with the position m"),
    ("reversed", "you rotate the other way, by -m * theta_i: x_2i' = x_2i cos + x_2i+1 sin"),
]
# (shape of x (..., T, Dh), first position): the first case already tells every mistake apart
_ROPE_CASES = [((6, 8), 0), ((2, 3, 5, 4), 0), ((1, 2, 7, 16), 3), ((4, 2), 0), ((2, 2, 9, 6), 10), ((3, 12), 100)]


def check_rope(fn, *, timeout: float = DEFAULT_TIMEOUT):
    """Check ``fn(x, positions)``: x a float32 torch tensor (..., T, Dh), positions an int64 tensor (T,) ->
    x with feature pair (2i, 2i+1) of position m rotated by m * theta_i, theta_i = 10000^(-2i/Dh) (the
    ``"interleaved"`` pairing of :func:`attention_course.positions.apply_rope`). Diagnoses
    ``[rope-wrong-pairing]`` (the halves pairing) and ``[rope-wrong-frequencies]``."""
    label = "rope"

    def body():
        rng = np.random.default_rng(10)
        for i, (shape, start) in enumerate(_ROPE_CASES, 1):
            x = rng.standard_normal(shape)
            positions = np.arange(start, start + shape[-2])
            case = (f"case {i} of {len(_ROPE_CASES)}: x of shape {shape_text(shape)}, positions "
                    f"{start}..{positions[-1]}")
            args = {"x": to_framework(x, "torch"), "positions": torch.from_numpy(positions)}
            out = as_array(call(fn, args, label, positional=2), "result", case)
            ref = rope_variant(x, positions)
            if close(out, ref, 2e-5, 1e-4):
                continue
            candidates = [("rope-wrong-pairing", "you pair feature i with feature i + Dh/2 (the halves form); "
                           "here the pairs are neighbours (x_2i, x_2i+1)",
                           lambda x=x, p=positions: (rope_variant(x, p, pairing="halves"), None))]
            candidates += [("rope-wrong-frequencies", detail,
                            lambda x=x, p=positions, a=a: (rope_variant(x, p, angles=a), None))
                           for a, detail in _ROPE_ANGLES]
            diagnose(out, None, candidates, case, ref, None, what="result", atol=2e-5, rtol=1e-4)
        return (f"✓ {display_name(fn, label)}: {len(_ROPE_CASES)} random cases ((T, Dh) and batched (B, H, T, Dh) "
                "inputs, positions starting at 0 and later) match RoPE computed as complex multiplication")

    run_check(body, timeout)


# ----------------------------------------------------------------------------------------------------------
# ALiBi slopes
# ----------------------------------------------------------------------------------------------------------


def alibi_slopes_variant(h: int, *, rule="paper", first=1, extra="every-other", reverse=False) -> np.ndarray:
    """(H,) ALiBi slopes; ``rule``: paper | geometric (2^(-8k/H) for all H) | halving (1/2, 1/4, ...);
    ``first``: the exponent index of the first head (1, or 0 for 1, ...); ``extra``: every-other | first | odd."""
    if rule == "halving":
        slopes = [2.0 ** -(k + first) for k in range(h)]
    elif rule == "geometric":
        slopes = [2.0 ** (-8.0 * (k + first) / h) for k in range(h)]
    else:
        n = 2 ** math.floor(math.log2(h))
        slopes = [2.0 ** (-8.0 * (k + first) / n) for k in range(n)]
        doubled = [2.0 ** (-8.0 * (k + first) / (2 * n)) for k in range(2 * n)]
        picked = {"every-other": doubled[0::2], "first": doubled, "odd": doubled[1::2]}[extra]
        slopes += picked[: h - n]
    return np.array(slopes[::-1] if reverse else slopes)


_ALIBI_VARIANTS = [
    ({"rule": "geometric"}, "you continue the geometric sequence 2^(-8k/H) for all {h} heads; when H is not a "
     "power of two the paper takes the slopes of the closest power of two below H, then every other slope of twice "
     "as many heads"),
    ({"rule": "halving"}, "you use 1/2, 1/4, 1/8, ... whatever the number of heads; the ratio is 2^(-8/H), so "
     "that the last slope is 2^-8 (for a power of two H)"),
    ({"first": 0}, "you count heads from 0, so the first slope is 2^0 = 1; the first slope is 2^(-8/H)"),
    ({"rule": "geometric", "first": 0}, "you count heads from 0, so the first slope is 2^0 = 1; the first slope is "
     "2^(-8/H)"),
    ({"reverse": True}, "they are in reverse order: the first head has the largest slope, 2^(-8/H)"),
    ({"extra": "first"}, "the extra heads take the FIRST slopes of twice as many heads; the paper takes every "
     "other one (the 1st, 3rd, 5th, ...), which fall between the slopes you already have"),
    ({"extra": "odd"}, "the extra heads take the 2nd, 4th, ... slopes of twice as many heads: those repeat slopes "
     "you already have; the paper takes the 1st, 3rd, 5th, ..."),
]
_ALIBI_CASES = [8, 1, 2, 16, 12, 6, 5, 24]


def check_alibi_slopes(fn, *, timeout: float = DEFAULT_TIMEOUT):
    """Check ``fn(num_heads)`` -> the H slopes of ALiBi (Press et al.; a list, array or tensor), as
    :func:`attention_course.positions.alibi_slopes`: 2^(-8/H), 2^(-16/H), ..., 2^(-8) when H is a power of two;
    otherwise the slopes of the closest smaller power of two n, then the first H - n of every other slope of 2n
    heads. Diagnoses ``[alibi-wrong-slopes]`` (with what is wrong)."""
    label = "alibi_slopes"

    def body():
        for i, h in enumerate(_ALIBI_CASES, 1):
            case = f"case {i} of {len(_ALIBI_CASES)}: {label}({h})"
            out = as_array(call(fn, {"num_heads": h}, label), "result", case)
            ref = alibi_slopes_variant(h)
            if close(out, ref, 1e-8, 1e-5):
                continue
            candidates = [("alibi-wrong-slopes", detail.format(h=h),
                           lambda h=h, kw=kw: (alibi_slopes_variant(h, **kw), None))
                          for kw, detail in _ALIBI_VARIANTS]
            diagnose(out, None, candidates, case, ref, None, what="slopes", atol=1e-8, rtol=1e-5)
        return (f"✓ {display_name(fn, label)}: {len(_ALIBI_CASES)} head counts (powers of two and not: "
                f"{', '.join(map(str, _ALIBI_CASES))}) give the slopes of Press et al.")

    run_check(body, timeout)


# ----------------------------------------------------------------------------------------------------------
# RoPE while decoding with a KV cache
# ----------------------------------------------------------------------------------------------------------


def rope_decode_variant(q, k, v, cache_k, cache_v, *, position="ok", rotate_values=False, rerotate=False,
                        core=None):
    """One decoding step with RoPE, float64: q, k, v (B, H, 1, Dh) of the new token, cache_k (B, H, T, Dh)
    keys already rotated at 0..T-1, cache_v (B, H, T, Dh) -> out (B, H, 1, Dh). ``position``: ok (T) | zero |
    before (T - 1) | after (T + 1)."""
    t = cache_k.shape[-2]
    new = {"ok": t, "zero": 0, "before": t - 1, "after": t + 1}[position]
    q_rot, k_rot = rope_variant(q, [new]), rope_variant(k, [new])
    old_keys = rope_variant(cache_k, np.arange(t)) if rerotate else cache_k
    v_new = rope_variant(v, [new]) if rotate_values else v
    keys, values = np.concatenate([old_keys, k_rot], axis=-2), np.concatenate([cache_v, v_new], axis=-2)
    return sdpa_variant(q_rot, keys, values, None, **(core or {}))


# (B, H, T cached, Dh)
_DECODE_CASES = [(1, 2, 5, 8), (2, 4, 9, 16), (1, 1, 3, 4), (2, 2, 12, 8), (3, 2, 20, 6)]


def check_rope_decode_step(fn, *, timeout: float = DEFAULT_TIMEOUT):
    """Check ``fn(q, k, v, cache_k, cache_v)`` -> out (B, H, 1, Dh) (or (out, weights)): one decoding step of
    causal attention with RoPE (interleaved pairs, base 10000). q, k, v (B, H, 1, Dh) are the new token's
    projections, not yet rotated; cache_k (B, H, T, Dh) holds the keys of positions 0..T-1, already rotated;
    cache_v (B, H, T, Dh) their values. The new token is at position T. Diagnoses
    ``[rope-position-not-offset]``, ``[rope-rotates-values]``, ``[rope-cache-rotated-twice]`` and the attention
    mistakes of :func:`check_scaled_dot_product_attention`."""
    label = "rope_decode_step"
    atol, rtol = 2e-5, 1e-4

    def body():
        rng = np.random.default_rng(11)
        for i, (b, h, t, dh) in enumerate(_DECODE_CASES, 1):
            q, k, v = (rng.standard_normal((b, h, 1, dh)) for _ in range(3))
            cache_k = rope_variant(rng.standard_normal((b, h, t, dh)), np.arange(t))
            cache_v = rng.standard_normal((b, h, t, dh))
            case = (f"case {i} of {len(_DECODE_CASES)}: B={b}, H={h}, Dh={dh}, {t} cached tokens "
                    f"(the new token is at position {t})")
            args = {name: to_framework(a, "torch") for name, a in
                    (("q", q), ("k", k), ("v", v), ("cache_k", cache_k), ("cache_v", cache_v))}
            out_s, w_s = split_result(call(fn, args, label, positional=5), case)
            out_s = as_array(out_s, "output" if w_s is not None else "result", case)
            w_s = None if w_s is None else as_array(w_s, "weights", case)
            ref_out, ref_w = rope_decode_variant(q, k, v, cache_k, cache_v)
            if close(out_s, ref_out, atol, rtol) and (w_s is None or close(w_s, ref_w, atol, rtol)):
                continue
            inputs = (q, k, v, cache_k, cache_v)
            structural = [
                ("rope-position-not-offset", "0", {"position": "zero"}),
                ("rope-position-not-offset", f"T - 1 = {t - 1}", {"position": "before"}),
                ("rope-position-not-offset", f"T + 1 = {t + 1}", {"position": "after"}),
                ("rope-rotates-values", "", {"rotate_values": True}),
                ("rope-cache-rotated-twice", "", {"rerotate": True}),
            ]
            candidates = [(c, d, lambda kw=kw, a=inputs: rope_decode_variant(*a, **kw)) for c, d, kw in structural]
            candidates += [(c, d, lambda kw=kw, a=inputs: rope_decode_variant(*a, core=kw))
                           for c, d, kw in core_variants(dh, dh, 1, t + 1, 4, False, False)]
            diagnose(out_s, w_s, candidates, case, ref_out, ref_w, atol=atol, rtol=rtol)
        return (f"✓ {display_name(fn, label)}: {len(_DECODE_CASES)} random decoding steps (caches of 3 to 20 "
                "tokens, 1 to 4 heads) match full attention with RoPE at the right positions")

    run_check(body, timeout)


# ----------------------------------------------------------------------------------------------------------
# Checked questions
# ----------------------------------------------------------------------------------------------------------

choice_question(
    "10.rotated",
    answer="B",
    why="RoPE rotates queries and keys, so that their dot products depend only on the distance m - n; the values "
        "carry the content that is averaged and stay as they are.",
    wrong={
        "A": ("rope-rotates-values", "the values are never rotated: only the scores need the positions."),
        "C": "rotating only the keys leaves the score depending on the key's absolute position, not on m - n: "
             "queries must be rotated too.",
        "D": "adding positions to the embeddings before the first layer is what absolute positions (sinusoidal or "
             "learned) do; RoPE acts inside every attention layer, after the projections.",
    },
)


def _alibi_bias_answer() -> float:
    """The bias head 2 of 8 adds to the score of query 10 for key 2: what the library computes."""
    return alibi_bias(8, 11, dtype=torch.float64)[2, 10, 2].item()


number_question(
    "10.alibi-bias",
    answer=_alibi_bias_answer,
    rtol=1e-6,
    why="head 2 (the third, counting from 0) has the slope 2^-3 = 1/8, and the key is 10 - 2 = 8 positions back: "
        "-8/8 = -1.",
    known={
        1.0: "the bias is a penalty: it is subtracted from the score, so it is negative.",
        -2.0: "heads are counted from 0: head 2 is the third head, whose slope is 2^-3, not 2^-2.",
        -0.5: "heads are counted from 0: head 2 is the third head, whose slope is 2^-3, not 2^-4.",
        -1.25: "the penalty grows with the distance between query and key, 10 - 2 = 8, not with the query's position.",
    },
    hint="The bias of head h is -slope_h * (i - j) for query i and key j; with 8 heads the slopes are 2^-1, 2^-2, ...",
)
