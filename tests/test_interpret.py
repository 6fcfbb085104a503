"""Interpretability tools of chapter 12: captured weights, head scores against loop references, ablation."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from attention_course.gpt import GPT, GPTConfig
from attention_course.heads import merge_heads, split_heads
from attention_course.interpret import (
    ablation_mask,
    attention_maps,
    copy_accuracy,
    eval_mode,
    head_ablation_table,
    induction_targets,
    prefix_matching_score,
    previous_token_score,
)
from attention_course.tasks import repeated_segment_batch


def random_model(seed=0, **kwargs):
    torch.manual_seed(seed)
    sizes = {"vocab_size": 20, "d_model": 32, "num_heads": 4, "num_layers": 2, "max_len": 16} | kwargs
    return GPT(GPTConfig(attention_only=True, **sizes)).eval()


def random_weights(shape, seed=0):
    """Row-stochastic causal maps (..., T, T), float64."""
    scores = torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    t = shape[-1]
    return scores.masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(), float("-inf")).softmax(-1)


def previous_token_reference(weights):
    w = weights.numpy()
    layers, batch, heads, t, _ = w.shape
    out = np.zeros((layers, heads))
    for layer in range(layers):
        for head in range(heads):
            out[layer, head] = np.mean([w[layer, b, head, q, q - 1] for b in range(batch) for q in range(1, t)])
    return out


def prefix_matching_reference(weights, ids, query_mask=None):
    """Loops: for each query with an earlier occurrence of its token, the weight on the tokens after it."""
    w, ids = weights.numpy(), ids.numpy()
    layers, batch, heads, t, _ = w.shape
    out = np.zeros((layers, heads))
    for layer in range(layers):
        for head in range(heads):
            per_query = []
            for b in range(batch):
                for q in range(t):
                    keys = [j for j in range(1, q) if ids[b, j - 1] == ids[b, q]]
                    if keys and (query_mask is None or query_mask[b, q]):
                        per_query.append(sum(w[layer, b, head, q, j] for j in keys))
            out[layer, head] = np.mean(per_query)
    return out


def test_scores_against_loop_references():
    ids, copy_target = repeated_segment_batch(5, 12, 6, torch.Generator().manual_seed(0), 2, 5)
    weights = random_weights((2, 5, 3, 12, 12))  # (L, B, H, T, T)
    np.testing.assert_allclose(previous_token_score(weights).numpy(), previous_token_reference(weights), atol=1e-12)
    np.testing.assert_allclose(prefix_matching_score(weights, ids).numpy(),
                               prefix_matching_reference(weights, ids), atol=1e-12)
    np.testing.assert_allclose(prefix_matching_score(weights, ids, copy_target).numpy(),
                               prefix_matching_reference(weights, ids, copy_target.numpy()), atol=1e-12)


def test_scores_of_ideal_heads():
    """A head that looks exactly one back scores 1 on previous-token; one that looks at the token after the
    first occurrence of the current token scores 1 on prefix matching, where that token exists."""
    ids = torch.tensor([[5, 1, 2, 3, 1, 2, 3, 4]])  # (1, T): segment [1, 2, 3] then its copy
    t = ids.size(1)
    previous = torch.zeros(1, 1, 1, t, t)
    previous[..., 0, 0] = 1.0
    previous[..., torch.arange(1, t), torch.arange(t - 1)] = 1.0
    assert previous_token_score(previous).item() == 1.0
    targets = induction_targets(ids)[0]  # (T, T)
    assert targets.nonzero().tolist() == [[4, 2], [5, 3], [6, 4]]  # token after the earlier 1, 2, 3
    induction = torch.zeros(1, 1, 1, t, t)
    induction[0, 0, 0] = torch.eye(t)
    induction[0, 0, 0, [4, 5, 6]] = targets[[4, 5, 6]].double().float()
    assert prefix_matching_score(induction, ids).item() == 1.0
    assert prefix_matching_score(previous, ids).item() == 0.0


def test_attention_maps_are_the_weights_the_model_used():
    """Each captured map, multiplied with that layer's values, gives exactly what entered the output
    projection (hooked), and equals torch's scaled_dot_product_attention output for the same q, k, v."""
    model = random_model()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(20.0 if p.dim() > 1 else 1.0)  # sharp, non-uniform maps: a wrong map cannot pass by luck
    ids = torch.randint(0, 20, (3, 11), generator=torch.Generator().manual_seed(1))
    maps = attention_maps(model, ids)
    assert maps.shape == (2, 3, 4, 11, 11)
    assert maps.max() > 0.9  # sharp
    seen = {}
    hooks = [block.attn.w_o.register_forward_hook(lambda m, i, o, layer=layer: seen.update({layer: i[0]}))
             for layer, block in enumerate(model.blocks)]
    block_inputs = {}
    pre_hooks = [block.norm1.register_forward_hook(lambda m, i, o, layer=layer: block_inputs.update({layer: o}))
                 for layer, block in enumerate(model.blocks)]
    with torch.no_grad():
        model(ids)
    for hook in hooks + pre_hooks:
        hook.remove()
    for layer, block in enumerate(model.blocks):
        with torch.no_grad():
            x = block_inputs[layer]  # (B, T, D) the normalised input of the attention
            q, k, v = (split_heads(f(x), 4) for f in (block.attn.w_q, block.attn.w_k, block.attn.w_v))
            torch.testing.assert_close(merge_heads(maps[layer] @ v), seen[layer], atol=1e-5, rtol=1e-5)
            reference = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, T, Dh)
            torch.testing.assert_close(maps[layer] @ v, reference, atol=1e-5, rtol=1e-5)


