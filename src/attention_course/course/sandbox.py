"""The grader's side of the trust boundary: start one submission in a disposable sandbox, talk to it only
through arrays, and end it.

Untrusted code only computes; trusted code judges. The grader (:mod:`.grade`) starts
``python -m attention_course.course.worker /sandbox`` (:mod:`.worker`, the untrusted side) in a sandbox, with a
temporary folder holding a copy of the notebook's code as its only writable folder. The worker runs the code
cells top to bottom (IPython, a time limit per cell); at each check cell it does NOT run the check: it keeps the
objects the check would be given (e.g. the function ``softmax``). It then answers the grader's calls: the
grader's checker, in the grader's own process, calls a stand-in for ``softmax`` on inputs it drew; the stand-in
sends the inputs to the worker, which calls the student's function and sends the outputs back (:mod:`.wire`:
arrays, never pickles). The expected values never enter the sandbox, so nothing the submission does to its own
modules (``check_*``, ``np.allclose``, IPython hooks) can change a verdict.

Backends (:func:`backend`):

* ``bwrap`` (bubblewrap, Debian package ``bubblewrap``): new user, mount, PID, network, IPC and UTS namespaces;
  the file system holds only the system folders, the Python installation and the package read-only (the
  course's ``solutions/``, the repository and other submissions are not there), a private ``/tmp`` and the
  submission's folder; no network; an unprivileged user with no capabilities; killing the sandbox kills every
  process in it (PID namespace, ``--die-with-parent``).
* ``rlimit`` (where bubblewrap is missing): the same worker, resource limits and scrubbed environment, but it
  can read every file the grader's user can, use the network and signal the user's other processes. A killed
  grader process takes its worker with it (``PR_SET_PDEATHSIG``), and the command line's processes adopt and kill
  what a submission started in a new session (:func:`adopt_orphans`); only when the instructor kills the whole
  command line does such a process live on. Weaker: use it only for trusted classes, or install bubblewrap.

Both: a scrubbed environment, limits on memory (``RLIMIT_AS``), CPU time, file size, core dumps and processes
(``RLIMIT_NPROC``, and a ``pids`` cgroup where the grader may create one: root ignores ``RLIMIT_NPROC``), its own
session and process group killed at the end, a hard time limit per notebook (the grader kills the sandbox) and
per cell, and a size limit on every reply. The worker's stdout and stderr go to ``/dev/null``: nothing the
submission prints reaches the grader's output.
"""

from __future__ import annotations

import ctypes
import functools
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from . import wire
from .kernel import KERNEL_ENV

SANDBOX_DIR = "/sandbox"
SANDBOX_UID = 65534  # "nobody" inside the sandbox's user namespace
# The few files of /etc that Python and its libraries read; the rest of /etc (keys, credentials) stays out.
ETC = ["/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime", "/etc/nsswitch.conf",
       "/etc/passwd", "/etc/group", "/etc/alternatives", "/etc/matplotlibrc", "/etc/mime.types"]


@dataclass
class Limits:
    """Resource limits of one submission."""

    notebook_s: float = 300.0  # wall time of the whole notebook, cells and calls together
    cell_s: float = 60.0  # wall time of one cell
    memory_mb: int = 8192  # address space (TensorFlow reserves a lot of it)
    processes: int = 256  # processes and threads
    file_mb: int = 64  # size of any file written
    output_mb: int = 64  # size of one reply


_BACKEND: str | None = None


@functools.cache
def bwrap_works() -> bool:
    """Whether bubblewrap is installed and may create its namespaces here."""
    if not shutil.which("bwrap"):
        return False
    command = ["bwrap", "--ro-bind", "/", "/", "--unshare-all", "--uid", str(SANDBOX_UID), "--die-with-parent",
               "true"]
    return subprocess.run(command, capture_output=True, timeout=30, check=False).returncode == 0


def backend() -> str:
    """``"bwrap"`` when bubblewrap runs here, else ``"rlimit"`` (weaker: see the module docstring)."""
    global _BACKEND
    if _BACKEND is None:
        forced = os.environ.get("ATTENTION_COURSE_SANDBOX") == "rlimit"
        _BACKEND = "bwrap" if not forced and bwrap_works() else "rlimit"
    return _BACKEND


def _package_root() -> Path:
    import attention_course

    return Path(attention_course.__file__).resolve().parents[1]


def _readonly_paths() -> list[str]:
    """What the sandbox may read: system folders, the Python installation, site-packages, the package."""
    paths = ["/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", *ETC, sys.base_prefix, sys.prefix,
             str(Path(sys.executable).resolve().parents[1]), str(_package_root())]
    paths += [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))]
    unique = []
    for p in paths:
        if p and os.path.exists(p) and p not in unique:
            unique.append(p)
    return unique


