"""DeepSeek V4's compressed layers in the course's GPT and served by chapter 18's engine: a GPT mixing the sliding, CSA
and HCA kinds decodes through its cache equal to its full forward, and the engine (paged cache, several sequences in
one row, chunked prefill) gives every request the tokens of decoding it alone. Each compressor keeps one state per
sequence (the cache protocol's ``state``/``set_state`` per segment); planted mistakes show the tests can fail."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attention_course.gpt import GPT, GPTConfig
from attention_course.kv_cache import KVCache
from attention_course.serving import Engine, Request, greedy_reference
from attention_course.serving.paged_cache import PagedKVCache
from attention_course.sparse import compressed, v4_layers
from attention_course.sparse.compressed import BlockCompressor, CompressorState, own_entries

VOCAB = 40
RATES = {"csa": 2, "hca": 3}  # blocks shorter than the prompts and the prefill chunks, and not aligned to them


def v4_gpt(kinds=("sliding", "csa", "hca"), seed=0) -> GPT:
    """Three layers as V4 interleaves them: a window of 4, CSA's indexer (16 heads: no ReLU ties) picks 2 entries."""
    config = GPTConfig(vocab_size=VOCAB, d_model=16, num_heads=2, num_layers=len(kinds), positions=None,
                       init="pytorch", tie_embeddings=False)
    attention = v4_layers(kinds, head_dim=8, window=4, q_lora_rank=8, rope_dim=4, o_groups=2, o_lora_rank=4,
                          rates=RATES, index_heads=16, index_head_dim=4, top_k=2)
    return GPT(config, seed=seed, attention=attention).double().eval()


def prompts(lengths, seed=0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (2, t), generator=g) for t in lengths]


def workload(seed: int) -> list[Request]:
    rng = np.random.default_rng(seed)
    return [Request(i, rng.integers(0, VOCAB, int(rng.integers(1, 12))).tolist(), int(rng.integers(1, 8)),
                    arrival=int(rng.integers(0, 3))) for i in range(6)]


def solo(model, requests) -> dict:
    return {r.id: greedy_reference(model, r.prompt, r.max_new_tokens) for r in requests}


def prefill_splits(engine, requests) -> list[int]:
    """The lengths at which a prefill chunk ended inside its prompt (the engine preempted nobody)."""
    assert engine.preemptions == 0
    prompt, done, splits = {r.id: len(r.prompt) for r in requests}, dict.fromkeys(r.id for r in requests), []
    for report in engine.history:
        for seq, n in report.batch:
            done[seq] = (done[seq] or 0) + n
            splits += [done[seq]] if done[seq] < prompt[seq] else []
    return splits


# ------------------------------------------------------------------ the GPT decodes through its cache


def test_a_gpt_of_v4_layers_decodes_through_the_cache_as_its_full_forward():
    """Prompts of 1..7 tokens: the prefill ends before, on and after block boundaries (rates 2 and 3), then 9
    single-token steps complete more blocks; the tokens equal recomputing the whole sequence at every step."""
    model = v4_gpt()
    with torch.no_grad():
        for ids in prompts(range(1, 8)):
            assert torch.equal(model.generate(ids, 9), model.generate(ids, 9, use_cache=False)), ids.shape
        cache = KVCache(model.num_layers)
        model(prompts([7])[0], cache=cache)
    # K = V: one key per token, no values; each compressed layer keeps its compressors' state (complete blocks as
    # entries, the rest pending)
    assert cache.keys[0].shape == (2, 1, 7, 8) and cache.values[0].size(-1) == 0
    assert cache.state(0) is None
    assert cache.state(1)["entries"].entries.shape == (2, 3, 8) and cache.state(1)["index"].pending.size(1) == 1
    assert cache.state(2)["entries"].entries.shape == (2, 2, 8) and "index" not in cache.state(2)


def drop_the_tail(monkeypatch):
    """Planted: the compressor forgets the tokens of an incomplete block between calls."""
    forward = BlockCompressor.forward

    def forgetful(self, x, inv_freq, state=None):
        entries, state = forward(self, x, inv_freq, state)
        return entries, CompressorState(state.pending[:, :0], state.last_block, state.entries)

    monkeypatch.setattr(BlockCompressor, "forward", forgetful)


def test_decoding_notices_a_tail_not_carried_across_calls(monkeypatch):
    model = v4_gpt()
    drop_the_tail(monkeypatch)
    with torch.no_grad():
        differ = [not torch.equal(model.generate(ids, 9), model.generate(ids, 9, use_cache=False))
                  for ids in prompts(range(1, 8))]
    assert sum(differ) >= 3


def test_head_mask_and_weights_reach_the_compressed_layers():
    model = v4_gpt()
    ids = prompts([7])[0]
    with torch.no_grad():
        logits, weights = model(ids, return_weights=True)
        silenced = model(ids, head_mask=torch.zeros(3, 2))
        for block in model.blocks:
            block.attn.o_b_proj.weight.zero_()
        assert torch.allclose(silenced, model(ids), rtol=0, atol=1e-12)  # a zero head mask silences every layer
    # the keys, then the entries (7 // 2 and 7 // 3); a sink takes its share of each row
    assert [w.shape[-1] for w in weights] == [7, 7 + 3, 7 + 2]
    assert all((w.sum(-1) < 1).all() for w in weights)


