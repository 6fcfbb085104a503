"""Generate the exercise notebooks from the solution notebooks (one source of
truth).

Usage, from the project root::

    python -m attention_course.exercises                      # regenerate every exercises/*.ipynb
    python -m attention_course.exercises solutions/01_soft_lookup_exercises.ipynb
    python -m attention_course.exercises --check              # only verify they are up to date (exit 1 if not)

``solutions/NAME.ipynb`` is the source; ``exercises/NAME.ipynb`` is generated
from it:

* every region between a line ``### BEGIN SOLUTION`` and a line ``### END
  SOLUTION`` (as in nbgrader) becomes ``raise NotImplementedError("Exercise N:
  <title>")`` at the indentation of the BEGIN line (the message on a line of
  its own where one line would be longer than ``CODE_LINE_LENGTH``); lines
  outside the regions (e.g. ``def`` lines and docstrings) are kept;
* check cells (tags ``check`` and ``exercise-N``) get the tag
  ``raises-exception`` as well, since they fail until the student has written
  the code;
* the title ``# Solutions: <title>`` becomes ``# Exercises: <title>``: the book
  shows the two pages under different titles, once each in the chapter map;
* cells tagged ``solution-only`` are left out;
* cells tagged ``exercise-only`` (instructions that only make sense to a
  student, such as how to work and what a check says before the code is
  written) lose that tag and ``remove-cell``: in the solution notebook they
  must carry both, so that the book's solution page does not show them (Jupyter
  Book drops cells tagged ``remove-cell``);
* the notebook is executed
  (:func:`attention_course.course.kernel.execute_notebook`) so that its stored
  outputs are real, and the outputs are checked for machine paths.

The solution notebook's structure is validated first: a first cell ``#
Solutions: <title>`` (older notebooks:
``# Exercises: <title>``, kept as it is); exercise headings ``## Exercise N
(warm-up|core|challenge): <title>`` numbered 1, 2, ...; in each exercise at
least one solution region, then exactly one check cell tagged ``check`` and
``exercise-N``. See CONTRIBUTING.md, "Adding an exercise".

``--check`` regenerates in memory and compares cell types, sources and tags
(not outputs) with the stored exercise notebooks; it is what
tests/test_exercises_sync.py runs.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import nbformat

from .kernel import execute_notebook

BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
# the longest code line of a notebook (tools/lint_notebooks.py, rule long-line)
CODE_LINE_LENGTH = 79
LEVELS = ("warm-up", "core", "challenge")
HEADING = re.compile(
    r"^##\s+Exercise\s+(\d+)\s+\(([^)]*)\)\s*:\s*(.+?)\s*$", re.M
)
CHECK_TAG, RAISES_TAG, SOLUTION_ONLY_TAG = (
    "check",
    "raises-exception",
    "solution-only",
)
EXERCISE_ONLY_TAG, REMOVE_CELL_TAG = "exercise-only", "remove-cell"
SOLUTIONS_TITLE, EXERCISES_TITLE = "# Solutions: ", "# Exercises: "
EXERCISE_TAG = re.compile(r"^exercise-(\d+)$")
MACHINE_PATH = re.compile(
    r"(/work/|/tmp/|/root/|/home/[a-z]+/|\.venv/lib/python|site-packages)"
)


class ExerciseError(Exception):
    """A solution notebook that breaks the conventions, or an exercise notebook
    that cannot be generated."""


@dataclass
class Exercise:
    number: int
    level: str
    title: str


def _source(cell) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def _tags(cell) -> list[str]:
    return list(cell.get("metadata", {}).get("tags", []))


def exercise_number(cell) -> int | None:
    """N from a cell's ``exercise-N`` tag, or None."""
    for tag in _tags(cell):
        m = EXERCISE_TAG.match(tag)
        if m:
            return int(m.group(1))
    return None


def parse_heading(cell) -> Exercise | None:
    """The exercise a markdown cell introduces (``## Exercise N (level):
    title``), or None."""
    if cell.get("cell_type") != "markdown":
        return None
    m = HEADING.search(_source(cell))
    return (
        Exercise(int(m.group(1)), m.group(2).strip(), m.group(3).strip())
        if m
        else None
    )


def _raise_line(indent: str, message: str) -> str:
    """``raise NotImplementedError(message)`` at ``indent``; split over three
    lines where one would be longer than the book's code column holds
    (CODE_LINE_LENGTH, as tools/lint_notebooks.py)."""
    line = f"{indent}raise NotImplementedError({message})\n"
    if len(line) - 1 <= CODE_LINE_LENGTH:
        return line
    return (
        f"{indent}raise NotImplementedError(\n{indent}    "
        f"{message}\n{indent})\n"
    )


