"""The GPT: cached generation, gradients, captured attention weights, head ablation, positions, errors."""

import pytest
import torch
import torch.nn.functional as F

from attention_course.gpt import GPT, GPTConfig
from attention_course.kv_cache import KVCache
from attention_course.masks import causal_mask
from attention_course.positions import apply_rope

POSITIONS = ["learned", "sinusoidal", "rope", "alibi", None]


def make_model(positions="learned", seed=0, **kwargs):
    torch.manual_seed(seed)
    sizes = {"vocab_size": 23, "d_model": 16, "num_heads": 4, "num_layers": 2, "max_len": 32} | kwargs
    model = GPT(GPTConfig(positions=positions, **sizes)).eval()
    with torch.no_grad():  # larger weights than GPT-2's init: the argmax then depends on the whole context
        for p in model.parameters():
            p.mul_(10.0 if p.dim() > 1 else 1.0)
    return model


def ids_for(b, t, vocab=23, seed=1):
    return torch.randint(0, vocab, (b, t), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("positions", POSITIONS)
@pytest.mark.parametrize("attention_only", [False, True])
def test_cached_generation_equals_uncached(positions, attention_only):
    model = make_model(positions, attention_only=attention_only)
    prompt = ids_for(3, 5)
    with_cache = model.generate(prompt, 8, use_cache=True)
    without = model.generate(prompt, 8, use_cache=False)
    assert with_cache.shape == (3, 13)
    assert torch.equal(with_cache[:, :5], prompt)
    assert torch.equal(with_cache, without)
    assert len(set(with_cache[:, 5:].flatten().tolist())) > 1  # not one token repeated: the test can fail


@pytest.mark.parametrize("positions", POSITIONS)
def test_cached_logits_equal_full_forward(positions):
    """Prefill 4 tokens, then 3 one at a time: the logits equal those of one pass over all 7."""
    model = make_model(positions)
    ids = ids_for(2, 7)
    full = model(ids)
    cache = KVCache(model.num_layers)
    parts = [model(ids[:, :4], cache=cache)] + [model(ids[:, t : t + 1], cache=cache) for t in range(4, 7)]
    torch.testing.assert_close(torch.cat(parts, dim=1), full, atol=1e-4, rtol=1e-4)


def test_causal_model_ignores_the_future_and_bidirectional_does_not():
    ids = ids_for(1, 6)
    changed = ids.clone()
    changed[0, 4] = (ids[0, 4] + 1) % 23
    causal = make_model()
    torch.testing.assert_close(causal(changed)[:, :4], causal(ids)[:, :4])
    bidirectional = make_model(causal=False)
    assert not torch.allclose(bidirectional(changed)[:, :4], bidirectional(ids)[:, :4])


@pytest.mark.parametrize("positions", POSITIONS)
def test_gradients_reach_every_parameter(positions):
    model = make_model(positions, dropout=0.1).train()
    ids = ids_for(2, 8)
    logits = model(ids[:, :-1])
    F.cross_entropy(logits.reshape(-1, 23), ids[:, 1:].reshape(-1)).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_head_is_tied_and_parameters_count_once():
    model = make_model(num_layers=1)
    assert model.head.weight is model.tok_emb.weight
    d, v, d_ff, t = 16, 23, 64, 32
    attention = 4 * (d * d + d)
    ff = d * d_ff + d_ff + d_ff * d + d
    norms = 2 * d * 3  # two in the block, one final
    assert model.num_parameters() == v * d + t * d + attention + ff + norms
    assert make_model(positions=None, num_layers=1, attention_only=True).num_parameters() == v * d + attention + 4 * d


def test_embedding_std_sets_the_embeddings_only():
    torch.manual_seed(0)
    model = GPT(GPTConfig(64, 32, 4, 2, max_len=128, tie_embeddings=False, embedding_std=1.0))
    assert 0.9 < model.tok_emb.weight.std().item() < 1.1
    assert 0.9 < model.pos_emb.table.weight.std().item() < 1.1
    assert 0.015 < model.head.weight.std().item() < 0.025  # the head keeps GPT-2's 0.02
    tied = GPT(GPTConfig(64, 32, 4, 2, max_len=128, embedding_std=1.0))
    assert 0.9 < tied.tok_emb.weight.std().item() < 1.1
    with pytest.raises(ValueError, match="embedding_std"):
        GPTConfig(64, 32, 4, 2, embedding_std=0.0)


def test_untied_head_has_its_own_matrix():
    model = make_model(num_layers=1, tie_embeddings=False)
    assert model.head.weight is not model.tok_emb.weight
    tied = make_model(num_layers=1)
    assert model.num_parameters() == tied.num_parameters() + model.head.weight.numel()


@pytest.mark.parametrize("positions", ["learned", "rope"])
def test_captured_weights_equal_a_recomputation(positions):
    """The returned weights are softmax(q k^T / sqrt(Dh)) with the causal mask, recomputed in float64 from each
    block's input, and are the weights the output was computed with."""
    model = make_model(positions, num_layers=3)
    ids = ids_for(2, 9)
    logits, weights = model(ids, return_weights=True)
    torch.testing.assert_close(logits, model(ids))
    assert len(weights) == 3 and all(w.shape == (2, 4, 9, 9) for w in weights)
    x = model.tok_emb(ids) + (model.pos_emb(torch.arange(9)) if positions == "learned" else 0)
    for block, captured in zip(model.blocks, weights, strict=True):
        h = block.norm1(x).double()
        attn = block.attn
        q = (h @ attn.w_q.weight.double().T + attn.w_q.bias.double()).view(2, 9, 4, 4).transpose(1, 2)
        k = (h @ attn.w_k.weight.double().T + attn.w_k.bias.double()).view(2, 9, 4, 4).transpose(1, 2)
        if positions == "rope":
            q, k = apply_rope(q, torch.arange(9)), apply_rope(k, torch.arange(9))
        scores = (q @ k.transpose(-1, -2) / 2.0).masked_fill(~causal_mask(9), float("-inf"))
        torch.testing.assert_close(captured.double(), scores.softmax(-1), atol=1e-5, rtol=1e-4)
        x = block(x)


def test_ablating_every_head_leaves_only_the_output_bias():
    """With head_mask 0 for all heads of layer 1, that layer's attention branch adds exactly w_o's bias."""
    model = make_model(num_layers=2)
    with torch.no_grad():
        for block in model.blocks:
            block.attn.w_o.bias.normal_()
    x = torch.randn(2, 5, 16)
    block = model.blocks[1]
    out = block.attn(block.norm1(x), head_mask=torch.zeros(4))
    torch.testing.assert_close(out, block.attn.w_o.bias.expand(2, 5, 16))
    ids = ids_for(2, 5)
    head_mask = torch.ones(2, 4)
    head_mask[1] = 0
    ablated = model(ids, head_mask=head_mask)
    block.attn.w_o.weight.data.zero_()  # the same model with layer 1's heads removed by hand
    torch.testing.assert_close(ablated, model(ids))


def test_head_mask_scales_single_heads():
    """Ablating one head changes the output; a bool mask of all True or a float mask of ones changes nothing."""
    model = make_model()
    ids = ids_for(2, 6)
    base = model(ids)
    torch.testing.assert_close(model(ids, head_mask=torch.ones(2, 4, dtype=torch.bool)), base)
    one_off = torch.ones(2, 4)
    one_off[0, 2] = 0
    assert not torch.allclose(model(ids, head_mask=one_off), base)


def test_dropout_only_in_training():
    model = make_model(dropout=0.3)
    ids = ids_for(2, 6)
    torch.testing.assert_close(model(ids), model(ids), atol=0, rtol=0)
    model.train()
    assert not torch.allclose(model(ids), model(ids))


def test_too_long_for_the_position_table():
    model = make_model("learned", max_len=8)
    model(ids_for(1, 8))
    with pytest.raises(ValueError, match="longer than max_len=8"):
        model(ids_for(1, 9))
    with pytest.raises(ValueError, match="longer than max_len=8"):
        model.generate(ids_for(1, 6), 5)


@pytest.mark.parametrize("positions", ["rope", None])
def test_no_table_no_length_limit(positions):
    model = make_model(positions, max_len=8)
    assert model.generate(ids_for(1, 6), 5).shape == (1, 11)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"d_model": 10, "num_heads": 4}, ValueError, "d_model=10 is not divisible by num_heads=4"),
        ({"d_ff": 0}, ValueError, "d_ff must be >= 1"),
        ({"num_layers": 0}, ValueError, "num_layers must be >= 1"),
        ({"vocab_size": 2.0}, TypeError, "vocab_size must be an int"),
        ({"positions": "t5"}, ValueError, "positions must be one of"),
        ({"positions": "rope", "d_model": 12, "num_heads": 4}, ValueError, "even head size"),
        ({"dropout": -0.1}, ValueError, r"dropout must be in \[0, 1\)"),
        ({"init": "xavier"}, ValueError, "init must be one of"),
    ],
)
def test_bad_sizes(kwargs, error, match):
    sizes = {"vocab_size": 23, "d_model": 16, "num_heads": 4, "num_layers": 2} | kwargs
    with pytest.raises(error, match=match):
        GPTConfig(**sizes)


