"""A whole class in one command: ``python -P -m attention_course.grade class
SUBMISSIONS --out RESULTS [-j N]``.

``SUBMISSIONS`` is a folder of submissions named by student, in one of the
layouts an instructor downloads:

* one folder per student (``alice/02_single_head_exercises.ipynb``), also
  Gradescope's "Export Submissions" (``submission_123/...``: the student's name
  is read from its ``submission_metadata.yml`` when there is one);
* Canvas's flat download (``alice_12345_67890_02_single_head_exercises.ipynb``,
  ``alice_LATE_12345_...``): the student is the name before the first number,
  the notebook the end of the file name (a ``-1`` Canvas adds to a resubmitted
  file is ignored).

Each notebook is matched by name to a reference notebook (``--solutions``,
default: the course's ``solutions/``) and graded in a child process of its own,
exactly as ``python -P -m attention_course.grade NOTEBOOK`` grades it (sandbox,
limits, isolation named in every result; ``-j N`` at once). Under ``RESULTS``:

* ``results/STUDENT/NOTEBOOK.json``: each result, written (atomically) as soon
  as it is known, with the SHA-256 of the file graded. Grading is resumable: a
  submission whose result is there, for the same file, is not graded again
  unless ``--regrade`` (everyone) or ``--regrade STUDENT`` (that student;
  repeatable); a changed file is. A failure of the grader itself (its process
  for the notebook crashed or ran out of time) is shown with the child's own
  error and never saved: the next run grades that notebook again. The hidden
  cases' seed is kept in ``seed.txt``, so that a resumed run (and a regrade)
  draws the same cases for everyone;
* ``feedback/STUDENT/NOTEBOOK.md`` and ``.html``: what the student gets back
  (:mod:`.exports`);
* ``review/STUDENT/NOTEBOOK.ipynb``: the submission annotated with the grader's
  verdicts after each check cell and the errors after each cell that raised,
  for a manual review; its outputs are the grading run's (prints, displays,
  figures, errors with tracebacks, cut at the grader's limits), never the ones
  the student saved; with ``--review-pdf`` also ``NOTEBOOK.pdf``, printed by
  Chromium (:mod:`.review_pdf`);
* ``gradebook.csv``: one row per person (a group submission: one per member)
  with the LMS's id and e-mail where its download gives them (Canvas's user id
  from its file names, Gradescope's student id and e-mail from
  ``submission_metadata.yml``), one column per notebook (its points; a late
  notebook, marked by Canvas's ``_LATE_``, or a Gradescope submission after the
  points file's ``due``, loses its ``late_penalty`` share), a total, the
  notebooks submitted late and Gradescope's submission times;
  ``exercises.csv``: one row per person, one column per exercise, and each
  exercise's mean points and share passed; ``canvas.csv``, ``moodle.csv`` and
  ``gradescope_NOTEBOOK.csv``: the same points in each LMS's own import format
  (:func:`.exports.canvas_csv`, :func:`.exports.moodle_csv`,
  :func:`.exports.gradescope_csv`; Canvas's columns titled ``NOTEBOOK (ID)``,
  which its import matches to assignment ``ID``, where the points file's
  ``[canvas_assignments]`` or ``--canvas-id NOTEBOOK=ID`` gives the id);
  ``results.jsonl`` (every result, one JSON line each); ``summary.txt`` (the
  table printed at the end).

Progress goes to stderr, one line per submission with the time it took and an
estimate of the time left.

Inputs are checked up front, and grading goes on for everything that matches: a
file that is not a notebook (``.html``, ``.zip``, ``.py``), a folder named like
one, a notebook whose name matches no reference notebook, a notebook at the top
of the folder that names no student, and the older copies of a notebook one
student submitted more than once (Canvas's ``-1`` resubmission or a browser's
``(1)`` copy: the copy with the highest number, then the last modified, is
graded) are not graded; each is listed with its reason (on stderr at the start,
and in ``summary.txt``), its student keeps a gradebook row, and the exit status
is 1. A file that is not a valid notebook (``{"cells": []}``, not JSON), or a
notebook of another chapter, gets an ``ERROR`` result (0 points; exit status
1) and the class goes on. A folder that does not exist or holds nothing
gradable, an output folder that cannot be written, or a points file that does
not fit the reference notebooks stops before anything is graded, with a message
naming it (exit status 2).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import secrets
import stat
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import nbformat

from . import review_pdf
from .canonical import (
    AUTO,
    MAX_NOTEBOOK_BYTES,
    Reference,
    default_reference,
    find_reference,
    plan,
    read_notebook,
)
from .cli import (
    ISOLATION_HELP,
    _grade_in_child,
    _without_current_folder,
    add_points_argument,
    load_points,
)
from .exports import (
    GradebookRow,
    canvas_csv,
    exercises_csv,
    feedback_html,
    feedback_markdown,
    gradebook_csv,
    gradescope_csv,
    moodle_csv,
    review_notebook,
)
from .grade import DEFAULT_NOTEBOOK_TIMEOUT_S, DEFAULT_TIMEOUT_S, score_result
from .points import Points, PointsError, canvas_id
from .results import NotebookResult, points_text, printable
from .sandbox import ISOLATIONS, Limits, adopt_orphans, bwrap_works

CANVAS_NAME = re.compile(
    r"^(?P<student>.+?)_(?P<late>LATE_)?(?P<user_id>\d+)_\d+_(?P<file>.+)$"
)
# Canvas's resubmission -1, a browser's copy (1)
CANVAS_COPY = re.compile(r"(?:-\d+| \(\d+\))(?=\.ipynb$)")
SKIPPED_FOLDERS = {".ipynb_checkpoints", "__MACOSX"}
EVERYONE = "*"  # --regrade without a name


class ClassError(ValueError):
    """Input that stops a class run before anything is graded."""


@dataclass
class Member:
    """One person a submission is graded for, as the LMS knows them (its
    gradebook import matches the id)."""

    name: str
    id: str = ""  # Canvas's user id, Gradescope's student id (sid)
    email: str = ""


@dataclass
class Submission:
    student: str
    path: Path  # the student's file
    reference: Path  # the solution notebook it is graded against
    # a group submission: every member gets the grade
    members: list[Member] = field(default_factory=list)
    # Canvas's _LATE_ marker, or Gradescope's time after the points file's due
    late: bool = False
    submitted_at: str = ""  # Gradescope's submission time

    @property
    def notebook(self) -> str:
        return self.reference.stem


def safe_name(student: str) -> str:
    """A student's name as a folder name: letters, digits, ``.``, ``-``, ``_``,
    ``@``; nothing else."""
    name = re.sub(r"[^\w.@-]", "_", student.strip()).strip(".") or "_"
    return name[:100]


def _gradescope_metadata(folder: Path) -> dict[str, tuple[list[Member], str]]:
    """``{submission folder: (its submitters, its submission time)}`` from
    Gradescope's ``submission_metadata.yml``, if there is one."""
    path = folder / "submission_metadata.yml"
    if (
        path.is_symlink()
        or not path.is_file()
        or path.stat().st_size > MAX_NOTEBOOK_BYTES
    ):
        return {}
    try:
        import yaml

        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    # an unreadable metadata file: fall back to the folder names
    except Exception:  # noqa: BLE001
        return {}
    found = {}
    for key, entry in data.items() if isinstance(data, dict) else []:
        entry = entry if isinstance(entry, dict) else {}
        submitters = entry.get(":submitters") or entry.get("submitters") or []
        members = [
            Member(
                str(s.get(":name") or s.get("name") or s.get(":email") or ""),
                str(s.get(":sid") or s.get("sid") or ""),
                str(s.get(":email") or s.get("email") or ""),
            )
            for s in submitters
            if isinstance(s, dict)
        ]
        members = [m for m in members if m.name]
        if members:
            found[str(key)] = (
                members,
                str(entry.get(":created_at") or entry.get("created_at") or ""),
            )
    return found


