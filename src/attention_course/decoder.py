"""A whole decoder-only language model assembled from the course's parts
(chapter 14): SmolLM2, a Llama; Qwen3 and Mistral as well (the same layer with
another attention: QK-norm, a sliding window).

Each layer is pre-norm (chapter 11's :func:`~attention_course.block.residual`):
:class:`~attention_course.block. RMSNorm`, chapter 14's attention
(:class:`~attention_course.modern.families.LlamaAttention`: grouped-query
heads, RoPE), RMSNorm again and :class:`~attention_course.block.SwiGLU`. Token
embedding in, a final RMSNorm and an output head (tied to the embedding, as in
SmolLM2) out. :meth:`Decoder.from_hf` copies a ``transformers``
``LlamaForCausalLM``'s (or ``Qwen3ForCausalLM``'s, ``MistralForCausalLM``'s)
sizes and weights, so the course's model and Hugging Face's can be compared
logit by logit.

:meth:`Decoder.generate` decodes greedily with a KV cache (chapter 8's
:class:`~attention_course.kv_cache.KVCache`, the cache protocol every attention
layer of the course speaks): the model asks the cache once per forward where
the new tokens stand and computes the RoPE table once for all its layers;
``use_cache=False`` runs the whole prefix again at every step instead, the
reference the cached decode must equal.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor, nn

from .block import RMSNorm, SwiGLU, residual
from .interop.hf import copy_linear
from .kv_cache import Cache, KVCache
from .modern.families import LlamaAttention, MistralAttention, Qwen3Attention
from .validation import INTEGER_DTYPES, check_int, check_rank

# the residual sub-layers of a pretrained model in inference
NO_DROPOUT = nn.Identity()


class DecoderLayer(nn.Module):
    """Pre-norm: ``x + attn(norm1(x))``, then ``x + ffn(norm2(x))``. (B, T, D)
    -> (B, T, D)."""

    def __init__(
        self, attn: nn.Module, d_model: int, d_ff: int, norm_eps: float
    ):
        super().__init__()
        self.norm1 = RMSNorm(d_model, eps=norm_eps)
        self.attn = attn
        self.norm2 = RMSNorm(d_model, eps=norm_eps)
        self.ffn = SwiGLU(d_model, d_ff)

    def forward(
        self,
        x: Tensor,
        positions: Tensor,
        rotary=None,
        cache: Cache | None = None,
        layer: int = 0,
    ) -> Tensor:
        def attend(h):
            return self.attn(
                h, positions, cache=cache, layer=layer, rotary=rotary
            )

        x = residual(x, attend, self.norm1, NO_DROPOUT, norm_first=True)
        return residual(x, self.ffn, self.norm2, NO_DROPOUT, norm_first=True)


class Decoder(nn.Module):
    """A Llama-family causal language model: ids (B, T) -> logits (B, T, V).

    Args:
        vocab_size, d_model, num_layers, num_heads, num_kv_heads, d_ff: the
            sizes (GQA when num_kv_heads < H).
        head_dim: Dh, default D // H. rope_base: RoPE's theta. norm_eps: the
            RMSNorms' epsilon.
        tie_embeddings: the output head shares the token embedding's matrix.
    """

    # what __init__ builds; from_hf takes the family of the model it copies
    attention_class = LlamaAttention
    #: The decoder families whose whole model is this one with another
    #: attention (the HF class names its twin).
    families = (LlamaAttention, Qwen3Attention, MistralAttention)

    def __init__(
        self,
        vocab_size: int,
        d_model: int,
        num_layers: int,
        num_heads: int,
        num_kv_heads: int,
        d_ff: int,
        *,
        head_dim: int | None = None,
        rope_base: float = 10000.0,
        norm_eps: float = 1e-6,
        tie_embeddings: bool = True,
    ):
        super().__init__()
        for name, value in (
            ("vocab_size", vocab_size),
            ("num_layers", num_layers),
            ("d_ff", d_ff),
        ):
            check_int(value, name)
        self.embed = nn.Embedding(vocab_size, d_model)
        self.blocks = nn.ModuleList(
            DecoderLayer(
                self.attention_class(
                    d_model,
                    num_heads,
                    num_kv_heads,
                    head_dim,
                    rope_base=rope_base,
                ),
                d_model,
                d_ff,
                norm_eps,
            )
            for _ in range(num_layers)
        )
        self.norm = RMSNorm(d_model, eps=norm_eps)
        self.head = nn.Linear(d_model, vocab_size, bias=False)
        if tie_embeddings:
            self.head.weight = self.embed.weight

    @property
    def vocab_size(self) -> int:
        return self.embed.num_embeddings

    @property
    def num_layers(self) -> int:
        return len(self.blocks)

    def forward(
        self,
        ids: Tensor,
        positions: Tensor | None = None,
        *,
        cache: Cache | None = None,
    ) -> Tensor:
        """ids (B, T) at positions (T,) -> next-token logits (B, T, V).
        Positions default to the cache's (the new tokens follow the cached
        ones), else 0..T-1; with a ``cache`` every layer adds its keys and
        values to it."""
        check_rank(ids, "ids", 2, "(B, T)")
        if ids.dtype not in INTEGER_DTYPES:
            raise TypeError(
                f"ids must be an integer tensor of token ids, got {ids.dtype}"
            )
        if positions is None:  # asked once per forward, for every layer
            positions = (
                torch.arange(ids.size(1), device=ids.device)
                if cache is None
                else cache.positions(0, ids.size(1), ids.device)
            )
        x = self.embed(ids)  # (B, T, D)
        # cos/sin once, shared by every layer
        rotary = self.blocks[0].attn.rotary(positions, x.dtype)
        for layer, block in enumerate(self.blocks):
            x = block(x, positions, rotary, cache, layer)
        return self.head(self.norm(x))  # (B, T, V)

    @torch.no_grad()
    def iter_generate(
        self, ids: Tensor, max_new_tokens: int, use_cache: bool = True
    ) -> Iterator[tuple[Tensor, Tensor]]:
        """Greedy decoding one step at a time, as :meth:`GPT.iter_generate
        <attention_course.gpt.GPT.iter_generate>`:
        yields (next_ids (B, 1), logits (B, V)) per new token. With the cache,
        the prompt runs once (prefill) and each step feeds only the newest
        token; without it, each step runs the whole sequence again."""
        check_int(max_new_tokens, "max_new_tokens", minimum=0)
        cache = KVCache(len(self.blocks)) if use_cache else None
        new = ids
        for _ in range(max_new_tokens):
            # (B, V)
            logits = (
                self(new, cache=cache)[:, -1]
                if use_cache
                else self(ids)[:, -1]
            )
            new = logits.argmax(dim=-1, keepdim=True)  # (B, 1)
            ids = torch.cat([ids, new], dim=1)
            yield new, logits

    def generate(
        self, ids: Tensor, max_new_tokens: int, use_cache: bool = True
    ) -> Tensor:
        """Greedy decoding: ids (B, T) -> (B, T + max_new_tokens) (see
        :meth:`iter_generate`)."""
        # now, not at the first step
        check_int(max_new_tokens, "max_new_tokens", minimum=0)
        steps = [
            new
            for new, _ in self.iter_generate(ids, max_new_tokens, use_cache)
        ]
        return torch.cat([ids, *steps], dim=1)

    @classmethod
    def from_hf(cls, model: nn.Module) -> Decoder:
        """The course's model with the sizes and weights of a ``transformers``
        ``LlamaForCausalLM``, ``Qwen3ForCausalLM`` or ``MistralForCausalLM``
        (eager).

        Each attention layer is :meth:`from_hf
        <attention_course.modern.attention.ModernAttention.from_hf>` of the
        course class that mirrors the HF layer (its RoPE, QK-norm and window
        read from the config); norms, SwiGLU and embeddings are copied.
        """
        layers = getattr(getattr(model, "model", None), "layers", None)
        if layers is None or not hasattr(model, "lm_head"):
            raise TypeError(
                "Decoder.from_hf needs a transformers causal LM "
                "(model.model.layers, model.lm_head), "
                f"got {type(model).__name__}"
            )
        attention = cls.family_of(layers[0].self_attn)
        config = model.config
        ours = cls(
            config.vocab_size,
            config.hidden_size,
            config.num_hidden_layers,
            config.num_attention_heads,
            config.num_key_value_heads,
            config.intermediate_size,
            head_dim=layers[0].self_attn.head_dim,
            norm_eps=config.rms_norm_eps,
            tie_embeddings=config.tie_word_embeddings,
        )
        ours.embed.weight.data.copy_(model.model.embed_tokens.weight.data)
        for block, layer in zip(ours.blocks, layers, strict=True):
            block.attn = attention.from_hf(layer.self_attn)
            block.norm1.weight.data.copy_(layer.input_layernorm.weight.data)
            block.norm2.weight.data.copy_(
                layer.post_attention_layernorm.weight.data
            )
            for mine, theirs in (
                ("gate", "gate_proj"),
                ("up", "up_proj"),
                ("down", "down_proj"),
            ):
                copy_linear(
                    getattr(block.ffn, mine), getattr(layer.mlp, theirs)
                )
        ours.norm.weight.data.copy_(model.model.norm.weight.data)
        if not config.tie_word_embeddings:
            ours.head.weight.data.copy_(model.lm_head.weight.data)
        return ours.to(model.lm_head.weight.dtype).eval()

    @classmethod
    def family_of(cls, hf_attention: nn.Module) -> type[nn.Module]:
        """The course attention class whose HF twin ``hf_attention`` is
        (TypeError for a family not rebuilt here)."""
        name = type(hf_attention).__name__
        for family in cls.families:
            if family.hf_twin.name == name:
                return family
        twins = ", ".join(f.hf_twin.name for f in cls.families)
        raise TypeError(
            "Decoder.from_hf rebuilds models whose attention is one of "
            f"{twins}, got {name}"
        )
