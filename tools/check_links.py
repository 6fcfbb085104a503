#!/usr/bin/env python3
"""Find broken internal links in a built HTML book, offline (no network, no Sphinx).

Usage, from the project root:
    python tools/check_links.py                          # the book, _build/html
    python tools/check_links.py _build/student/_build/html

Every `href`/`src` of every page (`.html` outside `_static/`) is resolved as a browser would resolve it; a link
to a file that does not exist, or to an `#anchor` that the target page does not define (`id=`/`name=`), is reported.
External links (http:, https:, mailto:, data:, ...) are not followed. Exit status 1 when something is broken.
Used by tests/test_links.py and tests/test_student_edition.py.
"""
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

LINK_ATTRIBUTES = {"a": "href", "link": "href", "img": "src", "script": "src", "source": "src", "iframe": "src"}


class _PageParser(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.anchors = set()
        self.links = []  # (line, tag, url)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        for key in ("id", "name"):
            if attrs.get(key):
                self.anchors.add(attrs[key])
        url = attrs.get(LINK_ATTRIBUTES.get(tag, ""))
        if url is not None:
            self.links.append((self.getpos()[0], tag, url))

    handle_startendtag = handle_starttag


def parse_pages(html_dir):
    """{path relative to html_dir: parser} for every page (.html outside _static/, which holds theme templates)."""
    pages = {}
    for path in sorted(Path(html_dir).rglob("*.html")):
        if path.relative_to(html_dir).parts[0] == "_static":
            continue
        parser = _PageParser()
        parser.feed(path.read_text(encoding="utf-8", errors="replace"))
        pages[path.relative_to(html_dir).as_posix()] = parser
    return pages


def _is_external(url):
    parts = urlsplit(url)
    return bool(parts.scheme or parts.netloc)


def broken_links(html_dir):
    """Human-readable descriptions of every broken internal link under html_dir (empty list: all good)."""
    html_dir = Path(html_dir)
    pages = parse_pages(html_dir)
    problems = []
    for page, parser in pages.items():
        for line, tag, url in parser.links:
            url = url.strip()
            if not url or _is_external(url):
                continue
            parts = urlsplit(url)
            where = f"{page}:{line}: <{tag}> {url!r}"
            if parts.path:
                target = (html_dir / page).parent / unquote(parts.path)
                if parts.path.endswith("/"):
                    target = target / "index.html"
                try:
                    relative = target.resolve().relative_to(html_dir.resolve()).as_posix()
                except ValueError:
                    problems.append(f"{where}: points outside the book")
                    continue
                if not target.is_file():
                    problems.append(f"{where}: no such file")
                    continue
            else:
                relative = page
            fragment = unquote(parts.fragment)
            if fragment and relative in pages and fragment not in pages[relative].anchors:
                problems.append(f"{where}: no id {fragment!r} in {relative}")
    return problems


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    html_dir = Path(argv[0] if argv else "_build/html")
    if not (html_dir / "index.html").is_file():
        print(f"{html_dir}/index.html not found: build the book first (`make book`)", file=sys.stderr)
        return 2
    problems = broken_links(html_dir)
    for problem in problems:
        print(problem)
    print(f"{len(problems)} broken internal link(s) in {html_dir}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
