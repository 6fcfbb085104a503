"""Chapter 16's FlashAttention kernels (Triton) against SDPA's flash backend, on a CUDA GPU (not run in CI).

For bf16 and fp16, B=8, H=16, Dh in (64, 128), T = 1024 ... 16384, causal and not: TFLOP/s of the forward and of
forward + backward, for the course's kernels (``attention_course.flash_triton.flash_attention``) and for
``F.scaled_dot_product_attention`` restricted to ``SDPBackend.FLASH_ATTENTION``, measured in the same process, and
the course's forward as a fraction of the GPU's dense peak (a large matmul in the same dtype, measured here).
Useful FLOPs: 4·B·H·Dh per visible query-key pair (T² without a mask, T(T+1)/2 causal) for the forward, 2.5 times
that for the backward (five matmuls instead of two). Targets, ratios of one run: forward >= 0.7x SDPA, forward +
backward >= 0.5x SDPA (the geometric mean over the shapes).

Every shape is first checked against SDPA (fp32 reference) at a small size; times are the median of
``triton.testing.do_bench``. Writes ``benchmarks/results/bench_triton.json``, which chapter 16 reads (it never times
anything itself). Without a CUDA GPU the script says so and exits 0.

Usage: python benchmarks/bench_triton.py [--quick]   (--quick: T up to 4096, Dh 64 only); ``benchmarks/gpu_check.py``
runs it after checking the kernels on the GPU.
"""

from __future__ import annotations

import argparse
import math
import sys

import common  # first: it sets OMP_WAIT_POLICY and the TF log level before torch loads
import torch
import torch.nn.functional as F

B, H = 8, 16
HEAD_DIMS = (64, 128)
SIZES = (1024, 2048, 4096, 8192, 16384)
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
FORWARD_TARGET, TRAINING_TARGET = 0.7, 0.5


def flops(t: int, dh: int, causal: bool) -> float:
    pairs = t * (t + 1) / 2 if causal else t * t
    return 4.0 * B * H * dh * pairs


def check_small(ft, dtype) -> None:
    """Outputs and gradients of the kernels against SDPA in float32, at a small size, before any timing."""
    g = torch.Generator(device="cuda").manual_seed(0)
    for causal in (False, True):
        q, k, v, do = (torch.randn(2, 3, 300, 64, device="cuda", generator=g) for _ in range(4))
        leaves = [x.to(dtype).requires_grad_() for x in (q, k, v)]
        out = ft.flash_attention(*leaves, is_causal=causal)
        out.backward(do.to(dtype))
        ref_leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        ref = F.scaled_dot_product_attention(*ref_leaves, is_causal=causal)
        ref.backward(do)
        pairs = [(out, ref)] + [(a.grad, b.grad) for a, b in zip(leaves, ref_leaves, strict=True)]
        relative = max(common.max_abs_diff(a.float().cpu(), b.cpu()) / b.abs().max().item() for a, b in pairs)
        common.check(f"{dtype} causal={causal} output, gradients vs SDPA fp32 (relative)", relative, 2e-2)


def peak_tflops(dtype, bench) -> float:
    a, b = (torch.randn(8192, 8192, device="cuda", dtype=dtype) for _ in range(2))
    return 2 * 8192**3 / (bench(lambda: a @ b) * 1e-3) / 1e12


def measure(ft, dtype, dh, t, causal, bench) -> dict:
    q, k, v, do = (torch.randn(B, H, t, dh, device="cuda", dtype=dtype) for _ in range(4))
    leaves = [x.requires_grad_() for x in (q, k, v)]
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def sdpa():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(*leaves, is_causal=causal)

    def ours():
        return ft.flash_attention(*leaves, is_causal=causal)

    result = {}
    for name, fn in (("ours", ours), ("sdpa", sdpa)):
        with torch.no_grad():
            forward_ms = bench(fn)
        out = fn()
        backward_ms = bench(lambda out=out: out.backward(do, retain_graph=True))
        for x in leaves:
            x.grad = None
        result[name] = (forward_ms, forward_ms + backward_ms)
    return result


def main(argv: list[str] | None = None) -> None:
    """The command line (``argv``: its arguments; None: sys.argv), or ``benchmarks/gpu_check.py``'s call."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_triton needs a CUDA GPU (the kernels are compiled by Triton for it); none here: nothing to do.")
        return
    import triton
    import triton.testing

    from attention_course import flash_triton as ft

    gpu = torch.cuda.get_device_name()
    config = common.setup("bench_triton", {"gpu": gpu, "triton": triton.__version__, "B": B, "H": H})

    def bench(fn):
        return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")

    sizes = SIZES[:3] if args.quick else SIZES
    head_dims = HEAD_DIMS[:1] if args.quick else HEAD_DIMS
    rows, fwd_ratios, train_ratios = [], [], []
    for label, dtype in DTYPES.items():
        check_small(ft, dtype)
        peak = peak_tflops(dtype, bench)
        print(f"  {label} matmul 8192: {peak:.0f} TFLOP/s", flush=True)
        for dh in head_dims:
            for causal in (False, True):
                for t in sizes:
                    r = measure(ft, dtype, dh, t, causal, bench)
                    work = flops(t, dh, causal)
                    tf = {name: (work / (f * 1e-3) / 1e12, 3.5 * work / (fb * 1e-3) / 1e12)
                          for name, (f, fb) in r.items()}
                    fwd_ratios.append(tf["ours"][0] / tf["sdpa"][0])
                    train_ratios.append(tf["ours"][1] / tf["sdpa"][1])
                    rows.append([label, dh, t, "yes" if causal else "no", f"{tf['ours'][0]:.0f}",
                                 f"{tf['sdpa'][0]:.0f}", f"{fwd_ratios[-1]:.2f}", f"{tf['ours'][1]:.0f}",
                                 f"{tf['sdpa'][1]:.0f}", f"{train_ratios[-1]:.2f}", f"{tf['ours'][0] / peak:.2f}"])
                    print("  " + " | ".join(str(c) for c in rows[-1]), flush=True)
                    torch.cuda.empty_cache()
    fwd = math.exp(sum(map(math.log, fwd_ratios)) / len(fwd_ratios))
    train = math.exp(sum(map(math.log, train_ratios)) / len(train_ratios))
    targets = [[f"forward >= {FORWARD_TARGET}x SDPA flash (geometric mean)", f"{fwd:.2f}",
                common.verdict(fwd >= FORWARD_TARGET)],
               [f"forward+backward >= {TRAINING_TARGET}x SDPA flash (geometric mean)", f"{train:.2f}",
                common.verdict(train >= TRAINING_TARGET)]]
    headers = ["dtype", "Dh", "T", "causal", "ours fwd TFLOP/s", "SDPA fwd TFLOP/s", "fwd ratio",
               "ours fwd+bwd TFLOP/s", "SDPA fwd+bwd TFLOP/s", "fwd+bwd ratio", "ours fwd / matmul peak"]
    for target in targets:
        print("  " + ": ".join(target[:2]) + f" ({target[2]})")
    common.save("bench_triton", config, table={"headers": headers, "rows": rows}, targets=targets)


if __name__ == "__main__":
    sys.exit(main())
