"""SingleHeadAttention (d_in -> d_out, no output projection) vs the float64 NumPy reference."""

import numpy as np
import pytest
import torch

from attention_course import SingleHeadAttention, causal_mask, numpy_ref

D_IN, D_OUT = 6, 4  # deliberately different: a transposed weight cannot go unnoticed


def reference(module, query, key, value, mask=None):
    """numpy_ref attention on the module's projections, with W = Linear.weight.T (d_in, d_out)."""
    w_q, w_k, w_v = (lin.weight.detach().double().numpy().T for lin in (module.w_q, module.w_k, module.w_v))
    b_q, b_k, b_v = (
        np.zeros(D_OUT) if lin.bias is None else lin.bias.detach().double().numpy()
        for lin in (module.w_q, module.w_k, module.w_v)
    )
    return numpy_ref.scaled_dot_product_attention(query @ w_q + b_q, key @ w_k + b_k, value @ w_v + b_v, mask)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("masked", [False, True])
def test_self_attention_matches_reference(bias, masked):
    torch.manual_seed(0)
    module = SingleHeadAttention(D_IN, D_OUT, bias=bias).double()
    x = np.random.default_rng(0).normal(size=(2, 5, D_IN))
    mask = causal_mask(5) if masked else None
    with torch.no_grad():
        out, weights = module(torch.from_numpy(x), mask=mask, return_weights=True)
    ref_out, ref_weights = reference(module, x, x, x, None if mask is None else mask.numpy())
    assert out.shape == (2, 5, D_OUT) and weights.shape == (2, 5, 5)
    np.testing.assert_allclose(out.numpy(), ref_out, rtol=0, atol=1e-10)
    np.testing.assert_allclose(weights.numpy(), ref_weights, rtol=0, atol=1e-10)


def test_cross_attention_matches_reference():
    torch.manual_seed(0)
    module = SingleHeadAttention(D_IN, D_OUT).double()
    rng = np.random.default_rng(1)
    query, key, value = rng.normal(size=(2, 3, D_IN)), rng.normal(size=(2, 7, D_IN)), rng.normal(size=(2, 7, D_IN))
    mask = rng.random((2, 3, 7)) < 0.5
    with torch.no_grad():
        out = module(*(torch.from_numpy(x) for x in (query, key, value)), mask=torch.from_numpy(mask))
    ref_out, _ = reference(module, query, key, value, mask)
    np.testing.assert_allclose(out.numpy(), ref_out, rtol=0, atol=1e-10)
