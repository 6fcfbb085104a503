"""Scaled dot-product attention from scratch vs PyTorch's SDPA and the NumPy reference; sdpa_fast vs scratch."""

import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import attention_course
from attention_course import causal_mask, masked_softmax, numpy_ref, scaled_dot_product_attention, sdpa_fast

TOL = {torch.float32: 1e-5, torch.float64: 1e-10}


def test_public_api_is_exported():
    for name in attention_course.__all__:
        assert getattr(attention_course, name) is not None


def test_top_level_import_does_not_import_tensorflow():
    code = "import sys, attention_course; assert 'tensorflow' not in sys.modules, 'tensorflow imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def random_qkv(batch=(2, 3), t_q=4, t_k=6, d_k=5, d_v=7, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(*batch, t_q, d_k, generator=g, dtype=dtype)
    k = torch.randn(*batch, t_k, d_k, generator=g, dtype=dtype)
    v = torch.randn(*batch, t_k, d_v, generator=g, dtype=dtype)
    return q, k, v


def random_mask(shape, seed=0, fully_masked_rows=False):
    """A random boolean mask; unless asked, every query row keeps at least one key."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(shape, generator=g) < 0.6
    if not fully_masked_rows:
        mask[..., 0] = True
    return mask


CASES = {  # name: (batch dims, Tq, Tk, Dk, Dv, mask kind)
    "no_mask": ((2, 3), 5, 5, 4, 4, None),
    "bool_mask": ((2, 3), 5, 5, 4, 4, "random"),
    "causal": ((2, 3), 5, 5, 4, 4, "causal"),
    "tq_ne_tk": ((2, 3), 3, 7, 4, 4, "random"),
    "dk_ne_dv": ((2, 3), 4, 6, 5, 9, "random"),
    "no_batch": ((), 4, 6, 5, 3, "random"),
    "one_batch_dim": ((3,), 4, 6, 5, 3, None),
    "three_batch_dims": ((2, 2, 3), 4, 6, 5, 3, "random"),
    "broadcast_mask": ((2, 3), 4, 6, 5, 3, "keys_only"),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("case", CASES)
def test_scratch_matches_torch_sdpa(case, dtype):
    batch, t_q, t_k, d_k, d_v, mask_kind = CASES[case]
    q, k, v = random_qkv(batch, t_q, t_k, d_k, d_v, dtype)
    mask, is_causal = None, False
    if mask_kind == "random":
        mask = random_mask((*batch, t_q, t_k))
    elif mask_kind == "keys_only":
        mask = random_mask((3, 1, t_k))  # broadcasts over the first batch dim and the queries
    elif mask_kind == "causal":
        mask, is_causal = causal_mask(t_q, t_k), True
    out, weights = scaled_dot_product_attention(q, k, v, mask)
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, attn_mask=None if is_causal else mask)
    torch.testing.assert_close(out, expected, rtol=0, atol=TOL[dtype])
    assert out.shape == (*batch, t_q, d_v) and weights.shape == (*batch, t_q, t_k)


@pytest.mark.parametrize("case", CASES)
def test_scratch_matches_numpy_reference_in_float64(case):
    batch, t_q, t_k, d_k, d_v, mask_kind = CASES[case]
    q, k, v = random_qkv(batch, t_q, t_k, d_k, d_v, torch.float64)
    mask = None if mask_kind is None else random_mask((*batch, t_q, t_k), fully_masked_rows=True)
    out, weights = scaled_dot_product_attention(q, k, v, mask)
    ref_out, ref_weights = numpy_ref.scaled_dot_product_attention(
        q.numpy(), k.numpy(), v.numpy(), None if mask is None else mask.numpy()
    )
    np.testing.assert_allclose(out.numpy(), ref_out, rtol=0, atol=1e-10)
    np.testing.assert_allclose(weights.numpy(), ref_weights, rtol=0, atol=1e-10)


def test_weights_are_the_softmax_of_scaled_scores():
    q, k, v = random_qkv(dtype=torch.float64)
    _, weights = scaled_dot_product_attention(q, k, v)
    scores = torch.einsum("...td,...sd->...ts", q, k) / q.shape[-1] ** 0.5
    torch.testing.assert_close(weights, scores.exp() / scores.exp().sum(-1, keepdim=True), rtol=0, atol=1e-12)


FAST_CASES = {  # name: (Tq, Tk, mask kind, is_causal)
    "no_mask": (5, 5, None, False),
    "random_mask_with_empty_rows": (4, 6, "random", False),
    "causal_square": (5, 5, None, True),
    "causal_tq_lt_tk": (3, 7, None, True),
    "causal_tq_gt_tk": (6, 3, None, True),  # the first queries may attend nothing: zero rows
    "causal_and_mask": (5, 5, "random", True),
}


@pytest.mark.parametrize("case", FAST_CASES)
def test_sdpa_fast_matches_scratch(case):
    t_q, t_k, mask_kind, is_causal = FAST_CASES[case]
    q, k, v = random_qkv((2, 3), t_q, t_k)
    mask = None if mask_kind is None else random_mask((2, 3, t_q, t_k), fully_masked_rows=True)
    scratch_mask = mask
    if is_causal:
        scratch_mask = causal_mask(t_q, t_k) if mask is None else mask & causal_mask(t_q, t_k)
    expected, _ = scaled_dot_product_attention(q, k, v, scratch_mask)
    out = sdpa_fast(q, k, v, mask, is_causal=is_causal)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-5)


def test_fully_masked_rows_give_zero_weights_zero_output_and_finite_gradients():
    q, k, v = (x.requires_grad_() for x in random_qkv(dtype=torch.float64))
    mask = random_mask((2, 3, 4, 6))
    mask[0, 1, 2] = False
    mask[1, 0] = False
    for attend in (scaled_dot_product_attention, lambda *args: (sdpa_fast(*args), None)):
        out, weights = attend(q, k, v, mask)
        assert torch.equal(out[0, 1, 2], torch.zeros(7, dtype=torch.float64))
        assert torch.equal(out[1, 0], torch.zeros(4, 7, dtype=torch.float64))
        if weights is not None:
            assert torch.equal(weights[0, 1, 2], torch.zeros(6, dtype=torch.float64))
        out.sum().backward()
        assert all(torch.isfinite(x.grad).all() for x in (q, k, v))
        q.grad = k.grad = v.grad = None


def test_masked_softmax_of_a_fully_masked_row_is_zero():
    scores = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[True, False, True], [False, False, False]])
    weights = masked_softmax(scores, mask)
    torch.testing.assert_close(weights[0], torch.softmax(torch.tensor([1.0, -float("inf"), 3.0]), -1))
    assert torch.equal(weights[1], torch.zeros(3))
    torch.testing.assert_close(masked_softmax(scores), torch.softmax(scores, -1))


def test_dropout_drops_weights_and_rescales_the_rest():
    q, k, v = random_qkv(dtype=torch.float64)
    _, weights = scaled_dot_product_attention(q, k, v)
    torch.manual_seed(0)
    out, dropped = scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    assert (dropped == 0).any()
    kept = dropped != 0
    torch.testing.assert_close(dropped[kept], weights[kept] / 0.5)
    torch.testing.assert_close(out, dropped @ v)


def test_sdpa_fast_dropout_is_seeded():
    q, k, v = random_qkv()
    torch.manual_seed(1)
    first = sdpa_fast(q, k, v, dropout_p=0.5)
    torch.manual_seed(1)
    torch.testing.assert_close(sdpa_fast(q, k, v, dropout_p=0.5), first)
    assert not torch.allclose(first, sdpa_fast(q, k, v))