def stub_source(source: str, exercise: Exercise, where: str) -> str:
    """Replace each solution region of ``source`` by ``raise
    NotImplementedError("Exercise N: title")``."""
    out, inside, begin_line = [], False, 0
    message = json.dumps(
        f"Exercise {exercise.number}: {exercise.title}", ensure_ascii=False
    )
    for lineno, line in enumerate(source.splitlines(keepends=True), 1):
        marker = line.strip()
        if marker == BEGIN:
            if inside:
                raise ExerciseError(
                    f"{where}: line {lineno}: {BEGIN} inside another "
                    "solution region"
                )
            inside, begin_line = True, lineno
            indent = line[: len(line) - len(line.lstrip())]
            out.append(_raise_line(indent, message))
        elif marker == END:
            if not inside:
                raise ExerciseError(
                    f"{where}: line {lineno}: {END} without {BEGIN}"
                )
            inside = False
        elif not inside:
            out.append(line)
    if inside:
        raise ExerciseError(
            f"{where}: line {begin_line}: {BEGIN} without {END}"
        )
    return "".join(out).rstrip("\n")


def _has_region(source: str) -> bool:
    return any(line.strip() in (BEGIN, END) for line in source.splitlines())


def exercises_in(nb, where: str = "notebook") -> list[Exercise]:
    """Validate a solution notebook's structure; return its exercises in
    order."""
    cells = nb.cells
    if (
        not cells
        or cells[0].cell_type != "markdown"
        or not _source(cells[0]).startswith((SOLUTIONS_TITLE, EXERCISES_TITLE))
    ):
        raise ExerciseError(
            f"{where}: the first cell must be a markdown cell starting with "
            f"'{SOLUTIONS_TITLE}<title>'"
        )
    found: list[Exercise] = []
    current, regions, checks = None, 0, 0

    def close(ex):
        if ex is None:
            return
        if regions == 0:
            raise ExerciseError(
                f"{where}: exercise {ex.number} has no {BEGIN} ... {END} "
                "region"
            )
        if checks != 1:
            raise ExerciseError(
                f"{where}: exercise {ex.number} needs exactly one check "
                "cell (tags 'check' and "
                f"'exercise-{ex.number}'), found {checks}"
            )

    for i, cell in enumerate(cells):
        _check_edition_tags(cell, f"{where} cell {i}")
        heading = parse_heading(cell)
        if (
            heading is None
            and cell.cell_type == "markdown"
            and re.search(r"^##\s+Exercise\b", _source(cell), re.M)
        ):
            raise ExerciseError(
                f"{where} cell {i}: exercise heading must read '## Exercise "
                "N (warm-up|core|"
                "challenge): title'"
            )
        if heading is not None:
            close(current)
            if heading.number != len(found) + 1:
                raise ExerciseError(
                    f"{where} cell {i}: exercise {heading.number} should be "
                    f"number {len(found) + 1}"
                )
            if heading.level not in LEVELS:
                raise ExerciseError(
                    f"{where} cell {i}: level '{heading.level}' is not one "
                    f"of {', '.join(LEVELS)}"
                )
            current, regions, checks = heading, 0, 0
            found.append(heading)
            continue
        if cell.cell_type != "code":
            continue
        where_cell = f"{where} cell {i}"
        if CHECK_TAG in _tags(cell):
            if current is None:
                raise ExerciseError(
                    f"{where_cell}: check cell before the first exercise "
                    "heading"
                )
            if exercise_number(cell) != current.number:
                raise ExerciseError(
                    f"{where_cell}: the check cell of exercise "
                    f"{current.number} must also be tagged "
                    f"'exercise-{current.number}'"
                )
            if _has_region(_source(cell)):
                raise ExerciseError(
                    f"{where_cell}: a check cell must not contain a "
                    "solution region"
                )
            checks += 1
        elif _has_region(_source(cell)):
            if current is None:
                raise ExerciseError(
                    f"{where_cell}: solution region before the first "
                    "exercise heading"
                )
            if checks:
                raise ExerciseError(
                    f"{where_cell}: solution region after the check cell of "
                    f"exercise {current.number}"
                )
            # validates the markers
            stub_source(_source(cell), current, where_cell)
            regions += 1
    close(current)
    if not found:
        raise ExerciseError(
            f"{where}: no '## Exercise N (level): title' heading found"
        )
    return found