def _environment(limits: Limits) -> dict:
    env = dict(KERNEL_ENV)
    env.update({
        "PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "TMPDIR": "/tmp", "LANG": "C.UTF-8",
        "PYTHONPATH": str(_package_root()), "PYTHONDONTWRITEBYTECODE": "1", "MPLBACKEND": "Agg",
        "MPLCONFIGDIR": "/tmp", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
        "CUDA_VISIBLE_DEVICES": "",
    })
    return env


def _command(folder: Path, env: dict) -> tuple[list[str], dict]:
    worker = [sys.executable, "-s", "-B", "-m", "attention_course.course.worker"]
    if backend() != "bwrap":
        return worker + [str(folder)], env
    # bwrap mounts in order: the private /tmp first, so that a Python or a package that lives under /tmp (a
    # clone in /tmp) is bound on top of it instead of hidden by it
    cmd = ["bwrap", "--tmpfs", "/tmp"]
    for path in _readonly_paths():
        cmd += ["--ro-bind", path, path]
    cmd += ["--bind", str(folder), SANDBOX_DIR, "--chdir", SANDBOX_DIR, "--dev", "/dev", "--proc", "/proc",
            "--unshare-all", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID),
            "--die-with-parent", "--new-session", "--clearenv"]
    for key, value in env.items():
        cmd += ["--setenv", key, value]
    return cmd + worker + [SANDBOX_DIR], {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}


def _pids_cgroup(limits: Limits) -> Path | None:
    """A fresh ``pids`` cgroup limited to ``limits.processes``, where this process may create one (v1 or v2)."""
    for parent in (Path("/sys/fs/cgroup/pids"), Path("/sys/fs/cgroup")):
        if not (parent / "cgroup.procs").exists() or not os.access(parent, os.W_OK):
            continue
        try:
            group = Path(tempfile.mkdtemp(prefix="attention-grade-", dir=parent))
        except OSError:
            continue
        try:
            (group / "pids.max").write_text(str(limits.processes))
            return group
        except OSError:
            _remove_cgroup(group)
    return None


def _remove_cgroup(group: Path | None) -> None:
    if group is not None:
        try:
            group.rmdir()
        except OSError:
            pass


PR_SET_PDEATHSIG = 1  # prctl(2): the signal the kernel sends this process when its parent dies


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when the grader that started it dies (bubblewrap's
    ``--die-with-parent`` does the same for the bwrap backend), so a killed grader leaves no worker behind."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")


PR_SET_CHILD_SUBREAPER = 36  # prctl(2): orphaned descendants are re-parented to this process, not to init


