"""The attention layer of today's open decoders, with the switches that tell
the models apart.

One module, :class:`ModernAttention`, is causal self-attention with
grouped-query heads (GQA) and RoPE, plus the options the models added, each one
line of :meth:`ModernAttention.forward`:

* ``qk_norm``: RMSNorm of each head's queries and keys before RoPE (Qwen3, OLMo
  2, Gemma 3);
* ``scale``: the score scale when it is not ``1 / sqrt(Dh)`` (Gemma's
  ``query_pre_attn_scalar``);
* ``softcap``: logit soft-capping ``cap * tanh(s / cap)`` (Gemma 2);
* ``window``: sliding-window attention, query i sees keys j with 0 <= i - j <
  window (Mistral, Gemma, GPT-OSS);
* ``sinks``: one learned logit per head that joins the softmax but has no value
  (GPT-OSS);
* ``inv_freq`` and ``rope_factor``: rescaled RoPE frequencies for long contexts
  (Llama 3, YaRN).

The scores go through the course's one
:func:`~attention_course.functional.attend` (soft-capping is its score mod, a
sink one more softmax column; grouped key/value heads repeated as
:func:`~attention_course.kv_cache.repeat_kv` does), the rotations through
:func:`~attention_course.positions.apply_rope`. Each model's class
(:mod:`attention_course.modern.families`) only reads its Hugging Face
configuration in ``from_hf``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ..block import RMSNorm
from ..functional import _attend, softcap_mod
from ..interop.hf import HFTwin, check_hf_module, copy_linear, hf_window
from ..kv_cache import Cache
from ..masks import causal_mask, sliding_window_mask
from ..positions import (
    KeepsRopeFrequencies,
    RotaryTable,
    check_pairing,
    inverse_frequencies,
    rope_table,
    rotate,
)
from ..validation import INTEGER_DTYPES, check_int, check_rank


def attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor,
    *,
    scale: float,
    softcap: float | None = None,
    sinks: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Attention with a given score scale, optional soft-capping and sinks ->
    (out (..., Tq, Dv), weights).

    q (B, H, Tq, Dk), k (B, H_kv, Tk, Dk), v (B, H_kv, Tk, Dv); mask boolean
    (Tq, Tk), True = may attend; sinks (H,). The cap bounds the *scores*
    (before the mask and the softmax), never the probabilities:
    :func:`~attention_course.functional.softcap_mod`. A sink is one more column
    of the softmax with the same logit for every query of its head: it takes
    weight away from the keys and gives back nothing, so a query may attend
    "nowhere" (weights summing to less than 1):
    :func:`~attention_course.functional.add_sinks`. Chapter 2's attention
    computes the rest: this is a face of
    :func:`~attention_course.functional.attend`'s eager backend.
    """
    # cap * tanh(score / cap), within (-cap, cap)
    score_mod = None if softcap is None else softcap_mod(softcap)
    # (B, H, Tq, Dv), (B, H, Tq, Tk)
    return _attend(
        q, k, v, mask, scale=scale, score_mod=score_mod, sinks=sinks
    )


def check_positions_for(positions, batch: int, t: int) -> Tensor:
    """Positions (T,) or (B, T) as a tensor that broadcasts over heads: (T,) or
    (B, 1, T)."""
    if (
        not isinstance(positions, Tensor)
        or positions.dtype not in INTEGER_DTYPES
    ):
        got = (
            positions.dtype
            if isinstance(positions, Tensor)
            else type(positions).__name__
        )
        raise TypeError(
            f"positions must be an integer tensor (T,) or (B, T), got {got}"
        )
    if tuple(positions.shape) not in ((t,), (batch, t)):
        raise ValueError(
            f"positions must have shape ({t},) or ({batch}, {t}), got "
            f"{tuple(positions.shape)}"
        )
    return positions if positions.dim() == 1 else positions[:, None, :]


def check_layer_input(x, d_model: int) -> None:
    """x must be a floating-point (B, T, D) tensor of the layer's width."""
    check_rank(x, "x", 3, "(B, T, D)")
    if not x.is_floating_point():
        raise TypeError(f"x must be a floating-point tensor, got {x.dtype}")
    if x.size(-1) != d_model:
        raise ValueError(
            f"x has width {x.size(-1)}, the layer was built for "
            f"d_model={d_model}"
        )


def layer_positions(
    x: Tensor, positions: Tensor | None, cache: Cache | None, layer: int
) -> Tensor:
    """The positions of x's tokens: given, else the cache's (after the cached
    ones), else 0..T-1; as (T,) or (B, 1, T), broadcasting over heads."""
    b, t, _ = x.shape
    if positions is None:
        positions = (
            torch.arange(t, device=x.device)
            if cache is None
            else cache.positions(layer, t, x.device)
        )
    return check_positions_for(positions, b, t)


