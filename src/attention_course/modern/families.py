"""One class per model family:
:class:`~attention_course.modern.attention.ModernAttention` with its switches
set.

Each class mirrors one Hugging Face ``transformers`` attention class
(``from_hf`` copies its sizes, options and weights) and differs from the others
only in what it reads from the configuration.
"""

from __future__ import annotations

from torch import Tensor, nn

from ..interop.hf import HFTwin
from .attention import ModernAttention
from .rope_scaling import rope_from_config


class LlamaAttention(ModernAttention):
    """Llama 3: grouped-query attention, RoPE in the halves pairing,
    ``rope_type="llama3"`` for long context."""

    hf_twin = HFTwin(
        "llama.modeling_llama",
        "LlamaAttention",
        "LlamaConfig",
        "LlamaRotaryEmbedding",
    )


class MistralAttention(ModernAttention):
    """Mistral 7B: Llama's attention with a sliding window on every layer
    (``config.sliding_window``)."""

    hf_twin = HFTwin(
        "mistral.modeling_mistral",
        "MistralAttention",
        "MistralConfig",
        "MistralRotaryEmbedding",
    )


class Qwen3Attention(ModernAttention):
    """Qwen3: RMSNorm of each head's queries and keys (QK-norm) before RoPE;
    head_dim set apart from D / H."""

    hf_twin = HFTwin(
        "qwen3.modeling_qwen3",
        "Qwen3Attention",
        "Qwen3Config",
        "Qwen3RotaryEmbedding",
    )

    @classmethod
    def options_from_hf(cls, module) -> dict:
        return super().options_from_hf(module) | dict(
            qk_norm_eps=module.q_norm.variance_epsilon
        )


class Gemma2Attention(ModernAttention):
    """Gemma 2: scores scaled by ``query_pre_attn_scalar ** -0.5``,
    soft-capped; local and global layers."""

    hf_twin = HFTwin(
        "gemma2.modeling_gemma2",
        "Gemma2Attention",
        "Gemma2Config",
        "Gemma2RotaryEmbedding",
    )

    @classmethod
    def options_from_hf(cls, module) -> dict:
        return super().options_from_hf(module) | dict(
            softcap=module.attn_logit_softcapping
        )


class Gemma3Attention(ModernAttention):
    """Gemma 3: QK-norm replaces soft-capping; five local layers per global
    one, each with its own RoPE base."""

    hf_twin = HFTwin(
        "gemma3.modeling_gemma3",
        "Gemma3Attention",
        "Gemma3TextConfig",
        "Gemma3RotaryEmbedding",
    )

    @classmethod
    def options_from_hf(cls, module) -> dict:
        return super().options_from_hf(module) | dict(
            softcap=module.attn_logit_softcapping,
            qk_norm_eps=module.q_norm.eps,
        )

    @classmethod
    def rope_from_hf(cls, module) -> tuple[Tensor, float]:
        # one set of rope parameters per layer type (local layers: base 10 000)
        config = module.config
        return rope_from_config(
            config.rope_parameters[module.layer_type],
            module.head_dim,
            config.max_position_embeddings,
        )

    @staticmethod
    def norm_weight(norm: nn.Module) -> Tensor:
        # Gemma's RMSNorm multiplies by (1 + weight)
        return 1.0 + norm.weight.data


class GptOssAttention(ModernAttention):
    """GPT-OSS: a learned sink logit per head, sliding and full layers
    alternating, YaRN RoPE by default."""

    hf_twin = HFTwin(
        "gpt_oss.modeling_gpt_oss",
        "GptOssAttention",
        "GptOssConfig",
        "GptOssRotaryEmbedding",
    )

    @classmethod
    def options_from_hf(cls, module) -> dict:
        return super().options_from_hf(module) | dict(sinks=True)
