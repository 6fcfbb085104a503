"""Grade submitted exercise notebooks: run each one in a sandbox, judge its exercises in the grader's process.

Usage::

    python -m attention_course.grade NOTEBOOK... [--json | --jsonl | --csv] [-j N] [--timeout SECONDS]
        [--notebook-timeout SECONDS] [--memory-mb MB] [--seed N] [--solutions PATH | --no-reference]

Untrusted code only computes; trusted code judges. Each notebook runs in a disposable sandbox
(:mod:`.sandbox`: bubblewrap, or a weaker rlimit-only fallback), top to bottom, with errors allowed so that a
broken exercise does not stop the later ones, a time limit per cell (``--timeout``, default 60 s) and per notebook
(``--notebook-timeout``, default 300 s). An exercise is found by its check cell (tags ``check`` and
``exercise-N``; see CONTRIBUTING.md, "Adding an exercise"). The sandbox does not run a check cell such as
``checks.check_softmax(softmax)``: it reports what ``softmax`` is, and the checker runs here, in the grader's
process, calling the student's function through a stand-in that sends the inputs to the sandbox and gets the
outputs back (:mod:`.judge`); a class is built, loaded with weights and called by reference the same way. The
checkers add hidden cases drawn from ``--seed`` (default: random per run; :mod:`attention_course.checks.hidden`).
A function or class that calls the reference implementation fails with ``calls-reference`` (:mod:`.references`).
Only a check cell that is not a plain ``checks.check_*(...)`` call, which can happen only without a reference,
runs inside the sandbox (see the instructor guide).

A failing check's diagnosis code (``[missing-scale]``, ...) is reported; other errors by exception name (e.g.
``NameError``), a check stopped by a time limit as ``timeout``, and a check cell that never ran (the submission's
process died) as ``not-run``.

Canonical check cells: a submission is graded against the check cells of its **reference** notebook, not its own,
so that deleting or editing a check cell (e.g. to ``pass``) gains nothing. The reference is the solution notebook
of the same name in the reference folder (``--solutions DIR``, also spelled ``--reference DIR``; default: the
``solutions/`` folder of the current directory, when there is one); a name with a prefix also matches, e.g.
``ada_lovelace_04_masking_exercises.ipynb`` is graded against ``04_masking_exercises.ipynb``. ``--solutions FILE``
grades every submission against that one solution notebook (for renamed files). Before the run, the source of
each check cell tagged ``exercise-N`` is replaced by the reference's check cell of exercise N; the exercises,
their titles and levels are the reference's. An exercise whose check cell the submission no longer has (deleted,
or its tags removed) fails with the code ``check-missing``; it still counts in the total. Without a reference
(``--no-reference``, no matching name, or no solutions folder) the notebook's own check cells are graded, and the
table says so.

Output: each notebook's result is written as soon as it is known (``-j N`` grades N notebooks at once, each in a
child process of its own, so a crash loses nothing already written and the batch goes on): a table per notebook
with a total such as ``3/5``, ``--jsonl`` (one JSON object per line), ``--csv`` (header first, then rows), or
``--json`` (one document at the end). Under each failed exercise the table shows
the hint for its code (the catalogue's description of the mistake, else the check's message); the CSV has, per
notebook, a row ``total`` whose ``passed`` is the number passed and whose ``message`` is ``passed/total``. Nothing a
submission prints reaches this output. A notebook that cannot be
read (missing, not JSON, not a notebook) gets an ``ERROR`` line and the others are still graded. Exit status: 0
whenever grading ran; 2 for a command-line usage error (including a ``--solutions`` path that does not exist).
"""

from __future__ import annotations

import argparse
import ast
import csv
import io
import json
import re
import secrets
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path

import nbformat

from ..checks import hidden
from ..mistakes import CODES
from . import judge, references
from .exercises import CHECK_TAG, exercise_number, parse_heading
from .sandbox import Limits, Sandbox, SandboxError, adopt_orphans, kill_adopted

