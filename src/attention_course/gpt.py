"""The course's one GPT: a small decoder-only language model built from its
attention, blocks and positions.

A :class:`GPTConfig` names the sizes and choices (nanoGPT's manner);
:class:`GPT` is a token embedding, positions (chapter 10: learned, rotary or
none), ``num_layers`` pre-LN :class:`GPTBlock` s, a final LayerNorm and an
output head, by default tied to the token embedding (the same (V, D) matrix
reads tokens in and scores them out). Every block attends through chapter 8's
:class:`~attention_course.kv_cache.CausalSelfAttention`, so
:meth:`GPT.generate` decodes greedily with a
:class:`~attention_course.kv_cache.KVCache` (MHA, GQA or MQA).

For looking inside (chapter 12): ``forward(ids, return_weights=True)`` also
returns every layer's attention weights (B, H, T, Tk), exactly the ones the
attention multiplied the values with, and ``head_mask`` (L, H) multiplies each
head's output before the output projection (0 = ablate the head).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial

import torch
from torch import Tensor, nn

from .block import FeedForward, residual
from .kv_cache import Cache, CausalSelfAttention, KVCache
from .positions import (
    LearnedPositions,
    RotaryTable,
    SinusoidalPositions,
    token_positions,
)
from .validation import check_dropout, check_heads, check_int, check_rank

POSITIONS = ("learned", "sinusoidal", "rope", "alibi", None)
INITS = ("gpt2", "pytorch")


@dataclass
class GPTConfig:
    """The sizes and choices of a :class:`GPT`.

    Attributes:
        vocab_size, d_model, num_heads, num_layers: V token ids, width D, H
            heads per layer, L blocks.
        num_kv_heads: H_kv key/value heads (chapter 8: None = H, MHA; 1: MQA;
            in between: GQA).
        d_ff: hidden width of the feed-forward networks (None: 4 D).
        max_len: longest sequence with "learned" positions (the table stops
            there).
        positions: "learned" (GPT-2), "sinusoidal" (the original Transformer's,
            added to the embeddings), "rope" (rotary, in every attention
            layer), "alibi" (a distance penalty per head, in every attention
            layer) or None (no position information: a causal model can still
            infer some).
        causal: each position sees only itself and the past (False: every
            position sees all; no generation).
        attention_only: blocks without feed-forward networks (the models of
            chapter 12).
        tie_embeddings: the output head reuses the token embedding matrix
            (GPT-2).
        init: "gpt2": weights normal(0, 0.02), embeddings normal(0,
            ``embedding_std``), and the projections that write into the
            residual stream (``w_o``, ``linear2``) scaled by 1 / sqrt(2 L), so
            the stream's size does not grow with depth; "pytorch": every layer
            keeps PyTorch's own initialisation.
        embedding_std: with "gpt2" init, the standard deviation of the token
        and position embeddings (GPT-2:
            0.02). Chapter 12's 2-layer induction model uses 1.0 and an untied
            head: there the embeddings must dominate the residual stream at
            init so that layer 2 can still read which token sits where.
        bias: whether the attention projections have biases (GPT-2: True;
            LLaMA: False).
        dropout: on attention weights, branch outputs and embeddings, in
            ``.train()`` mode only.
        backend: the attention backend of every layer
            (:func:`~attention_course.functional.attend`): "eager", the
            course's attention, which forms the weights (B, H, T, Tk) at every
            call; "sdpa", PyTorch's fused kernels (the weights are still
            formed, by "eager", whenever they are asked for); "blockwise",
            "flex".
    """

    vocab_size: int
    d_model: int
    num_heads: int
    num_layers: int
    num_kv_heads: int | None = None
    d_ff: int | None = None
    max_len: int = 256
    positions: str | None = "learned"
    causal: bool = True
    attention_only: bool = False
    tie_embeddings: bool = True
    init: str = "gpt2"
    embedding_std: float = 0.02
    bias: bool = True
    dropout: float = 0.0
    backend: str = "eager"

    def __post_init__(self):
        self.d_ff = 4 * self.d_model if self.d_ff is None else self.d_ff
        for name in (
            "vocab_size",
            "d_model",
            "num_heads",
            "num_layers",
            "d_ff",
            "max_len",
        ):
            check_int(getattr(self, name), name)
        check_heads(self.d_model, self.num_heads)
        check_dropout(self.dropout)
        if self.positions not in POSITIONS:
            raise ValueError(
                f"positions must be one of {POSITIONS}, got "
                f"positions={self.positions!r}"
            )
        if self.init not in INITS:
            raise ValueError(
                f"init must be one of {INITS}, got init={self.init!r}"
            )
        if not self.embedding_std > 0:
            raise ValueError(
                "embedding_std must be > 0, got "
                f"embedding_std={self.embedding_std}"
            )
        if self.positions == "sinusoidal" and self.d_model % 2:
            raise ValueError(
                "positions='sinusoidal' needs an even d_model, got "
                f"d_model={self.d_model}"
            )
        if self.positions == "rope" and (self.d_model // self.num_heads) % 2:
            raise ValueError(
                "positions='rope' needs an even head size, got d_model // "
                "num_heads = "
                f"{self.d_model // self.num_heads}"
            )


def _absolute_positions(config: GPTConfig) -> nn.Module | None:
    """The module that adds positions to the token embeddings: a learned table
    or the fixed sinusoids."""
    if config.positions == "learned":
        return LearnedPositions(config.max_len, config.d_model)
    if config.positions == "sinusoidal":
        return SinusoidalPositions(config.d_model)
    return None


def default_attention(config: GPTConfig, layer: int) -> nn.Module:
    """Chapter 8's :class:`~attention_course.kv_cache.CausalSelfAttention` with
    the config's choices."""
    c = config
    return CausalSelfAttention(
        c.d_model,
        c.num_heads,
        c.num_kv_heads,
        fused_qkv=False,
        bias=c.bias,
        rope=c.positions == "rope",
        causal=c.causal,
        dropout=c.dropout,
        backend=c.backend,
        alibi=c.positions == "alibi",
    )


