"""FlashAttention's forward statistics and its backward pass
(FlashAttention-2), in plain PyTorch.

The Triton kernels of :mod:`attention_course.flash_triton` compute these same
equations tile by tile; this module writes them on whole (Tq, Tk) matrices,
once, so that each line can be read and tested on its own.

The forward keeps, per query row, the **log-sum-exp** of its scaled scores
``lse = m + log(l)`` (the running maximum ``m`` and sum ``l`` of chapter 9's
online softmax, combined). That one number per row is all the backward needs to
rebuild the probabilities without storing them: ``P = exp(S - lse)``. The
backward of ``O = P V`` with ``P = softmax(S)``, ``S = scale * Q K^T``:

    dV = P^T dO dP = dO V^T dS = P * (dP - D),   D = rowsum(dP * P) = rowsum(dO
    * O)      (the softmax's Jacobian, one row at a time) dQ = scale * dS K dK
    = scale * dS^T Q

``D = rowsum(dO * O)`` is FlashAttention-2's trick: ``rowsum(dP * P)`` would
need a whole row of P, ``dO * O`` needs one row of the output, which the
forward stored anyway. Causal masks are bottom-right aligned (query i may
attend key j iff j <= i + Tk - Tq), as everywhere in the course; a row that may
attend no key has output 0, ``lse = -inf`` and zero gradients.
"""

from __future__ import annotations

import torch

from .functional import attend
from .masks import causal_mask
from .validation import check_attention_inputs


def _scores(q: torch.Tensor, k: torch.Tensor, is_causal: bool) -> torch.Tensor:
    """(..., Tq, Tk) scaled scores, -inf where the causal mask forbids a
    pair."""
    s = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    if is_causal:
        s = s.masked_fill(
            ~causal_mask(q.shape[-2], k.shape[-2], device=q.device),
            float("-inf"),
        )
    return s


def _probabilities(s: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """P = exp(S - lse) (..., Tq, Tk); rows with lse = -inf (nothing visible)
    give 0, not exp(-inf + inf) = NaN."""
    safe = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
    return torch.exp(s - safe[..., None])


def forward_with_lse(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention output (..., Tq, Dv) and the log-sum-exp of each row of scaled
    scores (..., Tq).

    q (..., Tq, Dk), k (..., Tk, Dk), v (..., Tk, Dv). What the forward kernel
    returns and saves for backward:
    :func:`~attention_course.functional.attend` with ``return_lse=True`` (lse =
    -inf for a row that sees no key).
    """
    return attend(q, k, v, is_causal=is_causal, return_lse=True)


def backward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    o: torch.Tensor,
    lse: torch.Tensor,
    do: torch.Tensor,
    is_causal: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """FlashAttention-2's backward: (dQ, dK, dV) from the inputs, the output
    ``o``, the saved ``lse`` and ``do``.

    P is recomputed from ``lse`` (never stored by the forward); ``D = rowsum(dO
    * O)`` replaces rowsum(dP * P).
    """
    check_attention_inputs(q, k, v)
    scale = q.shape[-1] ** -0.5
    # (..., Tq, Tk), recomputed
    p = _probabilities(_scores(q, k, is_causal), lse)
    dv = p.transpose(-1, -2) @ do  # (..., Tk, Dv)
    dp = do @ v.transpose(-1, -2)  # (..., Tq, Tk)
    d = (do * o).sum(dim=-1, keepdim=True)  # (..., Tq, 1) = rowsum(dP * P)
    ds = p * (dp - d)  # gradient of the scaled scores
    dq = scale * (ds @ k)
    dk = scale * (ds.transpose(-1, -2) @ q)
    return dq, dk, dv
