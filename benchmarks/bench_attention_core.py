"""The attention core softmax(q k^T / sqrt(Dh)) v alone, CPU fp32, H=12, Dh=64, T = 256 ... 4096.

Candidates:
  naive      attention_course.blockwise.naive_attention: matmul, softmax, matmul (materialises (T, T) scores)
  scratch    attention_course.scaled_dot_product_attention (the course's from-scratch function, returns weights)
  blockwise  attention_course.blockwise.blockwise_attention (tiles + online softmax, in plain PyTorch)
  sdpa       torch.nn.functional.scaled_dot_product_attention (PyTorch's fused CPU kernel)

Reported: fraction of the attainable peak (fastest large matmul, measured in the same rounds) counting useful
FLOPs only: 4*B*H*Dh per visible query-key pair, i.e. 4*B*H*T^2*Dh without a mask and 4*B*H*Dh*T(T+1)/2 causal.
B shrinks as T grows (8, 8, 4, 2, 1) to keep the run within a few minutes; large T get fewer repeats.

Usage: python benchmarks/bench_attention_core.py [--max-t 4096]
"""

from __future__ import annotations

import argparse

import common  # first: it sets OMP_WAIT_POLICY and the TF log level before torch or TensorFlow load
import torch
import torch.nn.functional as F

from attention_course import causal_mask, numpy_ref, scaled_dot_product_attention
from attention_course.blockwise import blockwise_attention, naive_attention

H, DH = 12, 64
SIZES = {256: (8, 5), 512: (8, 5), 1024: (4, 5), 2048: (2, 3), 4096: (1, 2)}  # T: (B, repeats)


def core_flops(b: int, h: int, t: int, dh: int, causal: bool) -> float:
    pairs = t * (t + 1) // 2 if causal else t * t
    return 4.0 * b * h * dh * pairs  # q k^T and weights @ v: 2 FLOPs per multiply-add each


def candidates(q, k, v, causal: bool) -> dict:
    t = q.shape[-2]
    mask = causal_mask(t) if causal else None
    return {
        "naive": lambda: naive_attention(q, k, v, is_causal=causal),
        "scratch": lambda: scaled_dot_product_attention(q, k, v, mask)[0],
        "blockwise": lambda: blockwise_attention(q, k, v, is_causal=causal),
        "sdpa": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
    }


def check_small() -> None:
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 3, 37, 16, generator=g) for _ in range(3))
    for causal in (False, True):
        mask = numpy_ref.causal_mask(37) if causal else None
        q64, k64, v64 = (t.double().numpy() for t in (q, k, v))
        ref, _ = numpy_ref.scaled_dot_product_attention(q64, k64, v64, mask)
        for name, fn in candidates(q, k, v, causal).items():
            label = f"{name}{' causal' if causal else ''} vs float64 reference"
            common.check(label, common.max_abs_diff(fn(), ref), 1e-5)


def main(max_t: int = 4096) -> dict:
    extra = {"H": H, "Dh": DH, "sizes (T: B, repeats)": SIZES, "dtype": "float32"}
    config = common.setup("bench_attention_core", extra)
    check_small()
    peak_fn, peak_flops = common.matmul_candidate()
    peak_times, measured = [], []
    for t, (b, repeats) in SIZES.items():
        if t > max_t:
            continue
        g = torch.Generator().manual_seed(t)
        q, k, v = (torch.randn(b, H, t, DH, generator=g) for _ in range(3))
        for causal in (False, True):
            cands = candidates(q, k, v, causal)
            with torch.inference_mode():
                expected = cands["sdpa"]()
                for name in ("naive", "blockwise"):  # the full-size outputs agree (scratch: same maths as naive)
                    label = f"T={t} {name}{' causal' if causal else ''} vs sdpa"
                    common.check(label, common.max_abs_diff(cands[name](), expected), 1e-4)
            cands["matmul peak"] = peak_fn
            times = common.interleaved(cands, repeats=repeats, warmup=1)
            peak_times += times.pop("matmul peak")
            measured.append((t, b, causal, times))
            del cands, expected
            print(f"  measured T={t} B={b} causal={causal}", flush=True)
    peak = peak_flops / min(peak_times) / 1e9
    print(f"\nattainable peak (fastest matmul, all rounds): {peak:.0f} GFLOP/s\n")
    names = ["naive", "scratch", "blockwise", "sdpa"]
    headers = ["T", "B", "causal", *(f"{n} (peak fraction)" for n in names), "sdpa fastest ms"]
    rows, results = [], []
    for t, b, causal, times in measured:
        flops = core_flops(b, H, t, DH, causal)
        fracs = {n: flops / common.fastest(times[n]) / 1e9 / peak for n in names}
        rows.append([t, b, "yes" if causal else "no", *(f"{fracs[n]:.2f}" for n in names),
                     f"{common.fastest(times['sdpa']) * 1e3:.1f}"])  # fmt: skip
        results.append({"T": t, "B": b, "causal": causal, "peak_fraction": fracs,
                        "fastest_s": {n: common.fastest(times[n]) for n in names},
                        "median_s": {n: common.median(times[n]) for n in names}})  # fmt: skip
    print(common.markdown_table(headers, rows))
    common.save("bench_attention_core", config, table={"headers": headers, "rows": rows}, peak_gflops=peak,
                results=results)
    return {"rows": rows}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-t", type=int, default=4096)
    main(parser.parse_args().max_t)
