"""Shared helpers of the course's benchmarks: configuration, attainable peak, interleaved timing, results.

Method (every script): print the configuration, check the outputs against the float64 reference at a small
size, then time the candidates side by side in one process: warm-up, then rounds in which every candidate
runs once (the order rotates from round to round, so a burst of load on the shared machine hits all of them),
reporting the fastest and the median run of each. Fractions of peak use *useful* FLOPs only (a causal
attention core counts only the visible query-key pairs) against the fastest of several large matmuls measured
in the same rounds.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import re
import resource
import statistics
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

# torch's OpenMP threads busy-wait at every barrier; on a shared 2-core machine a descheduled spinning
# thread turns a 2 ms step into 100 ms. Passive waiting keeps timings sane (set before torch loads). A script timing
# hundreds of small kernels per call sets KEEP_OMP_WAIT_POLICY before importing this module and keeps OpenMP's
# default (spin briefly, then sleep), as every PyTorch program runs: passive threads are woken for each kernel, and
# the wake-ups then cost more than the kernels (chapter 17's chunked form: slower on two threads than on one).
if not os.environ.get("KEEP_OMP_WAIT_POLICY"):
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch

from attention_course.course.kernel import use_kernel_environment  # noqa: E402

use_kernel_environment()  # the notebooks' settings (TensorFlow quiet and without oneDNN), before Keras loads

THREADS = 2
_STARTED = time.perf_counter()
RESULTS_DIR = Path(__file__).resolve().parent / "results"


# ---------------------------------------------------------------- configuration


def cpu_model() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:  # pragma: no cover - not Linux
        return platform.processor() or "unknown"
    match = re.search(r"^model name\s*:\s*(.+)$", text, re.M)
    return match.group(1).strip() if match else "unknown"


def version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def setup(name: str, extra: dict | None = None) -> dict:
    """Fix the thread count, print and return the configuration of this run."""
    torch.set_num_threads(THREADS)
    torch.manual_seed(0)
    config = {
        "benchmark": name,
        "date": _dt.datetime.now().strftime("%Y-%m-%d %H:%M"),
        "cpu": cpu_model(),
        "logical_cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "default (spin briefly, then sleep)"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": version("numpy"),
        "tensorflow": version("tensorflow-cpu") if version("tensorflow") == "not installed" else version("tensorflow"),
        "keras": version("keras"),
        "load_average": " ".join(f"{x:.1f}" for x in os.getloadavg()),
    }
    config.update(extra or {})
    print(f"== {name} ==")
    for key, value in config.items():
        if key != "benchmark":
            print(f"  {key:16s} {value}")
    print(flush=True)
    return config


# ---------------------------------------------------------------- timing


def time_once(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def interleaved(candidates: dict[str, Callable[[], object]], repeats: int, warmup: int = 1,
                inference: bool = True) -> dict[str, list[float]]:
    """Run every candidate ``warmup`` times, then ``repeats`` rounds of one run each (rotating order).

    Under ``torch.inference_mode()`` unless ``inference`` is False (training steps need autograd).
    Returns {name: [seconds of each timed run]}.
    """
    names = list(candidates)
    with torch.inference_mode(inference):
        for _ in range(warmup):
            for name in names:
                candidates[name]()
        times: dict[str, list[float]] = {name: [] for name in names}
        for r in range(repeats):
            order = names[r % len(names) :] + names[: r % len(names)]
            for name in order:
                times[name].append(time_once(candidates[name]))
    return times


def fastest(ts: list[float]) -> float:
    return min(ts)


def median(ts: list[float]) -> float:
    return statistics.median(ts)


# ---------------------------------------------------------------- attainable peak


def matmul_candidate(n: int = 3072) -> tuple[Callable[[], object], float]:
    """A large fp32 matmul (callable, FLOPs) to measure the attainable peak next to other candidates."""
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(n, n, generator=g), torch.randn(n, n, generator=g)
    out = torch.empty(n, n)
    return (lambda: torch.matmul(a, b, out=out)), 2.0 * n**3


def attainable_peak(n: int = 3072, repeats: int = 7) -> float:
    """Attainable fp32 GFLOP/s: the fastest of ``repeats`` (n, n) @ (n, n) matmuls on THREADS threads."""
    fn, flops = matmul_candidate(n)
    times = interleaved({"matmul": fn}, repeats=repeats, warmup=1)["matmul"]
    return flops / fastest(times) / 1e9


# ---------------------------------------------------------------- memory


def rss_bytes() -> int:
    """Current resident set size of this process."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS counter (VmHWM) to the current RSS; False if not possible here."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:  # pragma: no cover - older kernels / restricted containers
        return False


def peak_rss_bytes() -> int:
    """Peak resident set size since the start (or the last :func:`reset_peak_rss`)."""
    try:
        text = Path("/proc/self/status").read_text()
        return int(re.search(r"VmHWM:\s+(\d+)\s+kB", text).group(1)) * 1024
    except (OSError, AttributeError):  # pragma: no cover
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


# ---------------------------------------------------------------- reporting


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def markdown_table(headers: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def save(name: str, config: dict, **results) -> Path:
    """Write benchmarks/results/<name>.json (read by run_all.py to regenerate README.md)."""
    RESULTS_DIR.mkdir(exist_ok=True)
    path = RESULTS_DIR / f"{name}.json"
    elapsed = round(time.perf_counter() - _STARTED, 1)
    path.write_text(json.dumps({"config": config, "elapsed_s": elapsed, **results}, indent=1, default=str) + "\n")
    print(f"\nresults written to benchmarks/results/{path.name}")
    return path


def max_abs_diff(a, b) -> float:
    import numpy as np

    a = a.detach().double().numpy() if isinstance(a, torch.Tensor) else np.asarray(a)
    b = b.detach().double().numpy() if isinstance(b, torch.Tensor) else np.asarray(b)
    return float(np.abs(a - b).max())


def check(label: str, diff: float, tol: float) -> None:
    """Print a correctness check; raise if it fails (a benchmark of wrong code measures nothing)."""
    print(f"  check {label:56s} max |diff| = {diff:.1e}  (< {tol:.0e}: {diff < tol})")
    if not diff < tol:
        raise SystemExit(f"correctness check failed: {label}")
