"""Multi-head attention written with einsum over per-head weight tensors, and a
loop-over-heads version.

Einsum strings name every axis: b batch, t query positions, s key positions, d
features, h heads, k per-head features (Dh). The per-head weight layout is
Keras' (``keras.layers.MultiHeadAttention``): w_q (D, H, Dh), w_k (kdim, H,
Dh), w_v (vdim, H, Dh), biases (H, Dh), output w_o (H, Dh, D), b_o (D,).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from .functional import masked_softmax, scaled_dot_product_attention
from .masks import causal_mask, combine_masks
from .numpy_ref import MHA_PARAM_NAMES
from .params import as_tensors, check_params, sizes_of
from .validation import (
    check_attention_inputs,
    check_dropout,
    check_heads,
    check_mask,
    check_module_inputs,
    per_example_mask,
)

# Each ``x @ W + b`` tensor's layout (left) and its per-head layout (right): D
# = (h k) is H heads of Dh features. b_o (D,) is not per head and keeps its
# layout.
PER_HEAD_LAYOUT = {
    "w_q": ("d (h k)", "d h k"),
    "w_k": ("d (h k)", "d h k"),
    "w_v": ("d (h k)", "d h k"),
    "w_o": ("(h k) d", "h k d"),
    "b_q": ("(h k)", "h k"),
    "b_k": ("(h k)", "h k"),
    "b_v": ("(h k)", "h k"),
}


def project_heads(x: Tensor, w: Tensor, b: Tensor | None) -> Tensor:
    """(B, T, D_in) through per-head weights w (D_in, H, Dh) and bias b (H, Dh)
    -> (B, H, T, Dh)."""
    # contracts only D_in, which need not equal D
    heads = torch.einsum("btd,dhk->bhtk", x, w)
    # same bias at every position
    return heads if b is None else heads + rearrange(b, "h k -> h 1 k")


class EinsumMultiHeadAttention(nn.Module):
    """Multi-head attention with per-head weight tensors; same arguments and
    forward as MultiHeadAttention.

    Each projection is stored head by head, so queries, keys and values come
    out already split into heads (no split_heads), and the output projection
    w_o (H, Dh, D) sums over heads (no merge_heads).
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        dropout: float = 0.0,
        bias: bool = True,
        kdim: int | None = None,
        vdim: int | None = None,
    ):
        super().__init__()
        check_heads(d_model, num_heads)
        check_dropout(dropout)
        self.d_model, self.num_heads, self.head_dim = (
            d_model,
            num_heads,
            d_model // num_heads,
        )
        self.kdim = d_model if kdim is None else kdim
        self.vdim = d_model if vdim is None else vdim
        self.dropout = dropout
        # (D, H, Dh)
        self.w_q = nn.Parameter(torch.empty(d_model, num_heads, self.head_dim))
        # (kdim, H, Dh)
        self.w_k = nn.Parameter(
            torch.empty(self.kdim, num_heads, self.head_dim)
        )
        # (vdim, H, Dh)
        self.w_v = nn.Parameter(
            torch.empty(self.vdim, num_heads, self.head_dim)
        )
        # (H, Dh, D)
        self.w_o = nn.Parameter(torch.empty(num_heads, self.head_dim, d_model))
        for name in ("b_q", "b_k", "b_v"):
            self.register_parameter(
                name,
                nn.Parameter(torch.zeros(num_heads, self.head_dim))
                if bias
                else None,
            )
        self.register_parameter(
            "b_o", nn.Parameter(torch.zeros(d_model)) if bias else None
        )
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Weights uniform in +-1/sqrt(d_in), as nn.Linear draws them; biases
        zero."""
        # w_o reads H * Dh = D features
        fan_ins = (self.d_model, self.kdim, self.vdim, self.d_model)
        for w, fan_in in zip(
            (self.w_q, self.w_k, self.w_v, self.w_o), fan_ins, strict=True
        ):
            bound = fan_in**-0.5
            nn.init.uniform_(w, -bound, bound)

    def forward(
        self,
        query: Tensor,
        key: Tensor | None = None,
        value: Tensor | None = None,
        mask: Tensor | None = None,
        is_causal: bool = False,
        return_weights: bool = False,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """query (B, Tq, D), key (B, Tk, kdim), value (B, Tk, vdim) -> out (B,
        Tq, D) [, weights (B, H, Tq, Tk)].

        key defaults to query (self-attention) and value to key. ``mask``, True
        = may attend: (Tq, Tk) for all, (B, Tq, Tk) per example, (B, H, Tq, Tk)
        per head; ``is_causal=True`` also hides future keys (bottom-right
        aligned when Tq != Tk).
        """
        key = query if key is None else key
        value = key if value is None else value
        check_module_inputs(
            query,
            key,
            value,
            (self.d_model, self.kdim, self.vdim),
            self.w_q.dtype,
        )
        # 3-D (B, Tq, Tk) -> (B, 1, Tq, Tk)
        mask = per_example_mask(mask, query.size(0), self.num_heads)
        if is_causal:
            mask = combine_masks(
                mask,
                causal_mask(query.size(1), key.size(1), device=query.device),
            )
        q = project_heads(query, self.w_q, self.b_q)  # (B, H, Tq, Dh)
        k = project_heads(key, self.w_k, self.b_k)  # (B, H, Tk, Dh)
        v = project_heads(value, self.w_v, self.b_v)  # (B, H, Tk, Dh)
        # (B, H, Tq, Dh), (B, H, Tq, Tk)
        heads, weights = self.attend(q, k, v, mask)
        # summing over h and k merges and projects the heads
        out = torch.einsum("bhtk,hkd->btd", heads, self.w_o)
        out = out if self.b_o is None else out + self.b_o  # (B, Tq, D)
        return (out, weights) if return_weights else out

    def attend(
        self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None
    ) -> tuple[Tensor, Tensor]:
        """(B, H, Tq, Dh) queries, (B, H, Tk, Dh) keys and values -> (B, H, Tq,
        Dh), weights (B, H, Tq, Tk)."""
        check_attention_inputs(q, k, v, mask)
        # (B, H, Tq, Tk)
        scores = torch.einsum("bhtk,bhsk->bhts", q, k) / math.sqrt(
            self.head_dim
        )
        weights = F.dropout(
            masked_softmax(scores, mask),
            p=self.dropout,
            training=self.training,
        )
        return torch.einsum("bhts,bhsk->bhtk", weights, v), weights

    def load_numpy_params(self, params: dict) -> None:
        """Load a ``y = x @ W + b`` dict (see numpy_ref.init_mha_params): head
        h owns columns h*Dh .. (h+1)*Dh - 1."""
        check_params(
            params,
            self.d_model,
            self.kdim,
            self.vdim,
            bias=self.b_o is not None,
        )
        tensors = as_tensors(params, like=self.w_q)
        with torch.no_grad():
            for name, (flat, per_head) in PER_HEAD_LAYOUT.items():
                param = getattr(self, name)
                if param is not None:  # biases are None when bias=False
                    param.copy_(
                        rearrange(
                            tensors[name],
                            f"{flat} -> {per_head}",
                            h=self.num_heads,
                        )
                    )
            if self.b_o is not None:
                self.b_o.copy_(tensors["b_o"])

    def numpy_params(self) -> dict:
        """The weights as a float64 ``y = x @ W + b`` dict, W (d_in, d_out);
        zero biases if bias=False."""
        zeros = torch.zeros(self.d_model)
        params = {}
        for name, (flat, per_head) in PER_HEAD_LAYOUT.items():
            param = getattr(self, name)
            params[name] = (
                zeros
                if param is None
                else rearrange(param.detach(), f"{per_head} -> {flat}")
            )
        params["b_o"] = zeros if self.b_o is None else self.b_o.detach()
        return {
            name: params[name].double().cpu().numpy()
            for name in MHA_PARAM_NAMES
        }


def multi_head_attention_loop(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    params: dict,
    num_heads: int,
    mask: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Multi-head attention one head at a time, straight from the definition
    (for testing and teaching).

    Head h attends with its own slice of columns h*Dh .. (h+1)*Dh - 1 of w_q,
    w_k, w_v; the heads' outputs are concatenated and projected by w_o.

    Args:
        query: (B, Tq, Dq_in); key: (B, Tk, Dk_in); value: (B, Tk, Dv_in).
        params: a ``y = x @ W + b`` dict as from numpy_ref.init_mha_params
            (arrays or tensors; converted to query's dtype and device).
        num_heads: H; must divide D, the number of columns of w_q.
        mask: optional boolean, broadcastable to (B, H, Tq, Tk); True = may
            attend.

    Returns:
        out (B, Tq, D) and weights (B, H, Tq, Tk).
    """
    d_model, kdim, vdim = sizes_of(params)
    check_params(params, d_model, kdim, vdim)
    check_module_inputs(query, key, value, (d_model, kdim, vdim))
    p = as_tensors(params, like=query)
    check_heads(d_model, num_heads)
    head_dim = d_model // num_heads
    # 3-D (B, Tq, Tk) -> (B, 1, Tq, Tk)
    mask = per_example_mask(mask, query.size(0), num_heads)
    if mask is not None:
        scores_shape = (query.size(0), num_heads, query.size(1), key.size(1))
        check_mask(mask, scores_shape)
        # so that mask[:, h] is head h's (B, Tq, Tk) mask
        mask = mask.expand(scores_shape)
    outputs, weights = [], []
    for h in range(num_heads):
        cols = slice(h * head_dim, (h + 1) * head_dim)  # head h's features
        q = query @ p["w_q"][:, cols] + p["b_q"][cols]  # (B, Tq, Dh)
        k = key @ p["w_k"][:, cols] + p["b_k"][cols]  # (B, Tk, Dh)
        v = value @ p["w_v"][:, cols] + p["b_v"][cols]  # (B, Tk, Dh)
        out, w = scaled_dot_product_attention(
            q, k, v, None if mask is None else mask[:, h]
        )
        outputs.append(out)  # (B, Tq, Dh)
        weights.append(w)  # (B, Tq, Tk)
    # (B, Tq, H * Dh) -> (B, Tq, D)
    out = torch.cat(outputs, dim=-1) @ p["w_o"] + p["b_o"]
    return out, torch.stack(weights, dim=1)  # (B, Tq, D), (B, H, Tq, Tk)
