"""Grade one submitted exercise notebook: run it in a sandbox, judge its
exercises in the grader's process.

Untrusted code only computes; trusted code judges. Each notebook runs in a
disposable sandbox (:mod:`.sandbox`; the code runs in :mod:`.worker`), top to
bottom, with errors allowed so that a broken exercise does not stop the later
ones, a time limit per cell and per notebook. An exercise is found by its check
cell; the check cells are the reference notebook's (:mod:`.canonical`). The
sandbox does not run a check cell such as ``checks.check_softmax(softmax)``: it
reports what ``softmax`` is, and the checker runs here, in the grader's
process, calling the student's function through a stand-in that sends the
inputs to the sandbox and gets the outputs back (:mod:`.judge`); a class is
built, loaded with weights and called by reference the same way. The checkers
add hidden cases drawn from a seed (default: random per run;
:mod:`attention_course.checks.hidden`). A function or class that calls the
reference implementation fails with ``calls-reference`` (:mod:`.references`).

Public and hidden cases: a check runs once with the hidden cases on (public
cases first, then hidden ones); when it fails and its checker draws hidden
cases (:func:`.points.draws_hidden`), it runs again with them off, on the same
submission in the same sandbox: passing then means that the public cases passed
and a hidden one failed, and the exercise earns its public share
(:mod:`.points`); a stub still raising ``NotImplementedError`` is not run
again. Each check's time is measured, calls into the sandbox included. A
notebook whose exercise titles and title are all unlike its reference's is
another chapter's: an error, not a row of failures. Only a check cell that is
not a plain ``checks.check_*(...)`` call, which can happen only without a
reference, runs inside the sandbox (see the instructor guide).

A check cell whose tags were lost is recognised by its text (the reference's).
An exercise whose check cell the submission no longer has (deleted, or its tags
removed and its text changed) fails with the code ``check-missing``; it still
counts in the total. What an honest student needs to act on is reported too:
the errors of the cells that are not checks (``cell_errors``; a ``NameError``
names the cell that raised before it, e.g. an import that failed) and a
notebook from an older version of the course (``notes``: its exercises are not
the reference's). The outputs of every cell that ran (``outputs``: what it
printed, displayed, drew and raised, cleaned and bounded by
:func:`.wire.clean_outputs`) are kept for the instructor's review notebook,
never the ones the student saved. Without a reference the notebook's own check
cells are graded, and the result says so. The command line is :mod:`.cli`; the
results and their formats are :mod:`.results`.
"""

from __future__ import annotations

import contextlib
import secrets
import time
from pathlib import Path

from ..checks import hidden
from . import canonical, judge, references, wire
from .canonical import AUTO, Exercise, Reference
from .points import Points, draws_hidden
from .points import score as points_score
from .results import ExerciseResult, NotebookResult
from .sandbox import Limits, Sandbox, SandboxError, bwrap_works, describe

DEFAULT_TIMEOUT_S = 60
DEFAULT_NOTEBOOK_TIMEOUT_S = 300
CHECK_MISSING = "check-missing"
# failures that a run with the public cases only cannot turn into a pass:
# decided before any case ran, or (a stub still raising NotImplementedError) at
# the first public case; and a check stopped by its time limit, which is not
# run again for its public share (its time limit a second time)
NOT_RUN_AGAIN = {"calls-reference", "wrong-type", "not-implemented", "timeout"}


def _sandbox_cells(nb, exercises: list[Exercise]) -> tuple[list[dict], dict]:
    """The job for the sandbox (every code cell; at check cells the expressions
    the check is given) and ``{check cell key: (exercise, its checker calls or
    None)}``."""
    at = {
        index: exercise for exercise in exercises for index in exercise.indices
    }
    cells, points = [], {}
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        entry = {"key": str(index), "source": cell.source, "check": None}
        if index in at:
            calls = at[index].calls
            points[str(index)] = at[index]
            entry["check"] = {
                "exprs": canonical.expressions(calls),
                "run_in_sandbox": calls is None,
            }
        cells.append(entry)
    return cells, points


@contextlib.contextmanager
def _public_cases_only():
    """The hidden cases off inside the ``with`` block, the previous state
    restored after it."""
    with hidden.drawn_from(0):  # saves and restores the state around the block
        hidden.disable()
        yield


