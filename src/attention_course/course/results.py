"""The grader's results and the formats it writes them in: a table per
notebook, JSON, JSON lines, CSV.

A failing check's diagnosis code (``[missing-scale]``, ...) is reported; other
errors by exception name (e.g. ``NameError``), a check stopped by a time limit
as ``timeout``, and a check cell that never ran (the submission's process died)
as ``not-run``. Under each failed exercise the table shows the hint for its
code (the catalogue's description of the mistake, else the check's message).
The CSV has one row per exercise and, per notebook, a row whose ``exercise`` is
``total``, whose ``passed`` is the number passed and whose ``message`` is
``passed/total`` (an unreadable notebook gets one row whose ``code`` is
``error`` instead). Every report names the isolation the submission ran under
(a line under the notebook's in the table, a column of the CSV, a field of the
JSON).

Text that comes from a submission (messages, codes, its own titles, file names)
is escaped for each format when it is written: in the table and the CSV every
control, format or separator character but the space is written as an escape
(``\\x1b``, ``\\n``, ``\\u202e``), so it can neither forge a line nor drive the
terminal; a CSV cell that would begin with ``=``, ``+``, ``-`` or ``@`` (a
spreadsheet formula) begins with ``'``; JSON is ASCII, every other character
escaped (one line per result, whatever splits the lines).
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import asdict, dataclass, field

from ..mistakes import CODES, split_code

TOTAL = "total"  # the `exercise` of a notebook's total row in the CSV
CSV_HEADER = [
    "notebook",
    "exercise",
    "title",
    "level",
    "passed",
    "points",
    "max_points",
    "code",
    "message",
    "isolation",
]


@dataclass
class ExerciseResult:
    exercise: int
    title: str
    level: str
    passed: bool
    code: str | None = None
    message: str | None = None
    # its public cases passed (None: not known, e.g. the check timed out)
    public_passed: bool | None = None
    # its checker draws hidden cases (points.draws_hidden)
    hidden_cases: bool = False
    # the time its check took, calls into the sandbox included
    seconds: float | None = None
    points: float | None = None  # earned (points.score); None until scored
    max_points: float | None = None
    # the share of max_points its hidden cases carry (0 without hidden cases)
    hidden_share: float = 0.0

    @property
    def partial(self) -> bool:
        """Public cases passed, a hidden case failed: the public share is
        earned."""
        return (
            not self.passed and bool(self.public_passed) and self.hidden_cases
        )


@dataclass
class NotebookResult:
    notebook: str
    exercises: list[ExerciseResult] = field(default_factory=list)
    error: str | None = None
    # the solution notebook whose check cells were used; None: the notebook's
    # own
    reference: str | None = None
    # how the submission was isolated and limited (sandbox.describe)
    isolation: str | None = None
    # the error is the grader's (its process crashed, ran out of time): never a
    # grade
    grader_failed: bool = False
    # [cell number (1-based), exception name, message] of the
    cell_errors: list = field(default_factory=list)
    # cells that are not checks and raised (the student's code: shown in the
    # feedback) what the student should know about the whole notebook
    notes: list = field(default_factory=list)
    # {cell index (str): its nbformat outputs} of the grading run, for
    outputs: dict = field(default_factory=dict)
    # the review notebook; carried from the grader's child process
    # (as_dict(outputs=True)), never stored or reported

    @property
    def passed(self) -> int:
        return sum(e.passed for e in self.exercises)

    @property
    def total(self) -> int:
        return len(self.exercises)

    @property
    def score(self) -> float:
        return round(sum(e.points or 0.0 for e in self.exercises), 4)

    @property
    def max_score(self) -> float:
        return round(sum(e.max_points or 0.0 for e in self.exercises), 4)

    def as_dict(self, outputs: bool = False) -> dict:
        data = {
            "notebook": self.notebook,
            "passed": self.passed,
            "total": self.total,
            "score": self.score,
            "max_score": self.max_score,
            "error": self.error,
            "reference": self.reference,
            "isolation": self.isolation,
            "grader_failed": self.grader_failed,
            "notes": list(self.notes),
            "cell_errors": list(self.cell_errors),
            "exercises": [asdict(e) for e in self.exercises],
        }
        return {**data, "outputs": dict(self.outputs)} if outputs else data

    @classmethod
    def from_dict(cls, data: dict) -> NotebookResult:
        result = cls(
            str(data["notebook"]),
            error=data.get("error"),
            reference=data.get("reference"),
            isolation=data.get("isolation"),
            grader_failed=bool(data.get("grader_failed")),
            cell_errors=list(data.get("cell_errors") or []),
            notes=list(data.get("notes") or []),
            outputs=dict(data.get("outputs") or {}),
        )
        fields = set(ExerciseResult.__dataclass_fields__)
        result.exercises = [
            ExerciseResult(**{k: v for k, v in e.items() if k in fields})
            for e in data.get("exercises", [])
        ]
        return result


def printable(text) -> str:
    """``text`` with every character that is not printable (controls such as
    ESC and newlines, formatting such as right-to-left overrides, line
    separators) written as its escape; the space stays."""
    return "".join(
        c if c.isprintable() else c.encode("unicode_escape").decode("ascii")
        for c in str(text)
    )


def _csv_cell(value):
    """A cell a spreadsheet shows as text: printable, and never a formula."""
    if not isinstance(value, str):
        return value
    text = printable(value)
    return "'" + text if text[:1] in ("=", "+", "-", "@") else text


def hint(result: ExerciseResult) -> str:
    """What a failed exercise's code means: the catalogue's description, else
    the check's own message."""
    if result.code in CODES:
        return CODES[result.code]
    return split_code(result.message or "")[1].strip()


