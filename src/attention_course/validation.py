"""Input checks that turn shape and dtype mistakes into errors naming the offending values.

Every function and module of the package calls these first, so a wrong input fails at the API with a message
such as "query feature size 8 != key feature size 6" instead of deep inside a matmul or a broadcast.
"""

from __future__ import annotations

import torch
from torch import Tensor

INTEGER_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


def check_heads(d_model: int, num_heads: int) -> None:
    """Raise ValueError unless d_model splits into num_heads heads of equal width Dh = d_model // num_heads."""
    if num_heads < 1:
        raise ValueError(f"num_heads must be >= 1, got num_heads={num_heads}")
    if d_model % num_heads:
        raise ValueError(f"d_model={d_model} is not divisible by num_heads={num_heads}")


def check_dropout(p: float) -> None:
    """Raise ValueError unless p is a probability."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability must be in [0, 1], got {p}")


def check_rank(x: Tensor, name: str, rank: int, layout: str) -> None:
    """Raise ValueError unless x has `rank` dimensions, e.g. rank 3 for layout "(B, T, D)"."""
    if x.dim() != rank:
        raise ValueError(f"{name} must be {rank}-D {layout}, got shape {tuple(x.shape)}")


def broadcasts_to(shape: tuple[int, ...], target: tuple[int, ...]) -> bool:
    """True if a tensor of `shape` broadcasts to `target` without enlarging it (as masked_fill needs)."""
    if len(shape) > len(target):
        return False
    return all(s in (1, t) for s, t in zip(reversed(shape), reversed(target)))


def check_boolean(mask) -> None:
    """Raise TypeError unless mask is a boolean tensor: float masks (additive, or 0/1) are a different convention."""
    if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
        got = mask.dtype if isinstance(mask, Tensor) else type(mask).__name__
        raise TypeError(f"mask must be boolean (True = may attend), got {got}")


def check_mask(mask, scores_shape: tuple[int, ...]) -> None:
    """Raise unless mask is a boolean tensor (True = may attend) that broadcasts to the (..., Tq, Tk) scores."""
    check_boolean(mask)
    if not broadcasts_to(tuple(mask.shape), tuple(scores_shape)):
        raise ValueError(
            f"mask of shape {tuple(mask.shape)} does not broadcast to attention scores {tuple(scores_shape)}"
        )


def check_combinable(masks: list[Tensor]) -> None:
    """Raise unless the masks are boolean and broadcast against each other."""
    for mask in masks:
        check_boolean(mask)
    shapes = [tuple(mask.shape) for mask in masks]
    try:
        torch.broadcast_shapes(*shapes)
    except RuntimeError:
        raise ValueError(f"masks of shapes {shapes} do not broadcast together") from None


def check_attention_inputs(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, dropout_p: float = 0.0
) -> None:
    """Check q (..., Tq, Dk), k (..., Tk, Dk), v (..., Tk, Dv) and a mask broadcastable to (..., Tq, Tk)."""
    for name, x in (("query", q), ("key", k), ("value", v)):
        if x.dim() < 2:
            raise ValueError(f"{name} must have at least 2 dimensions (..., T, features), got shape {tuple(x.shape)}")
    if q.size(-1) != k.size(-1):
        raise ValueError(f"query feature size {q.size(-1)} != key feature size {k.size(-1)}")
    if k.size(-2) != v.size(-2):
        raise ValueError(f"key length {k.size(-2)} != value length {v.size(-2)}")
    if not q.dtype == k.dtype == v.dtype:
        raise TypeError(f"query, key and value must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    batch_shapes = [tuple(x.shape[:-2]) for x in (q, k, v)]
    try:
        batch = torch.broadcast_shapes(*batch_shapes)
    except RuntimeError:
        raise ValueError(f"batch dimensions of query, key and value {batch_shapes} do not broadcast") from None
    check_dropout(dropout_p)
    if mask is not None:
        check_mask(mask, (*batch, q.size(-2), k.size(-2)))


def check_module_inputs(query: Tensor, key: Tensor, value: Tensor, in_features: tuple[int, int, int]) -> None:
    """Check (B, Tq, Dq) query, (B, Tk, Dk) key, (B, Tk, Dv) value against the projections' input widths."""
    for name, x, d_in in zip(("query", "key", "value"), (query, key, value), in_features):
        check_rank(x, name, 3, "(B, T, D)")
        if x.size(-1) != d_in:
            raise ValueError(f"{name} has {x.size(-1)} features, but the {name} projection expects {d_in}")
    if not query.size(0) == key.size(0) == value.size(0):
        raise ValueError(f"batch sizes differ: query {query.size(0)}, key {key.size(0)}, value {value.size(0)}")


def check_lengths(lengths: Tensor, t: int) -> None:
    """Raise unless lengths is a 1-D integer tensor (B,) with every length in [0, t]."""
    if lengths.dtype not in INTEGER_DTYPES:
        raise TypeError(f"lengths must be integers, got {lengths.dtype}")
    if lengths.dim() != 1:
        raise ValueError(f"lengths must be 1-D (B,), got shape {tuple(lengths.shape)}")
    if lengths.numel() and (lengths.min() < 0 or lengths.max() > t):
        raise ValueError(f"lengths must lie in [0, t={t}], got {lengths.tolist()}")
