"""Qwen3-Next's full-attention layer: chapter 14's attention with a sigmoid
gate on its output (gated attention).

Every fourth layer of Qwen3-Next is softmax attention:
:class:`~attention_course.modern.attention.ModernAttention` with grouped-query
heads, QK-norm (RMSNorm storing its scale minus 1, as Gemma's) and RoPE on the
first quarter of each head (``partial_rotary_factor = 0.25``), plus one new
line: the merged heads are multiplied by sigmoid(x W_gate) before the output
projection, a gate per head and feature computed from the layer's input (Qiu et
al., 2025). It lets a head output nothing, without the attention-sink trick of
chapter 14.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..interop.hf import HFTwin, check_hf_module, copy_linear
from ..modern.attention import ModernAttention
from ..modern.rope_scaling import rope_from_config
from ..positions import RotaryTable, rotate


class Qwen3NextAttention(ModernAttention):
    """Gated softmax attention with partial RoPE, equal to transformers'
    ``Qwen3NextAttention`` (``from_hf``).

    ``inv_freq`` of length R/2 rotates only the first R features of each head
    (R < Dh: partial RoPE).
    """

    hf_twin = HFTwin(
        "qwen3_next.modeling_qwen3_next",
        "Qwen3NextAttention",
        "Qwen3NextConfig",
        "Qwen3NextRotaryEmbedding",
    )

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        num_kv_heads: int | None = None,
        head_dim: int | None = None,
        **options,
    ):
        super().__init__(d_model, num_heads, num_kv_heads, head_dim, **options)
        self.gate_proj = nn.Linear(
            d_model,
            num_heads * self.head_dim,
            bias=self.o_proj.bias is not None,
        )

    def rope(self, x: Tensor, rotary: RotaryTable) -> Tensor:
        """Rotate the first R = 2 * len(inv_freq) features of each head, leave
        the others as they are."""
        r = 2 * self.inv_freq.numel()
        return torch.cat(
            [rotate(x[..., :r], rotary, self.pairing), x[..., r:]], dim=-1
        )

    def output(self, x: Tensor, out: Tensor) -> Tensor:
        """o_proj(out * sigmoid(gate_proj(x))): each head's output scaled
        feature by feature into (0, 1)."""
        return self.o_proj(out * torch.sigmoid(self.gate_proj(x)))

    @classmethod
    def rope_from_hf(cls, module) -> tuple[Tensor, float]:
        params = dict(module.config.rope_parameters)
        rotary = int(
            module.head_dim * params.pop("partial_rotary_factor", 1.0)
        )
        return rope_from_config(
            params, rotary, module.config.max_position_embeddings
        )

    @classmethod
    def options_from_hf(cls, module) -> dict:
        return super().options_from_hf(module) | dict(
            qk_norm_eps=module.q_norm.eps
        )

    @staticmethod
    def norm_weight(norm: nn.Module) -> Tensor:
        # Qwen3-Next's RMSNorm multiplies by (1 + weight), as Gemma's
        return 1.0 + norm.weight.data

    @classmethod
    def from_hf(cls, module) -> Qwen3NextAttention:
        """A course layer with the sizes, options and weights of transformers'
        ``Qwen3NextAttention``.

        transformers' ``q_proj`` holds, per head, the Dh query rows then the Dh
        gate rows: they are split here.
        """
        check_hf_module(cls, module)
        ours = cls(**cls.options_from_hf(module))
        with torch.no_grad():
            per_head = module.q_proj.weight.view(
                ours.num_heads, 2, ours.head_dim, ours.d_model
            )
            ours.q_proj.weight.copy_(per_head[:, 0].reshape(-1, ours.d_model))
            ours.gate_proj.weight.copy_(
                per_head[:, 1].reshape(-1, ours.d_model)
            )
            if module.q_proj.bias is not None:
                bias = module.q_proj.bias.view(
                    ours.num_heads, 2, ours.head_dim
                )
                ours.q_proj.bias.copy_(bias[:, 0].reshape(-1))
                ours.gate_proj.bias.copy_(bias[:, 1].reshape(-1))
            for name in ("k_proj", "v_proj", "o_proj"):
                copy_linear(getattr(ours, name), getattr(module, name))
            ours.q_norm.weight.copy_(cls.norm_weight(module.q_norm))
            ours.k_norm.weight.copy_(cls.norm_weight(module.k_norm))
        return ours.to(module.q_proj.weight.dtype)