def points_text(value: float | None) -> str:
    """Points as an instructor writes them: ``1.5``, ``2``."""
    return "" if value is None else f"{round(value, 2):g}"


def status(e: ExerciseResult) -> str:
    """``pass``; ``PART``: the public cases passed and a hidden case failed
    (the public share earned); ``FAIL``."""
    return "pass" if e.passed else "PART" if e.partial else "FAIL"


def format_table(results: list[NotebookResult]) -> str:
    lines = []
    for r in results:
        name = printable(r.notebook)
        if r.error:
            lines.append(f"ERROR {name}: {printable(r.error)}")
            continue
        own = (
            ""
            if r.reference
            else "  (its own check cells: no reference notebook)"
        )
        lines.append(
            f"{name}: {r.passed}/{r.total} exercises, "
            f"{points_text(r.score)}/{points_text(r.max_score)} "
            f"points{own}"
        )
        if r.isolation:
            lines.append(f"  isolation: {r.isolation}")
        lines += [f"  note: {printable(note)}" for note in r.notes]
        titles = [printable(e.title) for e in r.exercises]
        width = max(map(len, titles), default=0)
        for e, title in zip(r.exercises, titles, strict=True):
            code = f"  [{printable(e.code)}]" if e.code else ""
            earned = f"{points_text(e.points)}/{points_text(e.max_points)}"
            lines.append(
                f"  Exercise {e.exercise:<3} {title:<{width}}  {earned:>7}  "
                f"{status(e)}{code}".rstrip()
            )
            if e.partial:
                lines.append(
                    f"{'':15}public cases passed, a hidden case failed: "
                    f"{points_text(e.points)} of "
                    f"{points_text(e.max_points)} points"
                )
            if not e.passed and hint(e):
                lines.append(f"{'':15}hint: {printable(hint(e))}")
    return "\n".join(lines)


def format_json(results: list[NotebookResult]) -> str:
    return json.dumps({"notebooks": [r.as_dict() for r in results]}, indent=2)


def format_jsonl(result: NotebookResult, outputs: bool = False) -> str:
    return json.dumps(result.as_dict(outputs))


def csv_rows(result: NotebookResult) -> list[list]:
    """The CSV rows of one notebook (see the module docstring)."""
    r = result
    isolation = r.isolation or ""
    if r.error:
        return [
            [r.notebook, "", "", "", "", "", "", "error", r.error, isolation]
        ]
    rows = [
        [
            r.notebook,
            e.exercise,
            e.title,
            e.level,
            int(e.passed),
            points_text(e.points),
            points_text(e.max_points),
            e.code or "",
            e.message or "",
            isolation,
        ]
        for e in r.exercises
    ]
    return rows + [
        [
            r.notebook,
            TOTAL,
            "",
            "",
            r.passed,
            points_text(r.score),
            points_text(r.max_score),
            "",
            f"{r.passed}/{r.total}",
            isolation,
        ]
    ]


def format_csv(results: list[NotebookResult], header: bool = True) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    if header:
        writer.writerow(CSV_HEADER)
    for r in results:
        writer.writerows([[_csv_cell(v) for v in row] for row in csv_rows(r)])
    return buf.getvalue()
