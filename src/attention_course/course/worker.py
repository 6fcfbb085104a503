"""The sandboxed worker: untrusted code runs here, and nothing here is trusted
by the grader.

Started by :class:`.sandbox.Sandbox` as ``python -m
attention_course.course.worker /sandbox`` inside the sandbox, that folder its
only writable place; the grader first sends it the job (the notebook's code
cells). It runs the code cells top to bottom in IPython, a time limit per cell;
at each check cell it does NOT run the check: it reports what the objects the
check would be given are (:mod:`.wire`'s descriptions), then answers the
grader's calls to them until the grader says continue. What a cell shows (its
prints, displays, result, error with its traceback, and the figures it leaves
open) is recorded as the cell's outputs and sent with the next report, bounded
(:func:`.wire.clean_outputs`), for the instructor's review notebook. Its stdout
and stderr go to ``/dev/null``; its replies go through the pipes it was started
with. The submission can change anything in this process, this module included:
the grader judges only the outputs it receives, for inputs it drew, and the
outputs it keeps for the review are cleaned and bounded again on its side.
"""

from __future__ import annotations

import base64
import contextlib
import inspect
import io
import json
import os
import signal
import sys

from . import wire


class _CellTimeout(KeyboardInterrupt):
    """Raised by the per-cell alarm (a KeyboardInterrupt: ``except Exception``
    does not catch it)."""


def _alarm(signum, frame):
    raise _CellTimeout


def _identity(obj) -> dict:
    """What the grader learns about an object it may call: its type, the
    classes it is an instance of (a class:
    its own bases) by qualified name, and for a class or function its name and
    signature."""
    is_class = inspect.isclass(obj)
    mro = obj.__mro__ if is_class else type(obj).__mro__
    info = {
        "type": type(obj).__name__,
        "class": is_class,
        "types": [f"{c.__module__}.{c.__qualname__}" for c in mro],
    }
    if is_class or inspect.isroutine(obj):
        info.update(name=_name(obj), params=wire.signature_of(obj))
    return info


def _name(obj) -> str:
    name = getattr(obj, "__name__", "")
    return name if isinstance(name, str) else ""


def _describe(obj) -> dict:
    """What the grader learns about an object a check is given: a class (a
    stand-in builds and calls its objects in the sandbox), a function (its name
    and signature), or a value (sent as data)."""
    if inspect.isclass(obj):
        return {"kind": wire.CLASS, **_identity(obj)}
    if callable(obj):
        return {
            "kind": wire.FUNCTION,
            "name": _name(obj),
            "params": wire.signature_of(obj),
        }
    return {"kind": wire.VALUE, **wire.encode_value(obj)}


@contextlib.contextmanager
def _time_limit(seconds: tuple[float, float]):
    """Raise :class:`_CellTimeout` in the block after ``seconds[0]`` of this
    process's CPU time (the submission's
    work: the machine's load does not change it) or ``seconds[1]`` of wall time
    (a backstop for code that waits without computing); both timers off after
    the block."""
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


class Recorder:
    """The outputs of the cell running now, as Jupyter would store them
    (nbformat v4), its text cut at the wire's limit while it is recorded (a
    cell printing in a loop does not fill the sandbox's memory)."""

    def __init__(self):
        self.outputs: list[dict] = []
        self.text = 0  # characters of text recorded for this cell

    def take(self) -> list[dict]:
        outputs, self.outputs, self.text = self.outputs, [], 0
        return wire.clean_outputs(outputs)

    def _room(self, text: str) -> str:
        # one over the limit: the wire marks the cut
        text = text[: max(0, wire.MAX_CELL_TEXT + 1 - self.text)]
        self.text += len(text)
        return text

    def stream(self, name: str, text: str) -> None:
        text = self._room(str(text))
        last = self.outputs[-1] if self.outputs else {}
        if last.get("output_type") == "stream" and last.get("name") == name:
            # consecutive writes are one output, as in Jupyter
            last["text"] += text
        elif text:
            self._add({"output_type": "stream", "name": name, "text": text})

    def display(self, data: dict, kind: str = "display_data") -> None:
        kept = {"text/plain": self._room(str(data.get("text/plain", "")))}
        png = data.get("image/png")
        images = sum("image/png" in o.get("data", {}) for o in self.outputs)
        if (
            isinstance(png, (str, bytes))
            and len(png) <= wire.MAX_IMAGE_CHARS
            and images < wire.MAX_IMAGES
        ):
            kept["image/png"] = (
                png if isinstance(png, str) else base64.b64encode(png).decode()
            )
        self._add({"output_type": kind, "data": kept, "metadata": {}})

    def error(self, ename: str, evalue: str, traceback: list) -> None:
        self._add(
            {
                "output_type": "error",
                "ename": ename,
                "evalue": self._room(evalue),
                "traceback": [
                    self._room(str(line)) for line in traceback[:200]
                ],
            }
        )

    def _add(self, output: dict) -> None:
        if len(self.outputs) < wire.MAX_CELL_OUTPUTS:
            self.outputs.append(output)

    def clear(self) -> None:
        self.outputs, self.text = [], 0


