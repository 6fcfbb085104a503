"""Hostile submissions: each attack of issue 17 is one cell added to the untouched (unsolved) exercise notebook of
chapter 1. They are graded in one parallel batch through the command line, next to a solved notebook: each is
graded honestly (0/5), the solved one 5/5, nothing is written outside the sandbox, no forged line reaches the
output, no process outlives grading, and the batch ends within the notebook limit plus the grace period."""

import csv
import dataclasses
import hashlib
import io
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
import types
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nbformat
import numpy as np
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from attention_course import checks
from attention_course.course import canonical, cli, grade, judge, references, sandbox, wire
from attention_course.course.results import NotebookResult

ROOT = Path(__file__).resolve().parents[1]
NAME = "01_soft_lookup_exercises.ipynb"
# The attacks target a frozen copy of chapter 1's exercises (five implementation tasks), so that redesigning the
# course's exercises does not change what these tests prove about the grader.
FIXTURES = ROOT / "tests" / "data" / "grader"
# Generous limits cost nothing where nothing hangs, and keep an honest notebook green on a loaded machine. Only the
# hang attack (it ignores the per-cell alarm) runs into the notebook limit: it is graded on its own, side by side
# with the batch, under a short one (HANG_S: its loop holds a core until then; its sandbox starts and reaches the loop
# in 2-3 s on a loaded machine).
CELL_S, NOTEBOOK_S, HANG_S, JOBS = 30, 120, 8, 2
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
        # every process forks until the process limit; then the first goes on (its cell ends without waiting for
        # the alarm) and the others keep the limit full, trying again every 30 s
        "fork_bomb": "import os, time\nroot = os.getpid()\nwhile True:\n    try:\n        os.fork()\n"
                     "    except OSError:\n        if os.getpid() == root:\n            break\n"
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
    assert sandbox.bwrap_works(), "these tests need bubblewrap (apt-get install bubblewrap)"
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
    common = ["--jsonl", "--timeout", str(CELL_S), "--solutions", str(refs)]
    hang = [p for p in paths if p.name.startswith("hang_")]
    rest = [p for p in paths if p not in hang]
    with ThreadPoolExecutor(1) as pool:
        alone = pool.submit(_timed_run, [*common, "--notebook-timeout", str(HANG_S), *map(str, hang)])
        done, elapsed = _timed_run([*common, "-j", str(JOBS), "--notebook-timeout", str(NOTEBOOK_S), *map(str, rest)])
        hang_done, hang_elapsed = alone.result()
    time.sleep(1)
    both = subprocess.CompletedProcess(done.args, done.returncode or hang_done.returncode,
                                       done.stdout + hang_done.stdout, done.stderr + hang_done.stderr)
    return {"done": both, "elapsed": elapsed, "hang_elapsed": hang_elapsed, "attacks": attacks, "tmp": tmp,
            "outside": outside, "reference": refs / NAME, "before": before, "n": len(rest), "survivors": _survivors(),
            "package": Path(__import__("attention_course").__file__).parent}


def _timed_run(args):
    start = time.monotonic()
    done = _run(args, timeout=1800)
    return done, time.monotonic() - start


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
    for name in ("replace_checks", "patch_allclose", "write_outside", "forged_output", "new_session_child"):
        codes = {e["code"] for e in results[name]["exercises"]}
        assert codes == {"not-implemented"}, (name, codes)
    # IPython's hooks (its exception handler, an input transformer that rewrites the check cells), exec: out of sight
    for name in ("custom_exc", "input_transformer", "read_solutions"):
        codes = {e["code"] for e in results[name]["exercises"]}
        assert codes == {"calls-reference"}, (name, codes)
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
    # the hang attack ends at its notebook limit (not at the grace period's kill), its command soon after: the
    # margin is for starting the command and its notebook's process on a loaded machine
    messages = {e["message"] for e in _results(batch)["hang"]["exercises"]}
    assert messages == {f"the notebook ran longer than its time limit ({HANG_S} s)"}, messages
    assert batch["hang_elapsed"] < HANG_S + cli.GRACE_S + 60