def test_bad_inputs():
    model = make_model()
    with pytest.raises(TypeError, match="ids must be an integer tensor"):
        model(torch.zeros(1, 3))
    with pytest.raises(ValueError, match="ids must be 2-D"):
        model(torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="vocab_size=23"):
        model(torch.tensor([[1, 23]]))
    with pytest.raises(ValueError, match="head_mask must have shape"):
        model(ids_for(1, 3), head_mask=torch.ones(4))
    with pytest.raises(ValueError, match="max_new_tokens must be >= 0"):
        model.generate(ids_for(1, 3), -1)
    with pytest.raises(TypeError, match="max_new_tokens must be an int, got float"):
        model.generate(ids_for(1, 3), 2.0)
    with pytest.raises(ValueError, match=r"ids must be 2-D \(B, T\)"):
        model.generate(ids_for(1, 3)[0], 2)
    with pytest.raises(ValueError, match="at least one token"):
        model.generate(ids_for(1, 3)[:, :0], 2)
    with pytest.raises(TypeError, match="cache must be a KVCache"):
        model(ids_for(1, 3), cache={})
    with pytest.raises(TypeError, match="config must be a GPTConfig"):
        GPT({"vocab_size": 23})
    bidirectional = make_model(causal=False)
    with pytest.raises(ValueError, match="causal"):
        bidirectional.generate(ids_for(1, 3), 2)
    with pytest.raises(ValueError, match="causal"):
        bidirectional(ids_for(1, 3), cache=KVCache(2))


