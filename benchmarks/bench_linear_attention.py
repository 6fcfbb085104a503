"""Chapter 17: the gated delta rule's chunked form against its token-by-token loop and against SDPA (CPU fp32).

Heads H=8, Dk=Dv=64, batch 1, T from 1k to 16k. The chunk size is chosen first, in the same run, for each form on
its own: the fastest of 16, 32, 64 and 128 tokens at T=4096, eager and compiled (the sweep is printed: smaller chunks
do fewer (L, L) products per token but take more sequential steps, each a few small kernels; the compiled step fuses
the elementwise work that makes large chunks costly in eager kernels; transformers' and flash-linear-attention's 64
suits a GPU's fused kernels). Candidates, timed side by side per T: the chunked form (``gated_delta_chunked``) in
PyTorch's eager kernels, the same with its per-group step compiled (``step=torch.compile(chunks_step)``: the
compiler fuses the step's elementwise work into fewer passes over memory, as a GPU kernel would; compiled once per
chunk size, before timing),
PyTorch's fused causal softmax attention (``scaled_dot_product_attention(is_causal=True)``) on the same q, k, v, and
(T <= 4096, it is slow) the recurrent loop (``gated_delta_recurrent``). Decoding one token at context 16k: one
delta-rule step on the fixed state against one query attending a 16k-token KV cache (SDPA), time and bytes kept per
sequence.

Threads: 2, with OpenMP's default wait policy (the other benchmarks set PASSIVE; see common.py).

Targets: the chunked form with its compiled step >= 10x faster than the loop at T=4096, and its time linear in T
(log-log fit exponent < 1.2); the eager chunked form's ratios are reported beside them, and the T at which the
compiled form overtakes SDPA causal (no target: it depends on the CPU). The eager form's ratios are also reported
on ONE torch thread by the CPU time of the timing thread (``time.thread_time``): the work each form does, which
other jobs on a shared machine disturb far less than wall time; with them, the loop against the chunked form's
matrix products and triangular solve alone (``products_floor``): the most the chunked form could gain over the
loop with PyTorch's eager kernels on one thread of this CPU, whatever its elementwise work.

Usage: python benchmarks/bench_linear_attention.py [--repeats N]
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import time

# OpenMP's default wait policy, not the other benchmarks' PASSIVE (common.py says why). Measured on this machine,
# idle, T=4096, chunks of 64: 94 ms on two passive threads, 57 ms on one thread, 32-35 ms on two default threads
os.environ["KEEP_OMP_WAIT_POLICY"] = "1"
import common  # noqa: E402  (before torch: it sets the TF log level, and OMP_WAIT_POLICY unless told to keep it)
import torch
import torch.nn.functional as F

from attention_course import linear_attention as la

H, D = 8, 64
CHUNK_SWEEP = (16, 32, 64, 128)
LENGTHS = (1024, 2048, 4096, 8192, 16384)
LOOP_LENGTHS = (1024, 4096)
DECODE_CONTEXT = 16384
MIN_LOOP_SPEEDUP, MAX_EXPONENT = 10.0, 1.2


def inputs(t: int, dtype=torch.float32, seed: int = 0):
    """q, k unit (1, H, T, D), v (1, H, T, D), beta in (0, 1), log_decay in (-0.1, 0) (a slow forget gate)."""
    g = torch.Generator().manual_seed(seed)
    q, k = la.normalize_qk(torch.randn(1, H, t, D, generator=g, dtype=dtype),
                           torch.randn(1, H, t, D, generator=g, dtype=dtype))
    v = torch.randn(1, H, t, D, generator=g, dtype=dtype)
    return q, k, v, torch.rand(1, H, t, generator=g, dtype=dtype), -0.1 * torch.rand(1, H, t, generator=g, dtype=dtype)


def exponent(lengths, times) -> float:
    """Slope of the least-squares line through (log T, log time)."""
    xs, ys = [math.log(t) for t in lengths], [math.log(s) for s in times]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)


def make_candidates(t: int, chunk: int, compiled_chunk: int, compiled_step) -> dict:
    """The timed calls at length t (the token loop only up to LOOP_LENGTHS: it is slow)."""
    q, k, v, beta, log_decay = inputs(t)
    candidates = {
        "chunked": lambda: la.gated_delta_chunked(q, k, v, beta, log_decay, chunk_size=chunk),
        "compiled": lambda: la.gated_delta_chunked(q, k, v, beta, log_decay, chunk_size=compiled_chunk,
                                                   step=compiled_step),
        "sdpa causal": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
    }
    if t in LOOP_LENGTHS:
        candidates["loop"] = lambda: la.gated_delta_recurrent(q, k, v, beta, log_decay)
    return candidates


def compile_step(chunk: int):
    """torch.compile(chunks_step) for groups of `chunk`-token chunks: (the compiled step, seconds to compile), its
    output checked against the float64 recurrence at T=1024 (every group of every T here has the same shape)."""
    compiled = torch.compile(la.chunks_step, dynamic=False)
    x = inputs(1024)
    start = time.perf_counter()
    with torch.inference_mode():
        out, state = la.gated_delta_chunked(*x, chunk_size=chunk, step=compiled)
    seconds = time.perf_counter() - start
    ref, ref_state = la.gated_delta_recurrent(*(t.double() for t in x))
    common.check("compiled step (float32) vs recurrent (float64), T=1024", common.max_abs_diff(out, ref), 1e-4)
    common.check("compiled step final state", common.max_abs_diff(state, ref_state), 1e-4)
    return compiled, seconds


def products_floor(t: int, chunk: int):
    """The chunked form's matrix products and triangular solve alone at length t, no elementwise work: a lower
    bound on its time with PyTorch's kernels. Per chunk and head: K K^T and Q K^T (L, D, L), the solve of the
    (L, L) system for 2D right-hand sides, K' S and K^T U (state pass), Q S and scores @ U (outputs)."""
    n = H * t // chunk
    x, xt, square = torch.randn(n, chunk, D), torch.randn(n, D, chunk), torch.randn(n, chunk, chunk)
    state, lower, rhs = torch.randn(n, D, D), square.tril(-1) * 0.1, torch.randn(n, chunk, 2 * D)

    def run():
        for _ in range(2):
            torch.bmm(x, xt)
        torch.linalg.solve_triangular(lower, rhs, upper=False, unitriangular=True)
        for _ in range(3):
            torch.bmm(x, state)
        torch.bmm(square, x)

    return run