class _Writer(io.TextIOBase):
    """``sys.stdout`` or ``sys.stderr`` while a cell runs: what it writes
    becomes the cell's stream output."""

    def __init__(self, recorder: Recorder, name: str):
        self.recorder, self.name = recorder, name

    @property
    def encoding(self) -> str:
        return "utf-8"

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        """The process's own descriptor (``/dev/null``), for code that hands
        ``sys.stdout`` to a subprocess."""
        return 1 if self.name == "stdout" else 2

    def write(self, text) -> int:
        self.recorder.stream(self.name, str(text))
        return len(str(text))


def recording_shell(recorder: Recorder):
    """An IPython shell whose results, displays and tracebacks go to
    ``recorder`` instead of the terminal."""
    from IPython.core.displayhook import DisplayHook
    from IPython.core.displaypub import DisplayPublisher
    from IPython.core.interactiveshell import InteractiveShell

    class Hook(DisplayHook):
        def write_output_prompt(self):
            pass

        def write_format_data(self, format_dict, md_dict=None):
            recorder.display(format_dict, "execute_result")

    class Publisher(DisplayPublisher):
        def publish(
            self,
            data,
            metadata=None,
            source=None,
            *,
            transient=None,
            update=False,
            **kwargs,
        ):
            recorder.display(data)

        def clear_output(self, wait=False):
            recorder.clear()

    class Shell(InteractiveShell):
        displayhook_class = Hook
        display_pub_class = Publisher

        def _showtraceback(self, etype, evalue, stb):
            recorder.error(
                getattr(etype, "__name__", str(etype)), str(evalue), list(stb)
            )

    return Shell.instance()


def _show_figures(recorder: Recorder) -> None:
    """Each matplotlib figure the cell left open as an image, then closed: what
    Jupyter's inline backend shows (a figure that cannot be drawn is shown as
    its error)."""
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is None:
        return
    try:
        for number in pyplot.get_fignums():
            buf = io.BytesIO()
            pyplot.figure(number).savefig(
                buf, format="png", dpi=72, bbox_inches="tight"
            )
            recorder.display(
                {
                    "text/plain": f"<Figure {number}>",
                    "image/png": base64.b64encode(buf.getvalue()).decode(),
                }
            )
        pyplot.close("all")
    # the student's figure: shown, and the cell is not failed for it
    except Exception as err:  # noqa: BLE001
        recorder.error(
            type(err).__name__, f"the figure could not be drawn: {err}", []
        )


def _run_cell(
    shell, source: str, seconds: tuple[float, float], recorder: Recorder
):
    """Run one cell under its time limits, what it shows recorded in
    ``recorder``; None when it was stopped outside IPython's own handling (its
    time limit)."""
    try:
        with (
            _time_limit(seconds),
            contextlib.redirect_stdout(_Writer(recorder, "stdout")),
            contextlib.redirect_stderr(_Writer(recorder, "stderr")),
        ):
            result = shell.run_cell(source, store_history=False, silent=False)
            _show_figures(recorder)
            return result
    # the submission's cell failed in any way: go on with the next
    except BaseException:  # noqa: BLE001
        recorder.error(
            "timeout", "the cell was interrupted by its time limit", []
        )
        return None


def _check_point(
    shell,
    check: dict,
    source: str,
    seconds: tuple[float, float],
    recorder: Recorder,
) -> dict:
    """At a check cell: describe the objects its check is given; run the check
    cell itself only when it is not a plain ``checks.check_*(...)`` call
    (graded without a reference: the notebook's own check cells)."""
    objects, report = {}, {}
    for expr in check["exprs"]:
        try:
            # the submission's own namespace, in the sandbox
            objects[expr] = eval(expr, shell.user_ns)
            report[expr] = _describe(objects[expr])
        # e.g. NameError: the exercise was not done
        except BaseException as err:  # noqa: BLE001
            report[expr] = {
                "kind": wire.ERROR,
                "etype": type(err).__name__,
                "message": str(err)[:500],
            }
    verdict = None
    if check.get("run_in_sandbox"):
        result = _run_cell(shell, source, seconds, recorder)
        error = (
            getattr(result, "error_in_exec", None)
            if result is not None
            else _CellTimeout()
        )
        verdict = {
            "passed": result is not None
            and error is None
            and getattr(result, "success", False),
            "etype": type(error).__name__ if error is not None else None,
            "message": str(error)[:1000] if error is not None else None,
        }
    return {"objects": report, "verdict": verdict, "_objects": objects}


