"""Positions for attention: sinusoidal, learned, rotary (RoPE) and ALiBi.

Attention compares every query with every key by content alone: without
positions, permuting the input tokens permutes the outputs the same way
(self-attention is permutation-equivariant). Two families fix that:

* **absolute** positions, added to the token embeddings before the first layer:
  the fixed sinusoids of Vaswani et al. (2017), :func:`sinusoidal_positions`,
  or a learned table (GPT-2), :class:`LearnedPositions`;
* **relative** positions, inside every attention layer: rotary embeddings
  (RoFormer, Su et al. 2021), :func:`apply_rope`, rotate queries and keys so
  that a score depends on ``m - n`` only; ALiBi (Press et al. 2022),
  :func:`alibi_bias`, adds ``-slope * distance`` to the scores.

Shapes: ``(..., T, Dh)`` per-head tensors; positions are integers of shape (T,)
or broadcastable batch shapes.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor, nn

from .functional import attend
from .masks import query_key_lengths
from .validation import (
    INTEGER_DTYPES,
    broadcast_shape,
    broadcasts_to,
    check_attention_inputs,
    check_int,
)

PAIRINGS = ("interleaved", "halves")


# ---------------------------------------------------------------- checks


def check_base(base) -> None:
    """Raise unless base is a finite real number > 1 (frequencies base^(-2i/d)
    must decrease)."""
    if not isinstance(base, int | float) or isinstance(base, bool):
        raise TypeError(f"base must be a float, got {type(base).__name__}")
    if not math.isfinite(base) or base <= 1:
        raise ValueError(f"base must be finite and > 1, got base={base}")


def check_pairing(pairing) -> None:
    """Raise ValueError unless pairing names one of the two RoPE feature
    layouts."""
    if pairing not in PAIRINGS:
        raise ValueError(
            f"pairing must be one of {PAIRINGS}, got pairing={pairing!r}"
        )


def check_frequencies(inv_freq, dim: int) -> None:
    """Raise unless inv_freq is a float tensor of dim // 2 frequencies (one per
    rotated pair)."""
    if not isinstance(inv_freq, Tensor) or not inv_freq.is_floating_point():
        got = (
            inv_freq.dtype
            if isinstance(inv_freq, Tensor)
            else type(inv_freq).__name__
        )
        raise TypeError(f"inv_freq must be a float tensor, got {got}")
    if tuple(inv_freq.shape) != (dim // 2,):
        raise ValueError(
            "inv_freq must hold one frequency per pair, shape "
            f"({dim // 2},) for Dh={dim}, "
            f"got {tuple(inv_freq.shape)}"
        )


def check_positions(positions, x: Tensor) -> None:
    """Raise unless positions are integers whose shape + (Dh,) broadcasts to x
    (..., T, Dh)."""
    if not isinstance(positions, Tensor):
        raise TypeError(
            "positions must be an integer tensor, got "
            f"{type(positions).__name__}"
        )
    if positions.dtype not in INTEGER_DTYPES:
        raise TypeError(
            "positions must be integers (torch.arange(T)), got "
            f"{positions.dtype}"
        )
    if positions.dim() < 1 or not broadcasts_to(
        (*positions.shape, x.size(-1)), tuple(x.shape)
    ):
        raise ValueError(
            f"positions of shape {tuple(positions.shape)} do not broadcast "
            "to x of shape "
            f"{tuple(x.shape)} (..., T, Dh); use (T,), or e.g. (B, 1, T) "
            "for (B, H, T, Dh)"
        )


# ---------------------------------------------------------------- which
# positions new tokens have


def token_positions(length: int, start: int = 0, device=None) -> Tensor:
    """(length,) integer positions start, ..., start + length - 1 of ``length``
    tokens that follow ``start`` earlier ones: a KV cache's length, or Tk - Tq
    for queries that are the last Tq of Tk keys (bottom-right, as
    :func:`~attention_course.masks.causal_mask`; negative if Tq > Tk). Never
    restart at 0 after a cache."""
    check_int(length, "length", minimum=0)
    check_int(start, "start", minimum=-length)
    return torch.arange(start, start + length, device=device)


# ---------------------------------------------------------------- absolute
# positions


def inverse_frequencies(dim: int, base: float = 10000.0) -> Tensor:
    """(dim // 2,) float64 frequencies theta_i = base^(-2i / dim): fast
    rotations first."""
    return base ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)


def sinusoidal_positions(
    num_positions: int, dim: int, base: float = 10000.0
) -> Tensor:
    """(T, D) float32 sinusoids (Vaswani et al.): sin(p theta_i) at feature 2i,
    cos at 2i + 1.

    Each pair of features is a clock turning at its own speed theta_i =
    base^(-2i/D), from one radian per position down to about 1 / base: together
    they give each position a distinct, smoothly varying code.
    """
    check_int(num_positions, "num_positions")
    check_int(dim, "dim", even=True)
    check_base(base)
    angles = torch.arange(num_positions, dtype=torch.float64)[
        :, None
    ] * inverse_frequencies(dim, base)
    pe = torch.empty(num_positions, dim, dtype=torch.float64)  # (T, D)
    pe[:, 0::2] = angles.sin()
    pe[:, 1::2] = angles.cos()
    return pe.float()


class LearnedPositions(nn.Module):
    """GPT-2 style learned position embeddings: one trained vector per position
    0 .. max_len - 1.

    Simple and flexible, but there is no vector for position max_len or beyond:
    the model cannot read sequences longer than it was built for.
    """

    def __init__(self, max_len: int, dim: int):
        super().__init__()
        check_int(max_len, "max_len")
        check_int(dim, "dim")
        self.max_len = max_len
        self.table = nn.Embedding(max_len, dim)

    def forward(self, positions: Tensor) -> Tensor:
        """Integer positions (...,) -> embeddings (..., D)."""
        if (
            not isinstance(positions, Tensor)
            or positions.dtype not in INTEGER_DTYPES
        ):
            got = (
                positions.dtype
                if isinstance(positions, Tensor)
                else type(positions).__name__
            )
            raise TypeError(f"positions must be an integer tensor, got {got}")
        if positions.numel() and positions.min() < 0:
            raise ValueError(
                f"positions must be >= 0, got {int(positions.min())}"
            )
        if positions.numel() and positions.max() >= self.max_len:
            raise ValueError(
                f"position {int(positions.max())} has no embedding: "
                f"max_len={self.max_len} "
                f"(learned positions exist only for 0..{self.max_len - 1})"
            )
        return self.table(positions)


class SinusoidalPositions(nn.Module):
    """The sinusoids of :func:`sinusoidal_positions` as a module with no
    parameters, called like :class:`LearnedPositions`: integer positions (...,)
    -> encodings (..., D), for any position (no max_len)."""

    def __init__(self, dim: int, base: float = 10000.0):
        super().__init__()
        check_int(dim, "dim", even=True)
        check_base(base)
        self.dim, self.base = dim, base

    def forward(self, positions: Tensor) -> Tensor:
        """Integer positions (...,) -> float32 encodings (..., D): sin(p
        theta_i) at 2i, cos(p theta_i) at 2i + 1."""
        if (
            not isinstance(positions, Tensor)
            or positions.dtype not in INTEGER_DTYPES
        ):
            got = (
                positions.dtype
                if isinstance(positions, Tensor)
                else type(positions).__name__
            )
            raise TypeError(f"positions must be an integer tensor, got {got}")
        # (..., D/2), float64
        angles = rope_angles(positions, self.dim, self.base)
        # (..., D)
        return (
            torch.stack([angles.sin(), angles.cos()], dim=-1)
            .flatten(-2)
            .float()
        )


# ---------------------------------------------------------------- rotary
# position embedding (RoPE)


def rope_angles(positions: Tensor, dim: int, base: float = 10000.0) -> Tensor:
    """Angles m * theta_i, float64 (*positions.shape, dim // 2), for integer
    positions m."""
    return positions.to(torch.float64)[..., None] * inverse_frequencies(
        dim, base
    ).to(positions.device)


def rotate_pairs(
    x1: Tensor, x2: Tensor, cos: Tensor, sin: Tensor
) -> tuple[Tensor, Tensor]:
    """Rotate each 2-D point (x1, x2) by the angle whose cosine and sine are
    given."""
    return x1 * cos - x2 * sin, x1 * sin + x2 * cos


class RotaryTable(NamedTuple):
    """cos and sin (..., T, Dh/2) of the angles m * theta_i at the positions of
    one forward pass.

    A model computes the table once per forward (:func:`rope_table`) and hands
    it to every layer, which rotates its queries and keys with it (Hugging
    Face's ``position_embeddings``): no layer recomputes the angles.
    """

    cos: Tensor
    sin: Tensor


def rope_table(
    positions: Tensor,
    inv_freq: Tensor,
    dtype: torch.dtype,
    factor: float = 1.0,
) -> RotaryTable:
    """The cos/sin table of integer positions (...,) for frequencies inv_freq
    (Dh/2,), in ``dtype``.

    Angles in float64, so large positions stay exact; ``factor`` scales cos and
    sin (YaRN's attention factor).
    """
    angles = positions.to(torch.float64)[..., None] * inv_freq.to(
        positions.device, torch.float64
    )
    return RotaryTable(
        (angles.cos() * factor).to(dtype), (angles.sin() * factor).to(dtype)
    )


class KeepsRopeFrequencies(nn.Module):
    """A module whose RoPE frequencies (the buffer ``inv_freq``) keep their
    float64 precision when the module is
    cast: ``.to(torch.bfloat16)`` moves them to the new device but never rounds
    them (Hugging Face likewise computes its angles in float32 whatever the
    model's dtype)."""

    def _apply(self, fn, recurse=True):
        freqs = self.inv_freq
        super()._apply(fn, recurse)
        # the device of the move, the dtype of before
        self.inv_freq = freqs.to(self.inv_freq.device)
        return self


def rotate(
    x: Tensor, table: RotaryTable, pairing: str = "interleaved"
) -> Tensor:
    """Rotate x (..., T, Dh) with a checked :class:`RotaryTable` (the trusting
    twin of :func:`apply_rope`)."""
    turn = rotate_interleaved if pairing == "interleaved" else rotate_halves
    return turn(x, table.cos, table.sin)


def apply_rope(
    x: Tensor,
    positions: Tensor,
    *,
    base: float = 10000.0,
    pairing: str = "interleaved",
    inv_freq: Tensor | None = None,
) -> Tensor:
    """Rotate each feature pair i of x (..., T, Dh) at position m by the angle
    m * theta_i.

    Apply it to queries and keys (never values): then q_m . k_n depends on the
    positions only through m - n.

    Args:
        positions: integer positions, (T,) or broadcastable with x's batch
            axes, e.g. (B, 1, T).
        pairing: which features form pair i. ``"interleaved"``: (x_2i, x_2i+1),
            as RoFormer and Meta's LLaMA code; ``"halves"``: (x_i, x_i+Dh/2),
            as GPT-NeoX and Hugging Face's ``rotate_half``.
        inv_freq: (Dh/2,) frequencies to use instead of ``base^(-2i/Dh)``: the
            rescaled ones of a long-context model (Llama 3's or YaRN's,
            :mod:`attention_course.modern.rope_scaling`).
    """
    if not isinstance(x, Tensor) or not x.is_floating_point():
        raise TypeError(
            "x must be a floating-point tensor, got "
            f"{getattr(x, 'dtype', type(x).__name__)}"
        )
    if x.dim() < 2 or x.size(-1) % 2:
        raise ValueError(
            "x must be (..., T, Dh) with an even head dimension Dh, got "
            f"shape {tuple(x.shape)}"
        )
    check_positions(positions, x)
    check_base(base)
    check_pairing(pairing)
    if inv_freq is None:
        # float64: large m stays exact
        inv_freq = inverse_frequencies(x.size(-1), base)
    else:
        check_frequencies(inv_freq, x.size(-1))
    return rotate(x, rope_table(positions, inv_freq, x.dtype), pairing)


def rotate_interleaved(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x (..., T, Dh) with pair i = features (2i, 2i + 1) rotated by the angles
    of cos, sin (..., T, Dh/2)."""
    x1, x2 = rotate_pairs(x[..., 0::2], x[..., 1::2], cos, sin)
    # (..., T, Dh/2, 2) -> (..., T, Dh)
    return torch.stack([x1, x2], dim=-1).flatten(-2)


def rotate_halves(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x (..., T, Dh) with pair i = features (i, i + Dh/2) rotated by the
    angles of cos, sin (..., T, Dh/2)."""
    x1, x2 = rotate_pairs(*x.chunk(2, dim=-1), cos, sin)
    return torch.cat([x1, x2], dim=-1)  # (..., T, Dh)


def rope_permutation(dim: int) -> Tensor:
    """Feature order p = [0, 2, 4, ..., 1, 3, 5, ...] that turns interleaved
    pairs into halves.

    ``rope_halves(x[..., p]) == rope_interleaved(x)[..., p]``: the first
    feature of every interleaved pair moves to the first half, the second to
    the second half.
    """
    check_int(dim, "dim", even=True)
    return torch.cat([torch.arange(0, dim, 2), torch.arange(1, dim, 2)])


def convert_rope_weight(weight: Tensor, num_heads: int, to: str) -> Tensor:
    """Reorder the output rows (H * Dh, ...) of a query or key projection for
    the other pairing.

    ``to="halves"`` converts a weight (or bias) trained with interleaved RoPE,
    e.g. a Meta LLaMA checkpoint, into one that gives the same attention with
    halves RoPE (the Hugging Face layout); ``to="interleaved"`` goes back.
    Scores are unchanged because queries and keys get the same permutation
    inside each head.
    """
    check_pairing(to)
    check_int(num_heads, "num_heads")
    rows = weight.size(0)
    if rows % num_heads or (rows // num_heads) % 2:
        raise ValueError(
            f"weight has {rows} rows: need num_heads={num_heads} heads of "
            "an even head dimension"
        )
    head_dim = rows // num_heads
    perm = rope_permutation(head_dim)
    if to == "interleaved":
        perm = perm.argsort()  # the inverse permutation
    # (H, Dh, ...)
    per_head = weight.reshape(num_heads, head_dim, *weight.shape[1:])
    return per_head[:, perm.to(weight.device)].reshape(weight.shape)


# ---------------------------------------------------------------- ALiBi


def alibi_slopes(num_heads: int, dtype=torch.float32) -> Tensor:
    """(H,) head slopes of Press et al.: 2^(-8/H), 2^(-16/H), ..., 2^(-8) when
    H is a power of two.

    Otherwise (the paper's rule) take the slopes of the closest smaller power
    of two, n, then the missing H - n from every other slope of 2n heads:
    2^(-4/n), 2^(-12/n), ..., which fall between the first n.
    """
    check_int(num_heads, "num_heads")
    n = 2 ** math.floor(math.log2(num_heads))
    slopes = [2.0 ** (-8.0 * (i + 1) / n) for i in range(n)]
    extra = [
        2.0 ** (-8.0 * (i + 1) / (2 * n)) for i in range(0, 2 * n, 2)
    ]  # every other slope of 2n heads
    return torch.tensor(slopes + extra[: num_heads - n], dtype=dtype)


def alibi_bias(
    num_heads: int,
    t_q: int,
    t_k: int | None = None,
    *,
    dtype=torch.float32,
    device=None,
) -> Tensor:
    """(H, Tq, Tk) float bias -slope_h * |i - j| to add to the attention scores
    of head h.

    Queries are the *last* Tq positions (bottom-right, like
    :func:`~attention_course.masks.causal_mask`), so query i sits at position i
    + Tk - Tq. A causal model also masks the future keys; without a mask the
    bias is symmetric (the distance either way), as in bidirectional uses of
    ALiBi.
    """
    t_k = t_q if t_k is None else t_k
    check_int(t_q, "t_q")
    check_int(t_k, "t_k")
    # (Tq, 1)
    query_pos = torch.arange(t_q, device=device)[:, None] + (t_k - t_q)
    distance = (query_pos - torch.arange(t_k, device=device)).abs()  # (Tq, Tk)
    slopes = alibi_slopes(num_heads, dtype=dtype).to(device)
    return -slopes[:, None, None] * distance.to(dtype)  # (H, Tq, Tk)


def attention_with_bias(
    q: Tensor, k: Tensor, v: Tensor, bias: Tensor, mask: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """Scaled dot-product attention with an additive float bias: softmax(q k^T
    / sqrt(Dk) + bias) v.

    q (..., Tq, Dk), k (..., Tk, Dk), v (..., Tk, Dv); bias broadcasts to the
    (..., Tq, Tk) scores (e.g. the (H, Tq, Tk) of :func:`alibi_bias`); ``mask``
    is boolean, True = may attend, applied after the bias, so a query that may
    attend no key gets zero weights and a zero output.
    Returns (out, weights): :func:`~attention_course.functional.attend` with
        the bias as a score mod.
    """
    check_attention_inputs(q, k, v, mask)
    check_bias(bias, q, k)
    return attend(q, k, v, mask, score_mod=bias_mod(bias))


def check_bias(bias, q: Tensor, k: Tensor) -> None:
    """Raise unless bias is a float tensor of q's dtype that broadcasts to the
    (..., Tq, Tk) scores."""
    if not isinstance(bias, Tensor) or not bias.is_floating_point():
        got = bias.dtype if isinstance(bias, Tensor) else type(bias).__name__
        raise TypeError(
            "bias must be a float tensor added to the scores (a boolean "
            "mask goes in mask=), "
            f"got {got}"
        )
    if bias.dtype != q.dtype:
        raise TypeError(f"bias dtype {bias.dtype} != query dtype {q.dtype}")
    scores = (
        *broadcast_shape(q.shape[:-2], k.shape[:-2]),
        q.size(-2),
        k.size(-2),
    )
    if not broadcasts_to(tuple(bias.shape), scores):
        raise ValueError(
            f"bias of shape {tuple(bias.shape)} does not broadcast to "
            f"scores {scores}"
        )


# ---------------------------------------------------------------- biases as
# score mods (score, b, h, q_idx, kv_idx)


def bias_mod(bias: Tensor):
    """A float bias broadcastable to the scores (at most (B, H, Tq, Tk)) as a
    score mod: score + bias[b, h, i, j]."""
    # (B or 1, H or 1, Tq or 1, Tk or 1)
    full = bias.reshape((1,) * (4 - bias.dim()) + tuple(bias.shape))

    def bias_score_mod(score, b, h, q_idx, kv_idx):
        # size-1 axes: index 0
        index = [
            i % n
            for i, n in zip((b, h, q_idx, kv_idx), full.shape, strict=True)
        ]
        return score + full[tuple(index)].to(score.dtype)

    return bias_score_mod


def alibi_mod(num_heads: int, t_q: int, t_k: int | None = None):
    """Adds -slope_h * |i' - j| to the score of head h: :func:`alibi_bias` as a
    score mod, for every backend of :func:`~attention_course.functional.attend`
    and FlexAttention (chapter 15)."""
    t_q, t_k = query_key_lengths(t_q, t_k)
    offset = t_k - t_q
    # powers of two: exact in every float dtype
    slopes = alibi_slopes(num_heads, dtype=torch.float64)

    def alibi_score_mod(score, b, h, q_idx, kv_idx):
        distance = (q_idx + offset - kv_idx).abs()
        return score - slopes[h].to(score.dtype) * distance

    return alibi_score_mod


def relative_bias_mod(table: Tensor, t_q: int, t_k: int | None = None):
    """Adds table[h, clamp(j - i', -M, M) + M] to the score of head h:
    :func:`relative_bias` as a score mod."""
    check_offset_table(table)
    t_q, t_k = query_key_lengths(t_q, t_k)
    offset, reach = t_k - t_q, (table.size(-1) - 1) // 2

    def relative_score_mod(score, b, h, q_idx, kv_idx):
        index = (kv_idx - q_idx - offset).clamp(-reach, reach) + reach
        return score + table[h, index].to(score.dtype)

    return relative_score_mod


def relative_bias(table: Tensor, t_q: int, t_k: int | None = None) -> Tensor:
    """(H, Tq, Tk) bias looked up by offset: table[h, clamp(j - i', -M, M) +
    M], with M = (table width - 1) / 2.

    A learned relative-position bias (T5 buckets its offsets; here each offset
    up to M has its own entry and longer ones share the last): ``table`` is (H,
    2M + 1), one learned value per head and offset. Queries are the last Tq
    positions, i' = i + Tk - Tq. ALiBi is the special case table[h, M + d] =
    -slope_h * |d|. Chapter 15 writes it as a FlexAttention ``score_mod``.
    """
    check_offset_table(table)
    t_k = t_q if t_k is None else t_k
    check_int(t_q, "t_q")
    check_int(t_k, "t_k")
    reach = (table.size(-1) - 1) // 2
    # (Tq, 1)
    query_pos = torch.arange(t_q, device=table.device)[:, None] + (t_k - t_q)
    # (Tq, Tk)
    offset = (torch.arange(t_k, device=table.device) - query_pos).clamp(
        -reach, reach
    )
    return table[:, offset + reach]  # (H, Tq, Tk)


def check_offset_table(table) -> None:
    """Raise unless table is a float (H, 2M + 1) tensor: one value per head and
    offset -M..M."""
    if not isinstance(table, Tensor) or not table.is_floating_point():
        got = (
            table.dtype if isinstance(table, Tensor) else type(table).__name__
        )
        raise TypeError(f"table must be a float tensor (H, 2M + 1), got {got}")
    if table.dim() != 2 or table.size(-1) % 2 == 0:
        raise ValueError(
            f"table must be (H, 2M + 1): one value per head and offset -M..M, "
            f"got shape {tuple(table.shape)}"
        )
