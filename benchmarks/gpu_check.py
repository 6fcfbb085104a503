"""Chapter 16's Triton kernels on a CUDA GPU, in one run: correctness first, then speed (not run in CI).

1. **Checks.** ``flash_attention``'s output and its three gradients against float64 SDPA computed on the same GPU
   from the same (rounded) inputs, in float16, bfloat16 and float32, head sizes 64 and 128 (and 80, which the
   kernel pads to 128), causal and not, Tq == Tk and Tq != Tk; then GQA (8 query heads over 2 key/value heads), a
   sliding window, padded key lengths, packed documents (per-query key ranges), and inputs that are views (a
   fused QKV projection split without a copy, keys expanded over the heads). The error is measured relative to
   the reference's largest entry, against a tolerance per dtype (:data:`TOLERANCE`). A case that fails to compile
   (a tile too large for the GPU's shared memory, say) is a failure with its message, and the run goes on.
2. **Speed.** ``benchmarks/bench_triton.py`` (imported, same process): TFLOP/s of the kernels and of SDPA's flash
   backend, forward and forward + backward, and the targets (>= 0.7x SDPA forward, >= 0.5x forward + backward).

Writes ``benchmarks/results/gpu_check.json`` (the checks, with the GPU's name and the date) and
``benchmarks/results/bench_triton.json`` (the timings, which chapter 16 and ``run_all.py --readme-only`` read).
Exits 1 if a check failed (the timings are then skipped), 2 without a CUDA GPU: a check that did not run is no pass.

Usage: python benchmarks/gpu_check.py [--quick] [--checks-only]
(--quick: the timings at T <= 4096 and Dh = 64 only; --checks-only: no timings).
"""

from __future__ import annotations

import argparse
import sys

import common  # first: it sets OMP_WAIT_POLICY and the TF log level before torch loads
import torch
import torch.nn.functional as F

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
TOLERANCE = {"fp16": 5e-3, "bf16": 3e-2, "fp32": 1e-4}  # max |ours - ref| / max |ref|, over output and gradients
HEAD_SIZES = (64, 128, 80)


def reference(q, k, v, is_causal=False, window=None, key_lengths=None, key_ranges=None):
    """SDPA on keys and values repeated over each group of query heads, with the course's masks (rows that may
    attend nothing give 0), differentiable: called on float64 views of float64 leaves."""
    from attention_course.masks import causal_mask, padding_mask, sliding_window_mask

    group = q.shape[1] // k.shape[1]
    k, v = (x.repeat_interleave(group, dim=1) for x in (k, v))
    t_q, t_k = q.shape[2], k.shape[2]
    mask = torch.ones(t_q, t_k, dtype=torch.bool, device=q.device)
    if window is not None:
        mask = sliding_window_mask(t_q, t_k, window, device=q.device)
    elif is_causal:
        mask = causal_mask(t_q, t_k, device=q.device)
    if key_lengths is not None:
        mask = mask & padding_mask(key_lengths, t_k)
    if key_ranges is not None:  # packed documents: query i of row b sees keys [starts[b, i], ends[b, i])
        keys = torch.arange(t_k, device=q.device)
        starts, ends = (r[:, None, :, None] for r in key_ranges)  # (B, 1, Tq, 1)
        mask = mask & (keys >= starts) & (keys < ends)  # (B, 1, Tq, Tk)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask).nan_to_num(0.0)


def relative_error(ft, leaves, make, do, **options) -> float:
    """Run the kernels on the views ``make(*leaves)`` and the reference on the same views of float64 copies: the
    largest error over the output and the gradients of the leaves, relative to each reference's largest entry."""
    ours = [x.detach().clone().requires_grad_() for x in leaves]
    out = ft.flash_attention(*make(*ours), **options)
    out.backward(do)
    refs = [x.detach().double().requires_grad_() for x in leaves]
    ref_out = reference(*make(*refs), **options)
    ref_out.backward(do.double())
    pairs = [(out, ref_out)] + [(a.grad, r.grad) for a, r in zip(ours, refs, strict=True)]
    return max(((a.double() - r).abs().max() / r.abs().max().clamp_min(1e-30)).item() for a, r in pairs)


