"""DeepSeek V4's attention (chapter 19): a sliding window over the latest
tokens, plus entries that each compress a block of older tokens.

Every layer has one key-value head shared by all query heads, and the same
vector is the key and the value (K = V). A query attends to the latest W tokens
(the window) and, in two of the three layer kinds, to compressed entries:

* ``"sliding"``: the window only;
* ``"hca"`` (heavily compressed attention): one entry per block of ``rate``
  tokens (128 in V4), every query sees every complete block before it;
* ``"csa"`` (compressed sparse attention): one entry per ``rate`` tokens (4),
  pooled over an overlapping span of 2 x ``rate`` (the previous block's first
  series and the block's own second series), of which a lightning indexer
  (:mod:`.indexer`'s score over its own compressed keys) picks each query's
  top ``top_k``.

An entry pools its tokens with a softmax over the block of a learned gate (per
token and feature, plus a bias per slot). Each head has a learned sink (a
softmax column with no value, as GPT-OSS's). RoPE rotates the last
``rope_dim`` features in pairs; since the values are the rotated keys, the
output's rope features are rotated back at the query's position, so what a key
adds depends on the distance only. The heads' outputs go through a grouped
low-rank projection. The mask is the window's, the compressed entries' causal
rule and the indexer's top-k, all boolean masks of the course's vocabulary;
the attention is :func:`~attention_course.functional.attend` with sinks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from ..block import RMSNorm
from ..functional import attend
from ..interop.hf import HFTwin, check_hf_module, copy_linear
from ..kv_cache import Cache
from ..modern.attention import layer_mask, layer_positions
from ..positions import RotaryTable, inverse_frequencies, rope_table, rotate
from ..validation import check_int
from .indexer import index_scores
from .topk import top_k_selection

if TYPE_CHECKING:
    from ..gpt import GPTConfig

KINDS = ("sliding", "csa", "hca")


def rotate_tail(x: Tensor, table: RotaryTable) -> Tensor:
    """x (..., T, Dh) with its last features rotated in interleaved pairs by
    ``table`` (cos, sin (..., T, R/2)); the first Dh - R pass unchanged."""
    rope_dim = 2 * table.cos.size(-1)
    rest, rot = x.split([x.size(-1) - rope_dim, rope_dim], dim=-1)
    return torch.cat([rest, rotate(rot, table, "interleaved")], dim=-1)


def pool_blocks(kv: Tensor, gate: Tensor, rate: int, overlap: bool) -> Tensor:
    """Compress every complete block of ``rate`` tokens into one entry.

    kv, gate (B, N * rate, W) -> (B, N, Dh): entry n is sum_s softmax_s(gate)
    * kv over the block's slots s, per feature. Without ``overlap`` W = Dh.
    With it W = 2 Dh: the first Dh features of each token (its series a)
    join the next block's entry, the last Dh (series b) its own block's, so
    entry n pools 2 x ``rate`` slots (block 0's missing predecessor weighs
    nothing)."""
    b, t, width = kv.shape
    n = t // rate
    kv, gate = (z.view(b, n, rate, width) for z in (kv, gate))
    if overlap:
        dh = width // 2
        # (B, N, 2 rate, Dh): the previous block's series a, then series b
        before_kv = torch.cat(
            [torch.zeros_like(kv[:, :1, :, :dh]), kv[:, :-1, :, :dh]], dim=1
        )
        before_gate = torch.cat(
            [
                torch.full_like(gate[:, :1, :, :dh], float("-inf")),
                gate[:, :-1, :, :dh],
            ],
            dim=1,
        )
        kv = torch.cat([before_kv, kv[..., dh:]], dim=2)
        gate = torch.cat([before_gate, gate[..., dh:]], dim=2)
    return (kv * gate.softmax(dim=2)).sum(dim=2)


@dataclass
class CompressorState:
    """What a compressor keeps between calls (in the cache, within a layer's
    :meth:`~attention_course.kv_cache.Cache.state`): the tokens of the block
    not complete yet (B, P < rate, D), the last complete block (B, rate, D),
    whose first series the next entry pools too (CSA; None for HCA), and the
    entries so far (B, N, Dh)."""

    pending: Tensor
    last_block: Tensor | None
    entries: Tensor


class BlockCompressor(nn.Module):
    """Compressed entries of width ``head_dim``, one per ``rate`` tokens:
    the projections of each token to a value and a gate, a bias per slot of
    the block, and an RMSNorm of each entry; ``overlap`` pools spans of
    2 x ``rate`` (CSA) instead of single blocks (HCA)."""

    def __init__(
        self,
        d_model: int,
        head_dim: int,
        rate: int,
        *,
        overlap: bool,
        norm_eps: float = 1e-6,
    ):
        super().__init__()
        for name, value in (
            ("d_model", d_model),
            ("head_dim", head_dim),
            ("rate", rate),
        ):
            check_int(value, name)
        self.head_dim, self.rate, self.overlap = head_dim, rate, overlap
        width = head_dim * (2 if overlap else 1)
        self.kv_proj = nn.Linear(d_model, width, bias=False)
        self.gate_proj = nn.Linear(d_model, width, bias=False)
        self.position_bias = nn.Parameter(torch.zeros(rate, width))
        self.norm = RMSNorm(head_dim, eps=norm_eps)

    def compress(
        self,
        blocks: Tensor,
        before: Tensor | None,
        first: int,
        inv_freq: Tensor,
    ) -> Tensor:
        """Complete blocks (B, n * rate, D), the first of them block number
        ``first``, after the block ``before`` (B, rate, D) or none -> their
        entries (B, n, Dh), each rotated at its block's first position."""
        n = blocks.size(1) // self.rate
        if self.overlap and before is not None:
            blocks = torch.cat([before, blocks], dim=1)
        gate = self.gate_proj(blocks) + self.position_bias.repeat(
            blocks.size(1) // self.rate, 1
        )
        pooled = pool_blocks(
            self.kv_proj(blocks), gate, self.rate, self.overlap
        )
        # the block before has its entry already: it lends its series a only
        entries = self.norm(pooled[:, pooled.size(1) - n :])
        starts = (first + torch.arange(n, device=blocks.device)) * self.rate
        return rotate_tail(entries, rope_table(starts, inv_freq, blocks.dtype))

    def forward(
        self,
        x: Tensor,
        inv_freq: Tensor,
        state: CompressorState | None = None,
    ) -> tuple[Tensor, CompressorState]:
        """x (B, T, D), the tokens after those ``state`` saw -> (every entry
        so far (B, N, Dh), the state after x)."""
        if state is None:
            empty = x.new_zeros(x.size(0), 0, self.head_dim)
            state = CompressorState(x[:, :0], None, empty)
        tokens = torch.cat([state.pending, x], dim=1)
        usable = tokens.size(1) // self.rate * self.rate
        blocks = tokens[:, :usable]
        new = self.compress(
            blocks, state.last_block, state.entries.size(1), inv_freq
        )
        entries = torch.cat([state.entries, new], dim=1)
        last = blocks[:, usable - self.rate :] if usable else state.last_block
        return entries, CompressorState(
            tokens[:, usable:], last if self.overlap else None, entries
        )

    @classmethod
    def from_hf(cls, module, overlap: bool) -> BlockCompressor:
        """The compressor part of transformers' ``DeepseekV4HCACompressor``
        (no overlap), ``DeepseekV4CSACompressor`` or ``DeepseekV4Indexer``
        (overlap)."""
        ours = cls(
            module.kv_proj.in_features,
            module.head_dim,
            module.compress_rate,
            overlap=overlap,
            norm_eps=module.kv_norm.variance_epsilon,
        )
        copy_linear(ours.kv_proj, module.kv_proj)
        copy_linear(ours.gate_proj, module.gate_proj)
        with torch.no_grad():
            ours.position_bias.copy_(module.position_bias)
            ours.norm.weight.copy_(module.kv_norm.weight)
        return ours.to(module.kv_proj.weight.dtype)


