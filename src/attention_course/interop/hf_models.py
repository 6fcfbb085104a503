"""The reference side of Hugging Face ``transformers``: its models built
offline, run, and made from the course's.

Chapter 14 (attention layers): :func:`build_hf_attention` makes one layer of a
model family with random weights (no
download: set ``HF_HUB_OFFLINE=1``); :func:`hf_forward` runs it as the model
would for causal self-attention: the cos and sin of the model's own rotary
embedding at the given position ids, and an additive float mask (B, 1, T, T)
that is 0 where a query may attend and the dtype's minimum elsewhere (the
window of a sliding layer included, as the model's mask builder does);
:func:`hf_decode` runs it through HF's own cache. Each family maps to the
course class that mirrors it (:data:`FAMILIES`).

Hugging Face computes the RoPE angles, the softmax and the norms in float32
even in a float64 module, so a course layer in float64 agrees with it to about
1e-7 relative (1e-6 is the bound the tests and chapter use), not 1e-15.

Chapter 17 (linear attention): :func:`build_hf_gated_deltanet` and
:func:`build_hf_kimi_delta`. Without the optional kernel packages
(flash-linear-attention, causal-conv1d; do not install them on a CPU machine:
with them transformers binds GPU kernels) ``Qwen3NextGatedDeltaNet`` runs its
pure-PyTorch fallbacks and logs a one-line notice per function:
:func:`quiet_transformers` silences that logger. The fallbacks compute the
recurrence in float32 whatever the module's dtype, so a comparison with the
course's layer is made in float32.

Chapter 18 (serving): :func:`to_hf_starcoder2`, the course's GPT as a
``transformers`` model, so that both engines decode the same weights. A
:class:`~attention_course.gpt.GPT` with rotary positions, biases and the exact
GELU is, layer for layer, a StarCoder2 (pre-LN attention with biased q/k/v/o
projections and grouped-query heads, then a pre-LN two-layer GELU MLP,
LayerNorm at the end). One layout differs: StarCoder2 rotates the feature pairs
(i, i + Dh/2) (``rotate_half``) where the course rotates (2i, 2i + 1)
("interleaved"). Permuting each head's query and key features from interleaved
to halves order changes no dot product q . k, so it turns one rotation into the
other.

This module imports the course's classes of chapters 14 and 17 (the twins'
table), so no chapter's package imports it; :mod:`attention_course.interop.hf`
holds what the course's classes themselves share.
"""

from __future__ import annotations

import importlib
import logging

import torch
from torch import Tensor

from ..linear_attention.gated_attention import Qwen3NextAttention
from ..modern import families
from ..modern.mla import MultiHeadLatentAttention
from ..sparse.attention import DeepseekV32Attention, GlmMoeDsaAttention
from ..sparse.compressed import CompressedAttention
from .hf import hf_window

# family -> the course class that mirrors its attention layer (its ``hf_twin``
# names the transformers classes)
FAMILIES = {
    "llama": families.LlamaAttention,
    "mistral": families.MistralAttention,
    "qwen3": families.Qwen3Attention,
    "gemma2": families.Gemma2Attention,
    "gemma3": families.Gemma3Attention,
    "gpt_oss": families.GptOssAttention,
    "deepseek_v3": MultiHeadLatentAttention,
    "qwen3_next": Qwen3NextAttention,  # chapter 17: gated attention
    "deepseek_v32": DeepseekV32Attention,  # chapter 19: sparse MLA
    "glm_moe_dsa": GlmMoeDsaAttention,
    "deepseek_v4": CompressedAttention,  # chapter 19: compressed attention
}


def _twin(family: str):
    if family not in FAMILIES:
        raise ValueError(
            f"family must be one of {sorted(FAMILIES)}, got family={family!r}"
        )
    return FAMILIES[family].hf_twin


def build_hf_attention(
    family: str,
    layer_idx: int = 0,
    *,
    dtype=torch.float64,
    seed: int = 0,
    **config,
):
    """One eager attention layer of ``family`` from a config of the given
    sizes, every parameter ~ N(0, 0.3^2).

    ``config`` holds the config's keyword arguments (hidden_size,
    num_attention_heads, ...); the layer count is ``layer_idx + 1`` unless
    ``layer_types`` says otherwise. Random sinks and norm weights make those
    options visible (HF initialises norm weights to one, Gemma's to zero, which
    would hide a wrong norm).
    """
    twin = _twin(family)
    config.setdefault(
        "num_hidden_layers",
        len(config.get("layer_types") or ()) or layer_idx + 1,
    )
    hf_config = getattr(importlib.import_module("transformers"), twin.config)(
        intermediate_size=8,
        vocab_size=16,
        attn_implementation="eager",
        **config,
    )
    return random_weights(
        twin.load()(hf_config, layer_idx), seed=seed, dtype=dtype
    )


