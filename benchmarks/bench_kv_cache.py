"""Greedy generation of 256 tokens with the course's GPT, with and without a KV cache (CPU fp32).

Model: 4 layers, D=256, H=8, vocabulary 512 (random seeded weights); batch of 4 prompts of 16 tokens.
Each run records the time of every decoding step (attention_course.gpt.GPT.iter_generate); the model is
chapter 8's (PyTorch's initialisation, no attention biases, untied head, PyTorch's fused attention).
Runs alternate cache / no cache (2 runs without, 4 with the cache by default); per-step times are the fastest
over the runs at each position.

Targets: with the cache the whole generation is >= 5x faster; and the time per token stays flat with the cache:
median step time over the last quarter of positions / over the first quarter < 1.5 (without a cache it grows with
the position, reported for contrast). The first step (prefill of the prompt) is excluded from per-token stats.

Usage: python benchmarks/bench_kv_cache.py [--repeats N]
"""

from __future__ import annotations

import argparse
import statistics
import time

import common  # first: it sets OMP_WAIT_POLICY and the TF log level before torch or TensorFlow load
import torch

from attention_course.gpt import GPT, GPTConfig

MODEL = dict(vocab_size=512, d_model=256, num_heads=8, num_layers=4, max_len=1024, tie_embeddings=False,
             init="pytorch", bias=False, backend="sdpa")
BATCH, PROMPT, NEW_TOKENS = 4, 16, 256
MIN_SPEEDUP = 5.0
MAX_FLATNESS = 1.5


def step_times(model: GPT, prompt: torch.Tensor, use_cache: bool) -> tuple[list[float], torch.Tensor]:
    """Seconds of each decoding step and the generated ids."""
    times, ids = [], []
    start = time.perf_counter()
    for next_ids, _ in model.iter_generate(prompt, NEW_TOKENS, use_cache=use_cache):
        now = time.perf_counter()
        times.append(now - start)
        ids.append(next_ids)
        start = now
    return times, torch.cat(ids, dim=1)


def quarters(per_step: list[float]) -> tuple[float, float]:
    """Median time per token over the first and over the last quarter of the decoding steps (prefill excluded).

    The median of the 63 or 64 steps of a quarter is a typical step: one burst of load from another process on
    the shared machine cannot move it, while it would move a mean.
    """
    steps = per_step[1:]
    q = len(steps) // 4
    return statistics.median(steps[:q]), statistics.median(steps[-q:])


def main(repeats: int = 2) -> dict:
    extra = {"model": MODEL, "batch": BATCH, "prompt": PROMPT, "new_tokens": NEW_TOKENS}
    config = common.setup("bench_kv_cache", extra)
    model = GPT(GPTConfig(**MODEL), seed=0).eval()
    prompt = torch.randint(0, MODEL["vocab_size"], (BATCH, PROMPT), generator=torch.Generator().manual_seed(0))

    small = prompt[:, :4]  # correctness first: identical tokens, logits within 1e-5
    ids_c, logits_c = model.generate(small, 24, use_cache=True, return_logits=True)
    ids_p, logits_p = model.generate(small, 24, use_cache=False, return_logits=True)
    print(f"  check identical tokens with and without cache (24 steps): {torch.equal(ids_c, ids_p)}")
    if not torch.equal(ids_c, ids_p):
        raise SystemExit("correctness check failed: tokens differ")
    common.check("logits with cache vs without", common.max_abs_diff(logits_c, logits_p), 1e-5)

    runs = {True: [], False: []}
    order = [True, False] * repeats + [True] * 2  # alternate; the cheap cached run gets two extra repeats
    with torch.inference_mode():
        step_times(model, prompt[:, :4], True)  # warm-up
        step_times(model, prompt[:, :4], False)
        for use_cache in order:
            times, ids = step_times(model, prompt, use_cache)
            runs[use_cache].append((times, ids))
            print(f"  run cache={use_cache}: {sum(times):.2f} s", flush=True)
    if not all(torch.equal(ids, runs[True][0][1]) for c in runs for _, ids in runs[c]):
        raise SystemExit("correctness check failed: full-size generations differ")
    print("  check identical tokens at full size (256 steps, every run): True")

    totals = {c: min(sum(t) for t, _ in runs[c]) for c in runs}
    per_pos = {c: [min(ts[i] for ts, _ in runs[c]) for i in range(NEW_TOKENS)] for c in runs}  # fastest per position
    speedup = totals[False] / totals[True]
    quarter = {c: quarters(per_pos[c]) for c in runs}
    flat = {c: quarter[c][1] / quarter[c][0] for c in runs}
    headers = ["", "total s (fastest)", "prefill ms", "ms/token, first quarter", "ms/token, last quarter",
               "last / first"]
    rows = []
    for c, label in ((False, "no cache"), (True, "KV cache")):
        rows.append([label, f"{totals[c]:.2f}", f"{per_pos[c][0] * 1e3:.1f}", f"{quarter[c][0] * 1e3:.2f}",
                     f"{quarter[c][1] * 1e3:.2f}", f"{flat[c]:.2f}"])  # fmt: skip
    print()
    print(common.markdown_table(headers, rows))
    targets = [
        [f"cache speed-up >= {MIN_SPEEDUP:.0f}x", f"{speedup:.1f}x", common.verdict(speedup >= MIN_SPEEDUP)],
        [f"with cache: last/first quarter median time per token < {MAX_FLATNESS}", f"{flat[True]:.2f}",
         common.verdict(flat[True] < MAX_FLATNESS)],
    ]  # fmt: skip
    print()
    print(common.markdown_table(["target", "measured", "result"], targets))
    common.save("bench_kv_cache", config, table={"headers": headers, "rows": rows}, targets=targets,
                per_position_s={"cache": per_pos[True], "no_cache": per_pos[False]})  # fmt: skip
    return {"speedup": speedup, "flatness": flat}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    main(parser.parse_args().repeats)
