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


def map_rows() -> dict[int, tuple[str, set[str], set[str]]]:
    rows = {}
    for line in (ROOT / "CONTRIBUTING.md").read_text().splitlines():
        cells = re.match(r"\| (\d+) \| (.*?) \| (.*) \| (.*) \|$", line)
        if cells:
            modules = {name.split(".")[0] for name in top_level_ticks(cells.group(3))} & MODULES
            rows[int(cells.group(1))] = (cells.group(2), modules, set(top_level_ticks(cells.group(4))))
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


@pytest.mark.parametrize("row", chapters.CHAPTERS[:-1], ids=lambda row: row.notebook)
def test_each_notebooks_library_line_names_modules_of_its_row(row):
    assert library_modules(ROOT / "book" / f"{row.notebook}.ipynb") <= set(row.modules)


def test_contributing_map_agrees_with_the_index():
    rows = map_rows()
    assert sorted(rows) == [row.number for row in chapters.CHAPTERS]
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
            assert mistake.topic in chapters.chapter(mistake.chapter).checks, mistake.code
    taught = {m.chapter for m in mistakes.MISTAKES.values()}
    assert taught - {None} == {row.number for row in chapters.CHAPTERS}  # every chapter has its section


def test_the_checks_lazy_table_covers_the_topics_of_the_index():
    topics = {topic for row in chapters.CHAPTERS for topic in row.checks} | set(chapters.SHARED_CHECKS)
    assert set(checks._LAZY.values()) == topics
    assert checks.__all__ == ["CODES", *checks._LAZY]


def test_the_command_line_prints_a_chapters_modules_checks_and_mistakes():
    result = subprocess.run([sys.executable, "-m", "attention_course.chapters", "15"], capture_output=True, text=True,
                            check=True)
    assert "attention_course.flex" in result.stdout and "attention_course.checks.flex" in result.stdout
    assert all(m.code in result.stdout for m in mistakes.in_chapter(15))
    assert chapters.main(["21"]) == 2 and chapters.main([]) == 2
    with pytest.raises(ValueError, match="no chapter 0"):
        chapters.chapter(0)
