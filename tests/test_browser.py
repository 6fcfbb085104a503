"""The built book (_build/html) in a real browser: Debian's Chromium, headless, driven by Playwright.

Every page of _toc.yml is opened once at 1280 px (one module-scoped visit; the tests below check what it recorded):
no console errors or uncaught exceptions, math typeset by MathJax with no raw `$...$` left, every image loaded,
no error traceback outside cells tagged `raises-exception`, the sidebar and the "next" buttons reach every page,
and the search page finds "softmax". Screenshots of the intro and of every chapter go to _build/screenshots/.

Pages read as a reader reads them (book/_static/course.css; each page is loaded once, at 1280 px, and the same visit
measures its layout there, then resized to a 390 px phone's width and, for a chapter, switched to dark mode), with
these rules:
- on a 390 px phone no page is wider than the screen;
- at 1280 px no display equation is wider than its column (long ones are split into aligned lines); at 390 px one
  may scroll inside its own box, up to 1.5 columns wide, but none is cut off;
- at 1280 px no line of a code cell is longer than the code column holds (measured in characters of its font; the
  notebook lint keeps code within 79) and no code block needs a scroll bar, and no printed table or verdict line is
  longer than the output column holds (messages that read as sentences may wrap);
- listings of library code (show_source; the library keeps to 79 columns, src/ruff.toml, `make format`) never wrap,
  and at 1280 px none needs a scroll bar (on a phone one scrolls in its own box);
- every cell shows each of its output streams in one box (`nb_merge_streams`), however the kernel chunked it;
- exercise pages show a failing check's message, not its traceback; solution pages show no BEGIN/END SOLUTION
  markers; the install cell's toggle says what it hides;
- in dark mode the plots sit on a light panel, and every page shows the licence in its footer;
- at 1280 px the smallest text of every figure is at least 12 px tall as shown (attention_course.plotting's rule).

Offline by design: the pages are served from 127.0.0.1 by a thread of this process; MathJax 3, which the pages load
from its CDN (as published), is served from the pinned copy that `make browser` (tools/install_browser.sh) fetches
into _build/mathjax: the server points the pages' CDN address at it. Chromium resolves no host but 127.0.0.1, so
every other request that would leave the machine fails, and is reported. Skipped, with the reason, when the book is
not built or no Chromium is installed.
"""

from __future__ import annotations

import functools
import http.server
import re
import shutil
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urldefrag

import pytest

ROOT = Path(__file__).resolve().parent.parent
HTML = ROOT / "_build" / "html"
MATHJAX = ROOT / "_build" / "mathjax" / "es5"
SCREENSHOTS = ROOT / "_build" / "screenshots"
# No host resolves but 127.0.0.1 (the site): a request that would leave the machine fails at once. Not Playwright's
# request routing: with a route, Playwright turns Chromium's HTTP cache off and every request waits on this process,
# so each page downloaded and compiled its 1.5 MB of Font Awesome and 1.2 MB of MathJax again (2026-11-28, 2 shared
# cores: the crawl took 105 s of CPU (Chromium's processes included) and 83-88 s with the route, 69-72 s of CPU and
# 58-65 s without it; the page loads alone 57 -> 33 s).
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
]
DESKTOP, PHONE = 1280, 390  # CSS pixels: a laptop, and a phone held upright
HEIGHT = 900
ANIMATION_SPEED = 1000  # the pages' transitions, sped up (the layout measured once they end is the same)
NAVIGATION_TIMEOUT_MS = 120_000  # a loaded CI machine (or a shared one) can take more than Playwright's 30 s
PHONE_EQUATION_SWIPES = 1.5  # at 390 px a display equation may scroll in its box, up to 1.5 columns wide
MATHJAX_REQUEST = re.compile(r"/mathjax@3[^/]*/es5/(?P<path>[^?#]+)")
MATHJAX_CDN = re.compile(rb"https://cdn\.jsdelivr\.net/npm/(?=mathjax@3[^/]*/es5/)")  # as the pages load it
MATHJAX_HERE = b"/_cdn/"  # where this test's server answers for it
RAW_MATH = re.compile(r"\$\$.+?\$\$|\$[^\s$][^$\n]*?\$|\\\(.+?\\\)|\\\[.+?\\\]", re.S)

sys.path.insert(0, str(ROOT / "tools"))
from student_toc import toc_docnames  # noqa: E402

DOCNAMES = toc_docnames(ROOT / "_toc.yml")

# Waits for MathJax's first typesetting of the page (if MathJax is there); returns its error, if any.
# Every wait in the page is bounded (WAIT_MS): page.evaluate has no timeout of its own, and on 2026-11-28 a crawl on a
# machine at load 10-23 twice stopped for over 10 minutes in chapter 10 with the renderer idle, waiting on a promise
# that never settled. A bounded wait turns that into a reported error (MathJax) or a measurement as the page stands.
WAIT_MS = 60_000
MATHJAX_DONE = f"""() => window.MathJax && window.MathJax.startup && window.MathJax.startup.promise
  ? Promise.race([window.MathJax.startup.promise.then(() => null, error => String(error)),
                  new Promise(resolve => setTimeout(resolve, {WAIT_MS}, "not typeset after {WAIT_MS} ms"))])
  : null"""