def test_forged_output_does_not_reach_csv_or_table(batch):
    """The forged notebook's result as --csv and as the table print it. The command line's process builds each
    result from its child's JSON line and writes it in the format asked for (cli._Writer, the same code path for
    every format; see test_report_text_is_escaped_for_each_format): the batch's result, written by that writer,
    is what `--csv` and the table print, without grading the notebook twice more (two sandboxes, about 17 s of
    CPU). The child's line also carries the cells' outputs for the review, where the forged cell's print is
    (jsonl leaves them out): they are put back, so that a format that printed them would fail here."""
    path = next(batch["tmp"].glob(f"submissions/forged_output_{NAME}"))
    result = _results(batch)["forged_output"]
    assert result["notebook"] == str(path)
    printed = {"2": [{"output_type": "stream", "name": "stdout", "text": f"{FORGED}\n"}]}
    written = {}
    for fmt in ("csv", "table"):
        out = io.StringIO()
        writer = cli._Writer(fmt, out)
        writer.add(NotebookResult.from_dict({**result, "outputs": printed}))
        writer.finish([str(path)])
        written[fmt] = out.getvalue()
    rows = list(csv.reader(io.StringIO(written["csv"])))
    assert rows[0] == ["notebook", "exercise", "title", "level", "passed", "points", "max_points", "code", "message",
                       "isolation"]
    assert len(rows) == 7 and all(r[4] == "0" for r in rows[1:])  # 5 exercises and the total
    assert written["table"].splitlines()[0].startswith(f"{path}: 0/5 exercises, 0/")
    assert FORGED not in written["csv"] + written["table"]


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
        "get_ipython().input_transformers_cleanup.append(lambda lines: lines)\ndef softmax(x):\n    return x":
            "changes how the notebook runs",
        "shell = get_ipython\nshell().events.register('pre_run_cell', print)\ndef softmax(x):\n    return x":
            "changes how the notebook runs",
        "import IPython\nIPython.get_ipython().user_ns.update(softmax=print)\ndef softmax(x):\n    return x":
            "changes how the notebook runs",
    }
    for source, why in cheats.items():
        cheat = nbformat.read(FIXTURES / "solutions" / NAME, as_version=4)
        index = next(i for i, c in enumerate(cheat.cells) if "exercise-1" in c.metadata.get("tags", []))
        cheat.cells.insert(index, new_code_cell(source))
        problem = references.forbidden_use(references.parse_cells(cheat), index + 1, "softmax")
        assert problem is not None and problem.startswith("[calls-reference]") and why in problem, source
    # what IPython writes for `%time`, `!ls` and `x = !ls` is not a hook: allowed
    honest = nbformat.read(FIXTURES / "solutions" / NAME, as_version=4)
    index = next(i for i, c in enumerate(honest.cells) if "exercise-1" in c.metadata.get("tags", []))
    honest.cells.insert(index, new_code_cell("%time y = 1\n!ls\nfiles = !ls\n%matplotlib inline"))
    assert references.forbidden_use(references.parse_cells(honest), index + 1, "softmax") is None


@pytest.mark.parametrize("body, code", [("while True:\n        pass", "timeout"),
                                        ("import os\n    os._exit(1)", "sandbox-ended")], ids=["loops", "exits"])
def test_a_function_that_never_returns_fails_alone(tmp_path, body, code):
    """Exercise 4's function loops forever (the sandbox's CPU-time limit per call stops it and the same sandbox goes
    on) or ends the submission's process (the sandbox is replaced by a fresh one): exercise 5 is still graded (as
    are 1 to 3, before it)."""
    nb = nbformat.read(FIXTURES / "solutions" / NAME, as_version=4)
    check = next(i for i, c in enumerate(nb.cells) if "exercise-4" in c.metadata.get("tags", []))
    nb.cells.insert(check, new_code_cell(f"def causal_mask(t_q, t_k=None):\n    {body}"))
    nbformat.write(nb, tmp_path / NAME)
    # the loop runs until the cell limit, 3 s of CPU time (each second of it a second of a core): short, and still
    # 3 times the slowest of the notebook's checks (1 s); CPU time, so a loaded machine (a fresh sandbox importing
    # torch slowly, before the limit starts) cannot reach it
    result = grade.grade_notebook(tmp_path / NAME, reference=None, limits=sandbox.Limits(cell_s=3, notebook_s=300))
    assert [(e.passed, e.code) for e in result.exercises] == [(True, None)] * 3 + [(False, code), (True, None)]


