"""The grader's results and the formats it writes them in: a table per notebook, JSON, JSON lines, CSV.

A failing check's diagnosis code (``[missing-scale]``, ...) is reported; other errors by exception name (e.g.
``NameError``), a check stopped by a time limit as ``timeout``, and a check cell that never ran (the submission's
process died) as ``not-run``. Under each failed exercise the table shows the hint for its code (the catalogue's
description of the mistake, else the check's message). The CSV has one row per exercise and, per notebook, a row
whose ``exercise`` is ``total``, whose ``passed`` is the number passed and whose ``message`` is ``passed/total``
(an unreadable notebook gets one row whose ``code`` is ``error`` instead). Every report names the isolation the
submission ran under (a line under the notebook's in the table, a column of the CSV, a field of the JSON).

Text that comes from a submission (messages, codes, its own titles, file names) is escaped for each format when it
is written: in the table and the CSV every control, format or separator character but the space is written as an
escape (``\\x1b``, ``\\n``, ``\\u202e``), so it can neither forge a line nor drive the terminal; a CSV cell
that would begin with ``=``, ``+``, ``-`` or ``@`` (a spreadsheet formula) begins with ``'``; JSON is ASCII, every
other character escaped (one line per result, whatever splits the lines).
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import asdict, dataclass, field

from ..checks.runner import split_code
from ..mistakes import CODES

TOTAL = "total"  # the `exercise` of a notebook's total row in the CSV
CSV_HEADER = ["notebook", "exercise", "title", "level", "passed", "code", "message", "isolation"]


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
    isolation: str | None = None  # how the submission was isolated and limited (sandbox.describe)

    @property
    def passed(self) -> int:
        return sum(e.passed for e in self.exercises)

    @property
    def total(self) -> int:
        return len(self.exercises)

    def as_dict(self) -> dict:
        return {"notebook": self.notebook, "passed": self.passed, "total": self.total, "error": self.error,
                "reference": self.reference, "isolation": self.isolation,
                "exercises": [asdict(e) for e in self.exercises]}

    @classmethod
    def from_dict(cls, data: dict) -> NotebookResult:
        result = cls(str(data["notebook"]), error=data.get("error"), reference=data.get("reference"),
                     isolation=data.get("isolation"))
        result.exercises = [ExerciseResult(**e) for e in data.get("exercises", [])]
        return result


def printable(text) -> str:
    """``text`` with every character that is not printable (controls such as ESC and newlines, formatting such as
    right-to-left overrides, line separators) written as its escape; the space stays."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in str(text))


def _csv_cell(value):
    """A cell a spreadsheet shows as text: printable, and never a formula."""
    if not isinstance(value, str):
        return value
    text = printable(value)
    return "'" + text if text[:1] in ("=", "+", "-", "@") else text


def hint(result: ExerciseResult) -> str:
    """What a failed exercise's code means: the catalogue's description, else the check's own message."""
    if result.code in CODES:
        return CODES[result.code]
    return split_code(result.message or "")[1].strip()


def format_table(results: list[NotebookResult]) -> str:
    lines = []
    for r in results:
        name = printable(r.notebook)
        if r.error:
            lines.append(f"ERROR {name}: {printable(r.error)}")
            continue
        own = "" if r.reference else "  (its own check cells: no reference notebook)"
        lines.append(f"{name}: {r.passed}/{r.total}{own}")
        if r.isolation:
            lines.append(f"  isolation: {r.isolation}")
        titles = [printable(e.title) for e in r.exercises]
        width = max(map(len, titles), default=0)
        for e, title in zip(r.exercises, titles, strict=True):
            status = "pass" if e.passed else "FAIL"
            code = f"  [{printable(e.code)}]" if e.code else ""
            lines.append(f"  Exercise {e.exercise:<3} {title:<{width}}  {status}{code}".rstrip())
            if not e.passed and hint(e):
                lines.append(f"{'':15}hint: {printable(hint(e))}")
    return "\n".join(lines)


def format_json(results: list[NotebookResult]) -> str:
    return json.dumps({"notebooks": [r.as_dict() for r in results]}, indent=2)


def format_jsonl(result: NotebookResult) -> str:
    return json.dumps(result.as_dict())


def csv_rows(result: NotebookResult) -> list[list]:
    """The CSV rows of one notebook (see the module docstring)."""
    r = result
    isolation = r.isolation or ""
    if r.error:
        return [[r.notebook, "", "", "", "", "error", r.error, isolation]]
    rows = [[r.notebook, e.exercise, e.title, e.level, int(e.passed), e.code or "", e.message or "", isolation]
            for e in r.exercises]
    return rows + [[r.notebook, TOTAL, "", "", r.passed, "", f"{r.passed}/{r.total}", isolation]]


def format_csv(results: list[NotebookResult], header: bool = True) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    if header:
        writer.writerow(CSV_HEADER)
    for r in results:
        writer.writerows([[_csv_cell(v) for v in row] for row in csv_rows(r)])
    return buf.getvalue()