def _match(name: str, reference) -> Path | None:
    return find_reference(name, reference) or find_reference(
        CANVAS_COPY.sub("", name), reference
    )


@dataclass
class Skipped:
    """A file of the submissions folder that is not graded, and why (listed in
    the summary; the exit status is 1)."""

    path: Path
    reason: str
    # known from its folder or its Canvas name: the student still has a
    # gradebook row
    student: str | None = None


def _student_files(entry: Path) -> list[Path]:
    """The files (and folders named like notebooks) under a student's folder,
    checkpoints and hidden files left out."""
    return [
        p
        for p in sorted(entry.rglob("*"))
        if not SKIPPED_FOLDERS & set(p.parts)
        and not any(
            part.startswith(".") for part in p.relative_to(entry).parts
        )
        and (not p.is_dir() or p.suffix == ".ipynb")
    ]


def _candidates(
    entry: Path, metadata: dict, skipped: list[Skipped]
) -> list[tuple[Submission, str]]:
    """(submission, the name matched to a reference; its reference not yet
    known) for one entry of the submissions folder; what cannot be a submission
    goes to ``skipped``."""
    if entry.is_dir() and not entry.is_symlink() and entry.suffix != ".ipynb":
        members, submitted_at = metadata.get(
            entry.name, ([Member(entry.name)], "")
        )
        student = " & ".join(m.name for m in members)
        return [
            (Submission(student, p, p, members, False, submitted_at), p.name)
            for p in _student_files(entry)
        ]
    m = CANVAS_NAME.match(entry.name)
    if entry.is_symlink() and entry.is_dir():
        skipped.append(
            Skipped(
                entry,
                "a link to a folder: not followed (copy the folder itself)",
            )
        )
    elif m:
        return [
            (
                Submission(
                    m["student"],
                    entry,
                    entry,
                    [Member(m["student"], m["user_id"])],
                    bool(m["late"]),
                ),
                m["file"],
            )
        ]
    elif entry.suffix == ".ipynb":
        skipped.append(
            Skipped(
                entry,
                _not_a_notebook(entry)
                or "a notebook at the top of the folder whose name "
                "names no student: expected STUDENT/NOTEBOOK.ipynb or "
                "Canvas's "
                "STUDENT_ID_ID_NOTEBOOK.ipynb",
            )
        )
    elif entry.name != "submission_metadata.yml":
        skipped.append(
            Skipped(
                entry,
                "not a submission: expected STUDENT/NOTEBOOK.ipynb or "
                "Canvas's "
                "STUDENT_ID_ID_NOTEBOOK.ipynb",
            )
        )
    return []


