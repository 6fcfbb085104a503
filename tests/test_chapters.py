"""The chapter index (attention_course.chapters) against every other list of the same facts: the notebooks'
"Library:" lines, CONTRIBUTING's chapter -> module map, the mistakes catalogue and the checks' lazy table."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from attention_course import chapters, checks, mistakes

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "attention_course"
MODULES = {p.stem for p in PACKAGE.glob("*.py")} | {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}


def top_level_ticks(text: str) -> list[str]:
    """The `backticked` names of a map cell outside parentheses (inside them: the functions of a module)."""
    depth, names = 0, []
    for match in re.finditer(r"[()]|`([^`]+)`", text):
        depth += {"(": 1, ")": -1}.get(match.group(0), 0)
        if match.group(1) and depth == 0:
            names.append(match.group(1))
    return names


def map_rows() -> dict[int | str, tuple[str, set[str], set[str]]]:
    rows = {}
    for line in (ROOT / "CONTRIBUTING.md").read_text().splitlines():
        cells = re.match(r"\| (\d+|capstone\d+) \| (.*?) \| (.*) \| (.*) \|$", line)
        if cells:
            key = int(cells.group(1)) if cells.group(1).isdigit() else cells.group(1)
            modules = {name.split(".")[0] for name in top_level_ticks(cells.group(3))} & MODULES
            rows[key] = (cells.group(2), modules, set(top_level_ticks(cells.group(4))))
    return rows


def library_modules(notebook: Path) -> set[str]:
    """The `attention_course.X` modules a chapter's "Library:" line names (the checks package aside)."""
    for cell in json.loads(notebook.read_text())["cells"][:3]:
        line = re.search(r"^Library:(.*?)(?:\n\n|$)", "".join(cell["source"]), re.M | re.S)
        if line:
            return {name.split(".")[1] for name in re.findall(r"`(attention_course\.[\w.]+)`", line.group(1))} - {
                "checks"}
    raise AssertionError(f"{notebook.name} has no Library: line")


def test_one_row_per_chapter_and_per_notebook():
    assert [row.number for row in chapters.CHAPTERS] == list(range(1, len(chapters.CHAPTERS) + 1))
    notebooks = sorted(p.stem for p in (ROOT / "book").glob("[0-9][0-9]_*.ipynb"))
    assert [row.notebook for row in chapters.CHAPTERS if row.notebook] == notebooks
    for row in chapters.CHAPTERS:
        assert set(row.modules) <= MODULES, row
        assert all((PACKAGE / "checks" / f"{topic}.py").exists() for topic in row.checks), row


def test_capstones_are_keyed_apart_from_the_chapters():
    """A capstone is ``capstoneK``, its notebooks ``capstoneK_*``: a new chapter (19, 20, ...) renames none of them,
    and every numbered exercise notebook is a chapter's."""
    keys = [row.key for row in chapters.CAPSTONES]
    assert keys == [f"capstone{k}" for k in range(1, len(keys) + 1)]
    for folder in ("exercises", "solutions"):
        capstones = sorted(p.stem for p in (ROOT / folder).glob("capstone*.ipynb"))
        assert capstones == [row.notebook for row in chapters.CAPSTONES], folder
        numbered = {int(p.name[:2]) for p in (ROOT / folder).glob("[0-9][0-9]_*.ipynb")}
        assert numbered <= {row.number for row in chapters.CHAPTERS}, folder
    for row in chapters.CAPSTONES:
        assert row.notebook.startswith(f"{row.key}_") and row.notebook.endswith("_exercises")
        assert set(row.chapters) <= {c.number for c in chapters.CHAPTERS}, row.key
        assert all((PACKAGE / "checks" / f"{topic}.py").exists() for topic in row.checks), row.key
    with pytest.raises(ValueError, match="no capstone 'capstone0'"):
        chapters.capstone("capstone0")


@pytest.mark.parametrize("row", [row for row in chapters.CHAPTERS if row.notebook], ids=lambda row: row.notebook)
def test_each_notebooks_library_line_names_modules_of_its_row(row):
    assert library_modules(ROOT / "book" / f"{row.notebook}.ipynb") <= set(row.modules)


def test_contributing_map_agrees_with_the_index():
    rows = map_rows()
    assert list(rows) == [row.number for row in chapters.CHAPTERS] + [row.key for row in chapters.CAPSTONES]
    for row in chapters.CAPSTONES:
        notebook, modules, topics = rows[row.key]
        assert notebook == f"`{row.notebook}`" and modules == set() and topics == set(row.checks), row.key
    for row in chapters.CHAPTERS:
        notebook, modules, topics = rows[row.number]
        assert row.notebook is None or notebook == f"`{row.notebook}`", row.number
        assert modules == set(row.modules), row.number
        assert topics == set(row.checks), row.number


def test_mistakes_belong_to_a_chapter_and_one_of_its_checks_topics():
    for mistake in mistakes.MISTAKES.values():
        if mistake.chapter is None:
            assert mistake.topic in chapters.SHARED_CHECKS, mistake.code
        else:
            assert mistake.topic in chapters.checks_of(mistake.chapter), mistake.code
    taught = {m.chapter for m in mistakes.MISTAKES.values()}
    units = {row.number for row in chapters.CHAPTERS if row.notebook} | {row.key for row in chapters.CAPSTONES}
    assert taught - {None} == units  # every chapter and capstone has its section


def test_the_checks_lazy_table_covers_the_topics_of_the_index():
    rows = chapters.CHAPTERS + chapters.CAPSTONES
    topics = {topic for row in rows for topic in row.checks} | set(chapters.SHARED_CHECKS)
    assert set(checks._LAZY.values()) == topics
    assert checks.__all__ == ["CODES", *checks._LAZY]


def test_the_command_line_prints_a_chapters_modules_checks_and_mistakes():
    result = subprocess.run([sys.executable, "-m", "attention_course.chapters", "15"], capture_output=True, text=True,
                            check=True)
    assert "attention_course.flex" in result.stdout and "attention_course.checks.flex" in result.stdout
    assert all(m.code in result.stdout for m in mistakes.in_chapter(15))
    assert chapters.main(["99"]) == 2 and chapters.main([]) == 2 and chapters.main(["capstone99"]) == 2
    assert chapters.main(["capstone1"]) == 0
    assert all(m.code in chapters.describe("capstone1") for m in mistakes.in_chapter("capstone1"))
    with pytest.raises(ValueError, match="no chapter 0"):
        chapters.chapter(0)
