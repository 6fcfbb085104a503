"""Checkers of chapter 12: the solution passes, every named mistake is reported by its code."""

import pytest
import torch

from attention_course import checks
from attention_course.checks import CheckFailed
from attention_course.interpret import induction_targets, prefix_matching_score, previous_token_score


def code_of(check, fn):
    with pytest.raises(CheckFailed) as info:
        check(fn)
    return info.value.code


def score_with(targets_fn=induction_targets, reduce="sum", all_queries=False, use_mask=True):
    """A prefix-matching score with one knob turned to a known mistake."""

    def score(weights, ids, query_mask=None):
        targets = targets_fn(ids)
        on_target = (weights * targets[None, :, None]).sum(-1)
        if reduce == "mean":
            on_target = on_target / targets.sum(-1).clamp(min=1)[None, :, None]
        queries = torch.ones_like(ids, dtype=torch.bool) if all_queries else targets.any(-1)
        if query_mask is not None and use_mask:
            queries = queries & query_mask
        return on_target.transpose(2, 3)[:, queries].mean(1)

    return score


def earlier_occurrence(ids):
    targets = induction_targets(ids)
    earlier = torch.zeros_like(targets)
    earlier[..., :-1] = targets[..., 1:]
    return earlier


def including_self(ids):
    previous = torch.cat([torch.full_like(ids[:, :1], -1), ids[:, :-1]], 1)
    diagonal = torch.eye(ids.size(1), dtype=torch.bool) & (ids[:, :, None] == previous[:, None, :])
    return induction_targets(ids) | diagonal


def test_solution_passes(capsys):
    checks.check_prefix_matching_score(prefix_matching_score)
    assert "✓ prefix_matching_score: 4 random cases" in capsys.readouterr().out


@pytest.mark.parametrize(
    "fn, code",
    [
        (score_with(earlier_occurrence), "induction-off-by-one"),
        (score_with(all_queries=True), "induction-all-queries"),
        (score_with(reduce="mean"), "induction-mean-over-targets"),
        (score_with(including_self), "induction-includes-self"),
        (score_with(use_mask=False), "induction-ignores-query-mask"),
        (lambda weights, ids, query_mask=None: prefix_matching_score(weights, ids, query_mask).T, "wrong-shape"),
        (lambda weights, ids, query_mask=None: 1.01 * prefix_matching_score(weights, ids, query_mask),
         "wrong-output"),
        (lambda weights, ids, query_mask=None: None, "returned-none"),
    ],
)
def test_named_mistakes_of_the_score(fn, code):
    assert code_of(checks.check_prefix_matching_score, fn) == code


def best_by(score_fn):
    def find(weights, ids, copy_target):
        scores = score_fn(weights, ids, copy_target)
        return divmod(scores.flatten().argmax().item(), scores.size(1))

    return find


def test_find_induction_head(capsys):
    checks.check_find_induction_head(best_by(prefix_matching_score))
    assert "finds the induction head in 4 planted cases" in capsys.readouterr().out
    previous = best_by(lambda w, ids, c: previous_token_score(w) * torch.tensor([[1.0]] + [[0.0]] * 2))
    assert code_of(checks.check_find_induction_head, previous) == "found-previous-token-head"
    assert code_of(checks.check_find_induction_head, best_by(score_with(earlier_occurrence))) == \
        "found-duplicate-token-head"
    assert code_of(checks.check_find_induction_head, lambda w, ids, c: "layer 2") == "wrong-type"
    assert code_of(checks.check_find_induction_head, lambda w, ids, c: (2, 3)) == "wrong-value"


def test_shift_pattern_question(capsys):
    checks.check_choice("12.shift-pattern", "C")
    assert capsys.readouterr().out.strip()
    for letter, code in (("A", "predicted-reversal-pattern"), ("B", "predicted-identity-pattern"),
                         ("D", "predicted-uniform-pattern")):
        with pytest.raises(CheckFailed) as info:
            checks.check_choice("12.shift-pattern", letter)
        assert info.value.code == code


