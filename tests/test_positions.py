"""Positions: sinusoidal, learned, RoPE (both pairings, weight conversion, KV cache) and ALiBi.

References are independent float64 NumPy code: RoPE through complex multiplication, the sinusoids
and ALiBi slopes written out from the papers' formulas, attention with a bias through torch's SDPA.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from attention_course import numpy_ref
from attention_course.gpt import GPT, GPTConfig
from attention_course.kv_cache import CausalSelfAttention, KVCache
from attention_course.masks import causal_mask
from attention_course.multi_head import MultiHeadAttention
from attention_course.positions import (
    LearnedPositions,
    SinusoidalPositions,
    alibi_bias,
    alibi_slopes,
    apply_rope,
    attention_with_bias,
    convert_rope_weight,
    rope_angles,
    rope_permutation,
    sinusoidal_positions,
    token_positions,
)


def randn(*shape, seed=0, dtype=torch.float64):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def rope_reference(
    x: np.ndarray, positions: np.ndarray, base: float = 10000.0, pairing="interleaved"
):
    """RoPE as complex multiplication: pair i is a complex z_i, times exp(1j * m * theta_i)."""
    d = x.shape[-1]
    theta = base ** (-np.arange(d // 2) * 2.0 / d)
    rotation = np.exp(1j * np.asarray(positions, dtype=np.float64)[..., None] * theta)
    if pairing == "interleaved":
        z = (x[..., 0::2] + 1j * x[..., 1::2]) * rotation
        out = np.empty_like(x)
        out[..., 0::2], out[..., 1::2] = z.real, z.imag
        return out
    z = (x[..., : d // 2] + 1j * x[..., d // 2 :]) * rotation
    return np.concatenate([z.real, z.imag], axis=-1)


# ---------------------------------------------------------------- without positions


def test_self_attention_without_positions_is_permutation_equivariant():
    torch.manual_seed(0)
    mha = MultiHeadAttention(12, 3).double().eval()
    x = randn(2, 7, 12)
    perm = torch.tensor([3, 0, 6, 1, 5, 2, 4])
    torch.testing.assert_close(mha(x[:, perm]), mha(x)[:, perm], rtol=0, atol=1e-12)


def test_causal_mask_breaks_the_symmetry_only_partly():
    torch.manual_seed(0)
    mha = MultiHeadAttention(12, 3).double().eval()
    x = randn(2, 7, 12)
    prefix_perm = torch.tensor(
        [3, 0, 5, 1, 4, 2, 6]
    )  # shuffle the first six tokens, keep the last one
    out, shuffled = mha(x, is_causal=True), mha(x[:, prefix_perm], is_causal=True)
    # the last token sees its prefix as a bag of words: its output does not change ...
    torch.testing.assert_close(shuffled[:, -1], out[:, -1], rtol=0, atol=1e-12)
    # ... but the earlier outputs are no longer a permutation of the old ones
    assert not torch.allclose(shuffled[:, :-1], out[:, prefix_perm[:-1]], atol=1e-3)


def test_rope_breaks_permutation_equivariance():
    torch.manual_seed(0)
    mha = MultiHeadAttention(12, 3, rope=True).double().eval()
    x = randn(2, 7, 12)
    perm = torch.tensor([3, 0, 6, 1, 5, 2, 4])
    assert not torch.allclose(mha(x[:, perm]), mha(x)[:, perm], atol=1e-3)


# ---------------------------------------------------------------- sinusoidal and learned


@pytest.mark.parametrize("t,d", [(1, 2), (50, 16), (7, 6)])
def test_sinusoidal_matches_the_formula(t, d):
    ref = np.zeros((t, d))
    for pos in range(t):
        for i in range(d // 2):
            angle = pos / 10000 ** (2 * i / d)
            ref[pos, 2 * i], ref[pos, 2 * i + 1] = math.sin(angle), math.cos(angle)
    pe = sinusoidal_positions(t, d)
    assert pe.dtype == torch.float32 and pe.shape == (t, d)
    np.testing.assert_allclose(pe.numpy(), ref, rtol=0, atol=1e-6)


def test_sinusoidal_similarity_depends_on_distance_only():
    pe = sinusoidal_positions(64, 32).double()
    gram = pe @ pe.T  # (T, T): sum_i cos((m - n) theta_i), a function of m - n only
    for offset in (1, 5, 20):
        diagonal = torch.diagonal(gram, offset)
        torch.testing.assert_close(diagonal, diagonal[:1].expand_as(diagonal), rtol=0, atol=1e-5)


def test_learned_positions_and_max_len():
    torch.manual_seed(0)
    pos = LearnedPositions(max_len=10, dim=6)
    out = pos(torch.arange(10))
    assert out.shape == (10, 6)
    torch.testing.assert_close(out, pos.table.weight)
    assert pos(torch.arange(4)[None].expand(3, 4)).shape == (3, 4, 6)
    with pytest.raises(ValueError, match=r"position 12 has no embedding: max_len=10"):
        pos(torch.arange(13))
    with pytest.raises(ValueError, match="positions must be >= 0, got -1"):
        pos(torch.tensor([-1, 0]))
    with pytest.raises(TypeError, match="positions must be an integer tensor, got torch.float32"):
        pos(torch.arange(3.0))
    with pytest.raises(TypeError, match="got list"):
        pos([0, 1])


# ---------------------------------------------------------------- RoPE


@pytest.mark.parametrize("pairing", ["interleaved", "halves"])
@pytest.mark.parametrize("base", [10000.0, 500.0])
def test_rope_matches_complex_multiplication(pairing, base):
    x = randn(2, 3, 9, 8)  # (B, H, T, Dh)
    positions = torch.arange(9) + 4
    out = apply_rope(x, positions, base=base, pairing=pairing)
    ref = rope_reference(x.numpy(), positions.numpy(), base, pairing)
    np.testing.assert_allclose(out.numpy(), ref, rtol=0, atol=1e-12)


@pytest.mark.parametrize("pairing", ["interleaved", "halves"])
def test_rope_batched_positions(pairing):
    x = randn(2, 3, 5, 6)
    positions = torch.tensor([[0, 1, 2, 3, 4], [7, 8, 9, 10, 11]])[:, None]  # (B, 1, T)
    ref = rope_reference(x.numpy(), positions.numpy(), pairing=pairing)
    np.testing.assert_allclose(
        apply_rope(x, positions, pairing=pairing).numpy(), ref, rtol=0, atol=1e-12
    )
    x3 = randn(2, 5, 6)  # (B, T, Dh) with (B, T) positions
    ref3 = rope_reference(x3.numpy(), positions[:, 0].numpy(), pairing=pairing)
    np.testing.assert_allclose(
        apply_rope(x3, positions[:, 0], pairing=pairing).numpy(), ref3, rtol=0, atol=1e-12
    )


def test_rope_float32_and_large_positions():
    x = randn(4, 16, dtype=torch.float32)
    positions = torch.arange(4) + 100_000
    out = apply_rope(x, positions)
    assert out.dtype == torch.float32
    ref = rope_reference(x.double().numpy(), positions.numpy())
    np.testing.assert_allclose(out.numpy(), ref, rtol=0, atol=1e-5)


def test_rope_keeps_norms_and_position_zero_is_identity():
    x = randn(3, 10, 8)
    out = apply_rope(x, torch.arange(10))
    torch.testing.assert_close(out.norm(dim=-1), x.norm(dim=-1), rtol=0, atol=1e-12)
    torch.testing.assert_close(out[:, 0], x[:, 0], rtol=0, atol=0)


@pytest.mark.parametrize("pairing", ["interleaved", "halves"])
def test_rope_score_depends_only_on_relative_position(pairing):
    q, k = randn(1, 8, seed=1), randn(1, 8, seed=2)

    def score(m, n):
        q_m = apply_rope(q, torch.tensor([m]), pairing=pairing)
        k_n = apply_rope(k, torch.tensor([n]), pairing=pairing)
        return (q_m * k_n).sum().item()

    for delta in (0, 3, -5):
        scores = [score(m, m - delta) for m in (5, 17, 1000)]
        np.testing.assert_allclose(scores, scores[0], rtol=0, atol=1e-10)
    assert abs(score(5, 2) - score(5, 4)) > 1e-3  # a different distance gives a different score


def test_rope_angles():
    angles = rope_angles(torch.tensor([0, 1, 3]), 4, base=100.0)
    torch.testing.assert_close(
        angles, torch.tensor([[0.0, 0.0], [1.0, 0.1], [3.0, 0.3]], dtype=torch.float64)
    )


def test_rope_permutation_converts_the_pairings():
    p = rope_permutation(8)
    assert p.tolist() == [0, 2, 4, 6, 1, 3, 5, 7]
    x, positions = randn(2, 6, 8), torch.arange(6)
    halves = apply_rope(x[..., p], positions, pairing="halves")
    torch.testing.assert_close(halves, apply_rope(x, positions)[..., p], rtol=0, atol=1e-12)


@pytest.mark.parametrize("num_heads", [1, 2, 3])
@pytest.mark.parametrize("bias", [True, False])
def test_converted_weights_give_the_same_attention(num_heads, bias):
    torch.manual_seed(num_heads)
    halves = (
        MultiHeadAttention(12, num_heads, bias=bias, rope=True, rope_pairing="halves")
        .double()
        .eval()
    )
    interleaved = MultiHeadAttention(
        12, num_heads, bias=bias, rope=True, rope_pairing="interleaved"
    ).double()
    interleaved.load_state_dict(halves.state_dict())
    x = randn(2, 9, 12)
    assert not torch.allclose(
        interleaved(x), halves(x), atol=1e-3
    )  # the same weights: a porting bug
    with torch.no_grad():
        for linear in (interleaved.w_q, interleaved.w_k):
            linear.weight.copy_(convert_rope_weight(linear.weight, num_heads, to="interleaved"))
            if bias:
                linear.bias.copy_(convert_rope_weight(linear.bias, num_heads, to="interleaved"))
    torch.testing.assert_close(
        interleaved(x, is_causal=True), halves(x, is_causal=True), rtol=0, atol=1e-12
    )
    back = convert_rope_weight(interleaved.w_q.weight, num_heads, to="halves")
    torch.testing.assert_close(back, halves.w_q.weight, rtol=0, atol=0)


def mha_rope_reference(query, key, value, params, num_heads, mask, pairing):
    """numpy_ref.multi_head_attention with RoPE on the projected, split queries and keys."""
    q = numpy_ref.split_heads(query @ params["w_q"] + params["b_q"], num_heads)
    k = numpy_ref.split_heads(key @ params["w_k"] + params["b_k"], num_heads)
    v = numpy_ref.split_heads(value @ params["w_v"] + params["b_v"], num_heads)
    t_q, t_k = q.shape[-2], k.shape[-2]
    q = rope_reference(q, np.arange(t_k - t_q, t_k), pairing=pairing)
    k = rope_reference(k, np.arange(t_k), pairing=pairing)
    heads, weights = numpy_ref.scaled_dot_product_attention(q, k, v, mask)
    return numpy_ref.merge_heads(heads) @ params["w_o"] + params["b_o"], weights


@pytest.mark.parametrize("num_heads", [1, 3, 6])
@pytest.mark.parametrize("pairing", ["interleaved", "halves"])
@pytest.mark.parametrize("use_mask", [False, True])
def test_multi_head_rope_matches_reference(num_heads, pairing, use_mask, rng):
    d_model, kdim, vdim, t_q, t_k = 12, 10, 7, 4, 9
    params = numpy_ref.init_mha_params(d_model, kdim, vdim, seed=num_heads)
    mha = MultiHeadAttention(
        d_model, num_heads, kdim=kdim, vdim=vdim, rope=True, rope_pairing=pairing
    )
    mha = mha.double().eval()
    mha.load_numpy_params(params)
    query, key, value = (
        rng.normal(size=(2, t_q, d_model)),
        rng.normal(size=(2, t_k, kdim)),
        rng.normal(size=(2, t_k, vdim)),
    )
    mask = numpy_ref.causal_mask(t_q, t_k) if use_mask else None
    if use_mask:
        mask = np.logical_and(mask, numpy_ref.padding_mask([9, 3], t_k))
    ref_out, ref_weights = mha_rope_reference(query, key, value, params, num_heads, mask, pairing)
    torch_mask = None if mask is None else torch.from_numpy(mask)
    with torch.no_grad():
        out, weights = mha(
            *map(torch.from_numpy, (query, key, value)), mask=torch_mask, return_weights=True
        )
    np.testing.assert_allclose(out.numpy(), ref_out, rtol=0, atol=1e-10)
    np.testing.assert_allclose(weights.numpy(), ref_weights, rtol=0, atol=1e-10)
    mha.backend = "sdpa"
    with torch.no_grad():
        fast = mha(*map(torch.from_numpy, (query, key, value)), mask=torch_mask)
    np.testing.assert_allclose(fast.numpy(), ref_out, rtol=0, atol=1e-10)


def test_rope_gradients():
    x = randn(2, 5, 6).requires_grad_()
    positions = torch.arange(5) + 2
    for pairing in ("interleaved", "halves"):
        assert torch.autograd.gradcheck(
            lambda t, p=pairing: apply_rope(t, positions, pairing=p), (x,)
        )


# ---------------------------------------------------------------- RoPE with a KV cache


@pytest.mark.parametrize("num_kv_heads", [None, 2, 1])
def test_rope_attention_with_cache_equals_recompute(num_kv_heads):
    torch.manual_seed(0)
    attn = CausalSelfAttention(16, 4, num_kv_heads, rope=True).double().eval()
    x = randn(2, 9, 16)
    full = attn(x)
    cache = KVCache(1)
    steps = [attn(x[:, :5], cache)] + [
        attn(x[:, t : t + 1], cache) for t in range(5, 9)
    ]  # prefill, then decode
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=0, atol=1e-12)


def test_rope_attention_rotates_by_absolute_position():
    """The same layer without an offset (every new token at position 0) gives different outputs."""
    torch.manual_seed(0)
    attn = CausalSelfAttention(16, 4, rope=True).double().eval()
    x = randn(1, 6, 16)
    cache = KVCache(1)
    attn(x[:, :5], cache)
    wrong_cache = KVCache(1)
    attn(x[:, :5], wrong_cache)
    wrong_cache.lengths[0] = (
        0  # forget the offset (the stored keys stay): the new token lands at position 0
    )
    wrong = attn(x[:, 5:], wrong_cache)
    assert not torch.allclose(wrong, attn(x)[:, 5:], atol=1e-3)
    torch.testing.assert_close(attn(x[:, 5:], cache), attn(x)[:, 5:], rtol=0, atol=1e-12)


def test_rope_model_has_no_position_table_and_rotates_in_every_layer():
    sizes = dict(vocab_size=97, d_model=32, num_heads=4, num_layers=1, max_len=16, init="pytorch")
    learned = GPT(GPTConfig(**sizes), seed=0)
    rope = GPT(GPTConfig(**sizes, positions="rope"), seed=0)
    assert learned.pos_emb.table.weight.shape == (16, 32) and rope.pos_emb is None
    assert not learned.blocks[0].attn.rope and rope.blocks[0].attn.rope
    torch.testing.assert_close(learned.tok_emb.weight, rope.tok_emb.weight, rtol=0, atol=0)  # same seed
    gqa = CausalSelfAttention(16, 4, 2, rope=True)
    assert gqa.as_multi_head().rope


def test_token_positions_follow_the_earlier_tokens():
    assert token_positions(3).tolist() == [0, 1, 2]
    assert token_positions(2, start=5).tolist() == [5, 6]  # after a cache of 5
    assert token_positions(2, start=-1).tolist() == [-1, 0]  # 2 queries, the last of 1 key
    assert token_positions(0, start=4).tolist() == []
    with pytest.raises(TypeError, match="length must be an int"):
        token_positions(2.0)
    with pytest.raises(ValueError, match="start must be >= -2"):
        token_positions(2, start=-3)


# ---------------------------------------------------------------- ALiBi


@pytest.mark.parametrize(
    "num_heads,exponents",
    [
        (1, [8]),
        (2, [4, 8]),
        (6, [2, 4, 6, 8, 1, 3]),
        (8, [1, 2, 3, 4, 5, 6, 7, 8]),
        (12, [1, 2, 3, 4, 5, 6, 7, 8, 0.5, 1.5, 2.5, 3.5]),
        (16, [0.5 * i for i in range(1, 17)]),
    ],
)
def test_alibi_slopes_are_the_papers(num_heads, exponents):
    """Press et al.: 8 heads get 1/2, ..., 1/256; 12 heads those 8, then 2^-0.5, 2^-1.5, ..."""
    slopes = alibi_slopes(num_heads, dtype=torch.float64)
    np.testing.assert_allclose(
        slopes.numpy(), 2.0 ** -np.array(exponents, dtype=np.float64), rtol=1e-15, atol=0
    )
    assert alibi_slopes(num_heads).dtype == torch.float32


def test_alibi_bias_values():
    bias = alibi_bias(8, 3, 5, dtype=torch.float64)
    assert bias.shape == (8, 3, 5)
    slopes = 2.0 ** -np.arange(1, 9)
    for h in range(8):
        for i in range(3):
            for j in range(5):
                assert bias[h, i, j].item() == pytest.approx(-slopes[h] * abs(i + 2 - j), abs=1e-15)
    torch.testing.assert_close(alibi_bias(4, 6), alibi_bias(4, 6, 6))


@pytest.mark.parametrize("num_heads,t_q,t_k", [(8, 5, 5), (12, 3, 7), (3, 1, 6)])
def test_attention_with_bias_matches_sdpa_float_mask(num_heads, t_q, t_k):
    q, k, v = (
        randn(2, num_heads, t_q, 6, seed=1),
        randn(2, num_heads, t_k, 6, seed=2),
        randn(2, num_heads, t_k, 5, seed=3),
    )
    bias = alibi_bias(num_heads, t_q, t_k, dtype=torch.float64)  # (H, Tq, Tk)
    mask = causal_mask(t_q, t_k)
    out, weights = attention_with_bias(q, k, v, bias, mask)
    float_mask = bias + torch.zeros(t_q, t_k, dtype=torch.float64).masked_fill(~mask, float("-inf"))
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=float_mask)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, num_heads, t_q, dtype=torch.float64))
    no_mask, _ = attention_with_bias(q, k, v, bias)
    torch.testing.assert_close(
        no_mask, F.scaled_dot_product_attention(q, k, v, attn_mask=bias), rtol=0, atol=1e-12
    )


def test_attention_with_bias_fully_masked_rows_are_zero():
    q, k, v = randn(1, 2, 3, 4, seed=1), randn(1, 2, 3, 4, seed=2), randn(1, 2, 3, 4, seed=3)
    bias = alibi_bias(2, 3, dtype=torch.float64)
    mask = torch.tensor([True, True, False])[:, None].expand(3, 3)  # query 2 may attend nothing
    out, weights = attention_with_bias(q, k, v, bias, mask)
    assert not out.isnan().any()
    assert (out[..., 2, :] == 0).all() and (weights[..., 2, :] == 0).all()
    grad_inputs = (q.requires_grad_(), bias.clone().requires_grad_())
    out, _ = attention_with_bias(grad_inputs[0], k, v, grad_inputs[1], mask)
    out.sum().backward()
    assert not q.grad.isnan().any()


def test_attention_with_bias_gradients():
    q, k, v = (randn(1, 2, 3, 4, seed=s).requires_grad_() for s in range(3))
    bias = alibi_bias(2, 3, dtype=torch.float64).requires_grad_()
    mask = causal_mask(3)
    assert torch.autograd.gradcheck(lambda *t: attention_with_bias(*t, mask)[0], (q, k, v, bias))


# ---------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "call,error,match",
    [
        (
            lambda: sinusoidal_positions(0, 4),
            ValueError,
            "num_positions must be >= 1, got num_positions=0",
        ),
        (
            lambda: sinusoidal_positions(4, 5),
            ValueError,
            "dim must be even, got dim=5",
        ),
        (
            lambda: sinusoidal_positions(4.0, 4),
            TypeError,
            "num_positions must be an int, got float",
        ),
        (lambda: sinusoidal_positions(4, True), TypeError, "dim must be an int, got bool"),
        (lambda: LearnedPositions(0, 4), ValueError, "max_len must be >= 1"),
        (
            lambda: apply_rope(randn(2, 5), torch.arange(2)),
            ValueError,
            "even head dimension Dh, got shape",
        ),
        (lambda: apply_rope(randn(5), torch.arange(5)), ValueError, r"\(\.\.\., T, Dh\)"),
        (
            lambda: apply_rope(torch.ones(3, 4, dtype=torch.long), torch.arange(3)),
            TypeError,
            "floating-point",
        ),
        (
            lambda: apply_rope(randn(3, 4), torch.arange(3.0)),
            TypeError,
            "positions must be integers",
        ),
        (
            lambda: apply_rope(randn(3, 4), [0, 1, 2]),
            TypeError,
            "positions must be an integer tensor, got list",
        ),
        (
            lambda: apply_rope(randn(3, 4), torch.arange(4)),
            ValueError,
            r"positions of shape \(4,\) do not broadcast",
        ),
        (
            lambda: apply_rope(randn(2, 3, 5, 4), torch.zeros(2, 5, dtype=torch.long)),
            ValueError,
            r"\(B, 1, T\)",
        ),
        (lambda: apply_rope(randn(3, 4), torch.tensor(1)), ValueError, "do not broadcast"),
        (
            lambda: apply_rope(randn(3, 4), torch.arange(3), base=float("inf")),
            ValueError,
            "finite and > 1",
        ),
        (
            lambda: apply_rope(randn(3, 4), torch.arange(3), base=float("nan")),
            ValueError,
            "finite and > 1",
        ),
        (lambda: apply_rope(randn(3, 4), torch.arange(3), base=1.0), ValueError, "base=1.0"),
        (
            lambda: apply_rope(randn(3, 4), torch.arange(3), base="10000"),
            TypeError,
            "base must be a float, got str",
        ),
        (
            lambda: apply_rope(randn(3, 4), torch.arange(3), pairing="neox"),
            ValueError,
            "pairing must be one of",
        ),
        (lambda: rope_permutation(3), ValueError, "dim must be even"),
        (lambda: convert_rope_weight(randn(12, 4), 5, "halves"), ValueError, "num_heads=5"),
        (lambda: convert_rope_weight(randn(12, 4), 4, "halves"), ValueError, "even head dimension"),
        (
            lambda: convert_rope_weight(randn(12, 4), 2, "llama"),
            ValueError,
            "pairing must be one of",
        ),
        (lambda: alibi_slopes(0), ValueError, "num_heads must be >= 1"),
        (lambda: alibi_bias(2, 0, 3), ValueError, "t_q must be >= 1"),
        (lambda: alibi_bias(2, 3, 0), ValueError, "t_k must be >= 1"),
        (
            lambda: attention_with_bias(
                randn(2, 3, 4), randn(2, 3, 4), randn(2, 3, 4), causal_mask(3)
            ),
            TypeError,
            "bias must be a float tensor",
        ),
        (
            lambda: attention_with_bias(randn(2, 3, 4), randn(2, 3, 4), randn(2, 3, 4), 0.5),
            TypeError,
            "got float",
        ),
        (
            lambda: attention_with_bias(
                randn(2, 3, 4), randn(2, 3, 4), randn(2, 3, 4), alibi_bias(2, 3)
            ),
            TypeError,
            "bias dtype torch.float32 != query dtype torch.float64",
        ),
        (
            lambda: attention_with_bias(
                randn(2, 3, 4),
                randn(2, 3, 4),
                randn(2, 3, 4),
                alibi_bias(3, 3, dtype=torch.float64),
            ),
            ValueError,
            "does not broadcast",
        ),
        (
            lambda: MultiHeadAttention(6, 2, rope=True),
            ValueError,
            "rope needs an even head dimension, got 3",
        ),
        (lambda: MultiHeadAttention(8, 2, rope=True, rope_base=0.5), ValueError, "base=0.5"),
        (
            lambda: MultiHeadAttention(8, 2, rope=True, rope_pairing="x"),
            ValueError,
            "pairing must be one of",
        ),
        (
            lambda: MultiHeadAttention(8, 2, rope=True).to_torch(),
            ValueError,
            "to_torch needs rope=False",
        ),
        (
            lambda: CausalSelfAttention(6, 2, rope=True),
            ValueError,
            "rope needs an even head dimension, got 3",
        ),
        (lambda: CausalSelfAttention(8, 2, rope=True, rope_base=-1), ValueError, "base=-1"),
        (
            lambda: GPTConfig(97, 15, 3, 1, positions="sinusoidal"),
            ValueError,
            "positions='sinusoidal' needs an even d_model",
        ),
        (lambda: GPTConfig(97, 32, 4, 1, positions="t5"), ValueError, "positions must be one of"),
        (lambda: CausalSelfAttention(8, 2, rope=True, alibi=True), ValueError, "not both"),
        (lambda: SinusoidalPositions(7), ValueError, "dim"),
        (lambda: SinusoidalPositions(8)(torch.arange(3.0)), TypeError, "integer tensor"),
    ],
)
def test_errors(call, error, match):
    with pytest.raises(error, match=match):
        call()


# ------------------------------------------------ sinusoids and ALiBi in the GPT (chapter 10's experiment)


def test_sinusoidal_module_gives_the_table_rows_at_any_position():
    table = sinusoidal_positions(300, 16)
    positions = torch.tensor([[0, 5, 299], [17, 2, 3]])
    torch.testing.assert_close(SinusoidalPositions(16)(positions), table[positions], atol=1e-6, rtol=0)
    assert list(SinusoidalPositions(16).parameters()) == []


def test_sinusoidal_gpt_reads_sequences_longer_than_max_len():
    sizes = {"vocab_size": 11, "d_model": 16, "num_heads": 2, "num_layers": 1, "max_len": 8}
    ids = torch.randint(0, 11, (2, 12), generator=torch.Generator().manual_seed(0))
    model = GPT(GPTConfig(positions="sinusoidal", **sizes), seed=0).eval()
    assert model(ids).shape == (2, 12, 11)
    with torch.no_grad():  # the same model without positions differs by the encodings it adds
        bare = GPT(GPTConfig(positions=None, **sizes), seed=0).eval()
        bare.load_state_dict(model.state_dict())
        x = model.tok_emb(ids) + sinusoidal_positions(12, 16)
        torch.testing.assert_close(model.head(model.norm(model.blocks[0](x))), model(ids))
        assert not torch.allclose(bare(ids), model(ids))
    with pytest.raises(ValueError, match="longer than max_len=8"):
        GPT(GPTConfig(positions="learned", **sizes), seed=0)(ids)


def alibi_reference(q, k, v):
    """Causal ALiBi with SDPA's float mask, queries the last Tq of Tk, slopes 2^(-8 (h + 1) / H) written out."""
    h, t_q, t_k = q.shape[1], q.shape[2], k.shape[2]
    slopes = torch.tensor([2.0 ** (-8.0 * (i + 1) / h) for i in range(h)], dtype=q.dtype)
    distance = (torch.arange(t_k - t_q, t_k)[:, None] - torch.arange(t_k)).to(q.dtype)  # (Tq, Tk)
    bias = (-slopes[:, None, None] * distance).masked_fill(distance < 0, float("-inf"))
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias)