# Run in the page after MathJax has finished: everything the tests need, in one round trip.
INSPECT_PAGE = """() => {
  const main = document.querySelector("main") || document.body;
  const prose = main.cloneNode(true);
  prose.querySelectorAll("pre, code, script, style, textarea, mjx-container, .highlight").forEach(e => e.remove());
  const mathNodes = Array.from(main.querySelectorAll("span.math, div.math"));
  const link = sel => { const a = document.querySelector(sel); return a ? a.href : null; };
  return {
    mathjaxLoaded: !!(window.MathJax && window.MathJax.startup && window.MathJax.version),
    mathjaxVersion: window.MathJax && window.MathJax.version || null,
    math: mathNodes.length,
    untypeset: mathNodes.filter(e => !e.querySelector("mjx-container")).map(e => e.textContent.slice(0, 80)),
    mathErrors: Array.from(main.querySelectorAll("mjx-merror")).map(e => e.textContent.slice(0, 80)),
    prose: prose.textContent,
    brokenImages: Array.from(document.images).filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.src),
    figures: Array.from(main.querySelectorAll("img")).filter(i => i.offsetParent !== null).map(i => {
      const style = getComputedStyle(i);
      const shown = i.getBoundingClientRect().width - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight)
        - parseFloat(style.borderLeftWidth) - parseFloat(style.borderRightWidth);
      return {src: i.src, shown, natural: i.naturalWidth}; }),
    images: document.images.length,
    tracebacks: Array.from(document.querySelectorAll(".cell:not(.tag_raises-exception) .output.traceback"))
      .map(e => e.textContent.slice(0, 300)),
    expectedErrors: Array.from(document.querySelectorAll(".cell.tag_raises-exception .output.traceback"))
      .map(e => e.textContent.trim()),
    solutionMarkers: Array.from(main.querySelectorAll("div.cell_input pre"))
      .filter(e => /### (BEGIN|END) SOLUTION/.test(e.textContent)).length,
    toggles: Array.from(main.querySelectorAll("details.hide summary")).map(e => e.textContent.trim()),
    sidebar: Array.from(document.querySelectorAll(".bd-sidebar-primary a.reference.internal")).map(a => a.href),
    next: link("a.right-next"),
    prev: link("a.left-prev"),
  };
}"""