def test_ablate_previous_token_question(capsys):
    """B is right; A (copying lives in layer 2) and C (redundancy covers it) fail with [wrong-answer] and their own
    explanation; a letter that is not an option is invalid."""
    checks.check_choice("12.ablate-previous-token", lambda: "B")
    assert "✓ 12.ablate-previous-token: B is right" in capsys.readouterr().out
    for letter, words in (("A", "intact"), ("C", "SAME job")):
        with pytest.raises(CheckFailed) as info:
            checks.check_choice("12.ablate-previous-token", letter)
        assert info.value.code == "wrong-answer"
        assert words in str(info.value)
    with pytest.raises(CheckFailed) as info:
        checks.check_choice("12.ablate-previous-token", "D")
    assert info.value.code == "invalid-answer"


# ----------------------------------------------------------------------------------------------------------
# The registry's tables (tests/test_checks_planted.py)
# ----------------------------------------------------------------------------------------------------------


def score_by_einsum(weights, ids, query_mask=None):
    """Another style: the targets from a comparison of shifted ids, the sum as an einsum, the mean by counting."""
    t = ids.size(1)
    targets = torch.zeros(ids.size(0), t, t, dtype=torch.bool)
    targets[:, :, 1:] = ids[:, None, :-1] == ids[:, :, None]  # key j follows an earlier copy of query t's token
    targets &= torch.ones(t, t, dtype=torch.bool).tril(-1)  # 0 < j < t
    on_target = torch.einsum("lbhqk,bqk->lbhq", weights, targets.to(weights.dtype))
    queries = targets.any(-1) if query_mask is None else targets.any(-1) & query_mask
    return (on_target * queries[None, :, None]).sum((1, 3)) / queries.sum()


def find_by_loop(weights, ids, copy_target):
    """Another style: every (layer, head) scored on the copied positions, the best kept in a loop."""
    scores = prefix_matching_score(weights, ids, copy_target)
    best, where = -1.0, None
    for layer in range(scores.size(0)):
        for head in range(scores.size(1)):
            if scores[layer, head] > best:
                best, where = scores[layer, head].item(), (layer, head)
    return where


def find_with_wrong_unravel(weights, ids, copy_target):
    index = prefix_matching_score(weights, ids, copy_target).flatten().argmax().item()
    return divmod(index, weights.size(0))  # divides by the number of layers, not of heads


def find_most_diagonal(weights, ids, copy_target):
    """Picks the head that attends most to the token just before: the previous-token head."""
    return best_by(lambda w, ids, c: previous_token_score(w))(weights, ids, copy_target)


CORRECT = [
    (checks.check_prefix_matching_score, prefix_matching_score),
    (checks.check_prefix_matching_score, score_by_einsum),
    (checks.check_find_induction_head, best_by(prefix_matching_score)),
    (checks.check_find_induction_head, find_by_loop),
]
PLANTED = [
    (checks.check_prefix_matching_score, score_with(earlier_occurrence), "induction-off-by-one"),
    (checks.check_prefix_matching_score, score_with(all_queries=True), "induction-all-queries"),
    (checks.check_prefix_matching_score, score_with(reduce="mean"), "induction-mean-over-targets"),
    (checks.check_prefix_matching_score, score_with(including_self), "induction-includes-self"),
    (checks.check_prefix_matching_score, score_with(use_mask=False), "induction-ignores-query-mask"),
    (checks.check_prefix_matching_score,
     lambda weights, ids, query_mask=None: prefix_matching_score(weights, ids, query_mask).T, "wrong-shape"),
    (checks.check_find_induction_head, find_most_diagonal, "found-previous-token-head"),
    (checks.check_find_induction_head, best_by(score_with(earlier_occurrence)), "found-duplicate-token-head"),
    (checks.check_find_induction_head, lambda w, ids, c: "layer 2", "wrong-type"),
    (checks.check_find_induction_head, find_with_wrong_unravel, "wrong-value"),
]
