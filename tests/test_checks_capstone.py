"""The capstone's check: a right module passes; each deliberately wrong one is diagnosed with its code."""

import math

import pytest
import torch
from torch import nn

from attention_course import checks, merge_heads, split_heads
from attention_course.checks import hidden
from attention_course.checks.questions import QUESTIONS
from attention_course.positions import apply_rope


def make_module(position="ok", rerotate=False, rotate_values=False, pairing="interleaved", mask="bottom-right",
                rope=True, cache_unrotated=False, cache_plain_keys=False):
    """A RoPE + KV-cache attention module, right by default, with one planted mistake on request."""

    class Module(nn.Module):
        def __init__(self, d_model, num_heads):
            super().__init__()
            self.num_heads = num_heads
            self.w_q, self.w_k, self.w_v, self.w_o = (nn.Linear(d_model, d_model) for _ in range(4))

        def rot(self, x, positions):
            return apply_rope(x, positions, pairing=pairing) if rope else x

        def forward(self, x, cache=None):
            past = 0 if cache is None else cache[0].shape[2]
            t = x.shape[1]
            positions = torch.arange(t) if position == "restart" else torch.arange(past, past + t)
            q, k, v = (split_heads(w(x), self.num_heads) for w in (self.w_q, self.w_k, self.w_v))
            if cache_plain_keys:  # the cache holds plain keys: all of them rotated again at every call
                k_plain = k if cache is None else torch.cat([cache[0], k], dim=2)
                q, k_all = self.rot(q, positions), self.rot(k_plain, torch.arange(past + t))
                v_all = v if cache is None else torch.cat([cache[1], v], dim=2)
                weights = torch.softmax((q @ k_all.transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill(
                    torch.arange(past + t)[None, :] > torch.arange(past, past + t)[:, None], float("-inf")), -1)
                return self.w_o(merge_heads(weights @ v_all)), (k_plain, v_all)
            q, k = self.rot(q, positions), self.rot(k, positions)
            if rotate_values:
                v = self.rot(v, positions)
            if cache is not None:
                old_k = self.rot(cache[0], torch.arange(past)) if rerotate else cache[0]
                k_all, v_all = torch.cat([old_k, k], dim=2), torch.cat([cache[1], v], dim=2)
                stored_k = torch.cat([cache[0], k], dim=2)
            else:
                k_all, v_all, stored_k = k, v, k
            i, j = torch.arange(t)[:, None], torch.arange(past + t)[None, :]
            allowed = {"bottom-right": j <= i + past, "top-left": j <= i, "none": j >= 0}[mask]
            scores = q @ k_all.transpose(-2, -1) / math.sqrt(q.shape[-1])
            weights = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
            out = self.w_o(merge_heads(weights @ v_all))
            if cache_unrotated:
                stored_k = stored_k + 1.0
            return out, (stored_k, v_all)

    return Module


def test_right_module_passes(capsys):
    checks.check_rope_cached_attention(make_module())
    assert capsys.readouterr().out.startswith("✓ Module: 4 sequences fed in chunks")


@pytest.mark.parametrize("seed", [0, 3])
def test_the_grader_adds_a_hidden_sequence(seed, capsys):
    """At grading time: a fifth sequence of random width, heads and chunks, in a batch of 5; mistakes still named."""
    with hidden.drawn_from(seed):
        checks.check_rope_cached_attention(make_module())
        assert capsys.readouterr().out.startswith("✓ Module: 5 sequences fed in chunks")
        with pytest.raises(checks.CheckFailed, match=r"^\[rope-position-not-offset\]"):
            checks.check_rope_cached_attention(make_module(position="restart"))


@pytest.mark.parametrize("kwargs, code", [
    ({"position": "restart"}, "rope-position-not-offset"),
    ({"rerotate": True}, "rope-cache-rotated-twice"),
    ({"rotate_values": True}, "rope-rotates-values"),
    ({"pairing": "halves"}, "rope-wrong-pairing"),
    ({"mask": "top-left"}, "causal-top-left-aligned"),
    ({"mask": "none"}, "mask-ignored"),
    ({"rope": False}, "rope-not-applied"),
    ({"cache_unrotated": True}, "wrong-output"),
    ({"cache_plain_keys": True}, "cache-keys-unrotated"),
])
def test_each_mistake_is_named(kwargs, code):
    with pytest.raises(checks.CheckFailed) as info:
        checks.check_rope_cached_attention(make_module(**kwargs))
    assert str(info.value).startswith(f"[{code}]"), str(info.value)


def test_missing_layer_and_wrong_return():
    class NoLayers(nn.Module):
        def __init__(self, d_model, num_heads):
            super().__init__()

    with pytest.raises(checks.CheckFailed, match=r"^\[missing-attribute\] Your module needs w_q"):
        checks.check_rope_cached_attention(NoLayers)

    class NoCache(make_module()):
        def forward(self, x, cache=None):
            return super().forward(x, cache)[0]

    with pytest.raises(checks.CheckFailed, match=r"^\[wrong-type\] Your forward must return"):
        checks.check_rope_cached_attention(NoCache)


def test_capstone_question_is_registered():
    assert QUESTIONS["19.cache-what"].answer == "A"


# ----------------------------------------------------------------------------------------------------------
# The registry's tables (tests/test_checks_planted.py)
# ----------------------------------------------------------------------------------------------------------


class FusedCachedAttention(nn.Module):
    """Another style: heads by view/transpose, RoPE as complex numbers, the fused kernel with a boolean mask."""

    def __init__(self, d_model, num_heads):
        super().__init__()
        self.h = num_heads
        self.w_q, self.w_k, self.w_v, self.w_o = (nn.Linear(d_model, d_model) for _ in range(4))

    def rotate(self, x, start):
        dh = x.shape[-1]
        theta = 10000.0 ** (-torch.arange(0, dh, 2, dtype=torch.float64) / dh)
        angles = torch.arange(start, start + x.shape[-2], dtype=torch.float64)[:, None] * theta
        z = torch.view_as_complex(x.double().reshape(*x.shape[:-1], dh // 2, 2).contiguous())
        return torch.view_as_real(z * torch.polar(torch.ones_like(angles), angles)).flatten(-2).to(x.dtype)

    def forward(self, x, cache=None):
        b, t, d = x.shape
        past = 0 if cache is None else cache[0].shape[2]
        q, k, v = (w(x).view(b, t, self.h, d // self.h).transpose(1, 2) for w in (self.w_q, self.w_k, self.w_v))
        q, k = self.rotate(q, past), self.rotate(k, past)
        if cache is not None:
            k, v = torch.cat([cache[0], k], 2), torch.cat([cache[1], v], 2)
        allowed = torch.arange(past + t)[None, :] <= torch.arange(past, past + t)[:, None]
        heads = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
        return self.w_o(heads.transpose(1, 2).reshape(b, t, d)), (k, v)


class NoCacheReturned(make_module()):
    def forward(self, x, cache=None):
        return super().forward(x, cache)[0]


class NoLinears(nn.Module):
    def __init__(self, d_model, num_heads):
        super().__init__()


rope_cached = checks.check_rope_cached_attention
CORRECT = [(rope_cached, make_module()), (rope_cached, FusedCachedAttention)]
PLANTED = [
    (rope_cached, make_module(position="restart"), "rope-position-not-offset"),
    (rope_cached, make_module(rerotate=True), "rope-cache-rotated-twice"),
    (rope_cached, make_module(rotate_values=True), "rope-rotates-values"),
    (rope_cached, make_module(pairing="halves"), "rope-wrong-pairing"),
    (rope_cached, make_module(mask="top-left"), "causal-top-left-aligned"),
    (rope_cached, make_module(mask="none"), "mask-ignored"),
    (rope_cached, make_module(rope=False), "rope-not-applied"),
    (rope_cached, make_module(cache_plain_keys=True), "cache-keys-unrotated"),
    (rope_cached, NoCacheReturned, "wrong-type"),
    (rope_cached, NoLinears, "missing-attribute"),
]
