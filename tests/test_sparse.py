"""Chapter 19: the lightning indexer, top-k as a mask function and sparse MLA equal to transformers'
DeepseekV32Attention and GlmMoeDsaAttention (one shot and cached decode), to attention-gym's indexer, and served."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from attention_course import masks, sparse, tiles
from attention_course.gpt import GPT, GPTConfig
from attention_course.interop.hf_models import build_hf_attention, hf_decode, hf_forward, relative_error
from attention_course.kv_cache import KVCache

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("transformers")

CLASSES = {"deepseek_v32": sparse.DeepseekV32Attention, "glm_moe_dsa": sparse.GlmMoeDsaAttention}
TOLERANCE = 1e-6  # float64 layers; HF's RoPE angles, softmax and indexer scores are float32 (see interop/hf_models.py)


def config(top_k: int, index_heads: int = 16, **sizes) -> dict:
    return dict(hidden_size=16, num_attention_heads=2, num_key_value_heads=2, q_lora_rank=8, kv_lora_rank=6,
                qk_rope_head_dim=4, qk_nope_head_dim=4, v_head_dim=4, index_topk=top_k, index_head_dim=8,
                index_n_heads=index_heads, max_position_embeddings=128) | sizes


def pair(family: str, top_k: int, seed: int = 0, **sizes):
    hf = build_hf_attention(family, dtype=torch.float64, seed=seed, **config(top_k, **sizes))
    return hf, CLASSES[family].from_hf(hf)


def inputs(seed: int, b: int, t: int, d: int = 16) -> torch.Tensor:
    return torch.randn(b, t, d, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


def decode(layer, x: torch.Tensor, prefill: int) -> torch.Tensor:
    """The first ``prefill`` tokens at once, then one at a time through a KVCache."""
    cache, t = KVCache(1), x.size(1)
    steps = [(0, prefill), *((p, p + 1) for p in range(prefill, t))]
    with torch.no_grad():
        return torch.cat([layer(x[:, start:end], cache=cache) for start, end in steps], dim=1)


# ------------------------------------------------------------------ equal to Hugging Face


@pytest.mark.parametrize("family", sorted(CLASSES))
@pytest.mark.parametrize("top_k", [1, 3, 6, 40])  # 40: more than the context
def test_sparse_mla_equals_transformers(family, top_k):
    hf, ours = pair(family, top_k, seed=top_k)
    for offset, (b, t) in zip((0, 9, 30), ((1, 11), (2, 7), (2, 13)), strict=True):
        x, positions = inputs(offset, b, t), torch.arange(t) + offset
        with torch.no_grad():
            assert relative_error(ours(x, positions), hf_forward(hf, x, positions)) < TOLERANCE, (offset, b, t)


@pytest.mark.parametrize("family", sorted(CLASSES))
@pytest.mark.parametrize("top_k", [2, 5, 40])
def test_cached_decode_equals_transformers_decode(family, top_k):
    """Tq != Tk: a prefill of 6, then single queries over 7, 8, ... keys, ours through the course's cache."""
    hf, ours = pair(family, top_k, seed=10 + top_k)
    x = inputs(top_k, 2, 12)
    reference = hf_decode(hf, x, prefill=6)
    assert relative_error(decode(ours, x, 6), reference) < TOLERANCE
    with torch.no_grad():  # with 16 indexer heads no score ties: one shot equals decoding
        assert relative_error(ours(x), reference) < TOLERANCE


def test_a_sparse_layer_is_mla_when_k_covers_the_context():
    hf, ours = pair("deepseek_v32", top_k=64)
    x = inputs(3, 2, 9)
    dense = ours.__class__.__mro__[1].forward_absorbed(ours, x)  # chapter 14's MLA with the same weights
    with torch.no_grad():
        assert relative_error(ours(x), dense) < 1e-12
        assert relative_error(pair("deepseek_v32", top_k=2)[1](x), dense) > 1e-3  # and a small k changes it


