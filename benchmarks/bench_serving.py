"""Serving with the course's GPT (chapter 18): continuous vs static batching vs one request at a time, the paged
cache's waste, a shared prefix, speculative decoding (CPU fp32).

Model: 4 layers, D=128, H=4, H_kv=2, RoPE, vocabulary 256 (random seeded weights). Workload: 24 requests, all
arrived, prompts of 8-48 tokens, outputs long-tailed as in chat (three in four of 4-24 tokens, one in four of 96-160);
paged cache with blocks of 16, at most 8 sequences and 64 new tokens per step. Correctness first: every engine's
tokens equal each request's solo greedy decode. Then the three policies run side by side in rounds (rotating order);
throughput = generated tokens / fastest time. The paged waste is measured at every step of the continuous run
(allocated slots minus stored positions, per running sequence) against contiguous buffers of the longest request.
Shared prefix: 12 requests with a 256-token common prompt and an 8-token question (12 new tokens each), with and
without prefix sharing. Speculative: a 6-layer target and its first 2 layers as an early-exit draft, k = 3, 4
prompts of 64 new tokens, against plain greedy decoding.

Targets: continuous >= 2x static batching throughput; paged waste < one block per sequence. Shared-prefix time
saved and speculative speed-up (at the measured acceptance rate) are reported.

Usage: python benchmarks/bench_serving.py [--repeats N]
"""

from __future__ import annotations

import argparse
import random

import common  # first: it sets OMP_WAIT_POLICY and the TF log level before torch or TensorFlow load
import torch

from attention_course.gpt import GPT, GPTConfig
from attention_course.serving import (
    Engine,
    Request,
    early_exit_draft,
    greedy_reference,
    speculative_generate,
)

MODEL = dict(vocab_size=256, d_model=128, num_heads=4, num_kv_heads=2, num_layers=4, positions="rope",
             tie_embeddings=False, init="pytorch")
BLOCK, MAX_SEQS, MAX_TOKENS, NUM_BLOCKS = 16, 8, 64, 256
MIN_CONTINUOUS_OVER_STATIC = 2.0


def workload(seed: int = 0) -> list[Request]:
    rng = random.Random(seed)
    out = []
    for i in range(24):
        new = rng.randint(96, 160) if rng.random() < 0.25 else rng.randint(4, 24)
        out.append(Request(i, [rng.randrange(MODEL["vocab_size"]) for _ in range(rng.randint(8, 48))], new))
    return out


def serve(model, requests, **kwargs) -> Engine:
    engine = Engine(model, NUM_BLOCKS, BLOCK, max_batch_tokens=MAX_TOKENS, **kwargs)
    engine.run([Request(r.id, r.prompt, r.max_new_tokens) for r in requests])
    return engine


def policies(model, requests):
    return {"one at a time": lambda: serve(model, requests, max_seqs=1),
            "static batching": lambda: serve(model, requests, max_seqs=MAX_SEQS, policy="static"),
            "continuous batching": lambda: serve(model, requests, max_seqs=MAX_SEQS)}


def paged_waste(model, requests) -> tuple[float, float]:
    """Mean over steps of the unused slots per running sequence: paged, and with contiguous max-length buffers."""
    engine = Engine(model, NUM_BLOCKS, BLOCK, max_seqs=MAX_SEQS, max_batch_tokens=MAX_TOKENS)
    for r in requests:
        engine.add(Request(r.id, r.prompt, r.max_new_tokens))
    longest = max(len(r.prompt) + r.max_new_tokens for r in requests)
    paged, contiguous = [], []
    while engine.waiting or engine.running:
        engine.step()
        cache = engine.cache
        for seq_id, table in cache.tables.items():
            paged.append(len(table) * BLOCK - cache.seq_lengths[seq_id])
            contiguous.append(longest - cache.seq_lengths[seq_id])
    return sum(paged) / len(paged), sum(contiguous) / len(contiguous)