DEFAULT_TIMEOUT_S = 60
DEFAULT_NOTEBOOK_TIMEOUT_S = 300
GRACE_S = 30  # a notebook's child process is killed this long after the notebook's time limit
RESULT_PREFIX = "attention-grade-result "
CODE = re.compile(r"^\[([A-Za-z0-9_-]+)\]")  # a diagnosis code at the start of a message
AUTO = "auto"  # reference=AUTO: the solutions/ folder of the current directory, if there is one
CHECK_MISSING = "check-missing"
TOTAL = "total"  # the `exercise` of a notebook's total row in the CSV


@dataclass
class ExerciseResult:
    exercise: int
    title: str
    level: str
    passed: bool
    code: str | None = None
    message: str | None = None


@dataclass
class NotebookResult:
    notebook: str
    exercises: list[ExerciseResult] = field(default_factory=list)
    error: str | None = None
    reference: str | None = None  # the solution notebook whose check cells were used; None: the notebook's own

    @property
    def passed(self) -> int:
        return sum(e.passed for e in self.exercises)

    @property
    def total(self) -> int:
        return len(self.exercises)

    def as_dict(self) -> dict:
        return {"notebook": self.notebook, "passed": self.passed, "total": self.total, "error": self.error,
                "reference": self.reference, "exercises": [asdict(e) for e in self.exercises]}


def _check_cells(nb) -> list[tuple[int, int, str, str]]:
    """(cell index, exercise number, title, level) of each check cell, in order."""
    found, heading, count = [], None, 0
    for i, cell in enumerate(nb.cells):
        h = parse_heading(cell)
        if h is not None:
            heading = h
            continue
        if cell.cell_type == "code" and CHECK_TAG in cell.get("metadata", {}).get("tags", []):
            count += 1
            number = exercise_number(cell) or (heading.number if heading else count)
            title = heading.title if heading and heading.number == number else ""
            level = heading.level if heading and heading.number == number else ""
            found.append((i, number, title, level))
    return found


def default_reference() -> Path | None:
    """The ``solutions/`` folder of the current directory (the course's root, where instructors grade), or None."""
    folder = Path.cwd() / "solutions"
    return folder if folder.is_dir() else None


def find_reference(notebook: str | Path, reference: str | Path | None = AUTO) -> Path | None:
    """The solution notebook whose check cells grade ``notebook``, or None.

    ``reference`` is a solution notebook (used for every submission), a folder of them (the one with the
    submission's name, or whose name the submission's name ends with after ``_``, ``-``, ``.`` or a space; the
    longest such match), ``AUTO`` (the ``solutions/`` folder of the current directory, if any) or None.
    """
    if reference == AUTO:
        reference = default_reference()
    if reference is None:
        return None
    reference = Path(reference)
    if reference.is_file():
        return reference
    name = Path(notebook).name
    matches = [p for p in reference.glob("*.ipynb")
               if name == p.name or (name.endswith(p.name) and name[-len(p.name) - 1] in "_-. ")]
    return max(matches, key=lambda p: len(p.name), default=None)


def _read(path: Path):
    """(notebook, None) or (None, the reason it cannot be graded)."""
    try:
        nb = nbformat.read(path, as_version=4)
        nbformat.validate(nb)
    except FileNotFoundError:
        return None, "no such file"
    except (OSError, UnicodeDecodeError) as err:
        return None, f"cannot read the file ({type(err).__name__})"
    except Exception as err:  # noqa: BLE001 - nbformat raises several kinds of errors for non-notebooks
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        return None, f"not a valid notebook ({type(err).__name__}: {first[:120]})"
    return nb, None


