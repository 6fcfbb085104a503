"""The sandboxed worker: untrusted code runs here, and nothing here is trusted by the grader.

Started by :class:`.sandbox.Sandbox` as ``python -m attention_course.course.worker /sandbox`` inside the sandbox,
that folder its only writable place; the grader first sends it the job (the notebook's code cells). It runs the
code cells top to bottom in IPython, a time limit per cell; at each check cell it does NOT run the check: it
reports what the objects the check would be given are (:mod:`.wire`'s descriptions), then answers the grader's
calls to them until the grader says continue. Its stdout and stderr go to ``/dev/null``; its replies go through the
pipes it was started with. The submission can change anything in this process, this module included: the grader
judges only the outputs it receives, for inputs it drew.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import signal
import sys

from . import wire


class _CellTimeout(KeyboardInterrupt):
    """Raised by the per-cell alarm (a KeyboardInterrupt: ``except Exception`` does not catch it)."""


def _alarm(signum, frame):
    raise _CellTimeout


def _identity(obj) -> dict:
    """What the grader learns about an object it may call: its type, the classes it is an instance of (a class:
    its own bases) by qualified name, and for a class or function its name and signature."""
    is_class = inspect.isclass(obj)
    mro = obj.__mro__ if is_class else type(obj).__mro__
    info = {"type": type(obj).__name__, "class": is_class,
            "types": [f"{c.__module__}.{c.__qualname__}" for c in mro]}
    if is_class or inspect.isroutine(obj):
        info.update(name=_name(obj), params=wire.signature_of(obj))
    return info


def _name(obj) -> str:
    name = getattr(obj, "__name__", "")
    return name if isinstance(name, str) else ""


def _describe(obj) -> dict:
    """What the grader learns about an object a check is given: a class (a stand-in builds and calls its
    objects in the sandbox), a function (its name and signature), or a value (sent as data)."""
    if inspect.isclass(obj):
        return {"kind": wire.CLASS, **_identity(obj)}
    if callable(obj):
        return {"kind": wire.FUNCTION, "name": _name(obj), "params": wire.signature_of(obj)}
    return {"kind": wire.VALUE, **wire.encode_value(obj)}


@contextlib.contextmanager
def _time_limit(seconds: tuple[float, float]):
    """Raise :class:`_CellTimeout` in the block after ``seconds[0]`` of this process's CPU time (the submission's
    work: the machine's load does not change it) or ``seconds[1]`` of wall time (a backstop for code that waits
    without computing); both timers off after the block."""
    cpu, wall = seconds
    for signum in (signal.SIGPROF, signal.SIGALRM):
        signal.signal(signum, _alarm)
    signal.setitimer(signal.ITIMER_PROF, cpu)
    signal.setitimer(signal.ITIMER_REAL, wall)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.setitimer(signal.ITIMER_REAL, 0)


def _run_cell(shell, source: str, seconds: tuple[float, float]):
    try:
        with _time_limit(seconds):
            return shell.run_cell(source, store_history=False, silent=False)
    except BaseException:  # noqa: BLE001 - the submission's cell failed in any way: go on with the next
        return None


def _check_point(shell, check: dict, source: str, seconds: tuple[float, float]) -> dict:
    """At a check cell: describe the objects its check is given; run the check cell itself only when it is not
    a plain ``checks.check_*(...)`` call (graded without a reference: the notebook's own check cells)."""
    objects, report = {}, {}
    for expr in check["exprs"]:
        try:
            objects[expr] = eval(expr, shell.user_ns)  # the submission's own namespace, in the sandbox
            report[expr] = _describe(objects[expr])
        except BaseException as err:  # noqa: BLE001 - e.g. NameError: the exercise was not done
            report[expr] = {"kind": wire.ERROR, "etype": type(err).__name__, "message": str(err)[:500]}
    verdict = None
    if check.get("run_in_sandbox"):
        result = _run_cell(shell, source, seconds)
        error = getattr(result, "error_in_exec", None) if result is not None else _CellTimeout()
        verdict = {"passed": result is not None and error is None and getattr(result, "success", False),
                   "etype": type(error).__name__ if error is not None else None,
                   "message": str(error)[:1000] if error is not None else None}
    return {"objects": report, "verdict": verdict, "_objects": objects}


class Objects:
    """The objects the grader may use at one check cell: those the check cell names, by expression, and those
    handed out since (a module the student's class built, one of its layers, a bound method), by number."""

    def __init__(self, named: dict):
        self.objects = dict(named)
        self._refs: dict[int, str] = {}  # id() of a handed-out object -> its number (each is kept alive here)

    def keep(self, obj) -> dict:
        """The reference tree of ``obj`` (see :func:`.wire.encode`), the same for the same object."""
        ref = self._refs.get(id(obj))
        if ref is None:
            ref = self._refs[id(obj)] = f"#{len(self._refs)}"
            self.objects[ref] = obj
        return {"t": "ref", "id": ref, **_identity(obj)}

    def find(self, tree: dict):
        ref = tree.get("id")
        if ref not in self.objects:
            raise LookupError(f"no object {ref!r} in the sandbox")
        return self.objects[ref]


def _no_grad():
    """The grader's calls run without autograd, as the checks do (loading weights copies into parameters)."""
    torch = sys.modules.get("torch")
    return torch.no_grad() if torch is not None else contextlib.nullcontext()


def _reply_to_call(request: dict, arrays: dict, table: Objects, seconds: tuple[float, float]) -> tuple[dict, dict]:
    """Answer one request: ``call`` the object ``expr`` (an expression of the check cell or a number) on the
    request's arguments (inside the observers its ``observe`` lists, see :func:`.checks.observe.run_observed`), or
    read its ``getattr`` attribute ``name``. Results that are not data (a module, a
    layer) are kept and sent as references; an attribute that is a tensor too, so that loading weights into it
    changes the module."""
    from ..checks.runner import original_error

    target = table.objects.get(request.get("expr"), _MISSING)
    if target is _MISSING:
        return {"ok": False, "etype": "NameError", "message": "no such object"}, {}
    if request.get("observe"):
        from ..checks import observe

        observe.warm_up()  # PyTorch's dispatch machinery loads once, before the call's time limit starts
    out: dict = {}
    try:
        with _time_limit(seconds), _no_grad():
            if request.get("op") == wire.GETATTR:
                value = getattr(target, str(request.get("name")))
                result = table.keep(value) if wire.is_torch_tensor(value) else wire.encode(value, out, keep=table.keep)
                return {"ok": True, "result": result}, out
            args = wire.decode(request["args"], arrays, remote=table.find)
            kwargs = wire.decode(request["kwargs"], arrays, remote=table.find)
            specs = wire.decode(request["observe"], arrays) if request.get("observe") else []
            if specs:  # the checker's observers (scores counted, fused calls, tensors formed) around this call
                from ..checks import observe

                args = list(args)  # an observer may stand in for an argument (observe.RowReads)
                result, observed = observe.run_observed(specs, lambda: target(*args, **kwargs), args)
            else:
                result, observed = target(*args, **kwargs), None
            reply = {"ok": True, "result": wire.encode(result, out, keep=table.keep),
                     "args_after": wire.encode([args, kwargs], out, keep=table.keep)}
            return (reply if observed is None else {**reply, "observed": observed}), out
    except _CellTimeout:
        return {"ok": False, "timeout": True}, {}
    except BaseException as err:  # noqa: BLE001 - reported to the grader by name
        err = original_error(err)
        return {"ok": False, "etype": type(err).__name__, "message": str(err).strip()[:2000],
                "not_implemented": isinstance(err, NotImplementedError)}, {}


_MISSING = object()


def _serve(reply_fd: int, request_fd: int, table: Objects,  # pragma: no cover - in the sandbox
           seconds: tuple[float, float]) -> bool:
    """Answer the grader's calls until it says continue (True) or closes the pipe (False)."""
    while True:
        try:
            request, arrays = wire.read_message(request_fd)
        except wire.WireError:
            return False
        if request.get("op") == wire.CONTINUE:
            return True
        try:
            header, out = _reply_to_call(request, arrays, table, seconds)
        except BaseException as err:  # noqa: BLE001 - e.g. an undecodable request
            header, out = {"ok": False, "etype": type(err).__name__, "message": str(err)[:300]}, {}
        try:
            wire.write_message(reply_fd, header, out)
        except BaseException:  # noqa: BLE001 - e.g. a result the wire cannot carry
            wire.write_message(reply_fd, {"ok": False, "etype": "WireError", "message": "unsendable result"})


def worker(folder: str) -> int:  # pragma: no cover - runs in the sandbox (tests/test_grader_hostile.py)
    """Run the job in ``folder`` (see :class:`.sandbox.Sandbox`): the cells in order; at each check cell report and
    answer the grader's calls; then report done."""
    reply_fd, request_fd = os.dup(1), os.dup(0)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)  # the submission's prints and os.write(1, ...) go nowhere
    os.chdir(folder)
    header, arrays = wire.read_message(request_fd)
    if header.get("op") != wire.JOB:
        return 1
    job = json.loads(arrays["job"].tobytes().decode())
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    seconds = (float(job.get("cell_s", 60)), float(job.get("cell_wall_s", 270)))  # CPU, wall
    errors: list[dict] = []  # the errors of the cells that are not checks, sent with the next report
    for index, cell in enumerate(job["cells"]):
        key = str(cell.get("key", index))
        if not cell.get("check"):
            error = cell_error(_run_cell(shell, cell["source"], seconds))
            if error is not None:
                errors.append({"key": key, **error})
            continue
        point = _check_point(shell, cell["check"], cell["source"], seconds)
        table = Objects(point.pop("_objects"))
        wire.write_message(reply_fd, {"op": wire.CHECK, "key": key, **point, "errors": errors})
        errors = []
        if not _serve(reply_fd, request_fd, table, seconds):
            return 0
    wire.write_message(reply_fd, {"op": wire.DONE, "errors": errors})
    return 0


def cell_error(result) -> dict | None:
    """A cell's error as the grader reports it to the student (``etype``, ``message``), or None: it ran."""
    if result is None:  # stopped by its time limit (or anything raised outside IPython's own handling)
        return {"etype": "timeout", "message": "the cell was interrupted by its time limit"}
    error = result.error_before_exec or result.error_in_exec
    if error is None:
        return None
    return {"etype": type(error).__name__, "message": str(error).strip()[:300]}


if __name__ == "__main__":  # pragma: no cover - the sandbox's entry point
    if len(sys.argv) == 2:
        sys.exit(worker(sys.argv[1]))
    sys.exit("usage: python -m attention_course.course.worker FOLDER")
