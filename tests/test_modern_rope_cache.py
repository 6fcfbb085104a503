"""Chapter 14: RoPE frequency scaling (Llama 3, YaRN), the sliding-window mask and the published cache table."""

from __future__ import annotations

import math
import os

import pytest
import torch

from attention_course.masks import causal_mask, sliding_window_mask
from attention_course.modern import cache, rope_scaling
from attention_course.positions import apply_rope, inverse_frequencies

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def test_llama3_frequencies_equal_transformers():
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    params = dict(rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                  original_max_position_embeddings=8192)
    config = transformers.LlamaConfig(hidden_size=4096, num_attention_heads=32, rope_parameters=params)
    hf_freq, hf_factor = ROPE_INIT_FUNCTIONS["llama3"](config)
    ours, factor = rope_scaling.rope_from_config(params, 128)
    torch.testing.assert_close(ours, hf_freq.double(), rtol=1e-6, atol=0)  # HF computes in float32
    assert factor == hf_factor == 1.0
    wavelength = 2 * math.pi / inverse_frequencies(128, 500000.0)
    fast, slow = wavelength < 8192 / 4, wavelength > 8192
    torch.testing.assert_close(ours[fast], inverse_frequencies(128, 500000.0)[fast])  # kept
    torch.testing.assert_close(ours[slow], inverse_frequencies(128, 500000.0)[slow] / 8)  # slowed down 8 times


@pytest.mark.parametrize("truncate", [True, False])
def test_yarn_frequencies_equal_transformers(truncate):
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    params = dict(rope_type="yarn", rope_theta=150000.0, factor=32.0, beta_fast=32.0, beta_slow=1.0,
                  truncate=truncate, original_max_position_embeddings=4096)
    config = transformers.GptOssConfig(hidden_size=64, num_attention_heads=1, head_dim=64, rope_parameters=params)
    hf_freq, hf_factor = ROPE_INIT_FUNCTIONS["yarn"](config)
    ours, factor = rope_scaling.rope_from_config(params, 64)
    torch.testing.assert_close(ours, hf_freq.double(), rtol=1e-6, atol=0)
    assert factor == pytest.approx(hf_factor) == pytest.approx(0.1 * math.log(32) + 1)


def test_yarn_factor_from_context_and_mscale():
    params = dict(rope_type="yarn", rope_theta=10000.0, factor=None, original_max_position_embeddings=16,
                  mscale=1.0, mscale_all_dim=0.5)
    _, factor = rope_scaling.rope_from_config(params, 8, max_positions=64)  # factor 64 / 16 = 4
    assert factor == pytest.approx((0.1 * math.log(4) + 1) / (0.05 * math.log(4) + 1))
    assert rope_scaling.yarn_attention_factor(1.0) == 1.0
    assert rope_scaling.rope_from_config(params | dict(attention_factor=0.5), 8, 64)[1] == 0.5


def test_rope_scaling_bad_inputs():
    with pytest.raises(ValueError, match="rope_type"):
        rope_scaling.rope_from_config(dict(rope_type="dynamic", rope_theta=10.0, original_max_position_embeddings=4),
                                      8)
    with pytest.raises(ValueError, match="partial_rotary_factor"):
        rope_scaling.rope_from_config(dict(rope_theta=10.0, partial_rotary_factor=0.5), 8)
    with pytest.raises(TypeError, match="rope_parameters must be a dict"):
        rope_scaling.rope_from_config([("rope_theta", 10.0)], 8)
    with pytest.raises(ValueError, match="high_freq_factor"):
        rope_scaling.llama3_frequencies(inverse_frequencies(8), factor=8.0, low_freq_factor=4.0, high_freq_factor=1.0,
                                        original_max_positions=64)
    with pytest.raises(TypeError, match="factor must be a float"):
        rope_scaling.yarn_frequencies(8, 100.0, factor="4", original_max_positions=16)
    with pytest.raises(ValueError, match="dim must be even"):
        rope_scaling.yarn_frequencies(7, 100.0, factor=4.0, original_max_positions=16)
    with pytest.raises(ValueError, match="factor must be finite"):
        rope_scaling.yarn_attention_factor(-1.0)