def _plan(nb, ref_nb):
    """[(exercise number, title, level, indices of its check cells in nb)]: the reference's exercises with the
    reference's check sources put into ``nb``, or, without a reference, ``nb``'s own check cells."""
    own = _check_cells(nb)
    if ref_nb is None:
        return [(number, title, level, [index]) for index, number, title, level in own]
    plan = []
    for ref_index, number, title, level in _check_cells(ref_nb):
        indices = [index for index, n, _, _ in own if n == number]
        for index in indices:
            nb.cells[index].source = ref_nb.cells[ref_index].source
        plan.append((number, title, level, indices))
    return plan


def class_exercises(ref_nb) -> dict[int, bool]:
    """``{exercise number: whether its reference solution gives the check a class}`` (a class handed to a
    function's check gets a clear message)."""
    found = {}
    for index, number, _, _ in _check_cells(ref_nb):
        definitions = references.definitions(ref_nb, index)
        exprs = judge.expressions(judge.parse_check(ref_nb.cells[index].source))
        found[number] = any(isinstance(definitions.get(e), ast.ClassDef) for e in exprs)
    return found


def _sandbox_cells(nb, plan) -> tuple[list[dict], dict]:
    """The job for the sandbox (every code cell; at check cells the expressions the check is given) and
    ``{check cell key: parsed checker calls or None}``."""
    check_indices = {index for *_, indices in plan for index in indices}
    cells, parsed = [], {}
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        entry = {"key": str(index), "source": cell.source, "check": None}
        if index in check_indices:
            calls = judge.parse_check(cell.source)
            parsed[str(index)] = calls
            entry["check"] = {"exprs": judge.expressions(calls), "run_in_sandbox": calls is None}
        cells.append(entry)
    return cells, parsed


def reference_uses(ref_nb) -> dict[int, set[str]]:
    """``{exercise number: the reference-like tokens its solution uses}``: what a submission may use too."""
    uses: dict[int, set[str]] = {}
    for index, number, _, _ in _check_cells(ref_nb):
        for expr in judge.expressions(judge.parse_check(ref_nb.cells[index].source)):
            uses.setdefault(number, set()).update(references.flagged(ref_nb, index, expr))
    return uses


def _judge_point(event, calls, sandbox, nb, index, allowed, class_allowed):
    """The outcome of one check cell reported by the sandbox; ``allowed``: what the reference solution uses
    (None: no reference, no check for calls to the reference); ``class_allowed``: whether this check takes a
    class. The verdict comes from the checker run here; only a check cell that is not a plain checker call (no
    reference) runs in the sandbox, and its report is taken as it is."""
    if calls is None:
        return judge.sandbox_verdict(event.get("verdict") or {})
    objects = event.get("objects") or {}
    for expr in judge.expressions(calls):
        info = objects.get(expr) or {}
        if info.get("kind") == "class" and not class_allowed:
            return False, "wrong-type", (f"[wrong-type] {expr} is a class; this exercise asks for a function "
                                         f"(see the exercise's instructions)")
        name = info.get("name") if info.get("kind") in ("function", "class") else None
        problem = None if allowed is None else references.forbidden_use(nb, index, expr, calls[0].checker, name,
                                                                         allowed)
        if problem:
            return False, "calls-reference", problem
    return judge.run_checks(calls, sandbox, str(index), objects, sandbox.limits.cell_s)


