"""The grader's judging side: check cells become checker calls in the grader's
process on stand-ins that forward to the sandbox (see :mod:`.sandbox`).

A check cell such as ``checks.check_softmax(softmax)`` or
``checks.check_choice("q3", answer)`` is parsed
(:func:`.canonical.parse_check`): the checker's name, literal arguments (taken
from the reference notebook's check cell, so trusted) and expressions to be
evaluated in the submission (``softmax``, ``answer``). At that cell the sandbox
reports what each expression is: a function becomes a stand-in
(:func:`stand_in`) that the checker calls like the student's function, a value
arrives as data. A class becomes a :class:`Remote`, a stand-in for an object
that stays in the sandbox: the module checks build the student's module through
it, load known weights into its layers and call it, all by reference. The
checker runs here, with the hidden cases of
:mod:`attention_course.checks.hidden` switched on, and its verdict is the
exercise's.

One exception: a check cell that is not a plain ``checks.check_*(...)`` call
(possible only when a notebook is graded with its own check cells, without a
reference) runs inside the sandbox, and the grader takes the verdict it reports
(:func:`sandbox_verdict`), which the submission could fake.
"""

from __future__ import annotations

import builtins
import contextlib
import inspect
import io
import sys

import numpy as np

from ..mistakes import hint, split_code
from . import wire
from .canonical import CheckCall
from .sandbox import Sandbox, SandboxError

# the checkers' observers (attention_course.checks.observe), by module name
_OBSERVE = f"{__name__.rsplit('.', 2)[0]}.checks.observe"


class Abort(BaseException):
    """Ends a check with a verdict of the grader's own (a BaseException: the
    checker's ``except Exception`` that turns the student's errors into
    messages does not catch it)."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code, self.message = code, message


def _student_error(header: dict) -> BaseException:
    """The student's exception, rebuilt by name: a built-in exception class
    stays one (a check that catches ``RuntimeError`` or ``AttributeError`` from
    a module catches it from one in the sandbox too); any other name becomes a
    plain Exception of that name."""
    message = str(header.get("message") or "")[:2000]
    if header.get("not_implemented"):
        return NotImplementedError(message)
    name = str(header.get("etype") or "Exception")
    name = name if name.isidentifier() else "Exception"
    base = getattr(builtins, name, None)
    if not (isinstance(base, type) and issubclass(base, Exception)):
        base = Exception
    try:
        return type(name, (base,), {"__module__": "submission"})(message)
    # a built-in whose constructor takes other arguments (UnicodeDecodeError)
    except TypeError:
        return type(name, (Exception,), {"__module__": "submission"})(message)


def _mutated(args, kwargs, after) -> str | None:
    """Which argument the student's call changed in place in the sandbox
    (``after``: the arguments as the call left them), or None. Only the
    arguments themselves are compared, as ``checks.runner.call`` compares them
    locally; nothing is ever written back into the grader's objects."""
    sent = [
        *[(f"argument {i + 1}", a) for i, a in enumerate(args)],
        *(kwargs or {}).items(),
    ]
    left = (
        [*after[0], *after[1].values()]
        if isinstance(after, list) and len(after) == 2
        else []
    )
    for (name, value), value_after in zip(sent, left, strict=False):
        before = wire.array_of(value)
        if (
            before is not None
            and isinstance(value_after, np.ndarray)
            and not (
                before.shape == value_after.shape
                and np.array_equal(before, value_after, equal_nan=True)
            )
        ):
            return name
    return None


def _reply(
    header: dict,
    arrays: dict,
    remote,
    args=(),
    kwargs=None,
    what: str = "the function",
):
    """The value of a reply from the sandbox (the student's exception when it
    raised); ``remote(tree)``: the stand-in for an object the sandbox kept. A
    call that changed one of its arguments in place fails with
    ``[mutates-input]`` (the checker's own arguments are never changed)."""
    if header.get("timeout"):
        raise Abort(
            "timeout", f"{what} ran longer than the time limit per call"
        )
    if not header.get("ok"):
        raise _student_error(header)
    try:
        result = wire.decode(header.get("result"), arrays, remote=remote)
        after = (
            wire.decode(header["args_after"], arrays, framework_ok=False)
            if "args_after" in header
            else None
        )
    except (wire.WireError, KeyError, TypeError, ValueError):
        raise Abort(
            "wrong-type", f"the result of {what} could not be read"
        ) from None
    changed = _mutated(args, kwargs, after)
    if changed:
        raise Abort(
            "mutates-input",
            f"[mutates-input] {hint('mutates-input', changed)}",
        )
    return result