def test_refusals():
    hf, _ = pair("deepseek_v32", 4)
    with pytest.raises(TypeError, match="GlmMoeDsaAttention"):
        sparse.GlmMoeDsaAttention.from_hf(hf)
    shared = build_hf_attention("glm_moe_dsa", layer_idx=1, **config(4, indexer_types=["full", "shared"]))
    with pytest.raises(ValueError, match="shared"):
        sparse.GlmMoeDsaAttention.from_hf(shared)
    with pytest.raises(ValueError, match="k must be"):
        sparse.top_k_selection(torch.zeros(1, 3, 3), 0)
    with pytest.raises(ValueError, match="scores"):
        sparse.top_k_selection(torch.zeros(3, 3), 2)
    with pytest.raises(ValueError, match="rope_dim"):
        sparse.LightningIndexer(16, 8, 2, 4, rope_dim=6)


# ------------------------------------------------------------------ the indexer and the top-k mask


def numpy_index_scores(q, k, w, scale):
    """float64 NumPy: sum_h w[b, h, i] relu(scale q[b, h, i] . k[b, j])."""
    q, k, w = (t.detach().numpy() for t in (q, k, w))
    per_head = np.maximum(np.einsum("bhid,bjd->bhij", q, k[:, 0]) * scale, 0)
    return np.einsum("bhi,bhij->bij", w, per_head)


@pytest.mark.parametrize("heads", [1, 2, 5])
def test_index_scores_against_numpy(heads):
    g = torch.Generator().manual_seed(heads)
    q, k = torch.randn(2, heads, 5, 8, generator=g, dtype=torch.float64), torch.randn(2, 1, 9, 8, generator=g,
                                                                                      dtype=torch.float64)
    w = torch.randn(2, heads, 5, generator=g, dtype=torch.float64)
    ours = sparse.index_scores(q, k, w, 8**-0.5)
    np.testing.assert_allclose(ours.numpy(), numpy_index_scores(q, k, w, 8**-0.5), rtol=1e-12, atol=1e-12)
    relu_after = (w[..., None] * (q @ k.transpose(-2, -1))).sum(1).clamp(min=0) * 8**-0.5
    assert (ours - relu_after).abs().max() > 1e-3 or heads == 1 and (w > 0).all()


@pytest.mark.parametrize("t_q, t_k", [(5, 5), (3, 8), (1, 12)])
@pytest.mark.parametrize("k", [1, 2, 4, 20])
def test_top_k_mask_against_a_sort(t_q, t_k, k):
    scores = torch.randn(2, t_q, t_k, dtype=torch.float64, generator=torch.Generator().manual_seed(k))
    selected = sparse.top_k_selection(scores, k)
    offset = t_k - t_q
    for b in range(2):
        for i in range(t_q):
            visible = np.arange(i + offset + 1)  # bottom-right causal
            best = visible[np.argsort(-scores[b, i, visible].numpy(), kind="stable")[:k]]
            assert set(np.flatnonzero(selected[b, i].numpy())) == set(best.tolist())
    assert (selected.sum(-1) == torch.arange(t_q).add(offset + 1).clamp(max=k)).all()


def test_top_k_is_a_mask_function_of_the_vocabulary():
    scores = torch.randn(2, 8, 8, generator=torch.Generator().manual_seed(0))
    mod = sparse.top_k(scores, 3)
    tensor = masks.materialize(mod, 2, 3, 8, 8)
    assert tensor.shape == (2, 3, 8, 8) and (tensor == sparse.top_k_selection(scores, 3)[:, None]).all()
    window = masks.and_masks(mod, masks.sliding_window(4, 8))  # composes with the other patterns
    assert (masks.materialize(window, 2, 1, 8, 8) == tensor[:, :1] & masks.sliding_window_mask(8, 8, 4)).all()
    states = tiles.tile_states(mod, 8, 8, 4, batch=2)  # tiles follow: the upper-right tile is never computed
    assert states.shape == (2, 1, 2, 2) and (states[..., 0, 1] == tiles.SKIP).all()
    assert (tiles.tile_states(sparse.top_k(scores, 8), 8, 8, 4, batch=2)
            == tiles.tile_states(masks.causal(8), 8, 8, 4, batch=2)).all()  # k >= T: the causal mask


