"""The student edition of the book: the same chapters and exercises, and no solutions anywhere in its HTML: no
solution page, no solution path, no instructor guide, no launch button that opens the whole repository.

`_toc_student.yml` and `_config_student.yml` are generated from `_toc.yml` and `_config.yml` by tools/student_toc.py
(entries under solutions/ and the instructor's pages dropped; Binder and Thebe off unless a student branch is named);
`make student-book` regenerates them and builds the edition into _build/student/_build/html
(`only_build_toc_files: true`: what the toc does not list is not built) with the same execution cache.
The tests of the built edition skip, saying so, until `make student-book` has run (`make test` runs it first).
"""

import json
import re
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
STUDENT_HTML = ROOT / "_build" / "student" / "_build" / "html"
BOOK_HTML = ROOT / "_build" / "html"
BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"  # the markers of attention_course.exercises (nbgrader's)
SOLUTION_ONLY = "solution-only"

sys.path.insert(0, str(ROOT / "tools"))
import student_toc  # noqa: E402
from check_links import broken_links, parse_pages  # noqa: E402


def _source(cell):
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def _normalise(text):
    return " ".join(text.split())


REGION = re.compile(rf"^[ \t]*{re.escape(BEGIN)}[ \t]*\n(.*?)^[ \t]*{re.escape(END)}[^\n]*\n?", re.M | re.S)


def solution_code(path):
    """The secret code of a solution notebook: every solution region (between the markers) and every
    `solution-only` cell, normalised, less what the students are given anyway -- a region that repeats code shown
    outside the regions (say, the `__init__` of a buggy class to fix) gives nothing away."""
    secret, given = [], []
    for cell in json.loads(Path(path).read_text(encoding="utf-8"))["cells"]:
        source = _source(cell)
        if cell["cell_type"] != "code":
            given.append(source)
        elif SOLUTION_ONLY in cell.get("metadata", {}).get("tags", []):
            secret.append(source)
        else:
            secret += REGION.findall(source)
            given.append(REGION.sub("", source))
    public = _normalise("\n".join(given))
    return [code for code in map(_normalise, secret) if code and code not in public]


class _Text(HTMLParser):
    """The text of an HTML page as a reader (or a search engine) sees it; no scripts or styles."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.parts, self._skip = [], 0

    def handle_starttag(self, tag, attrs):
        self._skip += tag in ("script", "style")

    def handle_endtag(self, tag):
        self._skip -= tag in ("script", "style") and self._skip > 0

    def handle_data(self, data):
        if not self._skip:
            self.parts.append(data)


def page_text(path):
    parser = _Text()
    parser.feed(Path(path).read_text(encoding="utf-8", errors="replace"))
    return _normalise("".join(parser.parts))


def solution_notebooks():
    return sorted((ROOT / "solutions").glob("*.ipynb"))


def exercise_docname(solution):
    return f"exercises/{solution.stem}"


# --- the student toc (no build needed) ---------------------------------------------------------------------------


def test_student_toc_is_generated_from_the_book_toc():
    expected = student_toc.render(student_toc.student_toc(student_toc.load(ROOT / "_toc.yml")))
    current = (ROOT / "_toc_student.yml").read_text(encoding="utf-8")
    assert current == expected, "_toc_student.yml is out of date: run `python tools/student_toc.py` (make student-book)"


def test_student_toc_lists_every_page_of_the_book_but_the_solutions_and_the_instructor_guide():
    book = student_toc.toc_docnames(ROOT / "_toc.yml")
    student = student_toc.toc_docnames(ROOT / "_toc_student.yml")
    assert "book/instructor_guide" in book and "book/instructor_guide" in student_toc.INSTRUCTOR_PAGES
    assert student == [d for d in book if not d.startswith("solutions/") and d not in student_toc.INSTRUCTOR_PAGES]
    for docname in student:
        assert any((ROOT / (docname + suffix)).is_file() for suffix in (".ipynb", ".md")), f"{docname} does not exist"


def test_student_toc_drops_solution_entries_and_emptied_parts():
    toc = yaml.safe_load("""
