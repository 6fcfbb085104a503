"""Kimi Linear's delta attention (KDA): Gated DeltaNet with one decay per key
channel, equal to transformers' ``KimiLinearDeltaAttention``.

The same layer as
:class:`~attention_course.linear_attention.layer.GatedDeltaNet` (projections,
short causal convolution, unit queries and keys, beta = sigmoid(b), gated
RMSNorm, output projection), with three changes:

* the decay is a vector per token and head: log alpha (B, H, T, Dk) =
  -exp(A_log) * softplus(f + dt_bias), f from a low-rank projection of x (D ->
  Dk -> H Dk), so each key channel (each row of the state) forgets at its own
  rate; the shared update
  :func:`~attention_course.linear_attention.rules.delta_step` takes it as it
  is;
* the output gate is sigmoid of a low-rank projection (D -> Dk -> H Dv), not
  silu of a full one;
* as many query/key heads as value heads, Dk = Dv.

A gate per channel does not factor into the (L, L) decay matrix of the chunked
form, so :meth:`forward` runs the recurrent form (the definition);
transformers' fallback runs its own chunked form, in float32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..interop.hf import HFTwin, check_hf_module
from .layer import GatedDeltaNet
from .rules import gated_delta_recurrent


class KimiDeltaAttention(GatedDeltaNet):
    """Kimi Linear's KDA layer: (B, T, D) -> (B, T, D), H heads of Dk = Dv =
    ``head_dim``."""

    hf_twin = HFTwin(
        "kimi_linear.modeling_kimi_linear", "KimiLinearDeltaAttention"
    )

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        head_dim: int,
        *,
        conv_kernel: int = 4,
        eps: float = 1e-6,
    ):
        super().__init__(
            d_model,
            num_heads,
            num_heads,
            head_dim,
            head_dim,
            conv_kernel=conv_kernel,
            eps=eps,
        )
        del self.z_proj, self.a_proj  # replaced by the low-rank gates below
        width = num_heads * head_dim
        # the decay's input, rank Dk
        self.f_a_proj = nn.Linear(d_model, head_dim, bias=False)
        self.f_b_proj = nn.Linear(head_dim, width, bias=False)
        self.dt_bias = nn.Parameter(torch.ones(width))  # one per key channel
        # the output gate, rank Dk
        self.g_a_proj = nn.Linear(d_model, head_dim, bias=False)
        self.g_b_proj = nn.Linear(head_dim, width, bias=False)

    def gates(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """beta = sigmoid(b) (B, H, T) and log alpha = -exp(A_log) * softplus(f
        + dt_bias) (B, H, T, Dk)."""
        beta = torch.sigmoid(self.b_proj(x)).transpose(1, 2)
        # (B, H, T, Dk)
        f = self.heads(
            self.f_b_proj(self.f_a_proj(x)) + self.dt_bias, self.num_v_heads
        )
        return beta, -self.A_log.exp()[:, None, None] * F.softplus(f)

    def output_gate(self, x: Tensor) -> Tensor:
        """sigmoid of the low-rank gate, per head (B, H, T, Dv)."""
        return torch.sigmoid(
            self.heads(self.g_b_proj(self.g_a_proj(x)), self.num_v_heads)
        )

    def sequence_rule(self, *args) -> tuple[Tensor, Tensor]:
        """A gate per channel: the recurrent form."""
        return gated_delta_recurrent(*args)

    @classmethod
    def from_hf(cls, module) -> KimiDeltaAttention:
        """A course layer with the sizes, options and weights of transformers'
        ``KimiLinearDeltaAttention``.

        Raises TypeError for another class, ValueError for an option it does
        not mirror (an activation other than silu, a convolution bias).
        """
        check_hf_module(cls, module)
        if module.activation != "silu":
            raise ValueError(
                "only the silu activation is mirrored, got "
                f"hidden_act={module.activation!r}"
            )
        if module.conv1d.bias is not None:
            raise ValueError(
                "a convolution with a bias is not mirrored (Kimi Linear's "
                "has none)"
            )
        ours = cls(
            module.hidden_size,
            module.num_heads,
            module.head_dim,
            conv_kernel=module.conv_kernel_size,
            eps=module.o_norm.variance_epsilon,
        )
        ours.copy_hf_weights(module)
        return ours.to(module.q_proj.weight.dtype)

    @torch.no_grad()
    def copy_hf_weights(self, module) -> None:
        """transformers keeps q, k, v unfused and the gates low-rank, as this
        layer does: a copy per parameter."""
        for ours, theirs in (
            (self.q_proj, module.q_proj),
            (self.k_proj, module.k_proj),
            (self.v_proj, module.v_proj),
            (self.b_proj, module.b_proj),
            (self.f_a_proj, module.forget_gate.f_a_proj),
            (self.f_b_proj, module.forget_gate.f_b_proj),
            (self.g_a_proj, module.g_a_proj),
            (self.g_b_proj, module.g_b_proj),
            (self.out_proj, module.o_proj),
        ):
            ours.weight.copy_(theirs.weight)
        # (C, 1, K) -> (C, K), channels q, k, v
        self.conv_weight.copy_(module.conv1d.weight[:, 0])
        self.dt_bias.copy_(module.forget_gate.dt_bias)
        # (1, 1, H, 1) -> (H,)
        self.A_log.copy_(module.forget_gate.A_log.reshape(-1))
        self.norm.weight.copy_(module.o_norm.weight)
