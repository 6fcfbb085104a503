"""Chapter 18 against the real engine: the course's GPT loaded into Hugging Face's StarCoder2 (same function), then
``transformers``' continuous batching (``generate_batch``, paged cache) and its assisted and prompt-lookup
generation give the same tokens as the course's engine and speculative decoding. Random weights, offline."""

from __future__ import annotations

import os
import random

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")

from attention_course.gpt import GPT, GPTConfig  # noqa: E402
from attention_course.interop.hf_models import interleaved_to_halves, to_hf_starcoder2  # noqa: E402
from attention_course.serving import Engine, Request, greedy_reference, speculative_generate  # noqa: E402

VOCAB = 61


def gpt(seed, d_model, num_heads, num_kv_heads, num_layers):
    config = GPTConfig(vocab_size=VOCAB, d_model=d_model, num_heads=num_heads, num_kv_heads=num_kv_heads,
                       num_layers=num_layers, positions="rope", init="pytorch", tie_embeddings=False)
    return GPT(config, seed=seed).eval()


@pytest.fixture(scope="module")
def models():
    target = gpt(0, 32, 4, 2, 2)
    draft = gpt(1, 16, 2, None, 1)
    return target, draft, to_hf_starcoder2(target), to_hf_starcoder2(draft)


def test_interleaved_to_halves():
    assert interleaved_to_halves(6).tolist() == [0, 2, 4, 1, 3, 5]


def test_the_twin_computes_the_same_logits(models):
    target, _, hf, _ = models
    ids = torch.randint(0, VOCAB, (2, 11), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        # HF computes RoPE angles in float32: agreement to float32 rounding, not better
        torch.testing.assert_close(hf(ids).logits, target(ids), rtol=0, atol=2e-5)
    with pytest.raises(ValueError, match="needs positions='rope'"):
        to_hf_starcoder2(GPT(GPTConfig(vocab_size=5, d_model=4, num_heads=1, num_layers=1)))


def test_generate_batch_equals_the_course_engine(models):
    target, _, _, _ = models
    rng = random.Random(random.SystemRandom().randrange(2**31))  # a workload the test did not choose
    prompts = [[rng.randrange(VOCAB) for _ in range(rng.randint(1, 16))] for _ in range(6)]
    steps = [rng.randint(1, 8) for _ in prompts]
    eos = greedy_reference(target, prompts[0], 8)[3]
    paged = to_hf_starcoder2(target, attn_implementation="paged|eager")
    config = transformers.GenerationConfig(max_new_tokens=8, do_sample=False, eos_token_id=eos, pad_token_id=0)
    pool = transformers.ContinuousBatchingConfig(page_size=4, num_blocks=64, max_batch_tokens=64)  # sized: no probe
    hf_out = paged.generate_batch(inputs=prompts, generation_config=config, continuous_batching_config=pool,
                                  progress_bar=False)
    hf_tokens = [out.generated_tokens for out in hf_out.values()]  # in request order: req_0, req_1, ...
    requests = [Request(i, p, 8, eos_token_id=eos, arrival=s % 3) for i, (p, s) in enumerate(zip(prompts, steps,
                                                                                               strict=True))]
    ours = Engine(target, num_blocks=30, block_size=4, max_seqs=3, max_batch_tokens=8).run(requests)
    assert [ours[i] for i in range(len(prompts))] == hf_tokens, f"prompts={prompts}"
    assert any(len(t) < 8 for t in hf_tokens)  # someone stopped at the end-of-sequence token


def test_assisted_and_prompt_lookup_equal_the_course(models):
    target, draft, hf, hf_draft = models
    for prompt in ([5, 9, 2, 5, 9], [1] * 3 + [7, 8, 1, 1]):
        ids = torch.tensor([prompt])
        assisted = hf.generate(ids, assistant_model=hf_draft, max_new_tokens=10, do_sample=False)[0, len(prompt):]
        lookup = hf.generate(ids, prompt_lookup_num_tokens=3, max_new_tokens=10, do_sample=False)[0, len(prompt):]
        ours_draft, _ = speculative_generate(target, prompt, 10, 3, draft)
        ours_lookup, _ = speculative_generate(target, prompt, 10, 3, None)
        assert assisted.tolist() == ours_draft == lookup.tolist() == ours_lookup == greedy_reference(target, prompt,
                                                                                                       10)
