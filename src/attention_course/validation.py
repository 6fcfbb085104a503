"""Input checks that turn shape and dtype mistakes into errors naming the
offending values.

Every function and module of the package calls these first, so a wrong input
fails at the API with a message such as "query feature size 8 != key feature
size 6" instead of deep inside a matmul or a broadcast. One rule everywhere:
``TypeError`` for a wrong type (a NumPy array, an integer tensor,
``num_heads=2.0``, a float mask), ``ValueError`` for a wrong value or shape;
the message names the argument.
"""

from __future__ import annotations

import torch
from torch import Tensor

INTEGER_DTYPES = (
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
)


def check_int(value, name: str, minimum: int = 1, even: bool = False) -> None:
    """Raise TypeError unless value is an int (not a bool or a float such as
    2.0), ValueError if < minimum (or odd, if ``even``)."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(
            f"{name} must be an int, got {type(value).__name__} {value!r}"
        )
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {name}={value}")
    if even and value % 2:
        raise ValueError(f"{name} must be even, got {name}={value}")


def check_world_size(world_size) -> None:
    """Raise TypeError unless world_size (P, the number of ranks) is an int,
    ValueError unless it is >= 1."""
    check_int(world_size, "world_size")


def check_heads(d_model: int, num_heads: int) -> None:
    """Raise unless d_model splits into num_heads heads of equal width Dh =
    d_model // num_heads >= 1."""
    check_int(d_model, "d_model")
    check_int(num_heads, "num_heads")
    if d_model % num_heads:
        raise ValueError(
            f"d_model={d_model} is not divisible by num_heads={num_heads}"
        )


def check_dropout(p: float, name: str = "dropout") -> None:
    """Raise unless p is a dropout probability, 0 <= p < 1 (p = 1 would drop
    everything and divide by 0)."""
    if not isinstance(p, (int, float)) or isinstance(p, bool):
        raise TypeError(f"{name} must be a float, got {type(p).__name__}")
    if not 0.0 <= p < 1.0:
        raise ValueError(f"{name} must be in [0, 1), got {name}={p}")


def check_tensor(x, name: str) -> None:
    """Raise TypeError unless x is a torch.Tensor (a NumPy array needs
    torch.from_numpy first)."""
    if not isinstance(x, Tensor):
        hint = (
            ": convert it with torch.from_numpy"
            if type(x).__module__ == "numpy"
            else ""
        )
        raise TypeError(
            f"{name} must be a torch.Tensor, got {type(x).__name__}{hint}"
        )


def check_floating(x, name: str) -> None:
    """Raise TypeError unless x is a floating-point tensor (integer token ids
    must go through an embedding)."""
    check_tensor(x, name)
    if not x.is_floating_point():
        raise TypeError(
            f"{name} must be a floating-point tensor, got {x.dtype}"
        )


def check_rank(x: Tensor, name: str, rank: int, layout: str) -> None:
    """Raise unless x is a tensor with `rank` dimensions, e.g. rank 3 for
    layout "(B, T, D)"."""
    check_tensor(x, name)
    if x.dim() != rank:
        raise ValueError(
            f"{name} must be {rank}-D {layout}, got shape {tuple(x.shape)}"
        )


def broadcast_shape(*shapes: tuple[int, ...]) -> tuple[int, ...] | None:
    """The shape that ``shapes`` broadcast to, or None if they do not.

    Plain Python on purpose: ``torch.broadcast_shapes`` imports sympy on its
    first call, which can take seconds on a loaded machine, long enough to hit
    a checker's time limit and leave sympy half-imported.
    """
    ndim = max((len(shape) for shape in shapes), default=0)
    padded = [(1,) * (ndim - len(shape)) + tuple(shape) for shape in shapes]
    result = []
    for sizes in zip(*padded, strict=True):
        other = {size for size in sizes if size != 1}
        if len(other) > 1:
            return None
        result.append(other.pop() if other else 1)
    return tuple(result)


def broadcasts_to(shape: tuple[int, ...], target: tuple[int, ...]) -> bool:
    """True if a tensor of `shape` broadcasts to `target` without enlarging it
    (as masked_fill needs)."""
    if len(shape) > len(target):
        return False
    return all(
        s in (1, t)
        for s, t in zip(reversed(shape), reversed(target), strict=False)
    )


def check_boolean(mask) -> None:
    """Raise TypeError unless mask is a boolean tensor: float masks (additive,
    or 0/1) are a different convention."""
    if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
        got = mask.dtype if isinstance(mask, Tensor) else type(mask).__name__
        raise TypeError(f"mask must be boolean (True = may attend), got {got}")


def check_mask(
    mask, scores_shape: tuple[int, ...], device: torch.device | None = None
) -> None:
    """Raise unless mask is a boolean tensor (True = may attend) that
    broadcasts to the (..., Tq, Tk) scores.

    With ``device``, the mask must also be on the device of the query (a cuda
    query with a cpu mask).
    """
    check_boolean(mask)
    check_mask_shape(mask, scores_shape, device)


def check_mask_shape(
    mask: Tensor,
    scores_shape: tuple[int, ...],
    device: torch.device | None = None,
) -> None:
    """Raise unless a boolean mask (its dtype checked already) broadcasts to
    the scores and lies on ``device``."""
    if device is not None and mask.device != device:
        raise ValueError(
            f"mask is on {mask.device}, but query is on {device}: move it "
            "with mask.to(query.device)"
        )
    if not broadcasts_to(tuple(mask.shape), tuple(scores_shape)):
        raise ValueError(
            f"mask of shape {tuple(mask.shape)} does not broadcast to "
            f"attention scores {tuple(scores_shape)}"
        )


