"""Sphinx extension loaded by `_config.yml` (`sphinx.local_extensions`): one fix to the book's generated HTML.

Sphinx 7.4 writes an inline `<script>` twice when an extension registers it after the HTML builder has started
(the builder stores its file name as `None`, the registry copy as `''`, so the two do not compare equal). Jupyter Book's
sphinx-thebe registers `const THEBE_JS_URL = ...` that way, and a `const` declared twice is a SyntaxError: every page
logged "Identifier 'THEBE_JS_URL' has already been declared" in the browser console. Fixed upstream for Sphinx 8
(sphinx-doc/sphinx#13402), which Jupyter Book 1.x cannot use (it requires Sphinx 7): here each page keeps the first of
two identical scripts.
tests/test_browser.py fails on any page error or console error, so a regression shows there.
"""


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
    app.connect("html-page-context", drop_duplicate_scripts)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
