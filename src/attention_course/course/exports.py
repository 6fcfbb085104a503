"""What the grader's results become for others: Gradescope's ``results.json``,
a gradebook CSV for Canvas or Moodle, and the feedback a student gets (Markdown
and HTML).

Gradescope (:func:`gradescope_results`, the fields of its autograder
specification, https://gradescope-autograders.readthedocs.io/en/latest/specs/):
``score`` and per exercise a test with ``name``, ``score``, ``max_score``,
``status``, ``output`` and ``visibility``. An exercise whose check has hidden
cases is two
tests: its public cases (``visible``) and its hidden cases
(``after_published``: the student sees them once the instructor publishes the
grades); ``score`` is the notebooks' total.

What a student is told (feedback, Gradescope's outputs) is built from the
exercise's points, status, diagnosis code, the catalogue's hint for that code,
and the time its check took; never a check's message for a hidden case (it may
describe the hidden input) and never a value the reference computed. A failure
that is not a catalogued mistake shows the student's own exception message
(their code raised it) or, for a failed public case, tells the student to run
the check in their notebook, where the same public case fails with its full
message.

Every text that could come from a submission is made printable
(:func:`.results.printable`) and escaped for its
format: HTML-escaped in HTML, HTML-escaped and backslash-escaped in Markdown, a
    CSV cell never a formula.
"""

from __future__ import annotations

import csv
import html
import io
import re
from dataclasses import dataclass, field
from pathlib import Path

from ..mistakes import CODES
from .results import (
    ExerciseResult,
    NotebookResult,
    _csv_cell,
    points_text,
    printable,
    status,
)

# the default; the points file's hidden_visibility chooses
HIDDEN_VISIBILITY = "after_published"
# exception names raised by the student's own code: their message is the
# student's text
_CHECKER_CODES = {
    "CheckFailed",
    "wrong-type",
    "timeout",
    "not-run",
    "sandbox-ended",
    "calls-reference",
    "check-missing",
    "mutates-input",
}


def student_hint(e: ExerciseResult, hidden_case: bool = False) -> str:
    """What a failed exercise tells its student (see the module docstring)."""
    if e.code in CODES:
        return CODES[e.code]
    if hidden_case:
        return (
            "a hidden case failed (the code above names the mistake "
            "where the check knows it)"
        )
    if (
        e.code
        and e.code not in _CHECKER_CODES
        and e.code.isidentifier()
        and e.message
    ):
        # the student's own exception
        return f"your code raised {e.code}: {e.message}"
    if e.code in (
        "timeout",
        "not-run",
        "sandbox-ended",
        "check-missing",
        "calls-reference",
        "wrong-type",
    ):
        return e.message or e.code
    return (
        "run this exercise's check in your notebook: its public cases "
        "fail there with the full message"
    )


def _line(e: ExerciseResult, part: str) -> str:
    """One test's output: ``part`` is "public", "hidden" or "all"."""
    if part == "hidden":
        if e.passed:
            return "The hidden cases passed."
        if not e.public_passed:
            return "Not counted: the public cases failed first."
        return printable(
            f"A hidden case failed [{e.code}]: "
            f"{student_hint(e, hidden_case=True)}"
        )
    if e.passed or (part == "public" and e.public_passed):
        return "The public cases passed." if part == "public" else "Passed."
    code = f" [{e.code}]" if e.code else ""
    return printable(f"Failed{code}: {student_hint(e)}")


def _tests(
    r: NotebookResult, prefix: str, hidden_visibility: str = HIDDEN_VISIBILITY
) -> list[dict]:
    tests = []
    for e in r.exercises:
        name = f"{prefix}Exercise {e.exercise}: {printable(e.title)}".rstrip(
            ": "
        )
        max_points = e.max_points or 0.0
        if e.hidden_share and e.hidden_cases:
            hidden_max = round(max_points * e.hidden_share, 4)
            public_max = round(max_points - hidden_max, 4)
            public_score = public_max if (e.passed or e.public_passed) else 0.0
            hidden_score = hidden_max if e.passed else 0.0
            tests.append(
                _test(
                    f"{name} (public cases)",
                    public_score,
                    public_max,
                    _line(e, "public"),
                    "visible",
                )
            )
            tests.append(
                _test(
                    f"{name} (hidden cases)",
                    hidden_score,
                    hidden_max,
                    _line(e, "hidden"),
                    hidden_visibility,
                )
            )
        else:
            tests.append(
                _test(
                    name,
                    e.points or 0.0,
                    max_points,
                    _line(e, "all"),
                    "visible",
                )
            )
    return tests


