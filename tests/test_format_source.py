"""tools/format_source.py (``make format``): each pass on small inputs, the
whole command on a small package (idempotent, within the limit, the same
program), and the safety net that refuses a changed program."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import format_source as fs  # noqa: E402

LIMIT = 40  # small inputs: a short limit shows every rule


def lines(text: str) -> list[str]:
    return textwrap.dedent(text).strip("\n").split("\n")


# Paragraphs ------------------------------------------------------------------


def test_refill_a_long_paragraph_keeps_short_ones():
    text = lines("""
        A paragraph whose first line is far too long for the limit
        and a second line.

        Short lines
        written on purpose
        stay as they are.
    """)
    out = fs.refill(text, LIMIT)
    assert max(map(len, out)) <= LIMIT
    assert out[-3:] == ["Short lines", "written on purpose", "stay as they are."]
    assert " ".join(out[: out.index("")]).split() == " ".join(text[:2]).split()


def test_refill_keeps_hanging_indents_of_lists_and_entries():
    text = lines("""
        Args:
            mask: optional boolean, broadcastable to (..., Tq, Tk); True = may attend.
            scale: a float.
        * a bullet item that is much longer than forty characters
        * short
    """)
    out = fs.refill(text, LIMIT)
    assert out[0] == "Args:"
    mask = out[1 : out.index("    scale: a float.")]
    assert mask[0].startswith("    mask: ") and all(line.startswith("        ") for line in mask[1:])
    bullet = out[out.index("    scale: a float.") + 1 : -1]
    assert bullet[0].startswith("* a bullet") and all(line.startswith("  ") for line in bullet[1:])
    assert out[-1] == "* short"
    assert max(map(len, out)) <= LIMIT


def test_refill_leaves_literal_blocks_doctests_tables_and_fields():
    text = lines("""
        Usage::

            python -m attention_course.grade NOTEBOOK --json --timeout SECONDS

        >>> attention(q, k, v, mask=None, is_causal=True, scale=0.125)
        +------------+-----------------------------------------------+
        | a table    | with a row far longer than the limit of forty |
        :param mask: a boolean mask that is longer than forty characters
        :param scale: the scale
    """)
    out = fs.refill(text, LIMIT)
    assert out[:7] == text[:7]
    fields = out[7:]  # a long field is wrapped under itself, never joined
    assert fields[0].startswith(":param mask: ") and fields[-1] == ":param scale: the scale"
    assert all(line.startswith("    ") for line in fields[1:-1])


def test_refill_counts_the_closing_quotes():
    text = ["x" * 20 + " " + "y" * 17]  # 38 characters, 41 with the quotes
    assert fs.refill(text, LIMIT) == text
    assert fs.refill(text, LIMIT, tail='"""') == ["x" * 20, "y" * 17]


# Docstrings and comments --------------------------------------------------


def test_refill_docstrings():
    source = textwrap.dedent('''\
        def f():
            """Summary line that runs well past the forty-column limit.

            Args:
                x: short.
            """
            return 1
        ''')
    out = fs.refill_docstrings(source, LIMIT)
    assert max(map(len, out.splitlines())) <= LIMIT
    assert '    """Summary line that runs well past' in out
    assert "        x: short.\n" in out
    assert fs.same_program(source, out)


def test_refill_comments_and_attribute_comments():
    source = textwrap.dedent("""\
        # A comment block whose first line is too long for the limit
        # and a short second line.
        x = 1
        #: A Sphinx attribute comment that is far too long for it.
        y = 2
        # noqa-free comment
        """)
    out = fs.refill_comments(source, LIMIT)
    assert max(map(len, out.splitlines())) <= LIMIT
    assert [line for line in out.splitlines() if line.startswith("#:")][1].startswith("#: ")
    assert out.endswith("# noqa-free comment\n")


def test_rules_are_cut_to_the_limit():
    source = "# " + "-" * 60 + "\n" + "    # --- masks " + "-" * 60 + "\n"
    out = fs.shorten_rules(source, LIMIT)
    assert out.splitlines() == ["# " + "-" * 38, "    # --- masks " + "-" * 24]


def test_trailing_comments_move_above_their_line():
    source = textwrap.dedent("""\
        def f(a):
            return a + 1  # a comment that does not fit after the code
        import os  # noqa: F401 - why the import stays at all here
        """)
    out = fs.move_trailing_comments(source, LIMIT)
    assert out.splitlines()[1:3] == ["    # a comment that does not fit after", "    # the code"]
    assert "import os  # noqa: F401\n" in out and "# why the import stays at all here\n" in out
    assert fs.same_program(source, out)


def test_long_fmt_skip_statements_are_laid_out():
    source = "x = [1,   2,   3,   4,   5,   6,   7,   8,   9]  # fmt: skip\ny = [1,  2]  # fmt: skip\n"
    out = fs.unskip_long_statements(source, LIMIT)
    assert out == "x = [1,   2,   3,   4,   5,   6,   7,   8,   9]\ny = [1,  2]  # fmt: skip\n"


# Strings ----------------------------------------------------------------------


