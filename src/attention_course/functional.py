"""Scaled dot-product attention: written out from scratch, through PyTorch's
fused kernel, and as one function.

``softmax(q k^T / sqrt(Dk)) v`` for q (..., Tq, Dk), k (..., Tk, Dk), v (...,
Tk, Dv). A boolean mask broadcastable to (..., Tq, Tk) says which keys each
query may attend (True = may attend); a query that may attend no key gets
all-zero weights and a zero output.

:func:`scaled_dot_product_attention` (chapter 2) and :func:`sdpa_fast` are the
faces the early chapters teach. :func:`attend` is the one function every later
variant goes through: a score scale, a ``score_mod`` (FlexAttention's
``score_mod(score, b, h, q_idx, kv_idx)``: ALiBi, relative bias, soft-capping),
attention sinks, dropout and the log-sum-exp, computed by a named backend of
:data:`BACKENDS` ("eager" and "sdpa" here; chapter 9's blockwise module
registers "blockwise", chapter 15's flex module "flex", chapter 16's
flash_triton "triton", each imported when first named). Grouped-query keys and
values (B, H_kv, Tk, D), from the modules' trusted path, go to the backends of
:data:`GROUPED` as they are (SDPA's ``enable_gqa`` reads each shared head in
place); the others get each head repeated for its query heads
(:func:`expand_kv`).
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from .masks import causal_mask, index_grid
from .validation import broadcast_shape, check_attention_inputs

ScoreMod = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], Tensor]


def masked_softmax(scores: Tensor, mask: Tensor | None = None) -> Tensor:
    """Softmax over the keys (last axis) of (..., Tq, Tk) scores, giving masked
    keys exactly zero weight.

    Masked scores become -inf, and exp(-inf) = 0. A query that may attend no
    key has a row of -inf, whose softmax is 0/0 = NaN: filling the masked
    entries with 0 afterwards turns such rows into zeros and leaves the other
    rows untouched (their masked entries are 0 already). The backward pass
    stays NaN-free too, because masked_fill passes no gradient to the entries
    it fills.
    """
    if mask is None:
        return torch.softmax(scores, dim=-1)
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1).masked_fill(~mask, 0.0)


def scaled_dot_product_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    dropout_p: float = 0.0,
) -> tuple[Tensor, Tensor]:
    """Attention from scratch: q (..., Tq, Dk), k (..., Tk, Dk), v (..., Tk,
    Dv) -> (out, weights).

    Args:
        mask: optional boolean tensor broadcastable to (..., Tq, Tk); True =
            may attend.
        dropout_p: probability of dropping each attention weight (the survivors
            are scaled by 1 / (1 - p)). Modules pass ``self.dropout if
            self.training else 0.0``.

    Returns:
        out (..., Tq, Dv) and weights (..., Tq, Tk); each row of weights sums
        to 1 (before dropout), or is all zeros where the mask allows no key.
    """
    check_attention_inputs(q, k, v, mask, dropout_p)
    # Dividing by sqrt(Dk) keeps the scores' variance near 1 whatever the
    # width, so softmax does not saturate.
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (..., Tq, Tk)
    weights = masked_softmax(scores, mask)  # (..., Tq, Tk)
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p, training=True)
    return weights @ v, weights  # (..., Tq, Dv), (..., Tq, Tk)


def sdpa_fast(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
) -> Tensor:
    """The same attention through
    ``torch.nn.functional.scaled_dot_product_attention`` (fused kernels).

    Shapes and mask convention as :func:`scaled_dot_product_attention`
    (PyTorch's boolean ``attn_mask`` also means True = may attend); returns
    only out (..., Tq, Dv), since fused kernels never form the weights.
    ``is_causal=True`` adds the bottom-right aligned
    :func:`~attention_course.masks.causal_mask`.
    """
    return attend(
        q, k, v, mask, is_causal=is_causal, dropout_p=dropout_p, backend="sdpa"
    )[0]


# ---------------------------------------------------------------- one
# function, named backends


def attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    *,
    is_causal: bool = False,
    scale: float | None = None,
    score_mod: ScoreMod | None = None,
    sinks: Tensor | None = None,
    dropout_p: float = 0.0,
    return_lse: bool = False,
    backend: str = "eager",
) -> tuple[Tensor, Tensor | None]:
    """Attention of every kind the course meets: q (..., Tq, Dk), k (..., Tk,
    Dk), v (..., Tk, Dv) -> (out, extra).

    Args:
        mask: boolean, broadcastable to (..., Tq, Tk), True = may attend;
            ``is_causal`` adds the bottom-right causal mask (a backend may then
            skip the future without building a mask).
        scale: multiplies q k^T; default 1 / sqrt(Dk).
        score_mod: ``score_mod(score, b, h, q_idx, kv_idx) -> score``,
            evaluated on index tensors that broadcast to the (B, H, Tq, Tk)
            scores (inputs of at most 4 dimensions), before the mask.
        sinks: (H,) one logit per head (GPT-OSS): one more softmax column with
            no value, so a query may attend "nowhere"; its weights then sum to
            less than 1. Inputs (B, H, T, D).
        dropout_p: probability of dropping each weight (modules pass
            ``self.dropout if self.training else 0``).
        return_lse: return the log-sum-exp of each row's scores (..., Tq)
            instead of the weights (with sinks, of the sink's logit too); -inf
            for a row that may attend nothing.
        backend: a name in :data:`BACKENDS`; only "eager" forms the (..., Tq,
            Tk) weights.

    Returns:
        out (..., Tq, Dv), zeros for rows that may attend nothing; then the lse
        if ``return_lse``, else the weights (..., Tq, Tk) on the eager backend
        and None on the others.
    """
    check_attention_inputs(q, k, v, mask, dropout_p)
    check_attend_options(q, scale, score_mod, sinks)
    return _attend(
        q,
        k,
        v,
        mask,
        is_causal=is_causal,
        scale=scale,
        score_mod=score_mod,
        sinks=sinks,
        dropout_p=dropout_p,
        return_lse=return_lse,
        backend=backend,
    )


def _attend(
    q,
    k,
    v,
    mask=None,
    *,
    is_causal=False,
    scale=None,
    score_mod=None,
    sinks=None,
    dropout_p=0.0,
    return_lse=False,
    backend="eager",
):
    """:func:`attend` on inputs checked already (a module validates at its
    edge, then trusts); k and v may have fewer heads than q (grouped-query
    attention: (B, H_kv, Tk, D), H_kv dividing H)."""
    run = backend_named(backend)
    if (
        k.dim() == 4
        and k.size(1) not in (1, q.size(1))
        and backend not in GROUPED
    ):
        # these backends need one key/value head per query head (or one for
        # all)
        groups = q.size(1) // k.size(1)
        k, v = expand_kv(k, groups), expand_kv(v, groups)  # (B, H, Tk, D)
    scale = q.size(-1) ** -0.5 if scale is None else float(scale)
    out, weights, lse = run(
        q,
        k,
        v,
        mask,
        is_causal=is_causal,
        scale=scale,
        score_mod=score_mod,
        dropout_p=dropout_p,
        need_lse=return_lse or sinks is not None,
    )
    if sinks is not None:
        out, weights, lse = add_sinks(sinks, out, weights, lse)
    return out, (lse if return_lse else weights)


def check_attend_options(q: Tensor, scale, score_mod, sinks) -> None:
    """Raise unless scale is a finite number > 0, score_mod a function, sinks a
    float (H,) tensor for (B, H, T, D)."""
    if scale is not None and (
        isinstance(scale, bool) or not isinstance(scale, int | float)
    ):
        raise TypeError(f"scale must be a number, got {type(scale).__name__}")
    if scale is not None and not (math.isfinite(scale) and scale > 0):
        raise ValueError(
            f"scale must be a finite number > 0, got scale={scale}"
        )
    if score_mod is not None and not callable(score_mod):
        raise TypeError(
            "score_mod must be a function (score, b, h, q_idx, kv_idx) -> "
            "score, "
            f"got {type(score_mod).__name__}"
        )
    if score_mod is not None and q.dim() > 4:
        raise ValueError(
            "a score_mod reads (b, h, q_idx, kv_idx): inputs of at most 4 "
            f"dimensions, got {q.dim()}"
        )
    if sinks is None:
        return
    if not isinstance(sinks, Tensor) or not sinks.is_floating_point():
        got = (
            sinks.dtype if isinstance(sinks, Tensor) else type(sinks).__name__
        )
        raise TypeError(
            f"sinks must be a float tensor (H,), one logit per head, got {got}"
        )
    if q.dim() != 4 or tuple(sinks.shape) != (q.size(1),):
        raise ValueError(
            "sinks must be (H,) for (B, H, T, D) inputs, got sinks "
            f"{tuple(sinks.shape)} "
            f"and query {tuple(q.shape)}"
        )


def apply_score_mod(
    score_mod: ScoreMod, scores: Tensor, q_start: int = 0, k_start: int = 0
) -> Tensor:
    """``score_mod`` on (..., Tq, Tk) scores (at most 4-D), every pair at once:
    the index tensors of :func:`~attention_course.masks.index_grid` broadcast
    to the scores; a tile starts at (q_start, k_start)."""
    # (B, H, Tq, Tk), a view
    four = scores.reshape((1,) * (4 - scores.dim()) + tuple(scores.shape))
    grid = index_grid(
        *four.shape, q_start=q_start, k_start=k_start, device=scores.device
    )
    modded = score_mod(four, *grid)
    if modded.shape != four.shape:
        raise ValueError(
            f"score_mod returned shape {tuple(modded.shape)} for scores "
            f"{tuple(four.shape)}: "
            "a mod that reads h needs (B, H, T, D) inputs"
        )
    return modded.reshape(scores.shape)


def masked_lse(scores: Tensor, mask: Tensor | None) -> Tensor:
    """(..., Tq) log-sum-exp of each row of scores over the keys its mask
    allows; -inf for a row with none.

    The fully masked rows are summed over zeros and replaced afterwards, so
    their gradient is 0, not NaN.
    """
    if mask is None:
        return torch.logsumexp(scores, dim=-1)
    visible = mask.expand(scores.shape).any(dim=-1)  # (..., Tq)
    rows = scores.masked_fill(~mask, float("-inf")).masked_fill(
        ~visible[..., None], 0.0
    )
    return torch.where(visible, torch.logsumexp(rows, dim=-1), float("-inf"))


def add_sinks(
    sinks: Tensor, out: Tensor, weights: Tensor | None, lse: Tensor
) -> tuple[Tensor, Tensor | None, Tensor]:
    """Add one softmax column of logit sinks[h] and value 0 after the fact,
    from the row's log-sum-exp.

    With Z = exp(lse) the keys' softmax denominator, the sink makes it Z +
    exp(sink): every weight, and so the output, shrinks by Z / (Z + exp(sink))
    = sigmoid(lse - sink). Any backend that gives the lse gets sinks.
    """
    sink = sinks.to(lse.dtype)[:, None]  # (H, 1): broadcasts over (B, H, Tq)
    # (B, H, Tq, 1); 0 for rows that see no key
    keep = torch.sigmoid(lse - sink)[..., None]
    weights = None if weights is None else weights * keep
    return out * keep, weights, torch.logaddexp(lse, sink)


def causal_with(
    mask: Tensor | None, is_causal: bool, t_q: int, t_k: int, device=None
) -> Tensor | None:
    """``mask`` and, if ``is_causal``, the bottom-right causal mask (the
    backends that cannot skip tiles); the mask was checked by :func:`attend`,
    so the two are combined without
    :func:`~attention_course.masks.combine_masks`'s checks."""
    if not is_causal:
        return mask
    causal = causal_mask(t_q, t_k, device=device)
    return causal if mask is None else mask & causal


def eager_backend(
    q, k, v, mask, *, is_causal, scale, score_mod, dropout_p, need_lse
):
    """Scores, score_mod, mask, softmax, dropout, values: every step a tensor
    (the only backend with weights)."""
    mask = causal_with(mask, is_causal, q.size(-2), k.size(-2), q.device)
    scores = q @ k.transpose(-2, -1) * scale  # (..., Tq, Tk)
    if score_mod is not None:
        scores = apply_score_mod(score_mod, scores)
    lse = masked_lse(scores, mask) if need_lse else None
    weights = masked_softmax(scores, mask)  # (..., Tq, Tk)
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p, training=True)
    return weights @ v, weights, lse


def sdpa_backend(
    q, k, v, mask, *, is_causal, scale, score_mod, dropout_p, need_lse
):
    """PyTorch's fused kernels. They keep the log-sum-exp inside, so no lse and
    no sinks; a score_mod must add a
    bias (it goes in as a float mask): soft-capping is refused."""
    if need_lse:
        raise ValueError(
            "backend 'sdpa' gives no log-sum-exp (PyTorch's fused kernels "
            "keep it inside), so it "
            "cannot return_lse or add sinks: use backend='eager', "
            "'blockwise' or 'flex'"
        )
    t_q, t_k = q.size(-2), k.size(-2)
    if is_causal and (mask is not None or t_q != t_k or score_mod is not None):
        # torch's is_causal is top-left aligned and refuses an extra attn_mask:
        # build our causal mask instead.
        mask, is_causal = causal_with(mask, True, t_q, t_k, q.device), False
    # (B, H_kv, Tk, D): read in place, never copied
    grouped = k.dim() == 4 and k.size(1) != q.size(1)
    attn_mask = (
        mask if score_mod is None else additive_bias(score_mod, q, k, mask)
    )
    out = F.scaled_dot_product_attention(
        q,
        k,
        v,
        attn_mask=attn_mask,
        dropout_p=dropout_p,
        is_causal=is_causal,
        scale=scale,
        enable_gqa=grouped,
    )
    if mask is None:
        return out, None, None  # (..., Tq, Dv)
    # Depending on the kernel, a query that may attend no key gets NaN: give it
    # a zero output row instead.
    return torch.where(mask.any(dim=-1, keepdim=True), out, 0.0), None, None


def additive_bias(
    score_mod: ScoreMod, q: Tensor, k: Tensor, mask: Tensor | None
) -> Tensor:
    """The float mask (..., Tq, Tk) that adds a score_mod's bias and -inf where
    ``mask`` hides a key.

    Only a mod of the form score + bias can go in as a float mask: the bias is
    the mod at scores 0, and the form is probed on one row of queries at
    scores 1 (a mod that is not score + bias, soft-capping, shows on any row),
    so a call costs one full pass of the mod, not two.
    """
    batch = (
        q.shape[:-2]
        if k.dim() == 4 and k.size(1) != q.size(1)
        else broadcast_shape(q.shape[:-2], k.shape[:-2])
    )
    shape = (*batch, q.size(-2), k.size(-2))  # grouped keys: the query heads
    zeros = torch.zeros(shape, dtype=q.dtype, device=q.device)
    bias = apply_score_mod(score_mod, zeros)
    first_row = zeros[..., :1, :] + 1
    if not torch.allclose(
        apply_score_mod(score_mod, first_row) - 1,
        bias[..., :1, :],
        atol=1e-6,
    ):
        raise ValueError(
            "backend 'sdpa' adds a score_mod as a float mask, so the mod "
            "must be score + bias; this one "
            "is not (soft-capping?): use backend='eager', 'blockwise' or "
            "'flex'"
        )
    return bias if mask is None else bias.masked_fill(~mask, float("-inf"))


def softcap_mod(cap: float) -> ScoreMod:
    """Caps each score smoothly within (-cap, cap), ``cap * tanh(score / cap)``
    (Gemma 2; chapter 14): before the mask and the softmax, never on the
    probabilities."""
    if isinstance(cap, bool) or not isinstance(cap, int | float):
        raise TypeError(f"cap must be a number, got {type(cap).__name__}")
    if not cap > 0 or math.isinf(cap):
        raise ValueError(f"cap must be a finite number > 0, got cap={cap}")

    def softcap_score_mod(score, b, h, q_idx, kv_idx):
        return cap * torch.tanh(score / cap)

    return softcap_score_mod


def expand_kv(x: Tensor, n_rep: int) -> Tensor:
    """(B, H_kv, T, Dh) -> (B, H_kv * n_rep, T, Dh), each head repeated n_rep
    times in a row, inputs unchecked
    (:func:`~attention_course.kv_cache.repeat_kv` is the checked face, chapter
    8)."""
    if n_rep == 1:
        return x
    b, h_kv, t, dh = x.shape
    return (
        x[:, :, None]
        .expand(b, h_kv, n_rep, t, dh)
        .reshape(b, h_kv * n_rep, t, dh)
    )


BACKENDS: dict[str, Callable] = {"eager": eager_backend, "sdpa": sdpa_backend}
# backends that read grouped-query keys and values (fewer heads than q) without
# copying them
GROUPED = {"sdpa"}
# name -> the module that registers it when imported
LATER_BACKENDS = {
    "blockwise": "blockwise",
    "flex": "flex",
    "triton": "flash_triton",
}


def register(name: str, fn: Callable) -> None:
    """Make ``fn`` the backend ``name`` of :func:`attend`. It is called as
    ``fn(q, k, v, mask, *, is_causal, scale, score_mod, dropout_p, need_lse)``
    on checked inputs and returns (out, weights or None, lse or None)."""
    if not isinstance(name, str) or not callable(fn):
        raise TypeError("register(name, fn) needs a string and a function")
    BACKENDS[name] = fn


def backend_named(name: str) -> Callable:
    """The backend registered as ``name``, importing the chapter's module that
    registers it the first time."""
    if name not in BACKENDS and name in LATER_BACKENDS:
        importlib.import_module(f".{LATER_BACKENDS[name]}", __package__)
    if name not in BACKENDS:
        raise ValueError(
            f"unknown attention backend {name!r}; known: "
            f"{sorted(BACKENDS.keys() | LATER_BACKENDS)}"
        )
    return BACKENDS[name]


def check_backend(name) -> None:
    """Raise unless ``name`` names a backend (modules check theirs once, when
    built)."""
    if not isinstance(name, str):
        raise TypeError(
            "backend must be a string such as 'eager' or 'sdpa', got "
            f"{type(name).__name__}"
        )
    backend_named(name)
