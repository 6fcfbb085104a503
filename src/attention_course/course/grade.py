"""Grade one submitted exercise notebook: run it in a sandbox, judge its exercises in the grader's process.

Untrusted code only computes; trusted code judges. Each notebook runs in a disposable sandbox (:mod:`.sandbox`;
the code runs in :mod:`.worker`), top to bottom, with errors allowed so that a broken exercise does not stop the
later ones, a time limit per cell and per notebook. An exercise is found by its check cell; the check cells are
the reference notebook's (:mod:`.canonical`). The sandbox does not run a check cell such as
``checks.check_softmax(softmax)``: it reports what ``softmax`` is, and the checker runs here, in the grader's
process, calling the student's function through a stand-in that sends the inputs to the sandbox and gets the
outputs back (:mod:`.judge`); a class is built, loaded with weights and called by reference the same way. The
checkers add hidden cases drawn from a seed (default: random per run; :mod:`attention_course.checks.hidden`).
A function or class that calls the reference implementation fails with ``calls-reference`` (:mod:`.references`).
Only a check cell that is not a plain ``checks.check_*(...)`` call, which can happen only without a reference,
runs inside the sandbox (see the instructor guide).

An exercise whose check cell the submission no longer has (deleted, or its tags removed) fails with the code
``check-missing``; it still counts in the total. Without a reference the notebook's own check cells are graded,
and the result says so. The command line is :mod:`.cli`; the results and their formats are :mod:`.results`.
"""

from __future__ import annotations

import secrets
import time
from pathlib import Path

from ..checks import hidden
from . import canonical, judge, references, wire
from .canonical import AUTO, Exercise, Reference
from .results import ExerciseResult, NotebookResult
from .sandbox import Limits, Sandbox, SandboxError, bwrap_works, describe

DEFAULT_TIMEOUT_S = 60
DEFAULT_NOTEBOOK_TIMEOUT_S = 300
CHECK_MISSING = "check-missing"


def _sandbox_cells(nb, exercises: list[Exercise]) -> tuple[list[dict], dict]:
    """The job for the sandbox (every code cell; at check cells the expressions the check is given) and
    ``{check cell key: (exercise, its checker calls or None)}``."""
    at = {index: exercise for exercise in exercises for index in exercise.indices}
    cells, points = [], {}
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        entry = {"key": str(index), "source": cell.source, "check": None}
        if index in at:
            calls = at[index].calls
            points[str(index)] = at[index]
            entry["check"] = {"exprs": canonical.expressions(calls), "run_in_sandbox": calls is None}
        cells.append(entry)
    return cells, points


def _judge_point(event, exercise: Exercise, sandbox, cells, index, reference: Reference | None):
    """The outcome of one check cell reported by the sandbox; ``cells``: the submission's parsed cells (see
    :func:`.references.parse_cells`), read for calls to the reference when there is a reference (what its
    solution uses is allowed, and whether its check takes a class). The verdict comes from the checker run here;
    only a check cell that is not a plain checker call (no reference) runs in the sandbox, and its report is taken
    as it is."""
    calls = exercise.calls
    if calls is None:
        return judge.sandbox_verdict(event.get("verdict") or {})
    objects = event.get("objects") or {}
    class_allowed = reference is None or reference.classes.get(exercise.number, False)
    for expr in canonical.expressions(calls):
        info = objects.get(expr) or {}
        if info.get("kind") == wire.CLASS and not class_allowed:
            return False, "wrong-type", (f"[wrong-type] {expr} is a class; this exercise asks for a function "
                                         f"(see the exercise's instructions)")
        if reference is None:
            continue
        name = info.get("name") if info.get("kind") in (wire.FUNCTION, wire.CLASS) else None
        problem = references.forbidden_use(cells, index, expr, calls[0].checker, name,
                                           reference.uses.get(exercise.number, set()))
        if problem:
            return False, "calls-reference", problem
    return judge.run_checks(calls, sandbox, str(index), objects, sandbox.limits.cell_s)


def run_in_sandbox(nb, exercises: list[Exercise], limits: Limits, reference: Reference | None = None) -> dict:
    """``{cell index: (passed, code, message)}`` for the check cells that were reached; ``reference``: see
    :func:`_judge_point` (None: calls to the reference are not looked for)."""
    sandbox_cells, points = _sandbox_cells(nb, exercises)
    cells = references.parse_cells(nb) if reference is not None else []
    deadline = time.monotonic() + limits.notebook_s
    outcomes: dict = {}
    restart = True
    while restart and time.monotonic() < deadline and len(outcomes) < len(points):
        restart = False
        with Sandbox(sandbox_cells, limits, deadline) as sandbox:
            try:
                sandbox.start()
                while True:
                    event = sandbox.next_event()
                    if event["op"] == wire.DONE:
                        break
                    key = str(event.get("key"))
                    if key in points and key not in outcomes:
                        outcomes[key] = _judge_point(event, points[key], sandbox, cells, int(key), reference)
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
    for key in points:
        outcomes.setdefault(key, missing)
    return {int(k): v for k, v in outcomes.items()}


def grade_notebook(path: str | Path, timeout: int = DEFAULT_TIMEOUT_S, reference: str | Path | None = AUTO,
                   limits: Limits | None = None, seed: int | None = None) -> NotebookResult:
    """Run one notebook in a sandbox and grade its check cells (the reference's, see :mod:`.canonical`), with
    the checkers' hidden cases drawn from ``seed`` (default: a fresh random seed)."""
    limits = limits or Limits(cell_s=timeout, notebook_s=max(DEFAULT_NOTEBOOK_TIMEOUT_S, timeout))
    with hidden.drawn_from(secrets.randbelow(2**31) if seed is None else seed):
        return _grade_notebook(path, reference, limits)


def _grade_notebook(path, reference, limits) -> NotebookResult:
    result = NotebookResult(str(path), isolation=describe(limits))
    if limits.isolation == "bwrap" and not bwrap_works():
        result.error = ("bubblewrap is not available here: install it (apt-get install bubblewrap), or ask for the "
                        "weaker isolation (--isolation=rlimit)")
        return result
    path = Path(path)
    nb, result.error = canonical.read_notebook(path)
    if nb is None:
        return result
    ref_path, ref = canonical.find_reference(path, reference), None
    if ref_path is not None:
        ref = Reference.read(ref_path)
        if isinstance(ref, str):
            result.error = ref
            return result
        result.reference = str(ref_path)
    exercises = canonical.plan(nb, ref)
    if not exercises:
        result.error = "no check cells (cells tagged 'check') found"
        return result
    outcomes = run_in_sandbox(nb, exercises, limits, ref) if any(e.indices for e in exercises) else {}
    for e in exercises:
        if not e.indices:
            result.exercises.append(ExerciseResult(
                e.number, e.title, e.level, False, CHECK_MISSING, f"the check cell of exercise {e.number} (tags "
                f"'check' and 'exercise-{e.number}') is missing from the notebook: restore it from the exercise "
                "notebook"))
            continue
        found = [outcomes[index] for index in e.indices]  # several copies: all must pass
        passed, code, message = next((o for o in found if not o[0]), found[0])
        result.exercises.append(ExerciseResult(e.number, e.title, e.level, passed, code, message))
    return result


def grade(paths, timeout: int = DEFAULT_TIMEOUT_S, reference: str | Path | None = AUTO,
          limits: Limits | None = None, seed: int | None = None) -> list[NotebookResult]:
    """Grade each notebook in this process, one after the other (the command line runs them in parallel)."""
    return [grade_notebook(p, timeout, reference, limits, seed) for p in paths]