# Run in the page after MathJax: what does not fit. Elements inside a box that scrolls on its own (a wide table or
# equation) do not widen the page and are not counted. Also measured, for the reader's checks below:
#   equations: every display equation's rendered width against the width of its box (and whether that box scrolls);
#   codeLines: every line of a visible code cell's source longer than its column holds, in characters of the
#     column's monospace font (a line the browser must wrap to the left margin);
#   streams: per cell, how many output boxes each stream (stdout, stderr) is shown in.
INSPECT_LAYOUT = """() => {
  const width = document.documentElement.clientWidth;
  const scrollsItself = e => { for (let p = e.parentElement; p && p !== document.body; p = p.parentElement) {
      const x = getComputedStyle(p).overflowX; if (x === "auto" || x === "scroll" || x === "hidden") return true; }
    return false; };
  const name = e => e.tagName.toLowerCase() + (e.className && typeof e.className === "string"
    ? "." + e.className.trim().split(/\\s+/).slice(0, 2).join(".") : "");
  const wide = Array.from(document.querySelectorAll("main *"))
    .filter(e => e.getBoundingClientRect().right > width + 1 && !scrollsItself(e)).slice(0, 5)
    .map(e => `${name(e)} (right edge ${Math.round(e.getBoundingClientRect().right)} px): `
      + e.textContent.trim().slice(0, 60));
  // A listing of library source (show_source: a Markdown code block in a cell's output): measured below.
  const isListing = pre => !!pre.closest("div.cell_output > div[class*='highlight-']:not(.output)");
  const clipped = Array.from(document.querySelectorAll("main pre"))
    .filter(pre => !isListing(pre) && pre.scrollWidth > pre.clientWidth + 1)
    .map(pre => `${pre.scrollWidth} px of text in ${pre.clientWidth} px: ` + pre.textContent.trim().slice(0, 60));
  const tex = e => { try { const items = MathJax.startup.document.getMathItemsWithin(e);
      return items.length ? items[0].math : e.textContent; } catch (error) { return e.textContent; } };
  const equations = Array.from(document.querySelectorAll("main mjx-container[display='true']")).map(e => {
    const box = e.closest("div.math") || e;
    const math = e.querySelector("mjx-math");
    const overflow = getComputedStyle(e).overflowX;
    return {tex: tex(box).trim().replace(/\\s+/g, " ").slice(0, 90),
            width: Math.ceil(math.getBoundingClientRect().width), box: e.clientWidth,
            scrolls: overflow === "auto" || overflow === "scroll"}; });
  const canvas = document.createElement("canvas").getContext("2d");
  const columnChars = pre => { const style = getComputedStyle(pre); canvas.font = style.font;
    const inner = pre.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
    return Math.floor(inner / canvas.measureText("0123456789").width * 10); };
  // Each listing: how it lays out its lines, whether it needs a scroll bar, its longest line against what its
  // column holds (characters of its font), and its first line (which names the function or class shown).
  const listings = Array.from(document.querySelectorAll("main div.cell_output pre")).filter(isListing)
    .map(pre => { const style = getComputedStyle(pre);
      const lines = pre.textContent.split("\\n").map(line => line.trimEnd());
      return {whiteSpace: style.whiteSpace, overflow: style.overflowX, wide: pre.scrollWidth > pre.clientWidth + 1,
              scrollWidth: pre.scrollWidth, clientWidth: pre.clientWidth, holds: columnChars(pre),
              longest: Math.max(...lines.map(line => line.length)),
              text: (lines.find(line => line.trim()) || "").trim().slice(0, 70)}; });
  const codeLines = [];
  document.querySelectorAll("main div.cell_input pre").forEach(pre => {
    if (pre.offsetParent === null || pre.closest("details:not([open])")) return;  // behind a toggle: the install cell
    const holds = columnChars(pre);
    pre.textContent.split("\\n").forEach(line => { if (line.trimEnd().length > holds)
      codeLines.push({holds, length: line.trimEnd().length, line: line.trim().slice(0, 70)}); }); });
  // Printed output (stdout, and the text of a cell's value): every line longer than the output column holds.
  const outputLines = [];
  document.querySelectorAll("main div.cell_output div.output.stream pre, "
                             + "main div.cell_output div.output.text_plain pre").forEach(pre => {
    if (pre.offsetParent === null || pre.closest(".traceback")) return;
    const holds = columnChars(pre);
    pre.textContent.split("\\n").forEach(line => { if (line.trimEnd().length > holds)
      outputLines.push({holds, length: line.trimEnd().length, line: line.trimEnd()}); }); });
  const streams = Array.from(document.querySelectorAll("main div.cell_output")).map(out => {
    const counts = {};
    for (const box of out.children) {
      const kind = box.classList.contains("stderr") ? "stderr" : box.classList.contains("stream") ? "stdout" : null;
      if (kind) counts[kind] = (counts[kind] || 0) + 1; }
    const input = out.parentElement.querySelector("div.cell_input pre");
    return {counts, cell: input ? input.textContent.trim().slice(0, 60) : ""}; })
    .filter(s => Object.values(s.counts).some(n => n > 1));
  const panel = Array.from(document.querySelectorAll("main div.cell_output img")).map(img => {
    const style = getComputedStyle(img);
    return {background: style.backgroundColor, padding: parseFloat(style.paddingLeft)}; });
  const licence = Array.from(document.querySelectorAll("footer a"))
    .filter(a => a.href.startsWith("https://creativecommons.org/licenses/by/4.0") && a.offsetParent !== null);
  return {pageWidth: document.documentElement.scrollWidth, width, wide, clipped, panel, equations, codeLines,
          streams, outputLines, listings,
          theme: document.documentElement.dataset.theme, licence: licence.length};
}"""


# Run once a page has loaded: waits for MathJax, then INSPECT_PAGE and INSPECT_LAYOUT, in one round trip.
MEASURE_LOADED = f"""async () => {{
  const failed = await ({MATHJAX_DONE})();
  return {{failed, info: ({INSPECT_PAGE})(), layout: ({INSPECT_LAYOUT})()}};
}}"""
# Run after the window was resized: waits until the transitions it started (the theme's sliding sidebars) have ended,
# so the layout is the one the page has when loaded at that width, then INSPECT_LAYOUT.
SETTLED = f"""async () => {{
  await Promise.race([Promise.all(document.getAnimations()
    .filter(a => a.effect && a.effect.getComputedTiming().endTime !== Infinity).map(a => a.finished.catch(() => null))),
    new Promise(resolve => setTimeout(resolve, {WAIT_MS}))]);
}}"""
MEASURE_RESIZED = f"""async () => {{
  await ({SETTLED})();
  return ({INSPECT_LAYOUT})();
}}"""
# Run after the system's colour scheme turned dark: the theme's own listener (its "auto" mode, the default) sets the
# page's theme in place, as a reader's system switching to dark does; waits for that, and for the transitions the
# new colours and the resize back to a laptop's width started, then INSPECT_LAYOUT.
MEASURE_DARK = f"""async () => {{
  const until = performance.now() + 10000;  // else measured as it is (a test checks the theme)
  while (document.documentElement.dataset.theme !== "dark" && performance.now() < until)
    await new Promise(resolve => requestAnimationFrame(resolve));
  getComputedStyle(document.body).color;  // the new style computed: its transitions have started
  await ({SETTLED})();
  return ({INSPECT_LAYOUT})();
}}"""


