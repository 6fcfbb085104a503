"""What one new token costs a layer of MLA, dense or sparse: multiply-adds and
bytes read, counted from the sizes.

Counts per query and per layer, in the absorbed form (chapter 14: every head
attends over the latents):
dense MLA scores T latents of C + R numbers and averages T latents of C
numbers, per head; sparse MLA does that for k latents only, after the indexer
scored all T keys (H_I heads of D_I numbers). The indexer is also linear in T,
but with a constant about H (2C + R) / (H_I D_I) times smaller: sparse wins
once T is well above k, and at the longest contexts the indexer's own cost is
what is left.
"""

from __future__ import annotations

from typing import NamedTuple

from ..validation import check_int


class SparseSizes(NamedTuple):
    """Sizes that decide the cost (DeepSeek V3.2's names): heads H, latent C,
    rotated key R, indexer heads H_I and their width D_I, top-k, and the bytes
    of one cached number in the latent and in the indexer's key."""

    heads: int
    latent: int
    rope: int
    index_heads: int
    index_dim: int
    top_k: int
    latent_bytes: float = 2  # bfloat16
    index_bytes: float = 1 + 4 / 128  # FP8, one float32 scale per block of 128


DEEPSEEK_V32 = SparseSizes(
    heads=128, latent=512, rope=64, index_heads=64, index_dim=128, top_k=2048
)


def dense_macs(sizes: SparseSizes, t: int) -> int:
    """Multiply-adds of one query of dense absorbed MLA over t keys: H (C + R)
    t for the scores, H C t after."""
    check_int(t, "t")
    return sizes.heads * (2 * sizes.latent + sizes.rope) * t


def indexer_macs(sizes: SparseSizes, t: int) -> int:
    """Multiply-adds of the indexer for one query over t keys (its head weights
    are negligible)."""
    check_int(t, "t")
    return sizes.index_heads * sizes.index_dim * t


def sparse_macs(sizes: SparseSizes, t: int) -> int:
    """The indexer over t keys, then dense MLA over min(k, t) of them."""
    return indexer_macs(sizes, t) + dense_macs(sizes, min(sizes.top_k, t))


def cache_bytes_per_token(sizes: SparseSizes) -> dict[str, float]:
    """Bytes one token leaves in one layer's cache: the latent and rotated key,
    and the indexer's key."""
    return {
        "latent": (sizes.latent + sizes.rope) * sizes.latent_bytes,
        "indexer key": sizes.index_dim * sizes.index_bytes,
    }