def submitted_after(submitted_at: str, due) -> bool:
    """Whether Gradescope's submission time (``2026-11-20 10:00:00 -0800``, as
    its export writes it) is after ``due`` (the points file's, None: no due
    time); a time that cannot be read is not late."""
    if not due or not submitted_at:
        return False
    try:
        when = datetime.fromisoformat(
            re.sub(r"\s+(?=[+-]\d\d:?\d\d$)", "", submitted_at.strip())
        )
    except ValueError:
        return False
    return when.tzinfo is not None and when > due


def find_submissions(
    folder: Path, reference
) -> tuple[list[Submission], list[Skipped]]:
    """Every submission in ``folder`` (see the module docstring) and every file
    that is not graded with its reason; a :class:`ClassError` when the folder
    does not exist or nothing in it can be graded."""
    if not folder.is_dir():
        raise ClassError(f"{folder}: no such folder")
    metadata = _gradescope_metadata(folder)
    found: list[Submission] = []
    skipped: list[Skipped] = []
    for entry in sorted(folder.iterdir()):
        if entry.name in SKIPPED_FOLDERS or entry.name.startswith("."):
            continue
        for submission, name in _candidates(entry, metadata, skipped):
            reason = _not_a_notebook(submission.path)
            submission.reference = None if reason else _match(name, reference)
            if reason is None and submission.reference is None:
                reason = (
                    "no reference notebook is named like it: rename it "
                    "as the exercise notebook was named"
                )
            if reason:
                skipped.append(
                    Skipped(submission.path, reason, submission.student)
                )
            # a link or a FIFO too: the grader refuses it with an ERROR result
            else:
                found.append(submission)
    if not found:
        listed = "".join(f"; {printable(s.path)}: {s.reason}" for s in skipped)
        raise ClassError(
            f"{folder}: no submissions found (expected "
            "STUDENT/NOTEBOOK.ipynb, Gradescope's export or "
            f"Canvas's download){listed}"
        )
    return _latest_copies(found, skipped), skipped


def _not_a_notebook(path: Path) -> str | None:
    if path.suffix != ".ipynb":
        return (
            f"not a notebook ({path.suffix or 'no extension'}): only "
            ".ipynb files are graded; ask for the notebook"
        )
    if path.is_dir() and not path.is_symlink():
        return "a folder named like a notebook: only notebook files are graded"
    return None