def layer_mask(
    t_q: int,
    t_k: int,
    device,
    cache: Cache | None,
    layer: int,
    window: int | None = None,
) -> Tensor:
    """(Tq, Tk) boolean, bottom-right: the cache's own mask when it has one (a
    paged cache packs several sequences), else causal, within the window on a
    sliding layer."""
    mask = (
        None
        if cache is None
        else cache.mask(layer, t_q, t_k, device, window=window)
    )
    if mask is not None:
        return mask
    if window is None:
        return causal_mask(t_q, t_k, device=device)
    return sliding_window_mask(t_q, t_k, window, device=device)


class ModernAttention(KeepsRopeFrequencies):
    """Causal self-attention with GQA, RoPE and the options of today's open
    models (see the module docstring).

    Args:
        d_model: model width D.
        num_heads: query heads H.
        num_kv_heads: key/value heads (H: multi-head, 1: multi-query, in
            between: grouped-query); default H.
        head_dim: Dh, default D // H (Gemma and Qwen3 use other values).
        bias: biases in the four projections.
        rope_base: theta of plain RoPE; ``inv_freq`` (Dh/2,) replaces its
            frequencies when given.
        rope_factor: multiplies cos and sin (YaRN's attention factor).
        pairing: the RoPE layout, "halves" as Hugging Face checkpoints or
            "interleaved".
        scale: score scale, default 1 / sqrt(Dh).
        softcap, window, qk_norm_eps: off when None; ``sinks=True`` adds one
            learned logit per head.
    """

    # the transformers class it mirrors, set by each model's subclass
    hf_twin: HFTwin | None = None

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        num_kv_heads: int | None = None,
        head_dim: int | None = None,
        *,
        bias: bool = False,
        rope_base: float = 10000.0,
        inv_freq: Tensor | None = None,
        rope_factor: float = 1.0,
        pairing: str = "halves",
        scale: float | None = None,
        softcap: float | None = None,
        window: int | None = None,
        sinks: bool = False,
        qk_norm_eps: float | None = None,
    ):
        super().__init__()
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        head_dim = d_model // num_heads if head_dim is None else head_dim
        for name, value in (
            ("d_model", d_model),
            ("num_heads", num_heads),
            ("num_kv_heads", num_kv_heads),
            ("head_dim", head_dim),
        ):
            check_int(value, name)
        if num_heads % num_kv_heads:
            raise ValueError(
                f"num_heads={num_heads} must be a multiple of "
                f"num_kv_heads={num_kv_heads}"
            )
        if window is not None:
            check_int(window, "window")
        if softcap is not None and not softcap > 0:
            raise ValueError(f"softcap must be > 0, got softcap={softcap}")
        check_pairing(pairing)
        self.d_model, self.num_heads, self.num_kv_heads, self.head_dim = (
            d_model,
            num_heads,
            num_kv_heads,
            head_dim,
        )
        self.pairing, self.rope_factor, self.softcap, self.window = (
            pairing,
            rope_factor,
            softcap,
            window,
        )
        self.scale = 1 / math.sqrt(head_dim) if scale is None else scale
        freqs = (
            inverse_frequencies(head_dim, rope_base)
            if inv_freq is None
            else inv_freq.to(torch.float64)
        )
        self.register_buffer("inv_freq", freqs, persistent=False)  # (Dh/2,)
        self.q_proj = nn.Linear(d_model, num_heads * head_dim, bias=bias)
        self.k_proj = nn.Linear(d_model, num_kv_heads * head_dim, bias=bias)
        self.v_proj = nn.Linear(d_model, num_kv_heads * head_dim, bias=bias)
        self.o_proj = nn.Linear(num_heads * head_dim, d_model, bias=bias)
        self.q_norm = (
            None if qk_norm_eps is None else RMSNorm(head_dim, eps=qk_norm_eps)
        )
        self.k_norm = (
            None if qk_norm_eps is None else RMSNorm(head_dim, eps=qk_norm_eps)
        )
        self.sinks = nn.Parameter(torch.zeros(num_heads)) if sinks else None

    def heads(self, x: Tensor, proj: nn.Linear) -> Tensor:
        """(B, T, D) -> (B, heads, T, Dh) through one projection."""
        b, t, _ = x.shape
        return proj(x).view(b, t, -1, self.head_dim).transpose(1, 2)

    def rotary(self, positions: Tensor, dtype: torch.dtype) -> RotaryTable:
        """The RoPE table (cos, sin) of integer positions (T,) or (B, 1, T),
        rescaled frequencies and factor
        included: computed once per forward (by the model, or by the layer for
            q and k together)."""
        return rope_table(positions, self.inv_freq, dtype, self.rope_factor)

    def rope(self, x: Tensor, rotary: RotaryTable) -> Tensor:
        """Rotate (B, heads, T, Dh) queries or keys with the table of their
        positions."""
        return rotate(x, rotary, self.pairing)

    def cache_shape(self) -> tuple[int, int, int]:
        """(H_kv, key size, value size) of what one position of this layer puts
        in a cache."""
        return self.num_kv_heads, self.head_dim, self.head_dim

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
        """x (B, T, D) at integer positions (T,) or (B, T) (default 0..T-1) ->
        (B, T, D).

        With a ``cache`` (:class:`~attention_course.kv_cache.Cache`), x holds
        the new tokens: their positions come from the cache, their keys and
        values join it (slot ``layer``), the queries see everything cached.
        ``rotary``: the model's RoPE table for these positions; ``head_mask``
        (H,) scales each head's output and ``weights`` (a list) receives the
        attention weights (B, H, Tq, Tk), as in chapter 8's layer.
        """
        check_layer_input(x, self.d_model)
        positions = layer_positions(x, positions, cache, layer)
        q, k, v = (
            self.heads(x, self.q_proj),
            self.heads(x, self.k_proj),
            self.heads(x, self.v_proj),
        )
        # normalise first: RoPE must rotate the vectors the scores will compare
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        # cos/sin once for q and k
        rotary = self.rotary(positions, x.dtype) if rotary is None else rotary
        # (B, H, T, Dh), (B, H_kv, T, Dh)
        q, k = self.rope(q, rotary), self.rope(k, rotary)
        if cache is not None:
            # (B, H_kv, Tk, Dh): the cached keys and the new ones
            k, v = cache.update(layer, k, v)
        mask = layer_mask(
            q.size(2), k.size(2), x.device, cache, layer, self.window
        )
        out, attention = attend(
            q,
            k,
            v,
            mask,
            scale=self.scale,
            softcap=self.softcap,
            sinks=self.sinks,
        )
        if weights is not None:
            weights.append(attention)
        if head_mask is not None:
            # (H, 1, 1) over (B, H, T, Dh)
            out = out * head_mask[:, None, None]
        # (B, H, T, Dh) -> (B, T, H * Dh) -> (B, T, D)
        return self.output(x, out.transpose(1, 2).flatten(2))

    def output(self, x: Tensor, out: Tensor) -> Tensor:
        """The output projection of the merged heads out (B, T, H * Dh); x (B,
        T, D) is the layer's input (Qwen3-Next's gated attention computes its
        output gate from it)."""
        return self.o_proj(out)

    # ------------------------------------------------------------ conversion
    # from Hugging Face transformers

    @classmethod
    def options_from_hf(cls, module) -> dict:
        """The constructor's options read from the module and its config (each
        model's class adds its own)."""
        config = module.config
        inv_freq, factor = cls.rope_from_hf(module)
        return dict(
            d_model=config.hidden_size,
            num_heads=config.num_attention_heads,
            num_kv_heads=config.num_key_value_heads,
            head_dim=module.head_dim,
            bias=module.q_proj.bias is not None,
            inv_freq=inv_freq,
            rope_factor=factor,
            scale=module.scaling,
            window=hf_window(module),
        )

    @classmethod
    def rope_from_hf(cls, module) -> tuple[Tensor, float]:
        """(inv_freq, cos/sin factor) of the module's rotary embedding,
        computed by the course."""
        from .rope_scaling import rope_from_config

        config = module.config
        return rope_from_config(
            config.rope_parameters,
            module.head_dim,
            config.max_position_embeddings,
        )

    @classmethod
    def from_hf(cls, module) -> ModernAttention:
        """A course layer with the sizes, options and weights of a transformers
        attention module (eager).

        Raises TypeError when ``module`` is not the transformers class this
        class mirrors.
        """
        check_hf_module(cls, module)
        ours = cls(**cls.options_from_hf(module))
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            copy_linear(getattr(ours, name), getattr(module, name))
        if ours.q_norm is not None:
            ours.q_norm.weight.data.copy_(cls.norm_weight(module.q_norm))
            ours.k_norm.weight.data.copy_(cls.norm_weight(module.k_norm))
        if ours.sinks is not None:
            ours.sinks.data.copy_(module.sinks.data)
        return ours.to(module.q_proj.weight.dtype)

    @staticmethod
    def norm_weight(norm: nn.Module) -> Tensor:
        """The scale an HF RMSNorm applies (Llama and Qwen store it as is;
        Gemma stores it minus 1)."""
        return norm.weight.data
