"""Masks: one convention (True = may attend), bottom-right causal alignment, padding, combination."""

import numpy as np
import pytest
import torch

from attention_course import causal_mask, combine_masks, masks, numpy_ref, padding_mask


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


# ---------------------------------------------------------------- one vocabulary: functions of indices


@pytest.mark.parametrize("t_q, t_k", [(6, 6), (3, 8), (1, 5)])
def test_each_tensor_builder_equals_materialize_of_its_function(t_q, t_k):
    lengths, prefixes = torch.tensor([2, 5]), torch.tensor([0, 3])
    doc_ids = torch.tensor([[0, 0, 1, 1, 1, 2, 2, 2][:t_k] + [3] * (t_k - 8), [0] * t_k])
    cases = [(masks.causal(t_q, t_k), masks.causal_mask(t_q, t_k)),
             (masks.sliding_window(3, t_q, t_k), masks.sliding_window_mask(t_q, t_k, 3)),
             (masks.padding(lengths, t_k), masks.padding_mask(lengths, t_k)),
             (masks.prefix_lm(2, t_q, t_k), masks.prefix_lm_mask(t_q, t_k, 2)),
             (masks.prefix_lm(prefixes, t_q, t_k), masks.prefix_lm_mask(t_q, t_k, prefixes)),
             (masks.document(doc_ids, t_q), masks.document_mask(doc_ids, t_q)),
             (masks.document(doc_ids[0], t_q, is_causal=False), masks.document_mask(doc_ids[0], t_q, causal=False))]
    for mod, tensor in cases:
        assert torch.equal(masks.materialize(mod, 2, 3, t_q, t_k), tensor.expand(2, 3, t_q, t_k)), mod.__name__


def test_chunked_and_the_combinators():
    chunked = masks.materialize(masks.chunked(3, 4, 8), 1, 1, 4, 8)[0, 0]  # queries at positions 4..7
    positions, keys = torch.arange(4, 8)[:, None], torch.arange(8)
    assert torch.equal(chunked, (keys <= positions) & (keys // 3 == positions // 3))
    assert chunked[0].tolist() == [False, False, False, True, True, False, False, False]  # position 4: chunk 3..5
    both = masks.and_masks(masks.causal(4, 8), masks.padding(torch.tensor([6]), 8))
    either = masks.or_masks(masks.causal(4, 8), masks.padding(torch.tensor([6]), 8))
    causal, padded = masks.causal_mask(4, 8), masks.padding_mask(torch.tensor([6]), 8)[0]
    assert torch.equal(masks.materialize(both, 1, 1, 4, 8), (causal & padded).expand(1, 1, 4, 8))
    assert torch.equal(masks.materialize(either, 1, 1, 4, 8), (causal | padded).expand(1, 1, 4, 8))
    tensor = masks.sliding_window_mask(4, 8, 2)
    assert torch.equal(masks.materialize(masks.tensor_mod(tensor), 2, 2, 4, 8), tensor.expand(2, 2, 4, 8))
    with pytest.raises(TypeError, match="or_masks needs one or more"):
        masks.or_masks()
    with pytest.raises(ValueError, match="chunk"):
        masks.chunked(0, 4)
