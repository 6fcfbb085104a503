"""Chapter 14's layers with a cache: decoding (a prefill, then one token at a time) equals the layer's full forward
and Hugging Face's own decode through its ``DynamicCache``; a GPT assembled from these layers is served by the
engine with the tokens of solo greedy decoding. Configurations are drawn from seeded generators (the ones of
test_modern_attention and test_modern_mla: GQA, QK-norm, windows shorter than T, soft-caps, sinks, MLA)."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from attention_course import modern
from attention_course.gpt import GPT, GPTConfig
from attention_course.interop import hf_models
from attention_course.interop.hf_models import build_hf_attention, hf_decode, hf_forward, relative_error
from attention_course.kv_cache import KVCache
from attention_course.linear_attention import GatedDeltaNet, Qwen3NextAttention
from attention_course.serving import Engine, Request, greedy_reference
from test_modern_attention import draw_config
from test_modern_mla import draw_config as draw_mla_config

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("transformers")

FAMILIES = ["llama", "mistral", "qwen3", "gemma2", "gemma3", "gpt_oss", "deepseek_v3", "qwen3_next"]


def draw(family: str, rng: np.random.Generator) -> tuple[dict, int]:
    if family == "deepseek_v3":
        return draw_mla_config(rng), 0
    if family == "qwen3_next":
        config, _ = draw_config("qwen3", rng)
        return config | dict(rope_parameters=dict(rope_type="default", rope_theta=100.0, partial_rotary_factor=0.5),
                             layer_types=["full_attention"]), 0
    return draw_config(family, rng)


def decode(layer, x: torch.Tensor, prefill: int, cache: KVCache) -> torch.Tensor:
    """The course layer through a cache: the first ``prefill`` positions at once, then one token at a time."""
    steps = [(0, prefill), *((p, p + 1) for p in range(prefill, x.size(1)))]
    with torch.no_grad():
        return torch.cat([layer(x[:, a:b], cache=cache, layer=0) for a, b in steps], dim=1)


@pytest.mark.parametrize("family", FAMILIES)
def test_cached_decode_equals_full_forward_and_transformers(family):
    rng = np.random.default_rng([14, 8, FAMILIES.index(family)])
    for case in range(2):
        config, layer_idx = draw(family, rng)
        hf = build_hf_attention(family, layer_idx, seed=case, **config)
        ours = hf_models.FAMILIES[family].from_hf(hf)
        b, t, prefill = int(rng.integers(1, 3)), int(rng.integers(9, 12)), int(rng.integers(1, 5))
        x = torch.from_numpy(rng.standard_normal((b, t, config["hidden_size"])))
        window = getattr(ours, "window", None)
        with torch.no_grad():
            full = ours(x)
        for cache in (KVCache(1), KVCache(1, max_len=t), KVCache(1, windows=[window])):
            assert relative_error(decode(ours, x, prefill, cache), full) < 1e-12, (family, config)
        assert relative_error(decode(ours, x, prefill, KVCache(1)), hf_decode(hf, x, prefill)) < 1e-6, config
        assert relative_error(hf_decode(hf, x, prefill), hf_forward(hf, x)) < 1e-6  # HF's decode is right too


def test_sliding_cache_keeps_only_the_window():
    layer = modern.MistralAttention(16, 4, 2, window=3).double()
    cache, x = KVCache(1, windows=[3]), torch.randn(1, 8, 16, dtype=torch.float64)
    out = decode(layer, x, 4, cache)
    assert cache.keys[0].shape == (1, 2, 2, 4) and cache.seq_len() == 8  # window - 1 positions kept, 8 seen
    with torch.no_grad():
        assert relative_error(out, layer(x)) < 1e-12
    with pytest.raises(ValueError, match="already dropped"):
        cache.crop(5)
    cache.crop(7)
    assert cache.keys[0].shape == (1, 2, 1, 4) and cache.seq_len() == 7


def test_a_spoiled_cache_is_noticed():
    """The comparison can fail: a cache that restarts positions at 0 (or forgets its keys) changes the output."""
    layer = modern.LlamaAttention(16, 4, 2).double()
    x = torch.randn(1, 7, 16, dtype=torch.float64)
    with torch.no_grad():
        full = layer(x)
    cache = KVCache(1)
    cache.positions = lambda layer, t, device=None: torch.arange(t, device=device)  # positions restart at 0
    assert relative_error(decode(layer, x, 3, cache), full) > 1e-3
    assert relative_error(decode(layer, x, 3, KVCache(1, windows=[2])), full) > 1e-3  # forgets all but one key


def test_bfloat16_keeps_rope_frequencies():
    """Casting a converted layer casts its weights, never its RoPE frequencies (8 mantissa bits would round them)."""
    hf = build_hf_attention("llama", hidden_size=16, num_attention_heads=4, num_key_value_heads=2,
                            rope_parameters=dict(rope_type="default", rope_theta=10000.0))
    mla = modern.MultiHeadLatentAttention(16, 2, q_lora_rank=None, kv_lora_rank=4, qk_nope_head_dim=4,
                                          qk_rope_head_dim=6, v_head_dim=4)
    for layer in (modern.LlamaAttention.from_hf(hf), mla):
        exact = layer.inv_freq.clone()
        layer = layer.to(torch.bfloat16)
        assert layer.inv_freq.dtype == torch.float64 and torch.equal(layer.inv_freq, exact)
        assert next(layer.parameters()).dtype == torch.bfloat16
        assert not torch.equal(exact.to(torch.bfloat16).double(), exact)  # a cast would have changed them


# ---------------------------------------------------------------- a GPT of chapter 14's layers, served

VOCAB = 41


def modern_gpt(attention, seed=0):
    config = GPTConfig(vocab_size=VOCAB, d_model=16, num_heads=4, num_kv_heads=2, num_layers=2, positions=None,
                       init="pytorch", tie_embeddings=False)
    return GPT(config, seed=seed, attention=attention).double().eval()


ATTENTIONS = {
    "gqa-qknorm-window": lambda c, i: modern.ModernAttention(c.d_model, c.num_heads, c.num_kv_heads, qk_norm_eps=1e-6,
                                                             window=None if i else 3),
    "softcap-sinks": lambda c, i: modern.ModernAttention(c.d_model, c.num_heads, c.num_kv_heads, softcap=2.0,
                                                         sinks=True, window=4),
    "mla": lambda c, i: modern.MultiHeadLatentAttention(c.d_model, c.num_heads, q_lora_rank=6, kv_lora_rank=5,
                                                        qk_nope_head_dim=4, qk_rope_head_dim=2, v_head_dim=3),
    "gated": lambda c, i: Qwen3NextAttention(c.d_model, c.num_heads, c.num_kv_heads, qk_norm_eps=1e-6,
                                             inv_freq=torch.tensor([1.0, 0.1])),
    "hybrid": lambda c, i: GatedDeltaNet(c.d_model, 2, 4, 4, 3, chunk_size=4) if i % 2 == 0 else Qwen3NextAttention(
        c.d_model, c.num_heads, c.num_kv_heads, qk_norm_eps=1e-6, inv_freq=torch.tensor([1.0, 0.1])),
}


@pytest.mark.parametrize("name", list(ATTENTIONS))
def test_engine_serves_a_gpt_of_modern_layers(name):
    model = modern_gpt(ATTENTIONS[name])
    if name == "softcap-sinks":
        with torch.no_grad():
            for block in model.blocks:
                block.attn.sinks.normal_()
    rng = np.random.default_rng(len(name))
    requests = [Request(i, rng.integers(0, VOCAB, int(rng.integers(1, 9))).tolist(), int(rng.integers(1, 7)),
                        arrival=int(rng.integers(0, 3))) for i in range(5)]
    engine = Engine(model, num_blocks=30, block_size=3, max_seqs=3, max_batch_tokens=7)
    assert engine.run(requests) == {r.id: greedy_reference(model, r.prompt, r.max_new_tokens) for r in requests}
    ids = torch.tensor([requests[0].prompt])
    generated = model.generate(ids, 4)
    assert torch.equal(generated, model.generate(ids, 4, use_cache=False))  # cached decode == full recompute


def test_paged_crop_states_and_refusals():
    model = modern_gpt(ATTENTIONS["hybrid"])
    with pytest.raises(ValueError, match="a recurrent layer's state cannot be shared"):
        Engine(model, 8, 2, prefix_sharing=True)
    engine = Engine(model, num_blocks=8, block_size=2)
    cache = engine.cache
    cache.add_sequence("a")
    cache.begin_step([("a", 5)])
    with torch.no_grad():
        model(torch.tensor([[1, 2, 3, 4, 5]]), cache=cache)
    cache.end_step()
    assert cache.seq_len("a") == 5 and cache.segments is not None
    cache.fork("a", "b")
    assert cache.state(0, "b") is cache.state(0, "a") is not None
    with pytest.raises(ValueError, match="a recurrent state cannot drop any"):
        cache.crop(3, "a")
    cache.begin_step([("a", 1)])
    with pytest.raises(ValueError, match="the step packs 1 new tokens"):
        model(torch.tensor([[1, 2]]), cache=cache)
    cache.abort_step()  # the states written before the failure are forgotten
    assert cache.state(0, "a") is cache.state(0, "b")
    cache.free_sequence("b")
    assert cache.state(0, "b") is None


def test_paged_crop_releases_blocks():
    model = modern_gpt(ATTENTIONS["gqa-qknorm-window"])
    cache = Engine(model, num_blocks=8, block_size=2).cache
    cache.add_sequence(0)
    cache.begin_step([(0, 5)])
    with torch.no_grad():
        model(torch.tensor([[1, 2, 3, 4, 5]]), cache=cache)
    cache.end_step()
    cache.crop(2, 0)
    assert cache.seq_len(0) == 2 and len(cache.tables[0]) == 1 and cache.num_free_blocks == 7
    with pytest.raises(ValueError, match="cannot crop to length=3"):
        cache.crop(3, 0)


def test_recurrent_state_in_a_kv_cache():
    model = modern_gpt(ATTENTIONS["hybrid"])
    cache = KVCache(model.num_layers)
    with torch.no_grad():
        model(torch.tensor([[1, 2, 3]]), cache=cache)
    assert cache.seq_len() == 3 and cache.state(0) is not None and cache.state(1) is None
    with pytest.raises(ValueError, match="recurrent layer's state"):
        cache.crop(2)
    cache.reset()
    assert cache.state(0) is None and cache.seq_len() == 0