def test_the_rlimit_fallback_grades_the_same(tmp_path, rlimit_run):
    """Without bubblewrap (weaker: see the instructor guide) the same worker judges the same way, under the same
    resource limits and with a scrubbed environment: the solved notebook full marks (graded under rlimit by the
    command line's run below, with the same limits), an attack none."""
    nbformat.write(_with_cell(_attacks(tmp_path, tmp_path / "none.ipynb")["patch_allclose"]), tmp_path / f"x_{NAME}")
    limits = sandbox.Limits(cell_s=CELL_S, notebook_s=NOTEBOOK_S, isolation="rlimit")
    attacked = grade.grade_notebook(tmp_path / f"x_{NAME}", reference=FIXTURES / "solutions", limits=limits)
    solved = rlimit_run["results"]["solved"]
    assert (solved["passed"], attacked.passed, attacked.total) == (5, 0, 5)
    assert solved["isolation"] == attacked.isolation


@pytest.fixture(scope="module")
def rlimit_run(tmp_path_factory):
    """One command line run under --isolation=rlimit where bubblewrap is not on PATH, two notebooks side by side:
    one that starts a process in a new session and kills its grader process, and the solved one."""
    tmp = tmp_path_factory.mktemp("rlimit")
    marker = f"attention-grade-orphan-{uuid.uuid4().hex}"
    attack = ("import os, subprocess, sys\n"
              f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)', '{marker}'],\n"
              "                 start_new_session=True)\n"
              "os.kill(os.getppid(), 9)")
    nbformat.write(_with_cell(attack), tmp / f"orphan_{NAME}")
    shutil.copy(FIXTURES / "solutions" / NAME, tmp / f"solved_{NAME}")
    args = ["--jsonl", "-j", "2", "--isolation", "rlimit", "--timeout", str(CELL_S), "--notebook-timeout", "120",
            "--solutions",
            str(FIXTURES / "solutions"), str(tmp / f"orphan_{NAME}"), str(tmp / f"solved_{NAME}")]
    done = _run(args, timeout=600, PATH=str(tmp))  # no bwrap on PATH
    time.sleep(1)
    survivors = _survivors(marker)
    for pid in survivors:
        os.kill(int(pid), 9)
    results = {Path(r["notebook"]).name.replace(f"_{NAME}", ""): r for r in map(json.loads, done.stdout.splitlines())}
    return {"results": results, "survivors": survivors}


def test_under_rlimit_a_process_in_a_new_session_dies_with_a_killed_grader(rlimit_run):
    """The rlimit backend has no PID namespace: a process the submission starts in a new session escapes the
    process-group kill, and when the submission then kills its grader process the orphan would live on under init.
    The command line's processes are subreapers: the orphan is re-parented to the top-level grader, which kills
    it, and the batch goes on."""
    results = rlimit_run["results"]
    assert results["solved"]["passed"] == 5 and results["orphan"]["passed"] == 0
    assert rlimit_run["survivors"] == []


def test_a_forged_verdict_from_the_sandbox_does_not_count(monkeypatch):
    """The submission controls its process: it could send a report with a passing verdict. For a plain checker
    call the grader never reads it, for a function or a class alike: the checker runs here."""
    event = {"op": "check", "objects": {"softmax": {"kind": "error", "etype": "NameError", "message": "x"}},
             "verdict": {"passed": True}}
    exercise = canonical.Exercise(1, "", "", [0], canonical.parse_check("checks.check_softmax(softmax)"))
    cells = references.parse_cells(nbformat.read(FIXTURES / "exercises" / NAME, as_version=4))
    box = types.SimpleNamespace(limits=sandbox.Limits(), closed=False)
    function = canonical.Reference(Path("ref"), [], {1: set()}, {1: False})
    assert grade._judge_point(event, exercise, box, cells, 0, function)[:4] == (False, "NameError", "NameError: x",
                                                                                 False)  # the public cases too
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
          "torch.allclose = lambda *a, **k: True\nimport numpy as np\nnp.allclose = lambda *a, **k: True")


def _class_notebook(hidden: str, *extra: str):
    """One class exercise (chapter 11's feed-forward network), its check cell last."""
    check = new_code_cell("checks.check_feed_forward(MyFeedForward)")
    check.metadata["tags"] = ["check", "exercise-1"]
    cells = [new_markdown_cell("# Exercises: a class"), new_markdown_cell("## Exercise 1 (core): Feed-forward"),
             new_code_cell(FEED_FORWARD.format(hidden=hidden)), *map(new_code_cell, extra), check]
    return new_notebook(cells=cells, metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                              "language": "python"}})


