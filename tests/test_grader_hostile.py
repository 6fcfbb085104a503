"""Hostile submissions: each attack of issue 17 is one cell added to the untouched (unsolved) exercise notebook of
chapter 1. They are graded in one parallel batch through the command line, next to a solved notebook: each is
graded honestly (0/5), the solved one 5/5, nothing is written outside the sandbox, no forged line reaches the
output, no process outlives grading, and the batch ends within the notebook limit plus the grace period."""

import csv
import hashlib
import io
import json
import math
import os
import shutil
import subprocess
import sys
import time
import types
import uuid
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from attention_course import checks
from attention_course.course import canonical, cli, grade, judge, references, sandbox

ROOT = Path(__file__).resolve().parents[1]
NAME = "01_soft_lookup_exercises.ipynb"
# The attacks target a frozen copy of chapter 1's exercises (five implementation tasks), so that redesigning the
# course's exercises does not change what these tests prove about the grader.
FIXTURES = ROOT / "tests" / "data" / "grader"
CELL_S, NOTEBOOK_S, JOBS = 8, 20, 2
MARKER = f"attention-grade-survivor-{uuid.uuid4().hex}"
FORGED = "FORGED-LINE"


def _attacks(outside: Path, reference: Path) -> dict[str, str]:
    package = Path(__import__("attention_course").__file__).parent
    return {
        "replace_checks": "from attention_course import checks\n"
                          "for n in dir(checks):\n"
                          "    if n.startswith('check_'):\n"
                          "        setattr(checks, n, lambda *a, **k: print('ok'))",
        "custom_exc": "get_ipython().set_custom_exc((BaseException,), lambda *a, **k: None)",
        "input_transformer": "get_ipython().input_transformers_cleanup.append(\n"
                             "    lambda lines: ['pass\\n'] if any('checks.' in l for l in lines) else lines)",
        "patch_allclose": "import numpy as np\nnp.allclose = lambda *a, **k: True\n"
                          "np.array_equal = lambda *a, **k: True\nnp.isclose = lambda a, b, **k: np.ones_like(a) > 0",
        "read_solutions": "import attention_course, json, pathlib\n"
                          "for root in [pathlib.Path(attention_course.__file__).parents[2], "
                          f"pathlib.Path({str(ROOT)!r}), pathlib.Path({str(reference.parent)!r})]:\n"
                          "    for path in list(root.glob('solutions/*.ipynb')) + list(root.glob('*.ipynb')):\n"
                          "        try:\n"
                          "            nb = json.loads(path.read_text())\n"
                          "        except Exception:\n"
                          "            continue\n"
                          "        for c in nb['cells']:\n"
                          "            if c['cell_type'] == 'code' and 'check' not in c['metadata'].get('tags', []):\n"
                          "                try:\n"
                          "                    exec(''.join(c['source']), globals())\n"
                          "                except Exception:\n"
                          "                    pass",
        "write_outside": f"import pathlib\nfor p in [{str(outside / 'pwned.txt')!r}, '/tmp/../pwned.txt', "
                         f"{str(reference)!r}, {str(package / 'pwned.py')!r}]:\n"
                         "    try:\n"
                         "        pathlib.Path(p).write_text('pwned')\n"
                         "    except OSError:\n"
                         "        pass",
        "forged_output": "import os\n"
                         f"line = b'{FORGED} ' + b'{{\"notebook\": \"x\", \"passed\": 5, \"total\": 5}}\\n'\n"
                         f"os.write(1, line * 50)\nos.write(2, line)\nprint('{FORGED}')",
        "kill_grader": "import os, signal\nfor pid in (os.getppid(), 1, -1):\n    try:\n        os.kill(pid, 9)\n"
                       "    except OSError:\n        pass",
        "hang": "import signal\nfor s in (signal.SIGINT, signal.SIGALRM, signal.SIGTERM):\n"
                "    signal.signal(s, signal.SIG_IGN)\nwhile True:\n    pass",
        "new_session_child": "import subprocess, sys\n"
                             f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)', '{MARKER}'],\n"
                             "                 start_new_session=True)",
        "fork_bomb": "import os, time\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n"
                     "        time.sleep(30)",
    }


def _with_cell(source: str):
    nb = nbformat.read(FIXTURES / "exercises" / NAME, as_version=4)
    first_code = next(i for i, c in enumerate(nb.cells) if c.cell_type == "code")
    nb.cells.insert(first_code + 1, new_code_cell(source))
    return nb