class Objects:
    """The objects the grader may use at one check cell: those the check cell
    names, by expression, and those handed out since (a module the student's
    class built, one of its layers, a bound method), by number."""

    def __init__(self, named: dict):
        self.objects = dict(named)
        # id() of a handed-out object -> its number (each is kept alive here)
        self._refs: dict[int, str] = {}

    def keep(self, obj) -> dict:
        """The reference tree of ``obj`` (see :func:`.wire.encode`), the same
        for the same object."""
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
    """The grader's calls run without autograd, as the checks do (loading
    weights copies into parameters)."""
    torch = sys.modules.get("torch")
    return torch.no_grad() if torch is not None else contextlib.nullcontext()


def _dispatch_modes(observe, tree, arrays: dict) -> bool:
    """Whether the observers a request lists (``tree``, as sent) include a
    ``TorchDispatchMode``; True when they cannot be read (the call then
    reports why)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    try:
        kinds = [spec["kind"] for spec in wire.decode(tree, arrays)]
        return any(
            issubclass(observe._KINDS[kind], TorchDispatchMode)
            for kind in kinds
        )
    except (KeyError, TypeError, ValueError, wire.WireError):
        return True


def _reply_to_call(
    request: dict, arrays: dict, table: Objects, seconds: tuple[float, float]
) -> tuple[dict, dict]:
    """Answer one request: ``call`` the object ``expr`` (an expression of the
    check cell or a number) on the request's arguments (inside the observers
    its ``observe`` lists, see :func:`.checks.observe.run_observed`), or read
    its ``getattr`` attribute ``name``. Results that are not data (a module, a
    layer) are kept and sent as references; an attribute that is a tensor too,
    so that loading weights into it changes the module."""
    target = table.objects.get(request.get("expr"), _MISSING)
    if target is _MISSING:
        return {
            "ok": False,
            "etype": "NameError",
            "message": "no such object",
        }, {}
    if request.get("observe"):
        from ..checks import observe

        # PyTorch's dispatch machinery loads once, before the call's time limit
        # starts; only a dispatch mode uses it (loading it costs more than a
        # second of CPU, which a check that only records fused calls, as a
        # NumPy exercise's does, need not pay)
        if _dispatch_modes(observe, request["observe"], arrays):
            observe.warm_up()
    out: dict = {}
    try:
        with _time_limit(seconds), _no_grad():
            if request.get("op") == wire.GETATTR:
                value = getattr(target, str(request.get("name")))
                result = (
                    table.keep(value)
                    if wire.is_torch_tensor(value)
                    else wire.encode(value, out, keep=table.keep)
                )
                return {"ok": True, "result": result}, out
            args = wire.decode(request["args"], arrays, remote=table.find)
            kwargs = wire.decode(request["kwargs"], arrays, remote=table.find)
            specs = (
                wire.decode(request["observe"], arrays)
                if request.get("observe")
                else []
            )
            # the checker's observers (scores counted, fused calls, tensors
            # formed) around this call
            if specs:
                from ..checks import observe

                # an observer may stand in for an argument (observe.RowReads)
                args = list(args)
                result, observed = observe.run_observed(
                    specs, lambda: target(*args, **kwargs), args
                )
            else:
                result, observed = target(*args, **kwargs), None
            reply = {
                "ok": True,
                "result": wire.encode(result, out, keep=table.keep),
                "args_after": wire.encode(
                    [args, kwargs], out, keep=table.keep
                ),
            }
            return (
                reply if observed is None else {**reply, "observed": observed}
            ), out
    except _CellTimeout:
        return {"ok": False, "timeout": True}, {}
    # reported to the grader by name
    except BaseException as err:  # noqa: BLE001
        # only an exception that wraps another can be unwrapped: a stub's
        # plain NotImplementedError does not load the checks' runner
        if err.__cause__ is not None or err.__context__ is not None:
            from ..checks.runner import original_error

            err = original_error(err)
        return {
            "ok": False,
            "etype": type(err).__name__,
            "message": str(err).strip()[:2000],
            "not_implemented": isinstance(err, NotImplementedError),
        }, {}


_MISSING = object()


def _serve(
    reply_fd: int,
    request_fd: int,
    table: Objects,  # pragma: no cover - in the sandbox
    seconds: tuple[float, float],
) -> bool:
    """Answer the grader's calls until it says continue (True) or closes the
    pipe (False)."""
    while True:
        try:
            request, arrays = wire.read_message(request_fd)
        except wire.WireError:
            return False
        if request.get("op") == wire.CONTINUE:
            return True
        try:
            header, out = _reply_to_call(request, arrays, table, seconds)
        # e.g. an undecodable request
        except BaseException as err:  # noqa: BLE001
            header, out = (
                {
                    "ok": False,
                    "etype": type(err).__name__,
                    "message": str(err)[:300],
                },
                {},
            )
        try:
            wire.write_message(reply_fd, header, out)
        # e.g. a result the wire cannot carry
        except BaseException:  # noqa: BLE001
            wire.write_message(
                reply_fd,
                {
                    "ok": False,
                    "etype": "WireError",
                    "message": "unsendable result",
                },
            )


def worker(
    folder: str,
) -> (
    int
):  # pragma: no cover - runs in the sandbox (tests/test_grader_hostile.py)
    """Run the job in ``folder`` (see :class:`.sandbox.Sandbox`): the cells in
    order; at each check cell report and answer the grader's calls; then report
    done."""
    reply_fd, request_fd = os.dup(1), os.dup(0)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        # the submission's prints and os.write(1, ...) go nowhere
        os.dup2(null, fd)
    os.chdir(folder)
    header, arrays = wire.read_message(request_fd)
    if header.get("op") != wire.JOB:
        return 1
    job = json.loads(arrays["job"].tobytes().decode())
    recorder = Recorder()
    shell = recording_shell(recorder)
    # CPU, wall
    seconds = (
        float(job.get("cell_s", 60)),
        float(job.get("cell_wall_s", 270)),
    )
    # the errors of the cells that are not checks, sent with the next report
    errors: list[dict] = []
    # the outputs of the cells run since the last report, sent with it
    outputs = Outputs()
    for index, cell in enumerate(job["cells"]):
        key = str(cell.get("key", index))
        if not cell.get("check"):
            error = cell_error(
                _run_cell(shell, cell["source"], seconds, recorder)
            )
            outputs.add(key, recorder.take())
            if error is not None:
                errors.append({"key": key, **error})
            continue
        point = _check_point(
            shell, cell["check"], cell["source"], seconds, recorder
        )
        outputs.add(key, recorder.take())
        table = Objects(point.pop("_objects"))
        wire.write_message(
            reply_fd,
            {"op": wire.CHECK, "key": key, **point, "errors": errors},
            outputs.send(),
        )
        errors = []
        if not _serve(reply_fd, request_fd, table, seconds):
            return 0
    wire.write_message(
        reply_fd, {"op": wire.DONE, "errors": errors}, outputs.send()
    )
    return 0


class Outputs:
    """The cells' outputs waiting for the next report, within the notebook's
    :data:`.wire.MAX_OUTPUT_CHARS`."""

    def __init__(self):
        self.cells: list[dict] = []
        self.room = wire.MAX_OUTPUT_CHARS

    def add(self, key: str, outputs: list[dict]) -> None:
        if outputs and self.room > 0:
            outputs = wire.clean_outputs(outputs, self.room)
            self.room -= wire.output_chars(outputs)
            self.cells.append({"key": key, "outputs": outputs})

    def send(self) -> dict:
        """The report's arrays; the cells are then sent."""
        arrays, self.cells = wire.outputs_message(self.cells), []
        return arrays


def cell_error(result) -> dict | None:
    """A cell's error as the grader reports it to the student (``etype``,
    ``message``), or None: it ran."""
    # stopped by its time limit (or anything raised outside IPython's own
    # handling)
    if result is None:
        return {
            "etype": "timeout",
            "message": "the cell was interrupted by its time limit",
        }
    error = result.error_before_exec or result.error_in_exec
    if error is None:
        return None
    return {"etype": type(error).__name__, "message": str(error).strip()[:300]}


if __name__ == "__main__":  # pragma: no cover - the sandbox's entry point
    if len(sys.argv) == 2:
        sys.exit(worker(sys.argv[1]))
    sys.exit("usage: python -m attention_course.course.worker FOLDER")
