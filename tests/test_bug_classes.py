"""Every classic attention bug, written out, is caught by the suite's own checks, and the correct code passes them.

The check is `assert_matches_reference` (conftest.py), the comparison with the float64 NumPy reference that the
rest of the suite runs, on one standard problem; the mask-convention bugs are also run against PyTorch's own
attention. A bug that slipped through would mean a blind spot in the tests, so each test asserts both halves.
"""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import attention_course.functional as functional
import attention_course.multi_head as multi_head
from attention_course import (
    EinsumMultiHeadAttention,
    MultiHeadAttention,
    causal_mask,
    combine_masks,
    masked_softmax,
    merge_heads,
    numpy_ref,
    scaled_dot_product_attention,
    split_heads,
)

D_MODEL, NUM_HEADS, T = 8, 2, 5  # Dh = 4 != T, so scaling by the length is visible
LENGTHS = np.array([3, 5, 0])  # the last sequence is empty: every one of its queries is fully masked


def suite_check(assert_matches_reference, module, num_heads=NUM_HEADS, kdim=D_MODEL, vdim=D_MODEL):
    """The suite's parity check on the standard problem: causal attention with padding, one sequence empty."""
    rng = np.random.default_rng(0)
    params = numpy_ref.init_mha_params(D_MODEL, kdim, vdim)
    query, key, value = (rng.normal(size=(3, T, d)) for d in (D_MODEL, kdim, vdim))
    mask = numpy_ref.padding_mask(LENGTHS, T)  # (B, 1, 1, T)
    assert_matches_reference(module, params, num_heads, query, key, value, mask=mask, is_causal=True)


def assert_caught(assert_matches_reference, buggy_module, **problem):
    with pytest.raises(AssertionError):
        suite_check(assert_matches_reference, buggy_module, **problem)


# --- values taken from the key projection ---------------------------------------------------------------------


class ValuesFromKeyProjection(MultiHeadAttention):
    def forward(self, query, key=None, value=None, mask=None, is_causal=False, return_weights=False):
        key = query if key is None else key
        value = key if value is None else value
        q = split_heads(self.w_q(query), self.num_heads)
        k = split_heads(self.w_k(key), self.num_heads)
        v = split_heads(self.w_k(value), self.num_heads)  # BUG: w_k instead of w_v
        heads, weights = self.attend(q, k, v, mask, is_causal, return_weights)
        out = self.w_o(merge_heads(heads))
        return (out, weights) if return_weights else out


def test_values_from_the_key_projection(assert_matches_reference):
    suite_check(assert_matches_reference, MultiHeadAttention(D_MODEL, NUM_HEADS))
    assert_caught(assert_matches_reference, ValuesFromKeyProjection(D_MODEL, NUM_HEADS))


# --- softmax and mask bugs, patched into the library's softmax ------------------------------------------------


def softmax_over_queries(scores, mask):
    return torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-2)  # BUG: normalises over queries


def masked_with_plus_1e10(scores, mask):
    return torch.softmax(scores.masked_fill(~mask, 1e10), dim=-1)  # BUG: sign slip, masked keys take all weight


def masked_with_inverted_mask(scores, mask):
    return masked_softmax(scores, ~mask)  # BUG: reads the mask as True = NOT allowed (nn.MultiheadAttention's)


def masked_with_minus_1e9(scores, mask):
    # BUG (subtle): a finite fill gives a fully masked query uniform weights over padding instead of zeros.
    return torch.softmax(scores.masked_fill(~mask, -1e9), dim=-1)


@pytest.mark.parametrize(
    "buggy_softmax", [softmax_over_queries, masked_with_plus_1e10, masked_with_inverted_mask, masked_with_minus_1e9]
)
def test_softmax_and_mask_bugs(assert_matches_reference, monkeypatch, buggy_softmax):
    suite_check(assert_matches_reference, MultiHeadAttention(D_MODEL, NUM_HEADS))
    monkeypatch.setattr(functional, "masked_softmax", buggy_softmax)
    assert_caught(assert_matches_reference, MultiHeadAttention(D_MODEL, NUM_HEADS))


# --- a triu mask handed to SDPA: True = may attend, so it attends the future -------------------------------------


def triu_causal_mask(t_q, t_k=None, device=None):
    t_k = t_q if t_k is None else t_k
    return torch.ones(t_q, t_k, dtype=torch.bool, device=device).triu(diagonal=1)  # BUG: the future, not the past


def test_triu_mask_in_the_module(assert_matches_reference, monkeypatch):
    suite_check(assert_matches_reference, MultiHeadAttention(D_MODEL, NUM_HEADS))
    monkeypatch.setattr(functional, "causal_mask", triu_causal_mask)  # the module's is_causal goes through attend
    assert_caught(assert_matches_reference, MultiHeadAttention(D_MODEL, NUM_HEADS))