def _copy_number(path: Path) -> int:
    """Canvas's resubmission number (``NAME-2.ipynb``) or a browser's copy
    number (``NAME (1).ipynb``); 0: none."""
    m = re.search(r"(?:-| \()(\d+)\)?\.ipynb$", path.name)
    return int(m[1]) if m else 0


def _latest_copies(
    found: list[Submission], skipped: list[Skipped]
) -> list[Submission]:
    """One submission per student and notebook: the latest copy (highest copy
    number, then last modified); the others go to ``skipped``, each naming the
    copy that is graded."""
    groups: dict[tuple[str, str], list[Submission]] = {}
    for s in found:
        groups.setdefault(
            (safe_name(s.student).lower(), s.notebook), []
        ).append(s)
    kept = []
    for group in groups.values():
        group.sort(
            key=lambda s: (
                _copy_number(s.path),
                s.path.lstat().st_mtime,
                str(s.path),
            )
        )
        kept.append(group[-1])
        skipped += [
            Skipped(
                s.path,
                f"an older copy of {s.student}'s {s.notebook}: "
                f"{group[-1].path} is graded",
            )
            # no row of its own: the student's row is the graded copy's
            for s in group[:-1]
        ]
    return [s for s in found if s in kept]


def _review(s: Submission, result: NotebookResult) -> str | None:
    """The submission annotated with its results for a manual review
    (:func:`.exports.review_notebook`), or None where it could not be
    graded."""
    if result.error:
        return None
    nb, _ = read_notebook(s.path)
    reference = Reference.read(s.reference)
    if nb is None or isinstance(reference, str):
        return None
    indices = {e.number: e.indices for e in plan(nb, reference)}
    # the student's own check cells, not the reference's that plan() put in
    nb, _ = read_notebook(s.path)
    return nbformat.writes(review_notebook(nb, result, indices))