def test_attention_maps_keep_the_training_mode():
    model = random_model().train()
    attention_maps(model, torch.zeros(1, 4, dtype=torch.long))
    assert model.training


@pytest.mark.parametrize("training", [True, False])
def test_eval_mode_restores_the_mode_even_after_an_error(training):
    model = random_model().train(training)
    with eval_mode(model) as inside:
        assert inside is model and not model.training
    assert model.training == training
    with pytest.raises(RuntimeError, match="inside"), eval_mode(model):
        raise RuntimeError("inside")
    assert model.training == training


def test_ablation_mask_and_errors():
    mask = ablation_mask(2, 4, (1, 2), (0, 0))
    assert mask.tolist() == [[0, 1, 1, 1], [1, 1, 0, 1]]
    with pytest.raises(ValueError, match="layer=2"):
        ablation_mask(2, 4, (2, 0))
    with pytest.raises(ValueError, match="weights"):
        previous_token_score(torch.zeros(2, 3, 4, 5))
    with pytest.raises(ValueError, match="do not match"):
        prefix_matching_score(torch.zeros(1, 2, 1, 5, 5), torch.zeros(3, 5, dtype=torch.long))
    with pytest.raises(ValueError, match="no query"):
        prefix_matching_score(torch.zeros(1, 1, 1, 4, 4), torch.arange(4)[None])
    with pytest.raises(ValueError, match="copy_target"):
        copy_accuracy(random_model(), torch.zeros(1, 4, dtype=torch.long), torch.zeros(1, 3, dtype=torch.bool))


def test_ablation_changes_exactly_the_ablated_head():
    """copy_accuracy with a head mask equals the accuracy of the masked forward pass computed by hand, and
    head_ablation_table holds that number for each single head."""
    model = random_model(vocab_size=12, max_len=20)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(10.0 if p.dim() > 1 else 1.0)
    ids, copy_target = repeated_segment_batch(64, 20, 12, torch.Generator().manual_seed(5))
    table = head_ablation_table(model, ids, copy_target)
    assert table.shape == (2, 4)
    for layer, head in ((0, 1), (1, 3)):
        mask = ablation_mask(2, 4, (layer, head))
        with torch.no_grad():
            predicted = model(ids[:, :-1], head_mask=mask).argmax(-1)
        by_hand = (predicted == ids[:, 1:])[copy_target[:, :-1]].float().mean().item()
        assert table[layer, head].item() == pytest.approx(by_hand)
    whole = copy_accuracy(model, ids, copy_target)
    assert (table != whole).any()  # some ablation changes some prediction: the mask reaches the model