def cases(dtype, device="cuda", t=300, head_sizes=HEAD_SIZES):
    """(name, leaves, make, options) for one dtype: the plain grid, then GQA, masks and views; sequences of about
    ``t`` tokens (a multiple of no tile)."""
    g = torch.Generator(device=device).manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, device=device, generator=g).to(dtype)

    def plain(q, k, v):
        return q, k, v

    for d in head_sizes:
        for t_q, t_k in ((t - 1, t - 1), (2 * t // 3, t + t // 10)):  # one square, one ragged with Tq != Tk
            for causal in (False, True):
                yield (f"Dh={d} Tq={t_q} Tk={t_k} causal={causal}", [randn(2, 4, t_q, d), randn(2, 4, t_k, d),
                       randn(2, 4, t_k, d)], plain, {"is_causal": causal})
    gqa = [randn(2, 8, t, 64), randn(2, 2, t, 64), randn(2, 2, t, 128)]
    window, lengths = t // 3, torch.tensor([t, t // 3 + 1], device=device)
    yield "GQA 8/2, Dk=64 Dv=128, causal", gqa, plain, {"is_causal": True}
    yield f"GQA 8/2, window {window}", gqa, plain, {"is_causal": True, "window": window}
    yield f"GQA 8/2, key lengths {lengths.tolist()}", gqa, plain, {"key_lengths": lengths}
    yield "GQA 8/2, window and key lengths", gqa, plain, {"is_causal": True, "window": window, "key_lengths": lengths}
    from attention_course.flash_triton import document_ranges

    sizes = [[t // 5, 1, t // 2, t - t // 5 - 1 - t // 2], [t // 2, t - t // 2]]  # packed documents, one row each
    doc_ids = torch.tensor([[doc for doc, n in enumerate(row) for _ in range(n)] for row in sizes], device=device)
    yield "GQA 8/2, packed documents, causal", gqa, plain, {"is_causal": True, "key_ranges": document_ranges(doc_ids)}

    def fused(x):  # (B, T, 3 * H * Dh) -> three (B, H, T, Dh) views
        return x.unflatten(-1, (3, 4, 64)).permute(2, 0, 3, 1, 4).unbind(0)

    yield "views: fused QKV, causal", [randn(2, t, 3 * 4 * 64)], fused, {"is_causal": True}

    def expanded(q, k, v):
        return q, k.expand(-1, 4, -1, -1), v.expand(-1, 4, -1, -1)

    yield "views: keys expanded 1 -> 4", [randn(2, 4, t, 64), randn(2, 1, t, 64), randn(2, 1, t, 64)], expanded, {}


def run_checks(ft, dtypes=tuple(DTYPES), device="cuda", t=300, head_sizes=HEAD_SIZES) -> tuple[list[list], bool]:
    """Every case of :func:`cases` in each dtype: table rows (dtype, case, error, tolerance, verdict) and whether
    all passed. (On the CPU, under the interpreter, with a small ``t``: how the tests run this script's logic.)"""
    rows, ok = [], True
    g = torch.Generator(device=device).manual_seed(1)
    for label in dtypes:
        for name, leaves, make, options in cases(DTYPES[label], device, t, head_sizes):
            q, _, v = make(*leaves)
            do = torch.randn(*q.shape[:3], v.shape[-1], device=device, generator=g).to(DTYPES[label])
            try:
                error = relative_error(ft, leaves, make, do, **options)
                verdict = common.verdict(error < TOLERANCE[label])
                measured = f"{error:.1e}"
            except Exception as err:  # noqa: BLE001 - a compile failure is a result to record, not a crash
                verdict, measured = "FAIL", f"{type(err).__name__}: {str(err).splitlines()[0][:120]}"
            ok &= verdict == "PASS"
            rows.append([label, name, measured, f"< {TOLERANCE[label]:.0e}", verdict])
            print("  " + " | ".join(rows[-1]), flush=True)
    return rows, ok


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="timings at T <= 4096 and Dh = 64 only")
    parser.add_argument("--checks-only", action="store_true", help="no timings")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_check needs a CUDA GPU: the kernels are compiled by Triton for it, and here there is none "
              "(torch.cuda.is_available() is False). Nothing was checked. Run it on a Linux machine with an NVIDIA "
              "GPU: python benchmarks/gpu_check.py")
        return 2
    import triton

    from attention_course import flash_triton as ft

    if ft.INTERPRETED:
        print("TRITON_INTERPRET=1 is set: unset it, or the GPU would run the interpreter's Python, not compiled code")
        return 2
    config = common.setup("gpu_check", {"gpu": torch.cuda.get_device_name(), "triton": triton.__version__})
    rows, ok = run_checks(ft)
    headers = ["dtype", "case", "max relative error", "tolerance", "result"]
    passed = sum(row[-1] == "PASS" for row in rows)
    common.save("gpu_check", config, table={"headers": headers, "rows": rows},
                targets=[["every check within its tolerance", f"{passed}/{len(rows)}", common.verdict(ok)]])
    if not ok:
        print(f"\n{len(rows) - passed} of {len(rows)} checks failed: no timings (a wrong kernel's speed means nothing)")
        return 1
    if not args.checks_only:
        import bench_triton

        bench_triton.main(["--quick"] if args.quick else [])
    return 0


if __name__ == "__main__":
    sys.exit(main())