def _ended(err: SandboxError) -> Abort:
    return Abort(
        "sandbox-ended", f"the submission's process stopped answering: {err}"
    )


def stand_in(sandbox: Sandbox, key: str, expr: str, info: dict):
    """A function that calls the student's object ``expr`` in the sandbox: same
    name, same signature. Stand-ins for objects in the sandbox travel to it as
    references, and an object it returns (a model it trained) comes back as
    one."""

    def student_function(*args, **kwargs):
        # the check's observers, run around the call in the sandbox; none is
        # active where no check imported their module, which imports PyTorch
        # (seconds of a grader's process judging NumPy exercises)
        observe = sys.modules.get(_OBSERVE)
        specs = observe.remote_specs() if observe is not None else []
        try:
            header, arrays = sandbox.call(
                key, expr, args, kwargs, keep=_keep, observe=specs
            )
        except SandboxError as err:
            raise _ended(err) from None
        result = _reply(
            header,
            arrays,
            lambda tree: Remote(sandbox, key, str(tree.get("id")), tree),
            args,
            kwargs,
        )
        if specs:
            try:
                observe.absorb(header.get("observed"))
            except (KeyError, TypeError, ValueError, AttributeError):
                raise Abort(
                    "wrong-type",
                    "the sandbox did not report what the check observed",
                ) from None
        return result

    student_function.__name__ = info.get("name") or expr
    student_function.__qualname__ = student_function.__name__
    signature = wire.signature_from(info.get("params"))
    if signature is not None:
        student_function.__signature__ = signature
    return student_function


class Remote:
    """A stand-in for an object that stays in the sandbox: the student's class,
    a module it built, one of the module's layers or parameters, a bound
    method.

    Calling it, or reading an attribute, asks the sandbox; arrays, numbers,
    shapes and dtypes come back as data, any other object as another Remote. So
    a module check runs in the grader's process as on a local module: it builds
    the student's module (``cls(12, 3)``), loads known weights into its layers
    (``module.w_q.weight.copy_(w)`` copies in the sandbox) and compares what
    the module returns for inputs it drew. ``checks.runner.is_instance`` and
    ``is_class`` read the classes the sandbox reported; the submission could
    misreport them, but a verdict still rests on outputs computed for inputs it
    has never seen. Python's own probes of special names (``__array__``,
    ``__len__``) are not forwarded. Its type is named after the object's, so
    messages read "built a Linear"."""

    def __new__(cls, sandbox: Sandbox, key: str, target: str, info: dict):
        return object.__new__(
            wire.named_class(str(info.get("type") or "object"), Remote)
        )

    def __init__(self, sandbox: Sandbox, key: str, target: str, info: dict):
        name = info.get("name") if isinstance(info.get("name"), str) else ""
        fields = {
            "_sandbox": sandbox,
            "_key": key,
            "_target": target,
            "_sandbox_types": tuple(str(t) for t in info.get("types") or ()),
            "_sandbox_class": info.get("class") is True,
            "__name__": name or target,
            "__qualname__": name,
            "__signature__": wire.signature_from(info.get("params")),
        }
        for field_name, value in fields.items():
            object.__setattr__(self, field_name, value)

    def _remote(self, tree: dict) -> Remote:
        return Remote(self._sandbox, self._key, str(tree.get("id")), tree)

    def __getattr__(self, name: str):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        try:
            header, arrays = self._sandbox.attribute(
                self._key, self._target, name
            )
        except SandboxError as err:
            raise _ended(err) from None
        return _reply(header, arrays, self._remote, what=f"reading .{name}")

    def __call__(self, *args, **kwargs):
        try:
            header, arrays = self._sandbox.call(
                self._key, self._target, args, kwargs, keep=_keep
            )
        except SandboxError as err:
            raise _ended(err) from None
        return _reply(
            header,
            arrays,
            self._remote,
            args,
            kwargs,
            what=f"{self.__name__}(...)",
        )

    def __setattr__(self, name, value):
        raise AttributeError(f"cannot set .{name} of an object in the sandbox")

    def __repr__(self) -> str:
        what = (
            f"class {self.__name__}"
            if self._sandbox_class
            else type(self).__name__
        )
        return f"<{what} in the sandbox>"