def _classes_before_each_check():
    """Each function under test replaced by a class, with the checks patched to pass: a check given a class
    would run inside the sandbox, where the patch works; chapter 1's exercises ask for functions, so it must not."""
    nb = nbformat.read(FIXTURES / "exercises" / NAME, as_version=4)
    cheat = ("from attention_course import checks\nfor n in dir(checks):\n    if n.startswith('check_'):\n"
             "        setattr(checks, n, lambda *a, **k: None)\n"
             "class softmax: pass\nclass attend: pass\nclass attention: pass\nclass causal_mask: pass\n"
             "class safe_attention: pass")
    for i in reversed([i for i, c in enumerate(nb.cells) if "check" in c.metadata.get("tags", [])]):
        nb.cells.insert(i, new_code_cell(cheat))
    return nb


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _survivors(marker: str = MARKER) -> list[str]:
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and marker.encode() in (proc / "cmdline").read_bytes():
                found.append(proc.name)
        except OSError:
            continue
    return found


def _run(args, timeout, **env):
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), **env)
    return subprocess.run([sys.executable, "-m", "attention_course.grade", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=ROOT, check=False)


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    assert sandbox.backend() == "bwrap", "these tests need bubblewrap (apt-get install bubblewrap)"
    tmp = tmp_path_factory.mktemp("hostile")
    outside, refs, subs = tmp / "outside", tmp / "reference", tmp / "submissions"
    for folder in (outside, refs, subs):
        folder.mkdir()
    shutil.copy(FIXTURES / "solutions" / NAME, refs / NAME)
    before = _digest(refs / NAME)
    attacks = _attacks(outside, refs / NAME)
    paths = []
    for name, source in attacks.items():
        nbformat.write(_with_cell(source), subs / f"{name}_{NAME}")
        paths.append(subs / f"{name}_{NAME}")
    nbformat.write(_classes_before_each_check(), subs / f"class_for_function_{NAME}")
    paths.append(subs / f"class_for_function_{NAME}")
    shutil.copy(FIXTURES / "solutions" / NAME, subs / f"solved_{NAME}")
    paths.append(subs / f"solved_{NAME}")
    args = ["--jsonl", "-j", str(JOBS), "--timeout", str(CELL_S), "--notebook-timeout", str(NOTEBOOK_S),
            "--solutions", str(refs), *map(str, paths)]
    start = time.monotonic()
    done = _run(args, timeout=1800)
    elapsed = time.monotonic() - start
    time.sleep(1)
    return {"done": done, "elapsed": elapsed, "attacks": attacks, "tmp": tmp, "outside": outside,
            "reference": refs / NAME, "before": before, "n": len(paths), "survivors": _survivors(),
            "package": Path(__import__("attention_course").__file__).parent}


def _results(batch) -> dict[str, dict]:
    lines = batch["done"].stdout.splitlines()
    results = [json.loads(line) for line in lines]  # every line parses: nothing forged in between
    return {Path(r["notebook"]).name.replace(f"_{NAME}", ""): r for r in results}


def test_every_attack_is_graded_zero_and_the_solved_notebook_full(batch):
    assert batch["done"].returncode == 0, batch["done"].stderr[-2000:]
    results = _results(batch)
    assert set(results) == set(batch["attacks"]) | {"solved", "class_for_function"}
    assert (results["solved"]["passed"], results["solved"]["total"]) == (5, 5)
    for name in [*batch["attacks"], "class_for_function"]:
        r = results[name]
        assert (r["passed"], r["total"], r["error"]) == (0, 5, None), (name, r)


def test_the_diagnoses_are_honest(batch):
    results = _results(batch)
    for name in ("replace_checks", "custom_exc", "input_transformer", "patch_allclose", "read_solutions",
                 "write_outside", "forged_output", "new_session_child"):
        codes = {e["code"] for e in results[name]["exercises"]}
        assert codes == {"not-implemented"}, (name, codes)
    assert {e["code"] for e in results["hang"]["exercises"]} == {"timeout"}
    assert {e["code"] for e in results["class_for_function"]["exercises"]} == {"wrong-type"}


def test_nothing_is_written_outside_the_sandbox(batch):
    assert list(batch["outside"].iterdir()) == []
    assert not Path("/pwned.txt").exists() and not Path("/tmp/pwned.txt").exists()
    assert _digest(batch["reference"]) == batch["before"]
    assert not (batch["package"] / "pwned.py").exists()


def test_no_forged_line_and_no_survivor(batch):
    assert FORGED not in batch["done"].stdout and FORGED not in batch["done"].stderr
    assert batch["survivors"] == []


def test_the_batch_ends_within_the_limits(batch):
    rounds = math.ceil(batch["n"] / JOBS)
    assert batch["elapsed"] < rounds * (NOTEBOOK_S + cli.GRACE_S)


def test_forged_output_does_not_reach_csv_or_table(batch):
    path = next(batch["tmp"].glob(f"submissions/forged_output_{NAME}"))
    common = ["--timeout", str(CELL_S), "--notebook-timeout", str(NOTEBOOK_S), "--solutions",
              str(batch["reference"]), str(path)]
    as_csv = _run(["--csv", *common], timeout=300)
    rows = list(csv.reader(io.StringIO(as_csv.stdout)))
    assert rows[0] == ["notebook", "exercise", "title", "level", "passed", "code", "message"]
    assert len(rows) == 7 and all(r[4] == "0" for r in rows[1:])  # 5 exercises and the total
    table = _run(common, timeout=300)
    assert table.stdout.splitlines()[0] == f"{path}: 0/5"
    assert FORGED not in as_csv.stdout + as_csv.stderr + table.stdout + table.stderr


@pytest.mark.parametrize("path", sorted((ROOT / "solutions").glob("*.ipynb")), ids=lambda p: p.name[:2])
def test_the_solutions_do_not_count_as_calling_the_reference(path):
    """What a solution uses of the library (chapter 2's modules build on it) its exercise allows; the rest is
    rejected (see the cheats below)."""
    reference = canonical.Reference.read(path)
    cells = references.parse_cells(nbformat.read(path, as_version=4))
    for check in reference.checks:
        for expr in canonical.expressions(check.calls):
            assert references.forbidden_use(cells, check.index, expr, check.calls[0].checker, None,
                                            reference.uses[check.number]) is None


def test_calls_to_the_reference_are_rejected():
    cheats = {
        "from attention_course.numpy_ref import softmax as s\ndef softmax(x):\n    return s(x)": "calls the reference",
        "import attention_course.numpy_ref as r\ndef softmax(x):\n    return r.softmax(x)": "calls the reference",
        "import torch.nn.functional as F\ndef helper(x):\n    return F.scaled_dot_product_attention(x, x, x)\n"
        "def softmax(x):\n    return helper(x)": "calls the reference",
        "import inspect\ndef softmax(x):\n    return inspect.stack()": "looks at the call stack",
        "def softmax(x):\n    return __import__('attention_course').numpy_ref.softmax(x)": "calls the reference",
        "def softmax(x):\n    m = __import__('a' + 'ttention_course')\n    return m": "hides what it calls",
    }
    for source, why in cheats.items():
        cheat = nbformat.read(FIXTURES / "solutions" / NAME, as_version=4)
        index = next(i for i, c in enumerate(cheat.cells) if "exercise-1" in c.metadata.get("tags", []))
        cheat.cells.insert(index, new_code_cell(source))
        problem = references.forbidden_use(references.parse_cells(cheat), index + 1, "softmax")
        assert problem is not None and problem.startswith("[calls-reference]") and why in problem, source


@pytest.mark.parametrize("body, code", [("while True:\n        pass", "timeout"),
                                        ("import os\n    os._exit(1)", "sandbox-ended")], ids=["loops", "exits"])
def test_a_function_that_never_returns_fails_alone(tmp_path, body, code):
    """Exercise 4's function loops forever (the check's own time limit stops the call) or ends the submission's
    process: the sandbox is replaced by a fresh one, and exercise 5 is still graded (as are 1 to 3, before it)."""
    nb = nbformat.read(FIXTURES / "solutions" / NAME, as_version=4)
    check = next(i for i, c in enumerate(nb.cells) if "exercise-4" in c.metadata.get("tags", []))
    nb.cells.insert(check, new_code_cell(f"def causal_mask(t_q, t_k=None):\n    {body}"))
    nbformat.write(nb, tmp_path / NAME)
    result = grade.grade_notebook(tmp_path / NAME, reference=None, limits=sandbox.Limits(cell_s=8, notebook_s=120))
    assert [(e.passed, e.code) for e in result.exercises] == [(True, None)] * 3 + [(False, code), (True, None)]


def test_the_rlimit_fallback_grades_the_same(tmp_path, monkeypatch):
    """Without bubblewrap (weaker: see the instructor guide) the same worker judges the same way, under the same
    resource limits and with a scrubbed environment."""
    monkeypatch.setattr(sandbox, "_BACKEND", "rlimit")
    shutil.copy(FIXTURES / "solutions" / NAME, tmp_path / f"solved_{NAME}")
    nbformat.write(_with_cell(_attacks(tmp_path, tmp_path / "none.ipynb")["patch_allclose"]), tmp_path / f"x_{NAME}")
    limits = sandbox.Limits(cell_s=CELL_S, notebook_s=60)
    paths = [tmp_path / f"solved_{NAME}", tmp_path / f"x_{NAME}"]
    solved, attacked = grade.grade(paths, reference=FIXTURES / "solutions", limits=limits)
    assert (solved.passed, attacked.passed, attacked.total) == (5, 0, 5)


def test_under_rlimit_a_process_in_a_new_session_dies_with_a_killed_grader(tmp_path):
    """The rlimit backend has no PID namespace: a process the submission starts in a new session escapes the
    process-group kill, and when the submission then kills its grader process the orphan would live on under init.
    The command line's processes are subreapers: the orphan is re-parented to the top-level grader, which kills
    it, and the batch goes on."""
    marker = f"attention-grade-orphan-{uuid.uuid4().hex}"
    attack = ("import os, subprocess, sys\n"
              f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)', '{marker}'],\n"
              "                 start_new_session=True)\n"
              "os.kill(os.getppid(), 9)")
    nbformat.write(_with_cell(attack), tmp_path / f"orphan_{NAME}")
    shutil.copy(FIXTURES / "solutions" / NAME, tmp_path / f"solved_{NAME}")
    args = ["--jsonl", "-j", "2", "--timeout", str(CELL_S), "--notebook-timeout", "60", "--solutions",
            str(FIXTURES / "solutions"), str(tmp_path / f"orphan_{NAME}"), str(tmp_path / f"solved_{NAME}")]
    done = _run(args, timeout=600, ATTENTION_COURSE_SANDBOX="rlimit")
    results = {Path(r["notebook"]).name: r for r in map(json.loads, done.stdout.splitlines())}
    assert results[f"solved_{NAME}"]["passed"] == 5 and results[f"orphan_{NAME}"]["passed"] == 0
    time.sleep(1)
    survivors = _survivors(marker)
    for pid in survivors:
        os.kill(int(pid), 9)
    assert survivors == []


