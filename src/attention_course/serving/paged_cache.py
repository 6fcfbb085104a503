"""A paged KV cache (PagedAttention, Kwon et al. 2023): fixed-size blocks, a
free list, a block table per sequence.

Chapter 8's :class:`~attention_course.kv_cache.KVCache` gives every sequence
one contiguous buffer; a server that does not know how long an answer will be
must reserve the maximum length, and most of it stays empty. Here the memory is
a pool of ``num_blocks`` blocks of ``block_size`` positions each, per layer
``(num_blocks, block_size, H_kv, Dh)``. A sequence owns a **block table**, the
list of its blocks in order: its position ``p`` lives in slot ``table[p //
block_size] * block_size + p % block_size`` of the pool. A sequence takes a new
block only when its last one is full, so it wastes less than one block.

Blocks carry a **reference count**: two sequences may share a block (a common
prompt prefix, a forked sequence). A shared block is never written: the first
write into it copies it first (**copy-on-write**). A block returns to the free
list when its count falls to zero, never before.

:class:`PagedKVCache` follows the course's cache protocol
(:class:`~attention_course.kv_cache.Cache`): the course's attention layers and
:class:`~attention_course.gpt.GPT` use it unchanged. One forward pass runs one
**ragged batch**: the new tokens of several sequences packed in one row (1,
T_new, D) (no padding). :meth:`PagedKVCache.begin_step` says which sequences
and how many new tokens each; then every layer's :meth:`~PagedKVCache.update`
writes the new keys/values through the tables and gathers each sequence's keys
back, packed the same way; :meth:`~PagedKVCache.mask` keeps each query to its
own sequence (block-diagonal) and to its past (bottom-right causal within the
sequence), :meth:`~PagedKVCache.positions` gives each token its own position,
which the model feeds to its absolute embeddings and its RoPE alike.

That gather copies every cached key of every sequence of the step, in every
layer, at every step. With ``read="blocks"`` nothing is gathered:
:meth:`~PagedKVCache.update` returns the pool itself (a view, the keys stay
where they are) and :meth:`~PagedKVCache.mask` is the **block table as a mask
over the pool**: query i may see pool slot j when j's block is in the table of
i's sequence, at a position <= i's. The same attention layers run unchanged;
the keys are read in place, as a paged kernel reads them (Kwon et al. 2023,
section 4.1).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from ..kv_cache import Cache
from ..validation import check_int, check_rank


class OutOfBlocks(RuntimeError):
    """The pool has too few free blocks for a request; nothing was changed (the
    scheduler preempts)."""


class BlockAllocator:
    """A free list and a reference count per block of a pool of ``num_blocks``
    blocks."""

    def __init__(self, num_blocks: int):
        check_int(num_blocks, "num_blocks")
        self.num_blocks = num_blocks
        # pop() hands out block 0 first
        self.free = list(range(num_blocks - 1, -1, -1))
        self.refs = [0] * num_blocks

    @property
    def num_free(self) -> int:
        return len(self.free)

    def allocate(self) -> int:
        """A free block, now referenced once."""
        if not self.free:
            raise OutOfBlocks(f"all {self.num_blocks} blocks are in use")
        block = self.free.pop()
        self.refs[block] = 1
        return block

    def share(self, block: int) -> None:
        """One more reference to a block already in use."""
        self._check_used(block)
        self.refs[block] += 1

    def release(self, block: int) -> None:
        """Drop one reference; the block is free again only when none is
        left."""
        self._check_used(block)
        self.refs[block] -= 1
        if self.refs[block] == 0:
            self.free.append(block)

    def _check_used(self, block: int) -> None:
        if not isinstance(block, int) or not 0 <= block < self.num_blocks:
            raise ValueError(
                f"block must be an int in [0, {self.num_blocks}), got "
                f"{block!r}"
            )
        if self.refs[block] == 0:
            raise ValueError(
                f"block {block} is free: it has no reference to share or "
                "release"
            )


def slot(table: Sequence[int], position: int, block_size: int) -> int:
    """Index in the flat pool (num_blocks * block_size slots) of a sequence's
    ``position`` (also elementwise, for a tensor table and a tensor of
    positions)."""
    return table[position // block_size] * block_size + position % block_size


def packed(
    lengths: Tensor, starts: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """Sequences of ``lengths`` (S,) packed in one row: each entry's sequence
    index and its position in its sequence (counting from ``starts``, default
    0), both (sum of lengths,)."""
    owner = torch.repeat_interleave(torch.arange(len(lengths)), lengths)
    # (S,) where each sequence starts in the row
    first = torch.cumsum(lengths, 0) - lengths
    offset = -first if starts is None else starts - first
    return owner, torch.arange(int(lengths.sum())) + offset[owner]


def blocks_for(num_tokens: int, block_size: int) -> int:
    """Blocks needed to hold ``num_tokens`` positions (a ceiling division)."""
    return -(-num_tokens // block_size)


@dataclass
class Step:
    """The ragged batch of one forward pass: which sequences, their cached
    lengths and new token counts."""

    seq_ids: list
    starts: list[int]
    new: list[int]
    write_slots: Tensor  # (T_new,) pool slots of the new positions, packed
    # (T_k,) pool slots of every position of every sequence, packed (gather
    # read only)
    read_slots: Tensor | None
    # (T_new,) position of each new token in its own sequence
    positions: Tensor
    # (1, T_k) gather: each key's position; (T_new, slots) blocks: in the
    # query's sequence
    key_positions: Tensor
    # (T_new, T_k) or (T_new, slots) True = may attend: own sequence, own past
    mask: Tensor


READS = ("gather", "blocks")


def inverse_tables(tables: Sequence[Sequence[int]], num_blocks: int) -> Tensor:
    """(S, num_blocks) the inverse of S block tables: entry [s, b] is the index
    of pool block b in table s, -1 where s does not hold b. A block shared by
    several sequences (a common prefix, a fork) appears in each sharer's row,
    so each reads it at its own position."""
    logical = torch.full((len(tables), num_blocks), -1, dtype=torch.long)
    for s, table in enumerate(tables):
        logical[s, torch.tensor(table, dtype=torch.long)] = torch.arange(
            len(table)
        )
    return logical


class PagedKVCache(Cache):
    """Keys and values of many sequences in a pool of fixed-size blocks (see
    the module docstring).

    Args:
        num_layers: attention layers that write into the cache.
        num_blocks, block_size: the pool: ``num_blocks`` blocks of
            ``block_size`` positions.
        num_kv_heads, head_dim: H_kv and Dh of the keys (and of the values,
        unless ``value_dim`` differs:
            MLA's latent layer stores its latent as "keys" and its rotated key
            as "values"; 0 for a layer whose keys are its values, K = V,
            DeepSeek V4's).
        dtype, device: of the pool.
        read: "gather" (copy each sequence's keys out of the pool, packed) or
            "blocks" (read them in place: the pool itself and the block tables
            as a mask over it). Same attention, different cost; the attribute
            may change between steps (a benchmark reads one pool both ways).
    """

    def __init__(
        self,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype=torch.float32,
        device=None,
        value_dim: int | None = None,
        read: str = "gather",
    ):
        if read not in READS:
            raise ValueError(f"read must be one of {READS}, got read={read!r}")
        self.read = read
        value_dim = head_dim if value_dim is None else value_dim
        for name, value in (
            ("num_layers", num_layers),
            ("num_blocks", num_blocks),
            ("block_size", block_size),
            ("num_kv_heads", num_kv_heads),
            ("head_dim", head_dim),
        ):
            check_int(value, name)
        check_int(value_dim, "value_dim", minimum=0)
        self.num_layers, self.block_size = num_layers, block_size
        self.allocator = BlockAllocator(num_blocks)
        self.keys = [
            torch.zeros(
                num_blocks,
                block_size,
                num_kv_heads,
                head_dim,
                dtype=dtype,
                device=device,
            )
            for _ in range(num_layers)
        ]
        self.values = [
            torch.zeros(
                num_blocks,
                block_size,
                num_kv_heads,
                value_dim,
                dtype=dtype,
                device=device,
            )
            for _ in range(num_layers)
        ]
        self.tables: dict[Hashable, list[int]] = {}
        self.seq_lengths: dict[Hashable, int] = {}
        # (layer, seq): a recurrent layer's state
        self.states: dict[tuple[int, Hashable], object] = {}
        self.step: Step | None = None

    @classmethod
    def for_model(
        cls, model, num_blocks: int, block_size: int, read: str = "gather"
    ) -> PagedKVCache:
        """A pool shaped for a model that speaks the cache protocol
        (:class:`~attention_course.gpt.GPT`,
        :class:`~attention_course.decoder.Decoder`): ``model.blocks``, one per
        layer, each ``block.attn`` with a ``cache_shape()`` (what one position
        caches) unless it keeps a recurrent state; its dtype and device."""
        # recurrent layers keep states
        attn = next(
            b.attn for b in model.blocks if hasattr(b.attn, "cache_shape")
        )
        heads, key_dim, value_dim = attn.cache_shape()
        w = next(attn.parameters())
        return cls(
            len(model.blocks),
            num_blocks,
            block_size,
            heads,
            key_dim,
            w.dtype,
            w.device,
            value_dim,
            read,
        )

    def seq_len(self, seq=0) -> int:
        """Positions cached for sequence ``seq`` (one of the ids given to
        :meth:`add_sequence`)."""
        self._check_known(seq)
        return self.seq_lengths[seq]

    def segments(self, t_new: int) -> list[tuple]:
        """[(seq, start, end)] of the step's packed row."""
        self._check_step(t_new)
        ends = torch.tensor(self.step.new).cumsum(0).tolist()
        return [
            (seq, end - n, end)
            for seq, n, end in zip(
                self.step.seq_ids, self.step.new, ends, strict=True
            )
        ]

    def state(self, layer: int, seq=0):
        return self.states.get((layer, seq))

    def set_state(self, layer: int, state, t_new: int, seq=0) -> None:
        # the length advances in end_step, for every layer at once
        self.states[(layer, seq)] = state

    @property
    def num_free_blocks(self) -> int:
        return self.allocator.num_free

    # ------------------------------------------------------------ sequences

    def add_sequence(
        self,
        seq_id: Hashable,
        prefix_blocks: Sequence[int] = (),
        prefix_len: int = 0,
    ) -> None:
        """A new sequence, empty or starting with ``prefix_len`` positions
        already in ``prefix_blocks`` (shared:
        each gets one more reference)."""
        if seq_id in self.tables:
            raise ValueError(f"sequence {seq_id!r} is already in the cache")
        check_int(prefix_len, "prefix_len", minimum=0)
        if blocks_for(prefix_len, self.block_size) != len(prefix_blocks):
            raise ValueError(
                f"prefix_len={prefix_len} needs "
                f"{blocks_for(prefix_len, self.block_size)} blocks of "
                f"{self.block_size}, got {len(prefix_blocks)}"
            )
        for block in prefix_blocks:
            self.allocator.share(block)
        self.tables[seq_id] = list(prefix_blocks)
        self.seq_lengths[seq_id] = prefix_len

    def fork(self, parent: Hashable, child: Hashable) -> None:
        """A new sequence ``child`` sharing every block of ``parent`` (parallel
        sampling, beam search)."""
        self._check_known(parent)
        self.add_sequence(child, self.tables[parent], self.seq_lengths[parent])
        self.states |= {
            (layer, child): state
            for (layer, seq), state in self.states.items()
            if seq == parent
        }

    def free_sequence(self, seq_id: Hashable) -> None:
        """Forget a sequence: one reference less on each of its blocks."""
        self._check_known(seq_id)
        if self.step is not None and seq_id in self.step.seq_ids:
            raise RuntimeError(
                f"sequence {seq_id!r} is in the running step: call end_step "
                "first"
            )
        for block in self.tables.pop(seq_id):
            self.allocator.release(block)
        del self.seq_lengths[seq_id]
        self.states = {
            key: state
            for key, state in self.states.items()
            if key[1] != seq_id
        }

    def _check_known(self, seq_id: Hashable) -> None:
        if seq_id not in self.tables:
            raise KeyError(f"no sequence {seq_id!r} in the cache")

    # ------------------------------------------------------------ blocks for
    # the next tokens

    def blocks_needed(self, seq_id: Hashable, num_new: int) -> int:
        """Blocks that :meth:`reserve` would take for ``num_new`` more
        positions: new blocks past the table's end, plus a copy of each shared
        block the new positions would write into."""
        self._check_known(seq_id)
        table, start = self.tables[seq_id], self.seq_lengths[seq_id]
        first, last = (
            start // self.block_size,
            blocks_for(start + num_new, self.block_size),
        )
        shared = sum(self.allocator.refs[b] > 1 for b in table[first:last])
        return max(0, last - len(table)) + shared

    def reserve(self, seq_id: Hashable, num_new: int) -> None:
        """Make every block that positions ``len .. len + num_new - 1`` fall in
        exist and belong to this sequence
        alone: append new blocks, copy shared ones (copy-on-write). Raises
        :class:`OutOfBlocks`, changing nothing, if the pool has too few free
        blocks."""
        check_int(num_new, "num_new", minimum=0)
        if self.blocks_needed(seq_id, num_new) > self.allocator.num_free:
            raise OutOfBlocks(
                f"sequence {seq_id!r} needs "
                f"{self.blocks_needed(seq_id, num_new)} blocks for "
                f"{num_new} tokens, {self.allocator.num_free} are free"
            )
        table, start = self.tables[seq_id], self.seq_lengths[seq_id]
        for index in range(
            start // self.block_size,
            blocks_for(start + num_new, self.block_size),
        ):
            if index == len(table):
                table.append(self.allocator.allocate())
            elif self.allocator.refs[table[index]] > 1:
                table[index] = self.copy_block(table[index])

    def copy_block(self, block: int) -> int:
        """Copy-on-write: a fresh block with the same keys and values in every
        layer; the caller's reference moves from ``block`` to the copy."""
        new = self.allocator.allocate()
        for pool in self.keys + self.values:
            pool[new] = pool[block]
        self.allocator.release(block)
        return new

    # ------------------------------------------------------------ one ragged
    # forward pass

    def begin_step(self, batch: Sequence[tuple[Hashable, int]]) -> None:
        """Prepare a forward pass over the new tokens of several sequences,
        packed in this order:
        ``batch`` = [(seq_id, num_new), ...]. Reserves their blocks (all or
        none: :class:`OutOfBlocks`)."""
        if self.step is not None:
            raise RuntimeError(
                "a step is already running: call end_step (or abort_step) "
                "first"
            )
        ids = [seq_id for seq_id, _ in batch]
        if not batch or len(set(ids)) != len(ids):
            raise ValueError(
                f"batch must name each sequence once, at least one, got {ids}"
            )
        for seq_id, num_new in batch:
            self._check_known(seq_id)
            check_int(num_new, "num_new")
        needed = sum(
            self.blocks_needed(seq_id, num_new) for seq_id, num_new in batch
        )
        # checked before any block moves: a failed step changes nothing
        if needed > self.allocator.num_free:
            raise OutOfBlocks(
                f"the step needs up to {needed} blocks, "
                f"{self.allocator.num_free} are free"
            )
        for seq_id, num_new in batch:
            self.reserve(seq_id, num_new)
        self.step = self._plan(ids, [n for _, n in batch])
        self.states_before = dict(self.states)  # what abort_step restores

    def _plan(self, ids: list, new: list[int]) -> Step:
        """Slots, positions and mask of the step, with tensor operations (no
        Python loop over positions)."""
        starts = [self.seq_lengths[seq_id] for seq_id in ids]
        widest = max(len(self.tables[seq_id]) for seq_id in ids)
        tables = torch.tensor(
            [
                self.tables[seq_id] + [0] * (widest - len(self.tables[seq_id]))
                for seq_id in ids
            ]
        )
        start_t, new_t = torch.tensor(starts), torch.tensor(new)
        # (T_new,) each new token's sequence and position
        owner_q, positions = packed(new_t, start_t)
        write = (
            tables[owner_q, positions // self.block_size] * self.block_size
            + positions % self.block_size
        )
        if self.read == "blocks":
            return self._plan_blocks(
                ids, starts, new, write, positions, owner_q
            )
        # (T_k,) each key's sequence and position
        owner_k, key_positions = packed(start_t + new_t)
        read = (
            tables[owner_k, key_positions // self.block_size] * self.block_size
            + key_positions % self.block_size
        )
        same_seq = owner_q[:, None] == owner_k[None, :]
        # bottom-right: key position <= query's
        causal = key_positions[None, :] <= positions[:, None]
        return Step(
            ids,
            starts,
            new,
            write,
            read,
            positions,
            key_positions[None],
            same_seq & causal,
        )

    def _plan_blocks(
        self, ids, starts, new, write, positions, owner_q
    ) -> Step:
        """The block tables as a mask over the pool: slot j holds, for query
        i's sequence, the position index * block_size + j % block_size, where
        index is j's block's place in that sequence's table."""
        # (S, blocks)
        logical = inverse_tables(
            [self.tables[seq_id] for seq_id in ids], self.allocator.num_blocks
        )
        # (slots,)
        slots = torch.arange(
            self.allocator.num_blocks * self.block_size, dtype=torch.int32
        )
        # (T_new, slots): -1 where not the query's
        index = logical.int()[owner_q][:, slots // self.block_size]
        held = index >= 0
        # in place
        key_positions = (
            index.mul_(self.block_size)
            .add_(slots % self.block_size)
            .masked_fill_(~held, -1)
        )
        # own blocks, own past (bottom-right)
        mask = held & (key_positions <= positions[:, None])
        return Step(
            ids, starts, new, write, None, positions, key_positions, mask
        )

    def update(
        self, layer: int, k: Tensor, v: Tensor
    ) -> tuple[Tensor, Tensor]:
        """Write the new keys/values k, v (1, H_kv, T_new, Dh) of the step
        through the block tables; return every position of the step's
        sequences, gathered through the tables and packed: (1, H_kv, T_k, Dh);
        with ``read="blocks"`` the whole pool instead, a view (1, H_kv,
        num_blocks * block_size, Dh)."""
        if self.step is None:
            raise RuntimeError(
                "call begin_step before a forward pass through a paged cache"
            )
        if not 0 <= layer < self.num_layers:
            raise IndexError(
                f"layer {layer} out of range for a cache of "
                f"{self.num_layers} layers"
            )
        check_rank(k, "k", 4, "(1, H_kv, T_new, Dh)")
        h_kv, dk, dv = *self.keys[layer].shape[2:], self.values[layer].shape[3]
        expected, t_new = (
            (1, h_kv, len(self.step.write_slots), dk),
            len(self.step.write_slots),
        )
        if tuple(k.shape) != expected or tuple(v.shape) != (
            1,
            h_kv,
            t_new,
            dv,
        ):
            raise ValueError(
                f"k and v must have shape (1, H_kv, T_new, Dh) = {expected} "
                "for this step, got "
                f"{tuple(k.shape)} and {tuple(v.shape)}"
            )
        out = []
        for pool, new in ((self.keys[layer], k), (self.values[layer], v)):
            # (num_blocks * block_size, H_kv, Dh), a view (flatten, not
            # view(-1): an empty value pool, K = V, has no size to infer)
            flat = pool.flatten(0, 1)
            # (T_new, H_kv, Dh)
            flat[self.step.write_slots] = new[0].transpose(0, 1).to(pool.dtype)
            # blocks: no copy
            read = (
                flat
                if self.step.read_slots is None
                else flat[self.step.read_slots]
            )
            # (1, H_kv, T_k or slots, Dh)
            out.append(read.transpose(0, 1)[None])
        return out[0], out[1]

    def positions(self, layer: int, t_new: int, device=None) -> Tensor:
        """(T_new,) each new token's position in its own sequence."""
        self._check_step(t_new)
        return self.step.positions.to(device)

    def mask(
        self,
        layer: int,
        t_q: int,
        t_k: int,
        device=None,
        *,
        window: int | None = None,
    ) -> Tensor:
        """(T_new, T_k) True = may attend: a key of the query's own sequence at
        a position <= the query's (and, for a sliding layer, less than
        ``window`` positions back); with ``read="blocks"`` (T_new, slots), over
        the pool."""
        self._check_step(t_q)
        mask = self.step.mask
        if window is not None:
            mask = mask & (
                self.step.positions[:, None] - self.step.key_positions < window
            )
        return mask.to(device)

    def crop(self, length: int, seq=0) -> None:
        """Forget every position of sequence ``seq`` from ``length`` on; blocks
        past the end are released."""
        self._check_known(seq)
        check_int(length, "length", minimum=0)
        if length > self.seq_lengths[seq] or (
            length < self.seq_lengths[seq]
            and any(s == seq for _, s in self.states)
        ):
            raise ValueError(
                f"cannot crop to length={length}: sequence {seq!r} holds "
                f"{self.seq_lengths[seq]} "
                "positions (a recurrent state cannot drop any)"
            )
        table = self.tables[seq]
        for block in table[blocks_for(length, self.block_size) :]:
            self.allocator.release(block)
        del table[blocks_for(length, self.block_size) :]
        self.seq_lengths[seq] = length

    def _check_step(self, t_new: int) -> None:
        if self.step is None:
            raise RuntimeError(
                "call begin_step before a forward pass through a paged cache"
            )
        if t_new != len(self.step.write_slots):
            raise ValueError(
                f"the step packs {len(self.step.write_slots)} new tokens, "
                f"the forward pass has {t_new}"
            )

    def end_step(self) -> None:
        """The forward pass is done: the new positions now count as cached."""
        if self.step is None:
            raise RuntimeError("no step to end")
        for seq_id, n in zip(self.step.seq_ids, self.step.new, strict=True):
            self.seq_lengths[seq_id] += n
        self.step = None

    def abort_step(self) -> None:
        """Forget a step whose forward pass failed: lengths stay as they were
        (the reserved blocks stay with their sequences, ready for the retry),
        so nothing half-written is ever read; recurrent states are restored."""
        self.step = None
        self.states = self.states_before

    # ------------------------------------------------------------ reading

    def gather(self, seq_id: Hashable, layer: int) -> tuple[Tensor, Tensor]:
        """A sequence's cached keys and values of ``layer``, read through its
        table: (1, H_kv, len, Dh) each."""
        self._check_known(seq_id)
        table, n = self.tables[seq_id], self.seq_lengths[seq_id]
        # (len,)
        slots = slot(
            torch.tensor(table, dtype=torch.long),
            torch.arange(n),
            self.block_size,
        )
        return tuple(
            pool.flatten(0, 1)[slots].transpose(0, 1)[None]
            for pool in (self.keys[layer], self.values[layer])
        )

    def reset(self) -> None:
        """Free every sequence (the blocks return to the free list as their
        counts reach zero)."""
        self.step = None
        for seq_id in list(self.tables):
            self.free_sequence(seq_id)


def wasted_positions(
    lengths: Sequence[int],
    block_size: int | None = None,
    max_len: int | None = None,
) -> int:
    """Reserved but unused positions for sequences of ``lengths``: with a paged
    cache of ``block_size`` (the unfilled end of each last block) or with
    contiguous buffers of ``max_len`` each (everything past the end)."""
    if (block_size is None) == (max_len is None):
        raise ValueError(
            "give exactly one of block_size (paged) or max_len (contiguous)"
        )
    if max_len is not None:
        if max(lengths, default=0) > max_len:
            raise ValueError(
                f"a sequence of {max(lengths)} positions does not fit "
                f"max_len={max_len}"
            )
        return sum(max_len - n for n in lengths)
    check_int(block_size, "block_size")
    return sum(blocks_for(n, block_size) * block_size - n for n in lengths)
