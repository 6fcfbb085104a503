"""FusedSelfAttention: fused QKV + PyTorch SDPA, equal to the float64 reference and the other modules."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from attention_course import numpy_ref
from attention_course.fused import FusedSelfAttention, sdpa_kernel_used
from attention_course.multi_head import MultiHeadAttention

D, H = 12, 3


def make(params=None, bias=True, dtype=torch.float64):
    m = FusedSelfAttention(D, H, bias=bias).to(dtype).eval()
    if params is not None:
        m.load_numpy_params(params)
    return m


def reference(x, params, mask=None, is_causal=False):
    t = x.shape[1]
    if is_causal:
        causal = numpy_ref.causal_mask(t)
        mask = causal if mask is None else np.logical_and(mask, causal)
    out, _ = numpy_ref.multi_head_attention(x, x, x, params, H, mask)
    return out


@pytest.fixture
def data(rng):
    return rng.normal(size=(2, 7, D)), numpy_ref.init_mha_params(D, seed=3)


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("dtype,atol", [(torch.float64, 1e-12), (torch.float32, 1e-5)])
def test_matches_numpy_reference(data, is_causal, dtype, atol):
    x, params = data
    with torch.no_grad():
        out = make(params, dtype=dtype)(torch.from_numpy(x).to(dtype), is_causal=is_causal)
    np.testing.assert_allclose(out.double().numpy(), reference(x, params, is_causal=is_causal), rtol=0, atol=atol)


@pytest.mark.parametrize("is_causal", [False, True])
def test_with_padding_mask_and_fully_masked_rows(data, is_causal):
    x, params = data
    mask = numpy_ref.padding_mask(np.array([7, 0]), 7)  # (B, 1, 1, T); the second sequence sees nothing
    with torch.no_grad():
        out = make(params)(torch.from_numpy(x), mask=torch.from_numpy(mask), is_causal=is_causal)
    assert torch.isfinite(out).all()
    np.testing.assert_allclose(out.numpy(), reference(x, params, mask, is_causal), rtol=0, atol=1e-12)
    np.testing.assert_allclose(out[1].numpy(), np.broadcast_to(params["b_o"], (7, D)), atol=1e-12)  # zero heads


def test_same_as_step_by_step_module_and_torch(data):
    x, params = data
    xt = torch.from_numpy(x).float()
    fused, mha = make(params, dtype=torch.float32), MultiHeadAttention(D, H).eval()
    mha.load_numpy_params(params)
    torch_mha = mha.to_torch(batch_first=True).eval()
    causal_not_allowed = ~torch.ones(7, 7, dtype=torch.bool).tril()  # nn.MultiheadAttention: True = NOT allowed
    with torch.no_grad():
        ours = fused(xt, is_causal=True)
        torch.testing.assert_close(ours, mha(xt, is_causal=True), rtol=0, atol=1e-5)
        theirs, _ = torch_mha(xt, xt, xt, attn_mask=causal_not_allowed, need_weights=False)
        torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)


def test_qkv_is_one_stacked_projection(data):
    x, params = data
    m = make(params)
    assert m.qkv.weight.shape == (3 * D, D) and m.w_o.weight.shape == (D, D)
    xt = torch.from_numpy(x)
    with torch.no_grad():
        q = m.qkv(xt)[..., :D]
    np.testing.assert_allclose(q.numpy(), x @ params["w_q"] + params["b_q"], atol=1e-12)
    # and the heads that go into SDPA are the reference's split heads
    q_heads = q.view(2, 7, H, D // H).transpose(1, 2)
    np.testing.assert_allclose(q_heads.numpy(), numpy_ref.split_heads(x @ params["w_q"] + params["b_q"], H), atol=1e-12)


def test_numpy_params_round_trip(data):
    _, params = data
    back = make(params).numpy_params()
    assert list(back) == list(numpy_ref.MHA_PARAM_NAMES)
    for name in params:
        assert back[name].dtype == np.float64
        np.testing.assert_allclose(back[name], params[name], atol=1e-12)


def test_without_bias(data):
    x, params = data
    params = {n: (np.zeros_like(p) if n.startswith("b_") else p) for n, p in params.items()}
    m = make(params, bias=False)
    assert m.qkv.bias is None and m.w_o.bias is None
    assert all(np.count_nonzero(m.numpy_params()[f"b_{n}"]) == 0 for n in "qkvo")
    with torch.no_grad():
        out = m(torch.from_numpy(x), is_causal=True)
    np.testing.assert_allclose(out.numpy(), reference(x, params, is_causal=True), atol=1e-12)
    with pytest.raises(ValueError, match="bias=False"):
        m.load_numpy_params(numpy_ref.init_mha_params(D))


def test_matches_sdpa_on_random_module():
    torch.manual_seed(0)
    m = FusedSelfAttention(32, 4).eval()
    x = torch.randn(2, 9, 32)
    with torch.no_grad():
        q, k, v = (t.view(2, 9, 4, 8).transpose(1, 2) for t in m.qkv(x).chunk(3, dim=-1))
        heads = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        expected = m.w_o(heads.transpose(1, 2).reshape(2, 9, 32))
        torch.testing.assert_close(m(x, is_causal=True), expected, rtol=0, atol=1e-6)


def test_dropout_only_in_training():
    torch.manual_seed(0)
    m = FusedSelfAttention(16, 2, dropout=0.5)
    x = torch.randn(2, 6, 16)
    m.eval()
    torch.testing.assert_close(m(x), m(x))
    m.train()
    torch.manual_seed(1)
    a = m(x)
    torch.manual_seed(2)
    assert not torch.allclose(a, m(x))
    torch.manual_seed(1)
    torch.testing.assert_close(a, m(x))  # seeded dropout is reproducible


def test_gradients_flow():
    m = FusedSelfAttention(16, 4)
    x = torch.randn(2, 5, 16, requires_grad=True)
    m(x, is_causal=True).sum().backward()
    assert x.grad is not None and m.qkv.weight.grad is not None and torch.isfinite(m.qkv.weight.grad).all()


def test_errors(data):
    x, params = data
    with pytest.raises(ValueError, match="d_model=10 is not divisible by num_heads=3"):
        FusedSelfAttention(10, 3)
    with pytest.raises(ValueError, match="dropout"):
        FusedSelfAttention(12, 3, dropout=1.5)
    m = make(params)
    with pytest.raises(ValueError, match=r"query must be 3-D \(B, T, D\), got shape \(7, 12\)"):
        m(torch.from_numpy(x[0]))
    with pytest.raises(ValueError, match="query has 8 features, but the query projection expects 12"):
        m(torch.zeros(2, 7, 8, dtype=torch.float64))
    with pytest.raises(TypeError, match="mask must be boolean"):
        m(torch.from_numpy(x), mask=torch.ones(7, 7, dtype=torch.float64))
    with pytest.raises(ValueError, match="does not broadcast"):
        m(torch.from_numpy(x), mask=torch.ones(5, 7, dtype=torch.bool))
    with pytest.raises(ValueError, match="w_k"):
        m.load_numpy_params(numpy_ref.init_mha_params(D, kdim=6))


def test_sdpa_kernel_used():
    q = torch.randn(1, 2, 8, 4)
    assert sdpa_kernel_used(q, q, q, is_causal=True) == "_scaled_dot_product_flash_attention_for_cpu"
    assert sdpa_kernel_used(q, q, q, attn_mask=torch.ones(8, 8, dtype=torch.bool)).startswith("_scaled_dot_product")
    assert sdpa_kernel_used(q, q, q, dropout_p=0.5) == "math"