def test_apply_rope_with_frequencies():
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    positions = torch.arange(5)
    torch.testing.assert_close(apply_rope(x, positions, base=100.0),
                               apply_rope(x, positions, inv_freq=inverse_frequencies(8, 100.0)))
    with pytest.raises(ValueError, match=r"shape \(4,\)"):
        apply_rope(x, positions, inv_freq=torch.ones(3))
    with pytest.raises(TypeError, match="inv_freq must be a float tensor"):
        apply_rope(x, positions, inv_freq=torch.ones(4, dtype=torch.long))


def test_sliding_window_mask():
    t_q, t_k = 4, 9
    for window in (1, 3, 9, 20):
        mask = sliding_window_mask(t_q, t_k, window)
        for i in range(t_q):
            for j in range(t_k):
                pos = i + t_k - t_q
                assert bool(mask[i, j]) == (0 <= pos - j < window)
    assert torch.equal(sliding_window_mask(6, None, 6), causal_mask(6))
    with pytest.raises(ValueError, match="window"):
        sliding_window_mask(3, 3, 0)


def test_cache_table_matches_hand_computation():
    rows = {row["model"]: row for row in cache.cache_table(context=8192)}
    # Llama-3-8B: 2 (K, V) * 32 layers * 8 KV heads * 128 features * 2 bytes (bf16).
    assert rows["Llama-3-8B"]["GQA"] == 2 * 32 * 8 * 128 * 2 == 131072
    assert rows["Llama-3-8B"]["MHA"] == 2 * 32 * 32 * 128 * 2
    assert rows["Llama-3-8B"]["MQA"] == 2 * 32 * 1 * 128 * 2
    assert rows["Llama-3-8B"]["MLA"] is None
    assert rows["Llama-3-8B"]["published/token"] == 131072
    # Mistral-7B: every layer keeps 4096 of 8192 tokens: half the bytes per token.
    assert rows["Mistral-7B"]["published/token"] == 2 * 32 * 8 * 128 * 2 * 4096 / 8192
    # Gemma-2-9B: 21 global layers keep 8192 tokens, 21 local ones 4096.
    per_layer = 2 * 8 * 256 * 2
    assert rows["Gemma-2-9B"]["published/token"] == per_layer * (21 * 8192 + 21 * 4096) / 8192
    # Gemma-3-12B: 8 global layers, 40 local ones with a window of 1024.
    assert rows["Gemma-3-12B"]["published/token"] == per_layer * (8 * 8192 + 40 * 1024) / 8192
    assert rows["Qwen3-8B"]["GQA"] == 2 * 36 * 8 * 128 * 2
    # GPT-OSS-120B: 18 full layers, 18 sliding layers of 128 tokens, heads of 64.
    assert rows["GPT-OSS-120B"]["published/token"] == 2 * 8 * 64 * 2 * (18 * 8192 + 18 * 128) / 8192
    # DeepSeek-V3: 61 layers, each a latent of 512 + 64 numbers.
    assert rows["DeepSeek-V3"]["MLA"] == 61 * 576 * 2 == 70272
    assert rows["DeepSeek-V3"]["published/token"] == 70272
    assert rows["DeepSeek-V3"]["MHA"] == 2 * 61 * 128 * 128 * 2
    # Llama-4-Scout: a chunk of 8192 hides nothing at 8192 tokens; at 131072, 36 of 48 layers keep 8192 tokens.
    assert rows["Llama-4-Scout"]["published/token"] == rows["Llama-4-Scout"]["GQA"] == 2 * 48 * 8 * 128 * 2
    long = {row["model"]: row for row in cache.cache_table(context=131072)}
    assert long["Llama-4-Scout"]["published/token"] == 2 * 8 * 128 * 2 * (12 * 131072 + 36 * 8192) / 131072


