"""The lightning indexer (DeepSeek V3.2): a cheap score of every key for every
query, used only to choose keys.

A few small heads (64 of 128 features in DeepSeek V3.2, against MLA's 128 heads
of 192) look at one shared key per token (like multi-query attention), each
head's dot product goes through a ReLU, and a weight per head and per query (a
projection of the token) mixes the heads:

    I[i, j] = sum_h w[i, h] * relu(q[i, h] . k[j] / sqrt(Dh))

The indexer keeps its own cache of one key (Dh numbers) per token. DeepSeek
runs it in FP8 (8-bit floats with one scale per block of 128 values) after a
Hadamard rotation of q and k (orthogonal: it keeps every dot product and
spreads outliers so that FP8 loses less); Hugging Face skips both and scores in
float32, and so does the course.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from ..interop.hf import copy_linear
from ..positions import RotaryTable, rotate
from ..validation import check_int


def index_scores(
    q: Tensor, k: Tensor, weights: Tensor, scale: float
) -> Tensor:
    """q (B, H, Tq, Dh), one key per token k (B, 1, Tk, Dh), weights (B, H, Tq)
    -> scores (B, Tq, Tk).

    The ReLU acts on each head's score, before the heads are mixed: a head that
    finds a key irrelevant adds 0, it cannot vote against it."""
    per_head = F.relu(q @ k.transpose(-2, -1) * scale)  # (B, H, Tq, Tk)
    return (weights[..., None] * per_head).sum(dim=1)  # (B, Tq, Tk)


class LightningIndexer(nn.Module):
    """The indexer of one layer; mirrors transformers' ``DeepseekV32Indexer``
    and ``GlmMoeDsaIndexer``.

    Args:
        d_model: width D of the tokens (the keys and head weights are
            projections of them).
        q_rank: width of the query latent it reads (MLA's normalised query
            latent, ``q_lora_rank``).
        num_heads, head_dim: its heads H and their width Dh.
        rope_dim: features of q and k that RoPE rotates (the FIRST
            ``rope_dim``, unlike MLA's last).
        pairing: RoPE layout: "halves" (DeepSeek V3.2) or "interleaved"
            (GLM-5).
    """

    def __init__(
        self,
        d_model: int,
        q_rank: int,
        num_heads: int,
        head_dim: int,
        rope_dim: int,
        *,
        pairing: str = "halves",
        norm_eps: float = 1e-6,
    ):
        super().__init__()
        for name, value in (
            ("d_model", d_model),
            ("q_rank", q_rank),
            ("num_heads", num_heads),
            ("head_dim", head_dim),
            ("rope_dim", rope_dim),
        ):
            check_int(value, name)
        if rope_dim > head_dim:
            raise ValueError(
                f"rope_dim={rope_dim} is larger than head_dim={head_dim}"
            )
        self.num_heads, self.head_dim, self.rope_dim, self.pairing = (
            num_heads,
            head_dim,
            rope_dim,
            pairing,
        )
        self.scale = head_dim**-0.5
        self.wq = nn.Linear(q_rank, num_heads * head_dim, bias=False)
        self.wk = nn.Linear(d_model, head_dim, bias=False)
        self.k_norm = nn.LayerNorm(head_dim, eps=norm_eps)
        self.weights_proj = nn.Linear(d_model, num_heads, bias=False)

    def rope(self, x: Tensor, rotary: RotaryTable) -> Tensor:
        """Rotate the first ``rope_dim`` features of x (..., T, Dh)."""
        rot, rest = x.split(
            [self.rope_dim, self.head_dim - self.rope_dim], dim=-1
        )
        return torch.cat([rotate(rot, rotary, self.pairing), rest], dim=-1)

    def queries(self, q_latent: Tensor, rotary: RotaryTable) -> Tensor:
        """q_latent (B, T, q_rank) -> (B, H, T, Dh), rotated."""
        b, t, _ = q_latent.shape
        return self.rope(
            self.wq(q_latent).view(b, t, self.num_heads, -1).transpose(1, 2),
            rotary,
        )

    def keys(self, x: Tensor, rotary: RotaryTable) -> Tensor:
        """x (B, T, D) -> one key per token (B, 1, T, Dh), normalised and
        rotated: what its cache keeps."""
        return self.rope(self.k_norm(self.wk(x))[:, None], rotary)

    def head_weights(self, x: Tensor) -> Tensor:
        """x (B, T, D) -> (B, H, T): how much each head counts for each query,
        scaled by H^-1/2."""
        return self.weights_proj(x).transpose(1, 2) * self.num_heads**-0.5

    def forward(
        self,
        x: Tensor,
        q_latent: Tensor,
        rotary: RotaryTable,
        keys: Tensor | None = None,
    ) -> Tensor:
        """Scores (B, Tq, Tk) of the queries of x (B, Tq, D) over ``keys`` (B,
        1, Tk, Dh), default x's own keys.

        No mask here: which keys a query may see is the mask's business
        (:func:`~.topk.top_k`)."""
        keys = self.keys(x, rotary) if keys is None else keys
        return index_scores(
            self.queries(q_latent, rotary),
            keys,
            self.head_weights(x),
            self.scale,
        )

    @classmethod
    def from_hf(cls, module, pairing: str) -> LightningIndexer:
        """The indexer of transformers' ``DeepseekV32Indexer`` ("halves") or
        ``GlmMoeDsaIndexer`` ("interleaved")."""
        ours = cls(
            module.hidden_size,
            module.q_lora_rank,
            module.n_heads,
            module.head_dim,
            module.qk_rope_head_dim,
            pairing=pairing,
            norm_eps=module.k_norm.eps,
        )
        copy_linear(ours.wq, module.wq_b)
        copy_linear(ours.wk, module.wk)
        ours.k_norm.load_state_dict(module.k_norm.state_dict())
        copy_linear(ours.weights_proj, module.weights_proj)
        return ours.to(module.wk.weight.dtype)