@pytest.mark.parametrize("num_kv_heads", [None, 2])
@pytest.mark.parametrize("backend", ["sdpa", "eager", "blockwise"])
def test_alibi_attention_matches_a_reference_with_and_without_cache(num_kv_heads, backend):
    torch.manual_seed(0)
    attn = CausalSelfAttention(24, 4, num_kv_heads, alibi=True, backend=backend).eval()
    x = torch.randn(2, 9, 24, dtype=torch.float64)
    attn.double()
    with torch.no_grad():
        q, k, v = attn.project(x)
        rep = 4 // (num_kv_heads or 4)
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        expected = attn.w_o(alibi_reference(q, k, v).transpose(1, 2).flatten(2))  # (B, T, D)
        weights = []
        full = attn(x, weights=weights)
        cache = KVCache(1)
        parts = [attn(x[:, :5], cache), attn(x[:, 5:7], cache), attn(x[:, 7:8], cache), attn(x[:, 8:], cache)]
    torch.testing.assert_close(full, expected, atol=1e-10, rtol=0)
    with torch.no_grad():
        torch.testing.assert_close(attn(x), expected, atol=1e-10, rtol=0)  # the backend's own path (no weights)
    torch.testing.assert_close(torch.cat(parts, dim=1), expected, atol=1e-10, rtol=0)
    assert weights[0].shape == (2, 4, 9, 9) and weights[0].triu(1).abs().max() == 0
    plain = CausalSelfAttention(24, 4, num_kv_heads, backend=backend).double().eval()
    plain.load_state_dict(attn.state_dict())
    with torch.no_grad():
        assert not torch.allclose(plain(x), full)  # the bias changes the output: the test can fail


def test_alibi_attention_dropout_and_gradients():
    torch.manual_seed(0)
    attn = CausalSelfAttention(16, 2, alibi=True, dropout=0.5)
    x = torch.randn(1, 6, 16, requires_grad=True)
    weights = []
    attn.train()(x, weights=weights).sum().backward()
    assert x.grad is not None and (weights[0] == 0).any()  # dropped weights
    with torch.no_grad():
        torch.testing.assert_close(attn.eval()(x), attn(x))  # deterministic in eval mode
    assert attn.as_multi_head().alibi