def _test(
    name: str,
    score: float,
    max_score: float,
    output: str,
    visibility: str,
    failed: bool = False,
) -> dict:
    return {
        "name": name,
        "score": round(score, 4),
        "max_score": round(max_score, 4),
        "status": "failed" if failed or score < max_score else "passed",
        "output": output,
        "output_format": "text",
        "visibility": visibility,
    }


def gradescope_results(
    results: list[NotebookResult],
    note: str | None = None,
    possible: dict[str, float] | None = None,
    hidden_visibility: str = HIDDEN_VISIBILITY,
) -> dict:
    """Gradescope's ``results.json`` for one submission's notebooks (see the
    module docstring); ``note``: a line for the whole submission (e.g. that no
    notebook was found); ``possible``: ``{notebook: the points its reference is
    worth}``, the ``max_score`` of a notebook that could not be graded (a
    failed test, never a passed 0/0 one)."""
    tests, lines, seconds = [], [], 0.0
    for r in results:
        prefix = (
            f"{Path(r.reference or r.notebook).stem}, "
            if len(results) > 1
            else ""
        )
        if r.error:
            tests.append(
                _test(
                    f"{prefix}the notebook {Path(r.notebook).name}".strip(
                        ", "
                    ),
                    0.0,
                    (possible or {}).get(r.notebook, 0.0),
                    printable(f"Not graded: {r.error}"),
                    "visible",
                    failed=True,
                )
            )
            lines.append(
                printable(f"{Path(r.notebook).name}: not graded: {r.error}")
            )
            continue
        tests += _tests(r, prefix, hidden_visibility)
        seconds += sum(e.seconds or 0.0 for e in r.exercises)
        lines.append(
            printable(
                f"{Path(r.notebook).name}: {r.passed}/{r.total} exercises, "
                f"{points_text(r.score)}/{points_text(r.max_score)} points. "
                f"Isolation: {r.isolation}"
            )
        )
        lines += [printable(f"Note: {note}") for note in r.notes]
        lines += (
            [
                printable(
                    f"{CELL_ERRORS_TITLE}: {'; '.join(cell_error_lines(r))}"
                )
            ]
            if r.cell_errors
            else []
        )
    if note:
        lines.insert(0, printable(note))
    return {
        "score": round(sum(r.score for r in results if not r.error), 4),
        "output": "\n".join(lines),
        "output_format": "text",
        "stdout_visibility": "hidden",
        "execution_time": int(round(seconds)),
        "tests": tests,
    }


@dataclass
class GradebookRow:
    """One person's row: as the LMS knows them (a group submission gives each
    member a row), their results by notebook, the notebooks they submitted late
    and when they submitted."""

    name: str
    id: str = ""
    email: str = ""
    results: dict[str, NotebookResult] = field(default_factory=dict)
    late: set[str] = field(default_factory=set)
    submitted_at: dict[str, str] = field(default_factory=dict)

    def points(self, notebook: str, late_penalty: float) -> float | None:
        """The notebook's points in the gradebook: 0 for an ERROR, less
        ``late_penalty`` (a share of them) when late; None: not submitted."""
        r = self.results.get(notebook)
        if r is None:
            return None
        score = 0.0 if r.error else r.score
        return (
            round(score * (1 - late_penalty), 4)
            if notebook in self.late
            else score
        )