def run_in_sandbox(nb, plan, limits: Limits, uses: dict | None = None, classes: dict | None = None) -> dict:
    """``{cell index: (passed, code, message)}`` for the check cells that were reached; ``uses``: see
    :func:`reference_uses` (None: calls to the reference are not looked for)."""
    numbers = {index: number for number, _, _, indices in plan for index in indices}
    cells, parsed = _sandbox_cells(nb, plan)
    deadline = time.monotonic() + limits.notebook_s
    outcomes: dict = {}
    restart = True
    while restart and time.monotonic() < deadline and len(outcomes) < len(parsed):
        restart = False
        with Sandbox(cells, limits, deadline) as sandbox:
            try:
                sandbox.start()
                while True:
                    event = sandbox.next_event()
                    if event["op"] == "done":
                        break
                    key = str(event.get("key"))
                    if key in parsed and key not in outcomes:
                        number = numbers[int(key)]
                        allowed = None if uses is None else uses.get(number, set())
                        class_allowed = classes is None or classes.get(number, False)
                        outcomes[key] = _judge_point(event, parsed[key], sandbox, nb, int(key), allowed,
                                                     class_allowed)
                    if sandbox.closed:  # a call ran out of time: start again for the checks after this one
                        restart = True
                        break
                    sandbox.resume()
            except SandboxError:
                pass
    if time.monotonic() >= deadline:
        missing = (False, "timeout", f"the notebook ran longer than its time limit ({limits.notebook_s:g} s)")
    else:
        missing = (False, "not-run", "the cell did not run (the submission's process stopped before it)")
    for key in parsed:
        outcomes.setdefault(key, missing)
    return {int(k): v for k, v in outcomes.items()}


def grade_notebook(path: str | Path, timeout: int = DEFAULT_TIMEOUT_S, reference: str | Path | None = AUTO,
                   limits: Limits | None = None, seed: int | None = None) -> NotebookResult:
    """Run one notebook in a sandbox and grade its check cells (the reference's, see the module docstring),
    with the checkers' hidden cases drawn from ``seed`` (default: a fresh random seed)."""
    limits = limits or Limits(cell_s=timeout, notebook_s=max(DEFAULT_NOTEBOOK_TIMEOUT_S, timeout))
    with hidden.drawn_from(secrets.randbelow(2**31) if seed is None else seed):
        return _grade_notebook(path, reference, limits)


def _grade_notebook(path, reference, limits) -> NotebookResult:
    result = NotebookResult(str(path))
    path = Path(path)
    nb, result.error = _read(path)
    if nb is None:
        return result
    ref_path, ref_nb = find_reference(path, reference), None
    if ref_path is not None:
        ref_nb, problem = _read(ref_path)
        if ref_nb is None or not _check_cells(ref_nb):
            result.error = f"reference notebook {ref_path}: {problem or 'no check cells'}"
            return result
        result.reference = str(ref_path)
    plan = _plan(nb, ref_nb)
    if not plan:
        result.error = "no check cells (cells tagged 'check') found"
        return result
    uses, classes = (reference_uses(ref_nb), class_exercises(ref_nb)) if ref_nb is not None else (None, None)
    outcomes = run_in_sandbox(nb, plan, limits, uses, classes) if any(indices for *_, indices in plan) else {}
    for number, title, level, indices in plan:
        if not indices:
            result.exercises.append(ExerciseResult(
                number, title, level, False, CHECK_MISSING, f"the check cell of exercise {number} (tags 'check' and "
                f"'exercise-{number}') is missing from the notebook: restore it from the exercise notebook"))
            continue
        found = [outcomes[index] for index in indices]  # several copies: all must pass
        passed, code, message = next((o for o in found if not o[0]), found[0])
        result.exercises.append(ExerciseResult(number, title, level, passed, code, message))
    return result


def grade(paths, timeout: int = DEFAULT_TIMEOUT_S, reference: str | Path | None = AUTO,
          limits: Limits | None = None, seed: int | None = None) -> list[NotebookResult]:
    """Grade each notebook in this process, one after the other (the command line runs them in parallel)."""
    return [grade_notebook(p, timeout, reference, limits, seed) for p in paths]


def hint(result: ExerciseResult) -> str:
    """What a failed exercise's code means: the catalogue's description, else the check's own message."""
    if result.code in CODES:
        return CODES[result.code]
    return CODE.sub("", result.message or "").strip()


