"""What a step costs in memory: the peak bytes a function allocates, from
torch.profiler's memory events."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch


def allocated_peak(fn: Callable[[], object]) -> int:
    """Peak bytes allocated by ``fn`` above what was allocated when it started
    (CPU tensors).

    torch.profiler records, for every op, the bytes it allocates minus those it
    frees itself; summed in the order the ops start, they trace the memory
    ``fn`` holds, op by op (a buffer an op frees before it returns does not
    count). Deterministic for given shapes: no clock is involved.
    """
    activities = [torch.profiler.ProfilerActivity.CPU]
    with (
        quiet_stderr(),
        torch.profiler.profile(
            activities=activities, profile_memory=True
        ) as prof,
    ):
        fn()
    live = peak = 0
    for event in sorted(prof.events(), key=lambda e: e.time_range.start):
        live += event.self_cpu_memory_usage
        peak = max(peak, live)
    return peak


@contextmanager
def quiet_stderr() -> Iterator[None]:
    """Silence file descriptor 2 (the profiler's native start/stop lines,
    stamped with the time) for a block."""
    sys.stderr.flush()
    saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)
