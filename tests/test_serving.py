"""Chapter 18: the paged cache, continuous batching, shared prefixes and speculative decoding change the cost of
decoding, never the tokens. Workloads are drawn at test time (hypothesis picks the seed; a failure prints it)."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attention_course.gpt import GPT, GPTConfig
from attention_course.kv_cache import KVCache
from attention_course.masks import causal_mask
from attention_course.serving import (
    BlockAllocator,
    Engine,
    OutOfBlocks,
    PagedKVCache,
    PrefixIndex,
    Request,
    accept_probability,
    blocks_for,
    early_exit_draft,
    greedy_reference,
    output_distribution,
    prompt_lookup,
    residual_distribution,
    shared_prefix_attention,
    slot,
    speculative_generate,
    speculative_sample,
    wasted_positions,
)
from attention_course.serving.speculative import expected_speedup, expected_tokens_per_pass, fit_acceptance

VOCAB = 53
WORKLOADS = settings(max_examples=2, deadline=None, database=None)


def tiny_gpt(seed=0, num_kv_heads=None, d_model=24, num_heads=4, num_layers=2, positions="rope", max_len=256):
    """A random float64 GPT whose greedy tokens vary (untied head, PyTorch init: logits of order 1)."""
    config = GPTConfig(vocab_size=VOCAB, d_model=d_model, num_heads=num_heads, num_kv_heads=num_kv_heads,
                       num_layers=num_layers, positions=positions, init="pytorch", tie_embeddings=False,
                       max_len=max_len)
    return GPT(config, seed=seed).double().eval()


@pytest.fixture(scope="module")
def model():
    return tiny_gpt(num_kv_heads=2)


def workload(seed, n=7, max_prompt=14, max_new=9, arrivals=4):
    rng = random.Random(seed)
    return [Request(i, [rng.randrange(VOCAB) for _ in range(rng.randint(1, max_prompt))], rng.randint(1, max_new),
                    arrival=rng.randint(0, arrivals)) for i in range(n)]


def with_eos(requests, references):
    """Give every request the same end-of-sequence id: a token that request 0 produces in mid-answer."""
    out = references[requests[0].id]
    eos = out[len(out) // 2]
    for r in requests:
        r.eos_token_id = eos
    return {i: toks[: toks.index(eos) + 1] if eos in toks else toks for i, toks in references.items()}


def solo(model, requests):
    return {r.id: greedy_reference(model, r.prompt, r.max_new_tokens, r.eos_token_id) for r in requests}


def assert_all_free(cache):
    assert sum(cache.allocator.refs) == 0 and cache.num_free_blocks == cache.allocator.num_blocks
    assert not cache.tables


# ---------------------------------------------------------------- the paged cache


def test_slot_arithmetic():
    table = [7, 2, 5]
    assert [slot(table, p, 4) for p in (0, 3, 4, 9)] == [28, 31, 8, 21]
    assert [blocks_for(n, 4) for n in (0, 1, 4, 5)] == [0, 1, 1, 2]


@pytest.mark.parametrize("block_size", [1, 3, 64])
@pytest.mark.parametrize("num_kv_heads", [None, 2, 1])
def test_ragged_step_equals_each_sequence_alone(block_size, num_kv_heads):
    """One packed forward over three sequences (a prefill chunk, a decode, a first chunk) gives each sequence's
    logits as its own contiguous-cache forward: mask, positions and gathered keys are right."""
    model = tiny_gpt(seed=1, num_kv_heads=num_kv_heads)
    g = torch.Generator().manual_seed(0)
    seqs = [torch.randint(0, VOCAB, (1, n), generator=g) for n in (9, 6, 4)]
    cached, new = [5, 5, 0], [4, 1, 4]  # Tq != Tk: chunks are the last positions of their keys
    cache = PagedKVCache.for_model(model, num_blocks=40, block_size=block_size)
    refs = []
    for i, (ids, c) in enumerate(zip(seqs, cached, strict=True)):
        cache.add_sequence(i)
        if c:
            cache.begin_step([(i, c)])
            model(ids[:, :c], cache=cache)
            cache.end_step()
        refs.append(model(ids[:, : c + new[i]])[0, c:])  # no cache at all: the reference
    cache.begin_step([(i, n) for i, n in enumerate(new)])
    packed = torch.cat([ids[:, c : c + n] for ids, c, n in zip(seqs, cached, new, strict=True)], dim=1)
    logits = model(packed, cache=cache)[0]
    cache.end_step()
    torch.testing.assert_close(logits, torch.cat(refs), rtol=0, atol=1e-12)
    contiguous = KVCache(model.num_layers)
    model(seqs[0][:, :9], cache=contiguous)
    for layer in range(model.num_layers):
        torch.testing.assert_close(cache.gather(0, layer)[0], contiguous.keys[layer], rtol=0, atol=1e-12)


def test_fork_copy_on_write_and_reference_counts():
    model = tiny_gpt()
    cache = PagedKVCache.for_model(model, num_blocks=8, block_size=4)
    cache.add_sequence("a")
    ids = torch.randint(0, VOCAB, (1, 6), generator=torch.Generator().manual_seed(1))
    cache.begin_step([("a", 6)])
    model(ids, cache=cache)
    cache.end_step()
    keys_before = cache.gather("a", 0)[0].clone()
    cache.fork("a", "b")
    assert cache.tables["b"] == cache.tables["a"] and [cache.allocator.refs[b] for b in cache.tables["a"]] == [2, 2]
    assert cache.blocks_needed("b", 1) == 1  # the partial block 1 is shared: copy it before writing
    cache.begin_step([("b", 1)])
    model(torch.tensor([[3]]), cache=cache)
    cache.end_step()
    assert cache.tables["b"][0] == cache.tables["a"][0] and cache.tables["b"][1] != cache.tables["a"][1]
    torch.testing.assert_close(cache.gather("a", 0)[0], keys_before, rtol=0, atol=0)  # the parent is untouched
    torch.testing.assert_close(cache.gather("b", 0)[0][:, :, :6], keys_before, rtol=0, atol=0)
    assert cache.allocator.refs[cache.tables["a"][0]] == 2 and cache.allocator.refs[cache.tables["a"][1]] == 1
    cache.free_sequence("a")
    assert cache.allocator.refs[cache.tables["b"][0]] == 1  # still held by b: not freed
    cache.free_sequence("b")
    assert_all_free(cache)


def test_out_of_blocks_changes_nothing():
    model = tiny_gpt()
    cache = PagedKVCache.for_model(model, num_blocks=3, block_size=2)
    cache.add_sequence(0)
    cache.add_sequence(1)
    cache.begin_step([(0, 3)])
    model(torch.tensor([[1, 2, 3]]), cache=cache)
    cache.end_step()
    state = ({k: list(v) for k, v in cache.tables.items()}, dict(cache.seq_lengths), list(cache.allocator.refs))
    with pytest.raises(OutOfBlocks, match="needs up to 2 blocks, 1 are free"):
        cache.begin_step([(0, 1), (1, 3)])
    assert state == ({k: list(v) for k, v in cache.tables.items()}, dict(cache.seq_lengths),
                     list(cache.allocator.refs))
    assert cache.step is None


def test_failed_forward_leaves_lengths_unchanged():
    model = tiny_gpt()
    cache = PagedKVCache.for_model(model, num_blocks=4, block_size=2)
    cache.add_sequence(0)
    cache.begin_step([(0, 3)])
    with pytest.raises(ValueError, match="the step packs 3 new tokens, the forward pass has 2"):
        model(torch.tensor([[1, 2]]), cache=cache)
    cache.abort_step()
    assert cache.seq_len(0) == 0 and cache.seq_lengths == {0: 0}


@pytest.mark.parametrize("call,error,match", [
    (lambda c: c.begin_step([]), ValueError, "at least one"),
    (lambda c: c.begin_step([(0, 1), (0, 1)]), ValueError, "each sequence once"),
    (lambda c: c.begin_step([(9, 1)]), KeyError, "no sequence 9"),
    (lambda c: c.begin_step([(0, 0)]), ValueError, "num_new must be >= 1"),
    (lambda c: c.add_sequence(0), ValueError, "already in the cache"),
    (lambda c: c.add_sequence(5, [0], 3), ValueError, "prefix_len=3 needs 2 blocks of 2, got 1"),
    (lambda c: c.update(0, torch.zeros(1, 2, 1, 6), torch.zeros(1, 2, 1, 6)), RuntimeError, "begin_step"),
    (lambda c: c.free_sequence(7), KeyError, "no sequence 7"),
    (lambda c: c.allocator.release(3), ValueError, "block 3 is free"),
    (lambda c: c.allocator.share(-1), ValueError, "block must be an int"),
    (lambda c: c.end_step(), RuntimeError, "no step to end"),
])
def test_paged_cache_errors(call, error, match):
    cache = PagedKVCache.for_model(tiny_gpt(), num_blocks=4, block_size=2)
    cache.add_sequence(0)
    with pytest.raises(error, match=match):
        call(cache)


def test_bad_requests_are_refused():
    with pytest.raises(ValueError, match="may reach 12 tokens, longer than max_len=8"):
        Engine(tiny_gpt(positions="learned", max_len=8), 8, 2).add(Request(0, [1] * 9, 3))
    engine = Engine(tiny_gpt(positions=None), num_blocks=4, block_size=2, max_seqs=2, max_batch_tokens=4)
    for request, match in [(Request(0, [], 3), "non-empty"), (Request(0, [VOCAB], 3), "token ids in"),
                           (Request(0, [1], 0), "max_new_tokens must be >= 1"),
                           (Request(0, [1] * 6, 3), "may need 5 blocks, the cache has only 4")]:
        with pytest.raises(ValueError, match=match):
            engine.add(request)
    with pytest.raises(TypeError, match="request must be a Request"):
        engine.add((0, [1], 3))
    with pytest.raises(ValueError, match="max_batch_tokens=2 must be >= max_seqs=3"):
        Engine(tiny_gpt(), 4, 2, max_seqs=3, max_batch_tokens=2)
    assert_all_free(engine.cache)


def test_wasted_positions():
    assert wasted_positions([5, 8, 1], block_size=4) == 3 + 0 + 3
    assert wasted_positions([5, 8, 1], max_len=10) == 16
    with pytest.raises(ValueError, match="exactly one"):
        wasted_positions([1], 2, 3)


def test_kv_cache_crop():
    model = tiny_gpt(positions="rope")
    for max_len in (None, 12):
        cache = KVCache(model.num_layers, max_len=max_len)
        ids = torch.randint(0, VOCAB, (1, 8), generator=torch.Generator().manual_seed(2))
        model(ids, cache=cache)
        cache.crop(5)
        assert len(cache) == 5
        torch.testing.assert_close(model(ids[:, 5:], cache=cache), model(ids)[:, 5:], rtol=0, atol=1e-12)
        with pytest.raises(ValueError, match="cannot crop to length=9"):
            cache.crop(9)


# ---------------------------------------------------------------- continuous batching


@pytest.mark.parametrize("positions", ["learned", "sinusoidal", "rope", "alibi", None])
@given(seed=st.integers(0, 2**32 - 1))
@WORKLOADS
def test_engine_equals_solo_decoding_for_every_position_scheme(positions, seed):
    """Absolute positions come from the cache as RoPE's do: a packed row gives each token its own sequence's
    position (the sinusoidal model used to get len(cache), every sequence counted, and drifted)."""
    model = tiny_gpt(seed=seed % 7, positions=positions, max_len=32)
    requests = workload(seed, n=5, max_prompt=10, max_new=6)
    engine = Engine(model, num_blocks=40, block_size=3, max_seqs=3, max_batch_tokens=8)
    assert engine.run(requests) == solo(model, requests)
    assert_all_free(engine.cache)


@WORKLOADS
@given(seed=st.integers(0, 2**31 - 1))
@pytest.mark.parametrize("block_size", [1, 3, 64])  # 64: larger than any sequence
def test_engine_equals_solo_decoding(model, block_size, seed):
    requests = workload(seed)
    expected = with_eos(requests, solo(model, requests))
    engine = Engine(model, num_blocks=200 // block_size + 8, block_size=block_size, max_seqs=4, max_batch_tokens=6)
    out = engine.run(requests)
    assert out == expected, f"seed={seed}"
    assert engine.preemptions == 0 and max(len(h.batch) for h in engine.history) > 1
    assert any(n > 1 for h in engine.history for _, n in h.batch) and all(
        sum(n for _, n in h.batch) <= 6 for h in engine.history)  # chunked prefill under the token budget
    assert_all_free(engine.cache)


@WORKLOADS
@given(seed=st.integers(0, 2**31 - 1))
def test_preemption_and_resume(model, seed):
    requests = workload(seed, n=8, max_prompt=12, max_new=10, arrivals=0)
    expected = solo(model, requests)
    engine = Engine(model, num_blocks=9, block_size=3, max_seqs=6, max_batch_tokens=16)
    assert engine.run(requests) == expected, f"seed={seed}"
    assert engine.preemptions > 0, f"seed={seed}: the pool was not short"
    assert_all_free(engine.cache)


def test_static_batching_same_tokens_more_passes(model):
    requests = workload(3, n=8, arrivals=0)
    for r in requests[::2]:
        r.max_new_tokens = 1
    expected = solo(model, requests)
    engines = {p: Engine(model, 200, 4, max_seqs=4, max_batch_tokens=64, policy=p) for p in ("static", "continuous")}
    for engine in engines.values():
        assert engine.run(requests) == expected
        assert_all_free(engine.cache)
    assert engines["continuous"].forward_passes < engines["static"].forward_passes


# ---------------------------------------------------------------- shared prefixes


@WORKLOADS
@given(seed=st.integers(0, 2**31 - 1), block_size=st.sampled_from([1, 3]))
def test_prefix_sharing_full_and_no_hits(model, block_size, seed):
    rng = random.Random(seed)
    system = [rng.randrange(VOCAB) for _ in range(6)]  # a multiple of both block sizes
    requests = [Request(0, system, 4), Request(1, list(system), 5, arrival=3),  # a 100 % hit: copy-on-write
                Request(2, system + [rng.randrange(VOCAB) for _ in range(4)], 3, arrival=3),
                Request(3, [(system[0] + 1) % VOCAB] + system[1:], 4, arrival=3)]  # differs at token 0: no hit
    expected = solo(model, requests)
    engine = Engine(model, num_blocks=60, block_size=block_size, max_seqs=4, max_batch_tokens=8,
                    prefix_sharing=True)
    assert engine.run(requests) == expected, f"seed={seed}"
    assert engine.prefix_tokens_reused == 5 + 6, f"seed={seed}"  # 100 % hit computes its last token again
    engine.close()
    assert_all_free(engine.cache)


def test_prefix_index_match_insert_evict():
    cache = PagedKVCache(1, num_blocks=6, block_size=2, num_kv_heads=1, head_dim=2)
    index = PrefixIndex(cache)
    cache.add_sequence("a")
    cache.reserve("a", 5)
    index.insert([1, 2, 3, 4, 5], cache.tables["a"])
    assert len(index) == 2 and index.match([1, 2, 3, 4, 9]) == cache.tables["a"][:2]
    assert index.match([1, 3]) == [] and index.match([1, 2, 3]) == cache.tables["a"][:1]
    assert index.evict(2) == 0  # still used by "a"
    cache.free_sequence("a")
    first = index.match([1, 2])
    assert index.evict(1) == 1 and index.match([1, 2, 3, 4]) == first  # the longer prefix went first
    index.clear()
    assert_all_free(cache)
    with pytest.raises(TypeError, match="cache must be a PagedKVCache"):
        PrefixIndex(KVCache(1))


@pytest.mark.parametrize("b,h,t_q,s,p,d", [(1, 1, 1, 1, 1, 2), (3, 2, 2, 5, 7, 4), (2, 4, 5, 5, 3, 8)])
def test_shared_prefix_attention_equals_full_attention(b, h, t_q, s, p, d):
    g = torch.Generator().manual_seed(b + t_q)
    q = torch.randn(b, h, t_q, d, generator=g, dtype=torch.float64)
    kp, vp = (torch.randn(h, p, d, generator=g, dtype=torch.float64) for _ in range(2))
    ks, vs = (torch.randn(b, h, s, d, generator=g, dtype=torch.float64) for _ in range(2))
    k = torch.cat([kp.expand(b, h, p, d), ks], dim=2)
    v = torch.cat([vp.expand(b, h, p, d), vs], dim=2)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=causal_mask(t_q, p + s))
    torch.testing.assert_close(shared_prefix_attention(q, kp, vp, ks, vs), ref, rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="must be positions of the suffix"):
        shared_prefix_attention(q, kp, vp, ks[:, :, :0], vs[:, :, :0])


# ---------------------------------------------------------------- speculative decoding


@WORKLOADS
@given(seed=st.integers(0, 2**31 - 1))
def test_greedy_speculative_equals_plain_greedy(model, seed):
    draft = tiny_gpt(seed=seed % 1000, d_model=8, num_heads=2, num_layers=1)
    rng = random.Random(seed)
    prompt = [rng.randrange(VOCAB) for _ in range(rng.randint(1, 10))]
    expected = greedy_reference(model, prompt, 12)
    for k, proposer in ((1, draft), (4, draft), (3, None)):
        tokens, stats = speculative_generate(model, prompt, 12, k, proposer)
        assert tokens == expected, f"seed={seed}, k={k}"
        assert stats.target_passes + stats.accepted >= 12 >= stats.target_passes - 1 + stats.accepted
    eos = expected[len(expected) // 2]
    assert speculative_generate(model, prompt, 12, 3, draft, eos)[0] == expected[: expected.index(eos) + 1]


def test_a_perfect_draft_needs_few_target_passes(model):
    tokens, stats = speculative_generate(model, [1, 2, 3], 12, 4, draft=model)
    assert tokens == greedy_reference(model, [1, 2, 3], 12) and stats.acceptance_rate == 1
    assert stats.target_passes == 1 + 3  # prefill, then 5 tokens per pass: 1 + 5 + 5 + 1 (the last pass asks 1)


def test_early_exit_draft_is_the_targets_first_layers(model):
    draft = early_exit_draft(model, 1)
    assert draft.num_layers == 1 and torch.equal(draft.blocks[0].attn.w_q.weight, model.blocks[0].attn.w_q.weight)
    assert torch.equal(draft.head.weight, model.head.weight)
    with pytest.raises(ValueError, match="must be < the target's 2 layers"):
        early_exit_draft(model, 2)


def test_prompt_lookup():
    assert prompt_lookup([1, 2, 3, 9, 1, 2, 3], 2) == [9, 1]
    assert prompt_lookup([5, 6, 7, 5], 3) == [6, 7, 5]
    assert prompt_lookup([1, 2, 3], 2) == []


def random_distribution(g, v, zeros):
    d = torch.rand(v, generator=g, dtype=torch.float64) ** 3
    d[torch.randperm(v, generator=g)[:zeros]] = 0
    return d / d.sum()


@pytest.mark.parametrize("v,zeros", [(2, 0), (3, 1), (5, 2), (8, 0)])
def test_rejection_rule_keeps_the_target_distribution_exactly(v, zeros):
    g, worst = torch.Generator().manual_seed(v), 0.0
    for _ in range(20):
        p, q = random_distribution(g, v, zeros), random_distribution(g, v, zeros)
        torch.testing.assert_close(output_distribution(p, q), p, rtol=0, atol=1e-15)
        wrong = q * accept_probability(p, q) + (q * (1 - accept_probability(p, q))).sum() * p  # resample from p
        worst = max(worst, float((wrong - p).abs().max()))
    assert worst > 0.05  # the test can fail: without the residual the distribution is off
    torch.testing.assert_close(residual_distribution(p, p), p)


def test_speculative_sample_draws_from_the_target():
    g = torch.Generator().manual_seed(0)
    p = torch.tensor([0.5, 0.3, 0.15, 0.05], dtype=torch.float64)
    q = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)
    counts = torch.bincount(torch.tensor([speculative_sample(p, q, g) for _ in range(4000)]), minlength=4)
    assert (counts / 4000 - p).abs().sum() / 2 < 0.03  # total variation; the draft alone would be 0.45 off
    with pytest.raises(ValueError, match="p must be a probability distribution"):
        speculative_sample(p * 2, q, g)
    with pytest.raises(TypeError, match="q must be a 1-D floating-point tensor"):
        speculative_sample(p, [0.5, 0.5], g)


def test_allocator_hands_out_every_block_once():
    alloc = BlockAllocator(3)
    blocks = [alloc.allocate() for _ in range(3)]
    assert sorted(blocks) == [0, 1, 2]
    with pytest.raises(OutOfBlocks, match="all 3 blocks are in use"):
        alloc.allocate()
    alloc.share(1)
    alloc.release(1)
    assert alloc.num_free == 0
    alloc.release(1)
    assert alloc.num_free == 1 and alloc.allocate() == 1


# ---------------------------------------------------------------- the expected tokens per verify pass


def simulated_tokens_per_pass(alpha, k, passes, g):
    """Monte Carlo reference: each pass accepts proposals while independent coin flips (probability alpha) succeed,
    then yields the accepted ones plus the target's own token."""
    flips = torch.rand(passes, k, generator=g, dtype=torch.float64) < alpha  # (passes, k)
    accepted = flips.int().cumprod(dim=1).sum(dim=1)  # leading successes
    return float((accepted + 1).double().mean())