def format_table(results: list[NotebookResult]) -> str:
    lines = []
    for r in results:
        if r.error:
            lines.append(f"ERROR {r.notebook}: {r.error}")
            continue
        own = "" if r.reference else "  (its own check cells: no reference notebook)"
        lines.append(f"{r.notebook}: {r.passed}/{r.total}{own}")
        width = max((len(e.title) for e in r.exercises), default=0)
        for e in r.exercises:
            status = "pass" if e.passed else "FAIL"
            code = f"  [{e.code}]" if e.code else ""
            lines.append(f"  Exercise {e.exercise:<3} {e.title:<{width}}  {status}{code}".rstrip())
            if not e.passed and hint(e):
                lines.append(f"{'':15}hint: {hint(e)}")
    return "\n".join(lines)


def format_json(results: list[NotebookResult]) -> str:
    return json.dumps({"notebooks": [r.as_dict() for r in results]}, indent=2, ensure_ascii=False)


def format_csv(results: list[NotebookResult]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["notebook", "exercise", "title", "level", "passed", "code", "message"])
    for r in results:
        if r.error:
            writer.writerow([r.notebook, "", "", "", "", "error", r.error])
        for e in r.exercises:
            writer.writerow([r.notebook, e.exercise, e.title, e.level, int(e.passed), e.code or "", e.message or ""])
        if not r.error:
            writer.writerow([r.notebook, TOTAL, "", "", r.passed, "", f"{r.passed}/{r.total}"])
    return buf.getvalue()


def _from_dict(data: dict) -> NotebookResult:
    result = NotebookResult(str(data["notebook"]), error=data.get("error"), reference=data.get("reference"))
    result.exercises = [ExerciseResult(**e) for e in data.get("exercises", [])]
    return result


_CHILDREN_LOCK = threading.Lock()
_LIVE_CHILDREN: set[int] = set()  # the per-notebook processes this process started and still waits for


def _grade_in_child(path: str, args) -> NotebookResult:
    """Grade one notebook in a child process of its own: whatever happens to it, this process and the batch go
    on, and the child is killed at the notebook's time limit plus a grace period. Then every orphan this process
    adopted (see :func:`.sandbox.adopt_orphans`) is killed: a submission that killed its grader process does not
    leave processes behind, even under the rlimit backend."""
    cmd = [sys.executable, "-m", "attention_course.course.grade", "--one", path, "--timeout", str(args.timeout),
           "--notebook-timeout", str(args.notebook_timeout), "--memory-mb", str(args.memory_mb),
           "--seed", str(args.seed)]
    cmd += ["--no-reference"] if args.reference is None else ["--solutions", str(args.reference)]
    try:
        with _CHILDREN_LOCK:  # registered before another thread can take it for an orphan
            child = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True, start_new_session=True)
            _LIVE_CHILDREN.add(child.pid)
        try:
            out, _ = child.communicate(timeout=args.notebook_timeout + GRACE_S)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
            return NotebookResult(path, error=f"grading took longer than {args.notebook_timeout + GRACE_S:g} s")
        finally:
            with _CHILDREN_LOCK:
                _LIVE_CHILDREN.discard(child.pid)
                kill_adopted(keep=set(_LIVE_CHILDREN))
        lines = [line for line in out.splitlines() if line.startswith(RESULT_PREFIX)]
        if child.returncode == 0 and len(lines) == 1:
            return _from_dict(json.loads(lines[0][len(RESULT_PREFIX):]))
        return NotebookResult(path, error=f"the grader's process for this notebook failed (exit {child.returncode})")
    except (OSError, ValueError, TypeError, KeyError) as err:
        return NotebookResult(path, error=f"the grader's process for this notebook failed ({type(err).__name__})")


