"""Chapter 14: multi-head latent attention equals transformers' DeepseekV3Attention, and absorbed equals plain."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from attention_course import modern
from attention_course.interop.hf_models import build_hf_attention, hf_forward, relative_error

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("transformers")

TOLERANCE = {torch.float64: 1e-6, torch.float32: 1e-5}  # HF's RoPE angles and softmax are float32 (see hf.py)



def draw_config(rng: np.random.Generator) -> dict:
    heads = int(rng.choice([1, 2, 3]))
    rope = (dict(rope_type="default", rope_theta=10000.0) if rng.integers(2) else
            dict(rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=16,
                 mscale=float(rng.choice([0.7, 1.0])), mscale_all_dim=float(rng.choice([0.0, 0.8]))))
    return dict(hidden_size=heads * int(rng.choice([4, 8])), num_attention_heads=heads, num_key_value_heads=heads,
                q_lora_rank=None if rng.integers(2) else int(rng.integers(4, 12)),
                kv_lora_rank=int(rng.integers(3, 12)),
                qk_rope_head_dim=int(rng.choice([2, 4, 6])), qk_nope_head_dim=int(rng.integers(2, 8)),
                v_head_dim=int(rng.integers(2, 8)), rope_interleave=bool(rng.integers(2)), rope_parameters=rope,
                attention_bias=bool(rng.integers(2)), max_position_embeddings=64)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_mla_equal_to_transformers_and_absorbed(dtype):
    rng = np.random.default_rng([14, 3, dtype.itemsize])
    for case in range(6):
        config = draw_config(rng)
        hf = build_hf_attention("deepseek_v3", dtype=dtype, seed=case, **config)
        ours = modern.MultiHeadLatentAttention.from_hf(hf)
        b, t = int(rng.integers(1, 3)), int(rng.integers(5, 10))
        x = torch.from_numpy(rng.standard_normal((b, t, config["hidden_size"]))).to(dtype)
        positions = torch.arange(t) + int(rng.integers(0, 40))
        plain = ours(x, positions)
        assert relative_error(plain, hf_forward(hf, x, positions)) < TOLERANCE[dtype], config
        # Absorption only reorders products: float64 agrees to rounding, float32 to its own precision.
        assert relative_error(ours.forward_absorbed(x, positions), plain) < {torch.float64: 1e-12,
                                                                              torch.float32: 1e-5}[dtype]


def test_absorbed_reads_only_the_latent_cache():
    layer = modern.MultiHeadLatentAttention(16, 4, q_lora_rank=None, kv_lora_rank=6, qk_nope_head_dim=5,
                                            qk_rope_head_dim=4, v_head_dim=3).double()
    x = torch.randn(2, 7, 16, dtype=torch.float64)
    c, k_rope = layer.latents(x, layer.rotary(torch.arange(7), x.dtype))
    assert c.shape == (2, 1, 7, 6) and k_rope.shape == (2, 1, 7, 4)  # 10 numbers per token and layer
    w_uk, w_uv = layer.up_projections()
    assert w_uk.shape == (4, 5, 6) and w_uv.shape == (4, 3, 6)
    torch.testing.assert_close(layer.forward_absorbed(x), layer(x))


def test_absorbing_the_transposed_matrix_fails():
    layer = modern.MultiHeadLatentAttention(12, 2, q_lora_rank=None, kv_lora_rank=4, qk_nope_head_dim=4,
                                            qk_rope_head_dim=2, v_head_dim=3).double()
    x = torch.randn(1, 5, 12, dtype=torch.float64)
    q_nope, _ = layer.queries(x, layer.rotary(torch.arange(5), x.dtype))
    w_uk, _ = layer.up_projections()  # square here (N = C = 4): the transposed matrix has the right shape
    assert (q_nope @ w_uk - q_nope @ w_uk.transpose(-2, -1)).abs().max() > 1e-3


def test_mla_refusals_and_bad_inputs():
    hf = build_hf_attention("deepseek_v3", hidden_size=8, num_attention_heads=2, num_key_value_heads=1,
                            kv_lora_rank=4, qk_rope_head_dim=2, qk_nope_head_dim=2, v_head_dim=2, q_lora_rank=None)
    with pytest.raises(ValueError, match="num_key_value_heads"):
        modern.MultiHeadLatentAttention.from_hf(hf)
    with pytest.raises(TypeError, match="mirrors transformers' LlamaAttention"):
        modern.LlamaAttention.from_hf(hf)
    layer = modern.MultiHeadLatentAttention(8, 2, q_lora_rank=None, kv_lora_rank=4, qk_nope_head_dim=2,
                                            qk_rope_head_dim=2, v_head_dim=2)
    with pytest.raises(ValueError, match="d_model=8"):
        layer(torch.zeros(1, 3, 6))
    with pytest.raises(TypeError, match="q_lora_rank"):
        modern.MultiHeadLatentAttention(8, 2, q_lora_rank=2.5, kv_lora_rank=4, qk_nope_head_dim=2,
                                        qk_rope_head_dim=2, v_head_dim=2)
    with pytest.raises(ValueError, match="kv_lora_rank"):
        modern.MultiHeadLatentAttention(8, 2, q_lora_rank=None, kv_lora_rank=0, qk_nope_head_dim=2,
                                        qk_rope_head_dim=2, v_head_dim=2)
