"""A paged read that does not gather: attention of a step's queries over the
key/value **pool**, through the block tables, as PagedAttention kernels do
(Kwon et al. 2023, section 4.1).

:meth:`PagedKVCache.update
<attention_course.serving.paged_cache.PagedKVCache.update>` copies every key of
every sequence of the step into one packed tensor, and the model then scores
each query against all of them, masking the other sequences' keys: O(T_new *
sum of lengths) work plus a copy of every cached key, each step. Here the keys
stay in the pool. A FlexAttention mask over the flat pool (num_blocks *
block_size slots) maps each slot, through the inverse of the query's sequence's
block table, to its position in that sequence, and lets the query see it when
the sequence holds it at a position <= the query's (attention-gym's
paged-attention example uses the same physical-to-logical map). Its block mask
skips every tile of slots no query of the tile may see (free blocks, other
sequences' blocks), which is what a paged kernel does by walking the block
table.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.nn.attention import flex_attention as _flex

from .paged_cache import PagedKVCache, inverse_tables, packed


def logical_blocks(cache: PagedKVCache) -> Tensor:
    """(S, num_blocks) the inverse of the step's block tables
    (:func:`~.paged_cache.inverse_tables`)."""
    return inverse_tables(
        [cache.tables[seq_id] for seq_id in cache.step.seq_ids],
        cache.allocator.num_blocks,
    )


def paged_attention(
    q: Tensor, cache: PagedKVCache, layer: int, *, scale: float | None = None
) -> Tensor:
    """Attention of the step's packed queries q (1, H, T_new, Dh) over
    ``layer``'s pool, without gathering:
    (1, H, T_new, Dv). Call after ``cache.update(layer, k, v)`` wrote the
    step's keys."""
    if cache.step is None:
        raise RuntimeError("call begin_step (and update) before a paged read")
    logical, size = logical_blocks(cache), cache.block_size
    # (T_new,)
    owner_q, pos_q = packed(
        torch.tensor(cache.step.new), torch.tensor(cache.step.starts)
    )
    if q.shape[2] != len(pos_q):
        raise ValueError(
            f"q has {q.shape[2]} tokens, the step packs {len(pos_q)}"
        )

    # pool slot -> its position in the query's sequence (if held): causal
    def own_past(b, h, q_idx, kv_idx):
        index = logical[owner_q[q_idx], kv_idx // size]
        return (index >= 0) & (index * size + kv_idx % size <= pos_q[q_idx])

    pools = (cache.keys[layer], cache.values[layer])
    # (1, H_kv, slots, Dh): views
    k, v = (
        pool.view(-1, *pool.shape[2:]).transpose(0, 1)[None] for pool in pools
    )
    mask = _flex.create_block_mask(
        own_past,
        None,
        None,
        q.shape[2],
        k.shape[2],
        device="cpu",
        BLOCK_SIZE=size,
    )
    return _flex.flex_attention(
        q,
        k.to(q.dtype),
        v.to(q.dtype),
        block_mask=mask,
        scale=scale,
        enable_gqa=q.shape[1] != k.shape[1],
    )