@dataclass
class Visit:
    docname: str
    url: str
    status: int | None = None
    errors: list[str] = field(default_factory=list)  # console errors, uncaught exceptions, failed local requests
    info: dict = field(default_factory=dict)  # INSPECT_PAGE's record
    layout: dict = field(default_factory=dict)  # INSPECT_LAYOUT's record (at 1280 px, light)
    phone: dict = field(default_factory=dict)  # INSPECT_LAYOUT's record on a 390 px phone (light)
    dark: dict = field(default_factory=dict)  # INSPECT_LAYOUT's record at 1280 px in dark mode (chapters only)


@dataclass
class Crawl:
    base: str
    visits: dict[str, Visit]
    external: list[str]
    mathjax_requests: list[str]
    search_results: list[str]
    search_errors: list[str]
    screenshots: list[Path]


class _SiteHandler(http.server.SimpleHTTPRequestHandler):
    """The built book, as published, but for MathJax's address: its CDN's becomes this server's (MATHJAX_HERE),
    answered from the local copy (each request noted in `mathjax_requests`). Everything may be cached: nothing
    changes while the test runs."""

    mathjax_requests: list[str]

    def do_GET(self):
        found = MATHJAX_REQUEST.search(self.path)
        if self.path.startswith(MATHJAX_HERE.decode()) and found:
            self.mathjax_requests.append(self.path)
            if not MATHJAX.is_dir():  # no local copy: no math, but no error either (test_math_is_typeset skips)
                return self._send(200, "text/javascript", b"")
            path = MATHJAX / found["path"]
            if not path.is_file():
                return self._send(404, "text/plain", f"{found['path']} is not in MathJax's es5 folder".encode())
            return self._send(200, self.guess_type(str(path)), path.read_bytes())
        if self.path == "/favicon.ico":  # Chromium's own request, where a page names no icon (the book names none)
            return self._send(204, "image/x-icon", b"")
        if urldefrag(self.path).url.split("?")[0].endswith(".html"):
            path = Path(self.translate_path(self.path))
            if path.is_file():
                return self._send(200, "text/html", MATHJAX_CDN.sub(MATHJAX_HERE, path.read_bytes()))
        return super().do_GET()

    def _send(self, status, content_type, body):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def end_headers(self):
        self.send_header("Cache-Control", "max-age=3600")
        super().end_headers()

    def log_message(self, *args):
        pass


@dataclass
class Site:
    url: str
    mathjax_requests: list[str]  # the requests the pages made for MathJax, answered from the local copy


