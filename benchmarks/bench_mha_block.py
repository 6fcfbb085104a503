"""Causal multi-head self-attention block, B=8, T=1024, D=768, H=12, CPU fp32: the course's modules vs PyTorch.

Candidates (same weights in all of them; all called under torch.inference_mode()):
  fused               attention_course.fused.FusedSelfAttention(is_causal=True): fused QKV + SDPA
  nn.MHA mask         torch.nn.MultiheadAttention(need_weights=False) with a causal attn_mask (its True = NOT allowed),
                      in eval mode, where PyTorch takes its "fast path" (torch._native_multi_head_attention)
  nn.MHA mask, train  the same module in train mode (dropout=0, so the same outputs): no fast path, in_proj + SDPA;
                      faster than eval mode on this CPU
  nn.MHA hint (, train) the same plus is_causal=True, a hint that lets it drop the mask and call SDPA with is_causal
                      (reported, no target)
  scratch             attention_course.MultiHeadAttention(backend="eager"): every step written out
  scratch+sdpa        attention_course.MultiHeadAttention(backend="sdpa")

Targets: fused takes at most 0.85x the time of nn.MultiheadAttention with the causal mask (the faster of its eval and
train modes); fused reaches >= 0.75 of the attainable peak counting useful FLOPs only: projections 4 * 2*B*T*D^2 plus
the causal core 4*B*H*Dh * T(T+1)/2 (only visible query-key pairs).

Usage: python benchmarks/bench_mha_block.py [--repeats N]
"""

from __future__ import annotations

import argparse
import copy

import common  # first: it sets OMP_WAIT_POLICY and the TF log level before torch or TensorFlow load
import numpy as np
import torch

from attention_course import numpy_ref
from attention_course.fused import FusedSelfAttention
from attention_course.multi_head import MultiHeadAttention

B, T, D, H = 8, 1024, 768, 12
MAX_TIME_RATIO = 0.85
MIN_PEAK_FRACTION = 0.75


def useful_flops(b: int, t: int, d: int, h: int) -> float:
    """Projections (q, k, v, out) + causal attention core (scores and weights @ v over visible pairs only)."""
    dh = d // h
    projections = 4 * 2 * b * t * d * d
    core = 2 * 2 * b * h * dh * (t * (t + 1) // 2)
    return float(projections + core)


def build(d: int, h: int, params: dict):
    """The candidate modules, all loaded with the same numpy_ref parameters, in eval mode."""
    fused = FusedSelfAttention(d, h)
    fused.load_numpy_params(params)
    scratch = MultiHeadAttention(d, h, backend="eager")
    scratch.load_numpy_params(params)
    scratch_sdpa = MultiHeadAttention(d, h, backend="sdpa")
    scratch_sdpa.load_numpy_params(params)
    torch_mha = scratch.to_torch(batch_first=True)
    modules = [m.float().eval() for m in (fused, torch_mha, scratch, scratch_sdpa)]
    return modules + [copy.deepcopy(torch_mha).train()]  # train mode: dropout=0, same outputs, no fast path


def candidates(x: torch.Tensor, modules) -> dict:
    fused, torch_mha, scratch, scratch_sdpa, torch_mha_train = modules
    t = x.shape[1]
    not_allowed = ~torch.ones(t, t, dtype=torch.bool).tril()  # nn.MultiheadAttention: True = NOT allowed
    return {
        "fused": lambda: fused(x, is_causal=True),
        "nn.MHA mask": lambda: torch_mha(x, x, x, attn_mask=not_allowed, need_weights=False)[0],
        "nn.MHA mask, train": lambda: torch_mha_train(x, x, x, attn_mask=not_allowed, need_weights=False)[0],
        "nn.MHA hint": lambda: torch_mha(x, x, x, attn_mask=not_allowed, need_weights=False, is_causal=True)[0],
        "nn.MHA hint, train": lambda: torch_mha_train(x, x, x, attn_mask=not_allowed, need_weights=False,
                                                      is_causal=True)[0],
        "scratch": lambda: scratch(x, is_causal=True),
        "scratch+sdpa": lambda: scratch_sdpa(x, is_causal=True),
    }


def check_small() -> None:
    """All candidates against the float64 reference at B=2, T=16, D=48, H=4."""
    params = numpy_ref.init_mha_params(48, seed=1)
    x = np.random.default_rng(0).normal(size=(2, 16, 48))
    ref, _ = numpy_ref.multi_head_attention(x, x, x, params, 4, numpy_ref.causal_mask(16))
    with torch.inference_mode():
        for name, fn in candidates(torch.from_numpy(x).float(), build(48, 4, params)).items():
            common.check(f"{name} vs float64 reference (small)", common.max_abs_diff(fn(), ref), 1e-5)


def main(repeats: int = 7) -> dict:
    config = common.setup("bench_mha_block", {"B": B, "T": T, "D": D, "H": H, "causal": True, "dtype": "float32"})
    check_small()
    params = numpy_ref.init_mha_params(D, seed=0)
    x = torch.randn(B, T, D, generator=torch.Generator().manual_seed(0))
    cands = candidates(x, build(D, H, params))
    with torch.inference_mode():  # the full-size outputs must agree too
        expected = cands["scratch"]()
        for name, fn in cands.items():
            common.check(f"{name} vs scratch (full size)", common.max_abs_diff(fn(), expected), 1e-4)
    peak_fn, peak_flops = common.matmul_candidate()
    cands["matmul peak"] = peak_fn
    times = common.interleaved(cands, repeats=repeats, warmup=1)
    peak = peak_flops / common.fastest(times.pop("matmul peak")) / 1e9
    flops = useful_flops(B, T, D, H)
    print(f"\nuseful FLOPs per forward: {flops / 1e9:.2f} GFLOP; attainable peak (fastest matmul): {peak:.0f} GFLOP/s")
    base_name = min(("nn.MHA mask", "nn.MHA mask, train"), key=lambda n: common.fastest(times[n]))
    base = common.fastest(times[base_name])
    base_median = common.median(times[base_name])
    print(f"baseline: {base_name} (the faster nn.MultiheadAttention with the causal mask)")
    rows, results = [], {}
    for name, ts in times.items():
        best, med = common.fastest(ts), common.median(ts)
        frac = flops / best / 1e9 / peak
        results[name] = {"fastest_s": best, "median_s": med, "peak_fraction": frac, "time_ratio": best / base}
        rows.append([name, f"{best * 1e3:.0f}", f"{med * 1e3:.0f}", f"{frac:.2f}", f"{best / base:.2f}",
                     f"{med / base_median:.2f}"])  # fmt: skip
    headers = ["module", "fastest ms", "median ms", "fraction of peak", f"time / {base_name}", "median ratio"]
    print(common.markdown_table(headers, rows))
    ratio, frac = results["fused"]["time_ratio"], results["fused"]["peak_fraction"]
    targets = [
        [f"fused time <= {MAX_TIME_RATIO} x {base_name}", f"{ratio:.2f}", common.verdict(ratio <= MAX_TIME_RATIO)],
        [f"fused >= {MIN_PEAK_FRACTION} of peak (useful FLOPs)", f"{frac:.2f}",
         common.verdict(frac >= MIN_PEAK_FRACTION)],
    ]
    print()
    print(common.markdown_table(["target", "measured", "result"], targets))
    common.save("bench_mha_block", config, table={"headers": headers, "rows": rows}, targets=targets,
                peak_gflops=peak, useful_gflop=flops / 1e9, results=results)  # fmt: skip
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    main(parser.parse_args().repeats)