def _sha256(path: Path) -> str:
    """The SHA-256 of a regular file of at most the grader's size limit, read
    without following a link; anything else (a link, a FIFO, a device, a larger
    file) gets a marker instead, never read, and the grader refuses it with an
    ERROR result."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as err:
        return f"unreadable: {type(err).__name__}"
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_NOTEBOOK_BYTES:
            return "not a regular file of at most the grader's size"
        return hashlib.sha256(f.read(MAX_NOTEBOOK_BYTES + 1)).hexdigest()


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


class Store:
    """The output folder: stored results (resumable), feedback, gradebook."""

    def __init__(self, out: Path):
        self.out = out
        # the review notebooks written by this run
        self.reviews: list[Path] = []
        try:
            out.mkdir(parents=True, exist_ok=True)
            probe = out / f".write-probe-{os.getpid()}"
            probe.write_text("", encoding="utf-8")
            probe.unlink()
        except OSError as err:
            raise ClassError(
                f"--out {out}: cannot write there ({type(err).__name__}: "
                f"{err.strerror or err})"
            ) from None

    def result_path(self, s: Submission) -> Path:
        return (
            self.out / "results" / safe_name(s.student) / f"{s.notebook}.json"
        )

    def stored(self, s: Submission, digest: str) -> NotebookResult | None:
        path = self.result_path(s)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if data.get("sha256") != digest:
            return None
        result = NotebookResult.from_dict(data["result"])
        # a failure of the grader (saved by a version before grader_failed
        # existed) is graded again, never kept
        failed = result.grader_failed or (result.error or "").startswith(
            "the grader's process"
        )
        return None if failed else result

    def save(
        self, s: Submission, digest: str, result: NotebookResult, seed: int
    ) -> None:
        record = {
            "student": s.student,
            "notebook": s.notebook,
            "file": str(s.path),
            "sha256": digest,
            "seed": seed,
            "result": result.as_dict(),
        }
        _write_atomic(self.result_path(s), json.dumps(record, indent=1))
        folder = self.out / "feedback" / safe_name(s.student)
        _write_atomic(
            folder / f"{s.notebook}.md", feedback_markdown(result, s.student)
        )
        _write_atomic(
            folder / f"{s.notebook}.html", feedback_html(result, s.student)
        )
        review = _review(s, result)
        if review is not None:
            path = (
                self.out
                / "review"
                / safe_name(s.student)
                / f"{s.notebook}.ipynb"
            )
            _write_atomic(path, review)
            self.reviews.append(path)

    def seed(self, asked: int | None, regrade: bool) -> int:
        """The class's hidden-case seed: the stored one (a resumed run draws
        the same cases), unless asked for."""
        path = self.out / "seed.txt"
        stored = (
            path.read_text(encoding="utf-8").strip() if path.is_file() else ""
        )
        if (
            stored.isdigit()
            and asked is not None
            and int(stored) != asked
            and not regrade
        ):
            raise ClassError(
                f"the results in {self.out} were graded with --seed "
                f"{stored}: use it, or --regrade"
            )
        seed = (
            asked
            if asked is not None
            else int(stored)
            if stored.isdigit()
            else secrets.randbelow(2**31)
        )
        _write_atomic(path, f"{seed}\n")
        return seed


def summary_table(
    by_student: dict[str, dict[str, NotebookResult]], notebooks: list[str]
) -> str:
    width = max([len("student"), *(len(printable(s)) for s in by_student)])
    short = [n.split("_exercises")[0] for n in notebooks]
    header = (
        f"{'student':<{width}}  "
        + "  ".join(f"{n:>14}" for n in short)
        + f"  {'total':>9}"
    )
    lines = [header, "-" * len(header)]
    for student in sorted(by_student):
        row, cells, total, top = by_student[student], [], 0.0, 0.0
        for n in notebooks:
            r = row.get(n)
            if r is None:
                cells.append(f"{'-':>14}")
            elif r.error:
                cells.append(f"{'ERROR':>14}")
            else:
                score = points_text(r.score) + "/" + points_text(r.max_score)
                cells.append(f"{score:>14}")
                total, top = total + r.score, top + r.max_score
        lines.append(
            f"{printable(student):<{width}}  "
            + "  ".join(cells)
            + f"  {points_text(total) + '/' + points_text(top):>9}"
        )
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -P -m attention_course.grade class",
        description="Grade a folder of submissions named by "
        "student, resumably, and write each student's feedback, a gradebook "
        "CSV and JSON lines.",
    )
    parser.add_argument(
        "submissions",
        help="folder: STUDENT/NOTEBOOK.ipynb, Gradescope's export or "
        "Canvas's download",
    )
    parser.add_argument(
        "--out",
        required=True,
        help="folder for results, feedback and the gradebook",
    )
    parser.add_argument(
        "-j",
        "--jobs",
        type=int,
        default=1,
        help="notebooks graded in parallel",
    )
    parser.add_argument(
        "--regrade",
        metavar="STUDENT",
        nargs="?",
        action="append",
        const=EVERYONE,
        help="grade again what is already graded: everyone's, or "
        "(--regrade STUDENT, repeatable) "
        "one student's, with the stored hidden-case seed",
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
        help="memory limit per notebook",
    )
    parser.add_argument(
        "--isolation", choices=ISOLATIONS, default="bwrap", help=ISOLATION_HELP
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=None,
        help="seed of the hidden cases (default: the one stored "
        "in the output folder, else a random one)",
    )
    parser.add_argument(
        "--solutions",
        "--reference",
        dest="reference",
        metavar="PATH",
        default=AUTO,
        help="folder of solution notebooks (default: the course's solutions/)",
    )
    parser.add_argument(
        "--review-pdf",
        action="store_true",
        help="also print each review notebook to "
        "review/STUDENT/NOTEBOOK.pdf (needs chromium on PATH and "
        "playwright; offline, JavaScript off)",
    )
    parser.add_argument(
        "--canvas-id",
        metavar="NOTEBOOK=ID",
        action="append",
        default=[],
        help="Canvas's assignment id of a notebook (repeatable; over the "
        "points file's "
        "[canvas_assignments]): canvas.csv titles its column 'NOTEBOOK "
        "(ID)', which Canvas's import "
        "matches to that assignment",
    )
    add_points_argument(parser)
    return parser


def canvas_ids(
    asked: list[str], points: Points, reference: Path
) -> dict[str, str]:
    """``{notebook stem: Canvas's assignment id}``: the points file's, then
    ``--canvas-id NOTEBOOK=ID``'s; a :class:`ClassError` for a malformed one or
    a notebook that is no reference notebook."""
    ids = dict(points.canvas_ids)
    known = sorted(p.stem for p in reference.glob("*.ipynb"))
    for item in asked:
        notebook, _, number = item.partition("=")
        notebook = Path(notebook.strip()).stem
        if notebook not in known:
            raise ClassError(
                f"--canvas-id {item}: no reference notebook {notebook!r} "
                f"(known: {', '.join(known)})"
            )
        try:
            ids[notebook] = canvas_id(number.strip(), f"--canvas-id {item}")
        except PointsError as err:
            raise ClassError(str(err)) from None
    return ids


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    shadowing = _without_current_folder()
    if shadowing:
        parser.error(
            "modules were imported from the current folder: "
            f"{', '.join(shadowing)}"
        )
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
    if args.seed is not None and args.seed < 0:
        parser.error("--seed must be a non-negative integer")
    args.reference = (
        default_reference()
        if args.reference == AUTO
        else Path(args.reference).resolve()
    )
    if args.reference is None or not Path(args.reference).is_dir():
        parser.error(
            f"--solutions {args.reference}: no such folder of solution "
            "notebooks"
        )
    if args.isolation == "bwrap" and not bwrap_works():
        parser.error(
            "bubblewrap is not available here (not installed, or no user "
            "namespaces): install it "
            "(apt-get install bubblewrap), or ask for the weaker isolation "
            "with --isolation=rlimit"
        )
    if args.review_pdf and review_pdf.converter_problem():
        parser.error(f"--review-pdf: {review_pdf.converter_problem()}")
    points = load_points(parser, args)
    try:
        points.canvas_ids = canvas_ids(args.canvas_id, points, args.reference)
        submissions, skipped = find_submissions(
            Path(args.submissions), args.reference
        )
        for s in submissions:
            s.late = s.late or submitted_after(s.submitted_at, points.due)
        store = Store(Path(args.out))
        args.regrade = _regrade(args.regrade, submissions)
        args.seed = store.seed(args.seed, args.regrade is True)
    except ClassError as err:
        parser.error(str(err))
    adopt_orphans()
    return _run(submissions, skipped, store, args, points)


def _regrade(
    asked: list[str] | None, submissions: list[Submission]
) -> bool | set[str]:
    """True (everyone), False (no one) or the students named (a
    :class:`ClassError` for a name that is none)."""
    if not asked:
        return False
    if EVERYONE in asked:
        return True
    students = {s.student for s in submissions}
    unknown = [name for name in asked if name not in students]
    if unknown:
        raise ClassError(
            f"--regrade {', '.join(unknown)}: no such student in the "
            "submissions (students: "
            f"{', '.join(sorted(students))})"
        )
    return set(asked)


def _run(
    submissions: list[Submission],
    skipped: list[Skipped],
    store: Store,
    args,
    points: Points,
) -> int:
    from concurrent.futures import ThreadPoolExecutor, as_completed

    results: dict[tuple[str, str], NotebookResult] = {}
    todo = []
    for s in submissions:
        digest = _sha256(s.path)
        again = args.regrade is True or (
            args.regrade and s.student in args.regrade
        )
        old = None if again else store.stored(s, digest)
        if old is not None:
            # the points file may have changed
            results[(s.student, s.notebook)] = score_result(old, points)
        else:
            todo.append((s, digest))
    for s in skipped:
        print(
            f"not graded: {printable(s.path)}: {printable(s.reason)}",
            file=sys.stderr,
            flush=True,
        )
    print(
        f"{len(submissions)} submissions of "
        f"{len({s.student for s in submissions})} students; "
        f"{len(submissions) - len(todo)} already graded (kept; --regrade "
        f"grades them again), {len(todo)} to grade "
        f"with -j {args.jobs}; hidden-case seed {args.seed}",
        file=sys.stderr,
        flush=True,
    )
    start, done = time.monotonic(), 0

    def grade_one(item):
        s, digest = item
        child_args = argparse.Namespace(
            **{**vars(args), "reference": s.reference}
        )
        t0 = time.monotonic()
        result = _grade_in_child(str(s.path), child_args)
        return s, digest, result, time.monotonic() - t0

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        for future in as_completed(
            [pool.submit(grade_one, item) for item in todo]
        ):
            s, digest, result, seconds = future.result()
            result = score_result(result, points)
            # a failure of the grader is never a grade: the next run tries
            # again
            if not result.grader_failed:
                store.save(s, digest, result, args.seed)
            results[(s.student, s.notebook)] = result
            done += 1
            left = (time.monotonic() - start) / done * (len(todo) - done)
            verdict = (
                f"ERROR {result.error}"
                if result.error
                else f"{points_text(result.score)}/"
                f"{points_text(result.max_score)} points"
            )
            print(
                f"[{done:>{len(str(len(todo)))}}/{len(todo)}] "
                f"{printable(s.student)} {s.notebook}: "
                f"{printable(verdict)} ({seconds:.1f} s; about "
                f"{left / 60:.1f} min left)",
                file=sys.stderr,
                flush=True,
            )
    _write_outputs(store, submissions, skipped, results, points)
    if args.review_pdf and store.reviews:
        print(
            f"printing {len(store.reviews)} review notebooks to PDF",
            file=sys.stderr,
            flush=True,
        )
        for problem in review_pdf.write_pdfs(store.reviews):
            print(
                f"review PDF not written: {printable(problem)}",
                file=sys.stderr,
                flush=True,
            )
    return 1 if skipped or any(r.error for r in results.values()) else 0


def gradebook_rows(
    submissions: list[Submission], skipped: list[Skipped], results: dict
) -> list[GradebookRow]:
    """One row per person: each member of a group submission gets its results;
    a student whose only files were not graded still has a row (empty: nothing
    graded; the summary says why)."""
    rows: dict[tuple[str, str, str], GradebookRow] = {}
    for s in submissions:
        for m in s.members or [Member(s.student)]:
            row = rows.setdefault(
                (m.name, m.id, m.email), GradebookRow(m.name, m.id, m.email)
            )
            if (s.student, s.notebook) in results:
                row.results[s.notebook] = results[(s.student, s.notebook)]
            if s.late:
                row.late.add(s.notebook)
            if s.submitted_at:
                row.submitted_at[s.notebook] = s.submitted_at
    for s in skipped:
        if s.student and not any(key[0] == s.student for key in rows):
            rows[(s.student, "", "")] = GradebookRow(s.student)
    return list(rows.values())


def _write_outputs(
    store: Store,
    submissions: list[Submission],
    skipped: list[Skipped],
    results: dict,
    points: Points,
) -> None:
    notebooks = sorted({s.notebook for s in submissions})
    by_student: dict[str, dict[str, NotebookResult]] = {
        s.student: {} for s in skipped if s.student
    }
    max_points: dict[str, float] = {}
    for (student, notebook), r in results.items():
        by_student.setdefault(student, {})[notebook] = r
        if not r.error:
            max_points[notebook] = max(
                max_points.get(notebook, 0.0), r.max_score
            )
    rows = gradebook_rows(submissions, skipped, results)
    _write_atomic(
        store.out / "gradebook.csv",
        gradebook_csv(rows, notebooks, max_points, points.late_penalty),
    )
    _write_atomic(store.out / "exercises.csv", exercises_csv(rows, notebooks))
    _write_atomic(
        store.out / "canvas.csv",
        canvas_csv(
            rows, notebooks, max_points, points.late_penalty, points.canvas_ids
        ),
    )
    _write_atomic(
        store.out / "moodle.csv",
        moodle_csv(rows, notebooks, points.late_penalty),
    )
    for notebook in notebooks:
        _write_atomic(
            store.out / f"gradescope_{notebook}.csv",
            gradescope_csv(rows, notebook, points.late_penalty),
        )
    lines = [
        json.dumps({"student": student, **r.as_dict()})
        for (student, _), r in sorted(results.items())
    ]
    _write_atomic(store.out / "results.jsonl", "\n".join(lines) + "\n")
    table = summary_table(by_student, notebooks)
    not_saved = (
        " (a failure of the grader, not saved: the next run grades it again)"
    )
    errors = [
        f"ERROR {printable(student)} {printable(r.notebook)}: "
        f"{printable(r.error)}"
        f"{not_saved if r.grader_failed else ''}"
        for (student, _), r in sorted(results.items())
        if r.error
    ]
    isolations = sorted({r.isolation for r in results.values() if r.isolation})
    not_graded = [
        f"NOT GRADED {printable(s.path)}: {printable(s.reason)}"
        for s in skipped
    ]
    text = (
        "\n".join(
            [
                table,
                *errors,
                *not_graded,
                *(f"isolation: {i}" for i in isolations),
            ]
        )
        + "\n"
    )
    _write_atomic(store.out / "summary.txt", text)
    sys.stdout.write(text)
    sys.stdout.flush()