def test_stream_write_ratio_by_hand():
    """Layer 0: |attention output| / |token + position embedding|, per position, averaged; hooks are removed and
    the training mode is kept. Larger embeddings give a smaller ratio, in proportion."""
    from attention_course.interpret import stream_write_ratio

    model = random_model().train()
    ids = torch.randint(0, 20, (3, 9), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        positions = torch.arange(9)
        stream = model.tok_emb(ids) + model.pos_emb(positions)  # (B, T, D)
        block = model.blocks[0]
        model.eval()  # by hand without dropout, as stream_write_ratio measures
        written = block.attn(block.norm1(stream))
        by_hand = (written.norm(dim=-1) / stream.norm(dim=-1)).mean().item()
        second_stream = block(stream)
        block1 = model.blocks[1]
        written1 = block1.attn(block1.norm1(second_stream))
        model.train()
        by_hand1 = (written1.norm(dim=-1) / second_stream.norm(dim=-1)).mean().item()
    assert stream_write_ratio(model, ids) == pytest.approx(by_hand, rel=1e-5)
    assert stream_write_ratio(model, ids, layer=1) == pytest.approx(by_hand1, rel=1e-5)
    assert model.training
    assert not model.blocks[0]._forward_pre_hooks and not model.blocks[0].attn._forward_hooks
    with torch.no_grad():  # LayerNorm makes the written part (almost: its eps) scale-free: 10 x the stream, ~a tenth
        model.tok_emb.weight.mul_(10.0)
        model.pos_emb.table.weight.mul_(10.0)
    assert stream_write_ratio(model, ids) == pytest.approx(by_hand / 10, rel=2e-2)
    with pytest.raises(ValueError, match="layer"):
        stream_write_ratio(model, ids, layer=2)


def reference_forward(model, ids, heads=(), path=None):
    """A 2-layer attention-only GPT by hand, float64, heads through torch's SDPA: logits (B, T, V), with the given
    layer-1 heads removed from one input (path "q", "k" or "v") of layer 2 only."""
    d = {name: p.detach().double() for name, p in model.named_parameters()}
    n_heads, t = model.num_heads, ids.size(1)

    def norm(x, name):
        return F.layer_norm(x, x.shape[-1:], d[f"{name}.weight"], d[f"{name}.bias"])

    def linear(x, name):
        return x @ d[f"{name}.weight"].T + d[f"{name}.bias"]

    def heads_out(layer, inputs):  # inputs: the normed stream read by q, k, v -> (B, H, T, Dh)
        proj = [split_heads(linear(x, f"blocks.{layer}.attn.w_{p}"), n_heads)
                for p, x in zip("qkv", inputs, strict=True)]
        return F.scaled_dot_product_attention(*proj, is_causal=True)

    x0 = d["tok_emb.weight"][ids] + d["pos_emb.table.weight"][:t]  # (B, T, D)
    h0 = norm(x0, "blocks.0.norm1")
    out0 = heads_out(0, (h0, h0, h0))  # (B, H, T, Dh)
    keep = torch.ones(n_heads, dtype=torch.float64)
    keep[[head for _, head in heads]] = 0.0
    x1 = x0 + linear(merge_heads(out0), "blocks.0.attn.w_o")
    x1_ablated = x0 + linear(merge_heads(out0 * keep[:, None, None]), "blocks.0.attn.w_o")
    h1, h1_ablated = norm(x1, "blocks.1.norm1"), norm(x1_ablated, "blocks.1.norm1")
    inputs = tuple(h1_ablated if p == path else h1 for p in "qkv")
    x2 = x1 + linear(merge_heads(heads_out(1, inputs)), "blocks.1.attn.w_o")
    return norm(x2, "norm") @ d["head.weight"].T


@pytest.mark.parametrize("num_heads, heads", [(4, [(0, 1), (0, 2)]), (2, [(0, 0)]), (8, [(0, 3), (0, 5), (0, 7)])])
@pytest.mark.parametrize("path", ["q", "k", "v"])
def test_path_ablated_forward_against_a_hand_written_model(num_heads, heads, path):
    """The logits equal a float64 forward by hand in which only the chosen input of layer 2 reads the stream
    without the ablated heads; the maps are those of that forward; hooks are removed and the mode is kept."""
    from attention_course.interpret import path_ablated_forward

    model = random_model(num_heads=num_heads, tie_embeddings=False, embedding_std=1.0).train()
    with torch.no_grad():
        for name, p in model.named_parameters():  # sharp, loud heads (std 0.02 at init), so that ablating matters
            p.mul_({"w_q": 25.0, "w_k": 25.0, "w_v": 10.0, "w_o": 100.0}.get(name.split(".")[-2], 1.0))
    ids = torch.randint(0, 20, (3, 11), generator=torch.Generator().manual_seed(7))
    logits, maps = path_ablated_forward(model, ids, heads, path)
    expected = reference_forward(model, ids, heads, path)
    torch.testing.assert_close(logits.double(), expected, atol=1e-4, rtol=1e-4)
    assert maps.shape == (2, 3, num_heads, 11, 11)
    whole = reference_forward(model, ids)
    assert (logits.double() - whole).abs().max() > 0.1  # the ablation reaches the model
    assert model.training
    assert not model.blocks[1].attn.w_k._forward_pre_hooks and not model.blocks[1]._forward_pre_hooks
    if path == "v":  # values do not change the weights: the maps are the whole model's
        torch.testing.assert_close(maps, attention_maps(model, ids), atol=1e-6, rtol=1e-6)


def test_path_ablated_forward_errors():
    from attention_course.interpret import path_ablated_forward

    model, ids = random_model(), torch.zeros(1, 5, dtype=torch.long)
    for kwargs, match in (({"heads": [(0, 1)], "path": "o"}, "path"), ({"heads": [(1, 0)]}, "heads"),
                          ({"heads": []}, "heads"), ({"heads": [(0, 1)], "layer": 0}, "layer")):
        with pytest.raises(ValueError, match=match):
            path_ablated_forward(model, ids, **kwargs)


def test_ov_circuit_against_numpy_and_copying_score():
    """ov_circuit equals its definition written out in float64 NumPy (a centring matrix, no biases); a circuit
    whose diagonal wins every row scores 1, a permutation of it 0, a random one about 1 / V."""
    from attention_course.interpret import copying_score, ov_circuit

    model = random_model(num_heads=2, vocab_size=20, tie_embeddings=False, embedding_std=1.0)
    p = {name: v.detach().double().numpy() for name, v in model.named_parameters()}
    d, dh = 32, 16
    emb = p["tok_emb.weight"]  # (V, D)
    normed = (emb - emb.mean(1, keepdims=True)) / np.sqrt(emb.var(1, keepdims=True) + 1e-5)
    normed = normed * p["blocks.1.norm1.weight"] + p["blocks.1.norm1.bias"]
    centring = np.eye(d) - np.ones((d, d)) / d
    ov = (p["head.weight"] @ np.diag(p["norm.weight"]) @ centring @ p["blocks.1.attn.w_o.weight"][:, dh:]
          @ p["blocks.1.attn.w_v.weight"][dh:] @ normed.T).T  # (V, V): row a = token a attended to
    torch.testing.assert_close(ov_circuit(model, 1, 1).double(), torch.from_numpy(ov), atol=1e-5, rtol=1e-4)
    eye = torch.eye(20) + 0.1 * torch.rand(20, 20, generator=torch.Generator().manual_seed(0))
    assert copying_score(eye) == 1.0
    assert copying_score(eye.roll(1, dims=1)) == 0.0
    assert copying_score(torch.randn(500, 500, generator=torch.Generator().manual_seed(0))) < 0.02
    with pytest.raises(ValueError, match="square"):
        copying_score(torch.zeros(3, 4))
    with pytest.raises(ValueError, match="head"):
        ov_circuit(model, 2, 0)


def test_next_token_accuracy_is_copy_accuracy_of_the_same_logits():
    from attention_course.interpret import next_token_accuracy

    model = random_model(vocab_size=12, max_len=20)
    ids, copy_target = repeated_segment_batch(16, 20, 12, torch.Generator().manual_seed(3))
    with torch.no_grad():
        logits = model(ids)  # (B, T, V): the last position is dropped
    assert next_token_accuracy(logits, ids, copy_target) == copy_accuracy(model, ids, copy_target)
    with pytest.raises(ValueError, match="logits"):
        next_token_accuracy(logits[:, :5], ids, copy_target)
