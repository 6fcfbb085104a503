"""The paged read without a gather equals the gather + block-diagonal-mask read (float64)."""

from __future__ import annotations

import warnings

import pytest
import torch

from attention_course.serving.paged_attention import paged_attention
from attention_course.serving.paged_cache import PagedKVCache


def _gather_read(q, cache, k, v):
    keys, values = cache.update(0, k, v)  # (1, H_kv, T_k, Dh), packed
    rep = q.shape[1] // keys.shape[1]
    keys, values = keys.repeat_interleave(rep, 1), values.repeat_interleave(rep, 1)
    mask = cache.mask(0, q.shape[2], keys.shape[2])
    return torch.nn.functional.scaled_dot_product_attention(q, keys, values, attn_mask=mask)


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