def test_indexer_equals_attention_gym_where_top_k_is_unambiguous():
    indexer_api = pytest.importorskip("attn_gym.sparse.indexer")
    hf, ours = pair("deepseek_v32", top_k=4)
    x, k = inputs(5, 2, 24), 4
    with torch.no_grad():
        rotary = ours.inputs(x, None)
        q = ours.indexer.queries(ours.query_latent(x), rotary)  # (B, H, T, Dh)
        keys = ours.indexer.keys(x, rotary)  # (B, 1, T, Dh)
        w = ours.indexer.weights_proj(x)  # (B, T, H), without our H^-1/2: attention-gym scales by (H Dh)^-1/2
        scores = ours.indexer(x, ours.query_latent(x), rotary)
    theirs = indexer_api.lightning_indexer(q.transpose(1, 2).contiguous(), keys[:, 0].contiguous(), w.contiguous(),
                                           k, causal=True, impl="reference")
    selected = sparse.top_k_selection(scores, k)
    ranked = scores.masked_fill(~masks.causal_mask(24, 24), float("-inf")).sort(-1, descending=True).values
    clear = (ranked[..., k - 1] - ranked[..., k] > 1e-6) & (torch.arange(24) >= k)  # > k candidates, a clear gap
    assert clear.sum() >= 30
    for b, i in clear.nonzero().tolist():
        assert set(theirs[b, i].tolist()) == set(selected[b, i].nonzero().flatten().tolist())


# ------------------------------------------------------------------ the ties trap


def test_few_indexer_heads_tie_and_decoding_then_differs_from_one_shot():
    """ReLU zeros with 2 heads at random initialisation: many scores are exactly 0, top-k breaks the ties by its
    own order, which depends on the row's length; one shot over T keys and a decode step over the same keys pick
    differently. With 16 heads there are no ties and the two agree."""
    gaps = {}
    for heads in (2, 16):
        hf, ours = pair("glm_moe_dsa", top_k=4, index_heads=heads)
        x = inputs(0, 2, 16)
        with torch.no_grad():
            rotary = ours.inputs(x, None)
            scores = ours.indexer(x, ours.query_latent(x), rotary)
            one_shot = ours(x)
        zeros = int((scores.masked_select(masks.causal_mask(16, 16)) == 0).sum())
        gaps[heads] = (zeros, relative_error(decode(ours, x, 8), one_shot))
        # transformers falls into the same trap, by the same amount: torch.topk orders the ties alike
        assert relative_error(hf_decode(hf, x, 8), hf_forward(hf, x)) == pytest.approx(gaps[heads][1], abs=1e-6)
    assert gaps[2][0] > 10 and gaps[2][1] > 1e-2
    assert gaps[16][0] == 0 and gaps[16][1] < 1e-12


# ------------------------------------------------------------------ cache and serving


def sparse_gpt(top_k: int, seed: int = 0) -> GPT:
    gpt_config = GPTConfig(vocab_size=40, d_model=16, num_heads=2, num_layers=2, max_len=64, positions=None)

    def attention(c, layer):
        return sparse.SparseLatentAttention(c.d_model, c.num_heads, q_lora_rank=8, top_k=top_k, index_heads=16,
                                            index_head_dim=8, kv_lora_rank=6, qk_nope_head_dim=4,
                                            qk_rope_head_dim=4, v_head_dim=4)

    return GPT(gpt_config, seed=seed, attention=attention).double().eval()


def test_a_gpt_with_sparse_layers_decodes_through_the_cache():
    model = sparse_gpt(top_k=3)
    ids = torch.randint(0, 40, (2, 5), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(model.generate(ids, 10), model.generate(ids, 10, use_cache=False))
        cache = KVCache(2)
        model(ids, cache=cache)
    c, rest = cache.keys[0], cache.values[0]  # the indexed layer kind: latent, then rotated key + indexer key
    assert c.shape == (2, 1, 5, 6) and rest.shape == (2, 1, 5, 4 + 8)


def test_the_engine_serves_sparse_layers_as_they_decode_alone():
    from attention_course.serving import Engine, Request, greedy_reference

    model = sparse_gpt(top_k=4, seed=1)
    rng = np.random.default_rng(0)
    requests = [Request(i, rng.integers(0, 40, int(rng.integers(2, 9))).tolist(), int(rng.integers(2, 7)))
                for i in range(5)]
    expected = {r.id: greedy_reference(model, r.prompt, r.max_new_tokens, r.eos_token_id) for r in requests}
    engine = Engine(model, num_blocks=40, block_size=4, max_seqs=3, max_batch_tokens=8)
    assert engine.run(requests) == expected
    assert max(len(h.batch) for h in engine.history) > 1