def test_a_forged_verdict_from_the_sandbox_does_not_count(monkeypatch):
    """The submission controls its process: it could send a report with a passing verdict. For a plain checker
    call the grader never reads it, for a function or a class alike: the checker runs here."""
    event = {"op": "check", "objects": {"softmax": {"kind": "error", "etype": "NameError", "message": "x"}},
             "verdict": {"passed": True}}
    exercise = canonical.Exercise(1, "", "", [0], canonical.parse_check("checks.check_softmax(softmax)"))
    cells = references.parse_cells(nbformat.read(FIXTURES / "exercises" / NAME, as_version=4))
    box = types.SimpleNamespace(limits=sandbox.Limits())
    function = canonical.Reference(Path("ref"), [], {1: set()}, {1: False})
    assert grade._judge_point(event, exercise, box, cells, 0, function) == (False, "NameError", "NameError: x")
    event["objects"]["softmax"] = {"kind": "class", "name": "softmax", "class": True, "types": []}
    assert grade._judge_point(event, exercise, box, cells, 0, function)[:2] == (False, "wrong-type")
    monkeypatch.setattr(judge, "run_checks", lambda *a: (False, "judged-here", ""))
    assert grade._judge_point(event, exercise, box, cells, 0, None)[:2] == (False, "judged-here")


