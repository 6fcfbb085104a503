"""Bring the library's source to the page's width (issue 41, item 7): ``make format``.

Chapters show the library's code with ``show_source``; the book's code column
at 1280 px holds about 80 characters, so the package keeps to 79 columns
(``src/ruff.toml``). One command, idempotent and deterministic::

    python tools/format_source.py [PATH ...]   # default: src/attention_course
    python tools/format_source.py --check      # report, change nothing

It runs ``ruff format`` (configured in ``src/ruff.toml``), then its own passes
for what ruff format leaves long, then ``ruff format`` again, until nothing
changes:

- docstrings and comment blocks: a paragraph with a line over the limit is
  re-filled; lists keep their hanging indent, and indented blocks, doctests,
  tables and ``:field:`` lines stay as written (short lines written on purpose
  stay too: only a paragraph with a long line is re-filled);
- a trailing comment that overflows its line moves above the line;
- a long string literal is split at spaces into implicitly concatenated pieces
  (an f-string never inside ``{...}``; prefixes kept; parentheses added where
  the string is not already inside brackets).

Behaviour cannot change: every file's syntax tree after the tool must equal
the tree before it, with docstrings compared word by word (their whitespace
re-filled) and implicitly concatenated strings joined, or the file is restored
and the command fails. Lines it cannot shorten are listed at the end (a long
word, a multi-line string that is not a docstring).
"""

from __future__ import annotations

import argparse
import ast
import io
import re
import subprocess
import sys
import textwrap
import tokenize
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_PATHS = [ROOT / "src" / "attention_course"]
CONFIG = ROOT / "src" / "ruff.toml"
LINE_LENGTH = 79  # the page's code column holds about 80 characters
MAX_ROUNDS = 6
SKIP = "# fmt: skip"

# A line that starts a new unit in a docstring or comment (never joined to the
# line above): a bullet, a number, a ``:field:``, a ``name: text`` entry of
# Args/Returns/Raises, a section header, a doctest, a table row.
BULLET = re.compile(r"([*+•|-]|\d+[.)]|\([a-z0-9]+\)|#\.)\s")
FIELD = re.compile(r":[^:\s][^:]*:(\s|$)")
ENTRY = re.compile(r"[\w`*.\[\]'\"]+(, [\w`*.\[\]'\"]+)*(\s\([^)]*\))?:(\s|$)")
TABLE = re.compile(r"(\+[-=]{2,}|\|.*\|$|={3,}|-{3,}\s*$)")
# A comment that is a rule: "# -----" or "# --- section ---------".
RULE = re.compile(r"(#:? ?(?:.*? )?)([-=])\2{3,}$")
# A pragma with an explanation: "# noqa: F401 - why" keeps the pragma.
NOQA = re.compile(r"(#\s*noqa(?::\s*[A-Z]+[0-9]+(?:[,\s]+[A-Z]+[0-9]+)*)?)\s*[-:—]?\s+(\S.*)")
PRAGMA = re.compile(r"#\s*(noqa|type:|pragma|fmt:|ruff:|isort:|pylint:)|#!")


def line_length() -> int:
    """The line length of ``src/ruff.toml`` (79), or 79 without it."""
    if not CONFIG.is_file():
        return LINE_LENGTH
    return tomllib.loads(CONFIG.read_text(encoding="utf-8")).get("line-length", LINE_LENGTH)


# Paragraphs: shared by docstrings and comment blocks ---------------------


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _starts_unit(text: str) -> bool:
    """Whether a (stripped) line begins something of its own."""
    return bool(
        BULLET.match(text)
        or FIELD.match(text)
        or ENTRY.match(text)
        or TABLE.match(text)
        or text.startswith(">>>")
    )


def _hang(text: str) -> int:
    """The hanging indent of a one-line unit: under a bullet's text, four
    spaces under an ``entry:``, none under a plain line."""
    bullet = BULLET.match(text)
    if bullet:
        return len(bullet[0])
    return 4 if FIELD.match(text) or ENTRY.match(text) else 0


def _keeps_lines(text: str) -> bool:
    """Lines kept as written: doctests, tables, aligned columns."""
    doctest = text.startswith((">>>", "... ")) or text == "..."
    return doctest or bool(TABLE.match(text))