def _keep(value) -> dict | None:
    """How a Remote travels back to the sandbox as an argument: by
    reference."""
    return (
        {"t": "ref", "id": value._target}
        if isinstance(value, Remote)
        else None
    )


def _resolve(arg, sandbox: Sandbox, key: str, objects: dict):
    kind, value = arg
    if kind == "literal":
        return value
    info = objects.get(value) or {}
    if info.get("kind") == wire.FUNCTION:
        return stand_in(sandbox, key, value, info)
    if info.get("kind") == wire.CLASS:
        return Remote(sandbox, key, value, info)
    if info.get("kind") == wire.VALUE:
        try:
            return wire.decode_value(info)
        except (wire.WireError, KeyError, TypeError, ValueError):
            raise Abort(
                "wrong-type", f"{value}: a value the grader cannot read"
            ) from None
    if info.get("kind") == wire.ERROR:
        etype = str(info.get("etype") or "Error")
        raise Abort(etype, f"{etype}: {info.get('message', '')}".strip())
    raise Abort("not-run", f"{value} was not reported by the submission")


def _uses_tensorflow(args, kwargs) -> bool:
    """Whether a check is given TensorFlow work (``framework="tf"``, or a Keras
    class): decided by what it is given, not by the checker's name, so that
    importing TensorFlow (seconds) is not counted in its time limit."""
    keras = any(
        t.startswith(("keras.", "tf_keras."))
        for a in [*args, *kwargs.values()]
        if isinstance(a, Remote)
        for t in object.__getattribute__(a, "_sandbox_types")
    )
    return kwargs.get("framework") == "tf" or keras


def run_checks(
    calls: list[CheckCall],
    sandbox: Sandbox,
    key: str,
    objects: dict,
    timeout: float | None = None,
) -> tuple[bool, str | None, str | None]:
    """Run the check cell's checker calls here, on stand-ins: (passed, code,
    message). ``timeout``: the time limit of each check (the grader's time
    limit per cell), unless the check cell sets its own; every input and output
    crosses a pipe, so the checks' default limit for a notebook is too tight on
    a busy machine."""
    from .. import checks

    for call in calls:
        checker = getattr(checks, call.checker, None)
        if checker is None or not call.checker.startswith("check_"):
            return False, "NameError", f"checks.{call.checker} does not exist"
        try:
            args = [_resolve(a, sandbox, key, objects) for a in call.args]
            kwargs = {
                k: _resolve(a, sandbox, key, objects)
                for k, a in call.kwargs.items()
            }
            if (
                timeout is not None
                and "timeout" in inspect.signature(checker).parameters
            ):
                kwargs.setdefault("timeout", timeout)
            if _uses_tensorflow(args, kwargs):
                # imported before the check's time limit starts
                import tensorflow  # noqa: F401
            with contextlib.redirect_stdout(io.StringIO()):
                checker(*args, **kwargs)
        except Abort as err:
            return False, err.code, err.message
        except checks.CheckFailed as err:
            text = str(err)
            return (
                False,
                split_code(text)[0] or "CheckFailed",
                text.splitlines()[0],
            )
        # e.g. the checker's own ValueError for an unknown question
        except Exception as err:  # noqa: BLE001
            return (
                False,
                type(err).__name__,
                (str(err).splitlines() or [""])[0],
            )
    return True, None, None


def sandbox_verdict(verdict: dict) -> tuple[bool, str | None, str | None]:
    """The verdict of a check cell that ran inside the sandbox (see the module
    docstring)."""
    if verdict.get("passed") is True:
        return True, None, None
    etype = str(verdict.get("etype") or "Error")
    message = str(verdict.get("message") or etype)
    if etype == "_CellTimeout":
        return (
            False,
            "timeout",
            "the cell was interrupted: it ran longer than the time limit",
        )
    return (
        False,
        split_code(message)[0] or etype,
        message.splitlines()[0] if message else etype,
    )
