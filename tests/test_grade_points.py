"""Points (attention_course.course.points): the defaults per level, the instructor's points file and its errors, the
score of a check whose public cases pass and a hidden case fails, and which checkers have hidden cases (read from the
checks' source, proven against what each checker draws when it runs a right answer). No notebook is graded here."""

import inspect
from pathlib import Path

import pytest

import test_checks_planted
from attention_course.checks import hidden
from attention_course.course import points as pts
from attention_course.course.cli import reference_exercises

GOOD = """
hidden_share = 0.4

[levels]
core = 5

[notebooks.01_soft_lookup_exercises]
1 = 4
5 = { points = 6, hidden_share = 0.25 }
"""


def test_defaults_come_from_the_level():
    p = pts.Points()
    assert [p.of("any", 1, level) for level in ("warm-up", "core", "challenge")] == [(1, 0.5), (2, 0.5), (3, 0.5)]


def test_points_file_overrides_levels_shares_and_exercises(tmp_path):
    path = tmp_path / "points.toml"
    path.write_text(GOOD, encoding="utf-8")
    p = pts.Points.load(path)
    assert p.of("01_soft_lookup_exercises", 1, "warm-up") == (4, 0.4)
    assert p.of("01_soft_lookup_exercises.ipynb", 5, "challenge") == (6, 0.25)
    assert p.of("ada_01_soft_lookup_exercises", 5, "challenge") == (6, 0.25)  # a prefixed copy: same overrides
    assert p.of("01_soft_lookup_exercises", 3, "core") == (5, 0.4)  # the [levels] table
    assert p.of("02_single_head_exercises", 1, "warm-up") == (1, 0.4)
    p.validate({"01_soft_lookup_exercises": {1, 2, 3, 4, 5}})


@pytest.mark.parametrize("text, message", [
    ("bonus = 1", "unknown key(s) bonus"),
    ("[levels]\neasy = 1", "[levels]: unknown level 'easy'"),
    ("[levels]\ncore = -1", "[levels] core: expected a non-negative number, got -1"),
    ("[levels]\ncore = 'two'", "[levels] core: expected a non-negative number, got 'two'"),
    ("hidden_share = 1.5", "hidden_share: expected a number from 0 to 1, got 1.5"),
    ("[notebooks.x]\nfirst = 1", "[notebooks.x]: 'first' is not an exercise number"),
    ("[notebooks.x]\n1 = { points = 2, weight = 3 }", "[notebooks.x] 1: unknown key(s) weight"),
    ("[notebooks.x]\n1 = { hidden_share = -0.1 }", "[notebooks.x] 1 hidden_share: expected a number from 0 to 1"),
    ("[notebooks.x\n1 = 2", "not valid TOML"),
])
def test_a_bad_points_file_is_refused_naming_the_key(tmp_path, text, message):
    path = tmp_path / "points.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(pts.PointsError) as info:
        pts.Points.load(path)
    assert str(info.value).startswith(f"points file {path}") and message in str(info.value), info.value


def test_points_file_is_checked_against_the_reference_notebooks(tmp_path):
    refs = reference_exercises(Path(__file__).parent / "data" / "grader" / "solutions")
    assert refs == {"01_soft_lookup_exercises": {1, 2, 3, 4, 5}}
    for text, message in (("[notebooks.02_single_head_exercises]\n1 = 2", "no reference notebook of that name "
                                                                           "(known: 01_soft_lookup_exercises)"),
                          ("[notebooks.01_soft_lookup_exercises]\n9 = 2", "9: no such exercise (the notebook has "
                                                                          "1, 2, 3, 4, 5)")):
        with pytest.raises(pts.PointsError, match=r".*") as info:
            pts.Points.from_dict(pts.tomllib.loads(text), "p.toml").validate(refs)
        assert message in str(info.value)
    with pytest.raises(pts.PointsError, match="cannot read it"):
        pts.Points.load(tmp_path / "missing.toml")


def test_partial_credit_is_the_public_share():
    assert pts.score(True, True, 3, 0.5) == 3
    assert pts.score(False, True, 4, 0.25) == 3  # public cases passed, a hidden one failed
    assert pts.score(False, False, 4, 0.25) == 0
    assert pts.score(False, None, 4, 0.25) == 0  # not known (the check ran out of time): nothing


def _checker_name(check) -> str:
    return getattr(check, "func", check).__name__  # a functools.partial: its function's


# TensorFlow loaded into this process makes a later torch check abort the process: the Keras check's right
# answer is run by tests/test_checks_planted.py, and its hidden cases are asserted statically below.
IN_ANOTHER_PROCESS = {"check_keras_attention"}


def _one_right_answer_per_check():
    seen = {}
    for _, check, impl in test_checks_planted.CORRECT:
        if _checker_name(check) not in IN_ANOTHER_PROCESS:
            seen.setdefault(_checker_name(check), (check, impl))
    return [seen[name] for name in sorted(seen)]


@pytest.mark.parametrize("check, impl", _one_right_answer_per_check(),
                         ids=[_checker_name(c) for c, _ in _one_right_answer_per_check()])
def test_draws_hidden_matches_what_the_checker_draws(check, impl, monkeypatch, capsys):
    """The static answer (read from the source) equals the observed one: a right answer run with the hidden cases
    on asks for them (every hidden-case function asks `hidden.active()` first) iff draws_hidden says so."""
    asked = []
    real = hidden.active
    monkeypatch.setattr(hidden, "active", lambda: asked.append(1) or real())
    # a right answer, not judged on time here: without the checker's wall-time limit (30 s for the capstone's
    # generation), which a loaded machine reached
    no_limit = {"timeout": None} if "timeout" in inspect.signature(check).parameters else {}
    with hidden.drawn_from(7):
        check(impl, **no_limit)
    capsys.readouterr()
    assert bool(asked) == pts.draws_hidden(_checker_name(check))


def test_both_kinds_of_checker_are_covered():
    kinds = {pts.draws_hidden(_checker_name(check)) for check, _ in _one_right_answer_per_check()}
    assert kinds == {True, False}
    assert pts.draws_hidden("check_softmax") and pts.draws_hidden("check_keras_attention")
    assert not pts.draws_hidden("check_choice")
    assert not pts.draws_hidden("check_nothing_of_that_name")


def test_the_instructor_guides_points_file_is_valid_for_the_course():
    """The example is at the top level of its file once de-indented (hidden_share before any table)."""
    root = Path(__file__).resolve().parents[1]
    guide = (root / "book" / "instructor_guide.md").read_text(encoding="utf-8")
    block = guide.split("```toml\n", 1)[1].split("```", 1)[0]
    example = pts.Points.from_dict(pts.tomllib.loads("\n".join(line.strip() for line in block.splitlines())), "guide")
    example.validate(reference_exercises(root / "solutions"))
    assert example.of("02_single_head_exercises", 3, "core") == (5, 0.25)
    assert example.levels["challenge"] == 4
