"""Attention in today's open models (chapter 14), each class equal to its
Hugging Face ``transformers`` module."""

from .attention import ModernAttention, attend
from .families import (
    Gemma2Attention,
    Gemma3Attention,
    GptOssAttention,
    LlamaAttention,
    MistralAttention,
    Qwen3Attention,
)
from .mla import DeepseekV3Attention, MultiHeadLatentAttention

__all__ = [
    "ModernAttention",
    "attend",
    "LlamaAttention",
    "MistralAttention",
    "Qwen3Attention",
    "Gemma2Attention",
    "Gemma3Attention",
    "GptOssAttention",
    "MultiHeadLatentAttention",
    "DeepseekV3Attention",
]
