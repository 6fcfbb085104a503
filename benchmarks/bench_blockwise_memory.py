"""Extra peak memory of causal attention vs T: naive (materialises (T, T)), blockwise, PyTorch SDPA.

Each (method, T) is measured in FRESH Python subprocesses, the smaller of 2 runs (allocator caches and earlier peaks
cannot leak from one measurement into the next; allocator noise only adds memory): each creates q, k, v (B=1, H=12,
T, Dh=64, fp32), runs the method once at a small size (so lazily allocated library buffers exist), resets the
kernel's peak-RSS counter (/proc/self/clear_refs) and records ``peak RSS during one call - RSS before the call``.
torch allocates outside Python, so tracemalloc would see nothing: resident memory is what counts.

Fitted: the growth exponent (slope of log(extra) vs log(T)) per method, ~2 for naive, ~1 for blockwise. Blockwise's
extra memory is O(T) (output, statistics) plus a constant set of tiles, which dominates at small T: its exponent is
fitted over T = 2048 ... 16384 too (blockwise and sdpa only beyond 4096; naive would need about 6 and 24 GiB).
Targets: at T=4096 blockwise uses >= 20x less extra memory than naive, and takes at most 1.5x naive's time
(timed in this process, interleaved).

Usage: python benchmarks/bench_blockwise_memory.py          (the child mode --child METHOD T is internal)
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import subprocess
import sys
from pathlib import Path

import common  # first: it sets OMP_WAIT_POLICY and the TF log level before torch or TensorFlow load
import torch
import torch.nn.functional as F

from attention_course.blockwise import blockwise_attention, naive_attention

B, H, DH = 1, 12, 64
SIZES = (512, 1024, 2048, 4096)
LONG_SIZES = (8192, 16384)  # blockwise and sdpa only: naive would need about 6 and 24 GiB
METHODS = ("naive", "blockwise", "sdpa")
MIN_MEMORY_RATIO = 20.0
MAX_TIME_RATIO = 1.5


def method(name: str):
    return {
        "naive": lambda q, k, v: naive_attention(q, k, v, is_causal=True),
        "blockwise": lambda q, k, v: blockwise_attention(q, k, v, is_causal=True),
        "sdpa": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
    }[name]


def inputs(t: int):
    g = torch.Generator().manual_seed(t)
    return tuple(torch.randn(B, H, t, DH, generator=g) for _ in range(3))


def child(name: str, t: int) -> None:
    """Measure one (method, T) and print a JSON line."""
    torch.set_num_threads(common.THREADS)
    fn = method(name)
    with torch.inference_mode():
        fn(*inputs(64))  # lazy library buffers, thread pools
        q, k, v = inputs(t)
        before = common.rss_bytes()
        reset = common.reset_peak_rss()
        out = fn(q, k, v)
        peak = common.peak_rss_bytes()
    del out
    print(json.dumps({"method": name, "T": t, "extra_bytes": max(0, peak - before), "hwm_reset": reset}))


def measure(name: str, t: int, runs: int = 2) -> int:
    """Smallest extra bytes over ``runs`` fresh subprocesses: the allocators' behaviour varies from run to run, and
    that noise only ever adds memory."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", name, str(t)]
    values = []
    for _ in range(runs):
        proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
        values.append(json.loads(proc.stdout.strip().splitlines()[-1])["extra_bytes"])
    return min(values)


def slope(ts, ys) -> float:
    """Least-squares slope of log(y) against log(T)."""
    xs, ys = [math.log(t) for t in ts], [math.log(max(y, 1)) for y in ys]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)


def linear_fit(ts, ys) -> tuple[float, float]:
    """Least-squares (a, b) of y = a + b * T."""
    mx, my = sum(ts) / len(ts), sum(ys) / len(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(ts, ys, strict=True)) / sum((x - mx) ** 2 for x in ts)
    return my - b * mx, b


