"""Checks of chapter 10: right implementations pass with one line, each planted mistake gets its code."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from attention_course import checks, mistakes
from attention_course.positions import alibi_slopes, apply_rope, sinusoidal_positions

# ---------------------------------------------------------------- sinusoids


def sinusoid(num_positions, dim, *, exponent=lambda i, d: -2 * i / d, cos_exponent=None, swapped=False):
    """Sinusoids written out, with hooks for the mistakes: exponent(i, d) of 10000 for pair i."""
    pos = torch.arange(num_positions, dtype=torch.float64)[:, None]
    pair = torch.arange(dim // 2, dtype=torch.float64)
    sin_freq = 10000.0 ** exponent(pair, dim)
    cos_freq = sin_freq if cos_exponent is None else 10000.0 ** cos_exponent(pair, dim)
    pe = torch.empty(num_positions, dim, dtype=torch.float64)
    first, second = (torch.cos, torch.sin) if swapped else (torch.sin, torch.cos)
    pe[:, 0::2], pe[:, 1::2] = first(pos * sin_freq), second(pos * cos_freq)
    return pe.float()


SINUSOID_BUGS = [
    (lambda t, d: sinusoid(t, d, swapped=True), "sin-cos-swapped"),
    (lambda t, d: sinusoid(t, d, exponent=lambda i, d: -i / d), "sinusoid-wrong-exponent"),
    (lambda t, d: sinusoid(t, d, exponent=lambda i, d: -4 * i / d), "sinusoid-wrong-exponent"),
    (lambda t, d: sinusoid(t, d, exponent=lambda i, d: 2 * i / d), "sinusoid-wrong-exponent"),
    (lambda t, d: sinusoid(t, d, cos_exponent=lambda i, d: -(2 * i + 1) / d), "sinusoid-wrong-exponent"),
    (lambda t, d: sinusoid(t, d)[:, : d // 2], "wrong-shape"),
]


def test_sinusoids_pass(capsys):
    checks.check_sinusoidal_positions(sinusoidal_positions)
    checks.check_sinusoidal_positions(lambda t, d: sinusoid(t, d).numpy())
    out = capsys.readouterr().out
    assert out.count("✓") == 2 and "match the sinusoids of Vaswani et al." in out


@pytest.mark.parametrize("impl, code", SINUSOID_BUGS)
def test_sinusoid_mistakes(impl, code):
    with pytest.raises(checks.CheckFailed) as info:
        checks.check_sinusoidal_positions(impl)
    assert info.value.code == code, str(info.value)


# ---------------------------------------------------------------- RoPE


def rope_by_hand(x, positions, *, halves=False, exponent=2, sign=1.0, direction=1.0, use_position=True):
    """RoPE written out with hooks: theta_i = 10000^(sign * -exponent * i / Dh), angle direction * m * theta_i."""
    d = x.shape[-1]
    theta = 10000.0 ** (sign * -exponent * torch.arange(d // 2, dtype=torch.float64) / d)
    m = positions.double() if use_position else torch.ones_like(positions, dtype=torch.float64)
    angle = direction * m[:, None] * theta
    cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
    if halves:
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).flatten(-2)


ROPE_BUGS = [
    (lambda x, p: rope_by_hand(x, p, halves=True), "rope-wrong-pairing"),
    (lambda x, p: apply_rope(x, p, pairing="halves"), "rope-wrong-pairing"),
    (lambda x, p: rope_by_hand(x, p, exponent=1), "rope-wrong-frequencies"),
    (lambda x, p: rope_by_hand(x, p, exponent=4), "rope-wrong-frequencies"),
    (lambda x, p: rope_by_hand(x, p, sign=-1.0), "rope-wrong-frequencies"),
    (lambda x, p: rope_by_hand(x, p, direction=-1.0), "rope-wrong-frequencies"),
    (lambda x, p: rope_by_hand(x, p, use_position=False), "rope-wrong-frequencies"),
    (lambda x, p: x, "wrong-output"),
]


def test_rope_passes(capsys):
    checks.check_rope(apply_rope)
    checks.check_rope(rope_by_hand)
    assert capsys.readouterr().out.count("match RoPE computed as complex multiplication") == 2


@pytest.mark.parametrize("impl, code", ROPE_BUGS)
def test_rope_mistakes(impl, code):
    with pytest.raises(checks.CheckFailed) as info:
        checks.check_rope(impl)
    assert info.value.code == code, str(info.value)


# ---------------------------------------------------------------- ALiBi slopes


def slopes_geometric(h):
    return [2 ** (-8 * (k + 1) / h) for k in range(h)]


def slopes_paper(h, extra=lambda doubled: doubled[0::2], first=1):
    n = 2 ** math.floor(math.log2(h))
    doubled = [2 ** (-8 * (k + first) / (2 * n)) for k in range(2 * n)]
    return [2 ** (-8 * (k + first) / n) for k in range(n)] + extra(doubled)[: h - n]


ALIBI_BUGS = [
    (slopes_geometric, "for all 12 heads"),
    (lambda h: [2.0 ** -(k + 1) for k in range(h)], "whatever the number of heads"),
    (lambda h: slopes_paper(h, first=0), "count heads from 0"),
    (lambda h: slopes_paper(h)[::-1], "reverse order"),
    (lambda h: slopes_paper(h, extra=lambda d: d), "FIRST slopes"),
    (lambda h: slopes_paper(h, extra=lambda d: d[1::2]), "2nd, 4th"),
]


def test_alibi_slopes_pass(capsys):
    checks.check_alibi_slopes(alibi_slopes)
    checks.check_alibi_slopes(slopes_paper)
    assert capsys.readouterr().out.count("give the slopes of Press et al.") == 2


@pytest.mark.parametrize("impl, detail", ALIBI_BUGS)
def test_alibi_slope_mistakes(impl, detail):
    with pytest.raises(checks.CheckFailed) as info:
        checks.check_alibi_slopes(impl)
    assert info.value.code == "alibi-wrong-slopes", str(info.value)
    assert detail in str(info.value)


def test_alibi_wrong_count_is_a_shape_error():
    with pytest.raises(checks.CheckFailed) as info:
        checks.check_alibi_slopes(lambda h: slopes_paper(h)[:-1] if h > 1 else [0.0])
    assert info.value.code in ("wrong-shape", "wrong-output")


# ---------------------------------------------------------------- decoding with RoPE


def decode_step(q, k, v, cache_k, cache_v, *, offset=0, rotate_values=False, rerotate=False, scale=True):
    """One RoPE decoding step with hooks for the mistakes."""
    t = cache_k.shape[-2]
    position = torch.tensor([t + offset]) if offset is not None else torch.tensor([0])
    q, k = apply_rope(q, position), apply_rope(k, position)
    if rotate_values:
        v = apply_rope(v, position)
    if rerotate:
        cache_k = apply_rope(cache_k, torch.arange(t))
    keys, values = torch.cat([cache_k, k], dim=-2), torch.cat([cache_v, v], dim=-2)
    scores = q @ keys.transpose(-2, -1) / (math.sqrt(q.shape[-1]) if scale else 1.0)
    weights = torch.softmax(scores, dim=-1)
    return weights @ values, weights


DECODE_BUGS = [
    (lambda *a: decode_step(*a, offset=None), "rope-position-not-offset", "position 0"),
    (lambda *a: decode_step(*a, offset=-1), "rope-position-not-offset", "T - 1"),
    (lambda *a: decode_step(*a, offset=1), "rope-position-not-offset", "T + 1"),
    (lambda *a: decode_step(*a, rotate_values=True), "rope-rotates-values", "values"),
    (lambda *a: decode_step(*a, rerotate=True), "rope-cache-rotated-twice", "second time"),
    (lambda *a: decode_step(*a, scale=False), "missing-scale", ""),
]


def test_decode_step_passes(capsys):
    checks.check_rope_decode_step(decode_step)
    checks.check_rope_decode_step(lambda *a: decode_step(*a)[0])
    assert capsys.readouterr().out.count("match full attention with RoPE") == 2


@pytest.mark.parametrize("impl, code, detail", DECODE_BUGS)
def test_decode_step_mistakes(impl, code, detail):
    with pytest.raises(checks.CheckFailed) as info:
        checks.check_rope_decode_step(impl)
    assert info.value.code == code, str(info.value)
    assert detail in str(info.value)


# ---------------------------------------------------------------- questions and the catalogue


def test_questions(capsys):
    checks.check_choice("10.rotated", "b")
    checks.check_number("10.alibi-bias", -1.0)
    assert capsys.readouterr().out.count("✓") == 2
    with pytest.raises(checks.CheckFailed, match=r"^\[rope-rotates-values\]"):
        checks.check_choice("10.rotated", "A")
    for wrong, text in ((1.0, "negative"), (-2.0, r"not 2\^-2"), (-1.25, "distance"), (-3.0, "The bias of head h")):
        with pytest.raises(checks.CheckFailed, match=text):
            checks.check_number("10.alibi-bias", wrong)


# ---------------------------------------------------------------- the registry's tables (tests/test_checks_planted.py)


def sinusoid_interleaved(num_positions, dim):
    """Another style: frequencies from exp/log, sin and cos stacked and interleaved."""
    pos = torch.arange(num_positions, dtype=torch.float32)[:, None]
    freq = torch.exp(-math.log(10000.0) * torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    return torch.stack([torch.sin(pos * freq), torch.cos(pos * freq)], dim=-1).flatten(-2)


def rope_complex(x, positions):
    """Another style: each neighbouring pair as one complex number, multiplied by e^(i m theta)."""
    d = x.shape[-1]
    theta = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angles = positions.double()[:, None] * theta
    z = torch.view_as_complex(x.double().reshape(*x.shape[:-1], d // 2, 2).contiguous())
    rotated = z * torch.polar(torch.ones_like(angles), angles)
    return torch.view_as_real(rotated).flatten(-2).to(x.dtype)


def slopes_tensor(h):
    """Another style: a tensor, the extra heads from the odd exponents of 2n heads."""
    n = 2 ** math.floor(math.log2(h))
    base = 2.0 ** (-8.0 * torch.arange(1, n + 1) / n)
    extra = 2.0 ** (-8.0 * (2 * torch.arange(h - n) + 1) / (2 * n))
    return torch.cat([base, extra])


def slopes_of_power_of_two_only(h):
    n = 2 ** math.floor(math.log2(h))
    return [2 ** (-8 * (k + 1) / n) for k in range(n)]


def decode_step_fused(q, k, v, cache_k, cache_v):
    """Another style: the fused kernel over the concatenated cache."""
    position = torch.tensor([cache_k.shape[-2]])
    keys = torch.cat([cache_k, apply_rope(k, position)], dim=-2)
    values = torch.cat([cache_v, v], dim=-2)
    return F.scaled_dot_product_attention(apply_rope(q, position), keys, values)


CORRECT = [
    (checks.check_sinusoidal_positions, sinusoidal_positions),
    (checks.check_sinusoidal_positions, sinusoid_interleaved),
    (checks.check_sinusoidal_positions, lambda t, d: sinusoid(t, d).numpy()),
    (checks.check_rope, apply_rope),
    (checks.check_rope, rope_complex),
    (checks.check_alibi_slopes, alibi_slopes),
    (checks.check_alibi_slopes, slopes_paper),
    (checks.check_alibi_slopes, slopes_tensor),
    (checks.check_rope_decode_step, decode_step),
    (checks.check_rope_decode_step, decode_step_fused),
]
PLANTED = [(checks.check_sinusoidal_positions, impl, code) for impl, code in SINUSOID_BUGS]
PLANTED += [(checks.check_rope, impl, code) for impl, code in ROPE_BUGS]
PLANTED += [(checks.check_alibi_slopes, impl, "alibi-wrong-slopes") for impl, _ in ALIBI_BUGS]
PLANTED += [(checks.check_alibi_slopes, slopes_of_power_of_two_only, "wrong-shape")]
PLANTED += [(checks.check_rope_decode_step, impl, code) for impl, code, _ in DECODE_BUGS]


def test_every_chapter_10_code_is_planted_here():
    planted = {code for _, _, code in PLANTED}
    chapter_10 = {m.code for m in mistakes.in_chapter(10)}
    assert chapter_10 <= planted
    assert all(m.topic == "positions" for m in mistakes.in_chapter(10))