def _judge_point(
    event,
    exercise: Exercise,
    sandbox,
    cells,
    index,
    reference: Reference | None,
):
    """The outcome of one check cell reported by the sandbox, ``(passed, code,
    message, public_passed, seconds)``; ``cells``: the submission's parsed
    cells (see :func:`.references.parse_cells`), read for calls to the
    reference when there is a reference (what its solution uses is allowed, and
    whether its check takes a class). The verdict comes from the checker run
    here (then, after a failure, once more with the public cases only, see the
    module docstring); only a check cell that is not a plain checker call (no
    reference) runs in the sandbox, and its report is taken as it is."""
    start = time.monotonic()
    passed, code, message = _verdict(
        event, exercise, sandbox, cells, index, reference
    )
    public = passed
    if not passed and code not in NOT_RUN_AGAIN and _has_hidden(exercise):
        if sandbox.closed:
            # the submission's process is gone: its public cases cannot be run
            # again
            public = None
        else:
            with _public_cases_only():
                rerun = judge.run_checks(
                    exercise.calls,
                    sandbox,
                    str(index),
                    event.get("objects") or {},
                    sandbox.limits.cell_wall_s,
                )
            public = rerun[0]
            # report the public case's failure: the one the student's notebook
            # shows
            if not public:
                passed, code, message = rerun
    return passed, code, message, public, round(time.monotonic() - start, 3)


def _has_hidden(exercise: Exercise) -> bool:
    return exercise.calls is not None and any(
        draws_hidden(c.checker) for c in exercise.calls
    )


def _verdict(
    event,
    exercise: Exercise,
    sandbox,
    cells,
    index,
    reference: Reference | None,
):
    calls = exercise.calls
    if calls is None:
        return judge.sandbox_verdict(event.get("verdict") or {})
    objects = event.get("objects") or {}
    class_allowed = reference is None or reference.classes.get(
        exercise.number, False
    )
    for expr in canonical.expressions(calls):
        info = objects.get(expr) or {}
        if info.get("kind") == wire.CLASS and not class_allowed:
            return (
                False,
                "wrong-type",
                (
                    f"[wrong-type] {expr} is a class; this exercise asks "
                    "for a function "
                    f"(see the exercise's instructions)"
                ),
            )
        if reference is None:
            continue
        name = (
            info.get("name")
            if info.get("kind") in (wire.FUNCTION, wire.CLASS)
            else None
        )
        problem = references.forbidden_use(
            cells,
            index,
            expr,
            calls[0].checker,
            name,
            reference.uses.get(exercise.number, set()),
        )
        if problem:
            return False, "calls-reference", problem
    return judge.run_checks(
        calls, sandbox, str(index), objects, sandbox.limits.cell_wall_s
    )


MAX_CELL_ERRORS = 50  # errors of cells that are not checks, kept per notebook


def _collect_errors(event: dict, errors: dict) -> None:
    """Add the errors of cells that are not checks reported with ``event``
    (untrusted: checked, each text cut) to ``errors``, ``{cell index:
    (exception name, message)}``."""
    reported = event.get("errors")
    for item in (
        reported[:MAX_CELL_ERRORS] if isinstance(reported, list) else []
    ):
        key = item.get("key") if isinstance(item, dict) else None
        if (
            isinstance(key, str)
            and key.isdigit()
            and len(errors) < MAX_CELL_ERRORS
        ):
            errors.setdefault(
                int(key),
                (str(item.get("etype"))[:100], str(item.get("message"))[:300]),
            )


def _collect_outputs(event: dict, outputs: dict) -> None:
    """Add the cells' outputs reported with ``event`` (cleaned by
    :func:`.wire.outputs_of`) to ``outputs``, ``{cell index: outputs}``, the
    first run's where the sandbox was started again, within the notebook's
    :data:`.wire.MAX_OUTPUT_CHARS`."""
    room = wire.MAX_OUTPUT_CHARS - sum(
        wire.output_chars(o) for o in outputs.values()
    )
    for key, cell in (event.get(wire.OUTPUTS) or {}).items():
        if int(key) not in outputs and room > 0:
            outputs[int(key)] = wire.clean_outputs(cell, room)
            room -= wire.output_chars(outputs[int(key)])