class GPTBlock(nn.Module):
    """Pre-LN block, two residual sub-layers (chapter 11's
    :func:`~attention_course.block.residual`):
    ``x + drop(attn(norm1(x)))``, then ``x + drop(mlp(norm2(x)))`` (no MLP if
    attention-only).

    ``attention(config, layer)`` builds the attention layer (default
    :func:`default_attention`); any layer called as ``attn(x, cache=, layer=,
    head_mask=, weights=, rotary=)`` fits, e.g. chapter 14's.
    """

    def __init__(
        self,
        config: GPTConfig,
        attention: Callable[[GPTConfig, int], nn.Module] = default_attention,
        layer: int = 0,
    ):
        super().__init__()
        c = config
        self.norm1 = nn.LayerNorm(c.d_model)
        self.attn = attention(c, layer)
        self.norm2 = None if c.attention_only else nn.LayerNorm(c.d_model)
        self.mlp = (
            None
            if c.attention_only
            else FeedForward(c.d_model, c.d_ff, "gelu", c.dropout)
        )
        self.dropout = nn.Dropout(c.dropout)

    def forward(
        self,
        x: Tensor,
        cache: Cache | None = None,
        layer: int = 0,
        head_mask: Tensor | None = None,
        weights: list | None = None,
        rotary: RotaryTable | None = None,
    ) -> Tensor:
        """x (B, T, D) -> (B, T, D); ``cache``, ``layer``, ``head_mask`` (H,),
        ``weights`` (a list that receives the attention weights) and ``rotary``
        (the forward's RoPE table) go to the attention."""
        attn = partial(
            self.attn,
            cache=cache,
            layer=layer,
            head_mask=head_mask,
            weights=weights,
            rotary=rotary,
        )
        x = residual(x, attn, self.norm1, self.dropout, norm_first=True)
        if self.mlp is not None:
            x = residual(
                x, self.mlp, self.norm2, self.dropout, norm_first=True
            )
        return x


