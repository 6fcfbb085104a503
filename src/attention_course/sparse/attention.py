"""Sparse multi-head latent attention (DeepSeek Sparse Attention, V3.2; GLM-5):
chapter 14's MLA in which each query attends only to the top-k keys its
lightning indexer chose.

The layer is MLA in its absorbed form (every head attends over the same
latents, the cache holds only them), with one change: the mask is the causal
mask AND the indexer's top-k (:func:`~.topk.top_k`). A cache layer of this kind
("indexed") is a latent layer whose "values" also carry the indexer's key: C +
R + Dh numbers per token.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..interop.hf import HFTwin, check_hf_module
from ..kv_cache import Cache
from ..masks import materialize
from ..modern.attention import layer_mask
from ..modern.mla import MultiHeadLatentAttention
from ..positions import RotaryTable
from ..validation import check_int
from .indexer import LightningIndexer
from .topk import top_k


class SparseLatentAttention(MultiHeadLatentAttention):
    """MLA whose queries attend to their ``top_k`` best keys; mirrors
    transformers' ``DeepseekV32Attention``.

    Args: those of
    :class:`~attention_course.modern.mla.MultiHeadLatentAttention`
    (``q_lora_rank`` is required:
    the indexer reads the query latent), then ``top_k`` (keys per query) and
    the indexer's ``index_heads``, ``index_head_dim`` and RoPE
    ``index_pairing``.
    """

    hf_twin = HFTwin(
        "deepseek_v32.modeling_deepseek_v32",
        "DeepseekV32Attention",
        "DeepseekV32Config",
        "DeepseekV32RotaryEmbedding",
    )
    # DeepSeek V3.2 rotates the indexer's features in two halves, MLA's in
    # pairs
    index_pairing = "halves"

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        *,
        q_lora_rank: int,
        top_k: int,
        index_heads: int,
        index_head_dim: int,
        **mla,
    ):
        check_int(q_lora_rank, "q_lora_rank")
        check_int(top_k, "top_k")
        super().__init__(d_model, num_heads, q_lora_rank=q_lora_rank, **mla)
        self.top_k = top_k
        self.indexer = LightningIndexer(
            d_model,
            q_lora_rank,
            index_heads,
            index_head_dim,
            self.rope_dim,
            pairing=self.index_pairing,
            norm_eps=self.kv_norm.eps,
        )

    def cache_shape(self) -> tuple[int, int, int]:
        """One "head" of the latent C, then the rotated key R and the indexer's
        key Dh side by side."""
        return 1, self.kv_lora_rank, self.rope_dim + self.indexer.head_dim

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
        """x (B, T, D) -> (B, T, D): absorbed MLA over the top-k keys of each
        query (the cached ones included)."""
        rotary = self.inputs(x, positions, cache, layer, rotary)
        q_nope, q_rope = self.queries(x, rotary)
        c, k_rope = self.latents(x, rotary)  # (B, 1, T, C), (B, 1, T, R)
        index_keys = self.indexer.keys(x, rotary)  # (B, 1, T, Dh)
        # the indexer's keys travel with the latent: (B, 1, Tk, R + Dh)
        if cache is not None:
            c, rest = cache.update(
                layer, c, torch.cat([k_rope, index_keys], dim=-1)
            )
            k_rope, index_keys = rest.split(
                [self.rope_dim, self.indexer.head_dim], dim=-1
            )
        # (B, Tq, Tk)
        scores = self.indexer(x, self.query_latent(x), rotary, index_keys)
        allowed = layer_mask(x.size(1), c.size(2), x.device, cache, layer)
        mask = materialize(
            top_k(scores, self.top_k, allowed),
            x.size(0),
            1,
            x.size(1),
            c.size(2),
            x.device,
        )
        return self.attend_latent(
            q_nope, q_rope, c, k_rope, mask, head_mask, weights
        )

    forward_absorbed = forward  # the sparse layer has one form only

    def query_latent(self, x: Tensor) -> Tensor:
        """(B, T, q_lora_rank): the normalised query latent, which the
        indexer's queries are projected from."""
        return self.q_proj[1](self.q_proj[0](x))

    @classmethod
    def from_hf(cls, module) -> SparseLatentAttention:
        """A course layer with the sizes, options and weights of the
        transformers module ``cls`` mirrors."""
        check_hf_module(cls, module)
        if module.indexer is None:
            raise ValueError(
                f"layer {module.layer_idx} reuses an earlier layer's top-k "
                "(indexer_types 'shared'): "
                "only layers with their own indexer ('full') are mirrored"
            )
        as_mla = type(
            "AsMLA", (MultiHeadLatentAttention,), {"hf_twin": cls.hf_twin}
        )
        # chapter 14's conversion of the MLA weights (same names, same checks)
        mla = as_mla.from_hf(module)
        ours = cls(
            mla.d_model,
            mla.num_heads,
            q_lora_rank=module.q_lora_rank,
            top_k=module.indexer.index_topk,
            index_heads=module.indexer.n_heads,
            index_head_dim=module.indexer.head_dim,
            kv_lora_rank=mla.kv_lora_rank,
            qk_nope_head_dim=mla.nope,
            qk_rope_head_dim=mla.rope_dim,
            v_head_dim=mla.v_dim,
            bias=mla.kv_a_proj.bias is not None,
            inv_freq=mla.inv_freq,
            rope_factor=mla.rope_factor,
            pairing=mla.pairing,
            scale=mla.scale,
            norm_eps=mla.kv_norm.eps,
        )
        ours.load_state_dict(mla.state_dict(), strict=False)
        ours.indexer = LightningIndexer.from_hf(
            module.indexer, cls.index_pairing
        )
        return ours.to(module.o_proj.weight.dtype)


class GlmMoeDsaAttention(SparseLatentAttention):
    """GLM-5's sparse MLA: DeepSeek V3.2's, with the indexer's RoPE
    interleaved; mirrors ``GlmMoeDsaAttention``."""

    hf_twin = HFTwin(
        "glm_moe_dsa.modeling_glm_moe_dsa",
        "GlmMoeDsaAttention",
        "GlmMoeDsaConfig",
        "GlmMoeDsaRotaryEmbedding",
    )
    index_pairing = "interleaved"


# the name of the transformers class it mirrors
DeepseekV32Attention = SparseLatentAttention
