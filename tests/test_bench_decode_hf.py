"""benchmarks/bench_decode_hf.py's step timer, which decides the paged decode step's verdict against Hugging Face:
one step is profiled for its aten ops and left out of the timings, and every other step that ran a forward pass is
timed. (Until 2026-11-28 it profiled every step from the 10th on, so that only 9 decode steps of each engine were
timed.)"""

import os
from pathlib import Path

import torch

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def test_one_step_is_profiled_and_every_other_step_that_ran_is_timed(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    environment = dict(os.environ)
    import bench_decode_hf as bench

    os.environ.clear()  # the benchmarks' `common` sets their environment when it loads: not the tests'
    os.environ.update(environment)
    record = []
    ran = [True] * 20 + [False]  # the last step finds nothing to run
    for forward in ran:
        bench.timed_steps(lambda forward=forward: bool((torch.ones(2) + 1).sum()) and forward, record)
    profiled = [r for r in record if isinstance(r, tuple)]
    timed = [r for r in record if not isinstance(r, tuple)]
    assert len(profiled) == 1 and profiled[0][0] == "ops" and profiled[0][1] >= 2  # an add and a sum at least
    assert record.index(profiled[0]) == bench.PROFILED_STEP
    assert len(timed) == 19 and all(t >= 0 for t in timed)
