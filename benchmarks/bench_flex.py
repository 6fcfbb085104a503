"""Compiled FlexAttention against SDPA given the explicit boolean mask: a sliding window as T grows, packed documents.

Chapter 15. Each mask is built once as a ``BlockMask`` (FlexAttention computes only the tiles that hold an allowed
pair) and once as the explicit (T, T) boolean mask that ``F.scaled_dot_product_attention`` reads for every pair.
Every candidate is first checked against the float64 reference at T=512; then, per T, the candidates are timed side
by side (interleaved rounds). Compiling costs time at every new T (``dynamic=False``: one kernel per shape); the
compile is done in the warm-up and reported separately, never in the timed runs.

Targets: at T=4096, window 256, compiled FlexAttention >= 4x faster than SDPA with the explicit mask; its time
roughly linear in T for a fixed window (log-log fit exponent < 1.3 over T=1024..16384); 8 packed documents of 512
tokens, causal inside each, >= 3x faster than SDPA with the dense document mask. SDPA with the explicit mask is
timed up to T=8192 only (its time grows as T^2: about 6 s a call at 16384). A GPU section runs when CUDA is there.

Usage: python benchmarks/bench_flex.py [--repeats N] [--max-t T]
"""

from __future__ import annotations

import argparse
import functools
import math
import time

import common  # first: it sets OMP_WAIT_POLICY and the TF log level before torch or TensorFlow load
import torch
import torch.nn.functional as F

from attention_course import flex, masks
from attention_course.blockwise import blockwise_attention, naive_attention

B, H, DH, WINDOW, DOCS = 1, 12, 64, 256, 8
SIZES = (1024, 2048, 4096, 8192, 16384)
SDPA_MAX_T = 8192
MIN_WINDOW_SPEEDUP, MAX_EXPONENT, MIN_DOCUMENT_SPEEDUP = 4.0, 1.3, 3.0


def inputs(t: int, device="cpu"):
    g = torch.Generator().manual_seed(t)
    return tuple(torch.randn(B, H, t, DH, generator=g).to(device) for _ in range(3))


def doc_ids(t: int) -> torch.Tensor:
    return torch.arange(t) // (t // DOCS)  # DOCS documents of t / DOCS tokens each


def mods(kind: str, t: int):
    """(mask_mod, explicit (T, T) mask) of the window or the packed documents."""
    if kind == "window":
        return flex.sliding_window(WINDOW, t), masks.sliding_window_mask(t, t, WINDOW)
    return flex.document(doc_ids(t)), masks.document_mask(doc_ids(t))


def candidates(kind: str, t: int, q, k, v, with_sdpa: bool = True, with_blockwise: bool = False) -> dict:
    mod, mask = mods(kind, t)
    bm = flex.block_mask(mod, t)
    out = {"flex compiled": functools.partial(flex.attention, q, k, v, block_mask=bm, compiled=True)}
    if with_sdpa:
        out["sdpa explicit mask"] = functools.partial(F.scaled_dot_product_attention, q, k, v, attn_mask=mask)
        out["sdpa causal"] = functools.partial(F.scaled_dot_product_attention, q, k, v, is_causal=True)
    if with_blockwise:
        out["blockwise (ch. 9)"] = functools.partial(blockwise_attention, q, k, v, mask=mask, is_causal=True)
    return out


def check_correct() -> None:
    t = 512
    q, k, v = inputs(t)
    for kind in ("window", "document"):
        _, mask = mods(kind, t)
        ref = naive_attention(q.double(), k.double(), v.double(), mask=mask)
        for name, fn in candidates(kind, t, q, k, v, with_blockwise=True).items():
            if name != "sdpa causal":
                common.check(f"{kind}: {name} vs float64 (T={t})", common.max_abs_diff(fn(), ref), 1e-5)


def compile_seconds(fn) -> float:
    start = time.perf_counter()
    with torch.inference_mode():
        fn()
    return time.perf_counter() - start


def time_row(kind: str, t: int, repeats: int, **options) -> tuple[dict, float]:
    calls = candidates(kind, t, *inputs(t), **options)
    compiled = compile_seconds(calls["flex compiled"])
    times = common.interleaved(calls, repeats=repeats, warmup=1)
    fast = {name: common.fastest(ts) for name, ts in times.items()}
    print(f"  {kind} T={t}: " + ", ".join(f"{n} {s * 1e3:.0f} ms" for n, s in fast.items())
          + f" (first call with compile {compiled:.1f} s)", flush=True)
    return fast, compiled


def slope(ts, ys) -> float:
    """Least-squares slope of log(y) against log(T)."""
    xs, ys = [math.log(t) for t in ts], [math.log(y) for y in ys]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)