format: jb-book
root: book/intro
parts:
  - caption: Chapters
    chapters:
      - file: book/01_soft_lookup
        sections:
          - file: solutions/01_soft_lookup_exercises
      - file: book/02_single_head.ipynb
  - caption: Exercises
    chapters:
      - file: exercises/01_soft_lookup_exercises
  - caption: Teaching
    chapters:
      - file: book/instructor_guide.md
  - caption: Solutions
    chapters:
      - file: solutions/01_soft_lookup_exercises
      - glob: ./solutions/*
""")
    student = student_toc.student_toc(toc)
    assert student == {
        "format": "jb-book", "root": "book/intro",
        "parts": [
            {"caption": "Chapters",
             "chapters": [{"file": "book/01_soft_lookup"}, {"file": "book/02_single_head.ipynb"}]},
            {"caption": "Exercises", "chapters": [{"file": "exercises/01_soft_lookup_exercises"}]},
        ],
    }
    assert student_toc.toc_docnames(student) == [
        "book/intro", "book/01_soft_lookup", "book/02_single_head", "exercises/01_soft_lookup_exercises"]
    assert "solutions" not in student_toc.render(student).split("\n", 2)[2]  # the header mentions it, the toc not


def test_solution_code_extracts_regions_and_solution_only_cells(tmp_path):
    notebook = {"cells": [
        {"cell_type": "code", "metadata": {}, "source": ["def f(x):\n", f"    {BEGIN}\n", "    y = x +  1\n",
                                                         "    return y\n", f"    {END}\n"]},
        {"cell_type": "code", "metadata": {"tags": [SOLUTION_ONLY]}, "source": "print('answer: 42')"},
        {"cell_type": "code", "metadata": {"tags": ["check"]}, "source": "check(f)"},
        {"cell_type": "markdown", "metadata": {}, "source": f"{BEGIN} in prose is not code"},
        # a region that only repeats code the students are given is not secret
        {"cell_type": "code", "metadata": {}, "source": "class Buggy:\n    def __init__(self):\n        self.w = 1\n"},
        {"cell_type": "code", "metadata": {}, "source": f"class Fixed:\n    def __init__(self):\n        {BEGIN}\n"
                                                         f"        self.w = 1\n        {END}\n"},
    ]}
    path = tmp_path / "nb.ipynb"
    path.write_text(json.dumps(notebook))
    assert solution_code(path) == ["y = x + 1 return y", "print('answer: 42')"]


def test_student_config_is_generated_from_the_book_config():
    expected = student_toc.render_config(student_toc.student_config(student_toc.load(ROOT / "_config.yml")))
    current = (ROOT / "_config_student.yml").read_text(encoding="utf-8")
    assert current == expected, "_config_student.yml is out of date: run `python tools/student_toc.py`"
    assert student_toc.main(["--check"]) == 0


def test_student_launch_buttons_open_the_notebook_alone_or_a_student_branch():
    config = student_toc.load(ROOT / "_config.yml")
    assert config["launch_buttons"]["binderhub_url"] and config["launch_buttons"]["thebe"]  # the full edition's
    student = student_toc.student_config(config)
    assert student["launch_buttons"]["binderhub_url"] == "" and student["launch_buttons"]["thebe"] is False
    assert student["launch_buttons"]["colab_url"] == config["launch_buttons"]["colab_url"]  # opens one notebook
    assert student["repository"] == config["repository"]
    on_branch = student_toc.student_config(config, branch="student")
    assert on_branch["launch_buttons"] == config["launch_buttons"]
    assert on_branch["repository"]["branch"] == "student"
    assert {k: v for k, v in student.items() if k != "launch_buttons"} == {
        k: v for k, v in config.items() if k != "launch_buttons"}
    assert config["launch_buttons"]["thebe"] is True, "student_config must not change the book's own config"


# --- the built student edition -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def student_html():
    if not (STUDENT_HTML / "index.html").is_file():
        pytest.skip(f"the student edition is not built ({STUDENT_HTML.relative_to(ROOT)}): "
                    "run `make student-book` first")
    return STUDENT_HTML


def test_every_student_page_is_built(student_html):
    for docname in student_toc.toc_docnames(ROOT / "_toc_student.yml"):
        assert (student_html / f"{docname}.html").is_file(), f"{docname}.html missing from the student edition"


def test_no_solution_files_and_no_links_to_solutions(student_html):
    files = [p.relative_to(student_html).as_posix() for p in student_html.rglob("*")]
    assert not [f for f in files if "solutions" in f.split("/")], "solution files in the student edition"
    links = [(page, url) for page, parser in parse_pages(student_html).items() for _, _, url in parser.links
             if re.search(r"(^|/)solutions/", url)]
    assert not links, f"links to solutions/ in the student edition: {links}"
    index = (student_html / "searchindex.js").read_text(encoding="utf-8")
    assert "solutions/" not in index, "the search index knows solution pages"


def test_no_solution_markers_anywhere(student_html):
    marked = [path.relative_to(student_html).as_posix() for path in student_html.rglob("*")
              if path.is_file() and path.suffix in (".html", ".js", ".ipynb", ".md", ".txt", ".json")
              and re.search(r"(BEGIN|END) SOLUTION", path.read_text(encoding="utf-8", errors="replace"))]
    assert not marked, f"solution markers in the student edition: {marked}"


def test_no_solution_code_in_the_exercise_pages(student_html):
    solutions = solution_notebooks()
    if not solutions:
        pytest.skip("no solutions/*.ipynb yet: nothing to leak")
    problems, checked = [], 0
    for solution in solutions:
        docname = exercise_docname(solution)
        # the page and the notebook the page's download button serves
        for shown in (student_html / f"{docname}.html", student_html / "_sources" / f"{docname}.ipynb"):
            if not shown.is_file():
                continue
            text = page_text(shown) if shown.suffix == ".html" else _normalise(
                "\n".join(_source(c) for c in json.loads(shown.read_text(encoding="utf-8"))["cells"]))
            checked += 1
            problems += [f"{shown.relative_to(student_html)}: {code[:100]!r}" for code in solution_code(solution)
                         if code in text]
    assert checked, "no exercise page of the student edition corresponds to a solution notebook"
    assert not problems, "solution code in the student edition:\n" + "\n".join(problems)


def test_the_solution_detector_sees_solutions_in_the_full_book():
    """Guards the test above against passing vacuously: the same search finds the code in the book's solution pages."""
    pages = [(s, BOOK_HTML / "solutions" / f"{s.stem}.html") for s in solution_notebooks()]
    pages = [(s, page) for s, page in pages if page.is_file() and solution_code(s)]
    if not pages:
        pytest.skip("no built solution page with solution code in _build/html (`make book` with solutions in _toc.yml)")
    for solution, page in pages:
        text = page_text(page)
        assert all(code in text for code in solution_code(solution)), f"solution code not found in {page}"


SOLUTION_PATH = re.compile(r"solutions/\w+")


def test_no_solution_path_and_no_instructor_page(student_html):
    """Not even as text: a student edition that says where the solutions are is not a student edition."""
    problems = [f"{docname}.html: {match!r}" for docname in student_toc.toc_docnames(ROOT / "_toc_student.yml")
                for match in SOLUTION_PATH.findall(page_text(student_html / f"{docname}.html"))]
    assert not problems, "solution paths in the student edition:\n" + "\n".join(problems)
    for docname in student_toc.INSTRUCTOR_PAGES:
        assert not (student_html / f"{docname}.html").exists(), f"{docname} is in the student edition"


def test_no_launch_button_opens_the_whole_repository(student_html):
    config = student_toc.load(ROOT / "_config_student.yml")
    pages = parse_pages(student_html)
    links = [(page, url) for page, parser in pages.items() for _, _, url in parser.links]
    if not config["launch_buttons"]["binderhub_url"]:
        assert not [link for link in links if "mybinder.org" in link[1]], "Binder buttons in the student edition"
        thebe = [page for page in pages if "initThebeSBT()" in (student_html / page).read_text(encoding="utf-8")]
        assert not thebe, f"live-code (Thebe) buttons in the student edition: {thebe}"
    assert [link for link in links if "colab.research.google.com" in link[1]], "no Colab button: expected one"


def test_no_broken_internal_links_in_the_student_edition(student_html):
    problems = broken_links(student_html)
    assert not problems, f"{len(problems)} broken internal link(s):\n" + "\n".join(problems)
