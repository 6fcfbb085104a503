"""KV-cache bytes of published models: MHA, GQA, MQA and MLA side by side,
sliding layers bounded by their window.

Each :class:`PublishedConfig` holds the numbers typed from a model's paper or
model card (``source`` is the key of the citation in ``references.bib``; for
DeepSeek V3.2 and V4, the defaults of their ``transformers`` configurations).
The bytes come from :func:`~attention_course.kv_cache.cache_bytes_per_token`
(keys and values of every layer) or, for MLA, from the latent each layer stores
instead; chapter 19's layers add their own kinds: a lightning indexer's key per
token (V3.2), and V4's one vector per token for key and value, a window, and
compressed entries of older blocks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..kv_cache import cache_bytes_per_token
from ..validation import check_int


@dataclass(frozen=True)
class PublishedConfig:
    """The attention sizes of a published model that decide its cache.

    ``local_layers`` of the ``num_layers`` keep at most ``local_span`` tokens
    (a sliding window, or a chunk of Llama 4's chunked attention);
    ``shared_layers`` cache nothing, reusing an earlier layer's keys and values
    (cross-layer KV sharing, Gemma 3n and 4); the other layers keep every
    token. ``latent_dim`` is MLA's per-layer cache per token (kv_lora_rank +
    qk_rope_head_dim), None for other models.

    Chapter 19's kinds: ``index_dim``, the numbers per token and layer of a
    lightning indexer's key (DeepSeek V3.2); ``keys_are_values``, one vector
    per token and key-value head serving as key and value (DeepSeek V4);
    ``compressed``, (layers, tokens per entry, numbers per entry) of local
    layers that also keep one entry per complete block of older tokens (V4's
    HCA, and CSA whose entries carry the indexer's key too).
    """

    name: str
    source: str
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    local_layers: int = 0
    local_span: int | None = None
    latent_dim: int | None = None
    shared_layers: int = 0
    features: tuple[str, ...] = ()
    index_dim: int = 0
    keys_are_values: bool = False
    compressed: tuple[tuple[int, int, int], ...] = ()


PUBLISHED = (
    PublishedConfig(
        "Llama-3-8B",
        "grattafiori2024llama3",
        32,
        32,
        8,
        128,
        features=("GQA", "RoPE scaling"),
    ),
    PublishedConfig(
        "Mistral-7B",
        "jiang2023mistral",
        32,
        32,
        8,
        128,
        local_layers=32,
        local_span=4096,
        features=("GQA", "sliding window"),
    ),
    PublishedConfig(
        "Gemma-2-9B",
        "gemmateam2024gemma2",
        42,
        16,
        8,
        256,
        local_layers=21,
        local_span=4096,
        features=("GQA", "local/global", "soft-capping"),
    ),
    PublishedConfig(
        "Gemma-3-12B",
        "gemmateam2025gemma3",
        48,
        16,
        8,
        256,
        local_layers=40,
        local_span=1024,
        features=("GQA", "local/global 5:1", "QK-norm"),
    ),
    PublishedConfig(
        "Qwen3-8B",
        "yang2025qwen3",
        36,
        32,
        8,
        128,
        features=("GQA", "QK-norm"),
    ),
    PublishedConfig(
        "GPT-OSS-120B",
        "openai2025gptoss",
        36,
        64,
        8,
        64,
        local_layers=18,
        local_span=128,
        features=("GQA", "sliding window", "sinks", "YaRN"),
    ),
    PublishedConfig(
        "Llama-4-Scout",
        "meta2025llama4",
        48,
        40,
        8,
        128,
        local_layers=36,
        local_span=8192,
        features=("GQA", "chunked local", "NoPE global 1:4"),
    ),
    PublishedConfig(
        "DeepSeek-V3",
        "deepseekai2024v3",
        61,
        128,
        128,
        128,
        latent_dim=512 + 64,
        features=("MLA", "YaRN"),
    ),
    PublishedConfig(
        "DeepSeek-V3.2",
        "wolf2020transformers",
        61,
        128,
        128,
        128,
        latent_dim=512 + 64,
        index_dim=128,
        features=("MLA", "lightning indexer", "top-k"),
    ),
    PublishedConfig(
        "DeepSeek-V4",
        "wolf2020transformers",
        43,
        64,
        1,
        512,
        local_layers=43,
        local_span=128,
        keys_are_values=True,
        # 23 HCA layers: an entry per 128 tokens; 20 CSA layers: an entry
        # and an indexer key per 4 tokens
        compressed=((23, 128, 512), (20, 4, 512 + 128)),
        features=("K = V", "window", "CSA/HCA", "sinks"),
    ),
)


def scheme_bytes_per_token(
    config: PublishedConfig, scheme: str, dtype=torch.bfloat16
) -> int | None:
    """Cache bytes per token, every layer full, if the model used ``scheme``:
    "MHA", "GQA", "MQA" or "MLA".

    MHA keeps ``num_heads`` key/value heads, GQA the published
    ``num_kv_heads``, MQA one; MLA one latent per layer (None for a model
    without one).
    """
    if scheme == "MLA":
        if config.latent_dim is None:
            return None
        return (
            config.num_layers
            * config.latent_dim
            * torch.empty((), dtype=dtype).element_size()
        )
    heads = {"MHA": config.num_heads, "GQA": config.num_kv_heads, "MQA": 1}
    if scheme not in heads:
        raise ValueError(
            "scheme must be 'MHA', 'GQA', 'MQA' or 'MLA', got "
            f"scheme={scheme!r}"
        )
    return cache_bytes_per_token(
        config.num_layers, heads[scheme], config.head_dim, dtype
    )


def published_cache_bytes(
    config: PublishedConfig,
    context: int,
    dtype=torch.bfloat16,
    between_steps: bool = False,
) -> int:
    """Bytes of the published model's cache for one sequence of ``context``
    tokens.

    MLA if the model has it, its key/value heads otherwise; a local layer keeps
    only its last ``local_span`` tokens (the keys a step reads), ``span - 1``
    with ``between_steps`` (the next token brings its own key: what
    transformers' sliding-window cache holds between steps); a shared layer
    keeps none. An indexer's key is kept for every token a layer keeps, a
    compressed entry for every complete block of the context.
    """
    check_int(context, "context")
    scheme = "MLA" if config.latent_dim is not None else "GQA"
    size = torch.empty((), dtype=dtype).element_size()
    # one layer, one token
    per_layer = (
        scheme_bytes_per_token(config, scheme, dtype) // config.num_layers
    )
    if config.keys_are_values:  # one vector serves as key and value
        per_layer //= 2
    per_layer += config.index_dim * size  # a lightning indexer's key
    full_layers = (
        config.num_layers - config.local_layers - config.shared_layers
    )
    local_tokens = (
        min(context, config.local_span - int(between_steps))
        if config.local_layers
        else 0
    )
    entries = sum(
        layers * (context // per_entry) * numbers * size
        for layers, per_entry, numbers in config.compressed
    )
    return (
        per_layer
        * (full_layers * context + config.local_layers * local_tokens)
        + entries
    )


def cache_table(
    context: int = 8192, dtype=torch.bfloat16, configs=PUBLISHED
) -> list[dict]:
    """One row per model: bytes per token under MHA, GQA, MQA, MLA, and the
    published cache at ``context`` tokens.

    ``published/token`` is the published cache divided by ``context`` (windows
    make it fall as the context grows).
    """
    return [
        {
            "model": c.name,
            **{
                s: scheme_bytes_per_token(c, s, dtype)
                for s in ("MHA", "GQA", "MQA", "MLA")
            },
            "published/token": published_cache_bytes(c, context, dtype)
            / context,
            "features": ", ".join(c.features),
            "source": c.source,
        }
        for c in configs
    ]


@dataclass(frozen=True)
class MLASizes:
    """The sizes of multi-head latent attention that decide its cache and its
    work (DeepSeek-V2/V3 names):
    C = ``kv_lora_rank``, R = ``qk_rope_head_dim``, N = ``qk_nope_head_dim``, V
    = ``v_head_dim``."""

    num_layers: int
    num_heads: int
    kv_lora_rank: int
    qk_rope_head_dim: int
    qk_nope_head_dim: int
    v_head_dim: int


# DeepSeek-V3 (deepseekai2024v3), its config.json sizes
DEEPSEEK_V3_MLA = MLASizes(61, 128, 512, 64, 128, 128)


def mla_costs(sizes: MLASizes, dtype=torch.bfloat16) -> dict:
    """What MLA caches per token and what attention does per (query, key) pair,
    expanded against absorbed.

    Expanded (the plain form): a cache of every head's key [W_uk c, k_rope] (N
    + R) and value W_uv c (V); a pair costs H (N + R) multiply-adds for the
    scores and H V for the output. Absorbed: a cache of the latent c and k_rope
    only (C + R, shared by the heads); a pair costs H (C + R) for the scores
    and H C for the output (the weights average the latent, W_uv comes after).
    transformers 5.24's DeepseekV3Attention caches the latent and re-expands it
    into keys and values at every step. Bytes are per token over all layers;
    multiply-adds per pair, one layer, all heads.
    """
    size = torch.empty((), dtype=dtype).element_size()
    h, c, r, n, v = (
        sizes.num_heads,
        sizes.kv_lora_rank,
        sizes.qk_rope_head_dim,
        sizes.qk_nope_head_dim,
        sizes.v_head_dim,
    )
    return {
        "expanded bytes/token": sizes.num_layers * h * (n + r + v) * size,
        "latent bytes/token": sizes.num_layers * (c + r) * size,
        "expanded MACs/pair": h * (n + r + v),
        "absorbed MACs/pair": h * (c + r + c),
    }
