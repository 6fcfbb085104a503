"""The grader's command line: ``python -m attention_course.grade NOTEBOOK...``.

Usage::

    python -m attention_course.grade NOTEBOOK... [--json | --jsonl | --csv] [-j N] [--timeout SECONDS]
        [--notebook-timeout SECONDS] [--memory-mb MB] [--seed N] [--solutions PATH | --no-reference]
        [--points FILE]
    python -m attention_course.grade class SUBMISSIONS --out RESULTS [-j N] [--regrade] ...   # .classroom
    python -m attention_course.grade bundle --out DIR ...       # Gradescope's autograder (.gradescope)
    python -m attention_course.grade gradescope --submission DIR --results FILE ...  # inside Gradescope

Points (:mod:`.points`): each exercise is worth its level's points (warm-up 1,
core 2, challenge 3), half of them on its hidden cases where its check has them
(public cases passed, a hidden one failed: the other half, ``PART``);
``--points FILE`` (TOML) overrides them per level and per exercise, validated
before anything is graded.

Each notebook is graded by :func:`.grade.grade_notebook` (a sandbox runs it,
the checkers judge here) in a child process of its own; ``--timeout`` (default
60 s) limits each cell and ``--notebook-timeout`` (default 300 s) each
notebook; the checkers' hidden cases are drawn from ``--seed`` (default: random
per run).

Canonical check cells (:mod:`.canonical`): a submission is graded against the
check cells of its **reference** notebook, the solution notebook of the same
name in ``--solutions DIR`` (also spelled ``--reference DIR``; default: the
``solutions/`` folder of the course's repository that this package belongs to,
never the current folder's); a name with a prefix also matches, e.g.
``ada_lovelace_04_masking_exercises.ipynb`` is graded against
``04_masking_exercises.ipynb``. ``--solutions FILE`` grades every submission
against that one solution notebook (for renamed files). Without a reference
(``--no-reference``, or no matching name) the notebook's own check cells are
graded, and the table says so.

Files: only regular files of at most 8 MB are graded; a symbolic link, a device
or a FIFO is refused with an ``ERROR`` line. The grader never imports a module
from the current folder, with or without ``-P``: the package drops that folder
from the import path before its first import when it runs as the grader
(:mod:`attention_course._safe_path`); ``-P`` also keeps out a file named
``attention_course.py`` there.

Output (:mod:`.results`): each notebook's result is written as soon as it is
known (``-j N`` grades N notebooks at once, each in a child process of its own,
so a crash loses nothing already written and the batch goes on): a table per
notebook with totals such as ``3/5 exercises, 7/11 points``, ``--jsonl`` (one
JSON object per line), ``--csv`` (header first, then rows, with a ``total`` row
per notebook), or ``--json`` (one document at the end). Nothing a submission
prints reaches this output. A notebook that cannot be read (missing, not JSON,
not a notebook) gets an ``ERROR`` line and the others are still graded; an
error of the grader itself (its process for the notebook crashed or ran out of
time) shows the child's own last error line. Exit status: 0 when every notebook
was graded; 1 when any got an ``ERROR``; 2 for a command-line usage error
(including a ``--solutions`` path that does not exist).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import secrets
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from .canonical import AUTO, check_cells, default_reference, read_notebook
from .grade import (
    DEFAULT_NOTEBOOK_TIMEOUT_S,
    DEFAULT_TIMEOUT_S,
    grade_notebook,
)
from .points import Points, PointsError
from .results import (
    NotebookResult,
    format_csv,
    format_json,
    format_jsonl,
    format_table,
)
from .sandbox import (
    ISOLATIONS,
    Limits,
    adopt_orphans,
    bwrap_works,
    kill_adopted,
    remove_left_by,
)

# a notebook's child process is killed this long after the notebook's time
# limit
GRACE_S = 30
RESULT_PREFIX = "attention-grade-result "
# the hidden cases' seed, from the command line to its child processes
SEED_VARIABLE = "ATTENTION_GRADE_SEED"
# python -m attention_course.grade SUBCOMMAND ...: a whole class, Gradescope's
# run, building its bundle
SUBCOMMANDS = {
    "class": "attention_course.course.classroom:main",
    "gradescope": "attention_course.course.gradescope:main_run",
    "bundle": "attention_course.course.gradescope:main_bundle",
}
# address space of the grader's own process for one notebook (PyTorch,
# TensorFlow)
GRADER_MEMORY_MB = 8192
ISOLATION_HELP = (
    "how each submission is isolated. bwrap (the default; needs "
    "bubblewrap): its own namespaces, no network, only "
    "the system's and the package's files, read-only, a tmpfs folder "
    f"({Limits.disk_mb} MB) and /tmp ({Limits.tmp_mb} "
    f"MB) of at most {Limits.files} "
    "files each (bytes only where no mount namespace can be made: the "
    "report says so), memory and processes "
    "limited in total by cgroups where the grader may make them (as root). "
    "rlimit (weaker, only when asked for): "
    f"resource limits per process, its folder a tmpfs of {Limits.disk_mb} "
    f"MB and {Limits.files} files where a mount "
    "namespace can be made "
    "(else on the disk, limited per file), elsewhere per file; its code can "
    "read every file of the user it runs "
    "as (run as root, the grader "
    "runs it as nobody: make the solutions and the submissions unreadable "
    "to others), use the network and "
    "signal that user's processes. Every report names the isolation used."
)


_CHILDREN_LOCK = threading.Lock()
# the per-notebook processes this process started and still waits for
_LIVE_CHILDREN: set[int] = set()


def _grade_in_child(path: str, args) -> NotebookResult:
    """Grade one notebook in a child process of its own: whatever happens to
    it, this process and the batch go on, and the child is killed at the
    notebook's time limit plus a grace period. Then every orphan this process
    adopted (see :func:`.sandbox.adopt_orphans`) is killed: a submission that
    killed its grader process does not leave processes behind, even under the
    rlimit backend."""
    cmd = [
        sys.executable,
        "-P",
        "-m",
        "attention_course.course.cli",
        "--one",
        path,
        "--timeout",
        str(args.timeout),
        "--notebook-timeout",
        str(args.notebook_timeout),
        "--memory-mb",
        str(args.memory_mb),
        "--isolation",
        args.isolation,
    ]
    cmd += (
        ["--no-reference"]
        if args.reference is None
        else ["--solutions", str(args.reference)]
    )
    cmd += (
        ["--points", str(args.points)] if getattr(args, "points", None) else []
    )
    # not on the command line, which every user can read
    env = dict(os.environ, **{SEED_VARIABLE: str(args.seed)})
    try:
        # registered before another thread can take it for an orphan
        with _CHILDREN_LOCK:
            child = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                env=env,
                stderr=subprocess.PIPE,
                text=True,
                errors="replace",
                start_new_session=True,
            )
            _LIVE_CHILDREN.add(child.pid)
        memory = GRADER_MEMORY_MB * 2**20
        resource.prlimit(child.pid, resource.RLIMIT_AS, (memory, memory))
        try:
            out, err = child.communicate(
                timeout=args.notebook_timeout + GRACE_S
            )
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
            return NotebookResult(
                path,
                error="the grader's process for this notebook took "
                "longer than "
                f"{args.notebook_timeout + GRACE_S:g} s",
                grader_failed=True,
            )
        finally:
            with _CHILDREN_LOCK:
                _LIVE_CHILDREN.discard(child.pid)
                kill_adopted(keep=set(_LIVE_CHILDREN))
            remove_left_by(child.pid)
        lines = [
            line for line in out.splitlines() if line.startswith(RESULT_PREFIX)
        ]
        if child.returncode == 0 and len(lines) == 1:
            return NotebookResult.from_dict(
                json.loads(lines[0][len(RESULT_PREFIX) :])
            )
        return NotebookResult(
            path,
            error="the grader's process for this notebook failed (exit "
            f"{child.returncode})"
            f"{_last_error(err)}",
            grader_failed=True,
        )
    except (OSError, ValueError, TypeError, KeyError) as err:
        return NotebookResult(
            path,
            error="the grader's process for this notebook failed "
            f"({type(err).__name__}: "
            f"{str(err)[:300]})",
            grader_failed=True,
        )


def _last_error(stderr: str) -> str:
    """``: `` and the last line of the child's error output (its exception, or
    argparse's message), or nothing. The child is the grader's own process: a
    submission's output never reaches it (the sandbox's goes nowhere)."""
    lines = [
        line.strip() for line in (stderr or "").splitlines() if line.strip()
    ]
    return f": {lines[-1][:500]}" if lines else ""


class _Writer:
    """Writes each result as soon as it is known, in the chosen format
    (``--json``: one document at the end)."""

    def __init__(self, fmt: str, out=None):
        self.fmt, self.out, self.lock, self.results = (
            fmt,
            out or sys.stdout,
            threading.Lock(),
            [],
        )
        if fmt == "csv":
            self._write(format_csv([]).rstrip("\n"))

    def _write(self, text: str) -> None:
        self.out.write(text + "\n")
        self.out.flush()

    def add(self, result: NotebookResult) -> None:
        with self.lock:
            self.results.append(result)
            if self.fmt == "jsonl":
                self._write(format_jsonl(result))
            elif self.fmt == "csv":
                self._write(format_csv([result], header=False).rstrip("\n"))
            elif self.fmt == "table":
                self._write(format_table([result]))

    def finish(self, order: list[str]) -> None:
        if self.fmt == "json":
            rank = {p: i for i, p in enumerate(order)}
            self._write(
                format_json(
                    sorted(
                        self.results,
                        key=lambda r: rank.get(r.notebook, len(rank)),
                    )
                )
            )


def _without_current_folder() -> list[str]:
    """Take the current folder off the import path (``python -m`` puts it
    first, so a student's clone graded from inside would have its files
    imported into the grader); return the modules already imported from it."""
    here = Path.cwd().resolve()
    sys.path[:] = [
        p for p in sys.path if p not in ("", ".") and Path(p).resolve() != here
    ]
    found = []
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None)
        if (
            isinstance(file, str)
            and "." not in name
            and Path(file).resolve().parent in (here, here / name)
        ):
            found.append(f"{name} ({file})")
    return found


def add_points_argument(parser) -> None:
    parser.add_argument(
        "--points",
        metavar="FILE",
        help="TOML file of points per level and per exercise (default: "
        "warm-up 1, core 2, challenge 3; half of an exercise's points on "
        "its hidden cases where its "
        "check has them); see the instructor guide",
    )


def load_points(parser, args, complete: bool | None = None) -> Points:
    """The points file's :class:`.points.Points`, validated against the
    reference notebooks (a usage error naming the file and the key if it cannot
    be used). A points file names the notebooks of a whole course: against one
    reference notebook (``complete`` None: when the reference is a file, e.g. a
    class run's child process for one submission) its other notebooks are other
    chapters, not errors."""
    if not getattr(args, "points", None):
        return Points()
    if complete is None:
        complete = args.reference is None or not Path(args.reference).is_file()
    try:
        points = Points.load(args.points)
        points.validate(reference_exercises(args.reference), complete)
    except PointsError as err:
        parser.error(str(err))
    args.points = str(Path(args.points).resolve())
    return points


def reference_exercises(reference) -> dict[str, set[int]]:
    """``{notebook stem: its exercise numbers}`` of the reference notebooks (a
    folder, or one notebook)."""
    if reference is None:
        return {}
    reference = Path(reference)
    paths = (
        [reference]
        if reference.is_file()
        else sorted(reference.glob("*.ipynb"))
    )
    found = {}
    for path in paths:
        nb, _ = read_notebook(path)
        if nb is not None:
            found[path.stem] = {c.number for c in check_cells(nb)}
    return found


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in SUBCOMMANDS:
        from importlib import import_module

        module, function = SUBCOMMANDS[argv[0]].split(":")
        return getattr(import_module(module), function)(argv[1:])
    parser = argparse.ArgumentParser(
        prog="python -m attention_course.grade",
        description="Run exercise notebooks in a sandbox and report which "
        "exercises pass.",
        epilog="Run it as python -P -m attention_course.grade (nothing "
        "imported from the current "
        "folder). Only regular files of at most 8 MB are graded. The CSV "
        "has one row per exercise and, per notebook, "
        "a row whose exercise is 'total', whose passed is the number "
        "passed, whose points are the notebook's and "
        "whose message is passed/total; its last column, like a line of the "
        "table and a field of the JSON, names "
        "the isolation used. A whole class: python -P -m "
        "attention_course.grade class --help; Gradescope's "
        "autograder: python -P -m attention_course.grade bundle --help.",
    )
    parser.add_argument("notebooks", nargs="*", help="submitted .ipynb files")
    fmt = parser.add_mutually_exclusive_group()
    fmt.add_argument(
        "--json",
        action="store_true",
        help="print one JSON document at the end",
    )
    fmt.add_argument(
        "--jsonl",
        action="store_true",
        help="print one JSON line per notebook as soon as it is graded",
    )
    fmt.add_argument(
        "--csv", action="store_true", help="print CSV (one row per exercise)"
    )
    parser.add_argument(
        "--timeout",
        type=int,
        default=DEFAULT_TIMEOUT_S,
        help="time limit per cell, in seconds",
    )
    parser.add_argument(
        "--notebook-timeout",
        type=int,
        default=DEFAULT_NOTEBOOK_TIMEOUT_S,
        help="time limit per notebook, in seconds",
    )
    parser.add_argument(
        "--memory-mb",
        type=int,
        default=Limits.memory_mb,
        help="memory limit per notebook (all its processes together "
        "where a cgroup can be made)",
    )
    parser.add_argument(
        "--isolation", choices=ISOLATIONS, default="bwrap", help=ISOLATION_HELP
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=None,
        help="seed of the checkers' hidden cases (default: a random one "
        "per run)",
    )
    parser.add_argument(
        "-j",
        "--jobs",
        type=int,
        default=1,
        help="notebooks graded in parallel",
    )
    # the child process of _grade_in_child
    parser.add_argument("--one", metavar="NOTEBOOK", help=argparse.SUPPRESS)
    add_points_argument(parser)
    ref = parser.add_mutually_exclusive_group()
    ref.add_argument(
        "--solutions",
        "--reference",
        dest="reference",
        metavar="PATH",
        default=AUTO,
        help="folder of solution notebooks (matched by name) or one "
        "solution notebook whose check cells "
        "grade the submissions (default: the solutions/ folder of the "
        "course's repository that this "
        "package belongs to, if there is one; never the current folder's)",
    )
    ref.add_argument(
        "--no-reference",
        dest="reference",
        action="store_const",
        const=None,
        help="grade each notebook with its own check cells",
    )
    args = parser.parse_args(argv)
    shadowing = _without_current_folder()
    if shadowing:
        parser.error(
            "modules were imported from the current folder: "
            f"{', '.join(shadowing)}. Run the grader from "
            "another folder, or as python -P -m attention_course.grade"
        )
    if (
        args.reference not in (AUTO, None)
        and not Path(args.reference).exists()
    ):
        parser.error(f"--solutions {args.reference}: no such file or folder")
    if (
        args.jobs < 1
        or args.timeout < 1
        or args.notebook_timeout < 1
        or args.memory_mb < 64
    ):
        parser.error(
            "--jobs, --timeout, --notebook-timeout must be positive and "
            "--memory-mb at least 64"
        )
    if args.reference not in (AUTO, None):
        args.reference = Path(args.reference).resolve()
    elif args.reference == AUTO:
        args.reference = default_reference()
    if args.one and os.environ.get(SEED_VARIABLE, "").isdigit():
        args.seed = int(os.environ[SEED_VARIABLE])
    args.seed = secrets.randbelow(2**31) if args.seed is None else args.seed
    if args.seed < 0:
        parser.error("--seed must be a non-negative integer")
    points = load_points(parser, args)
    if args.isolation == "bwrap" and not bwrap_works():
        parser.error(
            "bubblewrap is not available here (not installed, or no user "
            "namespaces): install it "
            "(apt-get install bubblewrap), or ask for the weaker isolation "
            "with --isolation=rlimit, "
            "knowing what it does not protect (see --help)"
        )
    limits = Limits(
        cell_s=args.timeout,
        notebook_s=args.notebook_timeout,
        memory_mb=args.memory_mb,
        isolation=args.isolation,
    )
    adopt_orphans()
    if args.one:
        result = grade_notebook(
            args.one, args.timeout, args.reference, limits, args.seed, points
        )
        kill_adopted()
        # outputs: the review's
        sys.stdout.write(
            RESULT_PREFIX + format_jsonl(result, outputs=True) + "\n"
        )
        return 0
    if not args.notebooks:
        parser.error("give at least one notebook")
    writer = _Writer(
        "json"
        if args.json
        else "jsonl"
        if args.jsonl
        else "csv"
        if args.csv
        else "table"
    )
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = [
            pool.submit(_grade_in_child, str(p), args) for p in args.notebooks
        ]
        for future in as_completed(futures):
            writer.add(future.result())
    writer.finish([str(p) for p in args.notebooks])
    return 1 if any(r.error for r in writer.results) else 0


if (
    __name__ == "__main__"
):  # pragma: no cover - the child processes' entry point; main() is tested
    sys.exit(main())