def _units(lines: list[str]) -> list[tuple[int, int, str | None]]:
    """Split lines into (start, stop, hanging indent or None = keep as is).

    A unit is a paragraph (lines of one indent) or a list item (a first line,
    then lines indented deeper: the hanging indent). A line indented deeper
    than its paragraph's lines, a doctest or a table row, and the lines after
    a ``::``, stay as written.
    """
    units, i, literal_above = [], 0, None
    while i < len(lines):
        text = lines[i].strip()
        indent = _indent(lines[i])
        if literal_above is not None and (not text or indent > literal_above):
            units.append((i, i + 1, None))  # a literal block after "::"
            i += 1
            continue
        literal_above = None
        if not text or _keeps_lines(text) or text.endswith(":"):
            # a header ends its line: refilled alone, never joined
            units.append((i, i + 1, None if not text or _keeps_lines(text) else " " * indent))
            if text.endswith("::"):
                literal_above = indent
            i += 1
            continue
        stop, hanging = i + 1, None
        while stop < len(lines):
            follow = lines[stop].strip()
            depth = _indent(lines[stop])
            if not follow or _starts_unit(follow) or _keeps_lines(follow):
                break
            if hanging is None:
                if depth < indent:
                    break
                if depth > indent and not _starts_unit(text):
                    break  # a block indented under a plain paragraph
                hanging = depth
            elif depth != hanging:
                break
            stop += 1
        if hanging is None:
            hanging = indent + _hang(text)
        units.append((i, stop, " " * hanging))
        if lines[stop - 1].rstrip().endswith("::"):
            literal_above = indent
        i = stop
    return units


def refill(lines: list[str], limit: int, *, tail: str = "") -> list[str]:
    """Re-fill every unit of ``lines`` with a line over ``limit``.

    ``tail`` is text that will follow the last line (a docstring's closing
    quotes): it counts towards that line's length.
    """
    out = []
    for start, stop, hanging in _units(lines):
        unit = lines[start:stop]
        last = stop == len(lines)
        widths = [len(line) + (len(tail) if last and j == len(unit) - 1 else 0) for j, line in enumerate(unit)]
        if hanging is None or max(widths) <= limit or any(line.rstrip().endswith("\\") for line in unit):
            out.extend(unit)
            continue
        first = unit[0]
        words = " ".join(line.strip() for line in unit) + (tail if last else "")
        wrapper = textwrap.TextWrapper(
            width=limit,
            initial_indent=" " * _indent(first),
            subsequent_indent=hanging,
            break_long_words=False,
            break_on_hyphens=False,
        )
        filled = wrapper.wrap(words)
        if last and tail:
            filled[-1] = filled[-1][: -len(tail)]
        out.extend(filled)
    return out


# Source passes -------------------------------------------------------------


def _tokens(source: str) -> list[tokenize.TokenInfo]:
    return list(tokenize.generate_tokens(io.StringIO(source).readline))


def _docstring_nodes(tree: ast.AST) -> list[ast.Constant]:
    nodes = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                if isinstance(body[0].value.value, str):
                    nodes.append(body[0].value)
    return nodes


def refill_docstrings(source: str, limit: int) -> str:
    """Re-fill the paragraphs of triple-quoted docstrings that overflow."""
    lines = source.splitlines(keepends=True)
    edits = []
    for node in _docstring_nodes(ast.parse(source)):
        first, last = node.lineno - 1, node.end_lineno - 1
        col = node.col_offset
        if not any(len(lines[n].rstrip("\n")) > limit for n in range(first, last + 1)):
            continue
        head = lines[first][:col]
        token = "".join(lines[first : last + 1])[col:].rstrip("\n")
        opening = re.match(r"[a-zA-Z]*(\"\"\"|''')", token)
        if not opening:
            continue  # not triple-quoted
        quote = opening[1]
        after = lines[last].rstrip("\n")[node.end_col_offset :]
        if after.strip():
            continue  # code after the docstring on its line
        body = token[: len(token) - 3]
        text_lines = (" " * col + body).split("\n")
        filled = refill(text_lines, limit, tail=quote)
        filled[0] = head + filled[0][col:]
        new = "\n".join(filled) + quote + "\n"
        edits.append((first, last, new))
    for first, last, new in sorted(edits, reverse=True):
        lines[first : last + 1] = [new]
    return "".join(lines)


