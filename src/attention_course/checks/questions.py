"""Checked questions: predict-then-run, read-the-plot and conceptual questions,
answered by a letter or a number.

A question's right answer, its tolerance and an explanation for each wrong
answer live in the package, in the checks module of the chapter's topic,
registered here under an id ``"<chapter>.<name>"``; the notebook only asks the
question and calls the check, so the answer is not in the student's notebook::

    # src/attention_course/checks/<topic>.py, next to the topic's checkers
    from .questions import choice_question, number_question

    choice_question(
        "10.pairing",
        answer="B",
        why="the rotation angle depends only on the offset j - i, so shifting both positions changes nothing.",
        wrong={
            "A": "the absolute positions cancel in the dot product; only their difference is left.",
            "C": ("rope-pairs-split", "features are rotated in pairs (2i, 2i + 1), not (i, i + D/2)."),
        },
    )
    number_question("10.period", answer=lambda: 2 * math.pi * 10_000, rtol=1e-3,
                    why="the slowest pair turns by 1 / 10000 radians per position.",
                    known={2 * math.pi: "that is the period of the FASTEST pair (frequency 1)."})

    # the notebook's check cell
    checks.check_choice("10.pairing", answer)
    checks.check_number("10.period", period)

A wrong answer raises :class:`CheckFailed` with ``[wrong-answer]`` (or the code
given to that option, which must be in :mod:`attention_course.mistakes`) and
the explanation of the answer given; an answer that is not one of the
question's letters, or not a number, gets ``[invalid-answer]``; a right answer
prints one line with the reason. ``answer`` may also be a function of no
arguments that returns the answer (as an exercise's solution region inside a
``def`` needs): a ``raise NotImplementedError`` there gives
``[not-implemented]``. A number question's ``answer`` (and ``known``) may be a
function too, computed from the library when the check runs: the answer is then
what running the code gives.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from ..mistakes import MISTAKES
from .runner import (
    DEFAULT_TIMEOUT,
    as_number,
    call,
    fail,
    run_check,
    type_name,
)

# a chapter's number or a capstone's key
_ID = re.compile(r"^(\d+|capstone\d+)\.[a-z][a-z0-9-]*$")
_LETTER = re.compile(r"^[A-Z]$")


@dataclass(frozen=True)
class ChoiceQuestion:
    """A question answered by one letter. ``wrong``: letter -> (code,
    explanation) for every wrong option."""

    qid: str
    answer: str
    why: str
    wrong: Mapping[str, tuple[str, str]]

    @property
    def letters(self) -> list[str]:
        return sorted({self.answer, *self.wrong})


@dataclass(frozen=True)
class NumberQuestion:
    """A question answered by a number, right within ``rtol``/``atol``.
    ``known``: a wrong value -> (code, explanation), matched with the same
    tolerance; ``hint`` is shown for any other wrong value."""

    qid: str
    answer: float | Callable[[], float]
    why: str
    rtol: float = 1e-6
    atol: float = 0.0
    known: Mapping[float, tuple[str, str]] | Callable[[], Mapping] = field(
        default_factory=dict
    )
    hint: str = ""


#: id -> question, for every registered question.
QUESTIONS: dict[str, ChoiceQuestion | NumberQuestion] = {}


def _explanation(qid: str, what: str, value) -> tuple[str, str]:
    """A wrong option's explanation as (code, text): a plain string gets
    ``wrong-answer``."""
    code, text = (
        ("wrong-answer", value) if isinstance(value, str) else tuple(value)
    )
    if code not in MISTAKES:
        raise ValueError(
            f"question {qid!r}: {what} has the code {code!r}, which is not "
            "in attention_course.mistakes"
        )
    if not isinstance(text, str) or not text.strip():
        raise ValueError(
            f"question {qid!r}: {what} needs an explanation (a non-empty "
            "string)"
        )
    return code, text


def _register(question):
    if not isinstance(question.qid, str) or not _ID.match(question.qid):
        raise ValueError(
            "qid must look like '<chapter>.<name>', e.g. '10.pairing' or "
            "'capstone1.heads', "
            f"got {question.qid!r}"
        )
    if question.qid in QUESTIONS:
        raise ValueError(f"question {question.qid!r} is already registered")
    if not isinstance(question.why, str) or not question.why.strip():
        raise ValueError(
            f"question {question.qid!r}: why must say in one line why the "
            "answer is right"
        )
    QUESTIONS[question.qid] = question
    return question


def choice_question(
    qid: str,
    *,
    answer: str,
    why: str,
    wrong: Mapping[str, str | tuple[str, str]],
) -> ChoiceQuestion:
    """Register a question answered by one letter: ``answer`` the right letter,
    ``why`` the reason shown when it is given, ``wrong`` every other option's
    letter -> explanation, or -> (code, explanation) to name the mistake."""
    if not isinstance(answer, str) or not _LETTER.match(answer):
        raise ValueError(
            f"question {qid!r}: answer must be one capital letter, got "
            f"{answer!r}"
        )
    if not wrong:
        raise ValueError(
            f"question {qid!r}: wrong must explain at least one wrong option"
        )
    for letter in wrong:
        if (
            not isinstance(letter, str)
            or not _LETTER.match(letter)
            or letter == answer
        ):
            raise ValueError(
                f"question {qid!r}: wrong options must be capital letters "
                "other than the answer "
                f"{answer!r}, got {letter!r}"
            )
    explained = {
        letter: _explanation(qid, f"option {letter}", text)
        for letter, text in wrong.items()
    }
    return _register(ChoiceQuestion(qid, answer, why, explained))


def number_question(
    qid: str,
    *,
    answer: float | Callable[[], float],
    why: str,
    rtol: float = 1e-6,
    atol: float = 0.0,
    known: Mapping | Callable[[], Mapping] | None = None,
    hint: str = "",
) -> NumberQuestion:
    """Register a question answered by a number: ``answer`` (or a function
    computing it when the check runs), right within ``rtol`` (relative) or
    ``atol`` (absolute); ``known`` maps wrong values -> explanation or (code,
    explanation) (or is a function returning that mapping); ``hint`` is shown
    for any other wrong value."""
    if not callable(answer) and as_number(answer) is None:
        raise TypeError(
            f"question {qid!r}: answer must be a number or a function "
            "returning one, got "
            f"{type_name(answer)}"
        )
    for name, tol in (("rtol", rtol), ("atol", atol)):
        if isinstance(tol, bool) or not isinstance(tol, (int, float)):
            raise TypeError(
                f"question {qid!r}: {name} must be a number, got "
                f"{type(tol).__name__}"
            )
        if not tol >= 0:
            raise ValueError(
                f"question {qid!r}: {name} must be >= 0, got {tol!r}"
            )
    if (
        rtol == 0
        and atol == 0
        and not callable(answer)
        and not float(answer).is_integer()
    ):
        raise ValueError(
            f"question {qid!r}: a non-integer answer needs a tolerance "
            "(rtol or atol > 0)"
        )
    if not callable(known):
        known = {
            value: _explanation(qid, f"known value {value!r}", text)
            for value, text in (known or {}).items()
        }
    return _register(NumberQuestion(qid, answer, why, rtol, atol, known, hint))


def _question(qid, kind):
    if isinstance(qid, str) and qid not in QUESTIONS:
        # a question lives beside its topic's checkers, imported when first
        # used
        from . import load_all

        load_all()
    question = QUESTIONS.get(qid) if isinstance(qid, str) else None
    if question is None:
        known = ", ".join(sorted(QUESTIONS)) or "none"
        raise ValueError(
            f"qid {qid!r} is not a registered question (registered: {known})"
        )
    if not isinstance(question, kind):
        other = "check_number" if kind is ChoiceQuestion else "check_choice"
        raise ValueError(f"question {qid!r} is answered with checks.{other}")
    return question


def _given(answer, qid):
    """The student's answer: ``answer`` itself, or what it returns when it is a
    function of no arguments."""
    return (
        call(answer, {}, f"{qid}: your answer") if callable(answer) else answer
    )


def check_choice(
    qid: str, answer, *, timeout: float = DEFAULT_TIMEOUT
) -> None:
    """Check the letter ``answer`` (e.g. ``"B"``, any case; or a function
    returning it) to question ``qid``."""
    question = _question(qid, ChoiceQuestion)
    letters = ", ".join(question.letters)

    def body():
        given = _given(answer, qid)
        letter = given.strip().upper() if isinstance(given, str) else None
        if letter not in question.letters:
            raise fail(
                "invalid-answer",
                f"Your answer is {given!r}; answer question {qid} with one "
                "of the letters "
                f'{letters}, e.g. answer = "{question.letters[0]}".',
            )
        if letter == question.answer:
            return f"✓ {qid}: {letter} is right: {question.why}"
        code, text = question.wrong[letter]
        raise fail(
            code, f"{letter} is not the right answer to question {qid}: {text}"
        )

    run_check(body, timeout)


def check_number(qid: str, value, *, timeout: float = DEFAULT_TIMEOUT) -> None:
    """Check the number ``value`` (an int, a float, a 0-d array or tensor; or a
    function returning one) against question ``qid``'s answer, within the
    question's tolerance."""
    question = _question(qid, NumberQuestion)

    def body():
        given = _given(value, qid)
        number = as_number(given)
        if number is None or not math.isfinite(number):
            raise fail(
                "invalid-answer",
                f"Your answer to question {qid} is {type_name(given)} "
                f"{given!r}; answer "
                "with a number, e.g. 6.28.",
            )
        expected = (
            question.answer() if callable(question.answer) else question.answer
        )
        if _near(number, expected, question):
            return f"✓ {qid}: {_shown(number)} is right: {question.why}"
        known = (
            question.known() if callable(question.known) else question.known
        )
        for wrong, text in known.items():
            if _near(number, wrong, question):
                code, text = _explanation(qid, f"known value {wrong!r}", text)
                raise fail(
                    code,
                    f"{_shown(number)} is not the right answer to question "
                    f"{qid}: {text}",
                )
        hint = f" {question.hint}" if question.hint else ""
        raise fail(
            "wrong-answer",
            f"{_shown(number)} is not the right answer to question "
            f"{qid}.{hint}",
        )

    run_check(body, timeout)


def _shown(number: float) -> str:
    """A number as the student would write it: whole numbers in full (2362368,
    not 2.36237e+06), others with %g."""
    return (
        str(int(number))
        if float(number).is_integer() and abs(number) < 1e15
        else f"{number:g}"
    )


def _near(value: float, target: float, question: NumberQuestion) -> bool:
    return math.isclose(
        value, target, rel_tol=question.rtol, abs_tol=question.atol
    )