FEED_FORWARD = """import torch
from torch import nn
from attention_course import checks


class MyFeedForward(nn.Module):
    def __init__(self, d_model, d_ff, dropout=0.0):
        super().__init__()
        self.linear1, self.linear2 = nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.linear2(self.dropout({hidden}))
"""
CHEATS = ("for n in dir(checks):\n    if n.startswith('check_'):\n        setattr(checks, n, lambda *a, **k: None)\n"
          "torch.allclose = lambda *a, **k: True\nimport numpy as np\nnp.allclose = lambda *a, **k: True\n"
          "get_ipython().set_custom_exc((BaseException,), lambda *a, **k: None)")


def _class_notebook(hidden: str, *extra: str):
    """One class exercise (chapter 11's feed-forward network), its check cell last."""
    check = new_code_cell("checks.check_feed_forward(MyFeedForward)")
    check.metadata["tags"] = ["check", "exercise-1"]
    cells = [new_markdown_cell("# Exercises: a class"), new_markdown_cell("## Exercise 1 (core): Feed-forward"),
             new_code_cell(FEED_FORWARD.format(hidden=hidden)), *map(new_code_cell, extra), check]
    return new_notebook(cells=cells, metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                              "language": "python"}})


def test_a_class_is_judged_by_the_grader_not_by_the_sandbox(tmp_path):
    """A class exercise whose submission forgets the activation and patches every check, torch.allclose,
    np.allclose and IPython's exception hook: the checker runs in the grader, builds the module by reference and
    names the mistake. (When a class's check ran inside the sandbox, these patches made it pass.)"""
    nbformat.write(_class_notebook("torch.relu(self.linear1(x))"), tmp_path / "reference.ipynb")
    nbformat.write(_class_notebook("self.linear1(x)", CHEATS), tmp_path / "cheat.ipynb")
    nbformat.write(_class_notebook("torch.relu(self.linear1(x))", CHEATS), tmp_path / "honest.ipynb")
    limits = sandbox.Limits(cell_s=30, notebook_s=120)
    cheat, honest = grade.grade([tmp_path / "cheat.ipynb", tmp_path / "honest.ipynb"],
                                reference=tmp_path / "reference.ipynb", limits=limits)
    assert [(e.passed, e.code) for e in cheat.exercises] == [(False, "ffn-activation-missing")]
    assert [(e.passed, e.code) for e in honest.exercises] == [(True, None)]


