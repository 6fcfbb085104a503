"""Check cells and the reference notebook: what a submission is graded against,
read and parsed once.

A check cell (tags ``check`` and ``exercise-N``; see CONTRIBUTING.md, "Adding
an exercise") such as ``checks.check_softmax(softmax)`` or
``checks.check_choice("q3", answer)`` is parsed (:func:`parse_check`) into
checker calls: the checker's name, literal arguments and expressions to be
evaluated in the submission.

Canonical check cells: a submission is graded against the check cells of its
**reference** notebook, not its own, so that deleting or editing a check cell
(e.g. to ``pass``) gains nothing. The reference is the solution notebook of the
same name in the reference folder (:func:`find_reference`); :class:`Reference`
reads it once: its check cells, each parsed once, what each exercise's solution
uses of the library (:mod:`.references`) and whether its check takes a class.
:func:`plan` puts the reference's check sources into a submission.
"""

from __future__ import annotations

import ast
import errno
import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from . import references
from .exercises import CHECK_TAG, exercise_number, parse_heading

# reference=AUTO: the solutions/ folder of the course's repository (see
# default_reference)
AUTO = "auto"
# a submission larger than this is refused before it is parsed
MAX_NOTEBOOK_BYTES = 8 * 2**20


@dataclass
class CheckCall:
    checker: str
    # ("literal", value) or ("expr", source)
    args: list = field(default_factory=list)
    kwargs: dict = field(default_factory=dict)


def _argument(node) -> tuple[str, object]:
    try:
        return "literal", ast.literal_eval(node)
    except (ValueError, SyntaxError, TypeError):
        return "expr", ast.unparse(node)


def parse_check(source: str) -> list[CheckCall] | None:
    """The checker calls of a check cell, or None when it is anything but
    ``checks.check_*(...)`` calls."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    calls = []
    for stmt in tree.body:
        if not (
            isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)
        ):
            return None
        func = stmt.value.func
        if not (
            isinstance(func, ast.Attribute)
            and isinstance(func.value, ast.Name)
            and func.value.id == "checks"
        ):
            return None
        if (
            not func.attr.startswith("check_")
            or any(isinstance(a, ast.Starred) for a in stmt.value.args)
            or any(k.arg is None for k in stmt.value.keywords)
        ):
            return None
        calls.append(
            CheckCall(
                func.attr,
                [_argument(a) for a in stmt.value.args],
                {k.arg: _argument(k.value) for k in stmt.value.keywords},
            )
        )
    return calls or None


def expressions(calls: list[CheckCall] | None) -> list[str]:
    """The expressions the sandbox evaluates at the check cell."""
    found = []
    for call in calls or []:
        for kind, value in [*call.args, *call.kwargs.values()]:
            if kind == "expr" and value not in found:
                found.append(value)
    return found


@dataclass
class CheckCell:
    index: int  # the cell's index in its notebook
    number: int  # the exercise it checks
    title: str
    level: str
    source: str
    # None: not a plain checker call (runs in the sandbox)
    calls: list[CheckCall] | None


def check_cells(nb) -> list[CheckCell]:
    """The notebook's check cells, in order, each parsed once."""
    found, heading, count = [], None, 0
    for i, cell in enumerate(nb.cells):
        h = parse_heading(cell)
        if h is not None:
            heading = h
            continue
        if cell.cell_type == "code" and CHECK_TAG in cell.get(
            "metadata", {}
        ).get("tags", []):
            count += 1
            number = exercise_number(cell) or (
                heading.number if heading else count
            )
            own = heading is not None and heading.number == number
            found.append(
                CheckCell(
                    i,
                    number,
                    heading.title if own else "",
                    heading.level if own else "",
                    cell.source,
                    parse_check(cell.source),
                )
            )
    return found


def notebook_title(nb) -> str | None:
    """The text of the notebook's first level-1 heading (``Exercises:
    Masking``), or None."""
    for cell in nb.cells[:3]:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                if line.startswith("# "):
                    return line[2:].strip()
    return None


def read_notebook(path: Path, limit: int = MAX_NOTEBOOK_BYTES):
    """(notebook, None) or (None, the reason it cannot be graded). Only a
    regular file is read, never through a symbolic link (a link to a solution
    notebook, to ``/dev/zero``) nor a device or a FIFO, and only up to
    ``limit`` bytes: its size is checked before anything is parsed."""
    try:
        # O_NONBLOCK: opening a FIFO waits not
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None, "no such file"
    except OSError as err:
        if err.errno == errno.ELOOP:
            return (
                None,
                "a symbolic link: the grader reads only regular files (copy "
                "the notebook itself)",
            )
        return None, f"cannot read the file ({type(err).__name__})"
    info = os.fstat(fd)
    # checked before fdopen, which refuses a folder with an exception
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        return (
            None,
            "not a regular file (a folder, device or FIFO): the grader "
            "reads only regular files",
        )
    with os.fdopen(fd, "rb") as f:
        if info.st_size > limit:
            return (
                None,
                f"the file has {info.st_size} bytes, over the grader's "
                f"limit of {limit} bytes",
            )
        data = f.read(limit + 1)
    if len(data) > limit:
        return None, f"the file has over {limit} bytes, the grader's limit"
    try:
        nb = nbformat.reads(data.decode("utf-8"), as_version=4)
        nbformat.validate(nb)
        # JSON: nbformat read it; it fills in what a notebook lacks
        raw = json.loads(data.decode("utf-8"))
        if "nbformat" not in raw or not raw.get("cells"):
            return None, (
                "not a notebook saved by Jupyter (no 'nbformat' field or no "
                "cells): submit the exercise "
                "notebook itself, saved from Jupyter"
            )
    except UnicodeDecodeError as err:
        return None, f"cannot read the file ({type(err).__name__})"
    # nbformat raises several kinds of errors for non-notebooks
    except Exception as err:  # noqa: BLE001
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        return (
            None,
            f"not a valid notebook ({type(err).__name__}: {first[:120]})",
        )
    return nb, None