def test_triu_mask_handed_to_torch_sdpa():
    q, k, v = torch.randn(3, 2, T, 4, dtype=torch.float64).unbind(0)
    expected, _ = numpy_ref.scaled_dot_product_attention(q.numpy(), k.numpy(), v.numpy(), numpy_ref.causal_mask(T))
    right = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_mask(T))
    wrong = F.scaled_dot_product_attention(q, k, v, attn_mask=triu_causal_mask(T))  # the nn.MHA-style mask
    np.testing.assert_allclose(right.numpy(), expected, rtol=0, atol=1e-10)
    with pytest.raises(AssertionError):
        np.testing.assert_allclose(wrong.numpy(), expected, rtol=0, atol=1e-10)


def test_our_mask_handed_to_nn_multihead_attention_without_inverting():
    ours = MultiHeadAttention(D_MODEL, NUM_HEADS).eval()
    theirs = ours.to_torch()
    x = torch.randn(2, T, D_MODEL)
    with torch.no_grad():
        expected = ours(x, is_causal=True)
        right, _ = theirs(x, x, x, attn_mask=~causal_mask(T))
        wrong, _ = theirs(x, x, x, attn_mask=causal_mask(T))  # BUG: nn.MultiheadAttention's True = NOT allowed
    torch.testing.assert_close(right, expected, rtol=0, atol=1e-5)
    with pytest.raises(AssertionError):
        torch.testing.assert_close(wrong, expected, rtol=0, atol=1e-5)


# --- scaling by the sequence length instead of sqrt(d_k) ---------------------------------------------------------


def attend_scaled_by_length(q, k, v, mask=None, **options):
    return functional._attend(q, k, v, mask, **options, scale=1 / math.sqrt(k.size(-2)))  # BUG: sqrt(Tk)


def test_scaling_by_sequence_length(assert_matches_reference, monkeypatch):
    suite_check(assert_matches_reference, MultiHeadAttention(D_MODEL, NUM_HEADS))
    monkeypatch.setattr(multi_head, "_attend", attend_scaled_by_length)
    assert_caught(assert_matches_reference, MultiHeadAttention(D_MODEL, NUM_HEADS))


# --- heads split with reshape but no transpose ---------------------------------------------------------------------


def split_heads_without_transpose(x, num_heads):
    b, t, d = x.shape
    return x.reshape(b, num_heads, t, d // num_heads)  # BUG: cuts the (T, D) block, mixing positions and features


def merge_heads_without_transpose(x):
    b, h, t, dh = x.shape
    return x.reshape(b, t, h * dh)


def test_heads_split_without_transpose(assert_matches_reference, monkeypatch):
    suite_check(assert_matches_reference, MultiHeadAttention(D_MODEL, NUM_HEADS))
    monkeypatch.setattr(multi_head, "_split_heads", split_heads_without_transpose)
    monkeypatch.setattr(multi_head, "_merge_heads", merge_heads_without_transpose)
    assert_caught(assert_matches_reference, MultiHeadAttention(D_MODEL, NUM_HEADS))
    # With one head the bug is invisible: that is why the suite runs several head counts.
    suite_check(assert_matches_reference, MultiHeadAttention(D_MODEL, 1), num_heads=1)


# --- an einsum weight layout that only works when d_in == d_out -----------------------------------------------------


class EinsumSquareOnly(EinsumMultiHeadAttention):
    def __init__(self, d_model, num_heads, kdim=None, vdim=None):
        super().__init__(d_model, num_heads, kdim=kdim, vdim=vdim)
        # BUG: w_k and w_v copy-pasted from w_q: (D, H, Dh) instead of (kdim, H, Dh) and (vdim, H, Dh)
        self.w_k = nn.Parameter(torch.empty(d_model, num_heads, self.head_dim))
        self.w_v = nn.Parameter(torch.empty(d_model, num_heads, self.head_dim))


def test_einsum_layout_that_needs_d_in_equal_d_out(assert_matches_reference):
    correct = EinsumMultiHeadAttention(D_MODEL, NUM_HEADS, kdim=6, vdim=10)
    suite_check(assert_matches_reference, correct, kdim=6, vdim=10)
    # Hidden while every width is d_model: that is why the suite also runs kdim, vdim != d_model ...
    suite_check(assert_matches_reference, EinsumSquareOnly(D_MODEL, NUM_HEADS))
    # ... where the check cannot even load the weights.
    with pytest.raises(RuntimeError):
        buggy = EinsumSquareOnly(D_MODEL, NUM_HEADS, kdim=6, vdim=10)
        suite_check(assert_matches_reference, buggy, kdim=6, vdim=10)


# --- dropout left on at evaluation ----------------------------------------------------------------------------------


class DropoutAlwaysOn(MultiHeadAttention):
    def attend(self, q, k, v, mask, is_causal, return_weights):
        mask = combine_masks(mask, causal_mask(q.size(-2), k.size(-2))) if is_causal else mask
        return scaled_dot_product_attention(q, k, v, mask, dropout_p=self.dropout)  # BUG: ignores self.training


def test_dropout_left_on_at_eval(assert_matches_reference):
    suite_check(assert_matches_reference, MultiHeadAttention(D_MODEL, NUM_HEADS, dropout=0.1))
    torch.manual_seed(0)
    assert_caught(assert_matches_reference, DropoutAlwaysOn(D_MODEL, NUM_HEADS, dropout=0.1))