def gradebook_csv(
    rows: list[GradebookRow],
    notebooks: list[str],
    max_points: dict[str, float],
    late_penalty: float = 0.0,
) -> str:
    """One row per person (name, the LMS's id and e-mail where it gave them),
    one column per notebook (its points, late penalty applied; empty: not
    submitted), a total, the notebooks submitted late and the submission times;
    the second row gives each column's points possible (Canvas's gradebook
    import reads such a row)."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(
        ["student", "id", "email", *notebooks, "total", "late", "submitted_at"]
    )
    writer.writerow(
        [
            "Points Possible",
            "",
            "",
            *(points_text(max_points.get(n)) for n in notebooks),
            points_text(sum(max_points.get(n, 0.0) for n in notebooks)),
            "",
            "",
        ]
    )
    for row in sorted(rows, key=lambda r: (r.name, r.id)):
        cells = [row.points(n, late_penalty) for n in notebooks]
        times = "; ".join(
            f"{n}: {row.submitted_at[n]}"
            for n in notebooks
            if row.submitted_at.get(n)
        )
        writer.writerow(
            [
                _csv_cell(row.name),
                _csv_cell(row.id),
                _csv_cell(row.email),
                *("" if c is None else points_text(c) for c in cells),
                points_text(sum(c for c in cells if c is not None)),
                "; ".join(n for n in notebooks if n in row.late),
                _csv_cell(times),
            ]
        )
    return buf.getvalue()


def _person_rows(
    rows: list[GradebookRow], notebooks: list[str], late_penalty: float
):
    """(row, [points or None per notebook]) sorted by name: the cells every LMS
    export shares."""
    for row in sorted(rows, key=lambda r: (r.name, r.id)):
        yield row, [row.points(n, late_penalty) for n in notebooks]


def _points_cells(cells: list) -> list[str]:
    return ["" if c is None else points_text(c) for c in cells]


def canvas_csv(
    rows: list[GradebookRow],
    notebooks: list[str],
    max_points: dict[str, float],
    late_penalty: float = 0.0,
    assignment_ids: dict[str, str] | None = None,
) -> str:
    """Canvas's gradebook import: ``Student``, ``ID`` (Canvas's user id, from
    its download's file names), ``SIS User ID``, ``SIS Login ID``, ``Section``,
    then one column per notebook and a ``Points Possible`` row second. A
    notebook's column is titled ``NOTEBOOK (ID)`` when ``assignment_ids`` gives
    its Canvas assignment id: Canvas matches such a column to that assignment,
    as in its own export; without an id, ``NOTEBOOK`` alone, and Canvas creates
    a new assignment of that name. An empty cell leaves Canvas's grade as it is
    (not submitted)."""
    ids = assignment_ids or {}
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(
        [
            "Student",
            "ID",
            "SIS User ID",
            "SIS Login ID",
            "Section",
            *(f"{n} ({ids[n]})" if n in ids else n for n in notebooks),
        ]
    )
    writer.writerow(
        [
            "Points Possible",
            "",
            "",
            "",
            "",
            *(points_text(max_points.get(n)) for n in notebooks),
        ]
    )
    for row, cells in _person_rows(rows, notebooks, late_penalty):
        writer.writerow(
            [
                _csv_cell(row.name),
                _csv_cell(row.id),
                "",
                "",
                "",
                *_points_cells(cells),
            ]
        )
    return buf.getvalue()


def moodle_csv(
    rows: list[GradebookRow], notebooks: list[str], late_penalty: float = 0.0
) -> str:
    """Moodle's grade import from a CSV file: one header row, no points row
    (Moodle would read it as a user), a user identified by ``Email address`` or
    ``ID number`` (chosen in its import form), one column per notebook mapped
    to a grade item there."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["Full name", "ID number", "Email address", *notebooks])
    for row, cells in _person_rows(rows, notebooks, late_penalty):
        writer.writerow(
            [
                _csv_cell(row.name),
                _csv_cell(row.id),
                _csv_cell(row.email),
                *_points_cells(cells),
            ]
        )
    return buf.getvalue()