def test_a_class_is_judged_by_the_grader_not_by_the_sandbox(tmp_path):
    """A class exercise whose submission forgets the activation and patches every check, torch.allclose and
    np.allclose: the checker runs in the grader, builds the module by reference and names the mistake. (When a
    class's check ran inside the sandbox, these patches made it pass. IPython's hooks are rejected before any
    check: see the batch's custom_exc.)"""
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
def backend(request):
    """Each attack runs under bubblewrap (required here, as in CI) and under the rlimit fallback."""
    if request.param == "bwrap":
        assert sandbox.bwrap_works(), "these tests need bubblewrap (apt-get install bubblewrap)"
    return request.param


def _chapter_2_with(source: str, before_exercise: int):
    """Chapter 2's exercise notebook as handed out, with a cell inserted before an exercise's check cell."""
    nb = nbformat.read(ROOT / "exercises" / CHAPTER_2, as_version=4)
    index = next(i for i, c in enumerate(nb.cells) if f"exercise-{before_exercise}" in c.metadata.get("tags", []))
    nb.cells.insert(index, new_code_cell(source))
    return nb


def _grade_one(tmp_path, nb, backend, name=CHAPTER_2, reference=ROOT / "solutions"):
    nbformat.write(nb, tmp_path / name)
    limits = dataclasses.replace(ROUND_LIMITS, isolation=backend)
    return grade.grade_notebook(tmp_path / name, reference=reference, limits=limits, seed=1)


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
    result = _grade_one(tmp_path, _chapter_2_with(WRITE_BACK, 3), backend)
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


def _chapter_1_with(cells: dict[int, str]):
    """The frozen chapter 1 exercises with a cell inserted right before the check cell of each exercise given."""
    nb = nbformat.read(FIXTURES / "exercises" / NAME, as_version=4)
    for number, source in sorted(cells.items(), reverse=True):
        index = next(i for i, c in enumerate(nb.cells) if f"exercise-{number}" in c.metadata.get("tags", []))
        nb.cells.insert(index, new_code_cell(source))
    return nb


REBOUND = {
    1: "from attention_course.numpy_ref import softmax  # rebinds the stub's name",
    3: "home = %env HOME\nfrom attention_course import numpy_ref\n\n"
       "def attention(q, k, v, mask=None):\n    return numpy_ref.scaled_dot_product_attention(q, k, v, mask)",
    4: "%time from attention_course.numpy_ref import causal_mask",
}


def test_calls_to_the_reference_are_read_as_ipython_runs_the_cells(tmp_path, backend):
    """The library's functions bound to the exercises' names by an import after the stub, inside a `%time`
    magic, and in a cell that a magic assignment made unparsable to Python: each is the reference, and each is
    rejected. (A reading of the last `def` before the check, skipping cells Python cannot parse, passed them.)"""
    result = _grade_one(tmp_path, _chapter_1_with(REBOUND), backend, name=NAME, reference=FIXTURES / "solutions")
    codes = {e.exercise: e.code for e in result.exercises}
    assert (codes[1], codes[3], codes[4]) == ("calls-reference",) * 3, result
    assert result.passed == 0


def _not_a_plain_file(tmp_path, kind: str) -> Path:
    path = tmp_path / f"{kind}_{NAME}"
    if kind == "link_to_solution":
        path.symlink_to(FIXTURES / "solutions" / NAME)
    elif kind == "link_to_dev_zero":
        path.symlink_to("/dev/zero")
    elif kind == "fifo":
        os.mkfifo(path)
    else:  # 9 MB of metadata
        nb = nbformat.read(FIXTURES / "exercises" / NAME, as_version=4)
        nb.metadata["padding"] = "x" * 9 * 2**20
        nbformat.write(nb, path)
    return path


@pytest.mark.parametrize("kind", ["link_to_solution", "link_to_dev_zero", "fifo", "oversized"])
def test_files_that_are_not_what_they_seem_are_refused(tmp_path, backend, kind):
    """A symbolic link (to a solution notebook: graded 5/5 before; to /dev/zero: read until the process was
    killed), a FIFO (blocked the grader) and a notebook over the size limit are refused before they are read."""
    path = _not_a_plain_file(tmp_path, kind)
    limits = dataclasses.replace(ROUND_LIMITS, isolation=backend)
    sandbox.bwrap_works(), sandbox.describe(limits)  # the probes run once per process: not timed (slow under load)
    start = time.monotonic()
    result = grade.grade_notebook(path, reference=FIXTURES / "solutions", limits=limits)
    assert result.total == 0 and result.error, result
    assert ("symbolic link" if kind.startswith("link") else "regular file" if kind == "fifo" else "limit") in \
        result.error
    assert time.monotonic() - start < 30  # before: a FIFO blocked for ever, /dev/zero was read until out of memory


