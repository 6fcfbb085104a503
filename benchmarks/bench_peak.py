"""Attainable fp32 matmul peak on this machine (THREADS threads): the yardstick of every "fraction of peak".

Usage: python benchmarks/bench_peak.py
"""

from __future__ import annotations

import common  # first: it sets OMP_WAIT_POLICY and the TF log level before torch or TensorFlow load
import torch


def main() -> dict:
    config = common.setup("bench_peak")
    sizes = (1024, 2048, 3072, 4096)
    candidates, flops = {}, {}
    for n in sizes:
        candidates[f"matmul {n}"], flops[f"matmul {n}"] = common.matmul_candidate(n)
    # correctness: a matmul against float64
    a, b = torch.randn(64, 64), torch.randn(64, 64)
    common.check("fp32 matmul vs float64", common.max_abs_diff(a @ b, a.double() @ b.double()), 1e-4)
    times = common.interleaved(candidates, repeats=7, warmup=1)
    rows, results = [], {}
    for name, ts in times.items():
        best, med = flops[name] / common.fastest(ts) / 1e9, flops[name] / common.median(ts) / 1e9
        results[name] = {"fastest_gflops": best, "median_gflops": med}
        rows.append([name, f"{best:.0f}", f"{med:.0f}"])
    peak = max(r["fastest_gflops"] for r in results.values())
    print(common.markdown_table(["square fp32 matmul", "fastest GFLOP/s", "median GFLOP/s"], rows))
    print(f"\nattainable peak (fastest of all runs): {peak:.0f} GFLOP/s")
    common.save("bench_peak", config, table=rows, peak_gflops=peak)
    return {"peak_gflops": peak}


if __name__ == "__main__":
    main()
