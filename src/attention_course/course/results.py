"""The grader's results and the formats it writes them in: a table per notebook, JSON, JSON lines, CSV.

A failing check's diagnosis code (``[missing-scale]``, ...) is reported; other errors by exception name (e.g.
``NameError``), a check stopped by a time limit as ``timeout``, and a check cell that never ran (the submission's
process died) as ``not-run``. Under each failed exercise the table shows the hint for its code (the catalogue's
description of the mistake, else the check's message). The CSV has one row per exercise and, per notebook, a row
whose ``exercise`` is ``total``, whose ``passed`` is the number passed and whose ``message`` is ``passed/total``
(an unreadable notebook gets one row whose ``code`` is ``error`` instead).
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import asdict, dataclass, field

from ..checks.runner import split_code
from ..mistakes import CODES

TOTAL = "total"  # the `exercise` of a notebook's total row in the CSV
CSV_HEADER = ["notebook", "exercise", "title", "level", "passed", "code", "message"]


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

    @classmethod
    def from_dict(cls, data: dict) -> NotebookResult:
        result = cls(str(data["notebook"]), error=data.get("error"), reference=data.get("reference"))
        result.exercises = [ExerciseResult(**e) for e in data.get("exercises", [])]
        return result


def hint(result: ExerciseResult) -> str:
    """What a failed exercise's code means: the catalogue's description, else the check's own message."""
    if result.code in CODES:
        return CODES[result.code]
    return split_code(result.message or "")[1].strip()


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


def format_jsonl(result: NotebookResult) -> str:
    return json.dumps(result.as_dict(), ensure_ascii=False)


def csv_rows(result: NotebookResult) -> list[list]:
    """The CSV rows of one notebook (see the module docstring)."""
    r = result
    if r.error:
        return [[r.notebook, "", "", "", "", "error", r.error]]
    rows = [[r.notebook, e.exercise, e.title, e.level, int(e.passed), e.code or "", e.message or ""]
            for e in r.exercises]
    return rows + [[r.notebook, TOTAL, "", "", r.passed, "", f"{r.passed}/{r.total}"]]


def format_csv(results: list[NotebookResult], header: bool = True) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    if header:
        writer.writerow(CSV_HEADER)
    for r in results:
        writer.writerows(csv_rows(r))
    return buf.getvalue()
