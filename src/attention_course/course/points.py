"""Points: what each exercise is worth, how its check's share splits between
    public and hidden cases, the score.

Defaults: an exercise is worth :data:`DEFAULT_POINTS` of its level (warm-up 1,
core 2, challenge 3). When its checker draws hidden cases
(:func:`draws_hidden`), :data:`DEFAULT_HIDDEN_SHARE` of its points (one half)
is the hidden cases' share: a submission that passes the public cases (the ones
the student's notebook runs) and fails a hidden one gets the public share, and
the result names it (``public_passed`` true, ``passed`` false, the hidden
failure's code). A check without hidden cases is worth all its points on its
public cases.

An instructor overrides points without editing a notebook in one TOML file
(``--points FILE``)::

    hidden_share = 0.5              # optional: the hidden cases' share of every exercise that has them
    late_penalty = 0.1              # optional: the share of a late notebook's points taken off (default 0)
    due = 2026-11-20T23:59:00Z      # optional: a Gradescope submission made after it is late (with its offset)
    hidden_visibility = "after_published"  # optional: when Gradescope shows the hidden cases' tests

    [levels]                        # optional: the points of each level
    warm-up = 1
    core = 2
    challenge = 3

    [notebooks.02_single_head_exercises]
    1 = 2                           # exercise 1 is worth 2 points
    3 = { points = 4, hidden_share = 0.25 }

    [canvas_assignments]            # optional: Canvas's assignment id of each notebook (canvas.csv's column titles)
    02_single_head_exercises = 123456

Every key is validated (:class:`PointsError`, naming the file, the table and
the key): unknown keys, levels and exercises, negative points, shares outside
[0, 1]; notebooks and exercise numbers are checked against the reference
notebooks when the reference folder is known (:meth:`Points.validate`).
"""

from __future__ import annotations

import ast
import functools
import math
import tomllib
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from .exercises import LEVELS

DEFAULT_POINTS = {"warm-up": 1.0, "core": 2.0, "challenge": 3.0}
DEFAULT_HIDDEN_SHARE = 0.5
# Gradescope's test visibilities
VISIBILITIES = ("hidden", "after_due_date", "after_published", "visible")


class PointsError(ValueError):
    """A points file that cannot be used; the message names the file and the
    key."""


def _number(value, where: str, upper: float | None = None) -> float:
    number = (
        not isinstance(value, bool)
        and isinstance(value, (int, float))
        and math.isfinite(value)
    )
    if upper is not None and not (number and 0 <= value <= upper):
        raise PointsError(
            f"{where}: expected a number from 0 to {upper:g}, got {value!r}"
        )
    if not (number and value >= 0):
        raise PointsError(
            f"{where}: expected a non-negative number, got {value!r}"
        )
    return float(value)


