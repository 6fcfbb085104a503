"""The float64 NumPy reference itself, against independent computations (plain loops, PyTorch's own attention)."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attention_course import numpy_ref


def loop_softmax(row):
    """Softmax of one row with Python floats."""
    exps = [math.exp(x - max(row)) for x in row]
    return [e / sum(exps) for e in exps]


def test_softmax_matches_a_loop(rng):
    x = rng.normal(size=(4, 7)) * 3
    expected = np.array([loop_softmax(list(row)) for row in x])
    np.testing.assert_allclose(numpy_ref.softmax(x), expected, rtol=0, atol=1e-15)
    np.testing.assert_allclose(numpy_ref.softmax(x.T, axis=0), expected.T, rtol=0, atol=1e-15)
    np.testing.assert_allclose(numpy_ref.softmax_unstable(x), expected, rtol=0, atol=1e-15)


def test_softmax_is_stable_on_large_inputs():
    x = np.array([1000.0, 1001.0, 1002.0])
    np.testing.assert_allclose(numpy_ref.softmax(x), numpy_ref.softmax(x - 1000.0), rtol=0, atol=1e-15)
    with np.errstate(over="ignore", invalid="ignore"):
        assert np.isnan(numpy_ref.softmax_unstable(x)).all()  # exp(1000) = inf, inf / inf = NaN


def test_softmax_of_a_fully_masked_row_is_zero():
    x = np.array([[0.0, -np.inf, 1.0], [-np.inf, -np.inf, -np.inf]])
    weights = numpy_ref.softmax(x)
    np.testing.assert_allclose(weights[0], [1 / (1 + math.e), 0.0, math.e / (1 + math.e)], rtol=0, atol=1e-15)
    np.testing.assert_array_equal(weights[1], [0.0, 0.0, 0.0])


@pytest.mark.parametrize("batch", [(), (2,), (2, 3)])
@pytest.mark.parametrize("masked", [False, True])
def test_attention_matches_torch_sdpa_in_float64(rng, batch, masked):
    q, k, v = rng.normal(size=(*batch, 4, 5)), rng.normal(size=(*batch, 6, 5)), rng.normal(size=(*batch, 6, 3))
    mask = rng.random((*batch, 4, 6)) < 0.6 if masked else None
    if masked:
        mask[..., 0] = True  # keep torch away from fully masked rows
    out, weights = numpy_ref.scaled_dot_product_attention(q, k, v, mask)
    tq, tk, tv = (torch.from_numpy(a) for a in (q, k, v))
    expected = F.scaled_dot_product_attention(tq, tk, tv, attn_mask=None if mask is None else torch.from_numpy(mask))
    np.testing.assert_allclose(out, expected.numpy(), rtol=0, atol=1e-10)
    np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=0, atol=1e-12)


def test_causal_attention_matches_torch_is_causal(rng):
    q, k, v = (rng.normal(size=(2, 5, 4)) for _ in range(3))
    out, _ = numpy_ref.scaled_dot_product_attention(q, k, v, numpy_ref.causal_mask(5))
    expected = F.scaled_dot_product_attention(*(torch.from_numpy(a) for a in (q, k, v)), is_causal=True)
    np.testing.assert_allclose(out, expected.numpy(), rtol=0, atol=1e-10)


def test_fully_masked_query_gets_zero_weights_and_output(rng):
    q, k, v = rng.normal(size=(3, 4)), rng.normal(size=(5, 4)), rng.normal(size=(5, 2))
    mask = np.ones((3, 5), dtype=bool)
    mask[1] = False
    out, weights = numpy_ref.scaled_dot_product_attention(q, k, v, mask)
    np.testing.assert_array_equal(out[1], [0.0, 0.0])
    np.testing.assert_array_equal(weights[1], np.zeros(5))


def test_non_boolean_mask_is_rejected(rng):
    q = rng.normal(size=(3, 4))
    with pytest.raises(TypeError, match="mask must be boolean"):
        numpy_ref.scaled_dot_product_attention(q, q, q, np.ones((3, 3)))


@pytest.mark.parametrize("t_q, t_k", [(4, 4), (2, 5), (5, 2)])
def test_causal_mask_is_bottom_right_aligned(t_q, t_k):
    expected = [[j <= i + (t_k - t_q) for j in range(t_k)] for i in range(t_q)]
    assert numpy_ref.causal_mask(t_q, t_k).tolist() == expected


def test_square_causal_mask_is_the_lower_triangle():
    np.testing.assert_array_equal(numpy_ref.causal_mask(4), np.tril(np.ones((4, 4), dtype=bool)))


def test_padding_mask():
    mask = numpy_ref.padding_mask([2, 4], 4)
    assert mask.shape == (2, 1, 1, 4) and mask.dtype == bool
    assert mask[:, 0, 0].tolist() == [[True, True, False, False], [True, True, True, True]]


def test_split_and_merge_heads(rng):
    x = rng.normal(size=(2, 3, 8))
    heads = numpy_ref.split_heads(x, 4)
    assert heads.shape == (2, 4, 3, 2)
    np.testing.assert_array_equal(heads[:, 1], x[:, :, 2:4])  # head 1 owns features 2 and 3
    np.testing.assert_array_equal(numpy_ref.merge_heads(heads), x)


def test_init_mha_params_shapes_and_seed():
    params = numpy_ref.init_mha_params(8, kdim=6, vdim=10, seed=3)
    assert tuple(params) == numpy_ref.MHA_PARAM_NAMES
    assert params["w_q"].shape == (8, 8) and params["w_k"].shape == (6, 8) and params["w_v"].shape == (10, 8)
    assert params["w_o"].shape == (8, 8) and all(params[f"b_{n}"].shape == (8,) for n in "qkvo")
    np.testing.assert_array_equal(numpy_ref.init_mha_params(8, 6, 10, seed=3)["w_k"], params["w_k"])


def loop_multi_head_attention(query, key, value, p, num_heads, mask):
    """Multi-head attention one batch entry, head and query at a time, with explicit sums."""
    b, t_q, d = query.shape[0], query.shape[1], p["w_q"].shape[1]
    dh = d // num_heads
    q, k, v = query @ p["w_q"] + p["b_q"], key @ p["w_k"] + p["b_k"], value @ p["w_v"] + p["b_v"]
    concat = np.zeros((b, t_q, d))
    for n in range(b):
        for h in range(num_heads):
            cols = slice(h * dh, (h + 1) * dh)
            for i in range(t_q):
                allowed = [j for j in range(key.shape[1]) if mask[n, i, j]]
                if not allowed:
                    continue
                scores = [q[n, i, cols] @ k[n, j, cols] / math.sqrt(dh) for j in allowed]
                for weight, j in zip(loop_softmax(scores), allowed, strict=True):
                    concat[n, i, cols] += weight * v[n, j, cols]
    return concat @ p["w_o"] + p["b_o"]


def test_multi_head_attention_matches_a_loop(rng):
    params = numpy_ref.init_mha_params(8, kdim=6, vdim=5)
    query, key, value = rng.normal(size=(2, 3, 8)), rng.normal(size=(2, 4, 6)), rng.normal(size=(2, 4, 5))
    mask = rng.random((2, 3, 4)) < 0.6  # includes fully masked rows
    out, weights = numpy_ref.multi_head_attention(query, key, value, params, 2, mask[:, None])
    assert weights.shape == (2, 2, 3, 4)
    np.testing.assert_allclose(out, loop_multi_head_attention(query, key, value, params, 2, mask), rtol=0, atol=1e-12)


def test_multi_head_attention_matches_nn_multihead_attention(rng):
    params = numpy_ref.init_mha_params(8, seed=1)
    torch_mha = nn.MultiheadAttention(8, 4, batch_first=True, dtype=torch.float64)
    with torch.no_grad():  # W (d_in, d_out) is the transpose of torch's (d_out, d_in)
        torch_mha.in_proj_weight.copy_(torch.from_numpy(np.concatenate([params[f"w_{n}"].T for n in "qkv"])))
        torch_mha.in_proj_bias.copy_(torch.from_numpy(np.concatenate([params[f"b_{n}"] for n in "qkv"])))
        torch_mha.out_proj.weight.copy_(torch.from_numpy(params["w_o"].T))
        torch_mha.out_proj.bias.copy_(torch.from_numpy(params["b_o"]))
        x = torch.from_numpy(rng.normal(size=(2, 5, 8)))
        expected, expected_weights = torch_mha(
            x, x, x, attn_mask=~torch.from_numpy(numpy_ref.causal_mask(5)), average_attn_weights=False
        )
    out, weights = numpy_ref.multi_head_attention(x.numpy(), x.numpy(), x.numpy(), params, 4, numpy_ref.causal_mask(5))
    np.testing.assert_allclose(out, expected.numpy(), rtol=0, atol=1e-10)
    np.testing.assert_allclose(weights, expected_weights.numpy(), rtol=0, atol=1e-10)


def test_multi_head_attention_rejects_indivisible_heads(rng):
    x = rng.normal(size=(1, 2, 8))
    with pytest.raises(ValueError, match="d_model=8 is not divisible by num_heads=3"):
        numpy_ref.multi_head_attention(x, x, x, numpy_ref.init_mha_params(8), 3)
