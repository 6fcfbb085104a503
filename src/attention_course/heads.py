"""Splitting the model width D into H heads of Dh = D // H features, and
merging them back."""

from __future__ import annotations

from torch import Tensor

from .validation import check_heads, check_rank


def split_heads(x: Tensor, num_heads: int) -> Tensor:
    """(B, T, D) -> (B, H, T, Dh): head h gets features h*Dh .. (h+1)*Dh - 1 of
    every position.

    The reshape cuts D into (H, Dh); the transpose then moves the head axis in
    front of T, so that each (batch, head) pair holds a (T, Dh) matrix to
    attend over. Reshaping straight to (B, H, T, Dh) instead would scramble
    positions and features.
    """
    check_rank(x, "x", 3, "(B, T, D)")
    check_heads(x.size(-1), num_heads)
    return _split_heads(x, num_heads)


def _split_heads(x: Tensor, num_heads: int) -> Tensor:
    """:func:`split_heads` on inputs a module has checked already (validate at
    the edge, trust inside)."""
    b, t, d = x.shape
    # (B, T, H, Dh) -> (B, H, T, Dh)
    return x.reshape(b, t, num_heads, d // num_heads).transpose(1, 2)


def merge_heads(x: Tensor) -> Tensor:
    """(B, H, T, Dh) -> (B, T, D): the inverse of :func:`split_heads`, heads
    side by side in D = H * Dh."""
    check_rank(x, "x", 4, "(B, H, T, Dh)")
    return _merge_heads(x)


def _merge_heads(x: Tensor) -> Tensor:
    """:func:`merge_heads` on a (B, H, T, Dh) tensor a module made itself."""
    b, h, t, dh = x.shape
    # After the transpose the memory is no longer in (B, T, H, Dh) order, so
    # reshape (not view) must copy. (B, T, H, Dh) -> (B, T, D)
    return x.transpose(1, 2).reshape(b, t, h * dh)
