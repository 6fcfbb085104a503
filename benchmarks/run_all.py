"""Run every benchmark (each in its own process) and regenerate benchmarks/README.md from their results.

Usage:
    python benchmarks/run_all.py                  # all benchmarks, then README.md
    python benchmarks/run_all.py --only bench_kv_cache bench_peak
    python benchmarks/run_all.py --readme-only    # rebuild README.md from benchmarks/results/*.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
BENCHMARKS = ["bench_peak", "bench_mha_block", "bench_attention_core", "bench_blockwise_memory", "bench_kv_cache",
              "bench_keras", "bench_training", "bench_flex", "bench_triton", "bench_linear_attention",
              "bench_serving", "bench_decode_hf", "bench_sparse"]  # fmt: skip
GPU_CHECK = (  # the one script to run on a GPU machine: checks, then bench_triton
    "On a GPU machine run `python benchmarks/gpu_check.py` (`--quick`: timings at T <= 4096 and Dh = 64 only). It "
    "first checks chapter 16's kernels on the GPU (outputs and the three gradients against float64 SDPA, in "
    "float16, bfloat16 and float32, head sizes 64, 128 and 80, causal and not, Tq != Tk, GQA, sliding window, "
    "padded key lengths, views of a fused QKV and expanded keys; results in `benchmarks/results/gpu_check.json`), "
    "then, if every check passed, runs `bench_triton.py`, whose results file this section and chapter 16 read; "
    "then `python benchmarks/run_all.py --readme-only`. Without a CUDA GPU it says so and exits with status 2."
)
GPU_ONLY = {"bench_triton"}  # on a machine without a CUDA GPU they print so and write no results

TITLES = {
    "bench_peak": "Attainable peak (fp32 matmul)",
    "bench_mha_block": "Causal multi-head self-attention block (B=8, T=1024, D=768, H=12)",
    "bench_attention_core": "Attention core: fraction of peak (H=12, Dh=64)",
    "bench_blockwise_memory": "Extra peak memory vs T, causal (B=1, H=12, Dh=64)",
    "bench_kv_cache": "Generation of 256 tokens with and without a KV cache",
    "bench_keras": "Keras: the course's layer vs keras.layers.MultiHeadAttention",
    "bench_training": "Training throughput: GPT vs nn.TransformerEncoder (D=128, H=4, 2 layers, B=16, T=128)",
    "bench_flex": "FlexAttention: sliding window and packed documents vs explicit masks (B=1, H=12, Dh=64)",
    "bench_triton": "FlashAttention in Triton (chapter 16) vs SDPA's flash backend, on a GPU (B=8, H=16)",
    "bench_linear_attention": "Gated delta rule: chunked form vs token loop vs SDPA causal (H=8, Dk=Dv=64, chunk 64)",
    "bench_serving": "Serving (chapter 18): continuous vs static batching, paged waste, shared prefix, paged reads, "
                     "speculative",
    "bench_decode_hf": "Greedy decoding against Hugging Face on the StarCoder2 twin: sequential and paged",
    "bench_sparse": "Learned sparse attention (chapter 19): indexer + top-k vs SDPA causal (H=8, Dh=64, k=2048)",
}

NOTES = {
    "bench_mha_block": (
        "*nn.MHA mask* is `torch.nn.MultiheadAttention(need_weights=False)` given a boolean causal `attn_mask` "
        "(its convention: True = NOT allowed), in eval mode, where PyTorch takes its native \"fast path\"; "
        "*, train* is the same module in train mode (dropout 0, same outputs), which runs in_proj + SDPA instead "
        "and is faster on this CPU. The time target compares with the faster of the two. *hint* also passes "
        "`is_causal=True`, which lets PyTorch drop the mask and call SDPA's causal kernel (reported, no target). "
        "All candidates run under `torch.inference_mode()`. Useful FLOPs: projections 4·2·B·T·D² plus the causal "
        "core 4·B·H·Dh·T(T+1)/2."
    ),
    "bench_attention_core": (
        "Useful FLOPs: 4·B·H·Dh per visible query-key pair (T² without a mask, T(T+1)/2 causal). *naive* and "
        "*scratch* compute the whole (T, T) matrix even when causal, so their causal fractions halve; *blockwise* "
        "skips the tiles above the diagonal; *sdpa* is PyTorch's fused CPU kernel."
    ),
    "bench_blockwise_memory": (
        "Each (method, T) runs in fresh subprocesses (the smaller of 2 runs: allocator noise only adds); extra = peak "
        "RSS during one call minus RSS before it (the kernel's peak counter is reset through /proc/self/clear_refs). "
        "Blockwise keeps O(T) state (output, running statistics) plus a constant set of (bq, bk) tiles, so its "
        "log-log growth exponent is below 1; "
        "over long sequences (naive not run there) a linear fit a + b·T shows what grows: compare b with the size of "
        "the output per token (B·H·Dh·4 bytes); a is the constant part (the tiles)."
    ),
    "bench_kv_cache": (
        "Per-token times are the fastest over the runs at each position; the flatness ratio compares the median "
        "time per token of the last and first quarters of the 256 decoding steps (prefill excluded)."
    ),
    "bench_linear_attention": (
        "Chapter 17. Run with OpenMP's default wait policy, not PASSIVE (see `benchmarks/common.py`: the "
        "chunked form launches hundreds of small kernels per call, and waking passive threads for each costs more "
        "than it gains). The chunked form (`linear_attention.gated_delta_chunked`) copies q, k, v chunk-major once, "
        "computes the (L, L) matrices and triangular solve of a group of chunks at once, carries the (Dk, Dv) "
        "state between chunks with two fused multiply-adds per chunk, then reads the group's outputs at once; "
        "its chunk size L is the fastest of the sweep at T=4096 in the same run (the chunk-size table), chosen "
        "for each form on its own since 2026-11-28 (the eager sweep's choice, 32 by 4 %, had given the compiled "
        "step 8.7x the loop's speed in that day's first run). "
        "*compiled* is the same function with its per-group step compiled (`step=torch.compile(chunks_step)`, "
        "compiled once per chunk size before timing; the compile time is printed by the script): the compiler "
        "fuses the step's "
        "elementwise work, which "
        "the eager kernels run as one pass over memory each. The loop "
        "(`gated_delta_recurrent`) takes one small step per token (about ten small kernels); SDPA causal is "
        "PyTorch's fused softmax attention on the same q, k, v (a different computation, timed for its cost). The "
        "*one thread, CPU time* rows time both forms on one torch thread by the CPU time of the timing thread, "
        "which other jobs disturb far less than wall time; *products and solve alone* times just the chunked "
        "form's batched matrix products and `torch.linalg.solve_triangular` at T=4096 (no elementwise work): the "
        "loop over that is the most any chunked form built from PyTorch's kernels could gain on one thread of "
        "this CPU. Decoding compares one delta-rule step on the state with one query over a 16k-token KV cache "
        "(float32, batch 1)."
    ),
    "bench_sparse": (
        "Chapter 19. Decode: one query over a cache of T tokens; *dense* is SDPA over all T keys, *indexer + top-k* "
        "the lightning indexer's scores (4 heads of 64 over one shared key per token, `sparse.index_scores`) and "
        "`topk`, *sparse* those then SDPA over the k = 2048 gathered keys and values (`index_select`: the gather "
        "DeepSeek's FlashMLA sparse kernel does on a GPU). Prefill: SDPA causal (fused) against the indexer's "
        "scores and top-k in blocks of 512 queries, which are three unfused passes over a (4, 512, T) tensor and a "
        "sort per row: on a CPU with PyTorch's eager kernels the indexer's own quadratic cost is larger than fused "
        "dense attention's at every length here, by a ratio that stays roughly constant (both are quadratic in T). "
        "Sparse attention wins at decode, from the lengths where the top-k gather costs less than reading every "
        "key, and the indexer's share of a sparse step grows with T. At prefill T = 8192, *sparse* is the "
        "indexer's blocks and then each query over its own 2048 keys, gathered 32 queries at a time: with eager "
        "PyTorch every gather copies H x 32 x 2048 keys and values (256 MiB), and these copies, not the arithmetic, "
        "make its time (*sparse / sdpa*); a GPU kernel (DeepSeek's FlashMLA) reads the chosen keys in place. "
        "Bytes per token and layer: this run's float32 caches, and DeepSeek V3.2's (bfloat16 latent, FP8 indexer "
        "key with one float32 scale per 128 numbers)."
    ),
    "bench_training": (
        "One step = forward, cross-entropy, backward and AdamW on the same batch. The nn.TransformerEncoder model "
        "(pre-LN, GELU, dropout 0) gets the same causal mask (its convention: True = NOT allowed, plus "
        "`is_causal=True`), the same learned positions and tied head, and the same weights: the script first "
        "checks the two compute the same loss and gradients. GPT forms the attention weights explicitly "
        "(chapter 12 reads them), nn.TransformerEncoder calls SDPA. Tokens/s = B·T / fastest step time."
    ),
    "bench_flex": (
        "Chapter 15. *flex compiled* is `torch.compile(flex_attention)` with the mask's `BlockMask` (tiles of 128; "
        "only tiles that hold an allowed pair are computed); *sdpa explicit mask* is "
        "`F.scaled_dot_product_attention` given the (T, T) boolean mask; *sdpa causal* (`is_causal=True`, more "
        "pairs than the window, no mask tensor) and chapter 9's *blockwise* (every tile up to the diagonal, the "
        "mask sliced per tile) are reported without targets. SDPA with the explicit mask is timed up to T=8192 "
        "(its time grows as T²). The first call at each T compiles a kernel (`dynamic=False`): its time, in the "
        "last column, is never part of the timed runs. The run recorded here was made while the 2-core machine "
        "was shared with other jobs (load average above 10): absolute times are several times an idle "
        "machine's; the ratios were measured side by side in the same rounds."

    ),
    "bench_triton": (
        GPU_CHECK + " "
        "Useful FLOPs: 4·B·H·Dh per visible query-key pair for the forward, 3.5 times that for forward + backward. "
        "Times: medians of `triton.testing.do_bench`. The peak is a (8192, 8192) matmul in the same dtype, measured "
        "in the same run. Chapter 16 prints this table from `benchmarks/results/bench_triton.json`."
    ),
    "bench_serving": (
        "Measured on the shared machine (the run's load is listed at the top), fastest of interleaved rounds "
        '(rotating order): the time '
        'ratios are the result, the milliseconds are not (a 2048-context step and an 8192-context one were not '
        'timed under the same load). 24 requests, outputs long-tailed (one in four of 96-160 tokens): static '
        "batching waits for each group's longest member, continuous batching refills the batch at every step; one"
        ' ragged forward pass per step through the paged cache (blocks of 16). Waste = allocated slots - stored '
        'positions per running sequence, averaged over every step.\n'
        '\n'
        '**Paged reads.** One decode step (one token for each of 8 sequences) of a 4-layer multi-head GPT (D=128,'
        ' H=4, SDPA, float32) over a pool holding 8 x context positions (seeded random keys; logits of both reads'
        ' equal to 1e-4 first). *gather*: `PagedKVCache(read="gather")` copies every cached key and value of the '
        "step's sequences out of the pool in every layer (2 x 8 x context x 128 x 4 bytes per layer; the MiB "
        'column is the peak, one layer\'s copy); *blocks*: `read="blocks"` hands the layer the pool itself (a '
        'view) and the block tables as an (8, slots) mask over it, so it allocates only that mask (built in '
        "int32). Memory = `serving.measure.allocated_peak`: torch.profiler's memory events, each op's own "
        "allocations minus its own frees, summed in op order (the peak above the step's start; no clock involved,"
        ' the same on every run). The target, >= 4x fewer bytes, is the copy against the mask: the gather '
        'allocates 2 x H x Dh x 4 = 1 KiB per cached position, the blocks read about 6 bytes per query per pool '
        'slot (a 4-byte position and two 1-byte masks), 48 bytes for 8 queries: 21x in theory, 16x measured with '
        "the step's other allocations; 4x leaves room for the free slots of a pool that is not full. The "
        "attention itself stays dense over the pool in both reads (every slot scored, the other sequences' masked"
        ' out): what the blocks read saves is the copy (and its time); a kernel that walks the block table '
        "(PagedAttention, or `serving.paged_attention`'s FlexAttention block mask once compiled) would also skip "
        "the other sequences' scores. Multi-head on purpose: with grouped-query attention the course's layer "
        "repeats each key/value head by copying (`expand_kv`), which on the pool copies the whole pool; SDPA's "
        "`enable_gqa=True` reads a group's head in place (a change to `CausalSelfAttention.forward` and "
        '`functional.sdpa_backend`, left for a branch that may re-execute chapters 8 and 10, whose pages show '
        'that source).\n'
        '\n'
        '**Speculative decoding.** A 6-layer target (D=128, random weights, eager attention), 4 prompts of 64 new'
        " tokens; every configuration's tokens equal plain greedy's first. Wall and CPU time (the process's, less"
        " disturbed by the other jobs) agree. By an early-exit draft (the target's first 2 layers, embeddings and"
        ' head) it is slower than plain greedy at every k; the last rows say why, in CPU time over a warm '
        '64-token cache: on this CPU a verify pass over k + 1 tokens is not free (1.25x a 1-token step for 2 '
        'tokens, 1.74x for 5: the tiny model is compute- and overhead-bound, not weight-read-bound as a large '
        'model on a GPU is, and a multi-token pass builds a causal mask and a masked softmax that a 1-token step '
        'skips), a draft pass costs 0.32 of a target step (more than 2/6 of its layers: embedding, head and '
        'Python cost per pass), and this random target accepts few proposals (0.46 at k = 1, fewer as k grows). '
        'The predicted column, tokens per pass / (verify cost + draft passes x draft cost), is below 1 for every '
        'k: at k = 1 an early-exit draft pays here only when (1 + alpha) / (1.25 + 0.32) > 1, alpha above 0.57. '
        "Prompt lookup proposes for free (no draft pass), so its 1.45 tokens per pass beat the verify pass's "
        'extra cost: 1.17x faster than plain greedy in wall time, the best of this sweep (the target met). The '
        'prediction (0.97x) charges every pass a 4-token verify; lookup often proposes fewer.\n'
        '\n'
        "### The real model: SmolLM2-135M served by the course's engine vs HF `generate_batch`\n"
        '\n'
        '`python benchmarks/bench_serving.py --real --requests 8 --new-tokens 16` (2026-11-28 02:37 UTC, shared '
        'machine under\n'
        'load, load average 4.5 4.9 4.4 on 2 cores; one timed run each after one warm-up request each; float32, '
        'greedy):\n'
        '\n'
        '| SmolLM2-135M, float32 | seconds | tokens / s |\n'
        '|---|---|---|\n'
        '| HF generate_batch | 11.1 | 11.5 |\n'
        '| course Engine (paged, continuous) | 2.6 | 50.1 |\n'
        '| course / HF |  | 4.35x |\n'
        '\n'
        'Course engine tokens == HF `generate_batch` tokens: True (all 8 requests). Speculative decoding, k = 3, '
        'on the first 2 requests: by prompt lookup, tokens == plain greedy: True, acceptance rate 0.29; by an '
        "early-exit draft (the first 8 of 30 layers with the model's final norm and head), tokens == plain "
        'greedy: True, acceptance rate 0.03 (8 layers of this model predict its next token poorly). One run on a '
        "loaded machine: the ratio is indicative, not a measurement of either engine's best; HF's engine here "
        'runs `generate_batch` with its default continuous-batching configuration.\n'
    ),
    "bench_decode_hf": (
        "The same random 4-layer GPT (D=128, H=4, H_kv=2, RoPE) and its StarCoder2 twin (`interop.hf_models`); "
        "both give the same greedy tokens (checked first). First table: 4 prompts of 32 tokens decoded one at a time, "
        "64 new tokens each, `GPT.generate` against HF `generate` (SDPA both). Second: the 4 prompts served "
        "together on a paged cache, the course's `serving.Engine` (blocks of 16) against HF `generate_batch` "
        "(attention \"paged|eager\"); a decode step is the median engine step after the prefill (HF's timed in its "
        "background thread), the fastest over the rounds. Aten ops: torch.profiler over one decode step of each "
        "(the 10th, then left out of the timings). Until 2026-11-28 the script profiled every step from the 10th on "
        "and timed only the 9 decode steps before it, in both engines (its last run then gave the paged step 1.05x, "
        "7.38 ms against 7.05 ms)."
    ),
}


def run(name: str) -> float:
    start = time.perf_counter()
    print(f"\n##### {name}", flush=True)
    env = dict(os.environ, PYTHONPATH=str(HERE) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    subprocess.run([sys.executable, str(HERE / f"{name}.py")], check=True, cwd=HERE.parent, env=env)
    return time.perf_counter() - start


def table(t: dict) -> str:
    lines = ["| " + " | ".join(t["headers"]) + " |", "|" + "|".join("---" for _ in t["headers"]) + "|"]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in t["rows"]])


def readme() -> str:
    results = {p.stem: json.loads(p.read_text()) for p in sorted(RESULTS.glob("*.json"))}
    if not results:
        raise SystemExit("no results in benchmarks/results/: run the benchmarks first")
    first = results.get("bench_peak", next(iter(results.values())))["config"]
    out = [
        "# Benchmarks",
        "",
        "Generated by `python benchmarks/run_all.py` (`make bench`); do not edit by hand. The benchmarks are not part "
        "of the test suite. Every script first checks its outputs against the float64 reference "
        "(`attention_course.numpy_ref`) at a small size, then times its candidates side by side in one process: a "
        "warm-up, then rounds in which each candidate runs once (rotating order), reporting the fastest and the "
        "median run. Fractions of peak count useful FLOPs only, against the fastest large fp32 matmul measured in the "
        "same process.",
        "",
        "## Machine",
        "",
        f"- CPU: {first['cpu']} ({first['logical_cpus']} logical CPUs), torch threads: {first['torch_threads']} "
        f"(`OMP_WAIT_POLICY={first['omp_wait_policy']}`)",
        f"- Python {first['python']}, torch {first['torch']}, numpy {first['numpy']}, "
        f"tensorflow {first['tensorflow']}, keras {first['keras']}",
        "- Dates and load averages of the runs: "
        + "; ".join(f"{n} {r['config']['date']} (load {r['config']['load_average']})" for n, r in results.items()),
        "",
        "The machine these numbers come from is shared (2 vCPUs, other jobs running): medians can be several times "
        "the fastest run. Compare ratios measured in the same run, not absolute times across runs.",
    ]
    for name in BENCHMARKS:
        if name not in results and name in GPU_ONLY:
            out += ["", f"## {TITLES[name]}", "", f"No GPU result yet: `python benchmarks/{name}.py` on a Linux "
                    "machine with a CUDA GPU writes it (on a CPU the script says it needs a GPU and exits).",
                    "", GPU_CHECK]
            continue
        if name not in results:
            continue
        r = results[name]
        out += ["", f"## {TITLES[name]}", "", f"`benchmarks/{name}.py` (ran in {r.get('elapsed_s', 0):.0f} s)", ""]
        if "gpu" in r["config"]:
            out[-1:] = [f"GPU: {r['config']['gpu']}, {r['config']['date']}, triton {r['config']['triton']}", ""]
        if name == "bench_peak":
            t = r["table"]
            out += [table({"headers": ["square fp32 matmul", "fastest GFLOP/s", "median GFLOP/s"], "rows": t}), "",
                    f"Attainable peak: **{r['peak_gflops']:.0f} GFLOP/s**."]  # fmt: skip
            continue
        out.append(table(r["table"]))
        if "time_table" in r:
            out += ["", table(r["time_table"])]
        for extra in r.get("extra_tables", []):
            out += ["", table(extra)]
        if "peak_gflops" in r and name != "bench_peak":
            out += ["", f"Attainable peak in this run: {r['peak_gflops']:.0f} GFLOP/s."]
        if "targets" in r:
            out += ["", table({"headers": ["target", "measured", "result"], "rows": r["targets"]})]
        if name in NOTES:
            out += ["", NOTES[name]]
    return "\n".join(out) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=BENCHMARKS)
    parser.add_argument("--readme-only", action="store_true")
    args = parser.parse_args()
    durations = {}
    if not args.readme_only:
        for name in args.only or BENCHMARKS:
            durations[name] = run(name)
        print("\ndurations: " + ", ".join(f"{n} {s:.0f} s" for n, s in durations.items()))
        print(f"total: {sum(durations.values()) / 60:.1f} min")
    (HERE / "README.md").write_text(readme())
    print("wrote benchmarks/README.md")


if __name__ == "__main__":
    main()
