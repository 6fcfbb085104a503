"""The grader's judging side: check cells become checker calls in the grader's process on stand-ins that
forward to the sandbox (see :mod:`.sandbox`).

A check cell such as ``checks.check_softmax(softmax)`` or ``checks.check_choice("q3", answer)`` is parsed
(:func:`parse_check`): the checker's name, literal arguments (taken from the reference notebook's check cell, so
trusted) and expressions to be evaluated in the submission (``softmax``, ``answer``). At that cell the sandbox
reports what each expression is: a function becomes a stand-in (:func:`stand_in`) that the checker calls like
the student's function, a value arrives as data. The checker runs here, with the hidden cases of
:mod:`attention_course.checks.hidden` switched on, and its verdict is the exercise's.

Exercises protected less: a check given a class (the module checks construct objects, set weights and call
methods) or a check cell that is not a plain ``checks.check_*(...)`` call runs inside the sandbox, and the
grader takes the verdict it reports; the sandbox still keeps it away from other submissions and the solutions,
but the submission could fake that verdict. :data:`SANDBOX_VERDICT_NOTE` says so in the results.
"""

from __future__ import annotations

import ast
import contextlib
import inspect
import io
import re
from dataclasses import dataclass, field

import numpy as np

from . import wire
from .sandbox import Sandbox, SandboxError

CODE = re.compile(r"^\[([A-Za-z0-9_-]+)\]")
SANDBOX_VERDICT_NOTE = "checked inside the sandbox (a class): see the instructor guide"


@dataclass
class CheckCall:
    checker: str
    args: list = field(default_factory=list)  # ("literal", value) or ("expr", source)
    kwargs: dict = field(default_factory=dict)


def _argument(node) -> tuple[str, object]:
    try:
        return "literal", ast.literal_eval(node)
    except (ValueError, SyntaxError, TypeError):
        return "expr", ast.unparse(node)


def parse_check(source: str) -> list[CheckCall] | None:
    """The checker calls of a check cell, or None when it is anything but ``checks.check_*(...)`` calls."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    calls = []
    for stmt in tree.body:
        if not (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)):
            return None
        func = stmt.value.func
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "checks":
            name = func.attr
        else:
            return None
        if not name.startswith("check_") or any(isinstance(a, ast.Starred) for a in stmt.value.args) or any(
                k.arg is None for k in stmt.value.keywords):
            return None
        calls.append(CheckCall(name, [_argument(a) for a in stmt.value.args],
                               {k.arg: _argument(k.value) for k in stmt.value.keywords}))
    return calls or None


def expressions(calls: list[CheckCall] | None) -> list[str]:
    """The expressions the sandbox evaluates at the check cell."""
    found = []
    for call in calls or []:
        for kind, value in [*call.args, *call.kwargs.values()]:
            if kind == "expr" and value not in found:
                found.append(value)
    return found


class Abort(BaseException):
    """Ends a check with a verdict of the grader's own (a BaseException: the checker's ``except Exception`` that
    turns the student's errors into messages does not catch it)."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code, self.message = code, message


def _student_error(header: dict) -> BaseException:
    message = str(header.get("message") or "")[:500]
    if header.get("not_implemented"):
        return NotImplementedError(message)
    name = str(header.get("etype") or "Exception")
    name = name if name.isidentifier() else "Exception"
    return type(name, (Exception,), {"__module__": "submission"})(message)


def _copy_back(original, after) -> None:
    """Write what the student's call left in an argument back into the grader's argument, so that the checker's
    test for modified inputs sees it."""
    if isinstance(original, (list, tuple)) and isinstance(after, (list, tuple)):
        for o, a in zip(original, after, strict=False):  # the submission may return fewer
            _copy_back(o, a)
    elif isinstance(original, dict) and isinstance(after, dict):
        for k, o in original.items():
            _copy_back(o, after.get(k))
    elif isinstance(after, np.ndarray):
        if isinstance(original, np.ndarray) and original.shape == after.shape:
            np.copyto(original, after, casting="unsafe")
        elif type(original).__module__.startswith("torch") and tuple(original.shape) == after.shape:
            import torch

            with torch.no_grad():
                original.copy_(torch.from_numpy(np.array(after)).to(original.dtype))