def gpu_section(repeats: int) -> list[list]:
    """The window at T=4096 on CUDA, when there is one (never required)."""
    t = 4096
    q, k, v = inputs(t, "cuda")
    mod, mask = mods("window", t)
    bm = torch.nn.attention.flex_attention.create_block_mask(mod, None, None, t, t, device="cuda")
    fn = torch.compile(torch.nn.attention.flex_attention.flex_attention, dynamic=False)
    calls = {"flex compiled (cuda)": lambda: fn(q, k, v, block_mask=bm),
             "sdpa explicit mask (cuda)": lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask.cuda())}
    diff = common.max_abs_diff(calls["flex compiled (cuda)"]().cpu(), calls["sdpa explicit mask (cuda)"]().cpu())
    common.check("cuda: flex vs sdpa explicit mask (T=4096)", diff, 1e-3)

    def synced(f):
        return lambda: (f(), torch.cuda.synchronize())

    times = common.interleaved({n: synced(f) for n, f in calls.items()}, repeats=repeats, warmup=2)
    return [[n, f"{common.fastest(ts) * 1e3:.2f}"] for n, ts in times.items()]


def main(repeats: int = 3, max_t: int = SIZES[-1]) -> None:
    config = common.setup("bench_flex", {"B": B, "H": H, "Dh": DH, "window": WINDOW, "documents": DOCS,
                                         "dtype": "float32", "block_size": 128, "max_T": max_t})
    if flex.compiled_unsupported_reason():
        raise SystemExit(f"compiled FlexAttention cannot run here: {flex.compiled_unsupported_reason()}")
    check_correct()
    sizes = [t for t in SIZES if t <= max_t]
    rows, flex_times, compiles, window_at = [], [], [], {}
    for t in sizes:
        fast, compiled = time_row("window", t, repeats, with_sdpa=t <= SDPA_MAX_T, with_blockwise=t == 4096)
        flex_times.append(fast["flex compiled"])
        compiles.append(compiled)
        window_at[t] = fast
        sdpa = fast.get("sdpa explicit mask")
        rows.append([f"window {WINDOW}", t, f"{fast['flex compiled'] * 1e3:.0f}",
                     f"{sdpa * 1e3:.0f}" if sdpa else "not run", f"{fast['sdpa causal'] * 1e3:.0f}"
                     if "sdpa causal" in fast else "not run",
                     f"{fast['blockwise (ch. 9)'] * 1e3:.0f}" if "blockwise (ch. 9)" in fast else "",
                     f"{sdpa / fast['flex compiled']:.1f}x" if sdpa else "", f"{compiled:.0f}"])
    doc, doc_compile = time_row("document", 4096, repeats)
    doc_speedup = doc["sdpa explicit mask"] / doc["flex compiled"]
    rows.append([f"{DOCS} documents, causal", 4096, f"{doc['flex compiled'] * 1e3:.0f}",
                 f"{doc['sdpa explicit mask'] * 1e3:.0f}", f"{doc['sdpa causal'] * 1e3:.0f}", "",
                 f"{doc_speedup:.1f}x", f"{doc_compile:.0f}"])
    headers = ["mask", "T", "flex compiled ms", "sdpa explicit mask ms", "sdpa causal ms", "blockwise (ch. 9) ms",
               "sdpa mask / flex", "first call (compile) s"]
    print()
    print(common.markdown_table(headers, rows))

    exponent = slope(sizes, flex_times)
    w = window_at[4096]
    window_speedup = w["sdpa explicit mask"] / w["flex compiled"]
    targets = [
        [f"T=4096, window {WINDOW}: sdpa explicit mask / flex compiled >= {MIN_WINDOW_SPEEDUP:.0f}",
         f"{window_speedup:.1f}x", common.verdict(window_speedup >= MIN_WINDOW_SPEEDUP)],
        [f"window {WINDOW}: growth exponent of flex compiled, T={sizes[0]}..{sizes[-1]}, < {MAX_EXPONENT}",
         f"{exponent:.2f}", common.verdict(exponent < MAX_EXPONENT)],
        [f"T=4096, {DOCS} documents: sdpa dense mask / flex compiled >= {MIN_DOCUMENT_SPEEDUP:.0f}",
         f"{doc_speedup:.1f}x", common.verdict(doc_speedup >= MIN_DOCUMENT_SPEEDUP)],
    ]
    print()
    print(common.markdown_table(["target", "measured", "result"], targets))
    results = {"table": {"headers": headers, "rows": rows}, "targets": targets, "exponent": exponent,
               "compile_seconds": dict(zip(sizes, compiles, strict=True))}
    if torch.cuda.is_available():  # pragma: no cover - no GPU on the course's machines
        gpu = gpu_section(repeats)
        results["time_table"] = {"headers": ["candidate (cuda, T=4096, window 256)", "fastest ms"], "rows": gpu}
        print(common.markdown_table(results["time_table"]["headers"], gpu))
    common.save("bench_flex", config, **results)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-t", type=int, default=SIZES[-1])
    args = parser.parse_args()
    main(args.repeats, args.max_t)
