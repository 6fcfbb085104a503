"""Calling the student's code safely: time limits, exceptions, argument
snapshots, results as arrays.

Every check runs its body through :func:`run_check`, which prints the body's
success line or re-raises its :class:`CheckFailed` with a short traceback; the
body calls the student's code through :func:`call`, which turns any exception
into a one-paragraph message (``NotImplementedError`` -> ``[not-implemented]``,
anything else -> ``[raised-exception]``) and checks that no array argument was
modified in place (``[mutates-input]``; the code is given copies, so the
checker's own arrays stay as they were), and turns the results into float64
NumPy arrays with :func:`as_array` (``[returned-none]``, ``[wrong-type]``).

Time limit (``timeout`` seconds per check, default :data:`DEFAULT_TIMEOUT`): on
the main thread of a POSIX process (a Jupyter kernel, pytest, a script) the
check runs under ``signal.setitimer``/``SIGALRM``, which interrupts pure-Python
loops; an alarm that is already pending (e.g. pytest-timeout's) is honoured and
restored afterwards. Elsewhere (another thread, Windows) the check runs in a
daemon thread and is abandoned after ``join(timeout)``. Neither can interrupt a
single long-running C call (one huge matmul); Jupyter's interrupt button and
the grader's per-cell time limit cover that.

In IPython/Jupyter a failed check displays only ``CheckFailed: [code]
message``: :class:`CheckFailed` renders its own traceback
(``_render_traceback_``), so stored notebook outputs contain no file paths.
"""

from __future__ import annotations

import copy
import inspect
import math
import signal
import sys
import threading
import time
import warnings
from collections.abc import Callable

import numpy as np

from ..mistakes import MISTAKES, hint, split_code