def _check_edition_tags(cell, where: str) -> None:
    """An ``exercise-only`` cell is hidden from the solution page
    (``remove-cell``) and is not ``solution-only``."""
    tags = _tags(cell)
    if EXERCISE_ONLY_TAG not in tags:
        return
    if SOLUTION_ONLY_TAG in tags:
        raise ExerciseError(
            f"{where}: a cell cannot be tagged both '{EXERCISE_ONLY_TAG}' "
            f"and '{SOLUTION_ONLY_TAG}'"
        )
    if REMOVE_CELL_TAG not in tags:
        raise ExerciseError(
            f"{where}: a cell tagged '{EXERCISE_ONLY_TAG}' must also be "
            f"tagged '{REMOVE_CELL_TAG}', "
            "so that the book's solution page does not show it"
        )
    if CHECK_TAG in tags or _has_region(_source(cell)):
        raise ExerciseError(
            f"{where}: a check cell or a solution region cannot be "
            f"'{EXERCISE_ONLY_TAG}'"
        )


def exercise_title(source: str) -> str:
    """The exercise notebook's first cell: ``# Solutions: X`` retitled ``#
    Exercises: X`` (the rest unchanged)."""
    return (
        EXERCISES_TITLE + source.removeprefix(SOLUTIONS_TITLE)
        if source.startswith(SOLUTIONS_TITLE)
        else source
    )


def make_exercise_notebook(solution_nb, where: str = "notebook"):
    """The exercise version of a solution notebook (not executed; outputs
    cleared)."""
    exercises_in(solution_nb, where)
    nb = nbformat.from_dict(json.loads(json.dumps(solution_nb)))  # deep copy
    cells, current = [], None
    nb.cells[0].source = exercise_title(_source(nb.cells[0]))
    for cell in nb.cells:
        heading = parse_heading(cell)
        if heading is not None:
            current = heading
        tags = _tags(cell)
        if SOLUTION_ONLY_TAG in tags:
            continue
        if EXERCISE_ONLY_TAG in tags:
            kept = [
                t
                for t in tags
                if t not in (EXERCISE_ONLY_TAG, REMOVE_CELL_TAG)
            ]
            if kept:
                cell.metadata["tags"] = kept
            else:
                cell.metadata.pop("tags", None)
        if cell.cell_type == "code":
            source = _source(cell)
            if _has_region(source):
                cell.source = stub_source(source, current, where)
            tags = _tags(cell)
            if CHECK_TAG in tags and RAISES_TAG not in tags:
                tags.append(RAISES_TAG)
            if tags:
                cell.metadata["tags"] = tags
            cell.outputs, cell.execution_count = [], None
            cell.metadata.pop("execution", None)
        cells.append(cell)
    nb.cells = cells
    nb.metadata.setdefault(
        "kernelspec",
        {"name": "python3", "display_name": "Python 3", "language": "python"},
    )
    return nb


def machine_paths(nb) -> list[str]:
    """Cells whose stored outputs (text, data or traceback) show a machine
    path."""
    found = []
    for i, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []):
            texts = [
                out.get("text", ""),
                out.get("evalue", ""),
                *out.get("traceback", []),
                *(
                    v
                    for v in out.get("data", {}).values()
                    if isinstance(v, str)
                ),
            ]
            for text in texts:
                text = "".join(text) if isinstance(text, list) else text
                m = MACHINE_PATH.search(text)
                if m:
                    found.append(f"cell {i}: {m.group(0)}")
    return found


def unexpected_check_results(nb) -> list[str]:
    """In an executed exercise notebook every check cell must fail with
    [not-implemented]."""
    problems = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or CHECK_TAG not in _tags(cell):
            continue
        errors = [
            o
            for o in cell.get("outputs", [])
            if o.get("output_type") == "error"
        ]
        if not errors or not errors[0].get("evalue", "").startswith(
            "[not-implemented]"
        ):
            got = (
                f"{errors[0].get('ename')}: "
                f"{errors[0].get('evalue', '')[:200]}"
                if errors
                else "no error"
            )
            problems.append(
                f"cell {i}: the check of exercise {exercise_number(cell)} "
                "should fail with "
                f"[not-implemented] before the student's work, got {got}"
            )
    return problems


def _signature(nb) -> list[tuple]:
    return [
        (c.cell_type, _source(c), tuple(sorted(_tags(c)))) for c in nb.cells
    ]


