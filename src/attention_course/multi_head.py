"""Multi-head attention as a PyTorch module, weight-compatible with
``torch.nn.MultiheadAttention``.

Always batch-first: query (B, Tq, D), key (B, Tk, kdim), value (B, Tk, vdim) ->
(B, Tq, D). Masks are boolean, True = may attend (nn.MultiheadAttention: True =
NOT allowed): (Tq, Tk), (B, Tq, Tk) per example (nn.MultiheadAttention reads
3-D as (B * H, Tq, Tk)), or (B, H, Tq, Tk) per head.
"""

from __future__ import annotations

from torch import Tensor, nn

from .functional import _attend, check_backend
from .heads import _merge_heads, _split_heads
from .params import (
    check_params,
    linear_params,
    load_linears,
    load_torch_mha,
    store_torch_mha,
    # (chapter 3 displays it next to from_torch)
    torch_mha_projections,  # noqa: F401
)
from .positions import apply_rope, check_base, check_pairing, token_positions
from .validation import (
    check_dropout,
    check_heads,
    check_mask_shape,
    check_module_inputs,
    per_example_mask,
)


class MultiHeadAttention(nn.Module):
    """H heads attend in parallel, each over its own Dh = D // H features; an
    output projection mixes them.

    Args:
        d_model: D, the width of queries and of the output.
        num_heads: H; must divide d_model.
        dropout: probability of dropping attention weights, in ``.train()``
            mode only.
        bias: whether the four projections have biases.
        kdim, vdim: feature sizes of key and value inputs (default d_model),
            e.g. for cross-attention.
        backend: the kernel of :func:`~attention_course.functional.attend`
            ("eager": every step written out;
            "sdpa": PyTorch's fused kernel; "blockwise", "flex"); weights, when
                requested, come from "eager".
        rope: rotate queries and keys of every head by their positions
            (:func:`apply_rope`); keys are at positions 0..Tk-1 and queries are
            the last Tq of them (bottom-right, as the causal mask).
        rope_base, rope_pairing: passed to :func:`apply_rope` as ``base`` and
            ``pairing``.

    Layers: ``w_q`` (D -> D), ``w_k`` (kdim -> D), ``w_v`` (vdim -> D), ``w_o``
        (D -> D).
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        dropout: float = 0.0,
        bias: bool = True,
        kdim: int | None = None,
        vdim: int | None = None,
        backend: str = "eager",
        rope: bool = False,
        rope_base: float = 10000.0,
        rope_pairing: str = "interleaved",
    ):
        super().__init__()
        check_heads(d_model, num_heads)
        check_dropout(dropout)
        check_base(rope_base)
        check_pairing(rope_pairing)
        check_backend(backend)
        if rope and (d_model // num_heads) % 2:
            raise ValueError(
                "rope needs an even head dimension, got "
                f"{d_model // num_heads}"
            )
        self.rope, self.rope_base, self.rope_pairing = (
            rope,
            rope_base,
            rope_pairing,
        )
        self.d_model, self.num_heads, self.head_dim = (
            d_model,
            num_heads,
            d_model // num_heads,
        )
        self.kdim = d_model if kdim is None else kdim
        self.vdim = d_model if vdim is None else vdim
        self.dropout = dropout
        self.backend = backend
        self.w_q = nn.Linear(d_model, d_model, bias=bias)
        self.w_k = nn.Linear(self.kdim, d_model, bias=bias)
        self.w_v = nn.Linear(self.vdim, d_model, bias=bias)
        self.w_o = nn.Linear(d_model, d_model, bias=bias)

    def forward(
        self,
        query: Tensor,
        key: Tensor | None = None,
        value: Tensor | None = None,
        mask: Tensor | None = None,
        is_causal: bool = False,
        return_weights: bool = False,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """query (B, Tq, D), key (B, Tk, kdim), value (B, Tk, vdim) -> out (B,
        Tq, D) [, weights (B, H, Tq, Tk)].

        key defaults to query (self-attention) and value to key. ``mask``, True
        = may attend: (Tq, Tk) for all, (B, Tq, Tk) per example, (B, H, Tq, Tk)
        per head; ``is_causal=True`` also hides future keys (bottom-right
        aligned when Tq != Tk).
        """
        key = query if key is None else key
        value = key if value is None else value
        # Validate once, here at the edge; the steps below trust what they are
        # given (the private twins).
        check_module_inputs(
            query,
            key,
            value,
            (self.d_model, self.kdim, self.vdim),
            self.w_q.weight.dtype,
        )
        # 3-D (B, Tq, Tk) -> (B, 1, Tq, Tk)
        mask = per_example_mask(mask, query.size(0), self.num_heads)
        if mask is not None:
            scores = (
                query.size(0),
                self.num_heads,
                query.size(1),
                key.size(1),
            )
            check_mask_shape(mask, scores, query.device)  # (B, H, Tq, Tk)
        q = _split_heads(self.w_q(query), self.num_heads)  # (B, H, Tq, Dh)
        k = _split_heads(self.w_k(key), self.num_heads)  # (B, H, Tk, Dh)
        v = _split_heads(self.w_v(value), self.num_heads)  # (B, H, Tk, Dh)
        if self.rope:
            q, k = self.rotate(q, k)
        # (B, H, Tq, Dh), (B, H, Tq, Tk)
        heads, weights = self.attend(q, k, v, mask, is_causal, return_weights)
        out = self.w_o(_merge_heads(heads))  # (B, Tq, D)
        return (out, weights) if return_weights else out

    def rotate(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        """RoPE on (B, H, Tq, Dh) queries and (B, H, Tk, Dh) keys; values are
        never rotated."""
        t_q, t_k = q.size(-2), k.size(-2)
        key_positions = token_positions(t_k, device=k.device)
        # the last Tq positions
        query_positions = token_positions(
            t_q, start=t_k - t_q, device=q.device
        )
        options = {"base": self.rope_base, "pairing": self.rope_pairing}
        return apply_rope(q, query_positions, **options), apply_rope(
            k, key_positions, **options
        )

    def attend(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Tensor | None,
        is_causal: bool,
        return_weights: bool,
    ) -> tuple[Tensor, Tensor | None]:
        """All heads at once: (B, H, Tq, Dh) queries -> (B, H, Tq, Dh) outputs
        and (B, H, Tq, Tk) weights.

        The weights are None unless the backend is "eager" (the fused kernels
        never form them).
        """
        # dropout regularises training only
        dropout_p = self.dropout if self.training else 0.0
        backend = "eager" if return_weights else self.backend
        return _attend(
            q,
            k,
            v,
            mask,
            is_causal=is_causal,
            dropout_p=dropout_p,
            backend=backend,
        )

    def projections(self) -> dict[str, nn.Linear]:
        """The four projections by name: q, k, v and o (output)."""
        return {"q": self.w_q, "k": self.w_k, "v": self.w_v, "o": self.w_o}

    @classmethod
    def from_torch(cls, m: nn.MultiheadAttention) -> MultiHeadAttention:
        """A MultiHeadAttention with the weights (copied), sizes and dropout of
        an ``nn.MultiheadAttention``.

        Works for both of its weight layouts (one packed ``in_proj_weight``, or
        separate q/k/v weights when kdim or vdim differ from embed_dim), with
        or without biases. Our module is batch-first whatever ``m.batch_first``
        is; with sequence-first inputs, transpose them to (B, T, D).
        """
        has_bias = m.in_proj_bias is not None
        ours = cls(
            m.embed_dim,
            m.num_heads,
            dropout=m.dropout,
            bias=has_bias,
            kdim=m.kdim,
            vdim=m.vdim,
        )
        ours = ours.to(m.out_proj.weight)  # same dtype and device
        # see torch_mha_projections: where m keeps each projection
        load_torch_mha(ours.projections(), m)
        return ours

    def to_torch(self, batch_first: bool = True) -> nn.MultiheadAttention:
        """An ``nn.MultiheadAttention`` computing the same function, with
        copies of these weights.

        Remember its masks use the opposite convention: pass
        ``attn_mask=~mask`` (True = NOT allowed).
        """
        if self.rope:
            raise ValueError(
                "nn.MultiheadAttention has no rotary embeddings: to_torch "
                "needs rope=False"
            )
        m = nn.MultiheadAttention(
            self.d_model,
            self.num_heads,
            dropout=self.dropout,
            bias=self.w_q.bias is not None,
            kdim=self.kdim,
            vdim=self.vdim,
            batch_first=batch_first,
        ).to(self.w_q.weight)
        store_torch_mha(self.projections(), m)
        return m

    def load_numpy_params(self, params: dict) -> None:
        """Load a ``y = x @ W + b`` dict (see numpy_ref.init_mha_params): W
        (d_in, d_out) is Linear's weight.T."""
        check_params(
            params,
            self.d_model,
            self.kdim,
            self.vdim,
            bias=self.w_q.bias is not None,
        )
        load_linears(self.projections(), params)

    def numpy_params(self) -> dict:
        """The weights as a float64 ``y = x @ W + b`` dict, W (d_in, d_out);
        zero biases if bias=False."""
        return linear_params(self.projections())