def test_split_string_at_spaces():
    pieces = fs.split_string('"the output is not linear2 of any hidden features"', 24)
    assert all(len(p) <= 24 for p in pieces)
    assert ast.literal_eval(" ".join(pieces)) == "the output is not linear2 of any hidden features"


def test_split_fstring_never_inside_a_field():
    token = 'f"got {value!r} for {name:>12} ({ {1: 2}[1] } of {{braces}}) and more words"'
    pieces = fs.split_string(token, 20)
    assert pieces is not None
    for piece in pieces:
        ast.parse(piece)  # each piece is a valid literal: no field was cut
    assert all(len(p) <= 20 or "{" in p for p in pieces)  # only a field may be longer
    assert "{braces}" in "".join(p for p in pieces if not p.startswith("f"))  # f dropped, {{ unescaped
    joined = " ".join(pieces)
    assert fs.same_program(f"x = {token}", f"x = {joined}")


def test_split_string_keeps_prefixes_and_escapes():
    pieces = fs.split_string(r'rb"C:\dir name\ more \N words here"', 14)
    assert all(p.startswith('rb"') for p in pieces)
    assert b"".join(ast.literal_eval(p) for p in pieces) == rb"C:\dir name\ more \N words here"
    named = fs.split_string(r'"a \N{NO-BREAK SPACE} and some more words"', 12)
    assert all("\\N{" not in p or "}" in p for p in named)
    assert ast.literal_eval(" ".join(named)) == "a \N{NO-BREAK SPACE} and some more words"


def test_split_strings_adds_parentheses_only_outside_brackets():
    source = 'x = "one two three four five six seven eight"\nf("one two three four five six seven eight")\n'
    out = fs.split_strings(source, LIMIT).splitlines()
    assert out[0].startswith('x = ("one ') and out[0].endswith('")')
    assert out[1].startswith('f("one ') and not out[1].startswith("f((")
    assert fs.same_program(source, "\n".join(out))


def test_unsplittable_strings_stay():
    source = 'x = "' + "a" * 60 + '"\n'
    assert fs.split_strings(source, LIMIT) == source


# The command ------------------------------------------------------------------

PACKAGE = '''\
"""A module docstring whose first line is much longer than the page's seventy-nine columns allow.

Args-like text:
    name: an entry with a hanging indent, long enough to need re-filling at seventy-nine columns.
"""

import os  # noqa: F401 - imported for its side effect, a reason that is long enough to overflow the line


def function(alpha, beta, gamma, delta, epsilon, zeta, eta, theta, iota, kappa, lambda_, mu):
    # A comment block whose first line is far too long for a page of seventy-nine columns, and a second
    # line that continues it.
    if alpha > beta:  # the trailing comment of this line makes it longer than seventy-nine columns
        raise ValueError(f"alpha={alpha!r} must not exceed beta={beta!r}: got gamma={gamma} and delta={delta}")
    message = "a plain string literal long enough that the line holding it cannot fit in seventy-nine"
    return message, [alpha, beta, gamma, delta, epsilon, zeta, eta, theta, iota, kappa, lambda_, mu]
'''


def test_format_paths_fits_the_limit_keeps_the_program_and_is_idempotent(tmp_path):
    module = tmp_path / "pkg" / "module.py"
    module.parent.mkdir()
    module.write_text(PACKAGE, encoding="utf-8")
    changed, restored, long = fs.format_paths([module.parent], 79)
    formatted = module.read_text(encoding="utf-8")
    assert changed == [module] and not restored and not long, long
    assert max(map(len, formatted.splitlines())) <= 79
    assert fs.same_program(PACKAGE, formatted)
    check = subprocess.run([sys.executable, "-m", "ruff", "check", "--isolated", "--select", "E501,F",
                            "--line-length", "79", str(module)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout
    assert fs.format_paths([module.parent], 79) == ([], [], [])  # idempotent
    assert module.read_text(encoding="utf-8") == formatted


def test_a_changed_program_is_refused(tmp_path, monkeypatch):
    module = tmp_path / "module.py"
    module.write_text(PACKAGE, encoding="utf-8")

    def wrong(source, limit):
        return source.replace("a plain string literal", "a plain string")

    monkeypatch.setattr(fs, "text_passes", wrong)
    changed, restored, _ = fs.format_paths([module], 79)
    assert restored == [str(module)] and changed == []
    assert module.read_text(encoding="utf-8") == PACKAGE


@pytest.mark.parametrize(("before", "after", "same"), [
    ('def f():\n    """Two  words\n    here."""\n', 'def f():\n    """Two words here."""\n', True),
    ('x = "ab"\n', 'x = ("a" "b")\n', True),
    ('x = "ab"\n', 'x = "a b"\n', False),
    ('x = f"{a} b"\n', 'x = f"{a}" " b"\n', True),
    ('x = f"{a}"\n', 'x = f"{a!r}"\n', False),
])
def test_same_program(before, after, same):
    assert fs.same_program(before, after) is same


def test_the_page_width_is_the_configured_one():
    assert fs.line_length() == 79