def _clone_of_a_student(tmp_path) -> Path:
    """A student's clone: its own solutions/ (a check cell that always passes) and its own attention_course package
    at its root, whose grader prints a forged full mark."""
    clone = tmp_path / "clone"
    (clone / "solutions").mkdir(parents=True)
    fake = nbformat.read(FIXTURES / "solutions" / NAME, as_version=4)
    for cell in fake.cells:
        if "check" in cell.metadata.get("tags", []):
            cell.source = "print('ok')"
    nbformat.write(fake, clone / "solutions" / NAME)
    forged = json.dumps({"notebook": NAME, "passed": 5, "total": 5, "error": None, "reference": "forged",
                         "exercises": []})
    package = clone / "attention_course" / "course"
    package.mkdir(parents=True)
    (package.parent / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    for module in ("grade.py", "cli.py"):
        (package / module).write_text(f"print('attention-grade-result ' + {forged!r})\n")
    shutil.copy(ROOT / "exercises" / NAME, clone / NAME)
    return clone


def test_grading_inside_a_students_clone_takes_nothing_from_it(tmp_path, backend):
    """Graded from inside a student's clone (as `python -P -m`, as the instructor guide says): the reference is the
    course's solutions/, not the clone's, and no module of the clone is imported (before, each notebook's grader
    process imported the clone's attention_course and printed its forged 5/5)."""
    clone = _clone_of_a_student(tmp_path)
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    done = subprocess.run([sys.executable, "-P", "-m", "attention_course.grade", "--jsonl", "--seed", "1",
                           "--isolation", backend,
                           "--timeout", str(CELL_S), "--notebook-timeout", "120", NAME], capture_output=True,
                          text=True, timeout=600, env=env, cwd=clone, check=False)
    result = json.loads(done.stdout.splitlines()[0])
    assert (result["passed"], result["total"], result["reference"]) == (0, 5, str(ROOT / "solutions" / NAME)), done


FORGE = "\x1b[2J\x1b]0;pwned\x07\n" + FORGED + " 5/5\u2028=HYPERLINK(1)"


def _forging_notebook():
    """Its own check cells (no reference): a title and an exception message that forge lines, drive the terminal
    and start spreadsheet formulas."""
    check = new_code_cell(f"raise ValueError({('=1+2' + FORGE)!r})")
    check.metadata["tags"] = ["check", "exercise-1"]
    cells = [new_markdown_cell("# Exercises: forged"),
             new_markdown_cell("## Exercise 1 (core): =cmd|' /C calc'!A0 \x1b[31mred"), check]
    return new_notebook(cells=cells, metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                              "language": "python"}})


def test_report_text_is_escaped_for_each_format(tmp_path):
    """Exception messages and titles from a submission reach every format escaped: no escape code or forged line
    in the table, no formula in the CSV, one ASCII line per result in JSON lines. (Before, the table carried the
    escape codes and a line starting FORGED-LINE, and the CSV a cell starting with =.) Graded once, by the command
    line under bubblewrap: the text is escaped where the results are formatted, in the grader, after either backend
    has delivered it; the command line's process builds each result from its child's JSON line and writes it in the
    format asked for (cli._Writer), so the table and the CSV are that result written by the same writer."""
    nbformat.write(_forging_notebook(), tmp_path / "forging.ipynb")
    done = _run(["--jsonl", "--no-reference", "--isolation", "bwrap", "--timeout", str(CELL_S), "--notebook-timeout",
                 "120", str(tmp_path / "forging.ipynb")], timeout=600)
    outputs = {"--jsonl": done.stdout}
    for fmt in ("table", "csv"):
        out = io.StringIO()
        writer = cli._Writer(fmt, out)
        for line in done.stdout.splitlines():
            writer.add(NotebookResult.from_dict(json.loads(line)))
        writer.finish([])
        outputs["--csv" if fmt == "csv" else fmt] = out.getvalue()
    table = outputs["table"]
    assert "\x1b" not in table and "\x07" not in table and "\u2028" not in table
    assert not any(line.startswith(FORGED) for line in table.splitlines()) and "FAIL  [ValueError]" in table
    rows = list(csv.reader(io.StringIO(outputs["--csv"])))
    assert len(rows) == 3 and all(not cell.startswith(("=", "+", "-", "@")) for row in rows for cell in row), rows
    assert "\x1b" not in outputs["--csv"]
    lines = outputs["--jsonl"].splitlines()
    assert len(lines) == 1 and lines[0].isascii() and json.loads(lines[0])["exercises"][0]["message"].startswith("=1+2")