class _Writer:
    """Writes each result as soon as it is known, in the chosen format (``--json``: one document at the end)."""

    def __init__(self, fmt: str, out=None):
        self.fmt, self.out, self.lock, self.results = fmt, out or sys.stdout, threading.Lock(), []
        if fmt == "csv":
            self._write(format_csv([]).rstrip("\n"))

    def _write(self, text: str) -> None:
        self.out.write(text + "\n")
        self.out.flush()

    def add(self, result: NotebookResult) -> None:
        with self.lock:
            self.results.append(result)
            if self.fmt == "jsonl":
                self._write(json.dumps(result.as_dict(), ensure_ascii=False))
            elif self.fmt == "csv":
                rows = format_csv([result]).rstrip("\n").split("\n", 1)
                if len(rows) > 1:
                    self._write(rows[1])
            elif self.fmt == "table":
                self._write(format_table([result]))

    def finish(self, order: list[str]) -> None:
        if self.fmt == "json":
            rank = {p: i for i, p in enumerate(order)}
            self._write(format_json(sorted(self.results, key=lambda r: rank.get(r.notebook, len(rank)))))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m attention_course.grade",
                                     description="Run exercise notebooks in a sandbox and report which exercises pass.")
    parser.add_argument("notebooks", nargs="*", help="submitted .ipynb files")
    fmt = parser.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="print one JSON document at the end")
    fmt.add_argument("--jsonl", action="store_true", help="print one JSON line per notebook as soon as it is graded")
    fmt.add_argument("--csv", action="store_true", help="print CSV (one row per exercise)")
    parser.add_argument("--timeout", type=int, default=DEFAULT_TIMEOUT_S, help="time limit per cell, in seconds")
    parser.add_argument("--notebook-timeout", type=int, default=DEFAULT_NOTEBOOK_TIMEOUT_S,
                        help="time limit per notebook, in seconds")
    parser.add_argument("--memory-mb", type=int, default=Limits.memory_mb, help="memory limit per notebook")
    parser.add_argument("--seed", type=int, default=None,
                        help="seed of the checkers' hidden cases (default: a random one per run)")
    parser.add_argument("-j", "--jobs", type=int, default=1, help="notebooks graded in parallel")
    parser.add_argument("--one", metavar="NOTEBOOK", help=argparse.SUPPRESS)  # the child process of _grade_in_child
    ref = parser.add_mutually_exclusive_group()
    ref.add_argument("--solutions", "--reference", dest="reference", metavar="PATH", default=AUTO,
                     help="folder of solution notebooks (matched by name) or one solution notebook whose check cells "
                     "grade the submissions (default: ./solutions, if there is one)")
    ref.add_argument("--no-reference", dest="reference", action="store_const", const=None,
                     help="grade each notebook with its own check cells")
    args = parser.parse_args(argv)
    if args.reference not in (AUTO, None) and not Path(args.reference).exists():
        parser.error(f"--solutions {args.reference}: no such file or folder")
    if args.jobs < 1 or args.timeout < 1 or args.notebook_timeout < 1 or args.memory_mb < 64:
        parser.error("--jobs, --timeout, --notebook-timeout must be positive and --memory-mb at least 64")
    if args.reference not in (AUTO, None):
        args.reference = Path(args.reference).resolve()
    elif args.reference == AUTO:
        args.reference = default_reference()
    args.seed = secrets.randbelow(2**31) if args.seed is None else args.seed
    if args.seed < 0:
        parser.error("--seed must be a non-negative integer")
    limits = Limits(cell_s=args.timeout, notebook_s=args.notebook_timeout, memory_mb=args.memory_mb)
    adopt_orphans()
    if args.one:
        result = grade_notebook(args.one, args.timeout, args.reference, limits, args.seed)
        kill_adopted()
        sys.stdout.write(RESULT_PREFIX + json.dumps(result.as_dict(), ensure_ascii=False) + "\n")
        return 0
    if not args.notebooks:
        parser.error("give at least one notebook")
    writer = _Writer("json" if args.json else "jsonl" if args.jsonl else "csv" if args.csv else "table")
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = [pool.submit(_grade_in_child, str(p), args) for p in args.notebooks]
        for future in as_completed(futures):
            writer.add(future.result())
    writer.finish([str(p) for p in args.notebooks])
    return 0


if __name__ == "__main__":  # pragma: no cover - tested through main()
    sys.exit(main())
