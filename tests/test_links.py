"""No broken internal link in the built book (_build/html): every href/src that stays inside the book points to an
existing file and, with a #fragment, to an id that page defines. External links are not followed (no network).
The checker is tools/check_links.py (also a command: `python tools/check_links.py [HTML_DIR]`)."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HTML = ROOT / "_build" / "html"

sys.path.insert(0, str(ROOT / "tools"))
from check_links import broken_links  # noqa: E402


def test_checker_finds_missing_files_and_anchors(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "index.html").write_text(
        '<a href="sub/page.html#there">ok</a> <a href="sub/page.html#nowhere">bad anchor</a>'
        '<a href="missing.html">bad file</a> <img src="sub/missing.png"> <a href="#top">ok</a> <p id="top"></p>'
        '<a href="https://example.com/x.html">external</a> <a href="mailto:a@b.c">mail</a> <a href="#">empty</a>'
    )
    (tmp_path / "sub" / "page.html").write_text('<h1 id="there">x</h1><a href="../index.html#top">ok</a>'
                                                '<a href="../../outside.html">out</a>')
    problems = broken_links(tmp_path)
    assert len(problems) == 4, problems
    assert any("'sub/page.html#nowhere'" in p and "no id 'nowhere'" in p for p in problems)
    assert any("'missing.html'" in p and "no such file" in p for p in problems)
    assert any("'sub/missing.png'" in p for p in problems)
    assert any("outside the book" in p for p in problems)


def test_no_broken_internal_links_in_the_book():
    if not (HTML / "index.html").is_file():
        pytest.skip(f"{HTML.relative_to(ROOT)}/index.html not found: run `make book` first")
    problems = broken_links(HTML)
    assert not problems, f"{len(problems)} broken internal link(s):\n" + "\n".join(problems)