# ------------------------------------------------------------------ served by the engine


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_engine_serves_v4_layers_as_they_decode_alone(seed):
    """Random workloads over block sizes 2..4 and 4..6 new tokens per step: prefills are cut into chunks that end
    inside compression blocks, several sequences share each step's row, and every request gets its solo tokens."""
    model = v4_gpt(seed=seed)
    requests = workload(seed)
    expected = solo(model, requests)
    for block_size, max_batch_tokens, read in ((2, 4, "gather"), (3, 5, "blocks"), (4, 6, "gather")):
        engine = Engine(model, num_blocks=60, block_size=block_size, max_seqs=3, max_batch_tokens=max_batch_tokens,
                        read=read)
        assert engine.run(requests) == expected, (block_size, max_batch_tokens, read)
        assert max(len(h.batch) for h in engine.history) > 1
        splits = prefill_splits(engine, requests)  # where a prompt's chunk ended before the prompt did
        assert any(s % RATES["csa"] for s in splits) and any(s % RATES["hca"] for s in splits), splits
    assert engine.cache.values[0].size(-1) == 0  # K = V in the pool too: the keys only


def share_the_state(monkeypatch):
    """Planted: one compressor state per layer for every sequence of the pool."""
    monkeypatch.setattr(PagedKVCache, "state", lambda self, layer, seq=0: self.states.get((layer, 0)))
    monkeypatch.setattr(PagedKVCache, "set_state",
                        lambda self, layer, state, t_new, seq=0: self.states.__setitem__((layer, 0), state))


def leak_entries(monkeypatch):
    """Planted: a query also sees every entry of the other sequences of its row."""
    def leaky(seen, segments):
        own = own_entries([torch.ones_like(s) for s in seen], segments)
        return own_entries(seen, segments) | ~own

    monkeypatch.setattr(compressed, "own_entries", leaky)


@pytest.mark.parametrize("plant", [share_the_state, leak_entries, drop_the_tail])
def test_each_planted_serving_mistake_changes_some_request(monkeypatch, plant):
    model = v4_gpt(seed=1)
    requests = workload(1)
    expected = solo(model, requests)
    plant(monkeypatch)
    engine = Engine(model, num_blocks=60, block_size=2, max_seqs=3, max_batch_tokens=4)
    served = engine.run(requests)
    assert sum(served[r.id] != expected[r.id] for r in requests) >= 2


def test_a_preempted_sequence_recomputes_its_compressors_from_scratch(monkeypatch):
    """A pool of 9 blocks of 2 preempts sequences: each is freed with its states and recomputed from its tokens
    alone; a pool that kept a preempted sequence's stale state (planted) would pool its blocks twice."""
    model, requests = v4_gpt(seed=3), workload(3)
    expected = solo(model, requests)
    engine = Engine(model, num_blocks=9, block_size=2, max_seqs=3, max_batch_tokens=5)
    assert engine.run(requests) == expected and engine.preemptions >= 3
    free = PagedKVCache.free_sequence

    def keeps_states(self, seq_id):
        states = dict(self.states)
        free(self, seq_id)
        self.states = states

    monkeypatch.setattr(PagedKVCache, "free_sequence", keeps_states)
    served = Engine(model, num_blocks=9, block_size=2, max_seqs=3, max_batch_tokens=5).run(requests)
    assert sum(served[r.id] != expected[r.id] for r in requests) >= 2


def test_compressor_states_are_per_sequence_and_cannot_be_shared_or_cropped():
    with pytest.raises(ValueError, match="kinds must name at least one of"):
        v4_layers(("sliding", "dense"), head_dim=8, window=4, q_lora_rank=8, rope_dim=4, o_groups=2, o_lora_rank=4)
    with pytest.raises(ValueError, match="nor a compressor's"):
        Engine(v4_gpt(), 8, 2, prefix_sharing=True)
    Engine(v4_gpt(("sliding",)), 8, 2, prefix_sharing=True)  # a sliding layer keeps keys only: shareable
    engine = Engine(v4_gpt(), num_blocks=8, block_size=2)
    cache = engine.cache
    for seq in ("a", "b"):
        cache.add_sequence(seq)
    cache.begin_step([("a", 5), ("b", 2)])
    with torch.no_grad():
        engine.model(torch.tensor([[1, 2, 3, 4, 5, 6, 7]]), cache=cache)
    cache.end_step()
    assert cache.state(0, "a") is None  # the sliding layer keeps none
    assert cache.state(2, "a")["entries"].entries.size(1) == 1 and cache.state(2, "b")["entries"].entries.size(1) == 0
    assert cache.state(1, "a")["entries"].pending.size(1) == 1 and cache.state(1, "b")["entries"].pending.size(1) == 0
    with pytest.raises(ValueError, match="a recurrent state cannot drop any"):
        cache.crop(3, "a")
    cache.begin_step([("a", 1)])
    with pytest.raises(ValueError, match="the step packs 1 new tokens"):
        engine.model(torch.tensor([[1, 2]]), cache=cache)
    cache.abort_step()
    # a step that fails after the CSA layer (1) has moved its state on, in the HCA layer (2): the state comes back
    engine.model.blocks[2].attn.output = lambda heads, rotary: 1 / 0
    cache.begin_step([("a", 1)])
    with pytest.raises(ZeroDivisionError):
        engine.model(torch.tensor([[1]]), cache=cache)
    assert cache.state(1, "a")["entries"].pending.size(1) == 0  # block 3 completed, in the failed step
    cache.abort_step()
    assert cache.state(1, "a")["entries"].pending.size(1) == 1 and cache.seq_len("a") == 5
