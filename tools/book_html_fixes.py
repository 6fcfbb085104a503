"""Sphinx extension loaded by `_config.yml` (`sphinx.local_extensions`): fixes to the book's generated pages.

1. Exercise pages (`exercises/`) show what a student sees first: each exercise's prompt, and for a check cell that
   fails because the exercise is not done yet, its one-line message (`CheckFailed: [not-implemented] ...`,
   `NotImplementedError: Exercise 2: ...`). The stored outputs keep the whole traceback (nbval compares them, and a
   student's own run prints it); the page keeps only its last part, from the line naming the exception.
2. Solution pages (`solutions/`) read as solutions: the `### BEGIN SOLUTION` / `### END SOLUTION` lines that the
   exercise generator (attention_course.course.exercises) cuts along are left out of the code shown.
3. Duplicated inline scripts (below).

Sphinx 7.4 writes an inline `<script>` twice when an extension registers it after the HTML builder has started
(the builder stores its file name as `None`, the registry copy as `''`, so the two do not compare equal). Jupyter Book's
sphinx-thebe registers `const THEBE_JS_URL = ...` that way, and a `const` declared twice is a SyntaxError: every page
logged "Identifier 'THEBE_JS_URL' has already been declared" in the browser console. Fixed upstream for Sphinx 8
(sphinx-doc/sphinx#13402), which Jupyter Book 1.x cannot use (it requires Sphinx 7): here each page keeps the first of
two identical scripts.
tests/test_browser.py fails on any page error or console error, so a regression shows there.
"""

import re

from docutils import nodes

ANSI = re.compile(r"\x1b\[[0-9;]*m")
EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(?:Error|Exception|Failed)\b: ", re.M)
SOLUTION_MARKER = re.compile(r"^[ \t]*### (?:BEGIN|END) SOLUTION[ \t]*(?:\n|\Z)", re.M)


def _in_cell_part(node, part):
    """Whether ``node`` lies in a notebook cell's input or output container (``part``: "cell_input"/"cell_output")."""
    parent = node.parent
    while parent is not None:
        if part in parent.get("classes", []):
            return True
        parent = parent.parent
    return False


def _replace_text(block, text):
    block.children = [nodes.Text(text)]
    block.rawsource = text


def last_exception(traceback: str) -> str:
    """The end of a traceback, from the last line that names the exception (the whole text, ANSI-free, if none)."""
    plain = ANSI.sub("", traceback).rstrip()
    starts = list(EXCEPTION_LINE.finditer(plain))
    return plain[starts[-1].start():] if starts else plain


def without_solution_markers(code: str) -> str:
    return SOLUTION_MARKER.sub("", code)


def trim_exercise_pages(app, doctree, docname):
    if docname.startswith("exercises/"):
        for block in doctree.findall(nodes.literal_block):
            if "traceback" in block.get("classes", []):
                _replace_text(block, last_exception(block.astext()))
    elif docname.startswith("solutions/"):
        for block in doctree.findall(nodes.literal_block):
            if _in_cell_part(block, "cell_input"):
                code = block.astext()
                if SOLUTION_MARKER.search(code):
                    _replace_text(block, without_solution_markers(code))


def _script_key(js):
    attributes = getattr(js, "attributes", {})
    return (getattr(js, "filename", js) or "", tuple(sorted((k, str(v)) for k, v in attributes.items())))


def drop_duplicate_scripts(app, pagename, templatename, context, doctree):
    scripts = context.get("script_files")
    if not isinstance(scripts, list):
        return
    seen = set()
    unique = []
    for js in scripts:
        key = _script_key(js)
        if key not in seen:
            seen.add(key)
            unique.append(js)
    scripts[:] = unique


def setup(app):
    app.connect("doctree-resolved", trim_exercise_pages)
    app.connect("html-page-context", drop_duplicate_scripts)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