def _comment_blocks(tokens) -> list[tuple[int, int, int]]:
    """(first row, last row, column) of runs of whole-line comments."""
    rows = {}
    for tok in tokens:
        if tok.type == tokenize.COMMENT and tok.line[: tok.start[1]].strip() == "":
            rows[tok.start[0]] = tok.start[1]
    blocks, row_list = [], sorted(rows)
    for row in row_list:
        if blocks and blocks[-1][1] == row - 1 and blocks[-1][2] == rows[row]:
            blocks[-1][1] = row
        else:
            blocks.append([row, row, rows[row]])
    return [tuple(b) for b in blocks]


def _plain_comment(text: str) -> bool:
    return text in ("#", "#:") or text.startswith(("# ", "#: "))


def _comment_prefix(block: list[str], col: int) -> str:
    """"# ", or "#: " for a block of Sphinx attribute comments."""
    return "#: " if all(line[col:].startswith("#:") for line in block) else "# "


def shorten_rules(source: str, limit: int) -> str:
    """Cut comment rules ("# -----", "# --- name ---") to the limit."""
    out = []
    for line in source.splitlines(keepends=True):
        body = line.rstrip("\n")
        match = RULE.fullmatch(body.strip())
        if len(body) > limit and match and body.lstrip().startswith("#"):
            indent = body[: _indent(body)]
            keep = max(3, limit - len(indent) - len(match[1]))
            line = indent + match[1] + match[2] * keep + "\n"
        out.append(line)
    return "".join(out)


def refill_comments(source: str, limit: int) -> str:
    """Re-fill the paragraphs of whole-line comment blocks that overflow."""
    lines = source.splitlines(keepends=True)
    for first, last, col in reversed(_comment_blocks(_tokens(source))):
        block = [lines[n - 1].rstrip("\n") for n in range(first, last + 1)]
        if max(map(len, block)) <= limit:
            continue
        if any(PRAGMA.match(line.strip()) or not _plain_comment(line.strip()) for line in block):
            continue  # a pragma, a shebang or a #-word block: leave it
        prefix = _comment_prefix(block, col)
        texts = [line[col + len(prefix) :] for line in block]
        filled = refill(texts, limit - col - len(prefix))
        new = [(" " * col + prefix + t).rstrip() + "\n" for t in filled]
        lines[first - 1 : last] = new
    return "".join(lines)


def _inside_multiline_string(tokens) -> set[int]:
    """Rows whose start lies inside a multi-line string (not its first row)."""
    rows = set()
    for tok in tokens:
        if tok.type == tokenize.STRING and tok.end[0] > tok.start[0]:
            rows.update(range(tok.start[0] + 1, tok.end[0] + 1))
    return rows


def move_trailing_comments(source: str, limit: int) -> str:
    """Move a trailing comment that overflows its line above that line."""
    tokens = _tokens(source)
    lines = source.splitlines(keepends=True)
    busy = _inside_multiline_string(tokens)
    for tok in reversed(tokens):
        row, col = tok.start
        if tok.type != tokenize.COMMENT:
            continue
        line = lines[row - 1].rstrip("\n")
        if not line[:col].strip() or len(line) <= limit or row in busy:
            continue
        code = line[:col].rstrip()
        text = tok.string[1:].strip()
        if tok.string.strip() == SKIP:
            continue  # unskip_long_statements' business
        if PRAGMA.match(tok.string):
            pragma = NOQA.fullmatch(tok.string)
            if not pragma:
                continue
            code, text = f"{code}  {pragma[1]}", pragma[2]  # the why moves
        indent = " " * _indent(code)
        filled = textwrap.wrap(text, width=limit - len(indent) - 2, break_long_words=False, break_on_hyphens=False)
        comment = [f"{indent}# {t}\n" for t in filled]
        lines[row - 1 : row] = comment + [code + "\n"]
    return "".join(lines)