# ---------------------------------------------------------------- chapter 8's model: PyTorch's init, GQA, SDPA

SMALL = dict(vocab_size=97, d_model=32, num_heads=4, num_layers=2, max_len=64, tie_embeddings=False,
             init="pytorch", bias=False, backend="sdpa")


def decoder(seed=0, **kwargs):
    return GPT(GPTConfig(**SMALL | kwargs), seed=seed).eval()


@pytest.mark.parametrize("config", [{}, {"num_kv_heads": 1}, {"num_kv_heads": 2},
                                    {"positions": "rope", "num_kv_heads": 2}])
def test_generation_identical_with_and_without_cache(config):
    model = decoder(**config)
    prompt = ids_for(2, 5, vocab=97)
    ids_cached, logits_cached = model.generate(prompt, 20, use_cache=True, return_logits=True)
    ids_plain, logits_plain = model.generate(prompt, 20, use_cache=False, return_logits=True)
    assert ids_cached.shape == (2, 25) and logits_cached.shape == (2, 20, 97)
    assert torch.equal(ids_cached, ids_plain)
    torch.testing.assert_close(logits_cached, logits_plain, rtol=0, atol=1e-5)
    assert torch.equal(ids_cached[:, :5], prompt)
    assert len(set(ids_cached[0, 5:].tolist())) > 3  # random weights, but not a constant stream
    assert model.blocks[0].attn.w_k.out_features == 32 // 4 * (config.get("num_kv_heads") or 4)


def test_generated_token_is_argmax_of_full_forward_and_steps_are_yielded():
    model = decoder()
    prompt = ids_for(2, 5, vocab=97)
    ids = model.generate(prompt, 3)
    with torch.no_grad():
        logits = model(ids[:, :-1])  # (B, T, V)
    assert logits.shape == (2, 7, 97)
    assert torch.equal(logits[:, -1].argmax(-1), ids[:, -1])
    steps = list(model.iter_generate(prompt, 3))
    assert all(n.shape == (2, 1) and lg.shape == (2, 97) for n, lg in steps)
    assert torch.equal(torch.cat([n for n, _ in steps], 1), ids[:, 5:])


def test_zero_new_tokens():
    model = decoder()
    prompt = ids_for(2, 5, vocab=97)
    ids, logits = model.generate(prompt, 0, return_logits=True)
    assert torch.equal(ids, prompt) and logits.shape == (2, 0, 97)


def test_weights_are_seeded_and_global_rng_untouched():
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    a, b, c = decoder(seed=0), decoder(seed=0), decoder(seed=1)
    assert torch.equal(torch.rand(1), before)
    assert torch.equal(a.head.weight, b.head.weight) and not torch.equal(a.head.weight, c.head.weight)
    assert a.head.weight is not a.tok_emb.weight


def test_pytorch_init_keeps_each_layers_default():
    """init="pytorch": embeddings normal(0, 1) (nn.Embedding's default), not GPT-2's 0.02."""
    model = decoder(d_model=64)
    assert 0.9 < model.tok_emb.weight.std().item() < 1.1
    assert model.blocks[0].attn.w_q.bias is None and model.blocks[0].mlp.linear1.bias is not None


def test_sdpa_path_equals_the_explicit_one():
    """The backend changes the kernel, not the function: the same weights give the same logits either way."""
    fast = decoder(num_kv_heads=2, positions="rope")
    slow = GPT(GPTConfig(**SMALL | {"num_kv_heads": 2, "positions": "rope", "backend": "eager"}))
    slow.load_state_dict(fast.state_dict())
    ids = ids_for(2, 9, vocab=97)
    torch.testing.assert_close(fast(ids), slow.eval()(ids), atol=1e-5, rtol=1e-5)
    _, weights = fast(ids, return_weights=True)  # asking for weights takes the explicit path
    assert weights[0].shape == (2, 4, 9, 9)