def test_without_bubblewrap_the_grader_refuses_unless_the_weaker_mode_is_asked_for(tmp_path, rlimit_run):
    """Where bubblewrap is missing (here: not on PATH), grading stops with a clear message; --isolation=rlimit
    grades (the rlimit run above, with the same PATH), and the report says so. (Before, the grader silently used
    its rlimit backend and said nothing.)"""
    shutil.copy(FIXTURES / "solutions" / NAME, tmp_path / NAME)
    common = ["--jsonl", "--timeout", str(CELL_S), "--notebook-timeout", "120", "--solutions",
              str(FIXTURES / "solutions"), str(tmp_path / NAME)]
    refused = _run(common, timeout=600, PATH=str(tmp_path))
    assert refused.returncode == 2 and "bubblewrap is not available" in refused.stderr and refused.stdout == ""
    result = rlimit_run["results"]["solved"]
    assert result["passed"] == 5 and result["isolation"].startswith("rlimit (weaker")


def _message(header: dict, arrays: dict, compress: bool = False) -> bytes:
    buf = io.BytesIO()
    data = {f"x_{k}": v for k, v in arrays.items()}
    header_array = np.frombuffer(json.dumps(header).encode(), dtype=np.uint8)
    (np.savez_compressed if compress else np.savez)(buf, __header__=header_array, **data)
    return buf.getvalue()


def test_the_wire_refuses_what_would_grow_in_the_grader(monkeypatch):
    """A few-MB compressed message (before: decompressed into 2-3 GB), a 200-byte description with a huge dtype,
    a header over its limit, arrays of a dtype outside the list: refused before they are decoded; a reply naming a
    new type for each of 600k items makes at most 256 classes (in a table of its own: the classes this test fills
    the process's table with would name every later test's objects `object`)."""
    monkeypatch.setattr(wire, "_NAMED", dict(wire._NAMED))
    bomb = _message({"op": "check"}, {"a0": np.zeros(2**26, dtype=np.uint8)}, compress=True)
    assert len(bomb) < 2**20
    for body in (bomb, _message({"op": "check", "pad": "x" * (2 * 2**20)}, {}),
                 _message({"op": "check"}, {"a0": np.zeros(3, dtype="<U3")}),
                 _message({"op": "check"}, {"a0": np.zeros((1,) * 9)})):
        with pytest.raises(wire.WireError, match="malformed"):
            wire.unpack(body)
    forged = {"value": {"t": "numpy", "a": "a0"}, "arrays": {"a0": [1]}, "dtypes": {"a0": "(1000000000000,)f8"}}
    with pytest.raises((wire.WireError, TypeError, ValueError)):
        wire.decode_value(forged)
    items = [{"t": "opaque", "type": f"T{i}"} for i in range(600_000)]
    values = wire.decode({"t": "list", "v": items}, {})
    assert len(values) == 600_000 and len(wire._NAMED) <= wire.MAX_NAMED + 1


def test_the_worker_warms_up_the_dispatch_machinery_only_for_a_dispatch_mode():
    """Entering a TorchDispatchMode first loads PyTorch's dispatch machinery (over a second of CPU), which the worker
    does before a call's time limit starts when the call's observers include one; a check that only records fused
    calls (a TorchFunctionMode: chapter 1's attention checks) does not pay it in every sandbox. Observers that cannot
    be read are warmed up for, as before."""
    from attention_course.checks import observe
    from attention_course.course import worker

    def listed(*observers):
        arrays: dict = {}
        return wire.encode([o.spec() for o in observers], arrays), arrays

    assert not worker._dispatch_modes(observe, *listed(observe.FusedAttentionCalls()))
    assert worker._dispatch_modes(observe, *listed(observe.FusedAttentionCalls(), observe.ScoreCounter(4)))
    assert worker._dispatch_modes(observe, {"t": "list", "v": [{"t": "py", "v": "scores"}]}, {})


