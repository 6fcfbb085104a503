"""Chapter 18's engine serves chapter 14's Decoder (SmolLM2's architecture): paged cache, continuous batching,
chunked prefill, preemption and prefix sharing give every request the tokens of ``Decoder.generate`` on it alone.

Random workloads on a tiny random-weight Llama (float64: no near-ties), then the real SmolLM2-135M on a few short
requests (the model is loaded from the cache in ~/.cache/attention_course, or built there: about 20 s).
"""

from __future__ import annotations

import os
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attention_course.decoder import Decoder
from attention_course.serving import (
    Engine,
    PagedKVCache,
    Request,
    early_exit_draft,
    greedy_reference,
    speculative_generate,
)
from test_decoder import tiny_llama

os.environ.setdefault("HF_HUB_OFFLINE", "1")
WORKLOADS = settings(max_examples=3, deadline=None, database=None)
VOCAB = 50


@pytest.fixture(scope="module")
def model():
    return Decoder.from_hf(tiny_llama(6, 2, tie=False))


def workload(seed, n=6, max_prompt=12, max_new=8, arrivals=3, vocab=VOCAB):
    rng = random.Random(seed)
    return [Request(i, [rng.randrange(vocab) for _ in range(rng.randint(1, max_prompt))], rng.randint(1, max_new),
                    arrival=rng.randint(0, arrivals)) for i in range(n)]


def solo(model, requests):
    return {r.id: greedy_reference(model, r.prompt, r.max_new_tokens, r.eos_token_id) for r in requests}


def assert_all_free(cache):
    assert sum(cache.allocator.refs) == 0 and cache.num_free_blocks == cache.allocator.num_blocks


def test_the_pool_is_shaped_by_the_cache_protocol(model):
    cache = PagedKVCache.for_model(model, num_blocks=5, block_size=4)
    assert cache.num_layers == len(model.blocks) == model.num_layers == 2
    assert cache.keys[0].shape == (5, 4, 2, 8) and cache.keys[0].dtype == torch.float64
    assert model.vocab_size == VOCAB


@WORKLOADS
@given(seed=st.integers(0, 2**31 - 1), block_size=st.sampled_from([1, 3, 16]))
@pytest.mark.parametrize("read", ["gather", "blocks"])
def test_engine_serves_the_decoder_as_it_decodes_alone(model, seed, block_size, read):
    requests = workload(seed)
    expected = solo(model, requests)
    engine = Engine(model, num_blocks=120 // block_size + 8, block_size=block_size, max_seqs=4, max_batch_tokens=6,
                    read=read)
    assert engine.run(requests) == expected, f"seed={seed}"
    assert max(len(h.batch) for h in engine.history) > 1  # several requests shared a forward pass
    assert_all_free(engine.cache)


@WORKLOADS
@given(seed=st.integers(0, 2**31 - 1))
def test_preemption_and_prefix_sharing_keep_the_tokens(model, seed):
    rng = random.Random(seed)
    system = [rng.randrange(VOCAB) for _ in range(6)]
    requests = workload(seed, n=6, arrivals=0)
    for r in requests[:4]:
        r.prompt = system + r.prompt
    expected = solo(model, requests)
    short = Engine(model, num_blocks=9, block_size=3, max_seqs=6, max_batch_tokens=16)
    assert short.run(requests) == expected and short.preemptions > 0, f"seed={seed}"
    shared = Engine(model, num_blocks=80, block_size=3, max_seqs=2, max_batch_tokens=16, prefix_sharing=True)
    assert shared.run(requests) == expected and shared.prefix_tokens_reused >= 6, f"seed={seed}"
    shared.close()
    for engine in (short, shared):
        assert_all_free(engine.cache)


def test_a_wrong_position_breaks_the_equality(model):
    """The comparison can fail: a model that restarts every new token's position at 0 decodes differently."""
    requests = workload(5, n=3, max_new=6)
    expected = solo(model, requests)

    class Restarting(Decoder):
        def forward(self, ids, positions=None, *, cache=None):
            return super().forward(ids, torch.zeros(ids.size(1), dtype=torch.long), cache=cache)

    wrong = Restarting(VOCAB, 48, 2, 6, 2, 40, norm_eps=1e-5)
    wrong.load_state_dict(model.state_dict())
    wrong.double()
    assert Engine(wrong, 60, 4, max_seqs=3).run(requests) != expected


def test_the_real_model_served_equals_decoding_alone():
    """SmolLM2-135M (float32): four requests, two sharing a prompt prefix, each equal to Decoder.generate alone."""
    pretrained = pytest.importorskip("attention_course.pretrained")
    tokenizer, hf = pretrained.load_smollm2()
    smol = Decoder.from_hf(hf)
    texts = ["The capital of France is", "The capital of France is a city that", "def fibonacci(n):",
             "Attention is all you"]
    requests = [Request(i, tokenizer(t).input_ids, 6, eos_token_id=tokenizer.eos_token_id, arrival=i % 2)
                for i, t in enumerate(texts)]
    expected = solo(smol, requests)
    engine = Engine(smol, num_blocks=32, block_size=4, max_seqs=4, max_batch_tokens=32, prefix_sharing=True)
    assert engine.run(requests) == expected
    assert engine.prefix_tokens_reused >= 4
    prompt, tokens = requests[1].prompt, expected[1][:4]  # speculative decoding: the same tokens
    assert speculative_generate(smol, prompt, 4, 3)[0] == tokens  # by prompt lookup
    assert speculative_generate(smol, prompt, 4, 3, early_exit_draft(smol, 4))[0] == tokens  # by an early exit


@WORKLOADS
@given(seed=st.integers(0, 2**31 - 1))
def test_speculative_decoding_of_the_decoder_equals_plain_greedy(model, seed):
    """Prompt lookup and an early-exit draft (the first layer, the same final norm and head) give Decoder.generate's
    tokens; the draft shares the target's weights and is cut, not copied."""
    draft = early_exit_draft(model, 1)
    assert len(draft.blocks) == 1 and len(model.blocks) == 2 and draft.blocks[0] is model.blocks[0]
    assert draft.head is model.head and draft.norm is model.norm
    rng = random.Random(seed)
    prompt = [rng.randrange(VOCAB) for _ in range(rng.randint(1, 10))] * 2  # repeats: prompt lookup finds some
    expected = greedy_reference(model, prompt, 12)
    for k, proposer in ((1, draft), (4, draft), (3, None)):
        tokens, stats = speculative_generate(model, prompt, 12, k, proposer)
        assert tokens == expected, f"seed={seed}, k={k}"
        assert stats.target_passes + stats.accepted >= 12 >= stats.target_passes - 1 + stats.accepted
    with pytest.raises(ValueError, match="must be < the target's 2 layers"):
        early_exit_draft(model, 2)