def differences(expected, actual) -> list[str]:
    """Source-level differences between a freshly generated and a stored
    exercise notebook."""
    exp, act = _signature(expected), _signature(actual)
    diffs = []
    if len(exp) != len(act):
        diffs.append(f"{len(act)} cells stored, {len(exp)} expected")
    for i, (e, a) in enumerate(zip(exp, act, strict=False)):
        if e[0] != a[0]:
            diffs.append(f"cell {i}: {a[0]} cell stored, {e[0]} expected")
        elif e[1] != a[1]:
            diffs.append(f"cell {i}: source differs")
        elif e[2] != a[2]:
            diffs.append(
                f"cell {i}: tags {list(a[2])} stored, {list(e[2])} expected"
            )
    return diffs


def exercise_path(solution: Path) -> Path:
    return solution.parent.parent / "exercises" / solution.name


def generate(solution: Path, run: bool = True) -> Path:
    """Write exercises/NAME.ipynb from solutions/NAME.ipynb (executed unless
    ``run`` is False)."""
    nb = make_exercise_notebook(
        nbformat.read(solution, as_version=4), str(solution)
    )
    target = exercise_path(solution)
    target.parent.mkdir(parents=True, exist_ok=True)
    if run:
        from nbclient.exceptions import CellExecutionError

        try:
            execute_notebook(nb, target.parent)
        except CellExecutionError as err:
            raise ExerciseError(
                f"{target}: a cell without the raises-exception tag "
                f"failed:\n{err}"
            ) from None
        problems = unexpected_check_results(nb)
        if problems:
            raise ExerciseError(f"{target}: {'; '.join(problems)}")
        paths = machine_paths(nb)
        if paths:
            raise ExerciseError(
                f"{target}: stored outputs show machine paths "
                f"({'; '.join(paths)}); print something "
                "stable instead (checks raise CheckFailed, which shows no "
                "paths)"
            )
    nbformat.write(nb, target)
    return target


def check(solution: Path) -> list[str]:
    """Problems that make exercises/NAME.ipynb out of date with
    solutions/NAME.ipynb (empty list: in sync)."""
    target = exercise_path(solution)
    try:
        expected = make_exercise_notebook(
            nbformat.read(solution, as_version=4), str(solution)
        )
    except ExerciseError as err:
        return [str(err)]
    if not target.exists():
        return [f"{target} does not exist"]
    return [
        f"{target}: {d}"
        for d in differences(expected, nbformat.read(target, as_version=4))
    ]


def _resolve(arg: str, root: Path) -> Path:
    path = Path(arg)
    if not path.suffix:
        path = path.with_suffix(".ipynb")
    if len(path.parts) == 1:
        path = root / "solutions" / path
    if path.parent.name == "exercises":
        path = path.parent.parent / "solutions" / path.name
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m attention_course.exercises",
        description=__doc__.split("\n")[0],
    )
    parser.add_argument(
        "notebooks",
        nargs="*",
        help="solution (or exercise) notebooks; default: solutions/*.ipynb",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="only verify that the exercise notebooks are up to date",
    )
    parser.add_argument(
        "--no-execute",
        action="store_true",
        help="write the exercise notebooks without running them",
    )
    parser.add_argument(
        "--root",
        default=".",
        help="project root holding solutions/ and exercises/ (default: .)",
    )
    args = parser.parse_args(argv)
    root = Path(args.root)
    solutions = [_resolve(a, root) for a in args.notebooks] or sorted(
        (root / "solutions").glob("*.ipynb")
    )
    if not solutions:
        print(
            f"no solution notebooks in {root / 'solutions'}", file=sys.stderr
        )
        return 1
    status = 0
    for solution in solutions:
        if not solution.exists():
            print(
                f"ERROR {solution}: no such solution notebook", file=sys.stderr
            )
            status = 1
            continue
        if args.check:
            problems = check(solution)
            for problem in problems:
                print(f"OUT OF DATE {problem}", file=sys.stderr)
            if problems:
                print(
                    "  regenerate with: python -m "
                    f"attention_course.exercises {solution}",
                    file=sys.stderr,
                )
                status = 1
            else:
                print(f"ok {exercise_path(solution)}")
            continue
        try:
            target = generate(solution, run=not args.no_execute)
        except ExerciseError as err:
            print(f"ERROR {err}", file=sys.stderr)
            status = 1
        else:
            print(f"wrote {target}")
    return status


if __name__ == "__main__":  # pragma: no cover - tested through main()
    sys.exit(main())
