"""Learned sparse attention (chapter 19): DeepSeek V3.2's lightning indexer
scores every key cheaply, each query attends to its top-k keys only, through
MLA (chapter 14); GLM-5 does the same with another RoPE layout."""

from .attention import (
    DeepseekV32Attention,
    GlmMoeDsaAttention,
    SparseLatentAttention,
)
from .indexer import LightningIndexer, index_scores
from .topk import top_k, top_k_selection

__all__ = [
    "SparseLatentAttention",
    "DeepseekV32Attention",
    "GlmMoeDsaAttention",
    "LightningIndexer",
    "index_scores",
    "top_k",
    "top_k_selection",
]
