"""Chapter 14: each course class equals the transformers attention module it mirrors (eager, random weights).

Configurations are drawn from a seeded generator: GQA groups 1, 2 and H, head_dim != D / H, position offsets,
windows shorter and longer than T, float64 and float32. Tolerances are relative to the largest output: HF computes
the RoPE angles, the softmax and the norms in float32 even in a float64 module, so float64 agrees to about 1e-7
(bound 1e-6); float32 to about 3e-7 (bound 1e-5). A wrong pairing, norm order, cap or sink is off by more than 1e-2.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from attention_course import modern
from attention_course.interop import hf_models
from attention_course.interop.hf_models import build_hf_attention, hf_forward, relative_error
from attention_course.masks import sliding_window_mask

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("transformers")

TOLERANCE = {torch.float64: 1e-6, torch.float32: 1e-5}
CASES = 4  # random configurations per family and dtype



def draw_sizes(rng: np.random.Generator) -> dict:
    """Heads H, a GQA group of 1, 2 or H, a head_dim unrelated to D / H."""
    heads = int(rng.choice([2, 4, 6]))
    kv_heads = heads // int(rng.choice([1, 2, heads]))
    return dict(hidden_size=heads * int(rng.choice([4, 6, 8])), num_attention_heads=heads, num_key_value_heads=kv_heads,
                head_dim=int(rng.choice([4, 6, 8, 10])))


def draw_rope(rng: np.random.Generator, family: str) -> dict:
    """Plain RoPE, Llama 3's scaling or YaRN (GPT-OSS's default), on a short original context."""
    base = float(rng.choice([100.0, 10000.0]))
    kind = {"llama": "llama3", "gpt_oss": "yarn"}.get(family, "default")
    if kind == "llama3":
        return dict(rope_type="llama3", rope_theta=base, factor=float(rng.choice([2.0, 8.0])), low_freq_factor=1.0,
                    high_freq_factor=4.0, original_max_position_embeddings=int(rng.choice([16, 64])))
    if kind == "yarn":
        return dict(rope_type="yarn", rope_theta=base, factor=float(rng.choice([4.0, 32.0])), beta_fast=32.0,
                    beta_slow=1.0, truncate=bool(rng.integers(2)), original_max_position_embeddings=16)
    return dict(rope_type="default", rope_theta=base)


def draw_config(family: str, rng: np.random.Generator) -> tuple[dict, int]:
    """(config kwargs, layer index) for one family, with its own options drawn too."""
    config = draw_sizes(rng) | dict(rope_parameters=draw_rope(rng, family))
    window = int(rng.integers(1, 12))  # T is 9 or 10 below: windows shorter and longer than T
    layer_idx = int(rng.integers(2))
    if family == "mistral":
        config |= dict(sliding_window=window)
    if family in ("gemma2", "gemma3", "gpt_oss"):
        config |= dict(sliding_window=window, layer_types=["sliding_attention", "full_attention"])
    if family in ("gemma2", "gemma3"):
        config |= dict(query_pre_attn_scalar=int(rng.choice([8, 12, 30])))
    if family == "gemma2":
        config |= dict(attn_logit_softcapping=float(rng.choice([1.0, 5.0])))
    if family == "gemma3":
        config["rope_parameters"] = dict(sliding_attention=dict(rope_type="default", rope_theta=100.0),
                                         full_attention=draw_rope(rng, family))
    if family == "gpt_oss":
        config |= dict(num_local_experts=2)
    if family in ("llama", "mistral", "qwen3", "gpt_oss"):
        config |= dict(attention_bias=bool(rng.integers(2)))
    return config, layer_idx


FAMILIES = ["llama", "mistral", "qwen3", "gemma2", "gemma3", "gpt_oss"]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("family", FAMILIES)
def test_equal_to_transformers(family, dtype):
    rng = np.random.default_rng([14, FAMILIES.index(family), dtype.itemsize])
    windows = set()
    for case in range(CASES):
        config, layer_idx = draw_config(family, rng)
        hf = build_hf_attention(family, layer_idx, dtype=dtype, seed=case, **config)
        ours = hf_models.FAMILIES[family].from_hf(hf)
        b, t = int(rng.integers(1, 3)), int(rng.integers(9, 11))
        x = torch.from_numpy(rng.standard_normal((b, t, config["hidden_size"]))).to(dtype)
        offset = int(rng.integers(0, 50))
        positions = torch.arange(t) + offset if case % 2 else None  # a decoding offset every other case
        err = relative_error(ours(x, positions), hf_forward(hf, x, positions))
        assert err < TOLERANCE[dtype], (family, config, layer_idx, err)
        windows.add(ours.window is not None and ours.window < t)
    if family in ("mistral", "gemma2", "gemma3", "gpt_oss"):
        assert True in windows  # at least one window that actually hides keys


def test_per_batch_positions_equal_transformers():
    hf = build_hf_attention("llama", hidden_size=16, num_attention_heads=4, num_key_value_heads=2)
    ours = modern.LlamaAttention.from_hf(hf)
    x = torch.randn(2, 6, 16, dtype=torch.float64)
    positions = torch.stack([torch.arange(6), torch.arange(6) + 30])  # (B, T): two sequences at their own offsets
    assert relative_error(ours(x, positions), hf_forward(hf, x, positions)) < 1e-6


def test_each_option_is_needed():
    """Switching off one option of a converted layer breaks the equality: the tests can fail."""
    rng = np.random.default_rng(3)
    x = torch.from_numpy(rng.standard_normal((1, 10, 24)))
    cases = [
        ("qwen3", {}, lambda m: setattr(m, "q_norm", None) or setattr(m, "k_norm", None)),
        ("gemma2", dict(attn_logit_softcapping=1.0), lambda m: setattr(m, "softcap", None)),
        ("gpt_oss", {}, lambda m: setattr(m, "sinks", None)),
        ("mistral", dict(sliding_window=3), lambda m: setattr(m, "window", 4)),
        ("llama", {}, lambda m: setattr(m, "pairing", "interleaved")),
    ]
    for family, extra, spoil in cases:
        hf = build_hf_attention(family, hidden_size=24, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                **extra)
        ours = hf_models.FAMILIES[family].from_hf(hf)
        ref = hf_forward(hf, x)
        assert relative_error(ours(x), ref) < 1e-6
        spoil(ours)
        assert relative_error(ours(x), ref) > 1e-2, family


def test_norm_after_rope_differs():
    """QK-norm before RoPE (Qwen3) is not the same as after it: the RMS of a pair survives rotation, not of Dh."""
    hf = build_hf_attention("qwen3", hidden_size=16, num_attention_heads=2, num_key_value_heads=2, head_dim=8)
    ours = modern.Qwen3Attention.from_hf(hf)
    x = torch.randn(1, 5, 16, dtype=torch.float64)
    rotary = ours.rotary(torch.arange(5), x.dtype)
    q = ours.heads(x, ours.q_proj)
    before, after = ours.rope(ours.q_norm(q), rotary), ours.q_norm(ours.rope(q, rotary))
    assert (before - after).abs().max() > 1e-3


def test_gemma3_local_and_global_layers_differ():
    hf_local = build_hf_attention("gemma3", 0, hidden_size=16, num_attention_heads=2, num_key_value_heads=1,
                                  head_dim=8, sliding_window=3, layer_types=["sliding_attention", "full_attention"])
    hf_global = build_hf_attention("gemma3", 1, hidden_size=16, num_attention_heads=2, num_key_value_heads=1,
                                   head_dim=8, sliding_window=3, layer_types=["sliding_attention", "full_attention"])
    local, full = modern.Gemma3Attention.from_hf(hf_local), modern.Gemma3Attention.from_hf(hf_global)
    assert (local.window, full.window) == (3, None)
    assert not torch.allclose(local.inv_freq, full.inv_freq)  # base 10 000 locally, 1 000 000 globally by default


def test_from_hf_refuses_other_modules():
    hf_llama = build_hf_attention("llama", hidden_size=16, num_attention_heads=2)
    with pytest.raises(TypeError, match="Qwen3Attention.*got .*LlamaAttention"):
        modern.Qwen3Attention.from_hf(hf_llama)
    with pytest.raises(TypeError, match="got torch.nn.modules.linear.Linear"):
        modern.LlamaAttention.from_hf(torch.nn.Linear(2, 2))
    with pytest.raises(TypeError, match="DeepseekV3Attention, got .*LlamaAttention"):
        modern.MultiHeadLatentAttention.from_hf(hf_llama)
    with pytest.raises(TypeError, match="layer must be one of"):
        hf_forward(torch.nn.Linear(2, 2), torch.zeros(1, 2, 2))
    with pytest.raises(ValueError, match="family must be one of"):
        build_hf_attention("gpt2")


def test_bad_inputs():
    layer = modern.ModernAttention(16, 4, 2)
    with pytest.raises(TypeError, match="floating-point"):
        layer(torch.zeros(1, 3, 16, dtype=torch.long))
    with pytest.raises(ValueError, match="d_model=16"):
        layer(torch.zeros(1, 3, 8))
    with pytest.raises(ValueError, match=r"\(B, T, D\)"):
        layer(torch.zeros(3, 16))
    with pytest.raises(TypeError, match="integer tensor"):
        layer(torch.zeros(1, 3, 16), positions=torch.zeros(3))
    with pytest.raises(ValueError, match=r"shape \(3,\) or \(1, 3\)"):
        layer(torch.zeros(1, 3, 16), positions=torch.arange(4))
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        modern.ModernAttention(16, 4, 3)
    with pytest.raises(ValueError, match="window"):
        modern.ModernAttention(16, 4, window=0)
    with pytest.raises(ValueError, match="softcap"):
        modern.ModernAttention(16, 4, softcap=0.0)
    with pytest.raises(TypeError, match="head_dim"):
        modern.ModernAttention(16, 4, head_dim=2.0)


def test_sinks_take_weight_and_give_nothing():
    """A sink lowers the weights' sum below 1 and adds no value: with a huge sink the output tends to zero."""
    q, k, v = torch.randn(3, 1, 2, 5, 4, dtype=torch.float64)
    mask = modern.attention.causal_mask(5)
    plain, w_plain = modern.attend(q, k, v, mask, scale=0.5)
    _, w_sink = modern.attend(q, k, v, mask, scale=0.5, sinks=torch.zeros(2, dtype=torch.float64))
    out_big, _ = modern.attend(q, k, v, mask, scale=0.5, sinks=torch.full((2,), 50.0, dtype=torch.float64))
    torch.testing.assert_close(w_plain.sum(-1), torch.ones(1, 2, 5, dtype=torch.float64))
    assert (w_sink.sum(-1) < 1).all()
    assert out_big.abs().max() < 1e-15 < plain.abs().max()


