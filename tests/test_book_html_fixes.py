"""The render fixes of tools/book_html_fixes.py on the texts they change (the built pages: tests/test_browser.py)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import book_html_fixes  # noqa: E402

NOT_IMPLEMENTED = [  # a stored traceback of an exercise cell (chapter 2's exercise notebook), ANSI colours included
    "\x1b[31m---------------------------------------------------------------------------\x1b[39m",
    "\x1b[31mNotImplementedError\x1b[39m                       Traceback (most recent call last)",
    "\x1b[36mCell\x1b[39m \x1b[32mIn[6]\x1b[39m, line 1\n----> 1 prediction = answer()",
    "\x1b[36mCell\x1b[39m \x1b[32mIn[5]\x1b[39m, line 3, in answer()\n      1 def answer():",
    "\x1b[31mNotImplementedError\x1b[39m: Exercise 2: A square weight hides its layout",
]


def test_a_traceback_is_cut_to_the_line_naming_the_exception():
    text = book_html_fixes.last_exception("\n".join(NOT_IMPLEMENTED))
    assert text == "NotImplementedError: Exercise 2: A square weight hides its layout"


def test_a_multi_line_check_message_is_kept_whole():
    message = "CheckFailed: [missing-scale] Divide the scores by sqrt(d_k).\n  Failing case: case 3 of 24"
    assert book_html_fixes.last_exception("\x1b[0;31mCheckFailed\x1b[0m" + message[11:]) == message


def test_a_text_without_an_exception_line_is_kept():
    assert book_html_fixes.last_exception("\x1b[31msomething else\x1b[39m\n") == "something else"


def test_solution_markers_are_left_out_and_the_code_kept():
    code = ("def f(x):\n    \"\"\"Doc.\"\"\"\n    ### BEGIN SOLUTION\n    return x + 1\n    ### END SOLUTION\n\n"
            "def g():\n    ### BEGIN SOLUTION\n    return 2\n    ### END SOLUTION")
    assert book_html_fixes.without_solution_markers(code) == (
        "def f(x):\n    \"\"\"Doc.\"\"\"\n    return x + 1\n\ndef g():\n    return 2\n")