def main(repeats: int = 2) -> dict:
    config = common.setup("bench_serving", {"model": MODEL, "block_size": BLOCK, "max_seqs": MAX_SEQS,
                                            "max_batch_tokens": MAX_TOKENS})
    model = GPT(GPTConfig(**MODEL), seed=0).eval()
    requests = workload()
    generated = sum(r.max_new_tokens for r in requests)
    with torch.inference_mode():
        solo = {r.id: greedy_reference(model, r.prompt, r.max_new_tokens) for r in requests}
        for name, run in policies(model, requests).items():
            same = run().finished == solo
            print(f"  check {name}: every request equals its solo greedy decode: {same}")
            if not same:
                raise SystemExit(f"correctness check failed: {name}")
    times = common.interleaved(policies(model, requests), repeats, warmup=0)
    rate = {name: generated / common.fastest(ts) for name, ts in times.items()}
    headers = ["policy", "fastest s", "median s", "tokens / s", "vs static"]
    rows = [[name, f"{common.fastest(ts):.2f}", f"{common.median(ts):.2f}", f"{rate[name]:.0f}",
             f"{rate[name] / rate['static batching']:.2f}x"] for name, ts in times.items()]

    with torch.inference_mode():
        waste, waste_contiguous = paged_waste(model, requests)
    rng = random.Random(1)
    system = [rng.randrange(MODEL["vocab_size"]) for _ in range(256)]
    shared = [Request(i, system + [rng.randrange(MODEL["vocab_size"]) for _ in range(8)], 12) for i in range(12)]
    prefix = {f"prefix sharing {s}": (lambda s=s: serve(model, shared, max_seqs=MAX_SEQS, prefix_sharing=s))
              for s in (False, True)}
    with torch.inference_mode():
        if prefix["prefix sharing True"]().finished != prefix["prefix sharing False"]().finished:
            raise SystemExit("correctness check failed: prefix sharing changed the tokens")
    print("  check prefix sharing: same tokens with and without: True")
    prefix_times = common.interleaved(prefix, repeats, warmup=0)
    saved = 1 - common.fastest(prefix_times["prefix sharing True"]) / common.fastest(
        prefix_times["prefix sharing False"])

    target = GPT(GPTConfig(**{**MODEL, "num_layers": 6, "init": "gpt2", "embedding_std": 0.05}), seed=0).eval()
    draft = early_exit_draft(target, 2)
    prompts = [[rng.randrange(MODEL["vocab_size"]) for _ in range(16)] for _ in range(4)]
    stats = []

    def speculative():
        stats.clear()
        for p in prompts:
            stats.append(speculative_generate(target, p, 64, 3, draft)[1])

    with torch.inference_mode():
        plain = [greedy_reference(target, p, 64) for p in prompts]
        same = [speculative_generate(target, p, 64, 3, draft)[0] for p in prompts] == plain
    print(f"  check speculative decoding equals plain greedy: {same}")
    if not same:
        raise SystemExit("correctness check failed: speculative decoding changed the tokens")
    spec_times = common.interleaved({"plain greedy": lambda: [greedy_reference(target, p, 64) for p in prompts],
                                     "speculative k=3": speculative}, repeats, warmup=0)
    acceptance = sum(s.accepted for s in stats) / sum(s.proposed for s in stats)
    speedup = common.fastest(spec_times["plain greedy"]) / common.fastest(spec_times["speculative k=3"])
    target_passes = sum(s.target_passes for s in stats)

    continuous_over_static = rate["continuous batching"] / rate["static batching"]
    rows += [["paged waste per sequence (positions)", f"{waste:.1f}", "", "", f"block = {BLOCK}"],
             ["contiguous waste per sequence (positions)", f"{waste_contiguous:.1f}", "", "", ""],
             ["shared 256-token prefix: time saved", f"{saved:.0%}", "", "", ""],
             ["speculative k=3: acceptance / speed-up", f"{acceptance:.2f}", "", "", f"{speedup:.2f}x wall, "
              f"{64 * 4 / target_passes:.2f}x target passes"]]
    print()
    print(common.markdown_table(headers, rows))
    targets = [[f"continuous >= {MIN_CONTINUOUS_OVER_STATIC:.0f}x static batching throughput",
                f"{continuous_over_static:.2f}x", common.verdict(continuous_over_static >= MIN_CONTINUOUS_OVER_STATIC)],
               ["paged waste < one block per sequence", f"{waste:.1f} < {BLOCK}", common.verdict(waste < BLOCK)]]
    print()
    print(common.markdown_table(["target", "measured", "result"], targets))
    common.save("bench_serving", config, table={"headers": headers, "rows": rows}, targets=targets)
    return {"continuous_over_static": continuous_over_static, "waste": waste, "saved": saved, "speedup": speedup}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    main(parser.parse_args().repeats)