@dataclass
class Points:
    """Points per level, the default hidden share, and per-notebook overrides
    ``{notebook stem: {exercise:
    (points or None, hidden share or None)}}``."""

    levels: dict[str, float] = field(
        default_factory=lambda: dict(DEFAULT_POINTS)
    )
    hidden_share: float = DEFAULT_HIDDEN_SHARE
    notebooks: dict[str, dict[int, tuple[float | None, float | None]]] = field(
        default_factory=dict
    )
    source: str | None = None  # the file read, for messages
    # the share of a late notebook's points taken off in the gradebook
    late_penalty: float = 0.0
    # when Gradescope shows a student their hidden cases' tests
    hidden_visibility: str = "after_published"
    # a submission time after it is late (Canvas marks its late files itself)
    due: datetime | None = None
    # {notebook stem: Canvas's assignment id}
    canvas_ids: dict[str, str] = field(default_factory=dict)

    @classmethod
    def load(cls, path: str | Path) -> Points:
        path = Path(path)
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except OSError as err:
            raise PointsError(
                f"points file {path}: cannot read it ({type(err).__name__})"
            ) from None
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
            raise PointsError(
                f"points file {path}: not valid TOML ({err})"
            ) from None
        return cls.from_dict(data, f"points file {path}")

    @classmethod
    def from_dict(cls, data: dict, source: str = "points") -> Points:
        points = cls(source=source)
        unknown = set(data) - {
            "levels",
            "hidden_share",
            "notebooks",
            "late_penalty",
            "hidden_visibility",
            "due",
            "canvas_assignments",
        }
        if unknown:
            raise PointsError(
                f"{source}: unknown key(s) {', '.join(sorted(unknown))} "
                "(expected levels, "
                "hidden_share, late_penalty, hidden_visibility, due, "
                "notebooks, canvas_assignments)"
            )
        for notebook, value in _table(
            data.get("canvas_assignments", {}),
            f"{source} [canvas_assignments]",
        ).items():
            points.canvas_ids[Path(notebook).stem] = canvas_id(
                value, f"{source} [canvas_assignments] {notebook}"
            )
        if "due" in data:
            points.due = _due(data["due"], f"{source} due")
        if "late_penalty" in data:
            points.late_penalty = _number(
                data["late_penalty"], f"{source} late_penalty", 1
            )
        if "hidden_visibility" in data:
            if data["hidden_visibility"] not in VISIBILITIES:
                raise PointsError(
                    f"{source} hidden_visibility: expected one of "
                    f"{', '.join(VISIBILITIES)}, got "
                    f"{data['hidden_visibility']!r}"
                )
            points.hidden_visibility = data["hidden_visibility"]
        for level, value in _table(
            data.get("levels", {}), f"{source} [levels]"
        ).items():
            if level not in LEVELS:
                raise PointsError(
                    f"{source} [levels]: unknown level {level!r} (one of "
                    f"{', '.join(LEVELS)})"
                )
            points.levels[level] = _number(value, f"{source} [levels] {level}")
        if "hidden_share" in data:
            points.hidden_share = _number(
                data["hidden_share"], f"{source} hidden_share", 1
            )
        for notebook, table in _table(
            data.get("notebooks", {}), f"{source} [notebooks]"
        ).items():
            where = f"{source} [notebooks.{notebook}]"
            entries = points.notebooks.setdefault(Path(notebook).stem, {})
            for key, value in _table(table, where).items():
                if not key.isdigit() or int(key) < 1:
                    raise PointsError(
                        f"{where}: {key!r} is not an exercise number (1, 2, "
                        "...)"
                    )
                entries[int(key)] = _entry(value, f"{where} {key}")
        return points

    def validate(
        self, exercises: dict[str, set[int]], complete: bool = True
    ) -> None:
        """Check the overrides against ``{notebook stem: its exercise
        numbers}`` (the reference notebooks). ``complete=False``: ``exercises``
        holds only some of the course's notebooks (one submission's reference,
        a bundle's chapters), so a notebook not among them is another
        chapter's, not a typo; its own numbers are still checked."""
        for notebook in self.canvas_ids:
            if notebook not in exercises and complete:
                raise PointsError(
                    f"{self.source} [canvas_assignments] {notebook}: no "
                    "reference notebook of that name "
                    f"(known: {', '.join(sorted(exercises)) or 'none'})"
                )
        for notebook, entries in self.notebooks.items():
            if notebook not in exercises and not complete:
                continue
            if notebook not in exercises:
                known = ", ".join(sorted(exercises)) or "none"
                raise PointsError(
                    f"{self.source} [notebooks.{notebook}]: no reference "
                    "notebook of that name "
                    f"(known: {known})"
                )
            for number in entries:
                if number not in exercises[notebook]:
                    have = ", ".join(map(str, sorted(exercises[notebook])))
                    raise PointsError(
                        f"{self.source} [notebooks.{notebook}] {number}: no "
                        "such exercise (the "
                        f"notebook has {have})"
                    )

    def of(
        self, notebook: str, number: int, level: str
    ) -> tuple[float, float]:
        """(points, hidden share) of exercise ``number`` of ``notebook`` (a
        path or a stem)."""
        override = self._overrides(notebook).get(number, (None, None))
        points = (
            override[0]
            if override[0] is not None
            else self.levels.get(level, DEFAULT_POINTS["core"])
        )
        share = override[1] if override[1] is not None else self.hidden_share
        return points, share

    def _overrides(self, notebook: str) -> dict:
        """The overrides of ``notebook``: by its stem, or a stem its name ends
        with (``alice_02_x``: ``02_x``)."""
        stem = Path(notebook).stem
        names = [
            n
            for n in self.notebooks
            if stem == n or (stem.endswith(n) and stem[-len(n) - 1] in "_-. ")
        ]
        return self.notebooks[max(names, key=len)] if names else {}


