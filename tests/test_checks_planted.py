"""The planted answers of every checker test (tests/test_checks_<topic>.py): each topic file lists CORRECT answers
(right code in several styles) and PLANTED wrong ones (check, implementation, the code it must get). Here every right
answer passes with one line, every wrong one is rejected with exactly its code, every code of the catalogue is
produced by some planted answer or zoo entry, and every check an exercise notebook calls has wrong answers planted
(at least three, with two codes or more) and a right answer in another style."""

from __future__ import annotations

import collections
import json
import re
from pathlib import Path

import pytest

import test_checks_blocks
import test_checks_capstone
import test_checks_capstone_model
import test_checks_core
import test_checks_distributed
import test_checks_flex
import test_checks_heads
import test_checks_interpret
import test_checks_kernels
import test_checks_kv_cache
import test_checks_linear
import test_checks_masks
import test_checks_modern
import test_checks_modules
import test_checks_porting
import test_checks_positions
import test_checks_runner
import test_checks_serving
import test_checks_sparse
import test_checks_tiles
from attention_course import bug_zoo, checks, mistakes

TOPICS = {
    "blocks": test_checks_blocks,
    "capstone": test_checks_capstone,
    "capstone_model": test_checks_capstone_model,
    "core": test_checks_core,
    "distributed": test_checks_distributed,
    "flex": test_checks_flex,
    "heads": test_checks_heads,
    "interpret": test_checks_interpret,
    "kernels": test_checks_kernels,
    "kv_cache": test_checks_kv_cache,
    "linear": test_checks_linear,
    "masks": test_checks_masks,
    "modern": test_checks_modern,
    "modules": test_checks_modules,
    "positions": test_checks_positions,
    "runner": test_checks_runner,
    "serving": test_checks_serving,
    "sparse": test_checks_sparse,
    "tiles": test_checks_tiles,
}
# Tables this file runs; test_checks_porting.py runs its own (with the details of its messages), counted below.
CORRECT = [(topic, *row) for topic, module in TOPICS.items() for row in getattr(module, "CORRECT", [])]
PLANTED = [(topic, *row) for topic, module in TOPICS.items() for row in module.PLANTED]


def _name(x) -> str:
    return getattr(x, "__name__", str(x))


@pytest.mark.parametrize("topic, check, impl", CORRECT, ids=[f"{t}-{_name(i)}" for t, _, i in CORRECT])
def test_correct_implementations_pass_with_one_line(topic, check, impl, capsys):
    check(impl)
    out = capsys.readouterr().out
    assert out.startswith("✓ ") and out.count("\n") == 1, out


@pytest.mark.parametrize("topic, check, impl, code", PLANTED, ids=[f"{p[0]}-{p[3]}-{i}" for i, p in enumerate(PLANTED)])
def test_mistakes_get_their_code(topic, check, impl, code, capsys):
    with pytest.raises(AssertionError) as info:
        check(impl)
    message = str(info.value)
    assert message.startswith(f"[{code}] "), message
    assert capsys.readouterr().out == ""  # no success line


def test_every_code_is_produced_somewhere():
    zoo = bug_zoo.ZOO + bug_zoo.SINGLE_HEAD_ZOO + bug_zoo.WEIGHT_LAYOUT_ZOO + bug_zoo.KV_CACHE_ZOO + bug_zoo.SEED_ZOO
    planted_elsewhere = {"timeout", "wrong-value"} | {"wrong-answer", "invalid-answer"}  # the latter: test_questions
    planted_elsewhere |= {m.code for m in mistakes.in_chapter(12)}  # its questions' codes
    planted_elsewhere |= {"tiles-dense-count", "partial-tiles-skipped"}  # question 15.doc-window-tiles
    planted_elsewhere |= {m.code for m in mistakes.in_chapter(14)}  # bug_zoo.MODERN_ZOO, tests/test_checks_modern.py
    planted_elsewhere |= {"kernel-heads-interleaved", "qkv-chunks-swapped"}  # tests/test_checks_porting.py
    planted_elsewhere |= {"window-off-by-one", "window-ignored", "tiles-not-skipped"}  # tests/test_checks_tiles.py
    # the grader's: test_grade.py, test_grader_hostile.py; the hidden cases': test_checks_hidden.py
    planted_elsewhere |= {"calls-reference", "sandbox-ended", "not-run", "softmax-global-max"}
    codes = {p[3] for p in PLANTED} | {b.code for b in zoo} | planted_elsewhere
    assert codes == set(checks.CODES)


# Checks of the exercise notebooks whose wrong answers are not planted in a table yet: empty since every chapter's
# table exists (a new chapter's checks come with their table). Never add one.
PENDING: set[str] = set()
# Questions: tests/test_chapter_questions.py tries every registered question's right answer and each wrong one.
QUESTION_CHECKS = {"check_choice", "check_number"}
MIN_PLANTED, MIN_CODES = 3, 2


def _check_name(check) -> str:
    return getattr(check, "__name__", None) or check.func.__name__  # a check, or a functools.partial of one


def _checks_in_exercise_notebooks() -> set[str]:
    names = set()
    for path in sorted((Path(__file__).parents[1] / "solutions").glob("*_exercises.ipynb")):
        for cell in json.loads(path.read_text())["cells"]:
            if "check" in cell.get("metadata", {}).get("tags", []):
                names |= set(re.findall(r"checks\.(check_\w+)", "".join(cell["source"])))
    return names - QUESTION_CHECKS


def _planted_by_check():
    zoo = bug_zoo.ZOO + bug_zoo.SINGLE_HEAD_ZOO + bug_zoo.WEIGHT_LAYOUT_ZOO + bug_zoo.KV_CACHE_ZOO + bug_zoo.SEED_ZOO
    wrong, right = collections.defaultdict(list), collections.Counter()
    tables = [*TOPICS.values(), test_checks_porting]
    for module in tables:
        for check, _, code in module.PLANTED:
            wrong[_check_name(check)].append(code)
        for check, _ in getattr(module, "CORRECT", []):
            right[_check_name(check)] += 1
    for entry in zoo:
        wrong[entry.check].append(entry.code)
    return wrong, right


def test_every_exercise_check_has_planted_wrong_answers():
    """At least three wrong answers with two codes or more, and one right answer in some style, for every check an
    exercise notebook calls."""
    used = _checks_in_exercise_notebooks()
    wrong, right = _planted_by_check()
    assert PENDING <= used, f"pending checks no exercise uses: {sorted(PENDING - used)}"
    missing = {name: (len(wrong[name]), len(set(wrong[name])), right[name]) for name in sorted(used - PENDING)
               if len(wrong[name]) < MIN_PLANTED or len(set(wrong[name])) < MIN_CODES or not right[name]}
    assert not missing, f"(planted, codes, right) of checks without enough planted answers: {missing}"
    done = {name for name in PENDING if len(wrong[name]) >= MIN_PLANTED and right[name]}
    assert not done, f"remove from PENDING, their tables exist: {sorted(done)}"
