"""The course's GPT as a Hugging Face ``transformers`` model, so that both engines decode the same weights.

A :class:`~attention_course.gpt.GPT` with rotary positions, biases and the exact GELU is, layer for layer, a
StarCoder2 (``Starcoder2ForCausalLM``: pre-LN attention with biased q/k/v/o projections and grouped-query heads,
then a pre-LN two-layer GELU MLP, LayerNorm at the end). One layout differs: StarCoder2 rotates the feature pairs
(i, i + Dh/2) (``rotate_half``) where the course rotates (2i, 2i + 1) ("interleaved"). Permuting each head's
query and key features from interleaved to halves order changes no dot product q . k, so it turns one rotation
into the other. (HF computes the RoPE angles in float32 even for a float64 model: about 1e-7 relative.)
"""

from __future__ import annotations

import torch


def interleaved_to_halves(head_dim: int) -> torch.Tensor:
    """(Dh,) feature order that puts pair (2i, 2i + 1) at (i, i + Dh/2): [0, 2, 4, ..., 1, 3, 5, ...]."""
    return torch.cat([torch.arange(0, head_dim, 2), torch.arange(1, head_dim, 2)])


def starcoder2_config(config, **extra):
    """The ``Starcoder2Config`` of a course :class:`~attention_course.gpt.GPTConfig`."""
    from transformers import Starcoder2Config

    if config.positions != "rope" or config.attention_only or not config.bias or not config.causal:
        raise ValueError("a StarCoder2 twin needs positions='rope', bias=True, causal=True and feed-forward layers")
    return Starcoder2Config(
        vocab_size=config.vocab_size, hidden_size=config.d_model, intermediate_size=config.d_ff,
        num_hidden_layers=config.num_layers, num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_kv_heads or config.num_heads, hidden_act="gelu",
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, norm_epsilon=1e-5, use_bias=True,
        tie_word_embeddings=False, attention_dropout=0.0, residual_dropout=0.0, embedding_dropout=0.0,
        **{"bos_token_id": None, "eos_token_id": None, **extra},
    )


@torch.no_grad()
def to_hf_starcoder2(model, attn_implementation: str = "eager", **config_extra):
    """A ``Starcoder2ForCausalLM`` computing the same function as ``model`` (its random init overwritten)."""
    from transformers import Starcoder2ForCausalLM

    c = model.config
    hf = Starcoder2ForCausalLM(starcoder2_config(c, **config_extra)).to(model.tok_emb.weight.dtype)
    hf.config._attn_implementation = attn_implementation
    order = interleaved_to_halves(c.d_model // c.num_heads)
    hf.model.embed_tokens.weight.copy_(model.tok_emb.weight)
    hf.lm_head.weight.copy_(model.head.weight)
    pairs = [(hf.model.norm, model.norm)]
    for block, layer in zip(model.blocks, hf.model.layers, strict=True):
        a, sa = block.attn, layer.self_attn
        for theirs, ours in ((sa.q_proj, a.w_q), (sa.k_proj, a.w_k)):  # rotated: features to halves order
            dh = a.head_dim
            theirs.weight.copy_(ours.weight.reshape(-1, dh, c.d_model)[:, order].reshape(-1, c.d_model))
            theirs.bias.copy_(ours.bias.reshape(-1, dh)[:, order].reshape(-1))
        pairs += [(sa.v_proj, a.w_v), (sa.o_proj, a.w_o), (layer.input_layernorm, block.norm1),
                  (layer.post_attention_layernorm, block.norm2), (layer.mlp.c_fc, block.mlp.linear1),
                  (layer.mlp.c_proj, block.mlp.linear2)]
    for theirs, ours in pairs:
        theirs.weight.copy_(ours.weight)
        theirs.bias.copy_(ours.bias)
    return hf.eval()
