"""Run a function on P processes that form a ``torch.distributed`` process
group, and collect what they return.

``launch(fn, world_size, *args)`` starts P fresh Python processes (forked from
a clean server process:
nothing is shared with the caller), joins them in a process group on a free
local port (the gloo backend, for CPUs, unless ``backend`` says otherwise),
calls ``fn(rank, world_size, *args)`` in each, and returns the P results in
rank order. ``fn`` must be importable (a function of a module, not of a
notebook): every rank imports it by name. ``start_method="fork"`` instead
copies the caller into each rank, so that a function or class defined in a
notebook reaches the ranks too (Linux and macOS only). As with any
``multiprocessing`` program, a script calls ``launch`` under ``if __name__ ==
"__main__":``.

Only gloo is tested here. NCCL (GPUs) is a ``backend`` argument away, but it is
untested in this course, and it only accepts CUDA tensors: the rank programs of
this package build CPU tensors, and would have to move them to their rank's GPU
first.

Distributed code hangs instead of failing: a rank that never reaches a
collective leaves the others waiting. Two timeouts turn a hang into an error:
the process group's own (a collective that waits longer raises in the waiting
rank) and a wall-clock limit on the whole launch, after which every rank still
running is killed and :class:`TimeoutError` names them. A rank that raises
makes the launch raise too, naming the rank.
"""

from __future__ import annotations

import datetime
import os
import pickle
import socket
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ..validation import check_world_size

# Errors a rank raises for bad input (or code not written yet) keep their type
# in the caller; anything else becomes a RuntimeError.
_KEPT_ERRORS = {
    "ValueError": ValueError,
    "TypeError": TypeError,
    "NotImplementedError": NotImplementedError,
}