TOTALS = '''import os, subprocess, sys

def fill(folder, limit):
    """Write 1 MB files into folder until limit or an error; the bytes written."""
    total, i = 0, 0
    block = b"x" * 2**20
    try:
        while total < limit:
            with open(os.path.join(folder, f"f{i}"), "wb") as f:
                f.write(block)
            total, i = total + len(block), i + 1
    except OSError:
        pass
    return total

def files_made(folder, limit):
    """How many empty files could be made in folder, up to limit."""
    n = 0
    try:
        while n < limit:
            open(os.path.join(folder, f"e{n}"), "w").close()
            n += 1
    except OSError:
        pass
    return n

def children_that_got(mb, n):
    """How many of n child processes, together, could each fill mb of memory (each under the per-process limit)."""
    code = f"b = bytearray(b'x') * ({mb} * 2**20); import time; time.sleep(3)"
    return sum(p.wait() == 0 for p in [subprocess.Popen([sys.executable, "-c", code]) for _ in range(n)])
'''
TOTAL_LIMITS = sandbox.Limits(cell_s=60, notebook_s=240, memory_mb=2048, disk_mb=64, tmp_mb=32, files=500)


def _totals_notebook(backend: str):
    """Its own check cells (no reference), run in the sandbox: each passes when the limit held (its own /tmp only
    under bwrap: under rlimit /tmp is the machine's)."""
    sizes = {"'.'": TOTAL_LIMITS.disk_mb, "'/tmp'": TOTAL_LIMITS.tmp_mb}
    if backend != "bwrap":
        del sizes["'/tmp'"]
    checks_ = {1: " and ".join(f"fill({f}, {mb + 32} * 2**20) <= {mb} * 2**20" for f, mb in sizes.items()),
               2: " and ".join(f"files_made({f}, 2000) <= {TOTAL_LIMITS.files}" for f in sizes),
               3: "children_that_got(700, 3) < 3"}
    cells = [new_markdown_cell("# Exercises: totals"), new_code_cell(TOTALS)]
    for number, source in checks_.items():
        check = new_code_cell(f"assert {source}")
        check.metadata["tags"] = ["check", f"exercise-{number}"]
        cells += [new_markdown_cell(f"## Exercise {number} (core): limit {number}"), check]
    return new_notebook(cells=cells, metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                              "language": "python"}})


def test_the_sandbox_is_limited_in_total(tmp_path, backend):
    """Its folder (and under bwrap its /tmp) are tmpfs limited in bytes and in files (before: 700 MB and 200,000
    files written to the host's disk, a /tmp in RAM that no limit counted; bubblewrap's own tmpfs limits bytes,
    not files), and its processes share one memory limit (a cgroup, as root; before, three children each under
    the per-process limit used 2.1 GB under a 2 GB limit). Where the machine allows no mount namespace, or no
    cgroup, the report says what is unlimited instead."""
    nbformat.write(_totals_notebook(backend), tmp_path / "totals.ipynb")
    limits = dataclasses.replace(TOTAL_LIMITS, isolation=backend)
    result = grade.grade_notebook(tmp_path / "totals.ipynb", reference=None, limits=limits)
    described = sandbox.describe(limits)
    if sandbox.private_tmpfs(backend):
        assert [(e.exercise, e.passed) for e in result.exercises[:2]] == [(1, True), (2, True)], result
        assert f"at most {limits.files} files" in described
    else:
        assert ("files unlimited" if backend == "bwrap" else "disk in total unlimited") in described
    if sandbox._cgroup_parents("memory"):
        assert result.exercises[2].passed, result
    assert ("in total (cgroup)" in described) == bool(sandbox._cgroup_parents("memory"))


def _leftovers(tmp: Path) -> list[str]:
    """Sandbox folders in ``tmp`` and cgroups of grader processes that are gone."""
    found = [p.name for p in tmp.glob(f"{sandbox.CGROUP_PREFIX}*")]
    for controller in ("pids", "memory"):
        for parent in sandbox._cgroup_parents(controller):
            for group in parent.glob(f"{sandbox.CGROUP_PREFIX}*-*"):
                pid = group.name[len(sandbox.CGROUP_PREFIX):].split("-")[0]
                if pid.isdigit() and not Path(f"/proc/{pid}").exists():
                    found.append(str(group))
    return found