def check_combinable(masks: list[Tensor]) -> None:
    """Raise unless the masks are boolean and broadcast against each other."""
    for mask in masks:
        check_boolean(mask)
    shapes = [tuple(mask.shape) for mask in masks]
    if broadcast_shape(*shapes) is None:
        raise ValueError(f"masks of shapes {shapes} do not broadcast together")


def check_attention_inputs(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    dropout_p: float = 0.0,
) -> None:
    """Check q (..., Tq, Dk), k (..., Tk, Dk), v (..., Tk, Dv) and a mask
    broadcastable to (..., Tq, Tk)."""
    for name, x in (("query", q), ("key", k), ("value", v)):
        check_floating(x, name)
        if x.dim() < 2:
            raise ValueError(
                f"{name} must have at least 2 dimensions (..., T, "
                f"features), got shape {tuple(x.shape)}"
            )
    if q.size(-1) != k.size(-1):
        raise ValueError(
            f"query feature size {q.size(-1)} != key feature size {k.size(-1)}"
        )
    if q.size(-1) == 0:
        raise ValueError(
            "query and key have feature size Dk = 0: the scores would all "
            "be 0 / sqrt(0)"
        )
    if k.size(-2) != v.size(-2):
        raise ValueError(
            f"key length {k.size(-2)} != value length {v.size(-2)}"
        )
    if not q.dtype == k.dtype == v.dtype:
        raise TypeError(
            f"query, key and value must share a dtype, got {q.dtype}, "
            f"{k.dtype}, {v.dtype}"
        )
    batch_shapes = [tuple(x.shape[:-2]) for x in (q, k, v)]
    batch = broadcast_shape(*batch_shapes)
    if batch is None:
        raise ValueError(
            f"batch dimensions of query, key and value {batch_shapes} do "
            "not broadcast"
        )
    if q.device != k.device or k.device != v.device:
        raise ValueError(
            f"query, key and value must be on one device, got {q.device}, "
            f"{k.device}, {v.device}"
        )
    check_dropout(dropout_p, "dropout_p")
    if mask is not None:
        check_mask(mask, (*batch, q.size(-2), k.size(-2)), device=q.device)


def check_module_inputs(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    in_features: tuple[int, int, int],
    dtype: torch.dtype | None = None,
) -> None:
    """Check (B, Tq, Dq) query, (B, Tk, Dk) key, (B, Tk, Dv) value against the
    projections' input widths.

    ``dtype`` is the module's weight dtype: inputs must match it (we raise
    rather than cast silently, so that a float64 comparison never runs in
    float32 by accident).
    """
    for name, x, d_in in zip(
        ("query", "key", "value"),
        (query, key, value),
        in_features,
        strict=True,
    ):
        check_floating(x, name)
        if x.dim() != 3:  # check_rank's message; x is a tensor already
            raise ValueError(
                f"{name} must be 3-D (B, T, D), got shape {tuple(x.shape)}"
            )
        if dtype is not None and x.dtype != dtype:
            raise TypeError(
                f"{name} is {x.dtype}, but the module's weights are "
                f"{dtype}: convert one of them "
                f"(e.g. {name}.to({dtype}) or module.to({x.dtype}))"
            )
        if x.size(-1) != d_in:
            raise ValueError(
                f"{name} has {x.size(-1)} features, but the {name} "
                f"projection expects {d_in}"
            )
    if not query.size(0) == key.size(0) == value.size(0):
        raise ValueError(
            f"batch sizes differ: query {query.size(0)}, key {key.size(0)}, "
            f"value {value.size(0)}"
        )


def per_example_mask(
    mask: Tensor | None, batch: int, num_heads: int
) -> Tensor | None:
    """The mask of a multi-head module as (B or 1, H or 1, Tq, Tk), with one
    rule for each rank.

    2-D (Tq, Tk): one mask for all; 3-D (B, Tq, Tk): one mask per example, the
    same for every head (as Keras' ``attention_mask``;
    ``nn.MultiheadAttention`` reads a 3-D mask as (B * H, Tq, Tk) instead); 4-D
    (B, H, Tq, Tk): per example and per head. A 3-D mask whose first size is
    neither B nor 1 is refused rather than guessed as per-head: that is what
    would silently go wrong when B == H.
    """
    if mask is None:
        return None
    check_boolean(mask)
    if mask.dim() != 3:
        return mask
    if mask.size(0) not in (1, batch):
        raise ValueError(
            "a 3-D mask is read as (B, Tq, Tk), one mask per example, but "
            "mask has shape "
            f"{tuple(mask.shape)} and B={batch}; for one mask per head pass "
            "(B, H, Tq, Tk) or "
            f"(1, H, Tq, Tk) (here H={num_heads})"
        )
    return mask[:, None]  # (B, 1, Tq, Tk): the same mask for every head


def check_lengths(lengths: Tensor, t: int) -> None:
    """Raise unless lengths is a 1-D integer tensor (B,) with every length in
    [0, t]."""
    if lengths.dtype not in INTEGER_DTYPES:
        raise TypeError(f"lengths must be integers, got {lengths.dtype}")
    if lengths.dim() != 1:
        raise ValueError(
            f"lengths must be 1-D (B,), got shape {tuple(lengths.shape)}"
        )
    if lengths.numel() and (lengths.min() < 0 or lengths.max() > t):
        raise ValueError(
            f"lengths must lie in [0, t={t}], got {lengths.tolist()}"
        )