def is_tensor(value) -> bool:
    """Whether ``value`` is a PyTorch tensor. PyTorch is looked up, not
    imported: a process that never imported it holds no tensor, and a NumPy
    chapter's check (graded in a process of its own) then never pays for the
    import (about 1.5 s)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def _is_module(value) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.nn.Module)


DEFAULT_TIMEOUT = 10.0


class CheckFailed(AssertionError):
    """A failed exercise check; ``str(err)`` starts with ``[code]``.

    IPython shows exceptions through ``_render_traceback_`` when they define
    it: this one shows just
    ``CheckFailed: message`` (no frames, no file paths), so stored notebook
        outputs are stable.
    """

    @property
    def code(self) -> str:
        return split_code(str(self))[0] or ""

    def _render_traceback_(self) -> list[str]:
        return [f"\x1b[0;31m{type(self).__name__}\x1b[0m: {self}"]


class _Timeout(BaseException):
    """Raised by the alarm handler; BaseException so that a student's ``except
    Exception`` does not swallow it."""


def display_name(obj, default: str) -> str:
    """The name of the student's function or class for the success line
    (``default`` for lambdas and partials)."""
    name = getattr(obj, "__name__", None)
    return name if isinstance(name, str) and name.isidentifier() else default


def fail(
    code: str, message: str | None = None, detail: str = "", case: str = ""
) -> CheckFailed:
    """A CheckFailed whose message is ``[code]`` and ``message`` (default: the
    code's hint in :mod:`attention_course.mistakes`, with ``detail`` filled
    in), then the failing ``case``."""
    if code not in MISTAKES:
        raise ValueError(
            f"unknown diagnosis code {code!r}: add it to "
            "attention_course.mistakes first"
        )
    text = message if message is not None else hint(code, detail)
    if case:
        text += f"\n  Failing case: {case}"
    return CheckFailed(f"[{code}] {text}")


# -----------------------------------------------------------------------------
# Running student code: time limit, exceptions, mutation, conversion of results
# -----------------------------------------------------------------------------


def run_with_timeout(func: Callable[[], str], timeout: float | None) -> str:
    """Run ``func()`` under a time limit (see the module docstring); raise
    CheckFailed[timeout] when exceeded."""
    if timeout is None or timeout <= 0:
        return func()
    message = (
        f"Your code did not finish within {timeout:g} s: is there an "
        "infinite loop (e.g. a `while` loop whose "
        "condition never changes)?"
    )
    if (
        hasattr(signal, "setitimer")
        and threading.current_thread() is threading.main_thread()
    ):
        return _run_with_alarm(func, timeout, message)
    return _run_in_thread(func, timeout, message)


def _run_with_alarm(func, timeout, message):
    start = time.monotonic()
    old_remaining, _ = signal.getitimer(signal.ITIMER_REAL)
    old_deadline = start + old_remaining if old_remaining > 0 else math.inf
    ours = start + timeout
    old_handler = signal.getsignal(signal.SIGALRM)
    outer_delivered = False

    def handler(signum, frame):
        nonlocal outer_delivered
        if time.monotonic() >= old_deadline - 1e-3 and callable(old_handler):
            # the outer alarm (e.g. pytest-timeout) was due first: it has now
            # fired
            outer_delivered = True
            old_handler(signum, frame)
        raise _Timeout

    signal.signal(signal.SIGALRM, handler)
    try:
        try:
            signal.setitimer(
                signal.ITIMER_REAL,
                max(min(ours, old_deadline) - time.monotonic(), 1e-4),
            )
            return func()
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except _Timeout:
        raise fail("timeout", message) from None
    finally:
        signal.signal(signal.SIGALRM, old_handler)
        # re-arm an outer alarm still to come, never twice
        if old_deadline < math.inf and not outer_delivered:
            signal.setitimer(
                signal.ITIMER_REAL, max(old_deadline - time.monotonic(), 1e-4)
            )


def _run_in_thread(func, timeout, message):
    result: dict = {}

    def target():
        try:
            result["value"] = func()
        # re-raised in the calling thread
        except BaseException as err:  # noqa: BLE001
            result["error"] = err

    worker = threading.Thread(
        target=target, name="attention-course-check", daemon=True
    )
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        raise fail("timeout", message)
    if "error" in result:
        raise result["error"]
    return result["value"]


def run_check(body: Callable[[], str], timeout: float | None) -> None:
    """Run a check body; print its success line, or re-raise its CheckFailed
    with a short traceback."""
    __tracebackhide__ = True  # pytest: hide this frame
    try:
        line = run_with_timeout(body, timeout)
    except CheckFailed as err:
        failure = CheckFailed(str(err))
    else:
        print(line)
        return
    raise failure from None


def _snapshot(value):
    if is_tensor(value):
        return value.detach().clone()
    if isinstance(value, np.ndarray):
        return value.copy()
    return None


def _given(value):
    """What the student's code is given for a checker's argument: a copy of
    every array, tensor and module in it, so that nothing the code does in
    place (zeroing the weights it is asked to load) changes the checker's
    own."""
    if isinstance(value, np.ndarray):
        return value.copy()
    if is_tensor(value):
        return value.clone()
    if _is_module(value):
        return copy.deepcopy(value)
    if type(value) in (list, tuple):
        return type(value)(_given(v) for v in value)
    if type(value) is dict:
        return {k: _given(v) for k, v in value.items()}
    return value


def _unchanged(before, after) -> bool:
    """Whether an argument still equals the copy taken before the call (NaN
    equals NaN)."""
    if is_tensor(before):
        import torch

        after = after.detach()
        if before.shape != after.shape:
            return False
        if before.is_floating_point():
            return bool(
                torch.allclose(before, after, rtol=0, atol=0, equal_nan=True)
            )
        return bool(torch.equal(before, after))
    return before.shape == after.shape and np.array_equal(
        before, after, equal_nan=before.dtype.kind == "f"
    )


def _has_shape(value) -> bool:
    """Arrays and tensors of any framework (torch, NumPy, TensorFlow):
    described by their shape, not their values."""
    return (
        isinstance(value, np.ndarray)
        or is_tensor(value)
        or (hasattr(value, "shape") and hasattr(value, "dtype"))
    )


def describe_call(label: str, args: dict) -> str:
    """``label(q of shape (2, 3), cache=(shape (1, 2, 4, 8), shape (1, 2, 4,
    8)), ...)``: arrays by their shapes, at any depth, modules by their class,
    anything else by a repr cut to 80 characters (a message stays short)."""
    parts = []
    for name, value in args.items():
        if _has_shape(value):
            parts.append(f"{name} of shape {shape_text(value.shape)}")
        # a dict of weights
        elif isinstance(value, dict) and all(
            _has_shape(v) for v in value.values()
        ):
            shapes = ", ".join(
                f"{k}: {shape_text(v.shape)}" for k, v in value.items()
            )
            parts.append(f"{name}={{{shapes}}}")
        else:
            parts.append(f"{name}={_described(value)}")
    return f"{label}({', '.join(parts)})"


def _described(value, depth: int = 0) -> str:
    if _has_shape(value):
        return f"shape {shape_text(value.shape)}"
    if _is_module(value):
        return f"a {type(value).__name__}"
    if (
        type(value) in (list, tuple)
        and depth < 2
        and any(_has_shape(v) or type(v) in (list, tuple) for v in value)
    ):
        inner = ", ".join(_described(v, depth + 1) for v in value[:6]) + (
            ", ..." if len(value) > 6 else ""
        )
        return f"({inner})" if type(value) is tuple else f"[{inner}]"
    text = " ".join(repr(value).split())
    return text if len(text) <= 80 else text[:77] + "..."


_KERAS_WRAPPER = "Exception encountered when calling"


def original_error(err: BaseException) -> BaseException:
    """The student's own exception. Keras (with its traceback filtering on)
    re-raises an error from a layer's ``call()`` as a new exception of the same
    type whose message starts with "Exception encountered when calling
    X.call()" and lists the arguments; the original is its ``__context__`` (or
    ``__cause__``). Triton's interpreter raises an ``InterpreterError`` from
    the error of a kernel (its ``__cause__``), e.g. the ``NotImplementedError``
    of an exercise's kernel."""
    while (
        str(err).startswith(_KERAS_WRAPPER)
        or type(err).__name__ == "InterpreterError"
    ):
        inner = err.__cause__ or err.__context__
        if inner is None:
            break
        err = inner
    return err