def _kill_the_grader_of(path: Path, tmp: Path) -> bool:
    """SIGKILL the command line's child process that grades ``path`` once its sandbox runs (its folder in ``tmp``
    and its cgroups, named after that process, exist), as the out-of-memory killer or an instructor's kill would."""
    parents = [p for c in ("pids", "memory") for p in sandbox._cgroup_parents(c)]
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        for proc in Path("/proc").iterdir():
            try:
                command = (proc / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            made = [*tmp.glob(f"{sandbox.CGROUP_PREFIX}{proc.name}-*"),
                    *(g for p in parents for g in p.glob(f"{sandbox.CGROUP_PREFIX}{proc.name}-*"))]
            if b"--one" in command and str(path).encode() in command and len(made) == 1 + len(parents):
                time.sleep(1)  # the worker started in them
                os.kill(int(proc.name), signal.SIGKILL)
                return True
        time.sleep(0.1)
    return False


def _honest_notebook():
    """One exercise whose own check cell passes (no reference: it runs in the sandbox)."""
    check = new_code_cell("assert sum(range(4)) == 6")
    check.metadata["tags"] = ["check", "exercise-1"]
    cells = [new_markdown_cell("# Exercises: honest"), new_markdown_cell("## Exercise 1 (core): Sum"), check]
    return new_notebook(cells=cells, metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                              "language": "python"}})


def test_nothing_is_left_behind(tmp_path, backend):
    """After a batch with an honest submission and one whose grader process is killed while its sandbox runs: no
    sandbox folder, no cgroup (before: an empty pids cgroup for every notebook graded, and the folder and cgroups
    of a killed grader). The submission cannot kill its grader itself (bwrap: its own PID namespace; rlimit as
    root: it runs as nobody), so the test does, from outside. The honest submission is a one-cell notebook graded
    by its own check cell (no reference of its name): its sandbox is made and removed as any other's, and its
    grader process imports no checker (a solved chapter 1 cost about 5 s of CPU more, PyTorch twice)."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    killed = tmp_path / f"kill_{NAME}"
    nbformat.write(_with_cell("import time\ntime.sleep(25)"), killed)
    honest = tmp_path / "honest.ipynb"
    nbformat.write(_honest_notebook(), honest)
    before = set(_leftovers(tmp))  # what earlier runs on this machine left (a grader killed from outside)
    args = ["--jsonl", "-j", "2", "--isolation", backend, "--timeout", str(CELL_S), "--notebook-timeout", "120",
            "--solutions", str(FIXTURES / "solutions"), str(killed), str(honest)]
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(_run, args, 600, TMPDIR=str(tmp))
        assert _kill_the_grader_of(killed, tmp)
        done = running.result()
    results = {Path(r["notebook"]).name: r for r in map(json.loads, done.stdout.splitlines())}
    assert (results[honest.name]["passed"], results[honest.name]["total"]) == (1, 1), results
    assert "failed (exit -9)" in results[killed.name]["error"], results
    assert set(_leftovers(tmp)) - before == set()


def _as_whom_notebook(secret: Path):
    """Its own check cells (no reference): the submission runs as nobody, and a file that only root may read (as
    the instructor guide asks of solutions and submissions) stays closed to it."""
    sources = {1: "import os\nassert os.getuid() == 65534",
               2: f"try:\n    open({str(secret)!r}).read()\nexcept PermissionError:\n    pass\nelse:\n"
                  "    raise AssertionError('read')"}
    cells = [new_markdown_cell("# Exercises: as whom")]
    for number, source in sources.items():
        check = new_code_cell(source)
        check.metadata["tags"] = ["check", f"exercise-{number}"]
        cells += [new_markdown_cell(f"## Exercise {number} (core): as whom {number}"), check]
    return new_notebook(cells=cells, metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                              "language": "python"}})


@pytest.mark.skipif(os.getuid() != 0, reason="the weak mode switches users only when the grader runs as root")
def test_the_weak_mode_as_root_runs_the_submission_as_nobody(tmp_path):
    """Run as root, --isolation=rlimit runs the submission as nobody, even with a Python under /root (mode 0700,
    where pyenv installs it): in the submission's own mount namespace /root is covered by a tmpfs holding only
    the interpreter (before: the grader kept root, and the submission could read everything)."""
    if not sandbox.private_tmpfs("rlimit"):
        pytest.skip("no mount namespace here: the report says the grader's user")
    secret = tmp_path / "solutions.ipynb"
    secret.write_text("{}")
    secret.chmod(0o600)
    nbformat.write(_as_whom_notebook(secret), tmp_path / "whom.ipynb")
    limits = dataclasses.replace(ROUND_LIMITS, isolation="rlimit")
    result = grade.grade_notebook(tmp_path / "whom.ipynb", reference=None, limits=limits)
    assert [(e.exercise, e.passed) for e in result.exercises] == [(1, True), (2, True)], result
    assert result.isolation.startswith("rlimit (weaker: as nobody")