def random_weights(
    layer: torch.nn.Module, *, seed: int, dtype, scale: float = 0.3
) -> torch.nn.Module:
    """Every parameter of ``layer`` drawn ~ N(0, scale^2) from a seeded
    generator; the layer in ``dtype``, eval mode."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(scale * torch.randn(p.shape, generator=generator))
    return layer.to(dtype).eval()


def hf_forward(layer, x: Tensor, positions: Tensor | None = None) -> Tensor:
    """Run a transformers attention layer on x (B, T, D) at position ids (T,)
    or (B, T) -> (B, T, D)."""
    b, t, _ = x.shape
    positions = torch.arange(t) if positions is None else positions
    with torch.no_grad():
        return _hf_call(layer, x, positions.expand(b, t), t)


def hf_decode(layer, x: Tensor, prefill: int, *, chunk: int = 1) -> Tensor:
    """Run a transformers attention layer through Hugging Face's own cache
    (``DynamicCache`` built from the layer's
    config: a sliding layer keeps its window) as generation does: the first
    ``prefill`` positions of x (B, T, D) at once, then ``chunk`` tokens at a
    time (1: one token, as decoding; more: chunked prefill) -> (B, T, D)."""
    from transformers import DynamicCache

    cache, b, t = DynamicCache(config=layer.config), x.size(0), x.size(1)
    window, outputs = hf_window(layer), []
    with torch.no_grad():
        for start, end in [
            (0, prefill),
            *((p, min(p + chunk, t)) for p in range(prefill, t, chunk)),
        ]:
            # what the cache still holds
            kept = start if window is None else min(start, window - 1)
            positions = torch.arange(start, end).expand(b, end - start)
            outputs.append(
                _hf_call(
                    layer,
                    x[:, start:end],
                    positions,
                    kept + end - start,
                    cache,
                )
            )
    return torch.cat(outputs, dim=1)


def _hf_call(
    layer, x: Tensor, position_ids: Tensor, t_k: int, cache=None
) -> Tensor:
    """One call of an HF layer: its model's rotary cos/sin and an additive (B,
    1, Tq, Tk) bottom-right mask."""
    family = next(
        (
            f
            for f, cls in FAMILIES.items()
            if type(layer).__name__ == cls.hf_twin.name
        ),
        None,
    )
    if family is None:
        raise TypeError(
            "layer must be one of the transformers attention classes of "
            f"{sorted(FAMILIES)}, "
            f"got {type(layer).__name__}"
        )
    twin = _twin(family)
    b, t_q, _ = x.shape
    rotary = twin.load(twin.rotary)(layer.config)
    if family == "deepseek_v4":
        # one table per RoPE kind, and the positions for the compressors
        tables = {
            kind: rotary(x, position_ids, layer_type=kind)
            for kind in ("main", "compress")
        }
    else:
        rotary_args = (layer.layer_type,) if family == "gemma3" else ()
        tables = rotary(x, position_ids, *rotary_args)
    i, j = torch.arange(t_q)[:, None] + (t_k - t_q), torch.arange(t_k)[None, :]
    allowed = j <= i
    window = hf_window(layer)
    if window is not None:
        allowed &= i - j < window
    mask = torch.zeros(b, 1, t_q, t_k, dtype=x.dtype).masked_fill(
        ~allowed, torch.finfo(x.dtype).min
    )
    extra = {"position_ids": position_ids} if family == "deepseek_v4" else {}
    return layer(
        x,
        position_embeddings=tables,
        attention_mask=mask,
        cache=cache,
        **extra,
    )[0]


def relative_error(ours: Tensor, ref: Tensor) -> float:
    """max |ours - ref| / max |ref|: a disagreement measured against the size
    of the output."""
    return float(
        (ours.detach() - ref.detach()).abs().max() / ref.detach().abs().max()
    )


def hf_cache_bytes(cache) -> int:
    """Bytes of the keys and values a transformers cache holds (a shared layer
    holds none)."""
    return sum(
        t.numel() * t.element_size()
        for layer in cache.layers
        for t in (getattr(layer, "keys", None), getattr(layer, "values", None))
        if t is not None
    )


# chapter 17: the linear-attention layers of Qwen3-Next and Kimi Linear

KERNEL_LOGGER = "transformers.integrations.hub_kernels"


def quiet_transformers() -> None:
    """Silence transformers' "falling back to its reference PyTorch
    implementation" notices (one per function)."""
    logging.getLogger(KERNEL_LOGGER).setLevel(logging.ERROR)


def build_hf_gated_deltanet(
    *, dtype=torch.float32, seed: int = 0, scale: float = 0.3, **config
):
    """transformers' ``Qwen3NextGatedDeltaNet`` from a config of the given
    sizes, every parameter ~ N(0, scale^2).

    ``config`` holds Qwen3NextConfig keyword arguments: hidden_size,
    linear_num_key_heads, linear_num_value_heads, linear_key_head_dim,
    linear_value_head_dim, linear_conv_kernel_dim (and hidden_act to see a
    refusal). Random norm weights, A_log and dt_bias make those parameters
    visible (a wrong copy would not hide).
    """
    from transformers import Qwen3NextConfig
    from transformers.models.qwen3_next.modeling_qwen3_next import (
        Qwen3NextGatedDeltaNet,
    )

    quiet_transformers()
    hf_config = Qwen3NextConfig(
        num_hidden_layers=1,
        layer_types=["linear_attention"],
        intermediate_size=8,
        vocab_size=16,
        **config,
    )
    return random_weights(
        Qwen3NextGatedDeltaNet(hf_config, 0),
        seed=seed,
        dtype=dtype,
        scale=scale,
    )


