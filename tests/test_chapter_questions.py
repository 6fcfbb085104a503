"""The chapters' checked questions: each right answer passes, each wrong option and each known wrong number fails
with its code; every chapter 1-9 asks at least one; the read-the-plot data shows what the answer says."""

import math

import numpy as np
import pytest

from attention_course import checks, numpy_ref
from attention_course.checks import core, masks
from attention_course.checks.questions import QUESTIONS, ChoiceQuestion, NumberQuestion

checks.load_all()  # every topic's questions registered (the package imports its checkers when first used)
CHOICES = sorted(qid for qid, q in QUESTIONS.items() if isinstance(q, ChoiceQuestion))
NUMBERS = sorted(qid for qid, q in QUESTIONS.items() if isinstance(q, NumberQuestion))


def _code(info) -> str:
    return str(info.value).split("]", 1)[0].lstrip("[")


def test_every_chapter_asks_a_question():
    prefixes = {qid.split(".")[0] for qid in QUESTIONS}
    assert set(map(str, range(1, 10))) <= prefixes
    assert all(p.isdigit() or p.startswith("capstone") for p in prefixes)  # capstones: "capstone1.<name>"


@pytest.mark.parametrize("qid", CHOICES)
def test_choice_right_and_wrong(qid, capsys):
    question = QUESTIONS[qid]
    checks.check_choice(qid, question.answer)
    assert capsys.readouterr().out.startswith(f"✓ {qid}: {question.answer} is right")
    assert len(question.letters) >= 3, "a choice question offers at least two wrong options"
    for letter, (code, _) in question.wrong.items():
        with pytest.raises(checks.CheckFailed) as info:
            checks.check_choice(qid, letter.lower())
        assert _code(info) == code


@pytest.mark.parametrize("qid", NUMBERS)
def test_number_right_known_and_other(qid, capsys):
    question = QUESTIONS[qid]
    answer = question.answer() if callable(question.answer) else question.answer
    checks.check_number(qid, answer)
    assert capsys.readouterr().out.startswith(f"✓ {qid}:")
    known = question.known() if callable(question.known) else question.known
    assert known, "a number question names at least one known wrong value"
    for value, (code, _) in known.items():
        assert not math.isclose(value, answer, rel_tol=question.rtol, abs_tol=question.atol)
        with pytest.raises(checks.CheckFailed) as info:
            checks.check_number(qid, value)
        assert _code(info) == code
    with pytest.raises(checks.CheckFailed) as info:
        checks.check_number(qid, 3 * answer + 7.5)
    assert _code(info) == "wrong-answer"


def test_scale_mystery_is_unscaled_attention():
    weights = core.scale_mystery()
    q, k = np.random.default_rng(1).standard_normal((2, 8, 64))
    np.testing.assert_allclose(weights, numpy_ref.softmax(q @ k.T))
    assert QUESTIONS["1.which-scale"].answer == "B"  # B: not divided at all
    sharpest = {name: numpy_ref.softmax(q @ k.T / s).max(axis=-1).mean() for name, s in [("sqrt", 8), ("d", 64)]}
    assert weights.max(axis=-1).mean() > 0.8 > 0.5 > sharpest["sqrt"] > sharpest["d"]


def test_mask_mystery_is_bottom_right_causal():
    weights = masks.mask_mystery()
    allowed = weights > 0
    np.testing.assert_array_equal(allowed, np.tril(np.ones((3, 6), dtype=bool), k=3))
    np.testing.assert_allclose(weights.sum(axis=-1), 1.0)
    assert QUESTIONS["4.which-mask"].answer == "B"


def test_bug_mystery_normalises_over_the_queries():
    weights = core.bug_mystery()
    np.testing.assert_allclose(weights.sum(axis=0), 1.0)
    assert not np.allclose(weights.sum(axis=1), 1.0)
    assert weights[-1, -1] == pytest.approx(1.0)
    assert np.all(np.triu(weights, 1) == 0)  # the causal mask itself is right
    assert QUESTIONS["7.which-bug"].answer == "B"


def test_number_answers_match_the_library():
    from attention_course.kv_cache import cache_bytes_per_token

    assert cache_bytes_per_token(32, 32, 128, "float16") * 4096 / 2**30 == QUESTIONS["8.cache-gib"].answer
    lengths, t = [5, 3], 6
    allowed = np.tril(np.ones((t, t), dtype=bool))[None] & (np.arange(t)[None, None] < np.array(lengths)[:, None, None])
    assert allowed.sum() == QUESTIONS["4.allowed-pairs"].answer
    x = (10 * np.arange(3)[:, None] + np.arange(6))[None]
    split = x.reshape(1, 3, 3, 2).transpose(0, 2, 1, 3)
    assert split[0, 2, 1, 0] == QUESTIONS["3.split-entry"].answer
    d_k = 64
    assert (1 / math.sqrt(d_k)) / (1 / d_k) == QUESTIONS["7.scale-by-d"].answer  # muP's scores, divided by sqrt(d_k)
