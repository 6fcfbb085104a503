"""What a hybrid model keeps per sequence: KV caches of its attention layers
plus fixed-size states of the others.

A linear-attention layer keeps (H, Dk, Dv) numbers of memory and (C, K - 1) of
convolution inputs, whatever the context; a softmax layer keeps keys and values
of every token (:mod:`attention_course.modern.cache`). Each
:class:`HybridConfig` holds sizes typed from a model's paper, model card or
configuration (``source`` is the citation key in ``references.bib``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..modern.cache import PUBLISHED, PublishedConfig, published_cache_bytes
from ..validation import check_int


@dataclass(frozen=True)
class HybridConfig:
    """A model's recurrent layers (``linear_layers`` of them) and its softmax
    layers (``attention``, or None).

    Each recurrent layer keeps ``heads`` memories of (``k_dim``, ``v_dim``) and
    ``conv_channels`` inputs of its ``conv_kernel``-tap convolution (0
    channels: no convolution).
    """

    name: str
    source: str
    linear_layers: int
    heads: int
    k_dim: int
    v_dim: int
    conv_channels: int = 0
    conv_kernel: int = 1
    attention: PublishedConfig | None = None
    features: tuple[str, ...] = ()


HYBRIDS = (
    HybridConfig(
        "Qwen3-Next-80B-A3B",
        "qwen2025qwen3next",
        36,
        32,
        128,
        128,
        conv_channels=2 * 16 * 128 + 32 * 128,
        conv_kernel=4,
        attention=PublishedConfig("", "", 12, 16, 2, 256),
        features=("Gated DeltaNet 3:1 gated attention",),
    ),
    HybridConfig(
        "Kimi-Linear-48B-A3B",
        "kimiteam2025kimilinear",
        20,
        32,
        128,
        128,
        conv_channels=3 * 32 * 128,
        conv_kernel=4,
        attention=PublishedConfig("", "", 7, 32, 32, 128, latent_dim=512 + 64),
        features=("KDA (decay per channel) 20:7 MLA",),
    ),
    HybridConfig(
        "MiniMax-Text-01",
        "minimax2025minimax01",
        70,
        64,
        128,
        128,
        attention=PublishedConfig("", "", 10, 64, 8, 128),
        features=("lightning attention 7:1 softmax",),
    ),
    HybridConfig(
        "Mamba-2-2.7B",
        "dao2024transformers",
        64,
        80,
        128,
        64,
        conv_channels=2 * 2560 + 2 * 128,
        conv_kernel=4,
        features=("SSD (Mamba-2), no attention",),
    ),
)


def _size(dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def state_bytes(config: HybridConfig, dtype=torch.float32) -> int:
    """Bytes of all recurrent layers' states for one sequence (independent of
    the context)."""
    per_layer = (
        config.heads * config.k_dim * config.v_dim
        + config.conv_channels * (config.conv_kernel - 1)
    )
    return config.linear_layers * per_layer * _size(dtype)


def hybrid_bytes(
    config: HybridConfig,
    context: int,
    kv_dtype=torch.bfloat16,
    state_dtype=torch.float32,
) -> int:
    """Bytes per sequence at ``context`` tokens: the attention layers' cache
    plus the recurrent states."""
    check_int(context, "context")
    kv = (
        0
        if config.attention is None
        else published_cache_bytes(config.attention, context, kv_dtype)
    )
    return kv + state_bytes(config, state_dtype)


def bytes_table(
    contexts=(4096, 32768, 262144, 1048576),
    kv_dtype=torch.bfloat16,
    state_dtype=torch.float32,
    pure=("Llama-3-8B", "Qwen3-8B", "DeepSeek-V3"),
    hybrids=HYBRIDS,
) -> list[dict]:
    """One row per model: layer counts (linear, attention), fixed state bytes,
    and bytes per sequence at each context.

    ``pure`` names the softmax-only models of chapter 14's table
    (:data:`~attention_course.modern.cache.PUBLISHED`) to compare with. Keys
    and values in ``kv_dtype`` (bfloat16), states in ``state_dtype`` (float32:
    transformers keeps the recurrent state in float32).
    """
    rows = []
    for config in (c for c in PUBLISHED if c.name in pure):
        rows.append(
            {
                "model": config.name,
                "linear_layers": 0,
                "attention_layers": config.num_layers,
                "state": 0,
                **{
                    t: published_cache_bytes(config, t, kv_dtype)
                    for t in contexts
                },
                "source": config.source,
            }
        )
    for config in hybrids:
        full = 0 if config.attention is None else config.attention.num_layers
        rows.append(
            {
                "model": config.name,
                "linear_layers": config.linear_layers,
                "attention_layers": full,
                "state": state_bytes(config, state_dtype),
                **{
                    t: hybrid_bytes(config, t, kv_dtype, state_dtype)
                    for t in contexts
                },
                "source": config.source,
            }
        )
    return rows
