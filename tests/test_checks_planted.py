"""The planted answers of every checker test (tests/test_checks_<topic>.py): each topic file lists CORRECT answers
(right code in several styles) and PLANTED wrong ones (check, implementation, the code it must get). Here every right
answer passes with one line, every wrong one is rejected with exactly its code, and every code of the catalogue is
produced by some planted answer or zoo entry."""

from __future__ import annotations

import pytest

import test_checks_core
import test_checks_heads
import test_checks_kv_cache
import test_checks_masks
import test_checks_modules
import test_checks_runner
import test_checks_tiles
from attention_course import bug_zoo, checks, mistakes

TOPICS = {"core": test_checks_core, "heads": test_checks_heads, "kv_cache": test_checks_kv_cache,
          "masks": test_checks_masks, "modules": test_checks_modules, "runner": test_checks_runner,
          "tiles": test_checks_tiles}
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
    planted_elsewhere |= {m.code for m in mistakes.in_chapter(10)}  # tests/test_checks_positions.py
    planted_elsewhere |= {m.code for m in mistakes.in_chapter(11)}  # tests/test_checks_blocks.py
    planted_elsewhere |= {m.code for m in mistakes.in_chapter(12)}  # tests/test_checks_interpret.py
    planted_elsewhere |= {m.code for m in mistakes.in_chapter(13)}  # tests/test_checks_distributed.py
    planted_elsewhere |= {m.code for m in mistakes.in_chapter(14)}  # tests/test_checks_capstone.py
    planted_elsewhere |= {"kernel-heads-interleaved", "qkv-chunks-swapped"}  # tests/test_checks_porting.py
    planted_elsewhere |= {"window-off-by-one", "window-ignored", "tiles-not-skipped"}  # tests/test_checks_tiles.py
    # the grader's: test_grade.py, test_grader_hostile.py; the hidden cases': test_checks_hidden.py
    planted_elsewhere |= {"calls-reference", "sandbox-ended", "not-run", "softmax-global-max"}
    codes = {p[3] for p in PLANTED} | {b.code for b in zoo} | planted_elsewhere
    assert codes == set(checks.CODES)