def chunk_sweep(repeats: int) -> tuple[int, int, dict, list, float]:
    """Each form's fastest chunk size at T=4096, eager and compiled timed side by side: (eager chunk, compiled chunk,
    the compiled steps by chunk size, rows [chunk, eager fastest ms, compiled fastest ms], seconds the compiles
    took). Each form gets its own: on 2026-11-28 the eager sweep's fastest, 32 (by 4 %), gave the compiled step 8.7x
    the loop's speed; the run of 2026-11-26, at 64, gave 10.6x."""
    steps, compile_s = {}, 0.0
    for chunk in CHUNK_SWEEP:
        steps[chunk], seconds = compile_step(chunk)
        compile_s += seconds
    x = inputs(4096)
    candidates = {}
    for chunk in CHUNK_SWEEP:
        candidates["eager", chunk] = functools.partial(la.gated_delta_chunked, *x, chunk_size=chunk)
        candidates["compiled", chunk] = functools.partial(la.gated_delta_chunked, *x, chunk_size=chunk,
                                                          step=steps[chunk])
    fastest = {key: common.fastest(ts) for key, ts in common.interleaved(candidates, repeats=repeats + 2).items()}
    best = {form: min(CHUNK_SWEEP, key=lambda chunk: fastest[form, chunk]) for form in ("eager", "compiled")}
    rows = [[chunk, f"{fastest['eager', chunk] * 1e3:.1f}", f"{fastest['compiled', chunk] * 1e3:.1f}"]
            for chunk in CHUNK_SWEEP]
    return best["eager"], best["compiled"], steps, rows, compile_s


