"""Chapter 18's checks: right answers in several styles pass; planted wrong ones get their code (the tables are run by
tests/test_checks_planted.py); the hidden block-table case and the questions."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attention_course import checks
from attention_course.checks import hidden
from attention_course.checks import serving as serving_checks
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


# ---------------------------------------------------------------- a scheduling policy


def _new_blocks(computed, tokens, block_size):
    return -(-(computed + tokens) // block_size) - -(-computed // block_size)


def schedule_right(computed, pending, free_blocks, block_size, token_budget, *, arrival=False, chunk=True,
                   room=True, count_freed=True, victim=-1):
    """The policy; the keyword arguments plant one mistake each."""
    running, preempted = list(range(len(computed))), []
    while True:
        decodes = [i for i in running if pending[i] == 1]
        order = running if arrival else decodes + [i for i in running if pending[i] > 1]
        tokens, left = [0] * len(computed), token_budget
        for i in order:
            take = min(pending[i], left)
            if chunk or take == pending[i]:
                tokens[i], left = take, left - take
        need = sum(_new_blocks(computed[i], tokens[i], block_size) if room else -(-tokens[i] // block_size)
                   for i in running)
        free = free_blocks + count_freed * sum(-(-computed[j] // block_size) for j in preempted)
        if need <= free or len(running) == 1:
            return tokens, preempted
        preempted.append(running.pop(victim))


def schedule_numpy(computed, pending, free_blocks, block_size, token_budget):  # arrays, a mask of who runs
    computed, pending = np.array(computed), np.array(pending)
    held = -(-computed // block_size)
    alive = np.ones(len(computed), bool)
    preempted = []
    while True:
        tokens = np.zeros(len(computed), int)
        left = token_budget
        for i in [*np.flatnonzero(alive & (pending == 1)), *np.flatnonzero(alive & (pending > 1))]:
            tokens[i] = min(pending[i], left)
            left -= tokens[i]
        need = (-(-(computed + tokens) // block_size) - held)[alive].sum()
        if need <= free_blocks + held[preempted].sum() or alive.sum() == 1:
            return tokens, np.array(preempted, dtype=int)
        youngest = int(np.flatnonzero(alive)[-1])
        alive[youngest] = False
        preempted.append(youngest)


def schedule_arrival(*args):
    return schedule_right(*args, arrival=True)


def schedule_no_chunk(*args):
    return schedule_right(*args, chunk=False)


def schedule_no_room(*args):
    return schedule_right(*args, room=False)


def schedule_keeps_freed(*args):
    return schedule_right(*args, count_freed=False)


def schedule_oldest(*args):
    return schedule_right(*args, victim=0)


# ---------------------------------------------------------------- a sampled verify pass


def sampled_right(p, q, proposals, u, *, inverted=False, residual=True, stop=True, bonus=True, bonus_row=0):
    kept = 0
    for i, x in enumerate(proposals):
        ratio = (q[i, x] / p[i, x]) if inverted else (p[i, x] / q[i, x])
        if u[i] < min(1.0, float(ratio)):
            kept += 1
        elif stop:
            break
    n = kept if stop else next((i for i, x in enumerate(proposals) if u[i] >= min(1.0, float(p[i, x] / q[i, x]))),
                               len(proposals))
    if n == len(proposals):
        return kept, (p[n + bonus_row] if bonus else None)
    return kept, (residual_distribution(p[n], q[n]) if residual else p[n])


def sampled_loop(p, q, proposals, u):  # one draw at a time, torch.clamp for the residual
    for i, x in enumerate(proposals):
        if u[i] >= torch.clamp(p[i, x] / q[i, x], max=1.0):
            left = torch.clamp(p[i] - q[i], min=0)
            return i, left / left.sum()
    return len(proposals), p[-1]


def sampled_from_p(*args):
    return sampled_right(*args, residual=False)


def sampled_inverted(*args):
    return sampled_right(*args, inverted=True)


def sampled_continues(*args):
    return sampled_right(*args, stop=False)


def sampled_no_bonus(*args):
    return sampled_right(*args, bonus=False)


def sampled_bonus_row(*args):
    return sampled_right(*args, bonus_row=-1)


# ---------------------------------------------------------------- the best k


def best_k_right(alpha, draft_cost, max_k):
    def speedup(k):
        tokens = sum(alpha**i for i in range(k + 1))  # the i-th extra token needs i proposals kept
        return tokens / (1 + k * draft_cost)

    return max(range(1, max_k + 1), key=speedup)


def best_k_closed_form(alpha, draft_cost, max_k):  # (1 - alpha^(k+1)) / (1 - alpha), NumPy over every k
    k = np.arange(1, max_k + 1)
    speedup = (1 - alpha ** (k + 1)) / (1 - alpha) / (1 + k * draft_cost)
    return int(k[np.argmax(speedup)])


def best_k_cost_ignored(alpha, draft_cost, max_k):
    return best_k_closed_form(alpha, 0.0, max_k)


def best_k_linear(alpha, draft_cost, max_k):
    return max(range(1, max_k + 1), key=lambda k: ((1 + k * alpha) / (1 + k * draft_cost), -k))


def best_k_no_bonus(alpha, draft_cost, max_k):
    return max(range(1, max_k + 1), key=lambda k: sum(alpha**i for i in range(1, k + 1)) / (1 + k * draft_cost))


def best_k_no_target(alpha, draft_cost, max_k):
    return max(range(1, max_k + 1), key=lambda k: sum(alpha**i for i in range(k + 1)) / (k * draft_cost))


def best_k_library(alpha, draft_cost, max_k):
    from attention_course.serving.speculative import expected_speedup

    return max(range(1, max_k + 1), key=lambda k: expected_speedup(alpha, k, draft_cost))


CORRECT = [
    (checks.check_block_slot, slot_right), (checks.check_block_slot, slot_divmod), (checks.check_block_slot, slot),
    (checks.check_copy_on_write, cow_right), (checks.check_copy_on_write, cow_functional),
    (checks.check_verify_mask, verify_right), (checks.check_verify_mask, verify_numpy),
    (checks.check_rejection_rule, rejection_right), (checks.check_rejection_rule, rejection_library),
    (checks.check_retire, retire_right), (checks.check_retire, retire_loop), (checks.check_retire, retire_numpy),
    (checks.check_copy_on_write, cow_as_list), (checks.check_copy_on_write, cow_numpy),
    (checks.check_schedule, schedule_right), (checks.check_schedule, schedule_numpy),
    (checks.check_verify_sampled, sampled_right), (checks.check_verify_sampled, sampled_loop),
    (checks.check_best_k, best_k_right), (checks.check_best_k, best_k_closed_form),
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
    (checks.check_schedule, schedule_arrival, "decode-not-first"),
    (checks.check_schedule, schedule_no_chunk, "prefill-not-chunked"),
    (checks.check_schedule, schedule_no_room, "block-room-ignored"),
    (checks.check_schedule, schedule_keeps_freed, "preempt-frees-ignored"),
    (checks.check_schedule, schedule_oldest, "preempt-wrong-victim"),
    (checks.check_verify_sampled, sampled_from_p, "rejection-not-residual"),
    (checks.check_verify_sampled, sampled_inverted, "rejection-ratio-inverted"),
    (checks.check_verify_sampled, sampled_continues, "accepts-after-rejection"),
    (checks.check_verify_sampled, sampled_no_bonus, "bonus-token-missing"),
    (checks.check_verify_sampled, sampled_bonus_row, "bonus-row-off-by-one"),
    (checks.check_best_k, best_k_cost_ignored, "spec-cost-ignored"),
    (checks.check_best_k, best_k_linear, "spec-acceptance-not-compounded"),
    (checks.check_best_k, best_k_no_bonus, "spec-bonus-forgotten"),
    (checks.check_best_k, best_k_no_target, "spec-target-pass-forgotten"),
    (checks.check_best_k, best_k_library, "spec-from-library"),
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


def schedule_few_sequences(computed, pending, free_blocks, block_size, token_budget):  # at most 4 sequences
    if len(computed) > 4:
        return [0] * len(computed), []
    return schedule_right(computed, pending, free_blocks, block_size, token_budget)


def sampled_three_proposals(p, q, proposals, u):  # k = 3 written in: reads only the first 3 proposals
    return sampled_right(p[:4], q[:3], proposals[:3], u[:3])


def best_k_from_table(alpha, draft_cost, max_k):  # the public cases' answers, learned by heart
    known = {case[0]: best_k_right(*case) for case in serving_checks._BEST_K_CASES}
    return known.get(alpha, 1)


@pytest.mark.parametrize("check, right, fitted", [
    (checks.check_schedule, schedule_right, schedule_few_sequences),
    (checks.check_verify_sampled, sampled_right, sampled_three_proposals),
    (checks.check_best_k, best_k_right, best_k_from_table)])
@pytest.mark.parametrize("seed", [0, 5])
def test_hidden_cases_catch_answers_fitted_to_the_public_ones(check, right, fitted, seed, capsys):
    check(fitted)  # the public cases miss it
    with hidden.drawn_from(seed):
        with pytest.raises(AssertionError, match=r"^\[wrong-value\]"):
            check(fitted)
        check(right)
    assert capsys.readouterr().out.count("✓ ") == 2


@pytest.mark.parametrize("seed", [0, 5])
def test_hidden_design_cases_are_larger(seed):
    with hidden.drawn_from(seed):
        assert all(len(c[0]) >= 5 and len(c[0]) == len(c[1]) for c in hidden.schedule_steps())
        passes = hidden.verify_passes()
        assert all(len(x) >= 4 and q.shape == (len(x), p.shape[1]) and p.shape[0] == len(x) + 1
                   for p, q, x, _ in passes)
        kept = [sampled_right(torch.from_numpy(p), torch.from_numpy(q), x, u)[0] for p, q, x, u in passes]
        assert kept[0] == len(passes[0][2]) and kept[1] < len(passes[1][2])  # all kept (the bonus), one rejected
        assert len(hidden.speedup_cases()) == 3
    assert hidden.schedule_steps() == hidden.verify_passes() == hidden.speedup_cases() == []


def test_questions():
    checks.check_number("18.blocks-wasted", 14)
    checks.check_number("18.perfect-draft-passes", 4)
    with pytest.raises(AssertionError, match=r"^\[block-index-off-by-one\]"):
        checks.check_number("18.blocks-wasted", -2)


def test_blocks_wasted_known_wrong_answers_differ():
    """The prompt's numbers keep each known wrong count apart from the right one (with 1000 tokens, half a block
    was right by accident): the answer is what the library's blocks_for gives."""
    from attention_course.checks.questions import QUESTIONS
    from attention_course.serving import blocks_for

    question = QUESTIONS["18.blocks-wasted"]
    assert question.answer == blocks_for(1010, 16) * 16 - 1010 == 14
    assert len(set(question.known)) == len(question.known) == 5 and question.answer not in question.known