def run_in_sandbox(
    nb,
    exercises: list[Exercise],
    limits: Limits,
    reference: Reference | None = None,
    errors: dict | None = None,
    outputs: dict | None = None,
) -> dict:
    """``{cell index: (passed, code, message, public_passed, seconds)}`` for
    the check cells that were reached;
    ``reference``: see :func:`_judge_point` (None: calls to the reference are
    not looked for); ``errors``, if given, gets the errors of the cells that
    are not checks (see :func:`_collect_errors`), ``outputs`` the outputs of
    the cells that ran (see :func:`_collect_outputs`)."""
    errors = {} if errors is None else errors
    outputs = {} if outputs is None else outputs
    sandbox_cells, points = _sandbox_cells(nb, exercises)
    cells = references.parse_cells(nb) if reference is not None else []
    deadline = time.monotonic() + limits.notebook_s
    outcomes: dict = {}
    restart = True
    while (
        restart and time.monotonic() < deadline and len(outcomes) < len(points)
    ):
        restart = False
        with Sandbox(sandbox_cells, limits, deadline) as sandbox:
            try:
                sandbox.start()
                while True:
                    event = sandbox.next_event()
                    _collect_errors(event, errors)
                    _collect_outputs(event, outputs)
                    if event["op"] == wire.DONE:
                        break
                    key = str(event.get("key"))
                    if key in points and key not in outcomes:
                        outcomes[key] = _judge_point(
                            event,
                            points[key],
                            sandbox,
                            cells,
                            int(key),
                            reference,
                        )
                    # a call ran out of time: start again for the checks after
                    # this one
                    if sandbox.closed:
                        restart = True
                        break
                    sandbox.resume()
            except SandboxError:
                pass
    if time.monotonic() >= deadline:
        missing = (
            False,
            "timeout",
            "the notebook ran longer than its time limit "
            f"({limits.notebook_s:g} s)",
            False,
            None,
        )
    else:
        missing = (
            False,
            "not-run",
            "the cell did not run (the submission's process stopped before "
            "it)",
            False,
            None,
        )
    for key in points:
        outcomes.setdefault(key, missing)
    return {int(k): v for k, v in outcomes.items()}


def grade_notebook(
    path: str | Path,
    timeout: int = DEFAULT_TIMEOUT_S,
    reference: str | Path | None = AUTO,
    limits: Limits | None = None,
    seed: int | None = None,
    points: Points | None = None,
) -> NotebookResult:
    """Run one notebook in a sandbox and grade its check cells (the
    reference's, see :mod:`.canonical`), with the checkers' hidden cases drawn
    from ``seed`` (default: a fresh random seed); each exercise scored with
    ``points`` (default: the defaults of :mod:`.points`)."""
    limits = limits or Limits(
        cell_s=timeout, notebook_s=max(DEFAULT_NOTEBOOK_TIMEOUT_S, timeout)
    )
    with hidden.drawn_from(secrets.randbelow(2**31) if seed is None else seed):
        result = _grade_notebook(path, reference, limits)
    return score_result(result, points or Points())


def score_result(result: NotebookResult, points: Points) -> NotebookResult:
    """Give each exercise of ``result`` its points (see :mod:`.points`); the
    name matched is the reference's."""
    name = Path(result.reference or result.notebook).stem
    for e in result.exercises:
        e.max_points, share = points.of(name, e.exercise, e.level)
        e.hidden_share = share if e.hidden_cases else 0.0
        e.points = round(
            points_score(
                e.passed, e.public_passed, e.max_points, e.hidden_share
            ),
            4,
        )
    return result


def _other_chapter(nb, ref: Reference, ref_nb_title: str | None) -> str | None:
    """Why ``nb`` looks like another chapter's notebook than its reference's,
    or None: its title differs and none of its exercise titles is one of the
    reference's."""
    own = {c.title for c in canonical.check_cells(nb) if c.title} | {
        h.title
        for h in map(canonical.parse_heading, nb.cells)
        if h is not None
    }
    title = canonical.notebook_title(nb)
    if (
        own & {c.title for c in ref.checks}
        or title is None
        or ref_nb_title is None
    ):
        return None
    if _chapter_part(title) == _chapter_part(ref_nb_title):
        return None
    return (
        "this notebook looks like another chapter's: its title is "
        f"{title!r} and none of its exercises is one "
        f"of {ref.path.name}'s (titled {ref_nb_title!r}); submit the "
        "notebook of this chapter under its name"
    )


