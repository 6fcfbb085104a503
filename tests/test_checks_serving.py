"""Chapter 18's checks: right answers in several styles pass; planted wrong ones get their code (the tables are run by
tests/test_checks_planted.py); the hidden block-table case and the questions."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attention_course import checks
from attention_course.checks import hidden
from attention_course.serving import residual_distribution, slot

# ---------------------------------------------------------------- block slots

def slot_right(table, position, block_size):
    return table[position // block_size] * block_size + position % block_size


def slot_divmod(table, position, block_size):
    block, offset = divmod(position, block_size)
    return int(np.int64(table[block]) * block_size + offset)


def slot_off_by_one(table, position, block_size):
    return table[position // block_size + 1] * block_size + position % block_size


def slot_contiguous(table, position, block_size):
    return position


def slot_not_scaled(table, position, block_size):
    return table[position // block_size] + position % block_size


# ---------------------------------------------------------------- copy-on-write

def cow_right(table, index, refs, free):
    old = table[index]
    if refs[old] > 1:
        new = free.pop()
        table[index] = new
        refs[new] = 1
        refs[old] -= 1
    return table, refs, free


def cow_functional(table, index, refs, free):
    old = table[index]
    if refs[old] == 1:
        return list(table), list(refs), list(free)
    new = free[-1]
    refs = [1 if b == new else n - 1 if b == old else n for b, n in enumerate(refs)]
    return table[:index] + [new] + table[index + 1:], refs, free[:-1]


def cow_frees_shared(table, index, refs, free):
    old = table[index]
    if refs[old] > 1:
        new = free.pop()
        table[index], refs[new], refs[old] = new, 1, 0
        free.append(old)  # BUG: another sequence still holds it
    return table, refs, free


def cow_in_place(table, index, refs, free):
    return table, refs, free


def cow_leaks(table, index, refs, free):
    old = table[index]
    if refs[old] > 1:
        new = free.pop()
        table[index], refs[new] = new, 1
    return table, refs, free


# ---------------------------------------------------------------- verify mask

def verify_right(num_cached, k):
    return torch.ones(k + 1, num_cached + k + 1, dtype=torch.bool).tril(num_cached)


def verify_numpy(num_cached, k):
    i = np.arange(k + 1)[:, None]
    j = np.arange(num_cached + k + 1)[None, :]
    return j <= i + num_cached


def verify_top_left(num_cached, k):
    return torch.ones(k + 1, num_cached + k + 1, dtype=torch.bool).tril()


def verify_all(num_cached, k):
    return torch.ones(k + 1, num_cached + k + 1, dtype=torch.bool)


def verify_square(num_cached, k):
    return torch.ones(k + 1, k + 1, dtype=torch.bool).tril()


# ---------------------------------------------------------------- rejection rule

def rejection_right(p, q, x, u):
    if u < min(1.0, float(p[x] / q[x])):
        return x
    r = torch.clamp(p - q, min=0)
    return r / r.sum()


def rejection_library(p, q, x, u):
    return x if u * q[x] < p[x] else residual_distribution(p, q).numpy()


def rejection_from_p(p, q, x, u):
    return x if u < min(1.0, float(p[x] / q[x])) else p


def rejection_inverted(p, q, x, u):
    if u < min(1.0, float(q[x] / p[x])):
        return x
    r = torch.clamp(p - q, min=0)
    return r / r.sum()


def rejection_always(p, q, x, u):
    return x


# ---------------------------------------------------------------- retiring

def retire_right(outputs, max_new_tokens, eos_token_id):
    pairs = enumerate(zip(outputs, max_new_tokens, strict=True))
    return [i for i, (out, n) in pairs if out[-1] != eos_token_id and len(out) < n]


def retire_numpy(outputs, max_new_tokens, eos_token_id):  # a NumPy array of the indices: right too
    import numpy as np

    ended = [(eos_token_id is not None and out[-1] == eos_token_id) or len(out) >= n
             for out, n in zip(outputs, max_new_tokens, strict=True)]
    return np.flatnonzero(~np.array(ended, dtype=bool))


def cow_as_list(table, index, refs, free):  # a list of the three lists: right too
    return list(cow_right(table, index, refs, free))


def cow_numpy(table, index, refs, free):  # NumPy arrays: right too
    import numpy as np

    return tuple(np.array(x) for x in cow_right(table, index, refs, free))


def retire_eos_truthy(outputs, max_new_tokens, eos_token_id):  # `if eos_token_id and ...`: id 0 is no end
    return [i for i, (out, n) in enumerate(zip(outputs, max_new_tokens, strict=True))
            if not ((eos_token_id and out[-1] == eos_token_id) or len(out) >= n)]


def retire_loop(outputs, max_new_tokens, eos_token_id):
    keep = []
    for i, out in enumerate(outputs):
        done = (eos_token_id is not None and out[-1] == eos_token_id) or len(out) == max_new_tokens[i]
        if not done:
            keep.append(i)
    return keep


def retire_ignores_eos(outputs, max_new_tokens, eos_token_id):
    return [i for i, (out, n) in enumerate(zip(outputs, max_new_tokens, strict=True)) if len(out) < n]


def retire_ignores_limit(outputs, max_new_tokens, eos_token_id):
    return [i for i, out in enumerate(outputs) if out[-1] != eos_token_id]


def retire_early(outputs, max_new_tokens, eos_token_id):
    pairs = enumerate(zip(outputs, max_new_tokens, strict=True))
    return [i for i, (out, n) in pairs if out[-1] != eos_token_id and len(out) < n - 1]


CORRECT = [
    (checks.check_block_slot, slot_right), (checks.check_block_slot, slot_divmod), (checks.check_block_slot, slot),
    (checks.check_copy_on_write, cow_right), (checks.check_copy_on_write, cow_functional),
    (checks.check_verify_mask, verify_right), (checks.check_verify_mask, verify_numpy),
    (checks.check_rejection_rule, rejection_right), (checks.check_rejection_rule, rejection_library),
    (checks.check_retire, retire_right), (checks.check_retire, retire_loop), (checks.check_retire, retire_numpy),
    (checks.check_copy_on_write, cow_as_list), (checks.check_copy_on_write, cow_numpy),
]

PLANTED = [
    (checks.check_block_slot, slot_off_by_one, "block-index-off-by-one"),
    (checks.check_block_slot, slot_contiguous, "slot-ignores-table"),
    (checks.check_block_slot, slot_not_scaled, "slot-block-not-scaled"),
    (checks.check_copy_on_write, cow_frees_shared, "shared-block-freed"),
    (checks.check_copy_on_write, cow_in_place, "cow-no-copy"),
    (checks.check_copy_on_write, cow_leaks, "cow-refs-not-moved"),
    (checks.check_verify_mask, verify_top_left, "verify-mask-top-left"),
    (checks.check_verify_mask, verify_all, "verify-mask-sees-future"),
    (checks.check_verify_mask, verify_square, "verify-mask-drops-cache"),
    (checks.check_rejection_rule, rejection_from_p, "rejection-not-residual"),
    (checks.check_rejection_rule, rejection_inverted, "rejection-ratio-inverted"),
    (checks.check_rejection_rule, rejection_always, "rejection-always-accepts"),
    (checks.check_retire, retire_ignores_eos, "finished-left-in-batch"),
    (checks.check_retire, retire_ignores_limit, "finished-left-in-batch"),
    (checks.check_retire, retire_early, "retired-too-early"),
    (checks.check_retire, retire_eos_truthy, "eos-zero-ignored"),
]


def test_messages_name_the_case():
    with pytest.raises(AssertionError, match=r"(?s)\[block-index-off-by-one\] .*Failing case: slot_off_by_one\(\[3, 0"):
        checks.check_block_slot(slot_off_by_one)


def test_unknown_wrong_answer_gets_wrong_value():
    with pytest.raises(AssertionError, match=r"^\[wrong-value\]"):
        checks.check_retire(lambda outputs, max_new_tokens, eos_token_id: [0])
    with pytest.raises(AssertionError, match=r"^\[wrong-type\]"):
        checks.check_verify_mask(lambda num_cached, k: torch.ones(k + 1, num_cached + k + 1))


@pytest.mark.parametrize("seed", [0, 5])
def test_hidden_block_tables(seed, capsys):
    def works_for_small_tables_only(table, position, block_size):  # a table of at most 4 blocks
        return slot_right(table, position, block_size) if position // block_size < 4 else 0

    checks.check_block_slot(works_for_small_tables_only)  # the public cases miss it
    capsys.readouterr()
    hidden.enable(seed)
    try:
        with pytest.raises(AssertionError, match=r"^\[wrong-value\]"):
            checks.check_block_slot(works_for_small_tables_only)
        checks.check_block_slot(slot_right)
    finally:
        hidden.disable()


def test_questions():
    checks.check_number("18.blocks-wasted", 8)
    checks.check_number("18.perfect-draft-passes", 4)
    with pytest.raises(AssertionError, match=r"^\[block-index-off-by-one\]"):
        checks.check_number("18.blocks-wasted", 7)