def cpu_times(repeats: int, chunk: int) -> dict:
    """{(form, T): fastest CPU seconds of one call} on one torch thread (the loop and the floor at T=4096)."""
    torch.set_num_threads(1)
    try:
        found = {}
        with torch.inference_mode():
            for t in LENGTHS:
                x = inputs(t)
                forms = {"chunked": functools.partial(la.gated_delta_chunked, *x, chunk_size=chunk)}
                if t == 4096:
                    forms["loop"] = functools.partial(la.gated_delta_recurrent, *x)
                    forms["products floor"] = products_floor(t, chunk)
                for name, fn in forms.items():
                    fn()  # warm-up
                    runs = []
                    for _ in range(repeats + 2):
                        start = time.thread_time()
                        fn()
                        runs.append(time.thread_time() - start)
                    found[name, t] = min(runs)
    finally:
        torch.set_num_threads(common.THREADS)
    return found


def decode(repeats: int, chunk: int) -> tuple[list, dict]:
    """One new token at context DECODE_CONTEXT: a delta step on the state vs SDPA over the KV cache."""
    q, k, v, beta, log_decay = inputs(DECODE_CONTEXT, seed=1)
    state = la.gated_delta_chunked(q, k, v, beta, log_decay, chunk_size=chunk)[1]  # the prompt, read once
    cache_k, cache_v = k.contiguous(), v.contiguous()
    q1, k1, v1, b1, g1 = (x[:, :, -1] for x in (q, k, v, beta, log_decay))

    def state_step():
        return la.read(la.delta_step(state, k1, v1, b1, g1), q1)

    def cache_step():
        return F.scaled_dot_product_attention(q1[:, :, None], cache_k, cache_v)

    times = common.interleaved({"state": state_step, "KV cache": cache_step}, repeats=20 * repeats, warmup=3)
    kept = {"state": state.numel() * 4, "KV cache": 2 * cache_k.numel() * 4}
    rows = [[name, f"{common.fastest(times[name]) * 1e3:.3f}", f"{common.median(times[name]) * 1e3:.3f}",
             f"{kept[name] / 2**20:.2f}"] for name in ("state", "KV cache")]
    ratio = common.fastest(times["KV cache"]) / common.fastest(times["state"])
    return rows, {"decode_speedup": ratio, "memory_ratio": kept["KV cache"] / kept["state"]}


