"""Shared prefixes: find the longest cached prefix of a prompt, and attend to a
shared prefix once.

Many requests start with the same tokens (a system prompt, few-shot examples, a
document asked several questions). Their keys and values at those positions are
the same (causality: a position sees only its past), so a server computes them
once. :class:`PrefixIndex` remembers the full blocks of prompts already
computed, keyed by the tokens up to the end of each block (RadixAttention,
Zheng et al. 2024, keeps the same map as a radix tree); a new prompt reuses the
longest chain of blocks whose tokens match its own, and the cache's reference
counts keep those blocks alive while anyone uses them. The index holds one
reference per block it remembers; :meth:`PrefixIndex.evict` drops the least
recently used blocks that nobody else uses when the pool runs short.

:func:`shared_prefix_attention` is the arithmetic of reading a shared prefix
once for a whole batch (cascade attention): the queries attend to the prefix
and to their own suffix separately, and chapter 9's online-softmax merge
(:mod:`attention_course.online_softmax`) combines the two parts by their
log-sum-exp: exactly full attention.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence

from torch import Tensor

from .. import online_softmax
from ..masks import causal_mask
from ..validation import check_rank
from .paged_cache import PagedKVCache


class PrefixIndex:
    """Full blocks of computed prompts, by the token prefix each one completes
    (see the module docstring)."""

    def __init__(self, cache: PagedKVCache):
        if not isinstance(cache, PagedKVCache):
            raise TypeError(
                f"cache must be a PagedKVCache, got {type(cache).__name__}"
            )
        self.cache = cache
        # least recently used first
        self.blocks: OrderedDict[tuple[int, ...], int] = OrderedDict()

    def __len__(self) -> int:
        return len(self.blocks)

    def match(self, tokens: Sequence[int]) -> list[int]:
        """Blocks holding the longest cached prefix of ``tokens`` (whole
        blocks: len(result) * block_size tokens); marks them recently used."""
        size, found = self.cache.block_size, []
        for end in range(size, len(tokens) + 1, size):
            key = tuple(tokens[:end])
            if key not in self.blocks:
                break
            self.blocks.move_to_end(key)
            found.append(self.blocks[key])
        return found

    def insert(self, tokens: Sequence[int], table: Sequence[int]) -> None:
        """Remember the full blocks of ``tokens`` (already computed, in the
        blocks of ``table``)."""
        size = self.cache.block_size
        for i in range(min(len(tokens) // size, len(table))):
            key = tuple(tokens[: (i + 1) * size])
            if key not in self.blocks:
                self.cache.allocator.share(table[i])
                self.blocks[key] = table[i]

    def evict(self, num_blocks: int) -> int:
        """Forget up to ``num_blocks`` blocks that only the index still holds
        (reference count 1): longest prefixes first, least recently used first
        among equal lengths; returns how many were freed."""
        refs, freed = self.cache.allocator.refs, 0
        # a longer prefix is useless without its start
        for key in sorted(self.blocks, key=len, reverse=True):
            if freed == num_blocks:
                break
            if refs[self.blocks[key]] == 1:
                self.cache.allocator.release(self.blocks.pop(key))
                freed += 1
        return freed

    def clear(self) -> None:
        """Forget everything (each remembered block loses the index's
        reference)."""
        while self.blocks:
            _, block = self.blocks.popitem()
            self.cache.allocator.release(block)


def shared_prefix_attention(
    q: Tensor,
    k_prefix: Tensor,
    v_prefix: Tensor,
    k_suffix: Tensor,
    v_suffix: Tensor,
) -> Tensor:
    """Attention of B sequences that share a prefix of P positions, reading the
    prefix once.

    q (B, H, Tq, Dh): the queries, the last Tq positions of each sequence's
    suffix; k_prefix, v_prefix (H, P, Dh), the same for every sequence;
    k_suffix, v_suffix (B, H, S, Dh), each sequence's own positions after the
    prefix (Tq <= S). Every query sees the whole prefix and its suffix up to
    itself (bottom-right causal). Returns (B, H, Tq, Dh), equal to causal
    attention over the concatenated keys.
    """
    check_rank(q, "q", 4, "(B, H, Tq, Dh)")
    check_rank(k_prefix, "k_prefix", 3, "(H, P, Dh)")
    check_rank(k_suffix, "k_suffix", 4, "(B, H, S, Dh)")
    if q.size(2) > k_suffix.size(2):
        raise ValueError(
            f"the Tq={q.size(2)} queries must be positions of the suffix of "
            f"S={k_suffix.size(2)}"
        )
    b, h, t_q, d = q.shape
    scale = 1 / math.sqrt(d)
    rows = online_softmax.init(
        (b, h, t_q), v_prefix.size(-1), dtype=q.dtype, device=q.device
    )
    # prefix: every query of every sequence against the one copy of the prefix,
    #     (B, H, Tq, P)
    online_softmax.merge(
        rows, q @ k_prefix.transpose(-2, -1) * scale, v_prefix
    )
    scores = q @ k_suffix.transpose(-2, -1) * scale  # (B, H, Tq, S)
    visible = causal_mask(t_q, k_suffix.size(2), device=q.device)
    online_softmax.merge(
        rows, scores.masked_fill(~visible, float("-inf")), v_suffix
    )
    return online_softmax.finish(rows)
