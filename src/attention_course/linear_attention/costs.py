"""Counting the work: floating-point operations of the forms, per head, as the
context grows.

A multiply-add counts 2. Decoding one token with softmax attention reads every
cached key and value (4 t Dh for scores and the weighted sum at context t); a
delta-rule step touches its (Dk, Dv) state a fixed number of times, whatever t.
Training with chunks of L tokens does (L, L) matrix products inside each chunk
and carries the state between chunks: fewer sequential steps (T / L) for more
work per token (about L (Dk + Dv) more).
"""

from __future__ import annotations

import math

from ..validation import check_int


def softmax_decode_flops(context: int, head_dim: int) -> int:
    """One new token attending ``context`` cached keys and values: q . k for
    each, then the weighted sum."""
    check_int(context, "context")
    return 4 * context * head_dim


def delta_decode_flops(k_dim: int, v_dim: int) -> int:
    """One delta-rule step: decay S, predict k @ S, write beta k (v - k S)^T,
    read q @ S (about 4 passes over S)."""
    return 8 * k_dim * v_dim


def chunked_flops(length: int, chunk: int, k_dim: int, v_dim: int) -> int:
    """The chunked form over ``length`` tokens: per chunk two (L, L) score
    matrices (K K^T, Q K^T), the triangular solve and the masked product with
    the writes (L^2 Dv each), and three products with the state (L Dk Dv
    each)."""
    check_int(length, "length")
    check_int(chunk, "chunk")
    chunks, size = divmod(length, chunk)
    sizes = [chunk] * chunks + ([size] if size else [])
    return sum(
        2 * (2 * n * n * k_dim + 2 * n * n * v_dim + 3 * n * k_dim * v_dim)
        for n in sizes
    )


def sequential_steps(length: int, chunk: int) -> int:
    """How many steps must run one after the other: one per chunk (the state
    passes between them)."""
    return math.ceil(length / chunk)
