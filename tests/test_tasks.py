"""Task generators of chapter 12: seeded, correct targets, varying copy offsets, clear errors."""

import numpy as np
import pytest
import torch

from attention_course.tasks import repeated_segment_batch, reversal_batch, shift_batch, sorting_batch


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def test_same_seed_same_batch_and_other_seed_differs():
    a, b, c = reversal_batch(8, 12, gen(1)), reversal_batch(8, 12, gen(1)), reversal_batch(8, 12, gen(2))
    assert torch.equal(a[0], b[0]) and not torch.equal(a[0], c[0])


def test_seq2seq_targets_against_numpy():
    for batch_fn, reference in (
        (reversal_batch, lambda d: d[:, ::-1]),
        (lambda *a: shift_batch(*a, shift=3), lambda d: np.roll(d, -3, axis=1)),
        (sorting_batch, lambda d: np.sort(d, axis=1)),
    ):
        digits, target = batch_fn(16, 9, gen())
        assert digits.shape == target.shape == (16, 9)
        assert digits.min() >= 0 and digits.max() <= 9
        np.testing.assert_array_equal(target.numpy(), reference(digits.numpy()))


def test_shift_reads_position_i_plus_shift():
    digits, target = shift_batch(2, 7, gen(), shift=2)
    assert target[0, 0] == digits[0, 2] and target[0, 6] == digits[0, 1]


def reference_copy(ids, copy_target):
    """For each example, find the copy from the mask and check it in plain Python; return the offsets."""
    offsets = []
    for row, mask in zip(ids.tolist(), copy_target.tolist(), strict=True):
        where = [t for t, m in enumerate(mask) if m]
        first, last = where[0], where[-1] + 1  # the copy is ids[first : last + 1]
        length = last - first + 1
        assert row[first : last + 1] == row[first - length : first]
        offsets.append(length)
    return offsets


def test_repeated_segment_copies_and_mask():
    ids, copy_target = repeated_segment_batch(200, 24, 30, gen(), min_segment=3, max_segment=10)
    assert ids.shape == copy_target.shape == (200, 24) and copy_target.dtype == torch.bool
    offsets = reference_copy(ids, copy_target)
    assert min(offsets) >= 3 and max(offsets) <= 10
    assert len(set(offsets)) == 8  # every length in [3, 10]: the copy offset varies per example
    starts = copy_target.float().argmax(dim=1)
    assert len(set(starts.tolist())) > 10  # and so does where the copy starts


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"batch_size": 0}, ValueError, "batch_size"),
        ({"seq_len": 2.5}, TypeError, "seq_len"),
        ({"min_segment": 1}, ValueError, "min_segment"),
        ({"max_segment": 13}, ValueError, "max_segment"),
        ({"generator": 0}, TypeError, "generator"),
    ],
)
def test_repeated_segment_errors(kwargs, error, match):
    args = {"batch_size": 2, "seq_len": 24, "vocab_size": 10, "generator": gen()} | kwargs
    with pytest.raises(error, match=match):
        repeated_segment_batch(**args)


def test_digit_task_errors():
    with pytest.raises(ValueError, match="length"):
        reversal_batch(2, 0, gen())
    with pytest.raises(TypeError, match="shift"):
        shift_batch(2, 5, gen(), shift=1.0)
    with pytest.raises(TypeError, match="generator"):
        sorting_batch(2, 5, None)