def first_line(err: BaseException) -> str:
    """The first line of an exception's message, without TensorFlow's
    "{{function_node ...}}" prefix, cut to 300 characters."""
    text = str(err).strip()
    if text.startswith("{{function_node") and "}}" in text:
        text = text[text.index("}}") + 2 :].strip()
    text = text.splitlines()[0] if text else ""
    # TensorFlow's op errors, without a name
    text = text[: -len(" name:")] if text.endswith(" name:") else text
    return text if len(text) <= 300 else text[:297] + "..."


def call(
    fn: Callable,
    args: dict,
    label: str,
    positional: int | None = None,
    call_text: str | None = None,
):
    """Call the student's ``fn`` with ``args`` (the first ``positional`` ones
    positionally, the rest as keywords).

    Turns exceptions into CheckFailed messages and checks that no array
    argument was modified.
    """
    call_text = call_text or describe_call(label, args)
    # the student's code gets copies: the checker's stay
    items = [(name, _given(v)) for name, v in args.items()]
    n_pos = len(items) if positional is None else positional
    pos = [v for _, v in items[:n_pos]]
    kw = dict(items[n_pos:])
    before = {name: _snapshot(v) for name, v in items}
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            result = fn(*pos, **kw)
    # any student error becomes a message
    except (Exception, SystemExit) as err:  # noqa: BLE001
        err = original_error(err)
        if isinstance(err, NotImplementedError):
            what = first_line(err) or f"{label} is not implemented yet"
            raise fail(
                "not-implemented",
                f"{what.rstrip('.')}: replace the `raise "
                "NotImplementedError(...)` line with your solution, "
                "run that cell, then run this check again.",
            ) from None
        text = first_line(err)
        raise fail(
            "raised-exception",
            "Your code raised "
            f"{type(err).__name__}{': ' + text if text else ''}\n  when "
            f"called as {call_text}.",
        ) from None
    for name, value in items:
        if before[name] is not None and not _unchanged(before[name], value):
            raise fail("mutates-input", detail=name, case=call_text)
    return result


