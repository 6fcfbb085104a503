"""Attention in linear time (chapter 17): linear attention as a recurrence, the
delta rule, Gated DeltaNet.

``rules``: the update, defined once per token, and its recurrent, chunked and
parallel forms; ``layer``:
:class:`GatedDeltaNet`, equal to transformers' ``Qwen3NextGatedDeltaNet``;
``kimi``: :class:`KimiDeltaAttention` (a decay per key channel), equal to
``KimiLinearDeltaAttention``; ``gated_attention``: Qwen3-Next's softmax layer
with its output gate; ``cache``: state and KV bytes of hybrid models. The
transformers reference lives in :mod:`attention_course.interop.hf_models`.
"""

from .cache import (
    HYBRIDS,
    HybridConfig,
    bytes_table,
    hybrid_bytes,
    state_bytes,
)
from .gated_attention import Qwen3NextAttention
from .kimi import KimiDeltaAttention
from .layer import DeltaNetState, GatedDeltaNet
from .rules import (
    chunk_parts,
    chunk_read,
    chunk_step,
    chunk_write,
    chunks_step,
    decay_matrix,
    decay_state,
    delta_step,
    elu_feature_map,
    gated_delta_chunked,
    gated_delta_parallel,
    gated_delta_recurrent,
    l2_normalize,
    linear_attention_parallel,
    linear_attention_recurrent,
    linear_step,
    normalize_qk,
    read,
)

__all__ = [
    "HYBRIDS",
    "HybridConfig",
    "bytes_table",
    "hybrid_bytes",
    "state_bytes",
    "Qwen3NextAttention",
    "DeltaNetState",
    "GatedDeltaNet",
    "KimiDeltaAttention",
    "chunk_parts",
    "chunk_read",
    "chunk_step",
    "chunk_write",
    "chunks_step",
    "decay_matrix",
    "decay_state",
    "delta_step",
    "elu_feature_map",
    "gated_delta_chunked",
    "gated_delta_parallel",
    "gated_delta_recurrent",
    "l2_normalize",
    "linear_attention_parallel",
    "linear_attention_recurrent",
    "linear_step",
    "normalize_qk",
    "read",
]
