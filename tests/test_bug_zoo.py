"""Every bug in the zoo is diagnosed with exactly its code; the zoo is readable (docstring code, # BUG marker)."""

import inspect

import pytest

from attention_course import bug_zoo, checks


ALL = bug_zoo.ZOO + bug_zoo.SINGLE_HEAD_ZOO


@pytest.mark.parametrize("bug", ALL, ids=lambda b: b.impl.__name__)
def test_each_bug_gets_its_diagnosis(bug):
    check = getattr(checks, bug.check)
    with pytest.raises(AssertionError) as info:
        check(bug.impl)
    assert str(info.value).startswith(f"[{bug.code}] "), str(info.value)


@pytest.mark.parametrize("bug", ALL, ids=lambda b: b.impl.__name__)
def test_each_bug_is_documented_and_marked(bug):
    assert inspect.getdoc(bug.impl).startswith(f"[{bug.code}] ")
    assert "# BUG:" in inspect.getsource(bug.impl)
    assert bug.code in checks.CODES


def test_bugs_maps_codes_to_zoo_entries():
    """BUGS covers ZOO only: chapter 7 lists BUGS one by one, with a symptom for each code."""
    assert set(bug_zoo.BUGS) == {b.code for b in bug_zoo.ZOO}
    assert not set(bug_zoo.BUGS.values()) & {b.impl for b in bug_zoo.SINGLE_HEAD_ZOO}
    for code, impl in bug_zoo.BUGS.items():
        assert any(b.code == code and b.impl is impl for b in bug_zoo.ZOO)


def test_the_zoo_base_classes_are_correct(capsys):
    checks.check_multi_head_attention(bug_zoo.ZooMultiHeadAttention)
    checks.check_single_head_attention(bug_zoo.ZooSingleHeadAttention)
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("✓ ZooMultiHeadAttention: ") and out[1].startswith("✓ ZooSingleHeadAttention: ")


def test_wrong_axis_bug_also_masks():
    """Its mask branch is never reached by the check (diagnosed on the first, unmasked case): run it here."""
    import torch

    q = torch.ones(2, 3, 4)
    mask = torch.tensor([[True, False, True]] * 3)
    _, weights = bug_zoo.sdpa_softmax_wrong_axis(q, q, q, mask)
    assert torch.allclose(weights[..., 0].sum(-1), torch.ones(2))  # normalised over the queries, per key
    assert torch.isnan(weights[..., 1]).all()  # a fully masked key column: softmax over -inf only


def test_single_head_wrong_axis_bug_also_masks():
    import torch

    module = bug_zoo.SHASoftmaxWrongAxis(4, 4)
    x = torch.ones(1, 3, 4)
    _, weights = module(x, mask=torch.tensor([[True, False, True]] * 3))
    assert torch.isnan(weights[..., 1]).all()  # a fully masked key column: softmax over -inf only, per key
