"""split_heads / merge_heads: head h owns features h*Dh .. (h+1)*Dh - 1; merge inverts split."""

import numpy as np
import pytest
import torch

from attention_course import merge_heads, numpy_ref, split_heads


@pytest.mark.parametrize("num_heads", [1, 2, 3, 6])
def test_split_heads_matches_reference_and_column_blocks(num_heads):
    x = torch.randn(2, 5, 6, dtype=torch.float64)
    heads = split_heads(x, num_heads)
    dh = 6 // num_heads
    assert heads.shape == (2, num_heads, 5, dh)
    np.testing.assert_array_equal(heads.numpy(), numpy_ref.split_heads(x.numpy(), num_heads))
    for h in range(num_heads):
        assert torch.equal(heads[:, h], x[:, :, h * dh : (h + 1) * dh])


@pytest.mark.parametrize("num_heads", [1, 2, 4])
def test_merge_heads_inverts_split_heads(num_heads):
    x = torch.randn(3, 4, 8)
    heads = split_heads(x, num_heads)
    assert not heads.is_contiguous() or num_heads == 1
    assert torch.equal(merge_heads(heads), x)
    np.testing.assert_array_equal(merge_heads(heads).numpy(), numpy_ref.merge_heads(heads.numpy()))


def test_split_heads_accepts_non_contiguous_input():
    x = torch.randn(5, 2, 8).transpose(0, 1)  # (B, T, D) view of a sequence-first tensor
    assert torch.equal(split_heads(x, 2), split_heads(x.contiguous(), 2))
