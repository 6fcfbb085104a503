"""The grader's side of the trust boundary: start one submission in a
disposable sandbox, talk to it only through arrays, and end it.

Untrusted code only computes; trusted code judges. The grader (:mod:`.grade`)
starts ``python -m attention_course.course.worker /sandbox`` (:mod:`.worker`,
the untrusted side) in a sandbox, with a temporary folder holding a copy of the
notebook's code as its only writable folder. The worker runs the code cells top
to bottom (IPython, a time limit per cell); at each check cell it does NOT run
the check: it keeps the objects the check would be given (e.g. the function
``softmax``). It then answers the grader's calls: the grader's checker, in the
grader's own process, calls a stand-in for ``softmax`` on inputs it drew; the
stand-in sends the inputs to the worker, which calls the student's function and
sends the outputs back (:mod:`.wire`: arrays, never pickles). The expected
values never enter the sandbox, so nothing the submission does to its own
modules (``check_*``, ``np.allclose``, IPython hooks) can change a verdict.

Backends (:func:`backend`):

* ``bwrap`` (bubblewrap, Debian package ``bubblewrap``; the default: without it
  the grader refuses): new user, mount, PID, network, IPC and UTS namespaces;
  the file system holds only the system folders, the Python installation and
  the package read-only (the course's ``solutions/``, the repository and other
  submissions are not there), and two tmpfs, ``/tmp`` and the submission's
  folder, limited in bytes and in files (mounted by the
  grader: :func:`private_tmpfs`; where it cannot, bubblewrap's own, limited in
  bytes only, and the report says so), gone with the sandbox; no network; an
  unprivileged user with no capabilities; killing the sandbox kills every
  process in it (PID namespace, ``--die-with-parent``).
* ``rlimit`` (weaker, only when the instructor asks for it): the same worker,
  resource limits and scrubbed environment in a folder of its own, but it can
  read every file of the user it runs as (``nobody`` when the grader runs as
  root and that user can run this Python, if need be through
  :func:`_open_the_way`: :func:`unprivileged_user`), use the network and signal
  that user's processes; its folder is a tmpfs limited in bytes and files where
  a mount namespace can be made (:func:`private_tmpfs`; else a folder on the
  disk, limited per file only), what it writes elsewhere per file only. A
  killed grader process takes its worker with it (``PR_SET_PDEATHSIG``), and
  the command line's processes adopt and kill what a submission started in a
  new session (:func:`adopt_orphans`); only when the instructor kills the whole
  command line does such a process live on.

Both: a scrubbed environment, limits on memory (a ``memory`` cgroup for all its
processes where the grader may create one, as root, and ``RLIMIT_AS`` per
process), CPU time, file size, core dumps and processes (a ``pids`` cgroup,
else ``RLIMIT_NPROC``), its own session and process group killed at the end, a
hard time limit per notebook (the grader kills the sandbox) and per cell, and a
size limit on every reply. Cgroups and folders are named after the grader
process that made them, so that the command line removes what a killed one left
(:func:`remove_left_by`). :func:`describe` says all this in the words every
report carries. The worker's stdout and stderr go to ``/dev/null``: nothing the
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
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# the cache's name only: attention_course.pretrained would import PyTorch
# (seconds) into every grader process
from ..model_cache import cache_folder
from . import wire
from .kernel import KERNEL_ENV

SANDBOX_DIR = "/sandbox"
SANDBOX_UID = 65534  # "nobody" inside the sandbox's user namespace
# The few files of /etc that Python and its libraries read; the rest of /etc
# (keys, credentials) stays out.
ETC = [
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/localtime",
    "/etc/nsswitch.conf",
    "/etc/passwd",
    "/etc/group",
    "/etc/alternatives",
    "/etc/matplotlibrc",
    "/etc/mime.types",
]


ISOLATIONS = ("bwrap", "rlimit")
WALL_FACTOR, WALL_MARGIN_S = 4, 30  # Limits.cell_wall_s


@dataclass
class Limits:
    """How one submission is isolated and limited."""

    # wall time of the whole notebook, cells and calls together
    notebook_s: float = 300.0
    cell_s: float = 60.0  # CPU time of one cell or one call (see cell_wall_s)
    # memory: of all its processes together where a cgroup can be made, else
    # address space
    memory_mb: int = 8192
    processes: int = 256  # processes and threads
    file_mb: int = 64  # size of any file written
    output_mb: int = 64  # size of one reply
    # its writable folder, a tmpfs of this size (rlimit: where a mount
    # namespace can be made)
    disk_mb: int = 512
    tmp_mb: int = 256  # bwrap: its /tmp, a tmpfs of this size
    # files and folders in each of those tmpfs, where the grader can mount them
    # (see private_tmpfs)
    files: int = 10_000
    # "bwrap", or "rlimit": weaker, only when the instructor asks for it
    isolation: str = "bwrap"

    @property
    def cell_wall_s(self) -> float:
        """The wall time of one cell, call or check: a backstop for code that
        waits without computing (a sleep). A submission's work is limited in
        CPU time (``cell_s``), which the machine's load does not change; this
        limit is large enough that a load of two busy processes per core (a
        third of a core each) does not reach it before the CPU limit."""
        return WALL_FACTOR * self.cell_s + WALL_MARGIN_S


@functools.cache
def bwrap_works() -> bool:
    """Whether bubblewrap is installed and may create its namespaces here."""
    if not shutil.which("bwrap"):
        return False
    command = [
        "bwrap",
        "--ro-bind",
        "/",
        "/",
        "--unshare-all",
        "--uid",
        str(SANDBOX_UID),
        "--die-with-parent",
        "true",
    ]
    return (
        subprocess.run(
            command, capture_output=True, timeout=30, check=False
        ).returncode
        == 0
    )


# rlimit as root: the submission runs as this user ("nobody") instead, where it
# can
UNPRIVILEGED = 65534


def _drop_privileges() -> (
    None
):  # pragma: no cover - runs in a child between fork and exec
    os.setgroups([])
    os.setgid(UNPRIVILEGED)
    os.setuid(UNPRIVILEGED)


@functools.cache
def unprivileged_user() -> int | None:
    """The user the rlimit mode runs a submission as: ``nobody`` when the
    grader runs as root and ``nobody`` can run this Python and import the
    package, else None (the grader's). Where a mount namespace can be made, a
    Python under a folder others may not enter (``/root``, where pyenv installs
    it) is made reachable in the submission's namespace only
    (:func:`_open_the_way`); elsewhere such an interpreter keeps the grader's
    user."""
    if os.getuid() != 0:
        return None
    paths, mountable = _readonly_paths(), private_tmpfs("rlimit")

    def drop():  # pragma: no cover - runs in the child between fork and exec
        if mountable:
            _mount_tmpfs([], None)
            _open_the_way(paths)
        _drop_privileges()

    try:
        probe = subprocess.run(
            [
                sys.executable,
                "-P",
                "-c",
                "import attention_course.course.worker",
            ],
            check=False,
            env={"PYTHONPATH": str(_package_root())},
            capture_output=True,
            timeout=120,
            cwd="/",
            # the grader's process: one thread
            preexec_fn=drop,
        )  # noqa: PLW1509
    # e.g. PermissionError: the interpreter is out of its reach
    except (OSError, subprocess.SubprocessError):
        return None
    return UNPRIVILEGED if probe.returncode == 0 else None


def _closed_folder(path: Path) -> Path | None:
    """The outermost folder above ``path`` that others may not enter (no
    ``o+x``), or None."""
    for folder in reversed(path.parents):
        try:
            if not os.stat(folder).st_mode & stat.S_IXOTH:
                return folder
        except OSError:
            return None
    return None


def _open_the_way(
    paths: list[str],
) -> None:  # pragma: no cover - runs in a child between fork and exec
    """As root, in the sandbox's own mount namespace (:func:`_mount_tmpfs`),
    before it becomes ``nobody``: each folder on the way to ``paths`` that
    others may not enter is covered by a small tmpfs they may enter, which
    holds only those of ``paths`` below it, bound back from where they were
    (through a handle opened before the cover hid them), with their own owners
    and modes. Outside the namespace nothing changes; inside it the rest of
    that folder (root's home, say) is gone."""
    closed: dict[Path, list[Path]] = {}
    for path in map(Path, paths):
        folder = _closed_folder(path)
        if folder is not None:
            closed.setdefault(folder, []).append(path)
    for folder, below in closed.items():
        handles = [(path, os.open(path, os.O_PATH)) for path in below]
        _libc(
            "mount",
            b"tmpfs",
            str(folder).encode(),
            b"tmpfs",
            MS_NOSUID | MS_NODEV,
            b"size=1m,nr_inodes=1000,mode=0755",
        )
        for path, handle in handles:
            if os.path.isdir(f"/proc/self/fd/{handle}"):
                os.makedirs(path, exist_ok=True)
            else:
                os.makedirs(path.parent, exist_ok=True)
                open(path, "w").close()
            _libc(
                "mount",
                f"/proc/self/fd/{handle}".encode(),
                str(path).encode(),
                None,
                MS_BIND | MS_REC,
                None,
            )
            os.close(handle)


CLONE_NEWNS, CLONE_NEWUSER = 0x00020000, 0x10000000  # unshare(2)
# mount(2)
MS_NOSUID, MS_NODEV, MS_BIND, MS_REC, MS_PRIVATE = (
    0x2,
    0x4,
    0x1000,
    0x4000,
    0x40000,
)


def _libc(name: str, *args) -> None:
    """Call libc's ``name`` (``unshare``, ``mount``, ``prctl``); OSError when
    it fails."""
    libc = ctypes.CDLL(None, use_errno=True)
    if getattr(libc, name)(*args) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{name}: {os.strerror(err)}")


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _user_namespace(inside: tuple[int, int], outside: tuple[int, int]) -> None:
    """A new user and mount namespace for this process, in which its user and
    group ``outside`` are ``inside``."""
    _libc("unshare", CLONE_NEWUSER | CLONE_NEWNS)
    _write("/proc/self/setgroups", "deny")
    _write("/proc/self/uid_map", f"{inside[0]} {outside[0]} 1")
    _write("/proc/self/gid_map", f"{inside[1]} {outside[1]} 1")


def _mount_tmpfs(
    mounts: list[tuple[Path, int, int]], owner: int | None
) -> None:  # pragma: no cover - a child
    """Runs in a child between fork and exec: a mount namespace of its own (as
    root; otherwise in a user namespace where it is root), in which each
    ``(folder, bytes, files)`` becomes a tmpfs of at most that many bytes and
    files (``nr_inodes``: bubblewrap's ``--tmpfs`` has a size option but no
    file limit), owned by ``owner`` (None: this process's user). Nothing
    outside sees these mounts; they are gone with the namespace's last
    process."""
    if os.getuid() != 0:
        _user_namespace((0, 0), (os.getuid(), os.getgid()))
    else:
        _libc("unshare", CLONE_NEWNS)
    _libc("mount", b"none", b"/", None, MS_REC | MS_PRIVATE, None)
    for folder, size, files in mounts:
        options = f"size={size},nr_inodes={files},mode=0700"
        if owner is not None:
            options += f",uid={owner},gid={owner}"
        _libc(
            "mount",
            b"tmpfs",
            str(folder).encode(),
            b"tmpfs",
            MS_NOSUID | MS_NODEV,
            options.encode(),
        )


def _lock_mounts(
    user: tuple[int, int],
) -> None:  # pragma: no cover - runs in a child between fork and exec
    """After :func:`_mount_tmpfs` in a user namespace: the grader's own
    ``user`` again, one user namespace further down, where the kernel refuses
    to unmount the tmpfs (they come from a more privileged namespace) and where
    the program it runs next has no capabilities."""
    _user_namespace(user, (0, 0))


def _tmpfs_mounts(folder: Path, limits: Limits) -> list[tuple[Path, int, int]]:
    """The tmpfs a sandbox gets where :func:`private_tmpfs` works: under bwrap
    its folder and its /tmp (bound to ``/sandbox`` and ``/tmp``), under rlimit
    its folder."""
    mb = 2**20
    if limits.isolation == "bwrap":
        return [
            (folder / "box", limits.disk_mb * mb, limits.files),
            (folder / "tmp", limits.tmp_mb * mb, limits.files),
        ]
    return [(folder, limits.disk_mb * mb, limits.files)]


@functools.cache
def private_tmpfs(isolation: str) -> bool:
    """Whether a sandbox of ``isolation`` can get tmpfs of limited bytes and
    files (:func:`_mount_tmpfs`): a child mounts one and runs that backend's
    probe in it (bwrap: bubblewrap with the folder bound; rlimit: the same lock
    the worker gets). False where the system allows no mount or user namespace
    (macOS, some containers)."""
    folder = Path(tempfile.mkdtemp(prefix=f"{CGROUP_PREFIX}{os.getpid()}-"))
    user = (os.getuid(), os.getgid())

    def mount():  # pragma: no cover - runs in the child
        _mount_tmpfs([(folder, 2**20, 16)], None)
        if isolation == "rlimit" and user[0] != 0:
            _lock_mounts(user)

    command = [
        sys.executable,
        "-S",
        "-c",
        f"open({str(folder / 'x')!r}, 'w').write('x')",
    ]
    if isolation == "bwrap":
        command = [
            "bwrap",
            "--ro-bind",
            "/",
            "/",
            "--bind",
            str(folder),
            str(folder),
            "--unshare-all",
            "--uid",
            str(SANDBOX_UID),
            "--die-with-parent",
            *command,
        ]
    try:
        # PLW1509
        done = subprocess.run(
            command,
            capture_output=True,
            timeout=30,
            check=False,
            cwd="/",
            preexec_fn=mount,
        )  # noqa
        # written in the tmpfs, not in the folder
        return done.returncode == 0 and not (folder / "x").exists()
    except (OSError, subprocess.SubprocessError):
        return False
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def describe(limits: Limits) -> str:
    """What the isolation of a submission is, as every report names it."""
    memory = (
        f"{limits.memory_mb} MB of memory in total (cgroup)"
        if _cgroup_parents("memory")
        else f"{limits.memory_mb} MB of address space per process (no "
        "cgroup here)"
    )
    processes = f"{limits.processes} processes" + (
        " (cgroup)" if _cgroup_parents("pids") else " (RLIMIT_NPROC)"
    )
    files = (
        f"at most {limits.files} files each"
        if private_tmpfs(limits.isolation)
        else "files unlimited: no mount namespace here"
    )
    if limits.isolation == "bwrap":
        return (
            "bwrap: namespaces (no network, no files but the system's and "
            "the package's, read-only), "
            f"{memory}, {processes}, a {limits.disk_mb} MB folder and "
            f"{limits.tmp_mb} MB /tmp (tmpfs, {files})"
        )
    user = (
        "as nobody, "
        if unprivileged_user() is not None
        else "as the grader's user (root: nobody cannot run this Python), "
        if os.getuid() == 0
        else "as the grader's user, "
    )
    disk = (
        f"a {limits.disk_mb} MB folder (tmpfs, at most {limits.files} "
        f"files), elsewhere {limits.file_mb} MB "
        f"per file, not in total"
        if private_tmpfs(limits.isolation)
        else f"{limits.file_mb} MB per file, disk in total unlimited"
    )
    return (
        f"rlimit (weaker: {user}no namespaces: it can read what that user "
        f"can, use the network), {memory}, "
        f"{processes}, {disk}"
    )


def _package_root() -> Path:
    import attention_course

    return Path(attention_course.__file__).resolve().parents[1]


def _readonly_paths() -> list[str]:
    """What the sandbox may read: system folders, the Python installation,
    site-packages, the package."""
    paths = [
        "/usr",
        "/bin",
        "/sbin",
        "/lib",
        "/lib32",
        "/lib64",
        *ETC,
        sys.base_prefix,
        sys.prefix,
        str(Path(sys.executable).resolve().parents[1]),
        str(_package_root()),
    ]
    paths += [
        p for p in sys.path if p.endswith(("site-packages", "dist-packages"))
    ]
    paths += [str(folder)] if (folder := model_cache()) else []
    unique = []
    for p in paths:
        if p and os.path.exists(p) and p not in unique:
            unique.append(p)
    return unique


def model_cache() -> Path | None:
    """The de-quantised SmolLM2's cache folder
    (:func:`attention_course.model_cache.cache_folder`), where the grader's
    user has built it: read-only in the sandbox, named by
    ``ATTENTION_COURSE_CACHE``, so that a notebook that loads the model
    (capstone 2) reads it in about a second instead of de-quantising the wheel
    there (about 20 s of CPU and 513 MB written into a tmpfs of 512 MB). Under
    bwrap the sandbox's user is the grader's; under rlimit an unprivileged user
    may not be able to read it, and the notebook then fails to load the
    model."""
    folder = cache_folder()
    return folder if folder.is_dir() else None


def _environment(limits: Limits, home: str) -> dict:
    env = dict(KERNEL_ENV)
    env.update(
        {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": home,
            "TMPDIR": home,
            "LANG": "C.UTF-8",
            "PYTHONPATH": str(_package_root()),
            "PYTHONDONTWRITEBYTECODE": "1",
            "MPLBACKEND": "Agg",
            "MPLCONFIGDIR": home,
            "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
            "OPENBLAS_NUM_THREADS": "1",
            "CUDA_VISIBLE_DEVICES": "",
            # no GPU in here: a submission's Triton kernels (chapter 16) can
            # only run under Triton's interpreter, and Triton reads this when
            # it is first imported, whatever the notebook imports first
            "TRITON_INTERPRET": "1",
        }
    )
    if folder := model_cache():
        env["ATTENTION_COURSE_CACHE"] = str(folder.parent)
    return env


def _command(folder: Path | None, limits: Limits) -> tuple[list[str], dict]:
    """The worker's command and environment. Under rlimit in ``folder``; under
    bwrap in ``folder``'s ``box`` and ``tmp`` (tmpfs of limited bytes and
    files, :func:`_tmpfs_mounts`) bound to ``/sandbox`` and ``/tmp``, or, where
    the grader cannot mount those (``folder`` is None), in bubblewrap's own
    tmpfs, limited in bytes only."""
    worker = [
        sys.executable,
        "-s",
        "-B",
        "-P",
        "-m",
        "attention_course.course.worker",
    ]
    if limits.isolation != "bwrap":
        return worker + [str(folder)], _environment(limits, str(folder))
    mb = 2**20
    home, tmp = (
        (
            ["--bind", str(folder / "box"), SANDBOX_DIR],
            ["--bind", str(folder / "tmp"), "/tmp"],
        )
        if folder
        else (
            ["--size", str(limits.disk_mb * mb), "--tmpfs", SANDBOX_DIR],
            ["--size", str(limits.tmp_mb * mb), "--tmpfs", "/tmp"],
        )
    )
    # bwrap mounts in order: the private /tmp first, so that a Python or a
    # package that lives under /tmp (a clone in /tmp) is bound on top of it
    # instead of hidden by it
    cmd = ["bwrap", *tmp]
    for path in _readonly_paths():
        cmd += ["--ro-bind", path, path]
    cmd += [
        *home,
        "--chdir",
        SANDBOX_DIR,
        "--dev",
        "/dev",
        "--proc",
        "/proc",
        "--unshare-all",
        "--uid",
        str(SANDBOX_UID),
        "--gid",
        str(SANDBOX_UID),
        "--die-with-parent",
        "--new-session",
        "--clearenv",
    ]
    for key, value in _environment(limits, "/tmp").items():
        cmd += ["--setenv", key, value]
    return cmd + worker + [SANDBOX_DIR], {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin")
    }


CGROUP_PREFIX = "attention-grade-"


def _cgroup_parents(controller: str) -> list[Path]:
    """Where this process may make a cgroup with ``controller`` (``pids`` or
    ``memory``): v1 or v2."""
    found = []
    for parent in (
        Path("/sys/fs/cgroup") / controller,
        Path("/sys/fs/cgroup"),
    ):
        v2 = parent == Path("/sys/fs/cgroup")
        if (
            v2
            and controller
            not in _read(parent / "cgroup.subtree_control").split()
        ):
            continue
        if (parent / "cgroup.procs").exists() and os.access(parent, os.W_OK):
            found.append(parent)
            break
    return found


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _cgroups(limits: Limits) -> list[Path]:
    """Fresh cgroups for one sandbox, named after this process (so its parent
    can remove what a killed grader left): ``pids`` limited to
    ``limits.processes``, ``memory`` to ``limits.memory_mb`` (swap
    included)."""
    settings = {
        "pids": {"pids.max": limits.processes},
        "memory": {
            "memory.limit_in_bytes": limits.memory_mb * 2**20,
            "memory.max": limits.memory_mb * 2**20,
            "memory.memsw.limit_in_bytes": limits.memory_mb * 2**20,
            "memory.swap.max": 0,
        },
    }
    groups = []
    for controller, values in settings.items():
        for parent in _cgroup_parents(controller):
            try:
                group = Path(
                    tempfile.mkdtemp(
                        prefix=f"{CGROUP_PREFIX}{os.getpid()}-", dir=parent
                    )
                )
            except OSError:
                continue
            groups.append(group)
            for name, value in values.items():
                if (group / name).exists():
                    try:
                        (group / name).write_text(str(value))
                    except OSError:
                        pass
    return groups


def remove_cgroup(group: Path) -> None:
    """Kill every process in ``group`` and remove it (waiting, briefly, for the
    processes to be gone)."""
    for _ in range(200):
        pids = _read(group / "cgroup.procs").split()
        for pid in pids:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        try:
            group.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.01)


def remove_left_by(pid: int) -> None:
    """Remove the cgroups and rlimit folders that the grader process ``pid``
    made, after it ended (killed, its own cleanup could not run)."""
    for controller in ("pids", "memory"):
        for parent in _cgroup_parents(controller):
            for group in parent.glob(f"{CGROUP_PREFIX}{pid}-*"):
                remove_cgroup(group)
    for folder in Path(tempfile.gettempdir()).glob(f"{CGROUP_PREFIX}{pid}-*"):
        shutil.rmtree(folder, ignore_errors=True)


# prctl(2): the signal the kernel sends this process when its parent dies
PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when the grader that started it dies
    (bubblewrap's ``--die-with-parent`` does the same for the bwrap backend),
    so a killed grader leaves no worker behind."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")


# prctl(2): orphaned descendants are re-parented to this process, not to init
PR_SET_CHILD_SUBREAPER = 36


def adopt_orphans() -> None:
    """Make this process the subreaper of its descendants: a process that a
    submission starts in a new session (out of reach of the sandbox's
    process-group kill), whose parent then dies, becomes a child of this
    process instead of init's, so :func:`kill_adopted` can end it. The grader's
    command line calls this in each of its processes; it matters for the rlimit
    backend (bubblewrap's PID namespace already ends every process)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(
            ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed"
        )


def _children() -> list[int]:
    """The pids of this process's children (from /proc: field 4 of stat is the
    parent's pid)."""
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
    """SIGKILL and reap every child of this process but ``keep`` (the children
    it started on purpose), again while more orphans arrive (their own
    children, re-parented here as they die)."""
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


def _preexec(
    limits: Limits,
    cgroups: list[Path],
    user: int | None = None,
    mounts=(),
    folder: Path | None = None,
    way=(),
):
    parent = os.getpid()

    def apply():  # pragma: no cover - runs in the child between fork and exec
        for group in cgroups:
            (group / "cgroup.procs").write_text(str(os.getpid()))
        mb = 2**20
        cpu = int(limits.notebook_s) + 5
        rlimits = [
            (resource.RLIMIT_AS, limits.memory_mb * mb),
            (resource.RLIMIT_CPU, cpu),
            (resource.RLIMIT_FSIZE, limits.file_mb * mb),
            (resource.RLIMIT_CORE, 0),
        ]
        if not any(
            group.parent.name == "pids" or (group / "pids.max").exists()
            for group in cgroups
        ):
            rlimits.append(
                (resource.RLIMIT_NPROC, limits.processes + _processes_now())
            )
        for name, value in rlimits:
            resource.setrlimit(name, (value, value))
        if mounts:
            grader = (os.getuid(), os.getgid())
            _mount_tmpfs(list(mounts), user)
            if limits.isolation == "rlimit" and grader[0] != 0:
                _lock_mounts(grader)
        # rlimit as root: drop to an unprivileged user for good (no
        # capabilities: no unmount)
        if user is not None:
            if mounts:
                _open_the_way(list(way))
            _drop_privileges()
        if folder is not None:
            # the tmpfs now mounted there, not the folder under it
            os.chdir(folder)
        # last: the kernel clears it when the process changes its user
        _die_with_parent()
        if os.getppid() != parent:  # the grader died before that
            os._exit(1)

    return apply


def _processes_now() -> int:
    """RLIMIT_NPROC counts every process of the user: the limit is on top of
    those already running."""
    if os.getuid() == 0:
        return 0
    try:
        return sum(
            1
            for p in Path("/proc").iterdir()
            if p.name.isdigit() and p.stat().st_uid == os.getuid()
        )
    except OSError:
        return 4096


class SandboxError(Exception):
    """The sandbox did not answer: it died, timed out, or sent something
    malformed."""


class Sandbox:
    """One run of a submission's code cells in a sandbox, then calls to the
    objects its check cells name.

    ``cells``: ``[{"source": ..., "check": None}]`` for code cells and
        ``{"source": ..., "check": {"exercise": N,
    "exprs": [...]}}`` for check cells (``exprs``: the expressions whose values
        the check is given).
    """

    def __init__(self, cells: list[dict], limits: Limits, deadline: float):
        self.cells, self.limits, self.deadline = cells, limits, deadline
        self.proc: subprocess.Popen | None = None
        self.folder: Path | None = None
        self.cgroups: list[Path] = []
        self.closed = False

    def start(self) -> None:
        """Start the worker and send it the job; it runs the cells and stops at
        each check cell (see :meth:`next_event`). Its folder, named after this
        process, holds tmpfs limited in bytes and files where
        :func:`private_tmpfs` works (under bwrap its folder and /tmp, under
        rlimit its folder, owned by the unprivileged user when the grader runs
        as root); elsewhere bubblewrap's own tmpfs (bytes only) or, under
        rlimit, a plain folder on the disk."""
        if self.limits.isolation == "bwrap" and not bwrap_works():
            raise SandboxError(
                "bubblewrap is not available here: install it, or choose "
                "--isolation=rlimit"
            )
        user = (
            unprivileged_user() if self.limits.isolation == "rlimit" else None
        )
        mounted = private_tmpfs(self.limits.isolation)
        if self.limits.isolation == "rlimit" or mounted:
            self.folder = Path(
                tempfile.mkdtemp(prefix=f"{CGROUP_PREFIX}{os.getpid()}-")
            )
        mounts = _tmpfs_mounts(self.folder, self.limits) if mounted else []
        for path, _, _ in mounts:
            path.mkdir(exist_ok=True)
        if user is not None and not mounted:
            os.chown(self.folder, user, user)
        cmd, env = _command(self.folder, self.limits)
        self.cgroups = _cgroups(self.limits)
        # preexec_fn (limits, cgroups, user, mounts) is safe here: the command
        # line grades each notebook in a single-threaded child process of its
        # own.
        workdir = self.folder if self.limits.isolation == "rlimit" else None
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            cwd="/",
            env=env,
            start_new_session=True,
            close_fds=True,
            preexec_fn=_preexec(
                self.limits,
                self.cgroups,
                user,
                mounts,
                workdir,
                # PLW1509
                [*_readonly_paths(), str(self.folder)],
            ),
        )  # noqa
        job = json.dumps(
            {
                "cells": self.cells,
                "cell_s": self.limits.cell_s,
                "cell_wall_s": self.limits.cell_wall_s,
            }
        ).encode()
        self._send(
            {"op": wire.JOB}, {"job": np.frombuffer(job, dtype=np.uint8)}
        )

    def next_event(self) -> dict:
        """The worker's next report: ``{"op": wire.CHECK, "key": cell index,
        "objects": {expr: info}, "verdict":
        ...}`` at a check cell (answer its calls, then :meth:`resume`), or
        ``{"op": wire.DONE}``; SandboxError when the worker died or ran out of
        time. Its ``wire.OUTPUTS``: ``{cell key: outputs}`` of the cells run
        since the last report, cleaned (:func:`.wire.outputs_of`)."""
        header, arrays = self._read()
        if header.get("op") not in (wire.CHECK, wire.DONE) or not isinstance(
            header.get("objects", {}), dict
        ):
            self.close()
            raise SandboxError(
                "the submission's process sent an invalid report"
            )
        header[wire.OUTPUTS] = wire.outputs_of(arrays)
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
            return wire.read_message(
                self.proc.stdout.fileno(),
                deadline,
                self.limits.output_mb * 2**20,
            )
        except wire.WireError as err:
            self.close()
            raise SandboxError(str(err)) from None

    def call(
        self,
        key: str,
        expr: str,
        args: tuple,
        kwargs: dict,
        keep=None,
        observe=None,
    ):
        """The reply of the student's object ``expr`` (as it was at check cell
        ``key``, or a number the sandbox handed out since) called on ``args``:
        ``(header, arrays)``. ``keep``: see :func:`.wire.encode` (the grader's
        stand-ins for objects in the sandbox travel as references).
        ``observe``: the checker's observers to run the call inside
        (:func:`attention_course.checks.observe.remote_specs`); the reply's
        ``observed`` says what they saw."""
        arrays: dict = {}
        request = {
            "op": wire.CALL,
            "key": key,
            "expr": expr,
            "args": wire.encode(list(args), arrays, keep=keep),
            "kwargs": wire.encode(dict(kwargs), arrays, keep=keep),
        }
        if observe:
            request["observe"] = wire.encode(list(observe), arrays)
        return self._ask(request, arrays)

    def attribute(self, key: str, expr: str, name: str):
        """The reply with the attribute ``name`` of the object ``expr``:
        ``(header, arrays)``."""
        return self._ask(
            {"op": wire.GETATTR, "key": key, "expr": expr, "name": name}, {}
        )

    def _ask(self, request: dict, arrays: dict):
        """Send a request and read its reply. Raises SandboxError when there is
        no reply; anything that interrupts the wait (the check's own time
        limit) closes the sandbox, whose replies would otherwise be out of
        step."""
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
        for group in self.cgroups:
            remove_cgroup(group)
        self.cgroups = []
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
