"""The course's fastest self-attention module: one fused QKV projection +
PyTorch's fused SDPA kernel.

Two things make it fast compared with the step-by-step
:class:`attention_course.MultiHeadAttention`:

1. **One (D, 3D) projection instead of three (D, D) ones.** ``qkv = x @ W_qkv +
   b_qkv`` is a single large matrix multiplication (better use of the CPU's
   caches and threads than three smaller ones). The result (B, T, 3D) is
   *viewed* as (B, T, 3, H, Dh) and permuted to (3, B, H, T, Dh): q, k and v
   are strided views into one buffer, nothing is copied.
2. **``torch.nn.functional.scaled_dot_product_attention`` with
   ``is_causal=True`` and no weights.** On CPU PyTorch then runs a fused,
   FlashAttention-style kernel: it never materialises the (B, H, T, T) scores,
   skips the tiles above the causal diagonal, and writes its output directly in
   (B, T, H, Dh) order so that merging the heads is a free reshape.

What pushes SDPA off its fused kernel (PyTorch 2.13, CPU;
:func:`sdpa_kernel_used` tells which one runs):
dropout in training mode (``dropout_p > 0`` runs the "math" path, which
materialises the weights), and wanting the attention weights at all (SDPA never
returns them: ``MultiHeadAttention(return_weights=True)`` and
``nn.MultiheadAttention(need_weights=True)`` compute them step by step). An
explicit ``attn_mask`` still runs the fused kernel on CPU, but the kernel must
read a (T, T) mask and cannot skip the tiles above the diagonal:
``is_causal=True`` is both correct here (Tq == Tk in self-attention) and
faster.

Weights can be exchanged with the float64 reference
(:mod:`attention_course.numpy_ref`) through
:meth:`FusedSelfAttention.load_numpy_params` /
:meth:`FusedSelfAttention.numpy_params` (``y = x @ W + b`` layout;
self-attention only, so kdim = vdim = d_model).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from .functional import sdpa_fast
from .params import (
    as_tensors,
    check_params,
    fused_qkv_params,
    load_fused_qkv,
    load_linear,
)
from .validation import (
    check_dropout,
    check_heads,
    check_module_inputs,
    per_example_mask,
)


class FusedSelfAttention(nn.Module):
    """Multi-head self-attention with a fused QKV projection and
    ``F.scaled_dot_product_attention``.

    Args:
        d_model: D, the model width (input and output features).
        num_heads: H; D must be divisible by H (Dh = D // H).
        dropout: dropout probability on the attention weights (applied inside
            SDPA in ``.train()`` mode only).
        bias: whether the projections have biases.

    Attributes:
        qkv: ``nn.Linear(D, 3D)``; its weight (3D, D) stacks the query, key and
            value projections.
        w_o: ``nn.Linear(D, D)``, the output projection.
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        dropout: float = 0.0,
        bias: bool = True,
    ):
        super().__init__()
        check_heads(d_model, num_heads)
        check_dropout(dropout)
        self.d_model = d_model
        self.num_heads = num_heads
        self.head_dim = d_model // num_heads
        self.dropout = dropout
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=bias)
        self.w_o = nn.Linear(d_model, d_model, bias=bias)

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None = None,
        is_causal: bool = False,
    ) -> torch.Tensor:
        """Self-attention over x.

        Args:
            x: (B, T, D) input.
            mask: optional boolean, True = may attend: (T, T), (B, T, T) per
                example or (B, H, T, T) per head. Slower than ``is_causal``.
            is_causal: causal self-attention (each position sees itself and the
                past); combined with ``mask``.

        Returns:
            (B, T, D) output. Query rows that may attend no key give ``b_o``
            (zero attention output).
        """
        check_module_inputs(
            x, x, x, (self.d_model,) * 3, self.qkv.weight.dtype
        )
        b, t, d = x.shape
        # 3-D (B, T, T) -> (B, 1, T, T)
        mask = per_example_mask(mask, b, self.num_heads)
        # (B, T, 3D) -> (B, T, 3, H, Dh) -> (3, B, H, T, Dh): views, no copy
        q, k, v = (
            self.qkv(x)
            .view(b, t, 3, self.num_heads, self.head_dim)
            .permute(2, 0, 3, 1, 4)
            .unbind(0)
        )
        dropout_p = self.dropout if self.training else 0.0
        if mask is None:  # the fast path: straight to PyTorch's fused kernel
            heads = F.scaled_dot_product_attention(
                q, k, v, dropout_p=dropout_p, is_causal=is_causal
            )
        # validates the mask, combines it with the causal mask, zeroes fully
        # masked rows
        else:
            # (B, H, T, Dh)
            heads = sdpa_fast(
                q, k, v, mask=mask, dropout_p=dropout_p, is_causal=is_causal
            )
        # (B, H, T, Dh) -> (B, T, H, Dh) -> (B, T, D); the fused kernel's
        # output is already laid out this way
        return self.w_o(heads.transpose(1, 2).reshape(b, t, d))

    def load_numpy_params(self, params: dict) -> None:
        """Copy weights from a
        :func:`attention_course.numpy_ref.init_mha_params` dict (``y = x @ W +
        b``)."""
        check_params(params, self.d_model, bias=self.qkv.bias is not None)
        tensors = as_tensors(params, like=self.qkv.weight)
        load_fused_qkv(self.qkv, tensors)
        load_linear(self.w_o, tensors["w_o"], tensors["b_o"])

    def numpy_params(self) -> dict:
        """The weights as a float64 ``numpy_ref`` dict (zeros for biases when
        ``bias=False``)."""
        return fused_qkv_params(self.qkv, self.w_o)


class _RecordOps(TorchDispatchMode):
    """Records the name of every ATen operator that reaches the backends while
    active."""

    def __init__(self):
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func.__name__)
        return func(*args, **(kwargs or {}))


def sdpa_kernel_used(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **sdpa_kwargs
) -> str:
    """Which implementation ``F.scaled_dot_product_attention(q, k, v,
    **sdpa_kwargs)`` runs.

    Records the ATen operators the call dispatches to and returns the name of
    the fused kernel, e.g. ``"_scaled_dot_product_flash_attention_for_cpu"``,
    or ``"math"`` for the step-by-step fallback (matrix products and a softmax
    that materialise the attention weights).
    """
    with _RecordOps() as recorder:
        F.scaled_dot_product_attention(q, k, v, **sdpa_kwargs)
    fused = [
        n.split(".")[0]
        for n in recorder.names
        if n.startswith("_scaled_dot_product")
    ]
    return fused[0] if fused else "math"