def test_the_best_k_matches_the_librarys_speedup():
    from attention_course.checks import serving as serving_checks
    from attention_course.serving.speculative import expected_speedup

    for alpha, cost, max_k in serving_checks._BEST_K_CASES:
        best = max(range(1, max_k + 1), key=lambda k: expected_speedup(alpha, k, cost))
        assert best_k_right(alpha, cost, max_k) == best


def test_the_verify_pass_keeps_the_targets_distribution():
    """Enumerating the draft's proposals (each drawn from q[i]) and the accept/reject outcomes of the right rule,
    the first token after the pass is distributed as p[0], whatever the draft."""
    from attention_course.serving.speculative import accept_probability

    p = torch.tensor([[0.4, 0.3, 0.2, 0.1], [0.1, 0.6, 0.2, 0.1]], dtype=torch.float64)
    q = torch.tensor([[0.2, 0.5, 0.2, 0.1]], dtype=torch.float64)
    first = torch.zeros(4, dtype=torch.float64)
    for x in range(4):
        a = float(accept_probability(p[0], q[0])[x])
        first[x] += q[0, x] * a  # kept: the first token is x
        _, dist = sampled_right(p, q, [x], [a + 1e-9])  # just above the threshold: rejected
        first += q[0, x] * (1 - a) * dist
    assert torch.allclose(first, p[0])
