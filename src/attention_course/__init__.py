"""Attention, Step by Step."""

# first of all: the grader imports nothing from the current folder
from . import _safe_path  # noqa: F401, I001

# first: loads Triton's library before anything imports TensorFlow
from . import native_libraries  # noqa: F401
from .lazy_exports import lazy_exports as _lazy_exports

# The layers and functions below import torch when first used, not when the
# package is imported (see lazy_exports).
_LAZY = {
    "EinsumMultiHeadAttention": "einsum_attention",
    "multi_head_attention_loop": "einsum_attention",
    "masked_softmax": "functional",
    "scaled_dot_product_attention": "functional",
    "sdpa_fast": "functional",
    "merge_heads": "heads",
    "split_heads": "heads",
    "causal_mask": "masks",
    "combine_masks": "masks",
    "padding_mask": "masks",
    "MultiHeadAttention": "multi_head",
    "SingleHeadAttention": "single_head",
}
__getattr__, __dir__ = _lazy_exports(__name__, _LAZY)


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