def stand_in(sandbox: Sandbox, key: str, expr: str, info: dict):
    """A function that calls the student's object ``expr`` in the sandbox: same name, same signature."""

    def student_function(*args, **kwargs):
        try:
            header, arrays = sandbox.call(key, expr, args, kwargs)
        except SandboxError as err:
            raise Abort("sandbox-ended", f"the submission's process stopped answering: {err}") from None
        if header.get("timeout"):
            raise Abort("timeout", "the function ran longer than the time limit per call")
        if not header.get("ok"):
            raise _student_error(header)
        try:
            result = wire.decode(header.get("result"), arrays)
            _copy_back([list(args), kwargs], wire.decode(header.get("args_after"), arrays, framework_ok=False))
        except (wire.WireError, KeyError, TypeError, ValueError):
            raise Abort("wrong-type", "the function's result could not be read") from None
        return result

    student_function.__name__ = info.get("name") or expr
    student_function.__qualname__ = student_function.__name__
    params = info.get("params")
    if isinstance(params, list):
        try:
            student_function.__signature__ = inspect.Signature([
                inspect.Parameter(str(n), inspect._ParameterKind(int(kind)),
                                  default=None if has_default else inspect.Parameter.empty)
                for n, kind, has_default in params])
        except (TypeError, ValueError):
            pass
    return student_function


def _value(info: dict):
    arrays = {k: np.array(v, dtype=info.get("dtypes", {}).get(k)) for k, v in info.get("arrays", {}).items()}
    return wire.decode(info.get("value"), arrays)


def _resolve(arg, sandbox: Sandbox, key: str, objects: dict):
    kind, value = arg
    if kind == "literal":
        return value
    info = objects.get(value) or {}
    if info.get("kind") == "function":
        return stand_in(sandbox, key, value, info)
    if info.get("kind") == "value":
        try:
            return _value(info)
        except (wire.WireError, KeyError, TypeError, ValueError):
            raise Abort("wrong-type", f"{value}: a value the grader cannot read") from None
    if info.get("kind") == "error":
        etype = str(info.get("etype") or "Error")
        raise Abort(etype, f"{etype}: {info.get('message', '')}".strip())
    raise Abort("not-run", f"{value} was not reported by the submission")


def run_checks(calls: list[CheckCall], sandbox: Sandbox, key: str, objects: dict,
               timeout: float | None = None) -> tuple[bool, str | None, str | None]:
    """Run the check cell's checker calls here, on stand-ins: (passed, code, message). ``timeout``: the time
    limit of each check (the grader's time limit per cell), unless the check cell sets its own; every input and
    output crosses a pipe, so the checks' default limit for a notebook is too tight on a busy machine."""
    from .. import checks

    for call in calls:
        checker = getattr(checks, call.checker, None)
        if checker is None or not call.checker.startswith("check_"):
            return False, "NameError", f"checks.{call.checker} does not exist"
        try:
            args = [_resolve(a, sandbox, key, objects) for a in call.args]
            kwargs = {k: _resolve(a, sandbox, key, objects) for k, a in call.kwargs.items()}
            if timeout is not None and "timeout" in inspect.signature(checker).parameters:
                kwargs.setdefault("timeout", timeout)
            if kwargs.get("framework") == "tf" or call.checker == "check_keras_attention":
                import tensorflow  # noqa: F401 - imported before the check's time limit starts
            with contextlib.redirect_stdout(io.StringIO()):
                checker(*args, **kwargs)
        except Abort as err:
            return False, err.code, err.message
        except checks.CheckFailed as err:
            text = str(err)
            match = CODE.match(text)
            return False, match.group(1) if match else "CheckFailed", text.splitlines()[0]
        except Exception as err:  # noqa: BLE001 - e.g. the checker's own ValueError for an unknown question
            return False, type(err).__name__, (str(err).splitlines() or [""])[0]
    return True, None, None


def sandbox_verdict(verdict: dict) -> tuple[bool, str | None, str | None]:
    """The verdict of a check that ran inside the sandbox (classes; see the module docstring)."""
    if verdict.get("passed") is True:
        return True, None, None
    etype = str(verdict.get("etype") or "Error")
    message = str(verdict.get("message") or etype)
    if etype == "_CellTimeout":
        return False, "timeout", "the cell was interrupted: it ran longer than the time limit"
    match = CODE.match(message)
    return False, match.group(1) if match else etype, message.splitlines()[0] if message else etype
