"""Attention, Step by Step."""

import importlib

from . import native_libraries  # noqa: F401 - first: loads Triton's library before anything imports TensorFlow

# The layers and functions below import torch when first used, not when the package is imported: the grader's
# processes import the package for its notebook handling and sandbox alone, several times per graded notebook.
_LAZY = {
    "EinsumMultiHeadAttention": "einsum_attention", "multi_head_attention_loop": "einsum_attention",
    "masked_softmax": "functional", "scaled_dot_product_attention": "functional", "sdpa_fast": "functional",
    "merge_heads": "heads", "split_heads": "heads",
    "causal_mask": "masks", "combine_masks": "masks", "padding_mask": "masks",
    "MultiHeadAttention": "multi_head",
    "SingleHeadAttention": "single_head",
}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    globals()[name] = value  # once: the next lookup finds it
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


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
