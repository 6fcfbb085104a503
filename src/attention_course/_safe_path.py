"""Run as the grader (``python -m attention_course.grade``, or its child ``-m
attention_course.course.cli``), the process never imports a module from the
current folder, with or without ``-P``: ``-m`` puts that folder first on the
import path, and a student's ``nbformat.py`` or ``ctypes.py`` there would run
in the trusted process. Imported first by the package (before any other
import), so that the folder is gone before anything can be imported from it;
any other use of the package keeps its import path as it is. Only ``-P`` (or
starting from another folder) protects from a module named ``attention_course``
there: Python finds the module to run before any of its code runs."""

import os
import sys

GRADER_MODULES = ("attention_course.grade", "attention_course.course.")
# options whose value is the next argument
_VALUED_OPTIONS = ("-X", "-W", "--check-hash-based-pycs")


def main_module(argv: list[str]) -> str | None:
    """The module ``argv`` (the interpreter's own command line) runs with
    ``-m``, or None."""
    args = iter(argv[1:])
    for arg in args:
        if arg == "-m":
            return next(args, None)
        if arg.startswith("-m"):
            return arg[2:]
        if arg in _VALUED_OPTIONS:
            next(args, None)
        elif arg == "-c" or not arg.startswith("-") or arg == "-":
            return None
    return None


def drop_current_folder() -> None:
    here = os.path.realpath(os.getcwd())
    sys.path[:] = [
        p
        for p in sys.path
        if p not in ("", ".") and os.path.realpath(p) != here
    ]


_module = main_module(list(getattr(sys, "orig_argv", [])))
if _module is not None and _module.startswith(GRADER_MODULES):
    drop_current_folder()