# ------------------------------------------------------------------------------------------------------------
# Issue 27: each kind of attack, under every backend this machine has, each bounded in memory, disk and time
# ------------------------------------------------------------------------------------------------------------

CHAPTER_2 = "02_single_head_exercises.ipynb"
BACKENDS = ["bwrap", "rlimit"]
ROUND_LIMITS = sandbox.Limits(cell_s=30, notebook_s=120, memory_mb=4096)


@pytest.fixture(params=BACKENDS)
def backend(request, monkeypatch):
    """Each attack runs under bubblewrap (required here, as in CI) and under the rlimit fallback."""
    if request.param == "bwrap":
        assert sandbox.bwrap_works(), "these tests need bubblewrap (apt-get install bubblewrap)"
    monkeypatch.setattr(sandbox, "_BACKEND", request.param)
    return request.param


def _chapter_2_with(source: str, before_exercise: int):
    """Chapter 2's exercise notebook as handed out, with a cell inserted before an exercise's check cell."""
    nb = nbformat.read(ROOT / "exercises" / CHAPTER_2, as_version=4)
    index = next(i for i, c in enumerate(nb.cells) if f"exercise-{before_exercise}" in c.metadata.get("tags", []))
    nb.cells.insert(index, new_code_cell(source))
    return nb


def _grade_one(tmp_path, nb, name=CHAPTER_2, reference=ROOT / "solutions"):
    nbformat.write(nb, tmp_path / name)
    return grade.grade_notebook(tmp_path / name, reference=reference, limits=ROUND_LIMITS, seed=1)


WRITE_BACK = '''import torch
from torch import nn

class MySingleHeadAttention(nn.Module):
    """Computes nothing: it zeroes the checker's weights in place, then returns what zero weights give."""

    def __init__(self, d_in, d_out, dropout=0.0):
        super().__init__()
        self.d_out = d_out

    def load_numpy_params(self, params):
        for value in params.values():
            value[...] = 0

    def forward(self, query, key=None, value=None, mask=None):
        key = query if key is None else key
        keep = torch.ones(query.shape[-2], key.shape[-2], dtype=torch.bool) if mask is None else mask
        keep = torch.broadcast_to(keep, (*query.shape[:-1], key.shape[-2])).to(query.dtype)
        weights = keep / keep.sum(-1, keepdim=True).clamp(min=1)
        return torch.zeros(*query.shape[:-1], self.d_out, dtype=query.dtype), weights
'''


def test_student_code_cannot_write_into_the_checkers_arrays(tmp_path, backend):
    """A module that zeroes the weights it is given and returns zeros: the checker compares with what its own
    (untouched) weights give. (When the grader copied what a call left in its arguments back into the checker's,
    this module passed chapter 2's exercise 3.)"""
    result = _grade_one(tmp_path, _chapter_2_with(WRITE_BACK, 3))
    third = result.exercises[2]
    assert (third.exercise, third.passed) == (3, False), third
    assert result.passed == 0, result


def test_a_local_check_gives_the_student_code_copies_too():
    """The same module run by the student's own check cell (no grader): it zeroes copies, not the checker's
    weights, and fails."""
    namespace: dict = {}
    exec(WRITE_BACK, namespace)  # noqa: S102 - the attack's own source, written above
    with pytest.raises(checks.CheckFailed):
        checks.check_single_head_attention(namespace["MySingleHeadAttention"])
