"""Review notebooks as PDF (``grade class ... --review-pdf``): each review
notebook a class run writes (:func:`.exports.review_notebook`) converted to
HTML by nbconvert and printed to ``NOTEBOOK.pdf`` next to it by
Chromium: Debian's ``chromium`` on PATH, driven by Playwright, as the course's
    browser test and ``make pdf`` use it.

Offline and inert: the page is the student's notebook (its markdown may hold
HTML and scripts), so it is printed with JavaScript off and every request it
makes refused (no network, no file); its images are the grading run's PNG
outputs, inline. Math is shown as its TeX source (MathJax would need
JavaScript).
"""

from __future__ import annotations

import shutil
from pathlib import Path

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]
PAGE_TIMEOUT_MS = 60_000


def converter_problem() -> str | None:
    """Why review PDFs cannot be printed here (no Chromium, no Playwright), or
    None."""
    if shutil.which("chromium") is None:
        return (
            "no chromium on PATH to print them with (Debian: apt-get "
            "install chromium)"
        )
    try:
        import playwright.sync_api  # noqa: F401 - only whether it is installed
    except ImportError:
        return (
            "playwright is not installed (pip install playwright; it "
            "drives the system's chromium)"
        )
    return None


def _refuse(route) -> None:
    route.abort()


def write_pdfs(notebooks: list[Path]) -> list[str]:
    """Print each review notebook to a PDF of the same name; the problems, one
    line per notebook that failed."""
    from nbconvert import HTMLExporter
    from playwright.sync_api import sync_playwright

    exporter, problems = HTMLExporter(), []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=shutil.which("chromium"), args=CHROMIUM_ARGS
        )
        try:
            context = browser.new_context(
                java_script_enabled=False, offline=True, color_scheme="light"
            )
            # scripts, styles, images, frames from anywhere: the page is the
            # student's
            context.route("**/*", _refuse)
            for path in notebooks:
                try:
                    html, _ = exporter.from_filename(str(path))
                    tab = context.new_page()
                    tab.set_content(
                        html, wait_until="load", timeout=PAGE_TIMEOUT_MS
                    )
                    tab.pdf(
                        path=str(path.with_suffix(".pdf")),
                        format="A4",
                        print_background=True,
                        margin={
                            "top": "12mm",
                            "bottom": "12mm",
                            "left": "10mm",
                            "right": "10mm",
                        },
                    )
                    tab.close()
                # one notebook's PDF, reported; the others go on
                except Exception as err:  # noqa: BLE001
                    problems.append(
                        f"{path}: {type(err).__name__}: "
                        f"{str(err).splitlines()[0][:300]}"
                    )
        finally:
            browser.close()
    return problems