def entries_visible(positions: Tensor, entries: int, rate: int) -> Tensor:
    """(T, N) boolean: a query at position p sees entry n iff the whole block
    n is at or before it, (n + 1) * rate <= p + 1."""
    n = torch.arange(entries, device=positions.device)
    return (n[None, :] + 1) * rate <= positions[:, None] + 1


def own_entries(seen: list[Tensor], segments: list[tuple]) -> Tensor:
    """Block-diagonal (B, T, N): the queries of each segment (seq, start,
    end) of a packed row see, of all the entries side by side, only their own
    sequence's, as ``seen`` (B, end - start, N_s) says."""
    b, t = seen[0].size(0), segments[-1][2]
    widths = [s.size(-1) for s in seen]
    mask = seen[0].new_zeros(b, t, sum(widths))
    column = 0
    for (_, start, end), sees, width in zip(
        segments, seen, widths, strict=True
    ):
        mask[:, start:end, column : column + width] = sees
        column += width
    return mask


class CompressedAttention(nn.Module):
    """One attention layer of DeepSeek V4, of kind ``"sliding"``, ``"csa"``
    or ``"hca"`` (:data:`KINDS`); mirrors transformers'
    ``DeepseekV4Attention``.

    Args:
        d_model, num_heads, head_dim: the token width, the query heads and
            their width (the one shared key-value head has the same width).
        kind: the layer kind; ``rate`` its block size (CSA, HCA).
        window: W, the latest tokens every query sees (itself included).
        q_lora_rank: width of the normalised query latent.
        rope_dim: the last features RoPE rotates; ``inv_freq`` (rope_dim / 2)
            its frequencies (V4: theta 10000 in sliding layers, 160000 with
            YaRN in compressed ones).
        o_groups, o_lora_rank: the output projection: the heads cut into
            ``o_groups`` groups, each projected to ``o_lora_rank``, then all
            mixed to ``d_model``.
        index_heads, index_head_dim, top_k: CSA's indexer.
    """

    hf_twin = HFTwin(
        "deepseek_v4.modeling_deepseek_v4",
        "DeepseekV4Attention",
        "DeepseekV4Config",
        "DeepseekV4RotaryEmbedding",
    )

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        head_dim: int,
        *,
        kind: str = "sliding",
        window: int,
        q_lora_rank: int,
        rope_dim: int,
        inv_freq: Tensor,
        o_groups: int,
        o_lora_rank: int,
        rate: int | None = None,
        index_heads: int | None = None,
        index_head_dim: int | None = None,
        top_k: int | None = None,
        norm_eps: float = 1e-6,
    ):
        super().__init__()
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        for name, value in (
            ("d_model", d_model),
            ("num_heads", num_heads),
            ("head_dim", head_dim),
            ("window", window),
            ("q_lora_rank", q_lora_rank),
            ("o_groups", o_groups),
            ("o_lora_rank", o_lora_rank),
        ):
            check_int(value, name)
        check_int(rope_dim, "rope_dim", even=True)
        if num_heads * head_dim % o_groups:
            raise ValueError(
                f"o_groups={o_groups} must divide num_heads * head_dim = "
                f"{num_heads * head_dim}"
            )
        self.kind, self.window, self.num_heads, self.head_dim = (
            kind,
            window,
            num_heads,
            head_dim,
        )
        self.rope_dim, self.o_groups = rope_dim, o_groups
        self.register_buffer("inv_freq", inv_freq.double(), persistent=False)
        self.q_a_proj = nn.Linear(d_model, q_lora_rank, bias=False)
        self.q_a_norm = RMSNorm(q_lora_rank, eps=norm_eps)
        self.q_b_proj = nn.Linear(
            q_lora_rank, num_heads * head_dim, bias=False
        )
        self.norm_eps = norm_eps
        self.kv_proj = nn.Linear(d_model, head_dim, bias=False)
        self.kv_norm = RMSNorm(head_dim, eps=norm_eps)
        # (groups, o_lora_rank, heads' features per group), drawn as a
        # Linear's weight (zeros would silence the layer in a model)
        fan_in = num_heads * head_dim // o_groups
        self.o_a = nn.Parameter(
            torch.empty(o_groups, o_lora_rank, fan_in).uniform_(
                -(fan_in**-0.5), fan_in**-0.5
            )
        )
        self.o_b_proj = nn.Linear(o_groups * o_lora_rank, d_model, bias=False)
        self.sinks = nn.Parameter(torch.zeros(num_heads))
        self.rate, self.top_k = rate, top_k
        if kind != "sliding":
            check_int(rate, "rate")
            self.compressor = BlockCompressor(
                d_model,
                head_dim,
                rate,
                overlap=kind == "csa",
                norm_eps=norm_eps,
            )
        if kind == "csa":
            check_int(index_heads, "index_heads")
            check_int(index_head_dim, "index_head_dim")
            check_int(top_k, "top_k")
            self.index_compressor = BlockCompressor(
                d_model, index_head_dim, rate, overlap=True, norm_eps=norm_eps
            )
            self.index_q_proj = nn.Linear(
                q_lora_rank, index_heads * index_head_dim, bias=False
            )
            self.index_weights = nn.Linear(d_model, index_heads, bias=False)
            self.index_heads, self.index_head_dim = index_heads, index_head_dim

    def queries(self, q_latent: Tensor, rotary: RotaryTable) -> Tensor:
        """q_latent (B, T, q_lora_rank) -> (B, H, T, Dh): each head's query
        scaled to root-mean-square 1 (no weight), then rotated."""
        b, t, _ = q_latent.shape
        q = self.q_b_proj(q_latent).view(b, t, self.num_heads, -1)
        q = q * torch.rsqrt(q.pow(2).mean(-1, keepdim=True) + self.norm_eps)
        return rotate_tail(q.transpose(1, 2), rotary)

    def index_selection(
        self, x: Tensor, q_latent: Tensor, positions: Tensor, keys: Tensor
    ) -> Tensor:
        """CSA: (B, T, N) boolean, each query's ``top_k`` compressed entries
        by the indexer's score over its keys (B, 1, N, Di), among those it may
        see."""
        b, t, _ = x.shape
        q = self.index_q_proj(q_latent).view(b, t, self.index_heads, -1)
        q = rotate_tail(
            q.transpose(1, 2), rope_table(positions, self.inv_freq, x.dtype)
        )
        weights = (
            self.index_weights(x).transpose(1, 2) * self.index_heads**-0.5
        )
        scores = index_scores(q, keys, weights, self.index_head_dim**-0.5)
        visible = entries_visible(positions, keys.size(2), self.rate)
        return top_k_selection(scores, self.top_k, visible)

    def output(self, heads: Tensor, rotary: RotaryTable) -> Tensor:
        """heads (B, H, T, Dh) -> (B, T, D): the rope features rotated back
        at each query's position, then the grouped low-rank projection."""
        back = RotaryTable(rotary.cos, -rotary.sin)
        heads = rotate_tail(heads, back).transpose(1, 2)  # (B, T, H, Dh)
        b, t = heads.shape[:2]
        grouped = heads.reshape(b, t, self.o_groups, -1)
        low = torch.einsum("btgi,goi->btgo", grouped, self.o_a)
        return self.o_b_proj(low.flatten(2))

    @property
    def keeps_state(self) -> bool:
        """Whether the layer keeps a state per sequence in the cache (its
        compressors'): a shared prompt prefix cannot share it."""
        return self.kind != "sliding"

    def cache_shape(self) -> tuple[int, int, int]:
        """What one token puts in a cache: one key-value head of Dh, and no
        value (K = V: the key is stored once)."""
        return 1, self.head_dim, 0

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
        """x (B, T, D) -> (B, T, D). Positions (T,) default to 0..T-1, or to
        those after the cached tokens. The cache keeps the window's keys
        (once: the values are the same vectors) and, as the state of each
        sequence, its compressors' (:class:`CompressorState`). A GPT's
        ``rotary`` is not used (each kind has its own frequencies);
        ``head_mask`` (H,) scales each head's output, ``weights`` (a list)
        receives the weights (B, H, T, Tk + N): the keys, then the entries."""
        b, t, _ = x.shape
        positions = layer_positions(x, positions, cache, layer)
        rotary = rope_table(positions, self.inv_freq, x.dtype)
        q_latent = self.q_a_norm(self.q_a_proj(x))
        q = self.queries(q_latent, rotary)  # (B, H, T, Dh)
        kv = rotate_tail(self.kv_norm(self.kv_proj(x))[:, None], rotary)
        if cache is not None:
            # K = V: the keys are stored once, beside empty values
            kv, _ = cache.update(layer, kv, kv[..., :0])
        # (B, 1, T, Tk): the window over the raw tokens
        mask = layer_mask(
            t, kv.size(2), x.device, cache, layer, window=self.window
        ).expand(b, 1, t, kv.size(2))
        if self.kind != "sliding":
            # (B, N, Dh), (B, T, N)
            entries, seen = self.entries_for_row(
                x, q_latent, positions, cache, layer
            )
            kv = torch.cat([kv, entries[:, None]], dim=2)
            mask = torch.cat([mask, seen[:, None]], dim=-1)
        heads, attention = attend(q, kv, kv, mask, sinks=self.sinks)
        if weights is not None:
            weights.append(attention)
        if head_mask is not None:
            # (H, 1, 1) over (B, H, T, Dh)
            heads = heads * head_mask[:, None, None]
        return self.output(heads, rotary)

    def entries_for_row(
        self,
        x: Tensor,
        q_latent: Tensor,
        positions: Tensor,
        cache: Cache | None,
        layer: int,
    ) -> tuple[Tensor, Tensor]:
        """The entries the new tokens may attend to (B, N, Dh) and which each
        query sees (B, T, N). With a cache, each sequence of the row (its
        segment: a paged cache packs several) continues from its own
        compressors' state and sees its own entries only."""
        if cache is None:
            entries, seen, _ = self.entries_for_sequence(
                x, q_latent, positions, {}
            )
            return entries, seen
        segments = cache.segments(x.size(1))
        entries, seen = [], []
        for seq, start, end in segments:
            span = slice(start, end)
            new, sees, state = self.entries_for_sequence(
                x[:, span],
                q_latent[:, span],
                positions[..., span],
                dict(cache.state(layer, seq) or {}),
            )
            # the length advanced in update already
            cache.set_state(layer, state, 0, seq)
            entries.append(new)
            seen.append(sees)
        return torch.cat(entries, dim=1), own_entries(seen, segments)

    def entries_for_sequence(
        self, x: Tensor, q_latent: Tensor, positions: Tensor, state: dict
    ) -> tuple[Tensor, Tensor, dict]:
        """One sequence's tokens x (B, T, D) after its compressors' ``state``
        -> (its entries so far (B, N, Dh), which each query sees (B, T, N),
        the state after x)."""
        entries, state["entries"] = self.compressor(
            x, self.inv_freq, state.get("entries")
        )
        if self.kind == "hca":
            seen = entries_visible(positions, entries.size(1), self.rate)
            return entries, seen.expand(x.size(0), -1, -1), state
        keys, state["index"] = self.index_compressor(
            x, self.inv_freq, state.get("index")
        )
        seen = self.index_selection(x, q_latent, positions, keys[:, None])
        return entries, seen, state

    @classmethod
    def from_hf(cls, module) -> CompressedAttention:
        """A course layer with the sizes, options and weights of the
        transformers ``DeepseekV4Attention`` ``module``."""
        check_hf_module(cls, module)
        config = module.config
        kind = {
            "sliding_attention": "sliding",
            "compressed_sparse_attention": "csa",
            "heavily_compressed_attention": "hca",
        }[module.layer_type]
        rotary = cls.hf_twin.load(cls.hf_twin.rotary)(config)
        rope = "main" if kind == "sliding" else "compress"
        compressed = module.compressor
        indexer = compressed.indexer if kind == "csa" else None
        ours = cls(
            config.hidden_size,
            module.num_heads,
            module.head_dim,
            kind=kind,
            window=module.sliding_window,
            q_lora_rank=config.q_lora_rank,
            rope_dim=config.qk_rope_head_dim,
            inv_freq=getattr(rotary, f"{rope}_inv_freq"),
            o_groups=config.o_groups,
            o_lora_rank=config.o_lora_rank,
            rate=None if compressed is None else compressed.compress_rate,
            index_heads=None if indexer is None else indexer.num_heads,
            index_head_dim=None if indexer is None else indexer.head_dim,
            top_k=None if indexer is None else indexer.index_topk,
            norm_eps=module.kv_norm.variance_epsilon,
        )
        for mine, theirs in (
            (ours.q_a_proj, module.q_a_proj),
            (ours.q_b_proj, module.q_b_proj),
            (ours.kv_proj, module.kv_proj),
            (ours.o_b_proj, module.o_b_proj),
        ):
            copy_linear(mine, theirs)
        with torch.no_grad():
            ours.q_a_norm.weight.copy_(module.q_a_norm.weight)
            ours.kv_norm.weight.copy_(module.kv_norm.weight)
            ours.o_a.copy_(module.o_a_proj.weight.view(ours.o_a.shape))
            ours.sinks.copy_(module.sinks)
        if compressed is not None:
            ours.compressor = BlockCompressor.from_hf(
                compressed, overlap=kind == "csa"
            )
        if indexer is not None:
            ours.index_compressor = BlockCompressor.from_hf(
                indexer, overlap=True
            )
            copy_linear(ours.index_q_proj, indexer.q_b_proj)
            copy_linear(ours.index_weights, indexer.scorer.weights_proj)
        return ours.to(module.kv_proj.weight.dtype)


