"""Checked questions: a right answer prints one line, each wrong answer gets its code and explanation, a malformed
answer or an unknown id a clear error; registering a malformed question fails."""

import math

import numpy as np
import pytest
import torch

from attention_course import checks
from attention_course.checks import questions


@pytest.fixture(autouse=True)
def registry(monkeypatch):
    """Each test registers its questions in an empty registry; the package's own questions are left alone."""
    monkeypatch.setattr(questions, "QUESTIONS", {})
    questions.choice_question(
        "99.pairing",
        answer="B",
        why="the angle depends only on the offset.",
        wrong={"A": "the absolute positions cancel.", "C": ("values-from-keys", "the values are not the keys.")},
    )
    questions.number_question("99.period", answer=2 * math.pi, rtol=1e-3, why="one full turn.",
                              known={math.pi: "that is half a turn."}, hint="How many radians is one turn?")
    questions.number_question("99.count", answer=lambda: 4 * 8 * 8, rtol=0, why="four 8 x 8 matrices.",
                              known=lambda: {3 * 8 * 8: ("missing-output-projection", "w_o counts too.")})
    return questions.QUESTIONS


def test_right_answers_print_one_line(capsys):
    checks.check_choice("99.pairing", "B")
    checks.check_choice("99.pairing", " b ")
    checks.check_choice("99.pairing", lambda: "B")
    checks.check_number("99.period", 6.2832)
    checks.check_number("99.period", torch.tensor(2 * math.pi))
    checks.check_number("99.count", np.int64(256))
    assert capsys.readouterr().out.splitlines() == [
        "✓ 99.pairing: B is right: the angle depends only on the offset.",
        "✓ 99.pairing: B is right: the angle depends only on the offset.",
        "✓ 99.pairing: B is right: the angle depends only on the offset.",
        "✓ 99.period: 6.2832 is right: one full turn.",
        "✓ 99.period: 6.28319 is right: one full turn.",
        "✓ 99.count: 256 is right: four 8 x 8 matrices.",
    ]


@pytest.mark.parametrize("answer, message", [
    ("A", "[wrong-answer] A is not the right answer to question 99.pairing: the absolute positions cancel."),
    ("c", "[values-from-keys] C is not the right answer to question 99.pairing: the values are not the keys."),
    ("D", "[invalid-answer] Your answer is 'D'; answer question 99.pairing with one of the letters A, B, C, e.g. "
          "answer = \"A\"."),
    ("AB", "[invalid-answer] Your answer is 'AB'; answer question 99.pairing with one of the letters A, B, C, e.g. "
           "answer = \"A\"."),
    (2, "[invalid-answer] Your answer is 2; answer question 99.pairing with one of the letters A, B, C, e.g. "
        "answer = \"A\"."),
    (None, "[invalid-answer] Your answer is None; answer question 99.pairing with one of the letters A, B, C, e.g. "
           "answer = \"A\"."),
])
def test_wrong_and_malformed_letters(answer, message, capsys):
    with pytest.raises(checks.CheckFailed) as info:
        checks.check_choice("99.pairing", answer)
    assert str(info.value) == message
    assert capsys.readouterr().out == ""


def test_answer_function_not_written_yet():
    def answer():
        raise NotImplementedError("Exercise 4: Pairs")

    with pytest.raises(checks.CheckFailed, match=r"^\[not-implemented\] Exercise 4: Pairs: replace the"):
        checks.check_choice("99.pairing", answer)


