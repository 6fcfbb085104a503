"""EinsumMultiHeadAttention and the loop over heads vs the float64 reference, each other and MultiHeadAttention."""

import numpy as np
import pytest
import torch

from attention_course import EinsumMultiHeadAttention, MultiHeadAttention, multi_head_attention_loop, numpy_ref

D_MODEL = 8


def random_inputs(t_q=5, t_k=5, kdim=D_MODEL, vdim=D_MODEL, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(2, t_q, D_MODEL)), rng.normal(size=(2, t_k, kdim)), rng.normal(size=(2, t_k, vdim))


@pytest.mark.parametrize("num_heads", [1, 2, 4, 8])
@pytest.mark.parametrize("kdim, vdim", [(D_MODEL, D_MODEL), (6, 10), (3, 16)])
@pytest.mark.parametrize("is_causal", [False, True])
def test_einsum_matches_numpy_reference(assert_matches_reference, num_heads, kdim, vdim, is_causal):
    params = numpy_ref.init_mha_params(D_MODEL, kdim, vdim, seed=num_heads)
    query, key, value = random_inputs(4, 6, kdim, vdim)
    mask = np.random.default_rng(1).random((2, 1, 4, 6)) < 0.6  # includes fully masked rows
    module = EinsumMultiHeadAttention(D_MODEL, num_heads, kdim=kdim, vdim=vdim)
    assert_matches_reference(module, params, num_heads, query, key, value, mask=mask, is_causal=is_causal)


def test_einsum_without_bias_matches_reference(assert_matches_reference):
    params = numpy_ref.init_mha_params(D_MODEL) | {f"b_{name}": np.zeros(D_MODEL) for name in "qkvo"}
    query, _, _ = random_inputs()
    assert_matches_reference(EinsumMultiHeadAttention(D_MODEL, 2, bias=False), params, 2, query, is_causal=True)


@pytest.mark.parametrize("num_heads", [1, 2, 4])
@pytest.mark.parametrize("kdim, vdim", [(D_MODEL, D_MODEL), (6, 10)])
def test_loop_over_heads_matches_reference_and_einsum(num_heads, kdim, vdim):
    params = numpy_ref.init_mha_params(D_MODEL, kdim, vdim)
    query, key, value = random_inputs(3, 7, kdim, vdim)
    mask = np.random.default_rng(2).random((2, num_heads, 3, 7)) < 0.6
    ref_out, ref_weights = numpy_ref.multi_head_attention(query, key, value, params, num_heads, mask)
    tensors = [torch.from_numpy(x) for x in (query, key, value)]
    out, weights = multi_head_attention_loop(*tensors, params, num_heads, torch.from_numpy(mask))
    np.testing.assert_allclose(out.numpy(), ref_out, rtol=0, atol=1e-10)
    np.testing.assert_allclose(weights.numpy(), ref_weights, rtol=0, atol=1e-10)
    module = EinsumMultiHeadAttention(D_MODEL, num_heads, kdim=kdim, vdim=vdim).double()
    module.load_numpy_params(params)
    with torch.no_grad():
        einsum_out, einsum_weights = module(*tensors, mask=torch.from_numpy(mask), return_weights=True)
    torch.testing.assert_close(einsum_out, out, rtol=0, atol=1e-10)
    torch.testing.assert_close(einsum_weights, weights, rtol=0, atol=1e-10)


def test_loop_without_mask_and_float32():
    params = numpy_ref.init_mha_params(D_MODEL)
    query, _, _ = random_inputs()
    x = torch.from_numpy(query).float()
    out, weights = multi_head_attention_loop(x, x, x, params, 2)
    ref_out, _ = numpy_ref.multi_head_attention(query, query, query, params, 2)
    assert out.dtype == torch.float32 and weights.shape == (2, 2, 5, 5)
    np.testing.assert_allclose(out.numpy(), ref_out, rtol=0, atol=1e-5)


def test_einsum_matches_multi_head_attention_in_float32():
    params = numpy_ref.init_mha_params(D_MODEL, kdim=6, vdim=10)
    einsum = EinsumMultiHeadAttention(D_MODEL, 4, kdim=6, vdim=10)
    linear = MultiHeadAttention(D_MODEL, 4, kdim=6, vdim=10)
    einsum.load_numpy_params(params)
    linear.load_numpy_params(params)
    query, key, value = (torch.from_numpy(x).float() for x in random_inputs(4, 6, 6, 10))
    with torch.no_grad():
        torch.testing.assert_close(einsum(query, key, value), linear(query, key, value), rtol=0, atol=1e-5)


def test_per_head_weight_layout():
    module = EinsumMultiHeadAttention(D_MODEL, 4, kdim=6, vdim=10)
    assert module.w_q.shape == (D_MODEL, 4, 2) and module.w_k.shape == (6, 4, 2) and module.w_v.shape == (10, 4, 2)
    assert module.w_o.shape == (4, 2, D_MODEL) and module.b_q.shape == (4, 2) and module.b_o.shape == (D_MODEL,)
    params = numpy_ref.init_mha_params(D_MODEL, kdim=6, vdim=10)
    module.double().load_numpy_params(params)
    for h in range(4):  # head h owns columns 2h, 2h + 1 of w_q and rows 2h, 2h + 1 of w_o
        np.testing.assert_array_equal(module.w_q[:, h].detach().numpy(), params["w_q"][:, 2 * h : 2 * h + 2])
        np.testing.assert_array_equal(module.w_o[h].detach().numpy(), params["w_o"][2 * h : 2 * h + 2])


@pytest.mark.parametrize("bias", [True, False])
def test_numpy_params_round_trip(bias):
    params = numpy_ref.init_mha_params(D_MODEL, kdim=6, vdim=10)
    if not bias:
        params |= {f"b_{name}": np.zeros(D_MODEL) for name in "qkvo"}
    module = EinsumMultiHeadAttention(D_MODEL, 2, bias=bias, kdim=6, vdim=10).double()
    module.load_numpy_params(params)
    exported = module.numpy_params()
    assert exported.keys() == params.keys()
    for name in params:
        np.testing.assert_array_equal(exported[name], params[name])
