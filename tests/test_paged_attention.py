"""The paged reads without a gather (the block tables as a mask over the pool; FlexAttention over the pool) equal the
gather + block-diagonal-mask read (float64): ragged steps, forks with copy-on-write, shared prefixes, GQA, windows."""

from __future__ import annotations

import warnings

import pytest
import torch

from attention_course.serving import Engine, PagedKVCache, greedy_reference
from attention_course.serving.measure import allocated_peak
from attention_course.serving.paged_attention import paged_attention
from test_serving import tiny_gpt, workload


def _gather_read(q, cache, k, v, window=None):
    keys, values = cache.update(0, k, v)  # (1, H_kv, T_k, Dh): packed (gather) or the whole pool (blocks)
    rep = q.shape[1] // keys.shape[1]
    keys, values = keys.repeat_interleave(rep, 1), values.repeat_interleave(rep, 1)
    mask = cache.mask(0, q.shape[2], keys.shape[2], window=window)
    return torch.nn.functional.scaled_dot_product_attention(q, keys, values, attn_mask=mask)


STEPS = [[("a", 5), ("b", 11), ("c", 1)], [("a", 1), ("b", 3)], [("a", 1), ("c", 7), ("b", 1)], [("a", 2), ("e", 3)]]


def _run_steps(read, heads, kv_heads, block_size, window):
    """Every step's attention output through a cache read ``read``: d forks a (copy-on-write at its first
    write), e starts from a's first block (a shared prefix), d leaves after one step (its blocks are reused)."""
    torch.manual_seed(0)
    cache, outs = PagedKVCache(1, 24, block_size, kv_heads, 8, dtype=torch.float64, read=read), []
    for i, batch in enumerate(STEPS):
        for seq, _ in batch:
            if seq == "e":
                cache.add_sequence("e", cache.tables["a"][:1], block_size)
            elif seq not in cache.tables:
                cache.add_sequence(seq)
        if i == 1:
            cache.fork("a", "d")
            batch = batch + [("d", 2)]
        cache.begin_step(batch)
        t_new = sum(n for _, n in batch)
        q = torch.randn(1, heads, t_new, 8, dtype=torch.float64)
        k, v = (torch.randn(1, kv_heads, t_new, 8, dtype=torch.float64) for _ in range(2))
        outs.append(_gather_read(q, cache, k, v, window))
        cache.end_step()
        if i == 1:
            cache.free_sequence("d")
    return outs, cache


@pytest.mark.parametrize("window", [None, 3])
@pytest.mark.parametrize("heads,kv_heads,block_size", [(2, 2, 4), (4, 2, 8), (3, 1, 16)])
def test_blocks_read_equals_gather_read(heads, kv_heads, block_size, window):
    """read="blocks" hands the layer the pool (a view: nothing copied) and the block tables as its mask."""
    gathered, _ = _run_steps("gather", heads, kv_heads, block_size, window)
    in_place, cache = _run_steps("blocks", heads, kv_heads, block_size, window)
    for ours, expected in zip(in_place, gathered, strict=True):
        assert (ours - expected).abs().max() < 1e-12
    cache.begin_step([("a", 1)])
    keys, _ = cache.update(0, *(torch.zeros(1, kv_heads, 1, 8, dtype=torch.float64) for _ in range(2)))
    assert keys.untyped_storage().data_ptr() == cache.keys[0].untyped_storage().data_ptr()  # the pool itself
    assert cache.mask(0, 1, keys.shape[2]).shape == (1, 24 * block_size)


@pytest.mark.parametrize("prefix_sharing,num_blocks", [(False, 9), (True, 60)])  # 9 blocks: preemptions
def test_engine_tokens_unchanged_by_the_blocks_read(prefix_sharing, num_blocks):
    model = tiny_gpt(num_kv_heads=2)
    requests = workload(5, n=8, max_prompt=12, max_new=10, arrivals=0)
    for r in requests[1::2]:
        r.prompt = requests[0].prompt + r.prompt  # a common prefix to share
    expected = {r.id: greedy_reference(model, r.prompt, r.max_new_tokens) for r in requests}
    engine = Engine(model, num_blocks, 3, max_seqs=6, max_batch_tokens=16, prefix_sharing=prefix_sharing,
                    read="blocks")
    assert engine.run(requests) == expected
    assert engine.preemptions > 0 if num_blocks == 9 else engine.prefix_tokens_reused > 0


def test_unknown_read_is_refused():
    with pytest.raises(ValueError, match="read must be one of"):
        PagedKVCache(1, 4, 4, 1, 8, read="flex")


@pytest.mark.parametrize("heads,kv_heads,block_size", [(2, 2, 4), (4, 2, 8), (3, 1, 16)])
def test_paged_read_equals_gather_on_ragged_steps_with_fork(heads, kv_heads, block_size):
    torch.manual_seed(0)
    cache = PagedKVCache(1, 24, block_size, kv_heads, 8, dtype=torch.float64)
    steps = [[("a", 5), ("b", 11), ("c", 1)], [("a", 1), ("b", 3)], [("a", 1), ("c", 7), ("b", 1)]]
    for i, batch in enumerate(steps):
        for seq, _ in batch:
            if seq not in cache.tables:
                cache.add_sequence(seq)
        if i == 1:
            cache.fork("a", "d")  # shares a's blocks: d's first write copies its last block
            batch = batch + [("d", 2)]
        cache.begin_step(batch)
        t_new = sum(n for _, n in batch)
        q = torch.randn(1, heads, t_new, 8, dtype=torch.float64)
        k, v = (torch.randn(1, kv_heads, t_new, 8, dtype=torch.float64) for _ in range(2))
        expected = _gather_read(q, cache, k, v)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ours = paged_attention(q, cache, 0)
        assert (ours - expected).abs().max() < 1e-12
        cache.end_step()
        if i == 1:
            cache.free_sequence("d")  # as a preemption does: its blocks return to the pool


def test_paged_read_refuses_a_missing_step_and_a_wrong_query_count():
    cache = PagedKVCache(1, 4, 4, 1, 8)
    with pytest.raises(RuntimeError, match="begin_step"):
        paged_attention(torch.zeros(1, 1, 1, 8), cache, 0)
    cache.add_sequence("a")
    cache.begin_step([("a", 3)])
    with pytest.raises(ValueError, match="step packs 3"):
        paged_attention(torch.zeros(1, 1, 2, 8), cache, 0)


def test_allocated_peak_counts_what_a_step_holds_at_its_peak():
    def step():
        kept = torch.empty(1000, 1000)  # 4,000,000 bytes, held to the end
        temp = torch.empty(500, 1000)  # 2,000,000 bytes, freed before the next allocation
        del temp
        return kept, torch.empty(250, 1000)  # 1,000,000 more: peak 6,000,000 while temp lived

    assert allocated_peak(step) == 6_000_000
    assert allocated_peak(lambda: None) == 0