def canvas_id(value, where: str) -> str:
    """Canvas's assignment id (the number in its assignment's address,
    ``/assignments/123456``) as text."""
    text = (
        str(value)
        if not isinstance(value, bool) and isinstance(value, (int, str))
        else ""
    )
    if not (text.isascii() and text.isdigit() and int(text) > 0):
        raise PointsError(
            f"{where}: expected Canvas's assignment id, a positive whole "
            "number (the number in the "
            f"assignment's address, .../assignments/123456), got {value!r}"
        )
    return str(int(text))


def _table(value, where: str) -> dict:
    if not isinstance(value, dict):
        raise PointsError(f"{where}: expected a table, got {value!r}")
    return value


def _entry(value, where: str) -> tuple[float | None, float | None]:
    if isinstance(value, dict):
        unknown = set(value) - {"points", "hidden_share"}
        if unknown:
            raise PointsError(
                f"{where}: unknown key(s) {', '.join(sorted(unknown))} "
                "(expected points, hidden_share)"
            )
        points = (
            _number(value["points"], f"{where} points")
            if "points" in value
            else None
        )
        share = (
            _number(value["hidden_share"], f"{where} hidden_share", 1)
            if "hidden_share" in value
            else None
        )
        return points, share
    return _number(value, where), None


# Which checkers draw hidden cases: read from the checks package's source, so
# that the split of an exercise's points is known before any submission runs
# (not from what a submission's run happened to reach).


def _imports(tree: ast.Module) -> dict[str, tuple[str, str | None]]:
    """``{local name: (module in the checks package, function or None for the
    module itself)}``."""
    found = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            for alias in node.names:
                local = alias.asname or alias.name
                found[local] = (
                    (node.module, alias.name)
                    if node.module
                    else (alias.name, None)
                )
    return found


@functools.cache
def _hidden_graph() -> tuple[dict, set]:
    """The checks package's functions, each with the functions it names, and
    the hidden-case functions."""
    from .. import checks

    folder = Path(checks.__file__).parent
    names: dict[tuple[str, str], set[tuple[str, str]]] = {}
    for path in sorted(folder.glob("*.py")):
        module = path.stem
        tree = ast.parse(path.read_text(encoding="utf-8"))
        imports = _imports(tree)
        local = {
            n.name
            for n in tree.body
            if isinstance(n, (ast.FunctionDef, ast.ClassDef))
        }
        for node in tree.body:
            if not isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                continue
            refs = set()
            for sub in ast.walk(node):
                if isinstance(sub, ast.Name):
                    if sub.id in local:
                        refs.add((module, sub.id))
                    elif sub.id in imports and imports[sub.id][1] is not None:
                        refs.add(imports[sub.id])
                elif isinstance(sub, ast.Attribute) and isinstance(
                    sub.value, ast.Name
                ):
                    target = imports.get(sub.value.id)
                    if target is not None and target[1] is None:
                        refs.add((target[0], sub.attr))
            names[(module, node.name)] = refs
    hidden = {
        key
        for key, refs in names.items()
        if key[0] == "hidden" and ("hidden", "active") in refs
    }
    return names, hidden


@functools.cache
def draws_hidden(checker: str) -> bool:
    """Whether ``checks.<checker>`` draws hidden cases (it names, directly or
    through the package's functions, a function of
    :mod:`attention_course.checks.hidden` that adds cases when they are on)."""
    from .. import checks

    function = getattr(checks, checker, None)
    module = getattr(function, "__module__", "").rsplit(".", 1)[-1]
    names, hidden = _hidden_graph()
    seen, todo = set(), [(module, checker)]
    while todo:
        key = todo.pop()
        if key in hidden:
            return True
        if key not in seen:
            seen.add(key)
            todo.extend(names.get(key, ()))
    return False


def score(
    passed: bool, public_passed: bool | None, points: float, share: float
) -> float:
    """The points earned: all of them when every case passed, the public share
    when only the public cases did."""
    if passed:
        return points
    return points * (1 - share) if public_passed else 0.0


def _due(value, where: str) -> datetime:
    """The due time: a TOML date-time with its offset
    (``2026-11-20T23:59:00Z``): without one, the time of which zone would be a
    guess."""
    if not isinstance(value, datetime) or value.tzinfo is None:
        raise PointsError(
            f"{where}: expected a date-time with its offset, e.g. "
            "2026-11-20T23:59:00Z or "
            f"2026-11-20T23:59:00-08:00, got {value!r}"
        )
    return value
