"""Autoregressive generation with a key/value cache, multi-query and
grouped-query attention.

A causal decoder generates one token at a time. Without a cache, step n re-runs
the whole model over all n positions, although the keys and values of the first
n - 1 positions are exactly what the previous step computed (causality: earlier
positions never look at later ones). A **KV cache** keeps each layer's keys and
values, (B, H_kv, T, Dh), so a decoding step only projects the *new* token and
attends over the cache:

* prefill: run the prompt (Tq = Tk = T0) once, storing its keys/values;
* decode: one query (Tq = 1) against Tk = T0 + n cached keys. Queries are the
  *last* Tq positions, which is the bottom-right aligned causal convention of
  the course (for Tq = 1 the mask allows every cached key).

The cost of a decoding step becomes O(T) (attention over the cache) instead of
O(T^2); the price is memory:
:func:`cache_bytes_per_token` bytes per token. Multi-query attention (MQA, one
key/value head shared by all query heads) and grouped-query attention (GQA,
``num_kv_heads`` groups) shrink that cache by ``num_heads / num_kv_heads``:
query head h uses key/value head ``h // (num_heads // num_kv_heads)``.

The course's one model, :class:`~attention_course.gpt.GPT`, generates with this
cache and this attention.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from .functional import _attend, check_backend, expand_kv
from .heads import merge_heads
from .masks import sliding_window_mask
from .params import (
    as_tensors,
    check_params,
    linear_params,
    load_fused_qkv,
    load_linear,
)
from .positions import (
    RotaryTable,
    alibi_mod,
    check_base,
    inverse_frequencies,
    rope_table,
    rotate,
    token_positions,
)
from .validation import check_dropout, check_heads, check_int, check_rank


def cache_bytes_per_token(
    num_layers: int, num_kv_heads: int, head_dim: int, dtype=torch.float32
) -> int:
    """Bytes a KV cache needs per token (per sequence): keys and values of
    every layer.

    ``2 (K and V) * num_layers * num_kv_heads * head_dim * bytes per element``;
    ``dtype`` is a torch dtype (or its name, e.g. ``"bfloat16"``).
    """
    if isinstance(dtype, str):
        if not isinstance(getattr(torch, dtype, None), torch.dtype):
            raise ValueError(f"unknown dtype name {dtype!r}")
        dtype = getattr(torch, dtype)
    if not isinstance(dtype, torch.dtype):
        raise TypeError(
            "dtype must be a torch.dtype or its name, got "
            f"{type(dtype).__name__}"
        )
    for name, value in (
        ("num_layers", num_layers),
        ("num_kv_heads", num_kv_heads),
        ("head_dim", head_dim),
    ):
        check_int(value, name)
    return 2 * num_layers * num_kv_heads * head_dim * dtype.itemsize


def repeat_kv(x: Tensor, n_rep: int) -> Tensor:
    """(B, H_kv, T, Dh) -> (B, H_kv * n_rep, T, Dh), each key/value head
    repeated n_rep times in a row.

    Equal to ``x.repeat_interleave(n_rep, dim=1)``: output head h is input head
    ``h // n_rep``, so the query heads of one group share one key/value head.
    ``expand`` makes the repeat a view; the final reshape copies (grouped
    kernels avoid even that copy: SDPA's ``enable_gqa``, which the layers'
    "sdpa" backend uses).
    """
    check_rank(x, "x", 4, "(B, H_kv, T, Dh)")
    check_int(n_rep, "n_rep")
    return expand_kv(x, n_rep)


class Cache(ABC):
    """The protocol every cache of the course follows, whatever a layer keeps:
    a model asks it, once per forward, where its new tokens stand
    (:meth:`positions`) and which keys each may see (:meth:`mask`); each layer
    hands it its new keys/values and gets back all of them (:meth:`update`).

    Layer kinds: contiguous and sliding window (:class:`KVCache`, chapters 8
    and 14), latent (MLA, chapter 14:
    a :class:`KVCache` layer holding the latent and the shared rotated key as
    its "keys" and "values"), recurrent state (a layer that keeps one
    fixed-size state per sequence instead of keys: :meth:`state`,
    :meth:`set_state`; chapter 17's Gated DeltaNet), indexed (a latent layer
    whose "values" also carry the lightning indexer's key, chapter 19's sparse
    MLA), compressed (chapter 19's DeepSeek V4: the window's keys, which are
    also the values, so the values are empty, plus each sequence's compressor
    state, run segment by segment as a recurrent layer's), paged
    (:class:`~attention_course.serving.paged_cache.PagedKVCache`, chapter 18:
    many sequences in one pool).
    """

    @abstractmethod
    def update(
        self, layer: int, k: Tensor, v: Tensor
    ) -> tuple[Tensor, Tensor]:
        """Store the new keys/values of ``layer``; return every key/value its
        new queries attend to."""

    @abstractmethod
    def positions(self, layer: int, t_new: int, device=None) -> Tensor:
        """(t_new,) positions of the new tokens, each in its own sequence."""

    @abstractmethod
    def mask(
        self,
        layer: int,
        t_q: int,
        t_k: int,
        device=None,
        *,
        window: int | None = None,
    ) -> Tensor | None:
        """(t_q, t_k) True = may attend, or None: the bottom-right causal mask.
        ``window``: a sliding layer's."""

    @abstractmethod
    def crop(self, length: int) -> None:
        """Forget every position from ``length`` on (speculative decoding's
        rejected drafts)."""

    @abstractmethod
    def seq_len(self, seq=0) -> int:
        """Positions cached for sequence ``seq``."""

    @abstractmethod
    def segments(self, t_new: int) -> list[tuple]:
        """[(seq, start, end)]: which new tokens of the row belong to which
        sequence (a recurrent layer runs each sequence's segment from that
        sequence's state)."""

    @abstractmethod
    def state(self, layer: int, seq=0):
        """The recurrent state of ``layer`` for sequence ``seq`` (None before
        its first token)."""

    @abstractmethod
    def set_state(self, layer: int, state, t_new: int, seq=0) -> None:
        """Keep a layer's state (recurrent, or V4's compressors) after
        ``t_new`` more tokens of sequence ``seq`` (0 when the layer's
        :meth:`update` counted them already)."""


class KVCache(Cache):
    """Keys and values of every layer of a decoder, (B, H_kv, T, Dh) each,
    grown one step at a time.

    Args:
        num_layers: number of attention layers that write into the cache.
        max_len: if given, each layer's buffers are preallocated for
            ``max_len`` positions on the first :meth:`update` and filled in
            place (no copying per step); if None, new keys/values are appended
            with ``torch.cat`` (simple, but every step copies the whole cache:
            O(T) work per token).
        windows: per layer, None (contiguous: keeps every position) or the
            window of a sliding layer, which keeps only the ``window - 1`` last
            positions (all a later query can still see).

    The batch rows are sequences of one common length. Keys and values may
    differ in their last size (MLA's latent layer stores its latent and its
    rotated key).
    """

    def __init__(
        self,
        num_layers: int,
        max_len: int | None = None,
        windows: Sequence[int | None] | None = None,
    ):
        if num_layers < 1:
            raise ValueError(f"num_layers must be >= 1, got {num_layers}")
        if max_len is not None and max_len < 1:
            raise ValueError(f"max_len must be >= 1 or None, got {max_len}")
        windows = [None] * num_layers if windows is None else list(windows)
        if len(windows) != num_layers or any(
            w is not None and w < 1 for w in windows
        ):
            raise ValueError(
                "windows must hold one window >= 1 or None per layer "
                f"({num_layers}), got {windows}"
            )
        self.num_layers = num_layers
        self.max_len = max_len
        self.windows = windows
        self.keys: list[Tensor | None] = [None] * num_layers
        self.values: list[Tensor | None] = [None] * num_layers
        self.lengths = [0] * num_layers
        # recurrent layers: one state for the whole batch
        self.states: dict[int, object] = {}

    def __len__(self) -> int:
        """Number of positions cached (in layer 0; every layer holds the same
        number after a full step)."""
        return self.lengths[0]

    def seq_len(self, seq=0) -> int:
        """Positions cached for each batch row (they share one length)."""
        return self.lengths[0]

    def segments(self, t_new: int) -> list[tuple]:
        """One segment: every batch row is its own sequence, all new tokens are
        its."""
        return [(0, 0, t_new)]

    def state(self, layer: int, seq=0):
        return self.states.get(layer)

    def set_state(self, layer: int, state, t_new: int, seq=0) -> None:
        self.states[layer] = state
        self.lengths[layer] += t_new

    def update(
        self, layer: int, k: Tensor, v: Tensor
    ) -> tuple[Tensor, Tensor]:
        """Store the new keys/values k, v (B, H_kv, T_new, Dh) of ``layer``;
        return all of them so far.

        Returns:
            (keys, values), each (B, H_kv, T_cached + T_new, Dh). With
            preallocation these are views into the buffers, valid until the
            next update.
        """
        if not 0 <= layer < self.num_layers:
            raise IndexError(
                f"layer {layer} out of range for a cache of "
                f"{self.num_layers} layers"
            )
        check_rank(k, "k", 4, "(B, H_kv, T, Dh)")
        if k.shape[:3] != v.shape[:3]:
            raise ValueError(
                "k and v must have the same shape (B, H_kv, T), got "
                f"{tuple(k.shape)} and "
                f"{tuple(v.shape)}"
            )
        if self.windows[layer] is not None:
            return self.update_sliding(layer, k, v)
        start, t_new = self.lengths[layer], k.shape[2]
        cached = self.keys[layer]
        if cached is not None and (
            cached.shape[:2] != k.shape[:2] or cached.shape[3] != k.shape[3]
        ):
            raise ValueError(
                f"new keys of shape {tuple(k.shape)} do not match the "
                f"cached (B, H_kv, T, Dh) = {tuple(cached.shape)}"
            )
        # append: torch.cat copies the old cache into a new tensor
        if self.max_len is None:
            if cached is None:
                self.keys[layer], self.values[layer] = k, v
            else:
                self.keys[layer] = torch.cat([cached, k], dim=2)
                self.values[layer] = torch.cat([self.values[layer], v], dim=2)
        else:  # preallocated: write the new positions in place
            if start + t_new > self.max_len:
                raise ValueError(
                    f"cache overflow: {start} + {t_new} positions > "
                    f"max_len={self.max_len}"
                )
            if cached is None:
                b, h_kv = k.shape[:2]
                self.keys[layer] = k.new_empty(
                    b, h_kv, self.max_len, k.size(3)
                )
                self.values[layer] = v.new_empty(
                    b, h_kv, self.max_len, v.size(3)
                )
            self.keys[layer][:, :, start : start + t_new] = k
            self.values[layer][:, :, start : start + t_new] = v
        self.lengths[layer] = start + t_new
        end = self.lengths[layer]
        return self.keys[layer][:, :, :end], self.values[layer][:, :, :end]

    def update_sliding(
        self, layer: int, k: Tensor, v: Tensor
    ) -> tuple[Tensor, Tensor]:
        """A sliding layer: return the kept and the new positions, then keep
        only the last ``window - 1``."""
        self.lengths[layer] += k.size(2)
        if self.keys[layer] is not None:
            k, v = (
                torch.cat([self.keys[layer], k], dim=2),
                torch.cat([self.values[layer], v], dim=2),
            )
        keep = min(self.windows[layer] - 1, k.size(2))
        self.keys[layer], self.values[layer] = (
            k[:, :, k.size(2) - keep :],
            v[:, :, v.size(2) - keep :],
        )
        # (B, H_kv, kept + T_new, Dh): the keys end at the last query
        return k, v

    def positions(self, layer: int, t_new: int, device=None) -> Tensor:
        """(t_new,) positions of the new tokens of ``layer``: they follow the
        cached ones (a paged cache that packs several sequences gives each
        token its own sequence's position)."""
        return token_positions(t_new, self.lengths[layer], device=device)

    def mask(
        self,
        layer: int,
        t_q: int,
        t_k: int,
        device=None,
        *,
        window: int | None = None,
    ) -> Tensor | None:
        """The attention mask of the new queries over the keys :meth:`update`
        returned: None, meaning the bottom-right causal mask (one sequence per
        batch row; a paged cache returns its own), or the bottom-right sliding
        window of a sliding layer (its keys end at the last query, so the
        window is relative)."""
        window = self.windows[layer] if window is None else window
        return (
            None
            if window is None
            else sliding_window_mask(t_q, t_k, window, device=device)
        )

    def crop(self, length: int) -> None:
        """Forget every position from ``length`` on, in every layer
        (speculative decoding's rejected drafts)."""
        check_int(length, "length", minimum=0)
        if length > min(self.lengths):
            raise ValueError(
                f"cannot crop to length={length}: the cache holds "
                f"{min(self.lengths)} positions"
            )
        if any(
            w is not None
            and self.keys[i] is not None
            and length < self.lengths[i] - self.keys[i].size(2)
            for i, w in enumerate(self.windows)
        ):
            raise ValueError(
                f"cannot crop to length={length}: a sliding layer has "
                "already dropped those positions"
            )
        if self.states and length < min(self.lengths):
            raise ValueError(
                "cannot crop a recurrent layer's state: it holds no "
                "positions to drop"
            )
        # a sliding layer's tensor ends at position lengths[i] - 1
        for kind in (self.keys, self.values):
            kind[:] = [
                t
                if t is None or (w is None and self.max_len)
                else t[:, :, : t.size(2) - (n - length)]
                for t, w, n in zip(
                    kind, self.windows, self.lengths, strict=True
                )
            ]
        self.lengths = [length] * self.num_layers

    def nbytes(self) -> int:
        """Bytes of memory held by the cache's tensors (preallocated buffers
        count in full)."""
        return sum(
            t.numel() * t.element_size()
            for t in self.keys + self.values
            if t is not None
        )

    def reset(self) -> None:
        """Forget everything (the next update starts at position 0)."""
        self.keys = [None] * self.num_layers
        self.values = [None] * self.num_layers
        self.lengths = [0] * self.num_layers
        self.states = {}


class CausalSelfAttention(nn.Module):
    """Causal multi-head self-attention that can read and extend a
    :class:`KVCache`; MHA, GQA or MQA.

    Args:
        d_model: D.
        num_heads: H query heads, Dh = D // H.
        num_kv_heads: H_kv key/value heads; must divide H. None or H: ordinary
            multi-head attention;
            1: multi-query attention; in between: grouped-query attention.
        fused_qkv: one Linear D -> (H + 2 H_kv) Dh (attribute ``qkv``) instead
            of three (``w_q``, ``w_k``, ``w_v``).
        bias: whether the projections have biases.
        rope: rotate queries and keys by their absolute positions
            (:func:`apply_rope`, interleaved pairs); with a cache, the new
            tokens' positions start at the cache's length, never at 0.
        rope_base: the ``base`` of :func:`apply_rope`.
        alibi: add ALiBi's bias, -slope_h * distance
            (:func:`~attention_course.positions.alibi_bias`), to the scores of
            head h (chapter 10), as a score mod of the backend. Not with
            ``rope``.
        causal: each position sees itself and the past; False: every position
            sees all (an encoder; no cache).
        dropout: probability of dropping attention weights, in ``.train()``
            mode only.
        backend: the name of :func:`~attention_course.functional.attend`'s
            backend: "sdpa" (PyTorch's fused kernels), "eager" (the course's,
            which forms the (B, H, Tq, Tk) weights), "blockwise", "flex", ...;
            whenever the weights are asked for, "eager" (the only backend that
            forms them).
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        num_kv_heads: int | None = None,
        fused_qkv: bool = True,
        bias: bool = True,
        rope: bool = False,
        rope_base: float = 10000.0,
        causal: bool = True,
        dropout: float = 0.0,
        backend: str = "sdpa",
        alibi: bool = False,
    ):
        super().__init__()
        check_heads(d_model, num_heads)
        check_base(rope_base)
        check_dropout(dropout)
        check_backend(backend)
        if rope and (d_model // num_heads) % 2:
            raise ValueError(
                "rope needs an even head dimension, got "
                f"{d_model // num_heads}"
            )
        if rope and alibi:
            raise ValueError(
                "choose one relative position method: rope=True or "
                "alibi=True, not both"
            )
        self.rope, self.rope_base, self.alibi = rope, rope_base, alibi
        self.causal, self.dropout, self.backend = causal, dropout, backend
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        check_int(num_kv_heads, "num_kv_heads")
        if num_heads % num_kv_heads:
            raise ValueError(
                f"num_kv_heads={num_kv_heads} must be >= 1 and divide "
                f"num_heads={num_heads}"
            )
        self.d_model, self.num_heads, self.num_kv_heads = (
            d_model,
            num_heads,
            num_kv_heads,
        )
        self.head_dim = d_model // num_heads
        self.kv_dim = num_kv_heads * self.head_dim
        self.fused_qkv = fused_qkv
        if fused_qkv:
            self.qkv = nn.Linear(d_model, d_model + 2 * self.kv_dim, bias=bias)
        else:
            self.w_q = nn.Linear(d_model, d_model, bias=bias)
            self.w_k = nn.Linear(d_model, self.kv_dim, bias=bias)
            self.w_v = nn.Linear(d_model, self.kv_dim, bias=bias)
        self.w_o = nn.Linear(d_model, d_model, bias=bias)

    def project(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """x (B, T, D) -> q (B, H, T, Dh), k and v (B, H_kv, T, Dh)."""
        if self.fused_qkv:
            q, k, v = self.qkv(x).split(
                [self.d_model, self.kv_dim, self.kv_dim], dim=-1
            )
        else:
            q, k, v = self.w_q(x), self.w_k(x), self.w_v(x)
        # (B, T, heads * Dh) -> (B, heads, T, Dh), as split_heads (x is checked
        # already)
        b, t, _ = x.shape
        return tuple(
            y.view(b, t, -1, self.head_dim).transpose(1, 2) for y in (q, k, v)
        )

    def forward(
        self,
        x: Tensor,
        cache: Cache | None = None,
        layer: int = 0,
        *,
        head_mask: Tensor | None = None,
        weights: list | None = None,
        rotary: RotaryTable | None = None,
    ) -> Tensor:
        """Attend from the positions in x (B, Tq, D) to themselves and to
        everything already in ``cache``.

        With a cache, x holds only the *new* positions (the last Tq of the
        sequence); their keys/values are added to ``cache`` (slot ``layer``).
        ``head_mask`` (H,) scales each head's output before ``w_o`` (0 switches
        a head off); if ``weights`` is a list, the attention weights (B, H, Tq,
        Tk) are appended to it. ``rotary``: the RoPE table of the new
        positions, computed once per forward by the model (:meth:`rotary`);
        without it the layer computes its own. Returns (B, Tq, D).
        """
        self.check_inputs(x, cache, head_mask)
        q, k, v = self.project(x)  # (B, H, Tq, Dh), (B, H_kv, Tq, Dh) x 2
        # the new tokens follow the cached ones: the cache knows their
        # positions
        if self.rope:
            if rotary is None:
                positions = (
                    token_positions(x.size(1), device=x.device)
                    if cache is None
                    else cache.positions(layer, x.size(1), x.device)
                )  # (Tq,)
                rotary = self.rotary(positions, x.dtype)
            # cached keys are stored already rotated
            q, k = rotate(q, rotary), rotate(k, rotary)
        if cache is not None:
            # (B, H_kv, Tk, Dh), Tk = cached + Tq
            k, v = cache.update(layer, k, v)
        # None: causal
        mask = (
            None
            if cache is None
            else cache.mask(layer, q.size(2), k.size(2), x.device)
        )
        heads = self.attend(q, k, v, weights, mask)  # (B, H, Tq, Dh)
        if head_mask is not None:
            # (H, 1, 1) broadcasts over (B, H, Tq, Dh)
            heads = heads * head_mask[:, None, None]
        return self.w_o(merge_heads(heads))

    def rotary(
        self, positions: Tensor, dtype: torch.dtype
    ) -> RotaryTable | None:
        """The RoPE table (cos, sin) of integer positions (T,), None without
        ``rope``: what a model computes once per forward and hands to every
        layer."""
        if not self.rope:
            return None
        return rope_table(
            positions,
            inverse_frequencies(self.head_dim, self.rope_base),
            dtype,
        )

    def cache_shape(self) -> tuple[int, int, int]:
        """(H_kv, key size, value size) of what one position of this layer puts
        in a cache."""
        return self.num_kv_heads, self.head_dim, self.head_dim

    def attend(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        weights: list | None = None,
        mask: Tensor | None = None,
    ) -> Tensor:
        """(B, H, Tq, Dh) queries, (B, H_kv, Tk, Dh) keys and values -> (B, H,
        Tq, Dh), through the module's backend of
        :func:`~attention_course.functional.attend` (inputs checked at the
        module's edge already; "sdpa" reads the shared key/value heads in
        place, the others repeat them, as :func:`repeat_kv`). Causal masks are
        bottom-right: a single new query (Tq = 1) is the last position and may
        see every key. A ``mask`` (a paged cache's, (Tq, Tk), True = may
        attend) replaces the causal one: it already holds causality. ALiBi is a
        score mod, so it runs on every backend."""
        # dropout regularises training only
        dropout_p = self.dropout if self.training else 0.0
        # one new query sees every key: no mask at all
        is_causal = self.causal and mask is None and q.size(2) > 1
        score_mod = (
            alibi_mod(self.num_heads, q.size(2), k.size(2))
            if self.alibi
            else None
        )
        # only the eager backend forms the weights
        backend = self.backend if weights is None else "eager"
        heads, attention = _attend(
            q,
            k,
            v,
            mask,
            is_causal=is_causal,
            score_mod=score_mod,
            dropout_p=dropout_p,
            # attention (B, H, Tq, Tk) on "eager"
            backend=backend,
        )
        if weights is not None:
            weights.append(attention)
        return heads

    def check_inputs(
        self, x: Tensor, cache: Cache | None, head_mask: Tensor | None
    ) -> None:
        """x (B, Tq, D) in the weights' dtype, checked once (it is query, key
        and value); a cache only for causal attention; head_mask (H,)."""
        check_rank(x, "query", 3, "(B, T, D)")
        if not x.is_floating_point():
            raise TypeError(
                f"query must be a floating-point tensor, got {x.dtype}"
            )
        dtype = self.w_o.weight.dtype
        if x.dtype != dtype:
            raise TypeError(
                f"query is {x.dtype}, but the module's weights are {dtype}: "
                "convert one of them "
                f"(e.g. query.to({dtype}) or module.to({x.dtype}))"
            )
        if x.size(-1) != self.d_model:
            raise ValueError(
                f"query has {x.size(-1)} features, but the query projection "
                f"expects {self.d_model}"
            )
        if cache is not None and not self.causal:
            raise ValueError(
                "a KV cache needs causal attention (causal=True): an "
                "earlier position would see a "
                "later one"
            )
        if head_mask is not None and tuple(head_mask.shape) != (
            self.num_heads,
        ):
            raise ValueError(
                "head_mask must have shape (num_heads,) = "
                f"({self.num_heads},), got "
                f"{tuple(head_mask.shape)}"
            )

    @torch.no_grad()
    def as_multi_head(self) -> CausalSelfAttention:
        """An equivalent ordinary multi-head layer (H_kv = H) whose key/value
        weights repeat each group's.

        Shows that GQA/MQA is MHA with key/value heads *tied* within each
        group: same outputs, H / H_kv times the cache.
        """
        mha = CausalSelfAttention(
            self.d_model,
            self.num_heads,
            None,
            fused_qkv=False,
            bias=self.w_o.bias is not None,
            rope=self.rope,
            rope_base=self.rope_base,
            causal=self.causal,
            dropout=self.dropout,
            backend=self.backend,
            alibi=self.alibi,
        ).to(self.w_o.weight)
        n_rep = self.num_heads // self.num_kv_heads
        if self.fused_qkv:
            w_q, w_k, w_v = self.qkv.weight.split(
                [self.d_model, self.kv_dim, self.kv_dim], dim=0
            )
            sizes = [self.d_model, self.kv_dim, self.kv_dim]
            biases = (
                None if self.qkv.bias is None else self.qkv.bias.split(sizes)
            )
        else:
            w_q, w_k, w_v = self.w_q.weight, self.w_k.weight, self.w_v.weight
            biases = (
                None
                if self.w_q.bias is None
                else (self.w_q.bias, self.w_k.bias, self.w_v.bias)
            )

        # (H_kv * Dh, ...) -> (H * Dh, ...): rows of kv head g become rows of
        # query heads g*n..g*n+n-1
        def rep(w):
            return (
                w.reshape(self.num_kv_heads, 1, self.head_dim, *w.shape[1:])
                .expand(self.num_kv_heads, n_rep, self.head_dim, *w.shape[1:])
                .reshape(self.d_model, *w.shape[1:])
            )

        mha.w_q.weight.copy_(w_q)
        mha.w_k.weight.copy_(rep(w_k))
        mha.w_v.weight.copy_(rep(w_v))
        mha.w_o.weight.copy_(self.w_o.weight)
        if biases is not None:
            mha.w_q.bias.copy_(biases[0])
            mha.w_k.bias.copy_(rep(biases[1]))
            mha.w_v.bias.copy_(rep(biases[2]))
            mha.w_o.bias.copy_(self.w_o.bias)
        return mha

    @torch.no_grad()
    def numpy_params(self) -> dict:
        """The weights as a float64 :mod:`~attention_course.numpy_ref` dict
        (``y = x @ W + b``, zero biases if none).

        For GQA/MQA these are the weights of :meth:`as_multi_head`, so
        ``numpy_ref.multi_head_attention(x, x, x, params, H, causal_mask)``
        reproduces the layer (without RoPE, which the NumPy reference does not
        have).
        """
        mha = self.as_multi_head()
        return linear_params(
            {name: getattr(mha, f"w_{name}") for name in "qkvo"}
        )

    @torch.no_grad()
    def load_numpy_params(self, params: dict) -> None:
        """Load a :func:`~attention_course.numpy_ref.init_mha_params` dict;
        multi-head layers only (H_kv = H)."""
        if self.num_kv_heads != self.num_heads:
            raise ValueError(
                "load_numpy_params needs num_kv_heads == num_heads, got "
                f"{self.num_kv_heads} and {self.num_heads}"
            )
        check_params(params, self.d_model, bias=self.w_o.bias is not None)
        tensors = as_tensors(params, like=self.w_o.weight)
        if self.fused_qkv:
            load_fused_qkv(self.qkv, tensors)
        else:
            for name in "qkv":
                load_linear(
                    getattr(self, f"w_{name}"),
                    tensors[f"w_{name}"],
                    tensors[f"b_{name}"],
                )
        load_linear(self.w_o, tensors["w_o"], tensors["b_o"])