def unskip_long_statements(source: str, limit: int) -> str:
    """Drop ``# fmt: skip`` from a statement with a line over the limit, so
    that ruff format lays it out."""
    lines = source.splitlines(keepends=True)
    rows = {tok.start[0] for tok in _tokens(source) if tok.type == tokenize.COMMENT and tok.string.strip() == SKIP}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.stmt) and node.end_lineno in rows:
            span = range(node.lineno - 1, node.end_lineno)
            if any(len(lines[n].rstrip("\n")) > limit for n in span):
                end = lines[node.end_lineno - 1]
                lines[node.end_lineno - 1] = end[: end.rindex(SKIP)].rstrip() + "\n"
    return "".join(lines)


def _string_parts(token: str) -> tuple[str, str, str] | None:
    """(prefix, quote, body) of a one-line, single-quoted string literal."""
    match = re.fullmatch(r"([a-zA-Z]*)(['\"])(.*)\2", token, re.S)
    if not match or match[3].startswith(match[2] * 2) or "\n" in token:
        return None
    return match[1], match[2], match[3]


def _words(body: str, fstring: bool) -> list[str]:
    """``body`` cut after each space outside ``{...}`` and ``\\N{...}``."""
    words, start, depth, i = [], 0, 0, 0
    while i < len(body):
        c = body[i]
        if c == "\\":
            if body.startswith("\\N{", i):
                i = body.index("}", i) + 1
                continue
            i += 2
            continue
        if fstring and c in "{}":
            if body.startswith(c * 2, i) and depth == 0:
                i += 2
                continue
            depth += 1 if c == "{" else -1
        elif c == " " and depth == 0 and (i + 1 == len(body) or body[i + 1] != " "):
            words.append(body[start : i + 1])
            start = i + 1
        i += 1
    words.append(body[start:])
    return [w for w in words if w]


def _fields(word: str) -> list[str]:
    """An f-string word cut before each ``{field}`` and after it."""
    cuts, depth, i = [0], 0, 0
    while i < len(word):
        c = word[i]
        if c == "\\":
            i += 2
            continue
        if c in "{}" and depth == 0 and word.startswith(c * 2, i):
            i += 2
            continue
        if c == "{":
            if depth == 0:
                cuts.append(i)
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                cuts.append(i + 1)
        i += 1
    cuts.append(len(word))
    return [word[a:b] for a, b in zip(cuts, cuts[1:], strict=False) if b > a]


def _piece(prefix: str, quote: str, body: str) -> str:
    """One piece of a split string; an f-piece without a field loses its f."""
    if "f" in prefix.lower():
        fields = re.sub(r"\{\{|\}\}", "", body)
        if "{" not in fields:
            prefix = re.sub("[fF]", "", prefix)
            body = body.replace("{{", "{").replace("}}", "}")
    return f"{prefix}{quote}{body}{quote}"


def split_string(token: str, width: int) -> list[str] | None:
    """``token`` as pieces of at most ``width`` characters, or None."""
    parts = _string_parts(token)
    if parts is None:
        return None
    prefix, quote, body = parts
    room = width - len(prefix) - 2
    fstring = "f" in prefix.lower()
    words = []
    for word in _words(body, fstring):
        words.extend(_fields(word) if fstring and len(word) > room else [word])
    pieces, current = [], ""
    for word in words:
        if current and len(current) + len(word) > room:
            pieces.append(current)
            current = ""
        current += word
    pieces.append(current)
    if len(pieces) < 2:
        return None
    return [_piece(prefix, quote, p) for p in pieces]


