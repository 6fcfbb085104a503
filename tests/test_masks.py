"""Masks: one convention (True = may attend), bottom-right causal alignment, padding, combination."""

import numpy as np
import pytest
import torch

from attention_course import causal_mask, combine_masks, numpy_ref, padding_mask


@pytest.mark.parametrize("t_q, t_k", [(1, 1), (4, 4), (3, 6), (6, 3), (1, 5)])
def test_causal_mask_follows_the_bottom_right_rule(t_q, t_k):
    mask = causal_mask(t_q, t_k)
    expected = [[j <= i + (t_k - t_q) for j in range(t_k)] for i in range(t_q)]
    assert mask.dtype == torch.bool and mask.shape == (t_q, t_k)
    assert mask.tolist() == expected
    np.testing.assert_array_equal(mask.numpy(), numpy_ref.causal_mask(t_q, t_k))


def test_square_causal_mask_is_the_lower_triangle_torch_is_causal_uses():
    assert torch.equal(causal_mask(5), torch.ones(5, 5, dtype=torch.bool).tril())


def test_last_query_sees_every_key_when_tq_is_less_than_tk():
    mask = causal_mask(2, 6)  # the last two positions of a 6-token sequence, as with a KV cache
    assert mask[-1].all()
    assert mask[0].tolist() == [True] * 5 + [False]


def test_causal_mask_device():
    assert causal_mask(3, device="cpu").device.type == "cpu"


@pytest.mark.parametrize("lengths", [[3, 5, 0], torch.tensor([3, 5, 0]), torch.tensor([3, 5, 0], dtype=torch.int32)])
def test_padding_mask(lengths):
    mask = padding_mask(lengths, 5)
    assert mask.dtype == torch.bool and mask.shape == (3, 1, 1, 5)
    assert mask[:, 0, 0].tolist() == [[True] * 3 + [False] * 2, [True] * 5, [False] * 5]
    np.testing.assert_array_equal(mask.numpy(), numpy_ref.padding_mask(np.array([3, 5, 0]), 5))


def test_combine_masks_is_a_broadcasting_and():
    causal, padding = causal_mask(4), padding_mask([2, 4], 4)
    combined = combine_masks(causal, None, padding)
    assert combined.shape == (2, 1, 4, 4)
    assert torch.equal(combined, causal & padding)
    assert not combined[0, 0, 3, 2]  # allowed by causal, hidden by padding
    assert not combined[1, 0, 0, 1]  # allowed by padding, hidden by causal


def test_combine_masks_of_nothing_is_none():
    assert combine_masks() is None
    assert combine_masks(None, None) is None


def test_combine_masks_of_one_mask_is_that_mask():
    mask = causal_mask(3)
    assert torch.equal(combine_masks(None, mask), mask)