class _QuietServer(http.server.ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        """The browser drops requests it no longer needs (e.g. on navigation): not an error of the site."""
        if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            super().handle_error(request, client_address)


@pytest.fixture(scope="module")
def site():
    if not (HTML / "index.html").is_file():
        pytest.skip(f"{HTML.relative_to(ROOT)}/index.html not found: run `make book` first")
    mathjax_requests: list[str] = []
    handler = functools.partial(type("Handler", (_SiteHandler,), {"mathjax_requests": mathjax_requests}),
                                directory=str(HTML))
    server = _QuietServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield Site(f"http://127.0.0.1:{server.server_port}/", mathjax_requests)
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def browser():
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("Chromium is not installed (`make browser` installs Debian's chromium with apt-get, as root)")
    playwright_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (requirements.txt)")
    with playwright_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def crawl(site, browser):
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    context = browser.new_context(viewport={"width": DESKTOP, "height": HEIGHT}, color_scheme="light",
                                  device_scale_factor=1)
    site, mathjax_requests, external = site.url, site.mathjax_requests, []
    page = context.new_page()
    page.set_default_navigation_timeout(NAVIGATION_TIMEOUT_MS)
    # Transitions (the sidebars sliding after a resize, colours after the theme's switch) run 1000 times faster:
    # the measurements wait for them to end, and the end is the same (Chromium's DevTools, per loaded document).
    devtools = context.new_cdp_session(page)
    devtools.send("Animation.enable")
    errors: list[str] = []
    page.on("console", lambda msg: errors.append(f"console.{msg.type}: {msg.text}") if msg.type == "error" else None)
    page.on("pageerror", lambda exc: errors.append(f"uncaught exception: {exc}"))
    page.on("response", lambda r: errors.append(f"HTTP {r.status}: {r.url}") if r.status >= 400 else None)
    page.on("requestfailed", lambda r: errors.append(f"request failed ({r.failure}): {r.url}")
            if r.url.startswith(site) else None)
    page.on("request", lambda r: None if r.url.startswith((site, "data:", "blob:")) else external.append(r.url))

    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    visits, screenshots = {}, []
    for docname in DOCNAMES:
        visit = Visit(docname, f"{site}{docname}.html")
        errors.clear()
        response = page.goto(visit.url, wait_until="load")
        devtools.send("Animation.setPlaybackRate", {"playbackRate": ANIMATION_SPEED})
        visit.status = response.status if response else None
        measured = page.evaluate(MEASURE_LOADED)
        if measured["failed"]:
            errors.append(f"MathJax failed: {measured['failed']}")
        visit.info, visit.layout = measured["info"], measured["layout"]
        chapter = docname.startswith("book/")
        if docname == DOCNAMES[0] or chapter:
            shot = SCREENSHOTS / f"{Path(docname).name}.png"
            page.screenshot(path=str(shot))
            screenshots.append(shot)
        page.set_viewport_size({"width": PHONE, "height": HEIGHT})
        visit.phone = page.evaluate(MEASURE_RESIZED)
        if docname == DOCNAMES[1]:
            page.screenshot(path=str(SCREENSHOTS / f"phone_{Path(docname).name}.png"), full_page=False)
        page.set_viewport_size({"width": DESKTOP, "height": HEIGHT})
        if chapter:
            page.emulate_media(color_scheme="dark")
            visit.dark = page.evaluate(MEASURE_DARK)
            page.emulate_media(color_scheme="light")
        visit.errors = list(dict.fromkeys(errors))
        visits[docname] = visit

    errors.clear()
    page.goto(f"{site}search.html?q=softmax", wait_until="load")
    try:
        page.wait_for_selector("#search-results ul.search li", timeout=20_000)
    except PlaywrightTimeout:  # no results: test_search_finds_softmax reports it
        pass
    search_results = page.eval_on_selector_all("#search-results ul.search li a", "els => els.map(a => a.href)")
    crawl = Crawl(site, visits, external, mathjax_requests, search_results, list(dict.fromkeys(errors)), screenshots)
    context.close()
    return crawl


@pytest.fixture(scope="module")
def layouts(crawl):
    """{(viewport width, colour scheme): {docname: INSPECT_LAYOUT's record}}: every page on a laptop and on a phone
    (light), and the chapters on a laptop in dark mode; all measured in the crawl's one visit of each page.

    The phone is the loaded page's window resized to 390 px, once the transitions that started have ended: the pages
    set their width to the device's (viewport meta tag), and no style depends on touch, so a phone's browser lays
    them out alike (on 2026-11-26 every record on every page equalled that of a separate `is_mobile`, `has_touch`
    context loading each page at 390 px). Dark mode is the system's colour scheme turned dark on the loaded page: the
    theme's listener switches the page in place, as it does for a reader (on 2026-11-26 every record on every page
    equalled that of the page reloaded with the scheme dark, which the theme reads when it loads)."""
    visits = crawl.visits.values()
    return {(DESKTOP, "light"): {v.docname: v.layout for v in visits},
            (PHONE, "light"): {v.docname: v.phone for v in visits},
            (DESKTOP, "dark"): {v.docname: v.dark for v in visits if v.docname.startswith("book/")}}


def test_no_page_is_wider_than_a_phone(layouts):
    problems = [f"{docname}: {r['pageWidth']} px wide on a {PHONE} px screen; too wide: {r['wide']}"
                for docname, r in layouts[PHONE, "light"].items() if r["pageWidth"] > r["width"] + 1]
    assert not problems, "pages that scroll sideways on a phone:\n" + _report(problems)


def test_no_code_block_is_clipped_on_a_laptop(layouts):
    problems = [f"{docname}: {clip}" for docname, r in layouts[DESKTOP, "light"].items() for clip in r["clipped"]]
    assert not problems, f"code blocks that need a scroll bar at {DESKTOP} px:\n" + _report(problems)
    assert all(r["pageWidth"] <= r["width"] + 1 for r in layouts[DESKTOP, "light"].values())


def test_display_equations_fit_a_laptop_column(layouts):
    """At 1280 px every display equation fits its column: a long one is split into aligned lines, as in a textbook
    (an `aligned` environment), never hidden behind an inner scroll bar."""
    problems = [f"{docname}: {e['width']} px wide in a {e['box']} px column: {e['tex']}"
                for docname, r in layouts[DESKTOP, "light"].items() for e in r["equations"]
                if e["width"] > e["box"] + 1]
    assert not problems, f"display equations clipped at {DESKTOP} px:\n" + _report(problems)


def test_display_equations_on_a_phone(layouts):
    """At 390 px an equation wider than the column scrolls inside its own box (course.css), so nothing is cut off;
    and none is wider than PHONE_EQUATION_SWIPES columns, so one line is read with at most one swipe."""
    problems = [f"{docname}: {e['width']} px wide in a {e['box']} px column"
                f"{'' if e['scrolls'] else ' that does not scroll'}: {e['tex']}"
                for docname, r in layouts[PHONE, "light"].items() for e in r["equations"]
                if e["width"] > e["box"] + 1 and (not e["scrolls"] or e["width"] > PHONE_EQUATION_SWIPES * e["box"])]
    assert not problems, f"display equations cut off or too wide at {PHONE} px:\n" + _report(problems)


def test_no_code_line_wraps_on_a_laptop(layouts):
    """At 1280 px no line of a code cell is longer than the code column holds (course.css would wrap it to the left
    margin, where it reads as a new statement): tools/lint_notebooks.py keeps the chapters' code cells within
    CODE_LINE_LENGTH (79) characters, and course.css sets the cells' code in a size whose column holds them."""
    problems = [f"{docname}: a line of {c['length']} characters, the column holds {c['holds']}: {c['line']}"
                for docname, r in layouts[DESKTOP, "light"].items() for c in r["codeLines"]]
    assert not problems, f"lines that wrap at {DESKTOP} px:\n" + _report(problems)


# A printed line may wrap only where it reads as a sentence: a check's verdict or message ("✓ ...", "[code] ...",
# "Failing case ...") or an exception's message, after an optional short label ("head size 48: ValueError: ...").
# Tables, verdict lines, lists and arrays must fit the column: wrapped, their columns land at the left margin.
PROSE_OUTPUT = re.compile(r"^(✓ |\s*\[[a-z0-9-]+\] |\s*Failing case|([^:]{1,40}: )?"
                          r"([A-Za-z_][\w.]*(Error|Exception|Failed|Warning): |\[[a-z0-9-]+\] ))")


def test_no_printed_table_or_verdict_wraps_on_a_laptop(layouts):
    """At 1280 px no printed line (stdout, a cell's value) is longer than the output column holds, in characters of
    its font, except messages that read as sentences (PROSE_OUTPUT): the notebooks print tables and verdicts in
    lines of at most 81 characters."""
    problems = [f"{docname}: a line of {o['length']} characters, the column holds {o['holds']}: {o['line'][:90]}"
                for docname, r in layouts[DESKTOP, "light"].items() for o in r["outputLines"]
                if not PROSE_OUTPUT.match(o["line"])]
    assert not problems, f"printed lines that wrap at {DESKTOP} px ({len(problems)}):\n" + _report(problems)


def test_library_listings_fit_a_laptop_column(layouts):
    """At 1280 px no show_source listing needs a horizontal scroll bar: the library keeps to 79 columns
    (src/ruff.toml; `make format` runs tools/format_source.py) and course.css sets listings in a size whose column
    holds them. Reported with the chapter and the listing's first line (the function or class it shows)."""
    listings = [(docname, x) for docname, r in layouts[DESKTOP, "light"].items() for x in r["listings"]]
    assert listings, "no show_source listing on any page: expected the chapters' library code"
    problems = [f"{docname}: a line of {x['longest']} characters, the column holds {x['holds']} "
                f"({x['scrollWidth']} px of text in {x['clientWidth']} px): {x['text']}"
                for docname, x in listings if x["wide"]]
    assert not problems, (f"library listings that scroll sideways at {DESKTOP} px ({len(problems)} of "
                          f"{len(listings)}; run `make format`, then re-execute the chapters):\n" + _report(problems))


def test_library_listings_scroll_instead_of_wrapping(layouts):
    """show_source's listings of library code keep their lines: a wrapped line would land at the left margin and
    read as a new statement. Where one is wider than its column (a phone), it scrolls inside its own box."""
    listings = [(docname, width, listing) for (width, scheme), records in layouts.items() if scheme == "light"
                for docname, r in records.items() for listing in r["listings"]]
    assert listings, "no show_source listing on any page: expected the chapters' library code"
    problems = [f"{docname} at {width} px: white-space {x['whiteSpace']}, overflow-x {x['overflow']}: {x['text']}"
                for docname, width, x in listings
                if x["whiteSpace"] != "pre" or (x["wide"] and x["overflow"] not in ("auto", "scroll"))]
    assert not problems, "listings that wrap or overflow their box:\n" + _report(problems)


def test_one_output_box_per_stream(layouts):
    """A cell's printed output is one box per stream, however the kernel chunked it (`nb_merge_streams`)."""
    problems = [f"{docname}: {s['counts']} boxes in the cell {s['cell']!r}"
                for docname, r in layouts[DESKTOP, "light"].items() for s in r["streams"]]
    assert not problems, "cells whose printed output is split into several boxes:\n" + _report(problems)


def _luminance(css_colour):
    """0 (black) to 1 (white) for an `rgb(...)`/`rgba(...)` colour; 0 for a transparent one."""
    values = [float(v) for v in re.findall(r"[\d.]+", css_colour)]
    if len(values) == 4 and values[3] == 0:
        return 0.0
    red, green, blue = values[:3]
    return (0.2126 * red + 0.7152 * green + 0.0722 * blue) / 255


def test_plots_sit_on_a_light_panel_in_dark_mode(layouts):
    dark = layouts[DESKTOP, "dark"]
    assert {r["theme"] for r in dark.values()} == {"dark"}, "the pages did not follow the system's dark mode"
    panels = [(docname, p) for docname, r in dark.items() for p in r["panel"]]
    assert panels, "no plot on any chapter page: expected the chapters' figures"
    problems = [f"{docname}: background {p['background']}, padding {p['padding']} px" for docname, p in panels
                if _luminance(p["background"]) < 0.8 or p["padding"] < 4]
    assert not problems, "plots without a light panel in dark mode:\n" + _report(problems)


def test_every_page_shows_the_licence(layouts):
    missing = [d for d, r in layouts[DESKTOP, "light"].items() if not r["licence"]]
    assert not missing, f"pages without a visible CC BY 4.0 link in the footer: {missing}"


def _report(problems):
    return "\n".join(problems)


def test_every_page_loads_without_errors(crawl):
    problems = [f"{v.docname}: HTTP {v.status}" for v in crawl.visits.values() if v.status != 200]
    problems += [f"{v.docname}: {e}" for v in crawl.visits.values() for e in v.errors]
    problems += [f"search.html: {e}" for e in crawl.search_errors]
    assert not problems, "pages with console errors:\n" + _report(problems)


def test_pages_need_nothing_from_the_network_but_mathjax(crawl):
    external = sorted(set(crawl.external))
    assert not external, "pages request third-party resources (blocked here: ship them with the book):\n" + _report(
        external)


def test_math_is_typeset(crawl):
    if not MATHJAX.is_dir():
        pytest.skip(f"no local MathJax 3 in {MATHJAX.parent.relative_to(ROOT)} to stand in for the CDN: "
                    "run `make browser` (tools/install_browser.sh; needs npm)")
    assert crawl.mathjax_requests, "no page requested MathJax 3 (mathjax@3 .../es5/...): is math rendering configured?"
    problems = []
    pages_with_math = 0
    for v in crawl.visits.values():
        info = v.info
        pages_with_math += info["math"] > 0
        if info["math"] and not info["mathjaxLoaded"]:
            problems.append(f"{v.docname}: MathJax did not load")
        problems += [f"{v.docname}: not typeset: {t!r}" for t in info["untypeset"]]
        problems += [f"{v.docname}: TeX error: {t!r}" for t in info["mathErrors"]]
        problems += [f"{v.docname}: raw math in the text: {m.group(0)[:80]!r}"
                     for m in RAW_MATH.finditer(info["prose"])]
    assert pages_with_math, "no page has any math: expected chapter 1's formulas"
    assert not problems, _report(problems)


def _smallest_text_px(path, shown_px, natural_px):
    """How tall the smallest text of the image file ``path`` is on the page, in CSS px, where it is shown
    ``shown_px`` wide (``natural_px`` is its own width in CSS px): (px, None), or (None, why it cannot be known).

    SVG (the diagrams, text kept as text): the smallest `font-size` of its <text> elements, in the units of its
    viewBox, times shown width / viewBox width. PNG (the notebooks' plots): attention_course.plotting records the
    smallest text drawn, in points, in the image (a text chunk), with the image's dpi: points * dpi / 72 is its size
    in the image's pixels, times shown width / natural width."""
    from attention_course import plotting

    if path.suffix == ".svg":
        svg = path.read_text(encoding="utf-8")
        view_box = re.search(r'viewBox="\s*[\d.-]+\s+[\d.-]+\s+([\d.]+)\s+[\d.]+\s*"', svg)
        sizes = [float(v) for v in re.findall(r"<text[^>]*font-size:\s*([\d.]+)px", svg)]
        if not view_box or not sizes:
            return None, "an SVG without a viewBox or without text elements (text drawn as paths?)"
        return min(sizes) * shown_px / float(view_box.group(1)), None
    from PIL import Image

    with Image.open(path) as image:
        recorded = getattr(image, "text", {}).get(plotting.SMALLEST_TEXT_KEY)
        dpi = image.info.get("dpi", (plotting.FIGURE_DPI,))[0]
    if recorded is None:
        return None, (f"no record of its smallest text ({plotting.SMALLEST_TEXT_KEY!r}): drawn before the course "
                      "style; re-execute the notebook (attention_course.plotting sets the style and records it)")
    if recorded == "none":
        return float("inf"), None  # a figure without text
    return float(recorded) * dpi / 72 * shown_px / natural_px, None


def test_figure_labels_are_readable_on_a_laptop(crawl):
    """At 1280 px the smallest text of every figure (plots and diagrams) is at least MIN_LABEL_PX (12) px tall, as
    shown on the page: attention_course.plotting's style (text >= 11 pt, figures up to about 7 inches wide) meets
    it. Measured from the image files the pages show, scaled as the page scales them."""
    from attention_course import plotting

    measured, problems = [], []
    for v in crawl.visits.values():
        for figure in v.info["figures"]:
            path = HTML / urldefrag(figure["src"]).url.removeprefix(crawl.base)
            if not path.is_file() or path.suffix not in (".svg", ".png"):
                continue  # logos and other images outside the book's own figures
            px, why = _smallest_text_px(path, figure["shown"], figure["natural"])
            name = f"{v.docname}: {path.name} (shown {figure['shown']:.0f} px wide)"
            if px is None:
                problems.append(f"{name}: {why}")
            elif px < plotting.MIN_LABEL_PX:
                problems.append(f"{name}: smallest text {px:.1f} px")
            measured.append(px)
    assert measured, "no figure measured: expected the chapters' plots and diagrams"
    assert not problems, (f"figures with labels under {plotting.MIN_LABEL_PX} px at {DESKTOP} px "
                          f"({len(problems)} of {len(measured)}):\n" + _report(problems))


def test_every_image_loads(crawl):
    problems = [f"{v.docname}: {src}" for v in crawl.visits.values() for src in v.info["brokenImages"]]
    assert not problems, "images that did not load:\n" + _report(problems)
    assert sum(v.info["images"] for v in crawl.visits.values()), "no images at all: expected the chapters' plots"


def test_no_error_tracebacks_in_outputs(crawl):
    problems = [f"{v.docname}: {t!r}" for v in crawl.visits.values() for t in v.info["tracebacks"]]
    assert not problems, "tracebacks in cells not tagged raises-exception:\n" + _report(problems)


def test_exercise_pages_show_the_check_message_not_a_traceback(crawl):
    """An exercise page shows, under a check that fails because the work is not done yet, the check's message
    (tools/book_html_fixes.py keeps the end of the stored traceback, from the line naming the exception)."""
    exercise_pages = [v for v in crawl.visits.values() if v.docname.startswith("exercises/")]
    assert sum(len(v.info["expectedErrors"]) for v in exercise_pages), "no failing check on any exercise page"
    problems = [f"{v.docname}: {text[:120]!r}" for v in exercise_pages for text in v.info["expectedErrors"]
                if "Traceback" in text or "---->" in text or not re.match(r"[\w.]+: ", text)]
    assert not problems, "exercise pages showing tracebacks:\n" + _report(problems)


def test_solution_pages_read_as_solutions(crawl):
    problems = [f"{v.docname}: {v.info['solutionMarkers']} code cells show BEGIN/END SOLUTION markers"
                for v in crawl.visits.values() if v.info["solutionMarkers"]]
    assert not problems, _report(problems)


def test_the_install_cell_toggle_says_what_it_hides(crawl):
    toggles = {text.splitlines()[0] for v in crawl.visits.values() for text in v.info["toggles"]}
    assert toggles == {"Show the install cell (for Colab)"}, f"toggle labels: {toggles}"


def test_navigation_reaches_every_page(crawl):
    expected = {crawl.base + d + ".html" for d in DOCNAMES[1:]}
    root = crawl.visits[DOCNAMES[0]]
    in_sidebar = {urldefrag(href).url for href in root.info["sidebar"]}
    assert expected <= in_sidebar, f"not in the sidebar of {DOCNAMES[0]}: {sorted(expected - in_sidebar)}"
    # The "next" buttons walk through the whole book in toc order.
    chain = [crawl.visits[d].info["next"] for d in DOCNAMES[:-1]]
    assert chain == [crawl.base + d + ".html" for d in DOCNAMES[1:]], f"'next' buttons: {chain}"
    assert crawl.visits[DOCNAMES[-1]].info["next"] is None


def test_search_finds_softmax(crawl):
    assert crawl.search_results, "search.html?q=softmax returned no results"
    pages = {crawl.base + d + ".html" for d in DOCNAMES}
    found = {urldefrag(href).url.split("?")[0] for href in crawl.search_results}
    assert found <= pages, f"search results outside the book: {sorted(found - pages)}"


def test_screenshots_of_intro_and_chapters(crawl):
    expected = [d for d in DOCNAMES if d == DOCNAMES[0] or d.startswith("book/")]
    assert len(crawl.screenshots) == len(expected)
    for shot in crawl.screenshots:
        assert shot.is_file() and shot.stat().st_size > 10_000, f"{shot} missing or blank"


def test_figure_measurement_on_files(tmp_path):
    """The measurement itself, without a browser: the committed diagrams pass at the column's width, a wide PNG
    with 8 pt text fails, and a PNG drawn without the course style cannot be measured."""
    import base64

    import matplotlib.pyplot as plt

    from attention_course import plotting

    for svg in sorted((ROOT / "book" / "figures").glob("*.svg")):
        px, why = _smallest_text_px(svg, 688, 691)
        assert why is None and px >= plotting.MIN_LABEL_PX, (svg.name, px)
    fig, ax = plt.subplots(figsize=(12, 3.4))
    ax.text(0.5, 0.5, "0.25", fontsize=8)
    recorded = tmp_path / "wide.png"
    recorded.write_bytes(base64.b64decode(plotting._png_with_smallest_text(fig)))
    plain = tmp_path / "plain.png"
    fig.savefig(plain, bbox_inches="tight")
    plt.close(fig)
    px, why = _smallest_text_px(recorded, 688, 1200)
    assert why is None and 6 < px < 7  # 8 pt * 100 / 72 * 688 / 1200
    px, why = _smallest_text_px(plain, 688, 1200)
    assert px is None and "re-execute" in why
