"""Attention, Step by Step."""

from . import native_libraries  # noqa: F401 - first: loads Triton's library before anything imports TensorFlow
from .einsum_attention import EinsumMultiHeadAttention, multi_head_attention_loop
from .functional import masked_softmax, scaled_dot_product_attention, sdpa_fast
from .heads import merge_heads, split_heads
from .masks import causal_mask, combine_masks, padding_mask
from .multi_head import MultiHeadAttention
from .single_head import SingleHeadAttention

__all__ = [
    "EinsumMultiHeadAttention",
    "MultiHeadAttention",
    "SingleHeadAttention",
    "causal_mask",
    "combine_masks",
    "masked_softmax",
    "merge_heads",
    "multi_head_attention_loop",
    "padding_mask",
    "scaled_dot_product_attention",
    "sdpa_fast",
    "split_heads",
]