def gradescope_csv(
    rows: list[GradebookRow], notebook: str, late_penalty: float = 0.0
) -> str:
    """Gradescope's score upload for one assignment: ``Name``, ``SID``,
    ``Email`` (Gradescope matches the e-mail or the SID of its roster) and
    ``Total Score``; people who did not submit the notebook are left out."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["Name", "SID", "Email", "Total Score"])
    for row, (points,) in _person_rows(rows, [notebook], late_penalty):
        if points is not None:
            writer.writerow(
                [
                    _csv_cell(row.name),
                    _csv_cell(row.id),
                    _csv_cell(row.email),
                    points_text(points),
                ]
            )
    return buf.getvalue()


def exercises_csv(rows: list[GradebookRow], notebooks: list[str]) -> str:
    """One row per person, one column per exercise (``NOTEBOOK:N``, its points;
    empty: not graded), then a row of each exercise's mean points and one of
    the share of graded submissions that passed it (as Otter's
    ``final_grades.csv`` with per-question statistics)."""
    columns = sorted(
        {
            (n, e.exercise)
            for row in rows
            for n, r in row.results.items()
            if n in notebooks
            for e in r.exercises
        }
    )
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(
        ["student", "id", *(f"{n}:{number}" for n, number in columns)]
    )
    found: dict[tuple[str, int], list] = {c: [] for c in columns}
    for row in sorted(rows, key=lambda r: (r.name, r.id)):
        by_column = {
            (n, e.exercise): e
            for n, r in row.results.items()
            for e in r.exercises
        }
        for column, e in by_column.items():
            if column in found:
                found[column].append(e)
        writer.writerow(
            [
                _csv_cell(row.name),
                _csv_cell(row.id),
                *(
                    points_text(by_column[c].points) if c in by_column else ""
                    for c in columns
                ),
            ]
        )
    writer.writerow(
        [
            "mean points",
            "",
            *(
                points_text(
                    sum(e.points or 0 for e in found[c]) / len(found[c])
                )
                if found[c]
                else ""
                for c in columns
            ),
        ]
    )
    writer.writerow(
        [
            "passed (share)",
            "",
            *(
                f"{sum(e.passed for e in found[c]) / len(found[c]):.2f}"
                if found[c]
                else ""
                for c in columns
            ),
        ]
    )
    return buf.getvalue()


_MARKDOWN_SPECIAL = re.compile(r"([\\`*_\[\]|~])")


def md(text) -> str:
    """Text shown as it is in Markdown, inside a line (never at its start):
    printable (no line break), ``<``, ``>`` and ``&`` HTML-escaped (no tag, no
    entity, no autolink) and the characters of emphasis, code, links and table
    cells backslash-escaped."""
    return _MARKDOWN_SPECIAL.sub(
        r"\\\1", html.escape(printable(text), quote=False)
    )


def _feedback_rows(r: NotebookResult) -> list[tuple[str, str, str, str, str]]:
    """(exercise, points, status, time, what to do) per exercise, as plain text
    (escaped by each format)."""
    rows = []
    for e in r.exercises:
        if e.passed:
            todo = ""
        elif e.partial:
            todo = (
                f"public cases pass; a hidden case fails [{e.code}]: "
                f"{student_hint(e, hidden_case=True)}"
            )
        else:
            todo = (
                f"[{e.code}] {student_hint(e)}" if e.code else student_hint(e)
            )
        time_text = "" if e.seconds is None else f"{e.seconds:.1f} s"
        rows.append(
            (
                f"{e.exercise}. {e.title}",
                f"{points_text(e.points)}/{points_text(e.max_points)}",
                {"pass": "passed", "PART": "partly", "FAIL": "failed"}[
                    status(e)
                ],
                time_text,
                todo,
            )
        )
    return rows


def feedback_markdown(r: NotebookResult, student: str | None = None) -> str:
    name = Path(r.notebook).name
    lines = [f"# Feedback: {md(name)}", ""]
    if student:
        lines += [f"Student: {md(student)}", ""]
    if r.error:
        return "\n".join([*lines, f"Not graded: {md(r.error)}", ""])
    lines += [
        f"**{points_text(r.score)} of {points_text(r.max_score)} points**, "
        f"{r.passed} of {r.total} exercises "
        "passed.",
        "",
        "| Exercise | Points | Result | Time | What to look at |",
        "|---|---|---|---|---|",
    ]
    lines += [
        "| " + " | ".join(md(cell) for cell in row) + " |"
        for row in _feedback_rows(r)
    ]
    lines += [
        "",
        "Partly: the public cases (the ones your notebook runs) pass and a "
        "hidden case fails: the code "
        "and hint name the mistake. Time: how long the exercise's check took.",
        "",
    ]
    lines += [f"**Note:** {md(note)}" for note in r.notes] + (
        [""] if r.notes else []
    )
    lines += (
        [f"{CELL_ERRORS_TITLE}:", ""]
        + [f"- {md(line)}" for line in cell_error_lines(r)]
        + [""]
        if r.cell_errors
        else []
    )
    lines += [f"Graded in isolation: {md(r.isolation or 'unknown')}.", ""]
    return "\n".join(lines)


CELL_ERRORS_TITLE = (
    "Cells of your notebook that raised an error (not checks; run them "
    "in your notebook)"
)


def cell_error_lines(r: NotebookResult) -> list[str]:
    """``cell 5: ModuleNotFoundError: No module named 'pandas'``, one per cell
    that raised."""
    return [
        f"cell {number}: {etype}: {message}"
        for number, etype, message in r.cell_errors
    ]


def feedback_html(r: NotebookResult, student: str | None = None) -> str:
    def esc(text) -> str:
        return html.escape(printable(text), quote=True)

    name = Path(r.notebook).name
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>Feedback: {esc(name)}</title></head><body>",
        f"<h1>Feedback: {esc(name)}</h1>",
    ]
    if student:
        parts.append(f"<p>Student: {esc(student)}</p>")
    if r.error:
        parts.append(f"<p>Not graded: {esc(r.error)}</p>")
    else:
        parts.append(
            f"<p><strong>{points_text(r.score)} of "
            f"{points_text(r.max_score)} points</strong>, "
            f"{r.passed} of {r.total} exercises passed.</p>"
        )
        parts.append(
            "<table><thead><tr><th>Exercise</th><th>Points</th>"
            "<th>Result</th><th>Time</th><th>What to look "
            "at</th></tr></thead><tbody>"
        )
        parts += [
            "<tr>" + "".join(f"<td>{esc(cell)}</td>" for cell in row) + "</tr>"
            for row in _feedback_rows(r)
        ]
        parts.append("</tbody></table>")
        parts += [
            f"<p><strong>Note:</strong> {esc(note)}</p>" for note in r.notes
        ]
        if r.cell_errors:
            parts.append(
                f"<p>{esc(CELL_ERRORS_TITLE)}:</p><ul>"
                + "".join(
                    f"<li>{esc(line)}</li>" for line in cell_error_lines(r)
                )
                + "</ul>"
            )
        parts.append(
            f"<p>Graded in isolation: {esc(r.isolation or 'unknown')}.</p>"
        )
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


REVIEW_OUTPUTS = (
    "Outputs: the grading run's (what each cell printed, displayed and "
    "raised in the sandbox); "
    "the outputs the student saved are removed. A check cell graded by the "
    "grader shows its verdict "
    "below it instead."
)


def review_notebook(
    nb, result: NotebookResult, check_indices: dict[int, list[int]]
):
    """The submitted notebook ``nb`` (an nbformat node, changed in place and
    returned) annotated for an instructor's manual review: each code cell's
    outputs are the grading run's (``result.outputs``, see
    :func:`.wire.clean_outputs`; none for a cell the run did not reach or a
    check the grader ran itself), never the ones the student saved; after each
    exercise's check cell (``check_indices``: ``{exercise: its cells'
    indices}``) a markdown cell with the grader's verdict, after each cell that
    raised one with its error, and a first cell with the notebook's points and
    notes."""
    from nbformat import from_dict
    from nbformat.v4 import new_markdown_cell

    after: dict[int, list[str]] = {}
    for e in result.exercises:
        verdict = (
            "passed"
            if e.passed
            else f"{status(e)} [{e.code}]: {e.message or ''}"
        )
        for index in check_indices.get(e.exercise, []):
            after.setdefault(index, []).append(
                f"Grader, exercise {e.exercise}: {points_text(e.points)}/"
                f"{points_text(e.max_points)} points, {verdict}"
            )
    for number, etype, message in result.cell_errors:
        after.setdefault(number - 1, []).append(
            f"Grader: this cell raised {etype}: {message}"
        )
    cells = []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            cell.outputs = [
                from_dict(output)
                for output in result.outputs.get(str(index), [])
            ]
            cell.execution_count = None
        cells.append(cell)
        cells += [new_markdown_cell(md(line)) for line in after.get(index, [])]
    head = [
        "Grader: "
        f"{points_text(result.score)}/{points_text(result.max_score)} "
        f"points, {result.passed} of "
        f"{result.total} exercises passed. Isolation: "
        f"{result.isolation or 'unknown'}.",
        *(f"Note: {note}" for note in result.notes),
        REVIEW_OUTPUTS,
    ]
    nb.cells = [
        new_markdown_cell("\n\n".join(md(line) for line in head)),
        *cells,
    ]
    return nb