def test_softcap_bounds_scores_not_probabilities():
    q, k, v = (10 * torch.randn(3, 1, 1, 4, 4, dtype=torch.float64)).unbind(0)
    _, weights = modern.attend(q, k, v, modern.attention.causal_mask(4), scale=1.0, softcap=2.0)
    scores = (q @ k.transpose(-2, -1)).clamp(-30, 30)
    capped = 2.0 * torch.tanh(scores / 2.0)
    expected = torch.softmax(capped.masked_fill(~modern.attention.causal_mask(4), float("-inf")), -1)
    torch.testing.assert_close(weights, expected)


@pytest.mark.parametrize("h, h_kv", [(4, 2), (6, 3), (4, 1)])
def test_attend_is_a_face_of_functional_attend_with_grouped_heads(h, h_kv):
    """modern.attend (soft-cap, sinks) on grouped keys and values (B, H_kv, Tk, Dh), Tq != Tk, a sliding mask: equal
    to the float64 NumPy reference with each key/value head repeated, and to functional.attend itself."""
    from attention_course import functional
    from test_attend import np_attend

    g = torch.Generator().manual_seed(h)
    q = torch.randn(2, h, 5, 8, generator=g, dtype=torch.float64)
    k, v = torch.randn(2, 2, h_kv, 9, 8, generator=g, dtype=torch.float64).unbind(0)
    sinks = torch.randn(h, generator=g, dtype=torch.float64)
    mask = sliding_window_mask(5, 9, 3)
    out, weights = modern.attend(q, k, v, mask, scale=0.3, softcap=1.5, sinks=sinks)
    k_rep, v_rep = k.repeat_interleave(h // h_kv, 1), v.repeat_interleave(h // h_kv, 1)
    ref_out, ref_weights, _ = np_attend(q, k_rep, v_rep, mask, scale=0.3, mod=("softcap", 1.5), sinks=sinks.numpy())
    np.testing.assert_allclose(out.numpy(), ref_out, atol=1e-12)
    np.testing.assert_allclose(weights.numpy(), ref_weights, atol=1e-12)
    same, _ = functional.attend(q, k_rep, v_rep, mask, scale=0.3, score_mod=functional.softcap_mod(1.5), sinks=sinks)
    assert torch.equal(out, same)
