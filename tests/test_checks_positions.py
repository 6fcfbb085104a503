"""Checks of chapter 10: right implementations pass with one line, each planted mistake gets its code."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import test_checks_capstone
from attention_course import checks, mistakes
from attention_course.checks import hidden
from attention_course.positions import (
    alibi_slopes,
    apply_rope,
    attention_with_bias,
    convert_rope_weight,
)

# ---------------------------------------------------------------- questions and the catalogue


def test_questions(capsys):
    checks.check_number("10.alibi-bias", -1.0)
    assert capsys.readouterr().out.count("✓") == 1
    for wrong, text in ((1.0, "negative"), (-2.0, r"not 2\^-2"), (-1.25, "distance"), (-3.0, "The bias of head h")):
        with pytest.raises(checks.CheckFailed, match=text):
            checks.check_number("10.alibi-bias", wrong)


# ---------------------------------------------------------------- RoPE, halves form (exercise 3)


def rope_halves_hf(x, positions, *, exponent=2, sign=1.0, tables="cat"):
    """Hugging Face's form with hooks: x cos + rotate_half(x) sin, cos/sin tables of Dh angles."""
    d = x.shape[-1]
    inv_freq = 10000.0 ** (-exponent * torch.arange(d // 2, dtype=torch.float64) / d)
    freqs = positions.double()[:, None] * inv_freq  # (T, Dh/2)
    emb = torch.cat([freqs, freqs], dim=-1) if tables == "cat" else freqs.repeat_interleave(2, dim=-1)
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    rotated = torch.cat([-x2, x1], dim=-1) * sign
    return (x * emb.cos().to(x.dtype) + rotated * emb.sin().to(x.dtype))


def rope_halves_complex(x, positions):
    """Another style: pair i as the complex number x_i + i x_(i + Dh/2)."""
    d = x.shape[-1]
    theta = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    z = torch.complex(x[..., : d // 2].double(), x[..., d // 2:].double())
    z = z * torch.polar(torch.ones(len(positions), d // 2, dtype=torch.float64), positions.double()[:, None] * theta)
    return torch.cat([z.real, z.imag], dim=-1).to(x.dtype)


HALVES_BUGS = [
    (lambda x, p: apply_rope(x, p), "rope-wrong-pairing"),
    (lambda x, p: rope_halves_hf(x, p, tables="repeat"), "rope-angle-layout"),
    (lambda x, p: rope_halves_hf(x, p, exponent=1), "rope-wrong-frequencies"),
    (lambda x, p: rope_halves_hf(x, p, sign=-1.0), "rope-wrong-frequencies"),
]


# ---------------------------------------------------------------- ALiBi after a cache (exercise 4)


def alibi_by_hand(q, k, v, slopes, *, first=False, top_left=False, sign=-1.0, scaled=False, masked=True,
                  scale=True):
    """Causal ALiBi attention written out, with hooks for the mistakes."""
    t_q, t_k = q.shape[-2], k.shape[-2]
    query_pos = torch.arange(t_q)[:, None] + (0 if first else t_k - t_q)
    distance = (query_pos - torch.arange(t_k)).abs()  # (Tq, Tk)
    bias = sign * slopes[:, None, None] * distance  # (H, Tq, Tk)
    d = math.sqrt(q.shape[-1]) if scale else 1.0
    raw = q @ k.transpose(-2, -1)
    scores = (raw + bias) / d if scaled else raw / d + bias
    if masked:
        allowed = torch.ones(t_q, t_k, dtype=torch.bool).tril(0 if top_left else t_k - t_q)
        scores = scores.masked_fill(~allowed, float("-inf"))
    weights = scores.softmax(dim=-1)
    return weights @ v, weights


def alibi_fused(q, k, v, slopes):
    """Another style: the bias with -inf where masked, as PyTorch's float attn_mask."""
    t_q, t_k = q.shape[-2], k.shape[-2]
    position = torch.arange(t_k - t_q, t_k)[:, None]  # (Tq, 1)
    distance = position - torch.arange(t_k)  # (Tq, Tk), >= 0 where allowed
    bias = -slopes[:, None, None] * distance.clamp(min=0)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias.masked_fill(distance < 0, float("-inf")))


def alibi_library(q, k, v, slopes):
    """Another style: the library's attention with a bias, the slopes as given."""
    t_q, t_k = q.shape[-2], k.shape[-2]
    distance = (torch.arange(t_k - t_q, t_k)[:, None] - torch.arange(t_k)).abs()
    mask = torch.ones(t_q, t_k, dtype=torch.bool).tril(t_k - t_q)
    return attention_with_bias(q, k, v, -slopes[:, None, None] * distance, mask)


ALIBI_ATTENTION_BUGS = [
    (lambda *a: alibi_by_hand(*a, first=True), "alibi-query-offset"),
    (lambda *a: alibi_by_hand(*a, first=True, top_left=True), "causal-top-left-aligned"),
    (lambda *a: alibi_by_hand(*a, top_left=True), "causal-top-left-aligned"),
    (lambda *a: alibi_by_hand(*a, sign=1.0), "alibi-bias-sign"),
    (lambda *a: alibi_by_hand(*a, scaled=True), "alibi-bias-scaled"),
    (lambda *a: alibi_by_hand(*a, masked=False), "mask-ignored"),
    (lambda *a: alibi_by_hand(*a, scale=False), "missing-scale"),
    (lambda q, k, v, slopes: alibi_library(q, k, v, alibi_slopes(q.shape[1])), "wrong-output"),
]


# ---------------------------------------------------------------- RoPE in a left-padded batch (exercise 5)


def left_padded(x, pad, *, positions=lambda slots, pad: slots - pad[:, None], pairing="halves"):
    """Positions (B, 1, T) broadcast over the heads, with a hook for the mistakes."""
    slots = torch.arange(x.shape[-2])
    return apply_rope(x, positions(slots, pad)[:, None, :], pairing=pairing)


def left_padded_loop(x, pad):
    """Another style: row by row; the padding slots get position 0."""
    rows = []
    for b in range(x.shape[0]):
        positions = (torch.arange(x.shape[-2]) - pad[b]).clamp(min=0)
        rows.append(rope_halves_hf(x[b], positions))
    return torch.stack(rows)


PADDED_BUGS = [
    (lambda x, pad: left_padded(x, pad, positions=lambda s, p: s.expand(len(p), -1)), "rope-padding-ignored"),
    (lambda x, pad: left_padded(x, pad, positions=lambda s, p: s + p[:, None]), "rope-padding-ignored"),
    (lambda x, pad: left_padded(x, pad, positions=lambda s, p: (s - p[0]).expand(len(p), -1)), "rope-offset-one-row"),
    (lambda x, pad: left_padded(x, pad, pairing="interleaved"), "rope-wrong-pairing"),
]


# ---------------------------------------------------------------- halves weights into neighbour-pair code (exercise 6)


def to_interleaved(weight, num_heads, *, inverse=True, per_head=True, columns=False):
    """Rows of each head reordered by p^-1, with hooks for the mistakes."""
    w = weight.T if columns else weight
    groups = num_heads if per_head else 1
    d = w.shape[0] // groups
    perm = torch.cat([torch.arange(0, d, 2), torch.arange(1, d, 2)])
    perm = perm.argsort() if inverse else perm
    out = w.reshape(groups, d, *w.shape[1:])[:, perm].reshape(w.shape)
    return out.T if columns else out


def to_interleaved_view(weight, num_heads):
    """Another style: the inverse of the permute in Hugging Face's LLaMA conversion script."""
    rows = weight.shape[0]
    rest = weight.shape[1:]
    return weight.reshape(num_heads, 2, rows // num_heads // 2, *rest).transpose(1, 2).reshape(rows, *rest)


ROWS_BUGS = [
    (lambda w, h: to_interleaved(w, h, inverse=False), "rope-permutation-inverted"),
    (lambda w, h: convert_rope_weight(w, h, to="halves"), "rope-permutation-inverted"),
    (lambda w, h: to_interleaved(w, h, per_head=False), "rope-permutation-not-per-head"),
    (lambda w, h: to_interleaved(w, 1), "rope-permutation-not-per-head"),
    (lambda w, h: to_interleaved(w, h, columns=True, per_head=False), "rope-permutation-on-columns"),
    (lambda w, h: w.clone(), "wrong-output"),
]


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_new_checks_pass_their_hidden_cases(seed, capsys):
    with hidden.drawn_from(seed):
        checks.check_rope_halves(rope_halves_hf)
        checks.check_alibi_attention(alibi_by_hand)
        checks.check_rope_left_padded(left_padded)
        checks.check_rope_to_interleaved(to_interleaved)
    out = capsys.readouterr().out
    for public in ("6 random cases", "4 random cases", "3 left-padded", "4 projections"):  # one more case each
        assert str(int(public[0]) + 1) + public[1:] in out


def test_hidden_cases_name_what_the_public_ones_miss():
    def sliced_heads(x, pad):  # right for up to 3 rows, then every row takes row 0's padding
        out = left_padded(x, pad)
        return out if len(pad) <= 4 else left_padded(x, pad, positions=lambda s, p: (s - p[0]).expand(len(p), -1))

    checks.check_rope_left_padded(sliced_heads)
    with hidden.drawn_from(0), pytest.raises(checks.CheckFailed) as info:
        checks.check_rope_left_padded(sliced_heads)
    assert info.value.code == "rope-offset-one-row"


def test_score_mystery_is_queries_rotated_only(capsys):
    scores = checks.positions.score_mystery()
    assert scores.shape == (24, 24)
    assert abs(scores - scores[:, :1]).max() < 1e-12  # each row constant
    assert abs(scores[:, 0] - scores[0, 0]).max() > 0.1  # rows differ
    checks.check_choice("10.which-rotation", "B")
    for wrong in "ACD":
        with pytest.raises(checks.CheckFailed, match=r"^\[wrong-answer\]"):
            checks.check_choice("10.which-rotation", wrong)


# ---------------------------------------------------------------- the registry's tables (tests/test_checks_planted.py)


CORRECT = [
    (checks.check_rope_halves, rope_halves_hf),
    (checks.check_rope_halves, rope_halves_complex),
    (checks.check_rope_halves, lambda x, p: apply_rope(x, p, pairing="halves")),
    (checks.check_alibi_attention, alibi_by_hand),
    (checks.check_alibi_attention, alibi_fused),
    (checks.check_alibi_attention, alibi_library),
    (checks.check_rope_left_padded, left_padded),
    (checks.check_rope_left_padded, left_padded_loop),
    (checks.check_rope_to_interleaved, to_interleaved),
    (checks.check_rope_to_interleaved, to_interleaved_view),
    (checks.check_rope_to_interleaved, lambda w, h: convert_rope_weight(w, h, to="interleaved")),
]
PLANTED = [(checks.check_rope_halves, impl, code) for impl, code in HALVES_BUGS]
PLANTED += [(checks.check_alibi_attention, impl, code) for impl, code in ALIBI_ATTENTION_BUGS]
PLANTED += [(checks.check_rope_left_padded, impl, code) for impl, code in PADDED_BUGS]
PLANTED += [(checks.check_rope_to_interleaved, impl, code) for impl, code in ROWS_BUGS]


# Chapter 10's mistakes of RoPE while decoding, named by the capstone's check (planted in test_checks_capstone.py)
DECODING = {"rope-position-not-offset", "rope-rotates-values", "rope-cache-rotated-twice"}


def test_every_chapter_10_code_is_planted_here():
    planted = {code for _, _, code in PLANTED}
    chapter_10 = {m.code for m in mistakes.in_chapter(10)}
    assert chapter_10 - DECODING <= planted
    assert DECODING <= {code for _, _, code in test_checks_capstone.PLANTED}
    assert all(m.topic == "positions" for m in mistakes.in_chapter(10))