def main(repeats: int = 3) -> dict:
    config = common.setup("bench_linear_attention", {"heads": H, "head_dim": D, "chunk sizes": CHUNK_SWEEP,
                                                     "lengths": LENGTHS})
    small = inputs(200, torch.float64)  # correctness first, in float64, at every chunk size
    ref, ref_state = la.gated_delta_recurrent(*small)
    for chunk in CHUNK_SWEEP:
        out, state = la.gated_delta_chunked(*small, chunk_size=chunk)
        common.check(f"chunked ({chunk}) vs recurrent (float64, T=200)", common.max_abs_diff(out, ref), 1e-10)
        common.check(f"chunked ({chunk}) vs recurrent final state", common.max_abs_diff(state, ref_state), 1e-10)

    chunk, compiled_chunk, steps, sweep_rows, compile_s = chunk_sweep(repeats)
    sweep_headers = ["chunk size (T=4096)", "chunked fastest ms", "compiled fastest ms"]
    print()
    print(common.markdown_table(sweep_headers, sweep_rows))
    print(f"\nchunk sizes for the rest of this run: {chunk} eager, {compiled_chunk} compiled")
    print(f"torch.compile(chunks_step) compiled {len(steps)} times in {compile_s:.0f} s (not part of any timed run)\n")
    compiled_step = steps[compiled_chunk]
    results, rows = {}, []
    for t in LENGTHS:
        times = common.interleaved(make_candidates(t, chunk, compiled_chunk, compiled_step),
                                   repeats=repeats if t in LOOP_LENGTHS else repeats + 2)
        ms = {name: common.fastest(ts) * 1e3 for name, ts in times.items()}
        results[t] = ms
        loop = ms.get("loop")
        rows.append([t, f"{ms['chunked']:.1f}", f"{ms['compiled']:.1f}", f"{ms['sdpa causal']:.1f}",
                     "-" if loop is None else f"{loop:.0f}", f"{ms['sdpa causal'] / ms['compiled']:.2f}",
                     "-" if loop is None else f"{loop / ms['chunked']:.1f}x",
                     "-" if loop is None else f"{loop / ms['compiled']:.1f}x"])
        print(f"  T={t}: " + ", ".join(f"{n} {v:.1f} ms" for n, v in ms.items()), flush=True)
    headers = ["T", f"chunked ({chunk}) ms", f"compiled ({compiled_chunk}) ms", "sdpa causal ms", "loop ms",
               "sdpa / compiled",
               "loop / chunked", "loop / compiled"]
    print()
    print(common.markdown_table(headers, rows))

    speedup = results[4096]["loop"] / results[4096]["compiled"]
    eager_speedup = results[4096]["loop"] / results[4096]["chunked"]
    slope = exponent(LENGTHS, [results[t]["compiled"] for t in LENGTHS])
    eager_slope = exponent(LENGTHS, [results[t]["chunked"] for t in LENGTHS])
    overtakes = next((t for t in LENGTHS if results[t]["compiled"] < results[t]["sdpa causal"]), None)
    cpu = cpu_times(repeats, chunk)
    cpu_speedup = cpu["loop", 4096] / cpu["chunked", 4096]
    cpu_slope = exponent(LENGTHS, [cpu["chunked", t] for t in LENGTHS])
    cpu_bound = cpu["loop", 4096] / cpu["products floor", 4096]
    print("\none thread, CPU time: " + ", ".join(f"{n} T={t} {s * 1e3:.1f} ms" for (n, t), s in cpu.items()))
    decode_rows, decode_stats = decode(repeats, chunk)
    decode_headers = [f"decode 1 token at context {DECODE_CONTEXT}", "fastest ms", "median ms", "MiB kept"]
    print()
    print(common.markdown_table(decode_headers, decode_rows))
    targets = [
        [f"chunked, compiled step, >= {MIN_LOOP_SPEEDUP:.0f}x faster than the loop at T=4096", f"{speedup:.1f}x",
         common.verdict(speedup >= MIN_LOOP_SPEEDUP)],
        [f"chunked, compiled step, time linear in T: log-log exponent < {MAX_EXPONENT}", f"{slope:.2f}",
         common.verdict(slope < MAX_EXPONENT)],
        ["chunked, eager: loop / chunked at T=4096 (reported)", f"{eager_speedup:.1f}x", "-"],
        ["chunked, eager: log-log exponent (reported)", f"{eager_slope:.2f}", "-"],
        ["one thread, CPU time: loop / chunked (eager) at T=4096 (reported)", f"{cpu_speedup:.1f}x", "-"],
        ["one thread, CPU time: loop / (the chunked form's products and solve alone) at T=4096 (reported)",
         f"{cpu_bound:.1f}x", "-"],
        ["one thread, CPU time: chunked (eager) log-log exponent (reported)", f"{cpu_slope:.2f}", "-"],
        ["T at which the compiled chunked form overtakes SDPA causal (reported)",
         "not within 16k" if overtakes is None else str(overtakes), "-"],
        [f"decode at {DECODE_CONTEXT}: KV cache time / state time (reported)", f"{decode_stats['decode_speedup']:.1f}x",
         "-"],
        [f"decode at {DECODE_CONTEXT}: KV cache bytes / state bytes (reported)",
         f"{decode_stats['memory_ratio']:.0f}x", "-"],
    ]  # fmt: skip
    print()
    print(common.markdown_table(["target", "measured", "result"], targets))
    common.save("bench_linear_attention", config, table={"headers": headers, "rows": rows},
                time_table={"headers": decode_headers, "rows": decode_rows},
                extra_tables=[{"headers": sweep_headers, "rows": sweep_rows}], targets=targets, chunk=chunk,
                compiled_chunk=compiled_chunk, compile_s=compile_s)
    return {"chunk": chunk, "speedup": speedup, "eager_speedup": eager_speedup, "exponent": slope,
            "compile_s": compile_s, "cpu_speedup": cpu_speedup,
            "cpu_exponent": cpu_slope, "overtakes": overtakes, **decode_stats}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    main(parser.parse_args().repeats)