def _older_version(nb, ref: Reference) -> str | None:
    """Why ``nb``, a notebook of its reference's chapter, looks like an older
    version of it (its exercises are not the reference's: another title under
    one number, or other numbers), or None."""
    own = {
        h.number: h.title
        for h in map(canonical.parse_heading, nb.cells)
        if h is not None
    }
    current = {c.number: c.title for c in ref.checks}
    if not own or own == current:
        return None
    changed = [n for n in sorted(own) if n in current and own[n] != current[n]]
    if changed:
        n = changed[0]
        detail = (
            f"exercise {n} is {own[n]!r} here and {current[n]!r} in the "
            "current version"
        )
    elif set(own) != set(current):
        detail = (
            f"it has exercises {', '.join(map(str, sorted(own)))}; the "
            "current version has "
            f"{', '.join(map(str, sorted(current)))}"
        )
    else:
        return None
    return (
        "this notebook is from an older version of the course "
        f"({ref.path.name}: {detail}): download the "
        "current exercise notebook and move your answers into it"
    )


def _chapter_part(title: str) -> str:
    return title.split(":", 1)[-1].strip().lower()


def _grade_notebook(path, reference, limits) -> NotebookResult:
    result = NotebookResult(str(path), isolation=describe(limits))
    if limits.isolation == "bwrap" and not bwrap_works():
        result.error = (
            "bubblewrap is not available here: install it (apt-get install "
            "bubblewrap), or ask for the "
            "weaker isolation (--isolation=rlimit)"
        )
        result.grader_failed = True
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
        result.error = _other_chapter(nb, ref, ref.title)
        if result.error:
            return result
        result.notes = [note for note in [_older_version(nb, ref)] if note]
    exercises = canonical.plan(nb, ref)
    if not exercises:
        result.error = "no check cells (cells tagged 'check') found"
        return result
    errors: dict[int, tuple[str, str]] = {}
    outputs: dict[int, list[dict]] = {}
    outcomes = (
        run_in_sandbox(nb, exercises, limits, ref, errors, outputs)
        if any(e.indices for e in exercises)
        else {}
    )
    result.outputs = {
        str(index): cell for index, cell in sorted(outputs.items())
    }
    result.cell_errors = [
        [index + 1, etype, message]
        for index, (etype, message) in sorted(errors.items())
        if "raises-exception"
        not in nb.cells[index].get("metadata", {}).get("tags", [])
    ]
    for e in exercises:
        if not e.indices:
            result.exercises.append(
                ExerciseResult(
                    e.number,
                    e.title,
                    e.level,
                    False,
                    CHECK_MISSING,
                    f"the check cell of exercise {e.number} (tags "
                    f"'check' and 'exercise-{e.number}') is missing from "
                    "the notebook: restore it from the exercise "
                    "notebook",
                )
            )
            continue
        # several copies: all must pass
        found = [outcomes[index] for index in e.indices]
        passed, code, message, _, _ = next(
            (o for o in found if not o[0]), found[0]
        )
        if code == "NameError":
            message = f"{message}{_failed_before(errors, e.indices[0])}"
        public = (
            all(o[3] for o in found)
            if all(o[3] is not None for o in found)
            else None
        )
        seconds = (
            None
            if any(o[4] is None for o in found)
            else round(sum(o[4] for o in found), 3)
        )
        result.exercises.append(
            ExerciseResult(
                e.number,
                e.title,
                e.level,
                passed,
                code,
                message,
                public,
                _has_hidden(e),
                seconds,
            )
        )
    return result


def _failed_before(errors: dict, index: int) -> str:
    """What a student needs next to a ``NameError``: the cell before the check
    that raised (an import that failed first), or nothing."""
    before = [(i, e) for i, e in sorted(errors.items()) if i < index]
    imports = [
        (i, e)
        for i, e in before
        if e[0] in ("ModuleNotFoundError", "ImportError")
    ]
    if not (imports or before):
        return ""
    i, (etype, message) = (imports or before)[0]
    return f" (cell {i + 1} raised {etype} before it: {message})"


def grade(
    paths,
    timeout: int = DEFAULT_TIMEOUT_S,
    reference: str | Path | None = AUTO,
    limits: Limits | None = None,
    seed: int | None = None,
    points: Points | None = None,
) -> list[NotebookResult]:
    """Grade each notebook in this process, one after the other (the command
    line runs them in parallel)."""
    return [
        grade_notebook(p, timeout, reference, limits, seed, points)
        for p in paths
    ]