def default_reference() -> Path | None:
    """The ``solutions/`` folder of the course whose package this is (the
    repository holding ``src/``), or None (an installed package has none).
    Never the current folder's: grading from inside a student's clone must not
    take the student's ``solutions/`` as the reference."""
    import attention_course

    folder = Path(attention_course.__file__).resolve().parents[2] / "solutions"
    return folder if folder.is_dir() else None


def find_reference(
    notebook: str | Path, reference: str | Path | None = AUTO
) -> Path | None:
    """The solution notebook whose check cells grade ``notebook``, or None.

    ``reference`` is a solution notebook (used for every submission), a folder
    of them (the one with the submission's name, or whose name the submission's
    name ends with after ``_``, ``-``, ``.`` or a space; the longest such
    match), ``AUTO`` (:func:`default_reference`) or None.
    """
    if reference == AUTO:
        reference = default_reference()
    if reference is None:
        return None
    reference = Path(reference)
    if reference.is_file():
        return reference
    name = Path(notebook).name
    matches = [
        p
        for p in reference.glob("*.ipynb")
        if name == p.name
        or (name.endswith(p.name) and name[-len(p.name) - 1] in "_-. ")
    ]
    return max(matches, key=lambda p: len(p.name), default=None)


@dataclass
class Reference:
    """A solution notebook, read once: its check cells, ``uses`` (``{exercise:
    the reference-like tokens its solution uses}``, which a submission may use
    too) and ``classes`` (``{exercise: whether its solution gives the check a
    class}``: a class handed to a function's check gets a clear message)."""

    path: Path
    checks: list[CheckCell]
    uses: dict[int, set[str]]
    classes: dict[int, bool]
    title: str | None = None  # its first heading (see notebook_title)

    @classmethod
    def read(cls, path: Path) -> Reference | str:
        """The reference, or why it cannot be used."""
        nb, problem = read_notebook(path)
        found = check_cells(nb) if nb is not None else []
        if not found:
            return f"reference notebook {path}: {problem or 'no check cells'}"
        cells = references.parse_cells(nb)
        uses: dict[int, set[str]] = {}
        classes: dict[int, bool] = {}
        for check in found:
            definitions = references.definitions(cells, check.index)
            exprs = expressions(check.calls)
            classes[check.number] = any(
                isinstance(definitions.get(e), ast.ClassDef) for e in exprs
            )
            for expr in exprs:
                uses.setdefault(check.number, set()).update(
                    references.flagged(cells, check.index, expr)
                )
        return cls(path, found, uses, classes, notebook_title(nb))


@dataclass
class Exercise:
    number: int
    title: str
    level: str
    # its check cells in the submission (several copies: all must pass; none:
    # deleted)
    indices: list[int]
    calls: list[CheckCall] | None


def _untagged_copies(nb, source: str, tagged: set[int]) -> list[int]:
    """The code cells of ``nb`` whose text is the reference's check cell
    ``source`` but whose tags were lost (a retyped or pasted cell): recognised
    by their text, so that an honest student is graded."""
    text = source.strip()
    return [
        i
        for i, cell in enumerate(nb.cells)
        if i not in tagged
        and cell.cell_type == "code"
        and cell.source.strip() == text
    ]


def plan(nb, reference: Reference | None) -> list[Exercise]:
    """The exercises to grade: the reference's, with the reference's check
    sources put into ``nb`` (whose own check cells are matched by exercise
    number, else, for a cell whose tags were lost, by its text), or, without a
    reference, ``nb``'s own check cells."""
    own = check_cells(nb)
    if reference is None:
        return [
            Exercise(c.number, c.title, c.level, [c.index], c.calls)
            for c in own
        ]
    found = []
    tagged = {c.index for c in own}
    for ref in reference.checks:
        indices = [
            c.index for c in own if c.number == ref.number
        ] or _untagged_copies(nb, ref.source, tagged)
        for index in indices:
            nb.cells[index].source = ref.source
        found.append(
            Exercise(ref.number, ref.title, ref.level, indices, ref.calls)
        )
    return found
