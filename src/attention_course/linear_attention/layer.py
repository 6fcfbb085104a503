"""Gated DeltaNet as Qwen3-Next runs it: the gated delta rule wrapped in
projections, a short convolution and a gated norm, equal to transformers'
``Qwen3NextGatedDeltaNet``.

Per token the layer projects x (D,) to queries and keys (H_k heads of Dk),
values and an output gate z (H heads of Dv), and two numbers per value head: b
(-> beta = sigmoid(b), the writing strength) and a (-> the decay, log alpha =
-exp(A_log) * softplus(a + dt_bias), Mamba-2's discretisation). A causal
depthwise convolution of K taps mixes each channel of q, k and v with the K - 1
tokens before it. Queries and keys are L2-normalised; the outputs of the rule
go through RMSNorm times silu(z), then the output projection.

Decoding needs only a fixed-size :class:`DeltaNetState`: the last K - 1 inputs
of the convolution and the (Dk, Dv) memory of each value head, whatever the
length of the context.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..block import RMSNorm
from ..heads import merge_heads
from ..interop.hf import HFTwin, check_hf_module
from ..kv_cache import Cache
from ..validation import check_floating, check_int, check_rank
from .rules import gated_delta_chunked, gated_delta_recurrent, normalize_qk


@dataclass
class DeltaNetState:
    """What a Gated DeltaNet layer carries from one token to the next, for each
    sequence of a batch.

    ``conv`` (B, C, K - 1): the last K - 1 inputs of the convolution (C = 2 H_k
        Dk + H Dv channels);
    ``recurrent`` (B, H, Dk, Dv): the memory of each value head. Neither grows
        with the context.
    """

    conv: Tensor
    recurrent: Tensor

    def nbytes(self) -> int:
        """Bytes of both parts, for the whole batch."""
        return sum(
            t.numel() * t.element_size() for t in (self.conv, self.recurrent)
        )


class GatedDeltaNet(nn.Module):
    """The Gated DeltaNet layer (Yang et al., 2025) with Qwen3-Next's options:
    (B, T, D) -> (B, T, D).

    Args:
        d_model: model width D.
        num_k_heads: query/key heads H_k; num_v_heads: value heads H, a
            multiple of H_k (grouped heads).
        k_head_dim, v_head_dim: Dk and Dv.
        conv_kernel: taps K of the causal depthwise convolution over q, k and
            v.
        eps: of the gated RMSNorm on the output.
        chunk_size: of the chunked form that :meth:`forward` uses (the result
            does not depend on it).
    """

    hf_twin = HFTwin(
        "qwen3_next.modeling_qwen3_next", "Qwen3NextGatedDeltaNet"
    )

    def __init__(
        self,
        d_model: int,
        num_k_heads: int,
        num_v_heads: int,
        k_head_dim: int,
        v_head_dim: int,
        *,
        conv_kernel: int = 4,
        eps: float = 1e-6,
        chunk_size: int = 64,
    ):
        super().__init__()
        for name, value in (
            ("d_model", d_model),
            ("num_k_heads", num_k_heads),
            ("num_v_heads", num_v_heads),
            ("k_head_dim", k_head_dim),
            ("v_head_dim", v_head_dim),
            ("conv_kernel", conv_kernel),
            ("chunk_size", chunk_size),
        ):
            check_int(value, name)
        if num_v_heads % num_k_heads:
            raise ValueError(
                f"num_v_heads={num_v_heads} must be a multiple of "
                f"num_k_heads={num_k_heads}"
            )
        self.d_model, self.num_k_heads, self.num_v_heads = (
            d_model,
            num_k_heads,
            num_v_heads,
        )
        self.k_head_dim, self.v_head_dim = k_head_dim, v_head_dim
        self.conv_kernel, self.chunk_size = conv_kernel, chunk_size
        key_dim, value_dim = num_k_heads * k_head_dim, num_v_heads * v_head_dim
        self.q_proj = nn.Linear(d_model, key_dim, bias=False)
        self.k_proj = nn.Linear(d_model, key_dim, bias=False)
        self.v_proj = nn.Linear(d_model, value_dim, bias=False)
        # the output gate
        self.z_proj = nn.Linear(d_model, value_dim, bias=False)
        # beta = sigmoid(b)
        self.b_proj = nn.Linear(d_model, num_v_heads, bias=False)
        # the decay's input
        self.a_proj = nn.Linear(d_model, num_v_heads, bias=False)
        # (C, K)
        self.conv_weight = nn.Parameter(
            torch.randn(2 * key_dim + value_dim, conv_kernel) / conv_kernel
        )
        self.A_log = nn.Parameter(torch.zeros(num_v_heads))
        self.dt_bias = nn.Parameter(torch.ones(num_v_heads))
        self.norm = RMSNorm(v_head_dim, eps=eps)
        self.out_proj = nn.Linear(value_dim, d_model, bias=False)

    def init_state(
        self, batch: int, dtype=torch.float32, device=None
    ) -> DeltaNetState:
        """The state before the first token: zeros (no past inputs, an empty
        memory)."""
        channels = self.conv_weight.size(0)
        return DeltaNetState(
            torch.zeros(
                batch,
                channels,
                self.conv_kernel - 1,
                dtype=dtype,
                device=device,
            ),
            torch.zeros(
                batch,
                self.num_v_heads,
                self.k_head_dim,
                self.v_head_dim,
                dtype=dtype,
                device=device,
            ),
        )

    def convolve(self, x: Tensor, past: Tensor) -> tuple[Tensor, Tensor]:
        """Causal depthwise convolution, then silu: x (B, T, C) after ``past``
        (B, C, K - 1) -> (B, T, C), new past."""
        # (B, C, K - 1 + T): the past inputs, then the new
        seq = torch.cat([past, x.transpose(1, 2)], dim=-1)
        # (B, C, T): K taps per channel
        out = F.conv1d(seq, self.conv_weight[:, None, :], groups=seq.size(1))
        return F.silu(out).transpose(1, 2), seq[
            ..., seq.size(-1) - past.size(-1) :
        ]

    def gates(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """beta = sigmoid(b) and log alpha = -exp(A_log) * softplus(a +
        dt_bias), each (B, H, T)."""
        beta = torch.sigmoid(self.b_proj(x))  # (B, T, H)
        # (B, T, H), <= 0
        log_decay = -self.A_log.exp() * F.softplus(
            self.a_proj(x) + self.dt_bias
        )
        return beta.transpose(1, 2), log_decay.transpose(1, 2)

    def output_gate(self, x: Tensor) -> Tensor:
        """silu(z) per value head (B, H, T, Dv): what multiplies the RMSNorm of
        the rule's outputs."""
        return F.silu(self.heads(self.z_proj(x), self.num_v_heads))

    def sequence_rule(self, *args) -> tuple[Tensor, Tensor]:
        """The form :meth:`forward` computes a whole sequence with: the chunked
        one."""
        return gated_delta_chunked(*args, chunk_size=self.chunk_size)

    def heads(self, x: Tensor, num_heads: int) -> Tensor:
        """(B, T, heads * Dh) -> (B, heads, T, Dh)."""
        b, t, _ = x.shape
        return x.view(b, t, num_heads, -1).transpose(1, 2)

    def mix(
        self, x: Tensor, state: DeltaNetState, rule
    ) -> tuple[Tensor, DeltaNetState]:
        """x (B, T, D) after ``state`` -> (B, T, D) and the state after x, the
        delta rule computed by ``rule``."""
        key_dim = self.num_k_heads * self.k_head_dim
        qkv, conv = self.convolve(
            torch.cat([self.q_proj(x), self.k_proj(x), self.v_proj(x)], -1),
            state.conv,
        )
        q, k, v = qkv.split(
            [key_dim, key_dim, qkv.size(-1) - 2 * key_dim], dim=-1
        )
        # (B, H_k, T, Dk)
        q, k = normalize_qk(
            self.heads(q, self.num_k_heads), self.heads(k, self.num_k_heads)
        )
        v = self.heads(v, self.num_v_heads)  # (B, H, T, Dv)
        beta, log_decay = self.gates(x)
        # (B, H, T, Dv)
        out, memory = rule(q, k, v, beta, log_decay, state.recurrent)
        out = self.norm(out) * self.output_gate(x)  # gated RMSNorm per head
        return self.out_proj(merge_heads(out)), DeltaNetState(conv, memory)

    def check_input(
        self, x: Tensor, state: DeltaNetState | None
    ) -> DeltaNetState:
        check_floating(x, "x")
        check_rank(x, "x", 3, "(B, T, D)")
        if x.size(-1) != self.d_model:
            raise ValueError(
                f"x has width {x.size(-1)}, the layer was built for "
                f"d_model={self.d_model}"
            )
        if x.size(1) == 0:
            raise ValueError("x is an empty sequence (T = 0)")
        if state is None:
            return self.init_state(x.size(0), x.dtype, x.device)
        if not isinstance(state, DeltaNetState):
            raise TypeError(
                "state must be a DeltaNetState (from init_state or "
                f"forward), got {type(state).__name__}"
            )
        expected = self.init_state(x.size(0), x.dtype)
        for name in ("conv", "recurrent"):
            if getattr(state, name).shape != getattr(expected, name).shape:
                raise ValueError(
                    f"state.{name} has shape "
                    f"{tuple(getattr(state, name).shape)}, expected "
                    f"{tuple(getattr(expected, name).shape)} for a batch of "
                    f"{x.size(0)}"
                )
        return state

    def forward(
        self,
        x: Tensor,
        state: DeltaNetState | None = None,
        return_state: bool = False,
        *,
        cache: Cache | None = None,
        layer: int = 0,
        **_attention_options,
    ):
        """x (B, T, D) -> (B, T, D) through the chunked form; with
        ``return_state`` also the state after x.

        ``state`` continues a sequence (a prompt already read); None starts
        each sequence of the batch afresh. With a ``cache``
        (:class:`~attention_course.kv_cache.Cache`, the recurrent kind) the
        layer reads and keeps each sequence's state there (slot ``layer``),
        segment by segment of a packed row; a GPT's options for attention
        layers (``rotary``, ``head_mask``, ``weights``) do not concern it.
        """
        if cache is not None:
            return self.forward_cached(x, cache, layer)
        state = self.check_input(x, state)
        out, state = self.mix(x, state, self.sequence_rule)
        return (out, state) if return_state else out

    def forward_cached(self, x: Tensor, cache: Cache, layer: int) -> Tensor:
        """Each sequence's segment of x (B, T, D) continues from its state in
        the cache, which keeps the new one."""
        outputs = []
        for seq, start, end in cache.segments(x.size(1)):
            segment = x[:, start:end]
            out, state = self.mix(
                segment,
                self.check_input(segment, cache.state(layer, seq)),
                self.sequence_rule,
            )
            cache.set_state(layer, state, end - start, seq)
            outputs.append(out)
        return torch.cat(outputs, dim=1)

    def step(
        self, x_t: Tensor, state: DeltaNetState | None = None
    ) -> tuple[Tensor, DeltaNetState]:
        """Decode one token: x_t (B, D) -> (y_t (B, D), the new state), through
        the recurrent form.

        The cost of a step does not depend on how many tokens came before: the
        state has a fixed size.
        """
        check_rank(x_t, "x_t", 2, "(B, D)")
        x = x_t[:, None]  # (B, 1, D)
        out, state = self.mix(
            x, self.check_input(x, state), gated_delta_recurrent
        )
        return out[:, 0], state

    def state_elements(self) -> int:
        """Numbers in one sequence's state: conv (C, K - 1) plus memory (H, Dk,
        Dv)."""
        return (
            self.conv_weight.size(0) * (self.conv_kernel - 1)
            + self.num_v_heads * self.k_head_dim * self.v_head_dim
        )

    # ------------------------------------------------------------ conversion
    # from Hugging Face transformers

    @classmethod
    def from_hf(cls, module) -> GatedDeltaNet:
        """A course layer with the sizes, options and weights of transformers'
        ``Qwen3NextGatedDeltaNet``.

        Raises TypeError for another class, ValueError for an option the course
        layer does not mirror (an activation other than silu, a convolution
        bias).
        """
        check_hf_module(cls, module)
        if module.activation != "silu" or module.norm.activation != "silu":
            raise ValueError(
                "only the silu activation is mirrored, got "
                f"hidden_act={module.activation!r}"
            )
        if module.conv1d.bias is not None:
            raise ValueError(
                "a convolution with a bias is not mirrored (Qwen3-Next's "
                "has none)"
            )
        ours = cls(
            module.hidden_size,
            module.num_k_heads,
            module.num_v_heads,
            module.head_k_dim,
            module.head_v_dim,
            conv_kernel=module.conv_kernel_size,
            eps=module.norm.variance_epsilon,
        )
        ours.copy_hf_weights(module)
        return ours.to(module.in_proj_qkvz.weight.dtype)

    @torch.no_grad()
    def copy_hf_weights(self, module) -> None:
        """Unpack transformers' fused projections, laid out per key head group:
        [q, k, v..., z...] and [b..., a...]."""
        # value heads per key head
        groups = self.num_v_heads // self.num_k_heads
        dk, gdv = self.k_head_dim, groups * self.v_head_dim
        qkvz = module.in_proj_qkvz.weight.view(
            self.num_k_heads, 2 * dk + 2 * gdv, self.d_model
        )
        for proj, part in zip(
            (self.q_proj, self.k_proj, self.v_proj, self.z_proj),
            qkvz.split([dk, dk, gdv, gdv], dim=1),
            strict=True,
        ):
            proj.weight.copy_(part.reshape(-1, self.d_model))
        ba = module.in_proj_ba.weight.view(
            self.num_k_heads, 2 * groups, self.d_model
        )
        b, a = ba.split([groups, groups], dim=1)
        self.b_proj.weight.copy_(b.reshape(-1, self.d_model))
        self.a_proj.weight.copy_(a.reshape(-1, self.d_model))
        # (C, 1, K) -> (C, K), channels q, k, v as ours
        self.conv_weight.copy_(module.conv1d.weight[:, 0])
        self.A_log.copy_(module.A_log)
        self.dt_bias.copy_(module.dt_bias)
        self.norm.weight.copy_(module.norm.weight)
        self.out_proj.weight.copy_(module.out_proj.weight)
