#!/usr/bin/env python3
"""Print the single-page HTML build of the book to one PDF, with Chromium driven by Playwright (`make pdf`).

Usage, from the project root, after `jupyter-book build . --builder singlehtml` (what `make pdf` runs first):
    python tools/print_pdf.py                                   # _build/singlehtml/index.html -> _build/pdf/book.pdf
    python tools/print_pdf.py PAGE.html OUT.pdf

Why not `jupyter-book build --builder pdfhtml`: in jupyter-book 1.0.4 it writes its single page into _build/html,
over the book, and launches Playwright's own Chromium (`playwright install chromium`, a download from outside the
package registry). This uses the Chromium that the browser test already needs (`chromium` on PATH, see
tools/install_browser.sh), or Playwright's own where there is no other. The page is served from
127.0.0.1 and printed in light mode, with backgrounds, after MathJax has typeset it; MathJax is answered from
_build/mathjax (as in tests/test_browser.py) when that copy exists, else fetched from its CDN.
"""

from __future__ import annotations

import argparse
import functools
import http.server
import re
import shutil
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_PAGE = ROOT / "_build" / "singlehtml" / "index.html"
DEFAULT_PDF = ROOT / "_build" / "pdf" / "book.pdf"
MATHJAX = ROOT / "_build" / "mathjax" / "es5"
MATHJAX_REQUEST = re.compile(r"/mathjax@3[^/]*/es5/(?P<path>[^?#]+)")
MATHJAX_DONE = """() => window.MathJax && window.MathJax.startup && window.MathJax.startup.promise
  ? window.MathJax.startup.promise.then(() => null, error => String(error)) : null"""
TIMEOUT_MS = 120_000
REDIRECT = re.compile(r'<meta http-equiv="Refresh" content="0; url=(?P<url>[^"]+)"', re.I)
PRINTED_NAME = "book_for_print.html"


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def serve(folder: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    """A local server for ``folder`` (pages load their scripts and images as on the web, not from file://)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0),
                                             functools.partial(_QuietHandler, directory=str(folder)))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_port}/"


def answer_mathjax_locally(route) -> None:
    """MathJax requests from the local copy when there is one; every other request goes through."""
    found = MATHJAX_REQUEST.search(route.request.url)
    if found and (MATHJAX / found["path"]).is_file():
        return route.fulfill(path=str(MATHJAX / found["path"]))
    return route.continue_()


def single_page(index: Path) -> Path:
    """The page to print. jupyter-book's singlehtml index.html only redirects to the root document (book/intro.html),
    whose links (styles, scripts, images) are written relative to the build's root folder: a copy of it in that folder
    makes them resolve."""
    redirect = REDIRECT.search(index.read_text(encoding="utf-8"))
    if redirect is None:
        return index
    copy = index.parent / PRINTED_NAME
    copy.write_text((index.parent / redirect["url"]).read_text(encoding="utf-8"), encoding="utf-8")
    return copy


def print_pdf(page: Path, pdf: Path) -> None:
    from playwright.sync_api import sync_playwright

    page = single_page(page)
    server, base = serve(page.parent)
    pdf.parent.mkdir(parents=True, exist_ok=True)
    chromium = shutil.which("chromium")
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
            context = browser.new_context(color_scheme="light")
            context.route("**/*", answer_mathjax_locally)
            tab = context.new_page()
            tab.goto(base + page.name, wait_until="load", timeout=TIMEOUT_MS)
            failed = tab.evaluate(MATHJAX_DONE)
            if failed:
                raise RuntimeError(f"MathJax failed: {failed}")
            tab.emulate_media(media="print")
            tab.pdf(path=str(pdf), format="A4", print_background=True, outline=True,
                    margin={"top": "15mm", "bottom": "15mm", "left": "12mm", "right": "12mm"})
            browser.close()
    finally:
        server.shutdown()
        server.server_close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("page", nargs="?", type=Path, default=DEFAULT_PAGE, help="the single-page HTML build")
    parser.add_argument("pdf", nargs="?", type=Path, default=DEFAULT_PDF, help="where to write the PDF")
    args = parser.parse_args(argv)
    if not args.page.is_file():
        print(f"{args.page} not found: build it first (jupyter-book build . --builder singlehtml)", file=sys.stderr)
        return 1
    print_pdf(args.page, args.pdf)
    print(f"wrote {args.pdf}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
