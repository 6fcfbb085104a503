"""Attention at serving time (chapter 18): a paged KV cache, continuous
batching, shared prefixes and speculative decoding, on the course's
:class:`~attention_course.gpt.GPT` and its cached attention. Each changes the
cost of decoding, never the tokens."""

from .paged_cache import (
    BlockAllocator,
    OutOfBlocks,
    PagedKVCache,
    blocks_for,
    slot,
    wasted_positions,
)
from .prefix import PrefixIndex, shared_prefix_attention
from .scheduler import Engine, Request, greedy_reference
from .speculative import (
    accept_probability,
    early_exit_draft,
    output_distribution,
    prompt_lookup,
    residual_distribution,
    speculative_generate,
    speculative_sample,
)

__all__ = [
    "BlockAllocator",
    "OutOfBlocks",
    "PagedKVCache",
    "blocks_for",
    "slot",
    "wasted_positions",
    "PrefixIndex",
    "shared_prefix_attention",
    "Engine",
    "Request",
    "greedy_reference",
    "accept_probability",
    "early_exit_draft",
    "output_distribution",
    "prompt_lookup",
    "residual_distribution",
    "speculative_generate",
    "speculative_sample",
]