def test_chapter_19s_cache_kinds_in_the_table():
    """DeepSeek V3.2 adds the indexer's key to MLA's latent; V4 keeps one vector per token for key and value in a
    window of 128 in every layer, plus one entry per complete block: 23 HCA layers (blocks of 128) and 20 CSA layers
    (blocks of 4, each entry with its indexer key)."""
    rows = {row["model"]: row for row in cache.cache_table(context=8192)}
    assert rows["DeepSeek-V3.2"]["published/token"] == 61 * (512 + 64 + 128) * 2
    window = 43 * 128 * 512 * 2
    entries = 23 * (8192 // 128) * 512 * 2 + 20 * (8192 // 4) * (512 + 128) * 2
    assert rows["DeepSeek-V4"]["published/token"] == (window + entries) / 8192
    long = {row["model"]: row for row in cache.cache_table(context=131072)}
    entries = 23 * (131072 // 128) * 512 * 2 + 20 * (131072 // 4) * (512 + 128) * 2
    assert long["DeepSeek-V4"]["published/token"] == (window + entries) / 131072


def test_the_deepseek_rows_are_transformers_configurations():
    """The typed sizes of the V3.2 and V4 rows against transformers' own configurations (their defaults are the
    released models')."""
    import collections

    from transformers import DeepseekV4Config, DeepseekV32Config

    v32, v4 = DeepseekV32Config(), DeepseekV4Config()
    row = next(c for c in cache.PUBLISHED if c.name == "DeepSeek-V3.2")
    assert (row.num_layers, row.num_heads, row.latent_dim, row.index_dim) == (
        v32.num_hidden_layers, v32.num_attention_heads, v32.kv_lora_rank + v32.qk_rope_head_dim, v32.index_head_dim)
    row = next(c for c in cache.PUBLISHED if c.name == "DeepSeek-V4")
    kinds = collections.Counter(v4.layer_types)
    rates = v4.compress_rates
    assert (row.num_layers, row.num_heads, row.num_kv_heads, row.head_dim, row.local_span) == (
        v4.num_hidden_layers, v4.num_attention_heads, v4.num_key_value_heads, v4.head_dim, v4.sliding_window)
    assert row.compressed == (
        (kinds["heavily_compressed_attention"], rates["heavily_compressed_attention"], v4.head_dim),
        (kinds["compressed_sparse_attention"], rates["compressed_sparse_attention"], v4.head_dim + v4.index_head_dim))


def test_cache_table_fp8_and_long_context():
    fp8 = {row["model"]: row for row in cache.cache_table(context=8192, dtype=torch.float8_e4m3fn)}
    assert fp8["Llama-3-8B"]["GQA"] == 2 * 32 * 8 * 128
    long = {row["model"]: row for row in cache.cache_table(context=131072)}
    assert long["Gemma-3-12B"]["published/token"] == 2 * 8 * 256 * 2 * (8 * 131072 + 40 * 1024) / 131072
    short = {row["model"]: row for row in cache.cache_table(context=100)}  # shorter than every window
    assert short["Mistral-7B"]["published/token"] == short["Mistral-7B"]["GQA"]
    with pytest.raises(ValueError, match="scheme"):
        cache.scheme_bytes_per_token(cache.PUBLISHED[0], "MLQ")
    with pytest.raises(ValueError, match="context"):
        cache.published_cache_bytes(cache.PUBLISHED[0], 0)


def _tiny_lm_cache(model_class, config, t: int):
    model = model_class(config).eval()
    with torch.no_grad():
        return model(torch.randint(0, config.vocab_size, (1, t), generator=torch.Generator().manual_seed(t)),
                     use_cache=True).past_key_values


@pytest.mark.parametrize("t", [4, 20])
def test_transformers_allocates_the_predicted_cache_chunked_llama4(t):
    transformers = pytest.importorskip("transformers")
    from attention_course.interop.hf_models import hf_cache_bytes

    transformers.logging.set_verbosity_error()
    config = transformers.Llama4TextConfig(
        hidden_size=32, intermediate_size=16, intermediate_size_mlp=16, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, vocab_size=50, attention_chunk_size=6, num_local_experts=2,
        attn_implementation="eager")
    assert config.layer_types.count("chunked_attention") == 3  # three chunked RoPE layers, one global NoPE layer
    predicted = cache.PublishedConfig("tiny Llama 4", "", 4, 4, 2, 8, local_layers=3, local_span=6)
    held = hf_cache_bytes(_tiny_lm_cache(transformers.Llama4ForCausalLM, config, t))
    assert held == cache.published_cache_bytes(predicted, t, torch.float32, between_steps=True)
    # by hand: 2 (K, V) * 2 heads * 8 features * 4 bytes * (global: t tokens + 3 chunked layers: min(t, 5) tokens)
    assert held == 2 * 2 * 8 * 4 * (t + 3 * min(t, 5))


def test_transformers_allocates_the_predicted_cache_shared_gemma4():
    transformers = pytest.importorskip("transformers")
    from attention_course.interop.hf_models import hf_cache_bytes

    transformers.logging.set_verbosity_error()
    config = transformers.Gemma4TextConfig(
        hidden_size=32, intermediate_size=16, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
        head_dim=8, global_head_dim=8, vocab_size=50, sliding_window=6, num_kv_shared_layers=2,
        layer_types=["sliding_attention", "full_attention"] * 2, hidden_size_per_layer_input=4,
        vocab_size_per_layer_input=50, attn_implementation="eager")
    # The last two layers reuse the keys and values of the first two: one sliding and one full layer cache.
    predicted = cache.PublishedConfig("tiny Gemma 4", "", 4, 4, 2, 8, local_layers=1, local_span=6, shared_layers=2)
    held = hf_cache_bytes(_tiny_lm_cache(transformers.Gemma4ForCausalLM, config, 20))
    assert held == cache.published_cache_bytes(predicted, 20, torch.float32, between_steps=True)
    assert held == 2 * 2 * 8 * 4 * (20 + 5)


def test_mla_costs_match_the_published_table_and_the_modules_tensors():
    v3 = cache.mla_costs(cache.DEEPSEEK_V3_MLA)
    deepseek = next(c for c in cache.PUBLISHED if c.name == "DeepSeek-V3")
    assert v3["latent bytes/token"] == cache.scheme_bytes_per_token(deepseek, "MLA")  # 61 * 576 * 2
    assert v3["expanded bytes/token"] == 61 * 128 * (192 + 128) * 2
    assert (v3["expanded MACs/pair"], v3["absorbed MACs/pair"]) == (128 * 320, 128 * 1088)
    # The course's MLA layer: the tensors its two forms attend over, counted per token.
    from attention_course import modern
    sizes = cache.MLASizes(1, 3, kv_lora_rank=10, qk_rope_head_dim=4, qk_nope_head_dim=6, v_head_dim=5)
    layer = modern.MultiHeadLatentAttention(24, 3, q_lora_rank=None, kv_lora_rank=10, qk_nope_head_dim=6,
                                            qk_rope_head_dim=4, v_head_dim=5)
    t = 7
    c, k_rope = layer.latents(torch.randn(1, t, 24), layer.rotary(torch.arange(t), torch.float32))  # (1, 1, T, C/R)
    w_uk, w_uv = layer.up_projections()  # (H, N, C), (H, V, C)
    keys = torch.cat([c @ w_uk.transpose(-2, -1), k_rope.expand(-1, 3, -1, -1)], dim=-1)  # (1, H, T, N + R)
    values = c @ w_uv.transpose(-2, -1)  # (1, H, T, V)
    costs = cache.mla_costs(sizes, torch.float32)
    assert costs["latent bytes/token"] == (c.numel() + k_rope.numel()) * 4 // t
    assert costs["expanded bytes/token"] == (keys.numel() + values.numel()) * 4 // t
    assert costs["expanded MACs/pair"] == 3 * (keys.size(-1) + values.size(-1))
    assert costs["absorbed MACs/pair"] == 3 * (c.size(-1) + k_rope.size(-1) + c.size(-1))


def test_transformers_caches_the_mla_latent():
    """transformers' DeepseekV3 caches the latent and k_rope (C + R per token and layer), not the expanded keys and
    values it attends over (it re-expands them at every step)."""
    import transformers

    from attention_course.interop.hf_models import hf_cache_bytes
    config = transformers.DeepseekV3Config(
        vocab_size=50, hidden_size=24, intermediate_size=16, moe_intermediate_size=8, num_hidden_layers=2,
        num_attention_heads=3, num_key_value_heads=3, q_lora_rank=12, kv_lora_rank=10, qk_rope_head_dim=4,
        qk_nope_head_dim=6, v_head_dim=5, n_routed_experts=2, num_experts_per_tok=1, first_k_dense_replace=2)
    held = hf_cache_bytes(_tiny_lm_cache(transformers.DeepseekV3ForCausalLM, config, 9))
    sizes = cache.MLASizes(2, 3, 10, 4, 6, 5)
    assert held == 9 * cache.mla_costs(sizes, torch.float32)["latent bytes/token"] == 9 * 2 * (10 + 4) * 4
    assert held < 9 * cache.mla_costs(sizes, torch.float32)["expanded bytes/token"]