@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.68, 0.95, 1.0])
def test_expected_tokens_per_pass_matches_a_simulation_and_the_closed_form(alpha):
    g = torch.Generator().manual_seed(0)
    for k in (1, 3, 8):
        formula = expected_tokens_per_pass(alpha, k)
        assert abs(simulated_tokens_per_pass(alpha, k, 40000, g) - formula) < 0.05, (alpha, k)
        closed = k + 1 if alpha == 1 else (1 - alpha ** (k + 1)) / (1 - alpha)
        assert formula == pytest.approx(closed, rel=1e-12)
    assert expected_speedup(alpha, 3, 0.0) == expected_tokens_per_pass(alpha, 3)
    assert expected_speedup(alpha, 3, 1 / 3) == pytest.approx(expected_tokens_per_pass(alpha, 3) / 2)


def test_fit_acceptance_recovers_a_planted_alpha():
    ks = range(1, 9)
    for alpha in (0.2, 0.55, 0.68, 0.9):
        exact = [expected_tokens_per_pass(alpha, k) for k in ks]
        assert fit_acceptance(ks, exact) == pytest.approx(alpha, abs=1e-4)
    g = torch.Generator().manual_seed(1)
    measured = [simulated_tokens_per_pass(0.6, k, 4000, g) for k in ks]  # noisy, like a measured curve
    assert abs(fit_acceptance(ks, measured) - 0.6) < 0.02
    assert abs(fit_acceptance(ks, [k + 1 for k in ks]) - 1.0) < 1e-9  # every proposal accepted


@pytest.mark.parametrize("call, error, match", [
    (lambda: expected_tokens_per_pass(1.5, 3), ValueError, "alpha must be a probability in"),
    (lambda: expected_tokens_per_pass("0.5", 3), TypeError, "alpha must be a float"),
    (lambda: expected_tokens_per_pass(0.5, 0), ValueError, "k must be >= 1"),
    (lambda: expected_speedup(0.5, 3, -1), ValueError, "draft_cost must be a number >= 0"),
    (lambda: fit_acceptance([1, 2], [1.5]), ValueError, "of one length"),
    (lambda: fit_acceptance([1], [1.5], resolution=2), ValueError, "resolution must be in"),
])
def test_speculative_formula_refuses_bad_input(call, error, match):
    with pytest.raises(error, match=match):
        call()
