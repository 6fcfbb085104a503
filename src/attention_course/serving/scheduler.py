"""Continuous batching (Orca, Yu et al. 2022) over a paged KV cache, with
chunked prefill (Sarathi-Serve).

A server holds many requests at different stages: some still reading their
prompt (prefill), most producing one token per step (decode). **Static
batching** takes a group of requests, runs them together until the longest is
done and only then takes the next group: a finished sequence stays in the batch
as padding, and new requests wait. **Continuous batching** decides at every
step (iteration-level scheduling): finished sequences leave at once, waiting
ones join as soon as there is room. Each step is one forward pass over one
*ragged* batch: the new tokens of every scheduled sequence packed in one row
(no padding), attending through the
:class:`~attention_course.serving.paged_cache.PagedKVCache` (block-diagonal,
bottom-right causal mask).

The step, in :meth:`Engine.step`:

1. admit waiting requests that have arrived while fewer than ``max_seqs`` run;
   with a :class:`~attention_course.serving.prefix.PrefixIndex`, a request
   starts from its longest cached prefix (at least its last prompt token is
   always computed: its logits choose the first new token);
2. give each running sequence its next tokens under a budget of
   ``max_batch_tokens`` per step: one token for a decoding sequence, a *chunk*
   of the prompt for one in prefill (a long prompt takes several steps; its
   chunk's queries are the last of its keys: bottom-right causal, chapter 8's
   convention);
3. reserve the blocks; if the pool is short, first forget cached prefixes
   nobody uses, then **preempt** the most recently admitted sequence: its
   blocks are freed and it goes back to the front of the queue with its prompt
   and the tokens generated so far; when it is admitted again it recomputes
   them (preemption by *recompute*, not swap: nothing is copied out; the tokens
   it already produced stay, and greedy decoding continues exactly);
4. run the forward pass; a sequence whose pending tokens are all computed gets
   its next token (greedy argmax); one that produced its end-of-sequence token
   or its last allowed token leaves the batch and frees its blocks.

``policy="static"`` is the baseline: a new group is admitted only when the
whole previous group is done, and a finished sequence stays in the batch (its
further tokens are computed and thrown away).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field

import torch

from ..validation import check_int
from .paged_cache import OutOfBlocks, PagedKVCache, blocks_for
from .prefix import PrefixIndex

POLICIES = ("continuous", "static")


@dataclass
class Request:
    """A prompt (token ids), how many tokens at most to generate, an optional
    end-of-sequence id, and the step at which the request arrives."""

    id: Hashable
    prompt: list[int]
    max_new_tokens: int
    eos_token_id: int | None = None
    arrival: int = 0


@dataclass
class Running:
    """A request in the engine: its tokens so far (prompt, then generated), how
    many are in the cache."""

    request: Request
    tokens: list[int]
    computed: int = 0
    output: list[int] = field(default_factory=list)
    done: bool = False
    indexed: bool = False

    @property
    def id(self) -> Hashable:
        return self.request.id

    def finished_by(self, token: int) -> bool:
        r = self.request
        return token == r.eos_token_id or len(self.output) == r.max_new_tokens


@dataclass
class StepReport:
    """What one step did: the ragged batch [(id, new tokens)], and who joined,
    left or was preempted."""

    batch: list[tuple[Hashable, int]]
    admitted: list = field(default_factory=list)
    retired: list = field(default_factory=list)
    preempted: list = field(default_factory=list)


class Engine:
    """Serve :class:`Request` s with any model that speaks the cache protocol:
    a :class:`~attention_course.gpt.GPT` (any positions, any attention layer)
    or a :class:`~attention_course.decoder.Decoder` (SmolLM2).

    Args:
        model: the model: ``model(ids, cache=cache)`` -> logits (1, T, V),
            ``model.blocks`` (one per layer, see
            :meth:`PagedKVCache.for_model`), ``model.vocab_size``; its forward
            pass runs once per step.
        num_blocks, block_size: the paged cache's pool.
        max_seqs: sequences in the batch at most.
        max_batch_tokens: new tokens per step at most (prefill chunks share it
            with decoding tokens).
        prefix_sharing: reuse cached prompt prefixes
            (:class:`~attention_course.serving.prefix.PrefixIndex`).
        policy: "continuous" or "static" (see the module docstring).
        read: how attention reads the cache, "gather" or "blocks"
            (:class:`PagedKVCache`): same tokens.
    """

    def __init__(
        self,
        model,
        num_blocks: int,
        block_size: int,
        max_seqs: int = 8,
        max_batch_tokens: int = 64,
        prefix_sharing: bool = False,
        policy: str = "continuous",
        read: str = "gather",
    ):
        check_int(max_seqs, "max_seqs")
        check_int(max_batch_tokens, "max_batch_tokens")
        if max_batch_tokens < max_seqs:
            raise ValueError(
                f"max_batch_tokens={max_batch_tokens} must be >= "
                f"max_seqs={max_seqs}: every "
                "decoding sequence needs one token per step"
            )
        if policy not in POLICIES:
            raise ValueError(
                f"policy must be one of {POLICIES}, got policy={policy!r}"
            )
        if prefix_sharing and any(
            keeps_state(block.attn) for block in model.blocks
        ):
            raise ValueError(
                "prefix sharing reuses cached keys and values: a recurrent "
                "layer's state cannot be shared (nor a compressor's)"
            )
        self.model = model.eval()
        self.cache = PagedKVCache.for_model(
            model, num_blocks, block_size, read
        )
        self.index = PrefixIndex(self.cache) if prefix_sharing else None
        self.max_seqs, self.max_batch_tokens, self.policy = (
            max_seqs,
            max_batch_tokens,
            policy,
        )
        self.waiting: deque[Running] = deque()
        self.running: list[Running] = []
        self.finished: dict[Hashable, list[int]] = {}
        self.clock = 0
        self.forward_passes = self.preemptions = self.prefix_tokens_reused = 0
        self.history: list[StepReport] = []

    # ------------------------------------------------------------ requests in
    # and out

    def add(self, request: Request) -> None:
        """Queue a request (checked now: a bad one never reaches the cache)."""
        if not isinstance(request, Request):
            raise TypeError(
                f"request must be a Request, got {type(request).__name__}"
            )
        known = (
            {s.id for s in self.waiting}
            | {s.id for s in self.running}
            | set(self.finished)
        )
        if request.id in known:
            raise ValueError(
                f"request id {request.id!r} is already in the engine"
            )
        if not request.prompt or not all(
            isinstance(t, int) and 0 <= t < self.model.vocab_size
            for t in request.prompt
        ):
            raise ValueError(
                f"request {request.id!r}: prompt must be a non-empty list "
                "of token ids in "
                f"[0, {self.model.vocab_size})"
            )
        check_int(request.max_new_tokens, "max_new_tokens")
        check_int(request.arrival, "arrival", minimum=0)
        longest, limit = (
            len(request.prompt) + request.max_new_tokens,
            position_limit(self.model),
        )
        if limit is not None and longest > limit:
            raise ValueError(
                f"request {request.id!r} may reach {longest} tokens, longer "
                "than max_len="
                f"{limit} (learned positions have no vector beyond it)"
            )
        needed = blocks_for(longest, self.cache.block_size)
        if needed > self.cache.allocator.num_blocks:
            raise ValueError(
                f"request {request.id!r} may need {needed} blocks, the "
                "cache has only "
                f"{self.cache.allocator.num_blocks}"
            )
        self.waiting.append(Running(request, list(request.prompt)))

    def run(
        self, requests: Iterable[Request], max_steps: int = 100_000
    ) -> dict[Hashable, list[int]]:
        """Serve every request to the end; returns the generated tokens of
        each, by id."""
        for request in sorted(requests, key=lambda r: r.arrival):
            self.add(request)
        while self.waiting or self.running:
            if len(self.history) >= max_steps:
                raise RuntimeError(
                    f"not done after max_steps={max_steps} steps"
                )
            self.step()
        return self.finished

    # ------------------------------------------------------------ one step

    @torch.no_grad()
    def step(self) -> StepReport:
        """Admit, schedule, run one forward pass, retire (see the module
        docstring)."""
        report = StepReport(batch=[], admitted=self._admit())
        plan = self._schedule(report)
        if plan:
            self._forward(plan, report)
        self.clock += 1
        self.history.append(report)
        return report

    def _admit(self) -> list:
        if self.policy == "static" and self.running:
            # static batching: the next group waits for the whole current one
            return []
        admitted = []
        while (
            self.waiting
            and len(self.running) < self.max_seqs
            and self.waiting[0].request.arrival <= self.clock
            and self._fits(self.waiting[0])
        ):
            seq = self.waiting.popleft()
            self._start(seq)
            self.running.append(seq)
            admitted.append(seq.id)
        return admitted

    def _fits(self, seq: Running) -> bool:
        """Admit only what the free blocks can hold (else it would be preempted
        at once); alone, always."""
        cached = (
            len(self.index.match(seq.tokens)) if self.index is not None else 0
        )
        return (
            not self.running
            or blocks_for(len(seq.tokens), self.cache.block_size) - cached
            <= self.cache.num_free_blocks
        )

    def _start(self, seq: Running) -> None:
        """Put a sequence in the cache, starting from its longest cached
        prefix, if any."""
        size = self.cache.block_size
        blocks = self.index.match(seq.tokens) if self.index is not None else []
        # the last token must run: it predicts the next
        cached = min(len(blocks) * size, len(seq.tokens) - 1)
        self.cache.add_sequence(
            seq.id, blocks[: blocks_for(cached, size)], cached
        )
        seq.computed = cached
        self.prefix_tokens_reused += cached

    def _schedule(self, report: StepReport) -> list[tuple[Running, int]]:
        """The step's ragged batch, with its blocks reserved (preempting if the
        pool is short)."""
        while True:
            budget, plan = self.max_batch_tokens, []
            for seq in self.running:
                n = min(len(seq.tokens) - seq.computed, budget)
                if n:
                    plan.append((seq, n))
                    budget -= n
            if not plan:
                return plan
            batch = [(seq.id, n) for seq, n in plan]
            try:
                self.cache.begin_step(batch)
                report.batch = batch
                return plan
            except OutOfBlocks:
                needed = (
                    sum(self.cache.blocks_needed(i, n) for i, n in batch)
                    - self.cache.num_free_blocks
                )
                if self.index is not None and self.index.evict(needed):
                    continue
                if len(self.running) == 1:
                    raise
                self._preempt(self.running[-1], report)

    def _preempt(self, seq: Running, report: StepReport) -> None:
        """Free a sequence's blocks; it waits at the front of the queue and
        will recompute its tokens."""
        self.cache.free_sequence(seq.id)
        self.running.remove(seq)
        seq.computed, seq.indexed = 0, False
        self.waiting.appendleft(seq)
        self.preemptions += 1
        report.preempted.append(seq.id)

    def _forward(
        self, plan: list[tuple[Running, int]], report: StepReport
    ) -> None:
        ids = [
            t
            for seq, n in plan
            for t in seq.tokens[seq.computed : seq.computed + n]
        ]
        try:
            # (1, T_new, V)
            logits = self.model(torch.tensor([ids]), cache=self.cache)
        except BaseException:
            # lengths unchanged: the half-written positions are never read
            self.cache.abort_step()
            raise
        self.cache.end_step()
        self.forward_passes += 1
        end = -1
        for seq, n in plan:
            end += n
            seq.computed += n
            # all its pending tokens ran: the last row predicts the next
            if seq.computed == len(seq.tokens):
                self._emit(seq, int(logits[0, end].argmax()), report)
        if self.policy == "static" and all(seq.done for seq in self.running):
            for seq in list(self.running):
                self._retire(seq, report)

    def _emit(self, seq: Running, token: int, report: StepReport) -> None:
        if (
            self.index is not None
            and not seq.indexed
            and seq.computed >= len(seq.request.prompt)
        ):
            self.index.insert(seq.request.prompt, self.cache.tables[seq.id])
            seq.indexed = True
        seq.tokens.append(token)
        if seq.done:
            # static batching: a finished sequence still runs, its tokens
            # thrown away
            return
        seq.output.append(token)
        if seq.finished_by(token):
            seq.done = True
            self.finished[seq.id] = seq.output
            if self.policy == "continuous":
                self._retire(seq, report)

    def _retire(self, seq: Running, report: StepReport) -> None:
        self.cache.free_sequence(seq.id)
        self.running.remove(seq)
        report.retired.append(seq.id)

    def close(self) -> None:
        """Forget the prefix index (after the last request every block is then
        free again)."""
        if self.index is not None:
            self.index.clear()


def keeps_state(attn) -> bool:
    """Whether a layer keeps a state per sequence in the cache: a recurrent
    layer (no keys: no ``cache_shape``) or one that says so
    (``keeps_state``: V4's compressors)."""
    return getattr(attn, "keeps_state", not hasattr(attn, "cache_shape"))


def position_limit(model) -> int | None:
    """The longest sequence a model can place: ``max_len`` for learned
    positions, else none (RoPE, ALiBi)."""
    config = getattr(model, "config", None)
    return (
        config.max_len
        if getattr(config, "positions", None) == "learned"
        else None
    )


def greedy_reference(
    model,
    prompt: list[int],
    max_new_tokens: int,
    eos_token_id: int | None = None,
) -> list[int]:
    """The tokens of one request decoded alone with the course's
    :meth:`GPT.iter_generate` (chapter 8's cache), stopped after the
    end-of-sequence token: what the engine must reproduce for every request."""
    out = []
    for next_ids, _ in model.iter_generate(
        torch.tensor([prompt]), max_new_tokens
    ):
        out.append(int(next_ids))
        if out[-1] == eos_token_id:
            break
    return out