class GPT(nn.Module):
    """A decoder-only language model: ids (B, T) -> next-token logits (B, T,
    V); see :class:`GPTConfig`.

    ``seed``: if given, the weights are drawn from ``torch.manual_seed(seed)``
    without disturbing the global RNG. ``attention(config, layer)``: builds
    each block's attention layer (default: chapter 8's, see
    :func:`default_attention`; chapter 14's layers fit too, with
    ``positions=None`` since they rotate themselves).
    """

    def __init__(
        self,
        config: GPTConfig,
        seed: int | None = None,
        *,
        attention: Callable[[GPTConfig, int], nn.Module] = default_attention,
    ):
        super().__init__()
        if not isinstance(config, GPTConfig):
            raise TypeError(
                f"config must be a GPTConfig, got {type(config).__name__}"
            )
        self.config = config
        with torch.random.fork_rng(devices=[], enabled=seed is not None):
            if seed is not None:
                torch.manual_seed(seed)
            self.tok_emb = nn.Embedding(config.vocab_size, config.d_model)
            # None: positions inside attention, or none
            self.pos_emb = _absolute_positions(config)
            self.dropout = nn.Dropout(config.dropout)
            self.blocks = nn.ModuleList(
                GPTBlock(config, attention, i)
                for i in range(config.num_layers)
            )
            self.norm = nn.LayerNorm(config.d_model)
            self.head = nn.Linear(
                config.d_model, config.vocab_size, bias=False
            )
            if config.tie_embeddings:
                # one (V, D) matrix embeds and unembeds
                self.head.weight = self.tok_emb.weight
            if config.init == "gpt2":
                self.apply(self._init_weights)
                for name, p in self.named_parameters():
                    if name.endswith(("w_o.weight", "linear2.weight")):
                        nn.init.normal_(
                            p, std=0.02 / math.sqrt(2 * config.num_layers)
                        )

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            # a tied head is the embedding matrix: it is drawn (again, last)
            # with the embeddings' std
            embeds = (
                isinstance(module, nn.Embedding)
                or module.weight is self.tok_emb.weight
            )
            nn.init.normal_(
                module.weight,
                std=self.config.embedding_std if embeds else 0.02,
            )
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    @property
    def num_layers(self) -> int:
        return self.config.num_layers

    @property
    def num_heads(self) -> int:
        return self.config.num_heads

    def num_parameters(self) -> int:
        """Number of trainable numbers; a tied embedding/head matrix counts
        once."""
        return sum(p.numel() for p in self.parameters())

    def forward(
        self,
        ids: Tensor,
        cache: Cache | None = None,
        head_mask: Tensor | None = None,
        return_weights: bool = False,
        last_only: bool = False,
    ) -> Tensor | tuple[Tensor, list[Tensor]]:
        """ids (B, T) -> logits (B, T, V) [, weights: one (B, H, T, Tk) tensor
        per layer].

        With a ``cache``, ids are the new tokens, at the positions the cache
        gives them (after the cached ones; a paged cache gives each token its
        own sequence's). ``head_mask`` (L, H), bool or float, multiplies each
        head's output before its layer's output projection. ``last_only``:
        logits (B, V) of the last position only, the one that predicts the next
        token.
        """
        # (T,), asked of the cache once
        positions = self._check_forward(ids, cache, head_mask)
        x = self.tok_emb(ids)  # (B, T, D)
        if self.pos_emb is not None:
            # (T, D): absolute positions, from the same source as RoPE's
            x = x + self.pos_emb(positions)
        x = self.dropout(x)
        # RoPE's cos/sin once, for every layer
        rotary = self.rotary(positions, x.dtype)
        weights = [] if return_weights else None
        for layer, block in enumerate(self.blocks):
            # (H,)
            mask_row = (
                None if head_mask is None else head_mask[layer].to(x.dtype)
            )
            x = block(x, cache, layer, mask_row, weights, rotary)
        if last_only:
            x = x[:, -1]  # (B, D)
        logits = self.head(self.norm(x))  # (B, T, V) or (B, V)
        return (logits, weights) if return_weights else logits

    def rotary(
        self, positions: Tensor, dtype: torch.dtype
    ) -> RotaryTable | None:
        """The RoPE table of the forward's positions, from the first layer that
        rotates (None: none does)."""
        attn = next(
            (
                block.attn
                for block in self.blocks
                if hasattr(block.attn, "rotary")
            ),
            None,
        )
        return None if attn is None else attn.rotary(positions, dtype)

    def _check_forward(
        self, ids: Tensor, cache: Cache | None, head_mask: Tensor | None
    ) -> Tensor:
        """Check the inputs of forward; return the positions (T,) of the new
        tokens."""
        if not isinstance(ids, Tensor) or ids.dtype not in (
            torch.int32,
            torch.int64,
        ):
            raise TypeError(
                "ids must be an integer tensor (B, T), got "
                f"{getattr(ids, 'dtype', type(ids).__name__)}"
            )
        check_rank(ids, "ids", 2, "(B, T)")
        if ids.numel() and (ids.min() < 0 or ids.max() >= self.vocab_size):
            raise ValueError(
                f"ids must lie in [0, vocab_size={self.vocab_size}), got "
                f"{ids.min()}..{ids.max()}"
            )
        if cache is not None and not isinstance(cache, Cache):
            raise TypeError(
                "cache must be a KVCache (a Cache), got "
                f"{type(cache).__name__}"
            )
        if cache is not None and not self.config.causal:
            raise ValueError("a KV cache needs a causal model (causal=True)")
        t = ids.size(1)
        positions = (
            token_positions(t, device=ids.device)
            if cache is None
            else cache.positions(0, t, ids.device)
        )
        end = (
            int(positions.max()) + 1
            if self.config.positions == "learned" and t
            else 0
        )
        if end > self.config.max_len:
            raise ValueError(
                f"sequence of {end} tokens is longer than "
                f"max_len={self.config.max_len} "
                f"(learned positions have no vector beyond it)"
            )
        if head_mask is not None and tuple(head_mask.shape) != (
            self.num_layers,
            self.num_heads,
        ):
            raise ValueError(
                f"head_mask must have shape (num_layers, num_heads) = "
                f"{(self.num_layers, self.num_heads)}, got "
                f"{tuple(head_mask.shape)}"
            )
        return positions

    @torch.no_grad()
    def iter_generate(
        self, ids: Tensor, max_new_tokens: int, use_cache: bool = True
    ) -> Iterator[tuple[Tensor, Tensor]]:
        """Greedy decoding, one step at a time: yields (next_ids (B, 1), logits
        (B, V)) per new token.

        With ``use_cache`` the first step (prefill) runs the prompt ids (B, T0)
        and each later step only the newest token, reading the earlier keys and
        values from a :class:`KVCache`; without it each step reruns the whole
        sequence. The tokens are the same either way; only the cost differs.
        """
        self._check_generate(ids, max_new_tokens)
        cache = (
            KVCache(self.num_layers, max_len=ids.size(1) + max_new_tokens)
            if use_cache
            else None
        )
        step_input = ids
        for _ in range(max_new_tokens):
            logits = self(step_input, cache=cache, last_only=True)  # (B, V)
            next_ids = logits.argmax(dim=-1, keepdim=True)  # (B, 1)
            ids = torch.cat([ids, next_ids], dim=1)
            step_input = next_ids if use_cache else ids
            yield next_ids, logits

    def generate(
        self,
        ids: Tensor,
        max_new_tokens: int,
        use_cache: bool = True,
        return_logits: bool = False,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Greedy generation: ids (B, T0) -> (B, T0 + max_new_tokens), each new
        token the argmax of the logits.

        With ``return_logits=True`` also returns the logits (B, max_new_tokens,
        V) that chose each new token. ``use_cache`` changes the cost, never the
        tokens (the logits agree up to float rounding).
        """
        steps = list(self.iter_generate(ids, max_new_tokens, use_cache))
        out = torch.cat([ids, *(next_ids for next_ids, _ in steps)], dim=1)
        if not return_logits:
            return out
        logits = [step_logits for _, step_logits in steps]
        return out, torch.stack(
            logits, dim=1
        ) if logits else self.head.weight.new_empty(
            len(ids), 0, self.vocab_size
        )

    def _check_generate(self, ids: Tensor, max_new_tokens: int) -> None:
        if not self.config.causal:
            raise ValueError("generate needs a causal model (causal=True)")
        check_rank(ids, "ids", 2, "(B, T)")
        if ids.size(1) == 0:
            raise ValueError(
                "ids must hold a prompt of at least one token, got shape "
                f"{tuple(ids.shape)}"
            )
        check_int(max_new_tokens, "max_new_tokens", minimum=0)