def free_port() -> int:
    """A TCP port that is free on this machine now (the OS picks it when
    binding port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _rank_main(
    rank: int,
    world_size: int,
    port: int,
    group_timeout: float,
    result_dir: str,
    fn,
    args,
    backend: str = "gloo",
) -> None:
    """The body of one rank: join the group, run fn, write its result (or its
    error) to ``rank<r>.pkl``."""
    torch.set_num_threads(1)  # P ranks share the machine's cores
    outcome: dict = {}
    try:
        dist.init_process_group(
            backend,
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(seconds=group_timeout),
        )
        outcome["result"] = fn(rank, world_size, *args)
    # reported to the caller, who raises it
    except BaseException as err:  # noqa: BLE001
        outcome["error"] = (
            type(err).__name__,
            str(err),
            traceback.format_exc(),
        )
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    with open(Path(result_dir) / f"rank{rank}.pkl", "wb") as f:
        pickle.dump(outcome, f)


def _context(fn: Callable, start_method: str):
    """``"fork"``: each rank is a copy of the caller (it sees what the caller
    defined, a notebook's classes included). ``"forkserver"``: processes are
    forked from a server process that has imported torch and the module of
    ``fn`` (the program every rank runs) once, so that a launch costs
    milliseconds instead of a torch import per rank; they share nothing with
    the caller. The server starts at the first launch: later launches reuse its
    imports."""
    if start_method == "fork":
        return mp.get_context("fork")
    ctx = mp.get_context("forkserver")
    # symbolic_shapes (and sympy) is imported lazily by the first custom
    # autograd Function: seconds per rank
    preload = [
        "torch",
        "torch.distributed",
        "torch.fx.experimental.symbolic_shapes",
    ]
    ctx.set_forkserver_preload([*preload, fn.__module__])
    return ctx


START_METHODS = ("forkserver", "fork")


def _check_launch_args(
    fn, world_size, timeout, group_timeout, backend, start_method
) -> None:
    if not callable(fn):
        raise TypeError(f"fn must be a function, got {type(fn).__name__}")
    check_world_size(world_size)
    if not isinstance(backend, str):
        raise TypeError(
            "backend must be a str such as 'gloo', got "
            f"{type(backend).__name__}"
        )
    if not dist.is_backend_available(backend):
        raise ValueError(
            f"backend={backend!r} is not available in this PyTorch build "
            "(gloo is, on every CPU)"
        )
    if start_method not in START_METHODS:
        raise ValueError(
            f"start_method must be one of {START_METHODS}, got "
            f"{start_method!r}"
        )
    for name, value in (
        ("timeout", timeout),
        ("group_timeout", group_timeout),
    ):
        if not value > 0:
            raise ValueError(f"{name} must be > 0 seconds, got {value}")


def launch(
    fn: Callable,
    world_size: int,
    *args,
    timeout: float = 60.0,
    group_timeout: float | None = None,
    backend: str = "gloo",
    start_method: str = "forkserver",
) -> list:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` ranks; return the
    results in rank order.

    Args:
        fn: a module-level function (each process imports it; any function with
            ``start_method="fork"``); its result must be picklable (tensors
            are).
        world_size: P, the number of processes.
        timeout: wall-clock limit in seconds for the whole launch (start-up
            included).
        group_timeout: limit of the process group's collectives and
            point-to-point waits (default: ``timeout``).
        backend: the ``torch.distributed`` backend; only ``"gloo"`` (CPU) is
            tested in this course.
        start_method: ``"forkserver"`` (fresh processes that import ``fn``) or
            ``"fork"`` (copies of the caller).

    Raises:
        TimeoutError: some rank had not finished after ``timeout`` seconds (all
            ranks are then killed).
        ValueError, TypeError, NotImplementedError: a rank raised one;
        RuntimeError: a rank raised anything else or died. Each message names
        the rank.
    """
    group_timeout = timeout if group_timeout is None else group_timeout
    _check_launch_args(
        fn, world_size, timeout, group_timeout, backend, start_method
    )
    ctx = _context(fn, start_method)
    with tempfile.TemporaryDirectory(
        prefix="attention_course_dist_"
    ) as result_dir:
        port = free_port()
        saved = os.environ.get("OMP_NUM_THREADS")
        # read when a child imports torch: one thread per rank
        os.environ["OMP_NUM_THREADS"] = "1"
        try:
            procs = [
                ctx.Process(
                    target=_rank_main,
                    args=(
                        r,
                        world_size,
                        port,
                        group_timeout,
                        result_dir,
                        fn,
                        args,
                        backend,
                    ),
                )
                for r in range(world_size)
            ]
            for p in procs:
                p.start()
        finally:
            if saved is None:
                del os.environ["OMP_NUM_THREADS"]
            else:
                os.environ["OMP_NUM_THREADS"] = saved
        _wait(procs, timeout)
        return [_result(rank, p, result_dir) for rank, p in enumerate(procs)]


def _wait(procs: list, timeout: float) -> None:
    """Wait for every process until the deadline; then kill the ones still
    running and raise TimeoutError."""
    deadline = time.monotonic() + timeout
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    hung = [rank for rank, p in enumerate(procs) if p.is_alive()]
    if not hung:
        return
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
    ranks = ", ".join(map(str, hung))
    raise TimeoutError(
        f"rank {ranks} did not finish within timeout={timeout:g} s "
        "(killed): a rank that never reaches a "
        "collective, or a send without a matching receive, leaves the "
        "others waiting"
    )


def _result(rank: int, proc, result_dir: str):
    """What rank ``rank`` returned, or raise its error (naming the rank)."""
    path = Path(result_dir) / f"rank{rank}.pkl"
    if not path.exists():
        raise RuntimeError(
            f"rank {rank} died without a result (exit code "
            f"{proc.exitcode}); its error output is "
            "above. In a script, call launch under `if __name__ == "
            '"__main__":` (each process '
            "imports the main module)"
        )
    with open(path, "rb") as f:
        outcome = pickle.load(f)
    if "error" in outcome:
        name, message, trace = outcome["error"]
        raise _KEPT_ERRORS.get(name, RuntimeError)(
            f"rank {rank} raised {name}: {message}\n{trace}"
        )
    return outcome["result"]
