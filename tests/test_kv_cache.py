"""KV cache, MQA/GQA and the cached causal attention (the GPT that generates with them: test_gpt.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attention_course import numpy_ref
from attention_course.kv_cache import (
    CausalSelfAttention,
    KVCache,
    cache_bytes_per_token,
    repeat_kv,
)


def prompt(b=2, t=5, vocab=97, seed=0):
    return torch.randint(0, vocab, (b, t), generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------- helpers


def test_cache_bytes_per_token():
    assert cache_bytes_per_token(1, 1, 1) == 2 * 4
    assert cache_bytes_per_token(32, 32, 128, torch.float16) == 2 * 32 * 32 * 128 * 2  # 512 KiB: a 7B-class model
    assert cache_bytes_per_token(32, 8, 128, "bfloat16") == cache_bytes_per_token(32, 32, 128, "bfloat16") // 4


@pytest.mark.parametrize(
    "args,error,match",
    [
        ((0, 1, 1), ValueError, "num_layers must be >= 1"),
        ((1, 1, 1, "float17"), ValueError, "unknown dtype name 'float17'"),
        ((1, 1, 1, "Tensor"), ValueError, "unknown dtype name"),
        ((1, 1, 1, 4), TypeError, "dtype must be a torch.dtype"),
    ],
)
def test_cache_bytes_errors(args, error, match):
    with pytest.raises(error, match=match):
        cache_bytes_per_token(*args)


@pytest.mark.parametrize("n_rep", [1, 2, 3])
def test_repeat_kv_is_repeat_interleave(n_rep):
    x = torch.randn(2, 2, 5, 4)
    torch.testing.assert_close(repeat_kv(x, n_rep), x.repeat_interleave(n_rep, dim=1), rtol=0, atol=0)


# ---------------------------------------------------------------- KVCache


@pytest.mark.parametrize("max_len", [None, 10])
def test_cache_update_returns_everything_so_far(max_len):
    cache = KVCache(num_layers=2, max_len=max_len)
    k1, v1 = torch.randn(2, 3, 4, 8), torch.randn(2, 3, 4, 8)
    k2, v2 = torch.randn(2, 3, 1, 8), torch.randn(2, 3, 1, 8)
    cache.update(0, k1, v1)
    k, v = cache.update(0, k2, v2)
    torch.testing.assert_close(k, torch.cat([k1, k2], 2), rtol=0, atol=0)
    torch.testing.assert_close(v, torch.cat([v1, v2], 2), rtol=0, atol=0)
    assert len(cache) == 5 and cache.lengths == [5, 0]
    expected_bytes = 2 * 2 * 3 * (5 if max_len is None else 10) * 8 * 4
    assert cache.nbytes() == expected_bytes
    cache.reset()
    assert len(cache) == 0 and cache.nbytes() == 0


def test_cache_errors():
    with pytest.raises(ValueError, match="num_layers must be >= 1"):
        KVCache(0)
    with pytest.raises(ValueError, match="max_len must be >= 1"):
        KVCache(1, max_len=0)
    cache = KVCache(1, max_len=4)
    k = torch.zeros(1, 2, 3, 4)
    with pytest.raises(IndexError, match="layer 1 out of range"):
        cache.update(1, k, k)
    with pytest.raises(ValueError, match="k and v must have the same shape"):
        cache.update(0, k, k[:, :1])
    with pytest.raises(ValueError, match=r"k must be 4-D \(B, H_kv, T, Dh\)"):
        cache.update(0, k[0], k[0])
    cache.update(0, k, k)
    with pytest.raises(ValueError, match=r"cache overflow: 3 \+ 3 positions > max_len=4"):
        cache.update(0, k, k)
    with pytest.raises(ValueError, match="do not match the cached"):
        cache.update(0, k[:, :1, :1], k[:, :1, :1])


# ---------------------------------------------------------------- the attention layer


@pytest.mark.parametrize("fused_qkv", [True, False])
def test_layer_matches_numpy_reference(rng, fused_qkv):
    params = numpy_ref.init_mha_params(16, seed=1)
    layer = CausalSelfAttention(16, 4, fused_qkv=fused_qkv, bias=True).double()
    layer.load_numpy_params(params)
    x = rng.normal(size=(2, 6, 16))
    with torch.no_grad():
        out = layer(torch.from_numpy(x))
    ref, _ = numpy_ref.multi_head_attention(x, x, x, params, 4, numpy_ref.causal_mask(6))
    np.testing.assert_allclose(out.numpy(), ref, rtol=0, atol=1e-12)
    back = layer.numpy_params()
    assert all(np.allclose(back[name], params[name], atol=1e-12) for name in params)


@pytest.mark.parametrize("num_kv_heads", [1, 2])
@pytest.mark.parametrize("fused_qkv,bias", [(True, True), (False, False)])
def test_gqa_numpy_params_reproduce_the_layer(rng, num_kv_heads, fused_qkv, bias):
    torch.manual_seed(0)
    layer = CausalSelfAttention(16, 4, num_kv_heads, fused_qkv=fused_qkv, bias=bias).double()
    params = layer.numpy_params()
    assert bias or not any(params[f"b_{n}"].any() for n in "qkvo")
    x = rng.normal(size=(2, 6, 16))
    with torch.no_grad():
        out = layer(torch.from_numpy(x))
    ref, _ = numpy_ref.multi_head_attention(x, x, x, params, 4, numpy_ref.causal_mask(6))
    np.testing.assert_allclose(out.numpy(), ref, rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="needs num_kv_heads == num_heads"):
        layer.load_numpy_params(params)


def test_load_numpy_params_without_bias():
    layer = CausalSelfAttention(16, 4, fused_qkv=False, bias=False)
    params = numpy_ref.init_mha_params(16)
    with pytest.raises(ValueError, match="bias=False"):
        layer.load_numpy_params(params)
    layer.load_numpy_params({n: (p * 0 if n.startswith("b_") else p) for n, p in params.items()})
    np.testing.assert_allclose(layer.numpy_params()["w_k"], params["w_k"], atol=1e-6)


@pytest.mark.parametrize("num_kv_heads", [1, 2, 4])
@pytest.mark.parametrize("fused_qkv", [True, False])
@pytest.mark.parametrize("max_len", [None, 12])
def test_incremental_equals_full(num_kv_heads, fused_qkv, max_len):
    """Prefill 5 positions, then a chunk of 3 (Tq=3 < Tk=8: bottom-right causal), then 1 at a time."""
    torch.manual_seed(0)
    layer = CausalSelfAttention(16, 4, num_kv_heads, fused_qkv=fused_qkv, bias=True).eval()
    x = torch.randn(2, 10, 16)
    with torch.no_grad():
        full = layer(x)
        cache = KVCache(1, max_len=max_len)
        parts = [layer(x[:, :5], cache), layer(x[:, 5:8], cache), layer(x[:, 8:9], cache), layer(x[:, 9:], cache)]
    torch.testing.assert_close(torch.cat(parts, 1), full, rtol=0, atol=1e-5)
    assert cache.keys[0][:, :, :10].shape == (2, num_kv_heads, 10, 4)  # the cache holds H_kv heads only


@pytest.mark.parametrize("num_kv_heads", [1, 2])
@pytest.mark.parametrize("fused_qkv,bias", [(True, True), (False, True), (True, False), (False, False)])
def test_gqa_equals_mha_with_repeated_kv_heads(num_kv_heads, fused_qkv, bias):
    torch.manual_seed(1)
    gqa = CausalSelfAttention(24, 6, num_kv_heads, fused_qkv=fused_qkv, bias=bias).double().eval()
    mha = gqa.as_multi_head()
    assert mha.num_kv_heads == 6 and mha.w_k.weight.shape == (24, 24)
    proj = gqa.qkv if fused_qkv else gqa.w_k
    assert proj.weight.shape[0] == (24 + 2 * 4 * num_kv_heads if fused_qkv else 4 * num_kv_heads)
    x = torch.randn(3, 7, 24, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(gqa(x), mha(x), rtol=0, atol=1e-12)
        _, k, _ = mha.project(x)
    torch.testing.assert_close(k[:, 0], k[:, 6 // num_kv_heads - 1])  # heads of one group share their keys


def test_layer_errors():
    with pytest.raises(ValueError, match="num_kv_heads=3 must be >= 1 and divide num_heads=4"):
        CausalSelfAttention(16, 4, 3)
    with pytest.raises(ValueError, match="d_model=10 is not divisible by num_heads=4"):
        CausalSelfAttention(10, 4)
    with pytest.raises(ValueError, match=r"query must be 3-D"):
        CausalSelfAttention(16, 4)(torch.zeros(16))