def hf_deltanet_forward(layer, x: Tensor) -> Tensor:
    """Run transformers' Gated DeltaNet layer on x (B, T, D) without a cache
    (its chunked fallback) -> (B, T, D)."""
    quiet_transformers()
    with torch.no_grad():
        return layer(x)


def build_hf_kimi_delta(
    *, dtype=torch.float32, seed: int = 0, scale: float = 0.3, **config
):
    """transformers' ``KimiLinearDeltaAttention`` from a config of the given
    sizes, every parameter ~ N(0, scale^2).

    ``config`` holds KimiLinearConfig keyword arguments: hidden_size,
    linear_num_heads, linear_head_dim, linear_conv_kernel_dim (and hidden_act
    to see a refusal).
    """
    from transformers import KimiLinearConfig
    from transformers.models.kimi_linear.modeling_kimi_linear import (
        KimiLinearDeltaAttention,
    )

    quiet_transformers()
    hf_config = KimiLinearConfig(
        num_hidden_layers=1,
        layer_types=["linear_attention"],
        intermediate_size=8,
        vocab_size=16,
        pad_token_id=None,
        bos_token_id=None,
        eos_token_id=None,
        **config,
    )
    return random_weights(
        KimiLinearDeltaAttention(hf_config, 0),
        seed=seed,
        dtype=dtype,
        scale=scale,
    )


# chapter 18: the course's GPT as a StarCoder2


def interleaved_to_halves(head_dim: int) -> torch.Tensor:
    """(Dh,) feature order that puts pair (2i, 2i + 1) at (i, i + Dh/2): [0, 2,
    4, ..., 1, 3, 5, ...]."""
    return torch.cat(
        [torch.arange(0, head_dim, 2), torch.arange(1, head_dim, 2)]
    )


def starcoder2_config(config, **extra):
    """The ``Starcoder2Config`` of a course
    :class:`~attention_course.gpt.GPTConfig`."""
    from transformers import Starcoder2Config

    if (
        config.positions != "rope"
        or config.attention_only
        or not config.bias
        or not config.causal
    ):
        raise ValueError(
            "a StarCoder2 twin needs positions='rope', bias=True, "
            "causal=True and feed-forward layers"
        )
    return Starcoder2Config(
        vocab_size=config.vocab_size,
        hidden_size=config.d_model,
        intermediate_size=config.d_ff,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_kv_heads or config.num_heads,
        hidden_act="gelu",
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        norm_epsilon=1e-5,
        use_bias=True,
        tie_word_embeddings=False,
        attention_dropout=0.0,
        residual_dropout=0.0,
        embedding_dropout=0.0,
        **{"bos_token_id": None, "eos_token_id": None, **extra},
    )


@torch.no_grad()
def to_hf_starcoder2(
    model, attn_implementation: str = "eager", **config_extra
):
    """A ``Starcoder2ForCausalLM`` computing the same function as ``model``
    (its random init overwritten)."""
    from transformers import Starcoder2ForCausalLM

    c = model.config
    hf = Starcoder2ForCausalLM(starcoder2_config(c, **config_extra)).to(
        model.tok_emb.weight.dtype
    )
    hf.config._attn_implementation = attn_implementation
    order = interleaved_to_halves(c.d_model // c.num_heads)
    hf.model.embed_tokens.weight.copy_(model.tok_emb.weight)
    hf.lm_head.weight.copy_(model.head.weight)
    pairs = [(hf.model.norm, model.norm)]
    for block, layer in zip(model.blocks, hf.model.layers, strict=True):
        a, sa = block.attn, layer.self_attn
        # rotated: features to halves order
        for theirs, ours in ((sa.q_proj, a.w_q), (sa.k_proj, a.w_k)):
            dh = a.head_dim
            theirs.weight.copy_(
                ours.weight.reshape(-1, dh, c.d_model)[:, order].reshape(
                    -1, c.d_model
                )
            )
            theirs.bias.copy_(ours.bias.reshape(-1, dh)[:, order].reshape(-1))
        pairs += [
            (sa.v_proj, a.w_v),
            (sa.o_proj, a.w_o),
            (layer.input_layernorm, block.norm1),
            (layer.post_attention_layernorm, block.norm2),
            (layer.mlp.c_fc, block.mlp.linear1),
            (layer.mlp.c_proj, block.mlp.linear2),
        ]
    for theirs, ours in pairs:
        theirs.weight.copy_(ours.weight)
        theirs.bias.copy_(ours.bias)
    return hf.eval()