def main(repeats: int = 3) -> dict:
    config = common.setup("bench_blockwise_memory", {"B": B, "H": H, "Dh": DH, "causal": True, "dtype": "float32"})
    q, k, v = inputs(300)
    expected = naive_attention(q.double(), k.double(), v.double(), is_causal=True)
    for name in METHODS:
        common.check(f"{name} vs float64 (T=300)", common.max_abs_diff(method(name)(q, k, v), expected), 1e-5)
    extra = {name: {} for name in METHODS}
    for t in SIZES + LONG_SIZES:
        for name in METHODS:
            if t in SIZES or name != "naive":
                extra[name][t] = measure(name, t)
        print(f"  measured T={t}: " + ", ".join(f"{n} {extra[n][t] / 2**20:.1f} MiB" for n in METHODS if t in extra[n]),
              flush=True)  # fmt: skip
    slopes = {name: slope(SIZES, [extra[name][t] for t in SIZES]) for name in METHODS}
    large = (SIZES[-2], SIZES[-1], *LONG_SIZES)
    measured_large = {name: [t for t in large if t in extra[name]] for name in METHODS}
    slopes_large = {name: slope(ts, [extra[name][t] for t in ts]) for name, ts in measured_large.items()}
    fits = {name: linear_fit(measured_large[name], [extra[name][t] for t in measured_large[name]])
            for name in ("blockwise", "sdpa")}
    headers = ["T", *(f"{n} extra MiB" for n in METHODS), "naive / blockwise"]
    rows = [[t, *(f"{extra[n][t] / 2**20:.1f}" if t in extra[n] else "not run" for n in METHODS),
             f"{extra['naive'][t] / max(extra['blockwise'][t], 1):.0f}x" if t in extra["naive"] else ""]
            for t in SIZES + LONG_SIZES]  # fmt: skip
    rows.append([f"growth exponent (fit, T={SIZES[0]}..{SIZES[-1]})", *(f"{slopes[n]:.2f}" for n in METHODS), ""])
    rows.append([f"growth exponent (fit, T={large[0]}..{large[-1]}; naive to {SIZES[-1]})",
                 *(f"{slopes_large[n]:.2f}" for n in METHODS), ""])  # fmt: skip
    rows.append([f"linear fit a + b*T (T={large[0]}..{large[-1]}): b bytes per token, a MiB", "",
                 *(f"b = {fits[n][1]:.0f}, a = {fits[n][0] / 2**20:.1f}" for n in ("blockwise", "sdpa")),
                 f"(output: {H * DH * 4} bytes per token)"])  # fmt: skip
    print()
    print(common.markdown_table(headers, rows))

    t_max = SIZES[-1]
    q, k, v = inputs(t_max)
    calls = {n: functools.partial(method(n), q, k, v) for n in METHODS}
    times = common.interleaved(calls, repeats=repeats, warmup=1)
    time_headers = ["method", f"fastest s (T={t_max})", "median s", "time / naive"]
    time_rows = [[n, f"{common.fastest(ts):.3f}", f"{common.median(ts):.3f}",
                  f"{common.fastest(ts) / common.fastest(times['naive']):.2f}"] for n, ts in times.items()]  # fmt: skip
    print()
    print(common.markdown_table(time_headers, time_rows))

    mem_ratio = extra["naive"][t_max] / max(extra["blockwise"][t_max], 1)
    time_ratio = common.fastest(times["blockwise"]) / common.fastest(times["naive"])
    targets = [
        [f"T={t_max}: naive extra / blockwise extra >= {MIN_MEMORY_RATIO:.0f}", f"{mem_ratio:.0f}x",
         common.verdict(mem_ratio >= MIN_MEMORY_RATIO)],
        [f"T={t_max}: blockwise time <= {MAX_TIME_RATIO} x naive", f"{time_ratio:.2f}",
         common.verdict(time_ratio <= MAX_TIME_RATIO)],
        [f"growth exponent naive (~2), T={SIZES[0]}..{SIZES[-1]} / blockwise (~1), T={large[0]}..{large[-1]}",
         f"{slopes['naive']:.2f} / {slopes_large['blockwise']:.2f}", "info"],
    ]  # fmt: skip
    print()
    print(common.markdown_table(["target", "measured", "result"], targets))
    common.save("bench_blockwise_memory", config, table={"headers": headers, "rows": rows},
                time_table={"headers": time_headers, "rows": time_rows}, targets=targets,
                extra_bytes=extra, slopes=slopes, slopes_large=slopes_large, linear_fits=fits)  # fmt: skip
    return {"extra": extra, "slopes": slopes}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", nargs=2, metavar=("METHOD", "T"))
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], int(args.child[1]))
    else:
        main(args.repeats)