def v4_layers(
    kinds: Sequence[str],
    *,
    head_dim: int,
    window: int,
    q_lora_rank: int,
    rope_dim: int,
    o_groups: int,
    o_lora_rank: int,
    rates: dict[str, int] | None = None,
    index_heads: int | None = None,
    index_head_dim: int | None = None,
    top_k: int | None = None,
    rope_base: float = 10000.0,
) -> Callable[[GPTConfig, int], CompressedAttention]:
    """A :class:`~attention_course.gpt.GPT`'s ``attention`` factory: layer i
    is a :class:`CompressedAttention` of kind ``kinds[i % len(kinds)]`` (V4
    interleaves them), of the config's width and heads; ``rates`` gives each
    compressed kind its block size (V4: {"csa": 4, "hca": 128}), the other
    sizes are every layer's (see :class:`CompressedAttention`)."""
    rates = {"csa": 4, "hca": 128} if rates is None else rates
    if not kinds or any(kind not in KINDS for kind in kinds):
        raise ValueError(
            f"kinds must name at least one of {KINDS}, got {list(kinds)}"
        )

    def attention(config: GPTConfig, layer: int) -> CompressedAttention:
        kind = kinds[layer % len(kinds)]
        return CompressedAttention(
            config.d_model,
            config.num_heads,
            head_dim,
            kind=kind,
            window=window,
            q_lora_rank=q_lora_rank,
            rope_dim=rope_dim,
            inv_freq=inverse_frequencies(rope_dim, rope_base),
            o_groups=o_groups,
            o_lora_rank=o_lora_rank,
            rate=rates.get(kind),
            index_heads=index_heads,
            index_head_dim=index_head_dim,
            top_k=top_k,
        )

    return attention