def split_strings(source: str, limit: int) -> str:
    """Split one-line string literals that overflow into shorter pieces."""
    tokens = _tokens(source)
    lines = source.splitlines(keepends=True)
    docstrings = {(n.lineno, n.col_offset) for n in _docstring_nodes(ast.parse(source))}
    depth, edits = 0, []
    for tok in tokens:
        if tok.type == tokenize.OP and tok.string in "([{":
            depth += 1
        elif tok.type == tokenize.OP and tok.string in ")]}":
            depth -= 1
        if tok.type != tokenize.STRING or tok.start[0] != tok.end[0] or tok.start in docstrings:
            continue
        row, col = tok.start
        if len(lines[row - 1].rstrip("\n")) <= limit or tok.end[1] <= limit - 1:
            continue
        before = lines[row - 1][:col]
        start = col if not before.strip() else _indent(before) + 8
        pieces = split_string(tok.string, limit - start - 2)
        if pieces is None:
            continue
        new = " ".join(pieces)
        edits.append((row, col, tok.end[1], new if depth else f"({new})"))
    for row, col, end, new in reversed(edits):
        line = lines[row - 1]
        lines[row - 1] = line[:col] + new + line[end:]
    return "".join(lines)


# Safety net ----------------------------------------------------------------


class _Normalise(ast.NodeTransformer):
    """Docstrings compared word by word (their whitespace is re-filled)."""

    def generic_visit(self, node):
        super().generic_visit(node)
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body:
            first = body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                if isinstance(first.value.value, str):
                    first.value.value = " ".join(first.value.value.split())
        return node


def same_program(before: str, after: str) -> bool:
    """Whether two sources compile to the same tree (modulo docstring
    whitespace; implicitly concatenated strings are joined by the parser)."""

    def tree(source):
        return ast.dump(_Normalise().visit(ast.parse(source)), include_attributes=False)

    return tree(before) == tree(after)


# Driver --------------------------------------------------------------------


def ruff_format(paths: list[Path], limit: int) -> None:
    command = [sys.executable, "-m", "ruff", "format", "--quiet", "--line-length", str(limit), *map(str, paths)]
    subprocess.run(command, check=True)


def text_passes(source: str, limit: int) -> str:
    steps = (unskip_long_statements, shorten_rules, refill_docstrings, refill_comments)
    steps += (move_trailing_comments, split_strings)
    for step in steps:
        source = step(source, limit)
    return source


def python_files(paths: list[Path]) -> list[Path]:
    files = []
    for path in paths:
        files.extend(sorted(path.rglob("*.py")) if path.is_dir() else [path])
    return files


def long_lines(files: list[Path], limit: int) -> list[str]:
    return [
        f"{path}:{n}: {len(line)} characters"
        for path in files
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if len(line) > limit
    ]


def format_paths(paths: list[Path], limit: int) -> tuple[list[Path], list[str], list[str]]:
    """Format in place; returns (files changed, files restored, lines left long)."""
    files = python_files(paths)
    originals = {path: path.read_text(encoding="utf-8") for path in files}
    for path, source in originals.items():
        # before ruff: it would wrap a line too long only for its comment in
        # parentheses
        path.write_text(move_trailing_comments(source, limit), encoding="utf-8")
    for _ in range(MAX_ROUNDS):
        ruff_format(files, limit)
        changed = False
        for path in files:
            source = path.read_text(encoding="utf-8")
            new = text_passes(source, limit)
            if new != source:
                path.write_text(new, encoding="utf-8")
                changed = True
        if not changed:
            break
    ruff_format(files, limit)
    restored = []
    for path, original in originals.items():
        if not same_program(original, path.read_text(encoding="utf-8")):
            path.write_text(original, encoding="utf-8")
            restored.append(str(path))
    changed = [path for path in files if path.read_text(encoding="utf-8") != originals[path]]
    return changed, restored, long_lines(files, limit)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="*", type=Path, default=DEFAULT_PATHS)
    parser.add_argument("--line-length", type=int, default=None, help="default: src/ruff.toml's")
    parser.add_argument("--check", action="store_true", help="list lines over the limit; change nothing")
    args = parser.parse_args(argv)
    limit = args.line_length or line_length()
    if args.check:
        long = long_lines(python_files(args.paths), limit)
        print("\n".join(long) or f"every line within {limit} characters")
        return 1 if long else 0
    changed, restored, long = format_paths(args.paths, limit)
    print(f"{len(changed)} files reformatted to {limit} columns")
    if long:
        print(f"{len(long)} lines still longer than {limit} (nothing to split at):")
        print("\n".join(long))
    if restored:
        print("restored (the tool would have changed the program):\n" + "\n".join(restored))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
