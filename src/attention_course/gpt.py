"""TinyGPT: a small decoder-only language model built from the course's attention, blocks and positions.

Token embedding, positions (chapter 10: learned, sinusoidal, rotary or none), ``num_layers`` pre-LN blocks
(:class:`GPTBlock`), a final LayerNorm and an output head, by default tied to the token embedding (the same (V, D)
matrix reads tokens in and scores them out). ``generate`` decodes greedily with chapter 8's
:class:`~attention_course.kv_cache.KVCache`.

For looking inside (chapter 12): ``forward(ids, return_weights=True)`` also returns every layer's attention
weights (B, H, T, Tk), exactly the ones the attention multiplied the values with, and ``head_mask`` (L, H)
multiplies each head's output before the output projection (0 = ablate the head).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from .block import FeedForward
from .heads import merge_heads, split_heads
from .kv_cache import KVCache
from .multi_head import MultiHeadAttention
from .positions import LearnedPositions, apply_rope, sinusoidal_positions
from .validation import check_dropout, check_heads, check_int, check_rank

POSITIONS = ("learned", "sinusoidal", "rope", None)


def causal_self_attention(
    attn: MultiHeadAttention,
    x: Tensor,
    positions: Tensor,
    *,
    causal: bool = True,
    rope: bool = False,
    cache: KVCache | None = None,
    layer: int = 0,
    head_mask: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Self-attention of ``attn``'s heads over x (B, T, D) at integer ``positions`` (T,).

    RoPE rotates queries and keys by their positions; with a ``cache`` the new keys and values join the
    cached ones (slot ``layer``) and the T queries are the last T positions (bottom-right causal mask).
    ``head_mask`` (H,) scales each head's output before ``w_o``. Returns out (B, T, D), weights (B, H, T, Tk).
    """
    q = split_heads(attn.w_q(x), attn.num_heads)  # (B, H, T, Dh)
    k = split_heads(attn.w_k(x), attn.num_heads)  # (B, H, T, Dh)
    v = split_heads(attn.w_v(x), attn.num_heads)  # (B, H, T, Dh)
    if rope:  # rotate before caching: cached keys keep the rotation of their own position
        q, k = apply_rope(q, positions), apply_rope(k, positions)
    if cache is not None:
        k, v = cache.update(layer, k, v)  # (B, H, Tk, Dh), Tk = cached + T
    heads, weights = attn.attend(q, k, v, None, causal, return_weights=True)  # (B, H, T, Dh), (B, H, T, Tk)
    if head_mask is not None:
        heads = heads * head_mask[:, None, None]  # (H, 1, 1) broadcasts over (B, H, T, Dh)
    return attn.w_o(merge_heads(heads)), weights  # (B, T, D)


class GPTBlock(nn.Module):
    """Pre-LN block: ``x + drop(attn(norm1(x)))``, then ``x + drop(ff(norm2(x)))`` (no FFN if attention-only)."""

    def __init__(self, d_model: int, num_heads: int, d_ff: int, dropout: float = 0.0, attention_only: bool = False):
        super().__init__()
        self.norm1 = nn.LayerNorm(d_model)
        self.attn = MultiHeadAttention(d_model, num_heads, dropout=dropout)
        self.norm2 = None if attention_only else nn.LayerNorm(d_model)
        self.ff = None if attention_only else FeedForward(d_model, d_ff, "gelu", dropout)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, positions: Tensor, **attention) -> tuple[Tensor, Tensor]:
        """x (B, T, D) -> (B, T, D) and the attention weights (B, H, T, Tk); ``attention``: see
        :func:`causal_self_attention`."""
        attn_out, weights = causal_self_attention(self.attn, self.norm1(x), positions, **attention)
        x = x + self.dropout(attn_out)
        if self.ff is not None:
            x = x + self.dropout(self.ff(self.norm2(x)))
        return x, weights


