"""Float64 NumPy reference implementation of attention: the ground truth of the
course.

Shape notation used everywhere in the course:
    B batch, T sequence length, D model width, H heads, Dh = D // H per-head
    width, Tq query positions, Tk key/value positions.
Mask convention: boolean, broadcastable to (..., Tq, Tk); True = "may attend".
A query row in which no key may be attended gets all-zero weights and a zero
output (never NaN).

Multi-head weights use the maths convention ``y = x @ W + b``: a projection
from d_in to d_out is stored as ``W`` of shape (d_in, d_out).
:func:`init_mha_params` creates such a dictionary; every framework
implementation in the package can load it, which is how the tests prove
cross-framework parity.
"""

from __future__ import annotations

import numpy as np

MHA_PARAM_NAMES = ("w_q", "b_q", "w_k", "b_k", "w_v", "b_v", "w_o", "b_o")


def softmax_unstable(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """Textbook softmax ``exp(x) / sum(exp(x))``; overflows to NaN for large
    inputs (shown in chapter 1)."""
    e = np.exp(x)
    return e / e.sum(axis=axis, keepdims=True)


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """Numerically stable softmax along ``axis``.

    Subtracting the row maximum leaves the result unchanged (softmax is
    shift-invariant) and keeps every exponent <= 0, so nothing overflows. Rows
    that are entirely ``-inf`` (fully masked) give all zeros.
    """
    x = np.asarray(x, dtype=np.float64)
    row_max = np.max(x, axis=axis, keepdims=True)
    row_max = np.where(np.isfinite(row_max), row_max, 0.0)
    e = np.exp(x - row_max)
    total = e.sum(axis=axis, keepdims=True)
    return np.divide(e, total, out=np.zeros_like(e), where=total > 0)


def scaled_dot_product_attention(q, k, v, mask=None):
    """Scaled dot-product attention ``softmax(q k^T / sqrt(Dk)) v``.

    Args:
        q: (..., Tq, Dk) queries.
        k: (..., Tk, Dk) keys.
        v: (..., Tk, Dv) values.
        mask: optional boolean array broadcastable to (..., Tq, Tk); True = may
            attend.

    Returns:
        (output, weights): output (..., Tq, Dv) and weights (..., Tq, Tk), both
        float64.
    """
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])  # (..., Tq, Tk)
    if mask is not None:
        mask = np.asarray(mask)
        if mask.dtype != np.bool_:
            raise TypeError(
                "mask must be boolean (True = may attend), got dtype "
                f"{mask.dtype}"
            )
        scores = np.where(mask, scores, -np.inf)
    weights = softmax(scores, axis=-1)
    return weights @ v, weights


def causal_mask(t_q: int, t_k: int | None = None) -> np.ndarray:
    """Boolean (Tq, Tk) mask in which query i may attend key j iff j <= i + (Tk
    - Tq).

    With Tq == Tk this is the lower triangle (each token sees itself and the
    past). With Tq < Tk the queries are taken to be the *last* Tq positions of
    the sequence, as when decoding with a KV cache.
    """
    t_k = t_q if t_k is None else t_k
    return np.tril(np.ones((t_q, t_k), dtype=bool), k=t_k - t_q)


def padding_mask(lengths, t: int) -> np.ndarray:
    """Boolean (B, 1, 1, T) key mask: key j of sequence b may be attended iff j
    < lengths[b]."""
    lengths = np.asarray(lengths)
    return (np.arange(t) < lengths[:, None])[:, None, None, :]


def split_heads(x: np.ndarray, num_heads: int) -> np.ndarray:
    """(B, T, D) -> (B, H, T, Dh)."""
    b, t, d = x.shape
    return x.reshape(b, t, num_heads, d // num_heads).transpose(0, 2, 1, 3)


def merge_heads(x: np.ndarray) -> np.ndarray:
    """(B, H, T, Dh) -> (B, T, D)."""
    b, h, t, dh = x.shape
    return x.transpose(0, 2, 1, 3).reshape(b, t, h * dh)


def init_mha_params(
    d_model: int,
    kdim: int | None = None,
    vdim: int | None = None,
    seed: int = 0,
) -> dict:
    """Random multi-head attention weights in the ``x @ W + b`` convention
    (float64).

    Returns a dict with w_q (d_model, d_model), w_k (kdim, d_model), w_v (vdim,
    d_model), w_o (d_model, d_model) and biases b_* of shape (d_model,).
    """
    rng = np.random.default_rng(seed)
    kdim = d_model if kdim is None else kdim
    vdim = d_model if vdim is None else vdim
    fan_in = {"q": d_model, "k": kdim, "v": vdim, "o": d_model}
    params = {}
    for name, d_in in fan_in.items():
        params[f"w_{name}"] = rng.normal(0.0, d_in**-0.5, size=(d_in, d_model))
        params[f"b_{name}"] = rng.normal(0.0, 0.1, size=(d_model,))
    return params


def multi_head_attention(
    query, key, value, params: dict, num_heads: int, mask=None
):
    """Multi-head attention with explicit weight matrices.

    Args:
        query: (B, Tq, Dq_in); key: (B, Tk, Dk_in); value: (B, Tk, Dv_in).
        params: dict as returned by :func:`init_mha_params`.
        num_heads: H; the model width D (columns of w_q) must be divisible by
            H.
        mask: optional boolean, broadcastable to (B, H, Tq, Tk); True = may
            attend.

    Returns:
        (output, weights): output (B, Tq, D) and per-head weights (B, H, Tq,
        Tk).
    """
    d_model = params["w_q"].shape[1]
    if d_model % num_heads:
        raise ValueError(
            f"d_model={d_model} is not divisible by num_heads={num_heads}"
        )
    # (B, H, Tq, Dh)
    q = split_heads(
        np.asarray(query, np.float64) @ params["w_q"] + params["b_q"],
        num_heads,
    )
    # (B, H, Tk, Dh)
    k = split_heads(
        np.asarray(key, np.float64) @ params["w_k"] + params["b_k"], num_heads
    )
    # (B, H, Tk, Dh)
    v = split_heads(
        np.asarray(value, np.float64) @ params["w_v"] + params["b_v"],
        num_heads,
    )
    # (B, H, Tq, Dh), (B, H, Tq, Tk)
    heads, weights = scaled_dot_product_attention(q, k, v, mask)
    return merge_heads(heads) @ params["w_o"] + params["b_o"], weights
