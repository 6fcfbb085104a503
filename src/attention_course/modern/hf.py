"""The reference: Hugging Face ``transformers`` attention modules, built offline from tiny configs.

:func:`build_hf_attention` makes one layer of a model family with random weights (no download: set
``HF_HUB_OFFLINE=1``); :func:`hf_forward` runs it as the model would for causal self-attention: the cos and sin of
the model's own rotary embedding at the given position ids, and an additive float mask (B, 1, T, T) that is 0 where a
query may attend and the dtype's minimum elsewhere (the window of a sliding layer included, as the model's mask
builder does). Each family maps to the course class that mirrors it (:data:`FAMILIES`).

Hugging Face computes the RoPE angles, the softmax and the norms in float32 even in a float64 module, so a course
layer in float64 agrees with it to about 1e-7 relative (1e-6 is the bound the tests and chapter use), not 1e-15.
"""

from __future__ import annotations

import importlib

import torch
from torch import Tensor

from ..interop.hf import hf_window
from ..linear_attention.gated_attention import Qwen3NextAttention
from ..sparse.attention import DeepseekV32Attention, GlmMoeDsaAttention
from . import families
from .mla import MultiHeadLatentAttention

# family -> the course class that mirrors its attention layer (its ``hf_twin`` names the transformers classes)
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
}


def _twin(family: str):
    if family not in FAMILIES:
        raise ValueError(f"family must be one of {sorted(FAMILIES)}, got family={family!r}")
    return FAMILIES[family].hf_twin


def build_hf_attention(family: str, layer_idx: int = 0, *, dtype=torch.float64, seed: int = 0, **config):
    """One eager attention layer of ``family`` from a config of the given sizes, every parameter ~ N(0, 0.3^2).

    ``config`` holds the config's keyword arguments (hidden_size, num_attention_heads, ...); the layer count is
    ``layer_idx + 1`` unless ``layer_types`` says otherwise. Random sinks and norm weights make those options
    visible (HF initialises norm weights to one, Gemma's to zero, which would hide a wrong norm).
    """
    twin = _twin(family)
    config.setdefault("num_hidden_layers", len(config.get("layer_types") or ()) or layer_idx + 1)
    hf_config = getattr(importlib.import_module("transformers"), twin.config)(
        intermediate_size=8, vocab_size=16, attn_implementation="eager", **config
    )
    return random_weights(twin.load()(hf_config, layer_idx), seed=seed, dtype=dtype)


def random_weights(layer: torch.nn.Module, *, seed: int, dtype, scale: float = 0.3) -> torch.nn.Module:
    """Every parameter of ``layer`` drawn ~ N(0, scale^2) from a seeded generator; the layer in ``dtype``, eval mode."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(scale * torch.randn(p.shape, generator=generator))
    return layer.to(dtype).eval()


def hf_forward(layer, x: Tensor, positions: Tensor | None = None) -> Tensor:
    """Run a transformers attention layer on x (B, T, D) at position ids (T,) or (B, T) -> (B, T, D)."""
    b, t, _ = x.shape
    positions = torch.arange(t) if positions is None else positions
    with torch.no_grad():
        return _hf_call(layer, x, positions.expand(b, t), t)


def hf_decode(layer, x: Tensor, prefill: int) -> Tensor:
    """Run a transformers attention layer through Hugging Face's own cache (``DynamicCache`` built from the layer's
    config: a sliding layer keeps its window) as generation does: the first ``prefill`` positions of x (B, T, D) at
    once, then one token at a time -> (B, T, D)."""
    from transformers import DynamicCache

    cache, b, t = DynamicCache(config=layer.config), x.size(0), x.size(1)
    window, outputs = hf_window(layer), []
    with torch.no_grad():
        for start, end in [(0, prefill), *((p, p + 1) for p in range(prefill, t))]:
            kept = start if window is None else min(start, window - 1)  # what the cache still holds
            positions = torch.arange(start, end).expand(b, end - start)
            outputs.append(_hf_call(layer, x[:, start:end], positions, kept + end - start, cache))
    return torch.cat(outputs, dim=1)


def _hf_call(layer, x: Tensor, position_ids: Tensor, t_k: int, cache=None) -> Tensor:
    """One call of an HF layer: its model's rotary cos/sin and an additive (B, 1, Tq, Tk) bottom-right mask."""
    family = next((f for f, cls in FAMILIES.items() if type(layer).__name__ == cls.hf_twin.name), None)
    if family is None:
        raise TypeError(f"layer must be one of the transformers attention classes of {sorted(FAMILIES)}, "
                        f"got {type(layer).__name__}")
    twin = _twin(family)
    b, t_q, _ = x.shape
    rotary = twin.load(twin.rotary)(layer.config)
    rotary_args = (layer.layer_type,) if family == "gemma3" else ()
    cos, sin = rotary(x, position_ids, *rotary_args)
    i, j = torch.arange(t_q)[:, None] + (t_k - t_q), torch.arange(t_k)[None, :]
    allowed = j <= i
    window = hf_window(layer)
    if window is not None:
        allowed &= i - j < window
    mask = torch.zeros(b, 1, t_q, t_k, dtype=x.dtype).masked_fill(~allowed, torch.finfo(x.dtype).min)
    return layer(x, position_embeddings=(cos, sin), attention_mask=mask, cache=cache)[0]


def relative_error(ours: Tensor, ref: Tensor) -> float:
    """max |ours - ref| / max |ref|: a disagreement measured against the size of the output."""
    return float((ours.detach() - ref.detach()).abs().max() / ref.detach().abs().max())


def hf_cache_bytes(cache) -> int:
    """Bytes of the keys and values a transformers cache holds (a shared layer holds none)."""
    return sum(t.numel() * t.element_size() for layer in cache.layers
               for t in (getattr(layer, "keys", None), getattr(layer, "values", None)) if t is not None)