class TinyGPT(nn.Module):
    """A decoder-only language model: ids (B, T) -> next-token logits (B, T, V).

    Args:
        vocab_size: V, number of token ids.
        d_model, num_heads, num_layers: width D, heads per layer H, number of blocks L.
        d_ff: hidden width of the feed-forward networks (default 4 D).
        max_len: longest sequence with "learned" or "sinusoidal" positions (their tables stop there).
        positions: "learned" (GPT-2), "sinusoidal" (Vaswani et al.), "rope" (rotary, in every attention
            layer) or None (no position information: a causal model can still infer some).
        causal: each position sees only itself and the past (False: every position sees all; no generation).
        attention_only: blocks without feed-forward networks (the models of chapter 12).
        tie_embeddings: the output head reuses the token embedding matrix (GPT-2).
        embedding_std: standard deviation of the initial token and learned position embeddings (GPT-2: 0.02).
            Chapter 12's 2-layer induction model uses 1.0 (PyTorch's default for ``nn.Embedding``) and an untied
            head: there the embeddings must dominate the residual stream at init so that layer 2 can still read
            which token sits where.
        dropout: on attention weights, branch outputs and embeddings, in ``.train()`` mode only.

    Weights start as in GPT-2: normal(0, 0.02) (embeddings: normal(0, ``embedding_std``)), and the projections
    that write into the residual stream (``w_o``, ``linear2``) scaled by 1 / sqrt(2 L), so the stream's size does
    not grow with depth at init.
    """

    def __init__(self, vocab_size: int, d_model: int, num_heads: int, num_layers: int, d_ff: int | None = None,
                 max_len: int = 256, positions: str | None = "learned", causal: bool = True,
                 attention_only: bool = False, tie_embeddings: bool = True, embedding_std: float = 0.02,
                 dropout: float = 0.0):
        super().__init__()
        d_ff = 4 * d_model if d_ff is None else d_ff
        for name, value in (("vocab_size", vocab_size), ("d_model", d_model), ("num_heads", num_heads),
                            ("num_layers", num_layers), ("d_ff", d_ff), ("max_len", max_len)):
            check_int(value, name)
        check_heads(d_model, num_heads)
        check_dropout(dropout)
        if not embedding_std > 0:
            raise ValueError(f"embedding_std must be > 0, got embedding_std={embedding_std}")
        if positions not in POSITIONS:
            raise ValueError(f"positions must be one of {POSITIONS}, got positions={positions!r}")
        if positions == "rope" and (d_model // num_heads) % 2:
            raise ValueError(f"positions='rope' needs an even head size, got d_model // num_heads = "
                             f"{d_model // num_heads}")
        self.vocab_size, self.max_len, self.positions, self.causal = vocab_size, max_len, positions, causal
        self.num_heads = num_heads
        self.tok_emb = nn.Embedding(vocab_size, d_model)
        self.pos_emb = LearnedPositions(max_len, d_model) if positions == "learned" else None
        if positions == "sinusoidal":
            self.register_buffer("pos_table", sinusoidal_positions(max_len, d_model), persistent=False)
        self.dropout = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(
            GPTBlock(d_model, num_heads, d_ff, dropout, attention_only) for _ in range(num_layers)
        )
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size, bias=False)
        if tie_embeddings:
            self.head.weight = self.tok_emb.weight  # one (V, D) matrix embeds and unembeds
        self.apply(lambda module: self._init_weights(module, embedding_std))
        for name, p in self.named_parameters():
            if name.endswith(("w_o.weight", "linear2.weight")):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * num_layers))

    def _init_weights(self, module: nn.Module, embedding_std: float) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            # a tied head is the embedding matrix: it is drawn (again, last) with the embeddings' std
            embeds = isinstance(module, nn.Embedding) or module.weight is self.tok_emb.weight
            nn.init.normal_(module.weight, std=embedding_std if embeds else 0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    @property
    def num_layers(self) -> int:
        return len(self.blocks)

    def num_parameters(self) -> int:
        """Number of trainable numbers; a tied embedding/head matrix counts once."""
        return sum(p.numel() for p in self.parameters())

    def forward(self, ids: Tensor, cache: KVCache | None = None, head_mask: Tensor | None = None,
                return_weights: bool = False) -> Tensor | tuple[Tensor, list[Tensor]]:
        """ids (B, T) -> logits (B, T, V) [, weights: one (B, H, T, Tk) tensor per layer].

        With a ``cache``, ids are the new tokens, at positions ``len(cache)`` onwards. ``head_mask`` (L, H), bool
        or float, multiplies each head's output before its layer's output projection.
        """
        start = self._check_forward(ids, cache, head_mask)
        positions = torch.arange(start, start + ids.size(1), device=ids.device)  # (T,)
        x = self.tok_emb(ids)  # (B, T, D)
        if self.pos_emb is not None:
            x = x + self.pos_emb(positions)
        elif self.positions == "sinusoidal":
            x = x + self.pos_table[positions]
        x = self.dropout(x)
        all_weights = []
        for layer, block in enumerate(self.blocks):
            mask_row = None if head_mask is None else head_mask[layer].to(x.dtype)  # (H,)
            x, weights = block(x, positions, causal=self.causal, rope=self.positions == "rope", cache=cache,
                               layer=layer, head_mask=mask_row)
            all_weights.append(weights)
        logits = self.head(self.norm(x))  # (B, T, V)
        return (logits, all_weights) if return_weights else logits

    def _check_forward(self, ids: Tensor, cache: KVCache | None, head_mask: Tensor | None) -> int:
        """Check the inputs of forward; return the position of the first new token."""
        if not isinstance(ids, Tensor) or ids.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"ids must be an integer tensor (B, T), got {getattr(ids, 'dtype', type(ids).__name__)}")
        check_rank(ids, "ids", 2, "(B, T)")
        if ids.numel() and (ids.min() < 0 or ids.max() >= self.vocab_size):
            raise ValueError(f"ids must lie in [0, vocab_size={self.vocab_size}), got {ids.min()}..{ids.max()}")
        if cache is not None and not self.causal:
            raise ValueError("a KV cache needs a causal model (causal=True)")
        start = 0 if cache is None else len(cache)
        if self.positions in ("learned", "sinusoidal") and start + ids.size(1) > self.max_len:
            raise ValueError(f"sequence of {start + ids.size(1)} tokens is longer than max_len={self.max_len} "
                             f"(positions={self.positions!r} has no vector beyond it)")
        if head_mask is not None and tuple(head_mask.shape) != (self.num_layers, self.num_heads):
            raise ValueError(f"head_mask must have shape (num_layers, num_heads) = "
                             f"{(self.num_layers, self.num_heads)}, got {tuple(head_mask.shape)}")
        return start

    @torch.no_grad()
    def generate(self, ids: Tensor, max_new_tokens: int, use_cache: bool = True) -> Tensor:
        """Greedy decoding: ids (B, T0) -> (B, T0 + max_new_tokens), each new token the argmax of the logits.

        With ``use_cache`` the prompt runs once (prefill) and each step feeds only the newest token, reading
        the earlier keys and values from a :class:`KVCache`; without it each step reruns the whole sequence.
        The tokens are the same either way; only the cost differs.
        """
        if not self.causal:
            raise ValueError("generate needs a causal model (causal=True)")
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
        cache = KVCache(self.num_layers) if use_cache else None
        step_input = ids
        for _ in range(max_new_tokens):
            logits = self(step_input, cache=cache)  # (B, T_step, V)
            next_ids = logits[:, -1].argmax(dim=-1, keepdim=True)  # (B, 1)
            ids = torch.cat([ids, next_ids], dim=1)
            step_input = next_ids if use_cache else ids
        return ids
