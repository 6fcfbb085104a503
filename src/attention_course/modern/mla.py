"""Multi-head latent attention (MLA), DeepSeek-V2 and V3: a KV cache of one
small latent per token.

Instead of keys and values per head, each token writes a latent ``c``
(kv_lora_rank numbers, RMS-normalised) and one rotated key ``k_rope``
(qk_rope_head_dim numbers) shared by every head. Head h's key is ``[W_uk[h] c,
k_rope]`` and its value ``W_uv[h] c``, both re-computed from the latent
(:meth:`MultiHeadLatentAttention.forward`).

Because ``q_nope . (W_uk c) = (W_uk^T q_nope) . c``, the up-projection of the
keys can be moved onto the query ("absorbed") and the one of the values onto
the output: every head then attends over the *same* keys ``[c, k_rope]`` and
values ``c``, multi-query attention over the latent, and decoding reads only
the latent cache: :meth:`MultiHeadLatentAttention.forward_absorbed`. RoPE is
why the rotated part is kept apart ("decoupled"): a rotation between ``W_uk``
and ``c`` would depend on the position and could not be absorbed.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ..block import RMSNorm
from ..interop.hf import HFTwin, check_hf_module, copy_linear
from ..kv_cache import Cache
from ..positions import (
    KeepsRopeFrequencies,
    RotaryTable,
    check_pairing,
    inverse_frequencies,
    rope_table,
    rotate,
)
from ..validation import check_int
from .attention import attend, check_layer_input, layer_mask, layer_positions
from .rope_scaling import rope_from_config


class MultiHeadLatentAttention(KeepsRopeFrequencies):
    """MLA with optional low-rank queries; mirrors transformers'
    ``DeepseekV3Attention`` (``from_hf``).

    Args:
        d_model, num_heads: width D and heads H.
        q_lora_rank: width of the query latent (None: one full-rank query
            projection).
        kv_lora_rank: width C of the key/value latent, the cache per token with
            ``qk_rope_head_dim``.
        qk_nope_head_dim, qk_rope_head_dim: per-head key features without and
            with RoPE (N and R).
        v_head_dim: per-head value features V.
        pairing: RoPE layout of the rotated part ("interleaved" for DeepSeek
            checkpoints).
        scale: score scale, default 1 / sqrt(N + R).
    """

    hf_twin = HFTwin(
        "deepseek_v3.modeling_deepseek_v3",
        "DeepseekV3Attention",
        "DeepseekV3Config",
        "DeepseekV3RotaryEmbedding",
    )

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        *,
        q_lora_rank: int | None,
        kv_lora_rank: int,
        qk_nope_head_dim: int,
        qk_rope_head_dim: int,
        v_head_dim: int,
        bias: bool = False,
        rope_base: float = 10000.0,
        inv_freq: Tensor | None = None,
        rope_factor: float = 1.0,
        pairing: str = "interleaved",
        scale: float | None = None,
        norm_eps: float = 1e-6,
    ):
        super().__init__()
        for name, value in (
            ("d_model", d_model),
            ("num_heads", num_heads),
            ("kv_lora_rank", kv_lora_rank),
            ("qk_nope_head_dim", qk_nope_head_dim),
            ("qk_rope_head_dim", qk_rope_head_dim),
            ("v_head_dim", v_head_dim),
        ):
            check_int(value, name)
        if q_lora_rank is not None:
            check_int(q_lora_rank, "q_lora_rank")
        check_pairing(pairing)
        self.d_model, self.num_heads, self.kv_lora_rank = (
            d_model,
            num_heads,
            kv_lora_rank,
        )
        self.nope, self.rope_dim, self.v_dim = (
            qk_nope_head_dim,
            qk_rope_head_dim,
            v_head_dim,
        )
        self.pairing, self.rope_factor = pairing, rope_factor
        self.scale = (
            1 / math.sqrt(qk_nope_head_dim + qk_rope_head_dim)
            if scale is None
            else scale
        )
        freqs = (
            inverse_frequencies(qk_rope_head_dim, rope_base)
            if inv_freq is None
            else inv_freq.to(torch.float64)
        )
        self.register_buffer("inv_freq", freqs, persistent=False)  # (R/2,)
        q_out = num_heads * (qk_nope_head_dim + qk_rope_head_dim)
        if q_lora_rank is None:
            self.q_proj = nn.Linear(d_model, q_out, bias=False)
        # queries through a low-rank bottleneck too (saves weights and
        # activations, not cache)
        else:
            self.q_proj = nn.Sequential(
                nn.Linear(d_model, q_lora_rank, bias=bias),
                RMSNorm(q_lora_rank, norm_eps),
                nn.Linear(q_lora_rank, q_out, bias=False),
            )
        # -> [c, k_rope]
        self.kv_a_proj = nn.Linear(
            d_model, kv_lora_rank + qk_rope_head_dim, bias=bias
        )
        self.kv_norm = RMSNorm(kv_lora_rank, norm_eps)
        self.kv_b_proj = nn.Linear(
            kv_lora_rank,
            num_heads * (qk_nope_head_dim + v_head_dim),
            bias=False,
        )
        self.o_proj = nn.Linear(num_heads * v_head_dim, d_model, bias=bias)

    def rotary(self, positions: Tensor, dtype: torch.dtype) -> RotaryTable:
        """The RoPE table (cos, sin) of the rotated part at integer positions,
        computed once per forward."""
        return rope_table(positions, self.inv_freq, dtype, self.rope_factor)

    def rope(self, x: Tensor, rotary: RotaryTable) -> Tensor:
        return rotate(x, rotary, self.pairing)

    def cache_shape(self) -> tuple[int, int, int]:
        """What one position puts in a cache (a latent layer): one "head" of
        the latent C and the rotated key R."""
        return 1, self.kv_lora_rank, self.rope_dim

    def queries(self, x: Tensor, rotary: RotaryTable) -> tuple[Tensor, Tensor]:
        """x (B, T, D) -> q_nope (B, H, T, N), q_rope (B, H, T, R)
        (rotated)."""
        b, t, _ = x.shape
        # (B, H, T, N + R)
        q = self.q_proj(x).view(b, t, self.num_heads, -1).transpose(1, 2)
        q_nope, q_rope = q.split([self.nope, self.rope_dim], dim=-1)
        return q_nope, self.rope(q_rope, rotary)

    def latents(self, x: Tensor, rotary: RotaryTable) -> tuple[Tensor, Tensor]:
        """What the cache stores per token: c (B, 1, T, C) and the shared
        rotated key k_rope (B, 1, T, R)."""
        c, k_rope = self.kv_a_proj(x)[:, None].split(
            [self.kv_lora_rank, self.rope_dim], dim=-1
        )
        return self.kv_norm(c), self.rope(k_rope, rotary)

    def up_projections(self) -> tuple[Tensor, Tensor]:
        """W_uk (H, N, C) and W_uv (H, V, C): the rows of kv_b_proj that turn
        the latent into keys and values."""
        w = self.kv_b_proj.weight.view(
            self.num_heads, self.nope + self.v_dim, self.kv_lora_rank
        )
        return w[:, : self.nope], w[:, self.nope :]

    def inputs(
        self,
        x: Tensor,
        positions: Tensor | None,
        cache: Cache | None = None,
        layer: int = 0,
        rotary: RotaryTable | None = None,
    ) -> RotaryTable:
        """Check x (B, T, D); return the RoPE table of its positions (given,
        the cache's, or 0..T-1)."""
        check_layer_input(x, self.d_model)
        return (
            self.rotary(layer_positions(x, positions, cache, layer), x.dtype)
            if rotary is None
            else rotary
        )

    def forward(
        self,
        x: Tensor,
        positions: Tensor | None = None,
        *,
        cache: Cache | None = None,
        layer: int = 0,
        rotary: RotaryTable | None = None,
        head_mask: Tensor | None = None,
        weights: list | None = None,
    ) -> Tensor:
        """Plain MLA: keys and values of every head re-expanded from the
        latent. x (B, T, D) -> (B, T, D).

        With a ``cache`` the layer runs :meth:`forward_absorbed`, which reads
        the cached latents directly.
        """
        if cache is not None:
            return self.forward_absorbed(
                x,
                positions,
                cache=cache,
                layer=layer,
                rotary=rotary,
                head_mask=head_mask,
                weights=weights,
            )
        rotary = self.inputs(x, positions, rotary=rotary)
        q_nope, q_rope = self.queries(x, rotary)
        c, k_rope = self.latents(x, rotary)
        w_uk, w_uv = self.up_projections()
        # (B, H, T, N), (B, H, T, V)
        k_nope, v = c @ w_uk.transpose(-2, -1), c @ w_uv.transpose(-2, -1)
        # (B, H, T, N + R)
        k = torch.cat(
            [k_nope, k_rope.expand(-1, self.num_heads, -1, -1)], dim=-1
        )
        q = torch.cat([q_nope, q_rope], dim=-1)
        out, attention = attend(
            q,
            k,
            v,
            layer_mask(x.size(1), x.size(1), x.device, None, layer),
            scale=self.scale,
        )
        return self.output(out, attention, head_mask, weights)

    def forward_absorbed(
        self,
        x: Tensor,
        positions: Tensor | None = None,
        *,
        cache: Cache | None = None,
        layer: int = 0,
        rotary: RotaryTable | None = None,
        head_mask: Tensor | None = None,
        weights: list | None = None,
    ) -> Tensor:
        """The same output with W_uk absorbed into the queries and W_uv into
        the output: attention over the latents, the new tokens' and, with a
        ``cache``, every cached one's (the cache holds only c and k_rope)."""
        rotary = self.inputs(x, positions, cache, layer, rotary)
        q_nope, q_rope = self.queries(x, rotary)
        # the new tokens': (B, 1, T, C), (B, 1, T, R)
        c, k_rope = self.latents(x, rotary)
        if cache is not None:
            # every position's: (B, 1, Tk, C), (B, 1, Tk, R)
            c, k_rope = cache.update(layer, c, k_rope)
        mask = layer_mask(q_nope.size(2), c.size(2), x.device, cache, layer)
        return self.attend_latent(
            q_nope, q_rope, c, k_rope, mask, head_mask, weights
        )

    def attend_latent(
        self,
        q_nope: Tensor,
        q_rope: Tensor,
        c: Tensor,
        k_rope: Tensor,
        mask: Tensor,
        head_mask: Tensor | None = None,
        weights: list | None = None,
    ) -> Tensor:
        """Absorbed attention of q_nope (B, H, T, N), q_rope (B, H, T, R) over
        the latents c (B, 1, Tk, C) and k_rope (B, 1, Tk, R) under ``mask``
        (True = may attend) -> (B, T, D)."""
        w_uk, w_uv = self.up_projections()
        # (B, H, T, N) @ (H, N, C) -> (B, H, T, C): q_nope . (W_uk c) = (q_nope
        # W_uk) . c
        q_latent = q_nope @ w_uk
        q = torch.cat([q_latent, q_rope], dim=-1)  # (B, H, T, C + R)
        # (B, 1, Tk, C + R): one key "head" shared by all heads
        k = torch.cat([c, k_rope], dim=-1)
        # (B, H, T, C)
        out_latent, attention = attend(q, k, c, mask, scale=self.scale)
        # (B, H, T, V)
        return self.output(
            out_latent @ w_uv.transpose(-2, -1), attention, head_mask, weights
        )

    def output(
        self,
        out: Tensor,
        attention: Tensor,
        head_mask: Tensor | None,
        weights: list | None,
    ) -> Tensor:
        """(B, H, T, V) heads -> (B, T, D); ``head_mask`` (H,) scales each
        head, ``weights`` receives attention."""
        if weights is not None:
            weights.append(attention)
        if head_mask is not None:
            out = out * head_mask[:, None, None]
        # (B, H, T, V) -> (B, T, H * V), as merge_heads
        return self.o_proj(out.transpose(1, 2).flatten(2))

    @classmethod
    def from_hf(cls, module) -> MultiHeadLatentAttention:
        """A course MLA layer with the sizes, options and weights of
        transformers' ``DeepseekV3Attention``."""
        check_hf_module(cls, module)
        config = module.config
        if config.num_key_value_heads != config.num_attention_heads:
            raise ValueError(
                "DeepseekV3Attention expands the latent to every head: "
                "num_key_value_heads must be "
                f"num_attention_heads={config.num_attention_heads}, got "
                f"{config.num_key_value_heads}"
            )
        inv_freq, factor = rope_from_config(
            config.rope_parameters,
            module.qk_rope_head_dim,
            config.max_position_embeddings,
        )
        ours = cls(
            config.hidden_size,
            config.num_attention_heads,
            q_lora_rank=module.q_lora_rank,
            kv_lora_rank=module.kv_lora_rank,
            qk_nope_head_dim=module.qk_nope_head_dim,
            qk_rope_head_dim=module.qk_rope_head_dim,
            v_head_dim=module.v_head_dim,
            bias=module.kv_a_proj_with_mqa.bias is not None,
            inv_freq=inv_freq,
            rope_factor=factor,
            pairing="interleaved"
            if getattr(config, "rope_interleave", True)
            else "halves",
            scale=module.scaling,
            norm_eps=module.kv_a_layernorm.variance_epsilon,
        )
        if module.q_lora_rank is None:
            copy_linear(ours.q_proj, module.q_proj)
        else:
            copy_linear(ours.q_proj[0], module.q_a_proj)
            ours.q_proj[1].weight.data.copy_(module.q_a_layernorm.weight.data)
            copy_linear(ours.q_proj[2], module.q_b_proj)
        copy_linear(ours.kv_a_proj, module.kv_a_proj_with_mqa)
        ours.kv_norm.weight.data.copy_(module.kv_a_layernorm.weight.data)
        copy_linear(ours.kv_b_proj, module.kv_b_proj)
        copy_linear(ours.o_proj, module.o_proj)
        return ours.to(module.o_proj.weight.dtype)


# the name of the transformers class it mirrors
DeepseekV3Attention = MultiHeadLatentAttention