def adopt_orphans() -> None:
    """Make this process the subreaper of its descendants: a process that a submission starts in a new session
    (out of reach of the sandbox's process-group kill), whose parent then dies, becomes a child of this process
    instead of init's, so :func:`kill_adopted` can end it. The grader's command line calls this in each of its
    processes; it matters for the rlimit backend (bubblewrap's PID namespace already ends every process)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")


def _children() -> list[int]:
    """The pids of this process's children (from /proc: field 4 of stat is the parent's pid)."""
    me, found = os.getpid(), []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == me:
            found.append(int(entry.name))
    return found


def kill_adopted(keep=frozenset()) -> None:
    """SIGKILL and reap every child of this process but ``keep`` (the children it started on purpose), again while
    more orphans arrive (their own children, re-parented here as they die)."""
    for _ in range(100):
        found = [pid for pid in _children() if pid not in keep]
        if not found:
            break
        for pid in found:
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass


def _preexec(limits: Limits, cgroup: Path | None):
    def apply():  # pragma: no cover - runs in the child between fork and exec
        _die_with_parent()
        if cgroup is not None:
            (cgroup / "cgroup.procs").write_text(str(os.getpid()))
        mb = 2**20
        cpu = int(limits.notebook_s) + 5
        for name, value in ((resource.RLIMIT_AS, limits.memory_mb * mb), (resource.RLIMIT_CPU, cpu),
                            (resource.RLIMIT_FSIZE, limits.file_mb * mb), (resource.RLIMIT_CORE, 0),
                            (resource.RLIMIT_NPROC, limits.processes + _processes_now())):
            resource.setrlimit(name, (value, value))

    return apply


def _processes_now() -> int:
    """RLIMIT_NPROC counts every process of the user: the limit is on top of those already running."""
    if os.getuid() == 0:
        return 0
    try:
        return sum(1 for p in Path("/proc").iterdir() if p.name.isdigit() and p.stat().st_uid == os.getuid())
    except OSError:
        return 4096


class SandboxError(Exception):
    """The sandbox did not answer: it died, timed out, or sent something malformed."""


class Sandbox:
    """One run of a submission's code cells in a sandbox, then calls to the objects its check cells name.

    ``cells``: ``[{"source": ..., "check": None}]`` for code cells and ``{"source": ..., "check": {"exercise": N,
    "exprs": [...]}}`` for check cells (``exprs``: the expressions whose values the check is given).
    """

    def __init__(self, cells: list[dict], limits: Limits, deadline: float):
        self.cells, self.limits, self.deadline = cells, limits, deadline
        self.proc: subprocess.Popen | None = None
        self.folder: Path | None = None
        self.cgroup: Path | None = None
        self.closed = False

    def start(self) -> None:
        """Start the worker; it runs the cells and stops at each check cell (see :meth:`next_event`)."""
        self.folder = Path(tempfile.mkdtemp(prefix="attention-grade-"))
        job = {"cells": self.cells, "cell_s": self.limits.cell_s}
        (self.folder / wire.JOB_FILE).write_text(json.dumps(job))
        cmd, env = _command(self.folder, _environment(self.limits))
        # preexec_fn (limits, cgroup) is safe here: the command line grades each notebook in a single-threaded
        # child process of its own.
        self.cgroup = _pids_cgroup(self.limits)
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     cwd=self.folder, env=env, start_new_session=True, close_fds=True,
                                     preexec_fn=_preexec(self.limits, self.cgroup))  # noqa: PLW1509 - see below

    def next_event(self) -> dict:
        """The worker's next report: ``{"op": wire.CHECK, "key": cell index, "objects": {expr: info}, "verdict":
        ...}`` at a check cell (answer its calls, then :meth:`resume`), or ``{"op": wire.DONE}``; SandboxError
        when the worker died or ran out of time."""
        header, _ = self._read()
        if header.get("op") not in (wire.CHECK, wire.DONE) or not isinstance(header.get("objects", {}), dict):
            self.close()
            raise SandboxError("the submission's process sent an invalid report")
        return header

    def resume(self) -> None:
        """Let the worker go on to the next cells."""
        self._send({"op": wire.CONTINUE}, {})

    def _send(self, header: dict, arrays: dict) -> None:
        if self.proc is None or self.proc.poll() is not None:
            raise SandboxError("the submission's process is not running")
        try:
            wire.write_message(self.proc.stdin.fileno(), header, arrays)
        except OSError:
            self.close()
            raise SandboxError("the submission's process ended") from None

    def _read(self, deadline: float | None = None):
        deadline = min(self.deadline, deadline or self.deadline)
        try:
            return wire.read_message(self.proc.stdout.fileno(), deadline, self.limits.output_mb * 2**20)
        except wire.WireError as err:
            self.close()
            raise SandboxError(str(err)) from None

    def call(self, key: str, expr: str, args: tuple, kwargs: dict, keep=None):
        """The reply of the student's object ``expr`` (as it was at check cell ``key``, or a number the sandbox
        handed out since) called on ``args``: ``(header, arrays)``. ``keep``: see :func:`.wire.encode` (the
        grader's stand-ins for objects in the sandbox travel as references)."""
        arrays: dict = {}
        request = {"op": wire.CALL, "key": key, "expr": expr, "args": wire.encode(list(args), arrays, keep=keep),
                   "kwargs": wire.encode(dict(kwargs), arrays, keep=keep)}
        return self._ask(request, arrays)

    def attribute(self, key: str, expr: str, name: str):
        """The reply with the attribute ``name`` of the object ``expr``: ``(header, arrays)``."""
        return self._ask({"op": wire.GETATTR, "key": key, "expr": expr, "name": name}, {})

    def _ask(self, request: dict, arrays: dict):
        """Send a request and read its reply. Raises SandboxError when there is no reply; anything that
        interrupts the wait (the check's own time limit) closes the sandbox, whose replies would otherwise be
        out of step."""
        self._send(request, arrays)
        try:
            return self._read()
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Kill every process of the sandbox and delete its folder."""
        self.closed = True
        if self.proc is not None and self.proc.returncode is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                self.proc.kill()
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                pass
            for stream in (self.proc.stdin, self.proc.stdout):
                try:
                    stream.close()
                except OSError:
                    pass
        _remove_cgroup(self.cgroup)
        self.cgroup = None
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
