"""Learned sparse attention (chapter 19): DeepSeek V3.2's lightning indexer
scores every key cheaply, each query attends to its top-k keys only, through
MLA (chapter 14); GLM-5 does the same with another RoPE layout. DeepSeek V4
attends over a sliding window plus compressed entries of older blocks, chosen
by an indexer in its CSA layers (:mod:`.compressed`)."""

from .attention import (
    DeepseekV32Attention,
    GlmMoeDsaAttention,
    SparseLatentAttention,
)
from .compressed import BlockCompressor, CompressedAttention, v4_layers
from .indexer import LightningIndexer, index_scores
from .topk import top_k, top_k_selection

__all__ = [
    "SparseLatentAttention",
    "DeepseekV32Attention",
    "GlmMoeDsaAttention",
    "CompressedAttention",
    "BlockCompressor",
    "v4_layers",
    "LightningIndexer",
    "index_scores",
    "top_k",
    "top_k_selection",
]