def as_array(value, what: str, case: str, kind: str = "float") -> np.ndarray:
    """A student's result as a NumPy array (float64, or bool for masks);
    CheckFailed for None/wrong types."""
    if value is None:
        raise (
            fail("returned-none", case=case)
            if what == "result"
            else fail(
                "returned-none",
                f"Your function returned None as its {what}.",
                case=case,
            )
        )
    if is_tensor(value):
        import torch

        tensor = value.detach().cpu()
        if tensor.dtype == torch.bool:
            arr = tensor.numpy()
        elif tensor.is_complex():
            arr = None
        else:  # floats of any width and integers
            arr = tensor.to(torch.float64).numpy()
    elif (
        isinstance(value, np.ndarray)
        or np.isscalar(value)
        and isinstance(value, (int, float, np.number, bool))
    ):
        arr = np.asarray(value)
    # TensorFlow / Keras tensors
    elif hasattr(value, "numpy") and callable(value.numpy):
        arr = np.asarray(value.numpy())
    elif isinstance(value, (list, tuple)):
        try:
            arr = np.asarray(
                value, dtype=np.float64 if kind == "float" else None
            )
        except (ValueError, TypeError):
            arr = None
    else:
        arr = None
    if arr is None or arr.dtype.kind not in "biuf":
        raise fail(
            "wrong-type",
            f"Your {what} is a {type_name(value)}; expected an array of "
            "numbers (a torch tensor or NumPy array).",
            case=case,
        )
    if kind == "bool":
        if arr.dtype != np.bool_:
            raise fail(
                "wrong-type",
                f"Your {what} has dtype {_dtype_name(value)}; a mask must "
                "be boolean (True = may attend), e.g. "
                "build it from a comparison or pass dtype=torch.bool.",
                case=case,
            )
        return arr
    return arr.astype(np.float64)


def _sandbox_field(value, name: str, default):
    """A field of the grader's stand-in for an object in its sandbox
    (``course.judge.Remote``), read without running any ``__getattr__`` of the
    object (a local module's, a student's)."""
    try:
        return object.__getattribute__(value, name)
    except AttributeError:
        return default


def is_instance(value, cls: type) -> bool:
    """``isinstance(value, cls)``; for the grader's stand-in of an object in
    its sandbox, by the qualified class names the sandbox reported."""
    return isinstance(
        value, cls
    ) or f"{cls.__module__}.{cls.__qualname__}" in _sandbox_field(
        value, "_sandbox_types", ()
    )


def is_class(value) -> bool:
    """Whether ``value`` is a class (or the grader's stand-in for a class in
    its sandbox)."""
    return (
        inspect.isclass(value)
        or _sandbox_field(value, "_sandbox_class", False) is True
    )


def type_name(value) -> str:
    if is_tensor(value):
        return f"torch tensor of dtype {value.dtype}"
    return type(value).__name__


def _dtype_name(value) -> str:
    return (
        str(value.dtype) if hasattr(value, "dtype") else type(value).__name__
    )


def split_result(result, case: str, names=("output", "weights")):
    """``out`` or ``(out, weights)`` -> (out, weights or None)."""
    if isinstance(result, (tuple, list)):
        if len(result) == 2:
            return result[0], result[1]
        raise fail(
            "wrong-type",
            f"Your function returned a {type(result).__name__} of "
            f"{len(result)} items; return the {names[0]}, or "
            f"a pair ({names[0]}, {names[1]}).",
            case=case,
        )
    return result, None


def close(a: np.ndarray, b: np.ndarray, atol: float, rtol: float) -> bool:
    return a.shape == b.shape and bool(
        np.allclose(a, b, rtol=rtol, atol=atol, equal_nan=True)
    )


def shape_text(shape) -> str:
    return str(tuple(None if s is None else int(s) for s in shape))


def as_number(value):
    """A student's numeric answer as a Python number, or None if it is not one
    (bool, str, array of several...)."""
    if is_tensor(value) and value.numel() == 1 and not value.is_complex():
        value = value.item()
    elif (
        isinstance(value, np.ndarray)
        and value.shape == ()
        and value.dtype.kind in "iuf"
    ):
        value = value.item()
    if isinstance(value, bool) or not isinstance(
        value, (int, float, np.integer, np.floating)
    ):
        return None
    return (
        value.item() if isinstance(value, (np.integer, np.floating)) else value
    )
