"""Capstone 2's checks: right answers pass; each planted wrong one is diagnosed with its code. The attention on
random weights (float64 reference), the whole model on SmolLM2's real weights against Hugging Face's."""

import functools

import torch
from torch import nn
from torch.nn import functional as F

from attention_course import checks
from attention_course.checks import capstone_model
from attention_course.decoder import Decoder


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def rope(x, positions, base, neighbours=False):
    """x (B, H, T, Dh) rotated at positions (T,): halves (Llama), or neighbours (the planted mistake)."""
    dh = x.shape[-1]
    angles = positions[:, None].float() / base ** (torch.arange(0, dh, 2).float() / dh)  # (T, Dh/2)
    if neighbours:
        cos, sin = angles.cos().repeat_interleave(2, -1), angles.sin().repeat_interleave(2, -1)
        turned = torch.stack([-x[..., 1::2], x[..., 0::2]], -1).flatten(-2)
        return x * cos + turned * sin
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    return x * cos + rotate_half(x) * sin


class Attention(nn.Module):
    """Grouped-query RoPE attention with a cache; ``bug`` plants one mistake."""

    bug = None

    def __init__(self, d_model, num_heads, num_kv_heads, rope_base):
        super().__init__()
        self.h, self.hkv, self.dh, self.base = num_heads, num_kv_heads, d_model // num_heads, rope_base
        self.q_proj = nn.Linear(d_model, num_heads * self.dh, bias=False)
        self.k_proj = nn.Linear(d_model, num_kv_heads * self.dh, bias=False)
        self.v_proj = nn.Linear(d_model, num_kv_heads * self.dh, bias=False)
        self.o_proj = nn.Linear(num_heads * self.dh, d_model, bias=False)

    def forward(self, x, cache=None):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.h, self.dh).transpose(1, 2)  # (B, H, T, Dh)
        k = self.k_proj(x).view(b, t, self.hkv, self.dh).transpose(1, 2)  # (B, Hkv, T, Dh)
        v = self.v_proj(x).view(b, t, self.hkv, self.dh).transpose(1, 2)
        past = 0 if cache is None or self.bug == "restart" else cache[0].shape[2]
        past += 1 if self.bug == "plus-one" and past else 0
        positions = torch.arange(past, past + t)
        base = 10000.0 if self.bug == "base" else self.base
        q, k = (rope(a, positions, base, self.bug == "neighbours") for a in (q, k))
        if cache is not None:
            k, v = torch.cat([cache[0], k], 2), torch.cat([cache[1], v], 2)
        n_rep = self.h // self.hkv
        if self.bug == "tiled":
            keys, values = k.repeat(1, n_rep, 1, 1), v.repeat(1, n_rep, 1, 1)
        else:
            keys, values = k.repeat_interleave(n_rep, 1), v.repeat_interleave(n_rep, 1)
        allowed = torch.ones(t, keys.shape[2], dtype=torch.bool).tril(keys.shape[2] - t)  # bottom-right causal
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=allowed)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1)), (k, v)


def planted(bug):
    return type(f"Attention_{bug.replace('-', '_')}", (Attention,), {"bug": bug})


def _hf():
    return capstone_model.reference_model()[1]


@functools.cache
def _course_model():
    """The course's Decoder (chapter 14) on the same weights, built once."""
    return Decoder.from_hf(_hf())


def course_logits(ids):
    """The course's Decoder on the same weights: another style of a right answer."""
    return _course_model()(ids)


def hf_variant_logits(kind):
    def logits(ids):
        with capstone_model._variant(kind), torch.no_grad():
            return _hf()(ids).logits
    return logits


def shifted_logits(ids):
    with torch.no_grad():
        out = _hf()(ids).logits
    out[0, -1] += 0.05  # one position off: no known mistake
    return out


@torch.no_grad()
def hf_generate(ids, max_new_tokens, bug=None):
    """Greedy decoding with Hugging Face's model and its own cache; ``bug`` plants one mistake."""
    model, past, fed, new, rows = _hf(), None, ids, [], []
    for step in range(max_new_tokens):
        if step:
            fed = {"recompute": torch.cat([ids, torch.cat(new, 1)], 1), "drop-cache": new[-1]}.get(bug, new[-1])
            past = None if bug in ("recompute", "drop-cache") else past
        out = model(fed, cache=past, use_cache=True)
        past = out.cache
        rows.append(out.logits[:, -1])
        token = rows[-1].topk(2).indices[:, 1:] if bug == "second-best" else rows[-1].argmax(-1, keepdim=True)
        new.append(token)
    logits = torch.stack(rows, 1)
    if bug == "logits-of-the-prompt":
        logits = logits + 0.05
    return torch.cat(new, 1), logits


@torch.no_grad()
def course_generate(ids, max_new_tokens):
    """The course's Decoder (chapter 14) through the course's KVCache: another style of a right answer."""
    from attention_course.kv_cache import KVCache

    model = _course_model()
    cache, fed, new, rows = KVCache(model.num_layers), ids, [], []
    for _ in range(max_new_tokens):
        rows.append(model(fed, cache=cache)[:, -1])
        fed = rows[-1].argmax(-1, keepdim=True)
        new.append(fed)
    return torch.cat(new, 1), torch.stack(rows, 1)


def generate_with(bug):
    return lambda ids, max_new_tokens: hf_generate(ids, max_new_tokens, bug)


CORRECT = [
    (checks.check_llama_attention, Attention),
    (checks.check_smollm2_logits, course_logits),
    (checks.check_greedy_decoding, hf_generate),
    (checks.check_greedy_decoding, course_generate),
]
PLANTED = [
    (checks.check_llama_attention, planted("neighbours"), "rope-wrong-pairing"),
    (checks.check_llama_attention, planted("tiled"), "kv-heads-tiled"),
    (checks.check_llama_attention, planted("restart"), "rope-position-not-offset"),
    (checks.check_llama_attention, planted("plus-one"), "cache-position-off-by-one"),
    (checks.check_llama_attention, planted("base"), "rope-base-default"),
    (checks.check_smollm2_logits, hf_variant_logits("no-final-norm"), "model-final-norm-missing"),
    (checks.check_smollm2_logits, hf_variant_logits("base"), "rope-base-default"),
    (checks.check_smollm2_logits, shifted_logits, "logits-differ-from-hf"),
    (checks.check_greedy_decoding, generate_with("recompute"), "decode-recomputes-prefix"),
    (checks.check_greedy_decoding, generate_with("drop-cache"), "decode-cache-dropped"),
    (checks.check_greedy_decoding, generate_with("second-best"), "wrong-output"),
    (checks.check_greedy_decoding, generate_with("logits-of-the-prompt"), "logits-differ-from-hf"),
]


def test_the_reference_model_is_restored_after_a_variant():
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        before = _hf()(ids).logits
        hf_variant_logits("base")(ids)
        hf_variant_logits("no-final-norm")(ids)
        assert torch.equal(_hf()(ids).logits, before)