@pytest.mark.parametrize("qid, value, message", [
    ("99.period", 3.1416, "[wrong-answer] 3.1416 is not the right answer to question 99.period: that is half a turn."),
    ("99.period", 6.0, "[wrong-answer] 6 is not the right answer to question 99.period. How many radians is one turn?"),
    ("99.count", 192, "[missing-output-projection] 192 is not the right answer to question 99.count: w_o counts too."),
    ("99.count", 255, "[wrong-answer] 255 is not the right answer to question 99.count."),
    ("99.period", "6.28", "[invalid-answer] Your answer to question 99.period is str '6.28'; answer with a number, "
                          "e.g. 6.28."),
    ("99.period", float("nan"), "[invalid-answer] Your answer to question 99.period is float nan; answer with a "
                                "number, e.g. 6.28."),
    ("99.period", True, "[invalid-answer] Your answer to question 99.period is bool True; answer with a number, "
                        "e.g. 6.28."),
    ("99.period", None, "[invalid-answer] Your answer to question 99.period is NoneType None; answer with a number, "
                        "e.g. 6.28."),
])
def test_wrong_and_malformed_numbers(qid, value, message):
    with pytest.raises(checks.CheckFailed) as info:
        checks.check_number(qid, value)
    assert str(info.value) == message
    assert "6.28319" not in str(info.value)  # the right answer is never revealed


def test_unknown_id_or_wrong_kind_of_check():
    with pytest.raises(ValueError, match=r"qid '99\.pairng' is not a registered question \(registered: 99\.count, "
                       r"99\.pairing, 99\.period\)"):
        checks.check_choice("99.pairng", "B")
    with pytest.raises(ValueError, match=r"qid 7 is not a registered question"):
        checks.check_number(7, 1.0)
    with pytest.raises(ValueError, match=r"question '99\.period' is answered with checks\.check_number"):
        checks.check_choice("99.period", "B")
    with pytest.raises(ValueError, match=r"question '99\.pairing' is answered with checks\.check_choice"):
        checks.check_number("99.pairing", 2)


@pytest.mark.parametrize("kwargs, error, match", [
    ({"qid": "pairing"}, ValueError, r"qid must look like '<chapter>\.<name>'"),
    ({"qid": "99.pairing"}, ValueError, r"question '99\.pairing' is already registered"),
    ({"answer": "b"}, ValueError, r"answer must be one capital letter, got 'b'"),
    ({"wrong": {}}, ValueError, r"wrong must explain at least one wrong option"),
    ({"wrong": {"A": "x", "B": "y"}}, ValueError, r"wrong options must be capital letters other than the answer 'B', "
                                                  r"got 'B'"),
    ({"wrong": {"A": ("no-such-code", "x")}}, ValueError, r"option A has the code 'no-such-code', which is not in"),
    ({"wrong": {"A": ""}}, ValueError, r"option A needs an explanation"),
    ({"why": ""}, ValueError, r"why must say in one line why the answer is right"),
])
def test_malformed_choice_questions(kwargs, error, match):
    question = {"qid": "98.new", "answer": "B", "why": "because.", "wrong": {"A": "no."}} | kwargs
    with pytest.raises(error, match=match):
        questions.choice_question(question.pop("qid"), **question)


@pytest.mark.parametrize("kwargs, error, match", [
    ({"answer": "6.28"}, TypeError, r"answer must be a number or a function returning one, got str"),
    ({"rtol": "1e-3"}, TypeError, r"rtol must be a number, got str"),
    ({"atol": -1.0}, ValueError, r"atol must be >= 0, got -1\.0"),
    ({"rtol": 0}, ValueError, r"a non-integer answer needs a tolerance"),
    ({"known": {1.0: ("no-such-code", "x")}}, ValueError, r"known value 1\.0 has the code 'no-such-code'"),
])
def test_malformed_number_questions(kwargs, error, match):
    question = {"answer": 6.28, "why": "because.", "rtol": 1e-3} | kwargs
    with pytest.raises(error, match=match):
        questions.number_question("98.new", **question)


def test_an_exact_integer_answer_needs_no_tolerance(capsys):
    questions.number_question("98.heads", answer=8, rtol=0, why="d_model / d_head.")
    checks.check_number("98.heads", 8.0)
    with pytest.raises(checks.CheckFailed, match=r"^\[wrong-answer\] 7\.99999 is not the right answer"):
        checks.check_number("98.heads", 7.99999)
    assert capsys.readouterr().out == "✓ 98.heads: 8 is right: d_model / d_head.\n"
