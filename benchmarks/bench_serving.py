"""Serving with the course's GPT (chapter 18): continuous vs static batching vs one request at a time, the paged
cache's waste, a shared prefix, speculative decoding (CPU fp32).

Model: 4 layers, D=128, H=4, H_kv=2, RoPE, vocabulary 256 (random seeded weights). Workload: 24 requests, all
arrived, prompts of 8-48 tokens, outputs long-tailed as in chat (three in four of 4-24 tokens, one in four of 96-160);
paged cache with blocks of 16, at most 8 sequences and 64 new tokens per step. Correctness first: every engine's
tokens equal each request's solo greedy decode. Then the three policies run side by side in rounds (rotating order);
throughput = generated tokens / fastest time. The paged waste is measured at every step of the continuous run
(allocated slots minus stored positions, per running sequence) against contiguous buffers of the longest request.
Shared prefix: 12 requests with a 256-token common prompt and an 8-token question (12 new tokens each), with and
without prefix sharing. Speculative: a 6-layer target, 4 prompts of 64 new tokens, plain greedy against its first 2
layers as an early-exit draft at k = 1..4 and against prompt lookup at k = 3; wall and CPU time side by side, and
the CPU time of a (k+1)-token verify pass and of a draft pass against a 1-token step (why a draft pays or not).

Paged reads: one decode step of 8 sequences x 2k, 4k, 8k cached positions (a 4-layer multi-head GPT, D=128,
H=4, SDPA), the cache read by gathering (every key copied out of the pool, packed) against ``read="blocks"`` (the
pool read in place, the block tables as the mask): logits equal first, then the bytes the step allocates (the
profiler's memory events: the peak above the start of the step) and its time, side by side in rounds.

Targets: continuous >= 2x static batching throughput; paged waste < one block per sequence; the blocks read
allocates >= 4x fewer bytes than the gather at every context and is no slower at 8k (the gather copies
2 * layers * 8 * context * D * 4 bytes per step; the blocks read allocates only its (8, pool) mask and scores).
speculative decoding faster than plain greedy in wall time at its best draft and k. Shared-prefix time saved is
reported.

With --real: the real SmolLM2-135M (chapter 14's Decoder, float32, weights from the local cache) served by the
course's engine against Hugging Face's continuous batching (``generate_batch``) on the same requests (greedy),
tokens equal and tokens per second side by side; then speculative decoding by prompt lookup and by an early-exit
draft (its first 8 of 30 layers), k = 3, with their acceptance rates.

Usage: python benchmarks/bench_serving.py [--repeats N] [--real] [--requests N] [--new-tokens N]
"""

from __future__ import annotations

import argparse
import random
import time

import common  # first: it sets OMP_WAIT_POLICY and the TF log level before torch or TensorFlow load
import torch

from attention_course.gpt import GPT, GPTConfig
from attention_course.kv_cache import KVCache
from attention_course.serving import (
    Engine,
    PagedKVCache,
    Request,
    early_exit_draft,
    greedy_reference,
    speculative_generate,
)
from attention_course.serving.measure import allocated_peak

MODEL = dict(vocab_size=256, d_model=128, num_heads=4, num_kv_heads=2, num_layers=4, positions="rope",
             tie_embeddings=False, init="pytorch")
BLOCK, MAX_SEQS, MAX_TOKENS, NUM_BLOCKS = 16, 8, 64, 256
MIN_CONTINUOUS_OVER_STATIC = 2.0
READ_MODEL = {**MODEL, "num_kv_heads": 4, "backend": "sdpa"}  # multi-head: the layer's GQA expand would copy the pool
READ_CONTEXTS, READ_SEQS, MIN_READ_MEMORY_RATIO = (2048, 4096, 8192), 8, 4.0


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


def filled_cache(model, context: int) -> PagedKVCache:
    """A pool holding READ_SEQS sequences of ``context`` positions (seeded random keys and values): the state of
    a server decoding 8 long answers, without running 64k prefill tokens through the model first."""
    cache = PagedKVCache.for_model(model, READ_SEQS * (context // BLOCK + 1), BLOCK)
    g = torch.Generator().manual_seed(context)
    for pool in cache.keys + cache.values:
        pool.copy_(torch.randn(pool.shape, generator=g))
    for seq in range(READ_SEQS):
        cache.add_sequence(seq)
        cache.reserve(seq, context + 1)  # the decode step's block too: the step allocates nothing then
        cache.seq_lengths[seq] = context
    return cache


def decode_step(model, cache: PagedKVCache, read: str):
    """One decode step (a token per sequence) through ``cache`` read as ``read``; the cache is left as it was."""
    cache.read = read
    cache.begin_step([(seq, 1) for seq in range(READ_SEQS)])
    logits = model(torch.arange(READ_SEQS)[None], cache=cache)  # (1, 8, V)
    cache.abort_step()  # lengths unchanged: the next step writes the same slots again
    return logits


def compare_reads(model, context: int, repeats: int) -> tuple[dict, dict]:
    """Peak bytes allocated and fastest time of one decode step, per read, at 8 x ``context``."""
    cache = filled_cache(model, context)
    error = float((decode_step(model, cache, "gather") - decode_step(model, cache, "blocks")).abs().max())
    print(f"  check reads at 8 x {context}: max |blocks - gather| logits < 1e-4: {error < 1e-4}")
    if error >= 1e-4:
        raise SystemExit("correctness check failed: the blocks read changed the logits")
    steps = {read: (lambda r=read: decode_step(model, cache, r)) for read in ("gather", "blocks")}
    memory = {read: allocated_peak(step) for read, step in steps.items()}
    times = common.interleaved(steps, repeats + 2)
    return memory, {read: common.fastest(ts) for read, ts in times.items()}


def paged_reads(model, repeats: int) -> tuple[list[list], dict]:
    """Gather vs blocks read at each context: equal logits, peak bytes allocated, time per decode step."""
    rows, ratios = [], {}
    for context in READ_CONTEXTS:
        memory, fast = compare_reads(model, context, repeats)
        ratios[context] = (memory["gather"] / memory["blocks"], fast["gather"] / fast["blocks"])
        rows.append([f"8 x {context}", f"{memory['gather'] / 2**20:.1f}", f"{memory['blocks'] / 2**20:.1f}",
                     f"{ratios[context][0]:.1f}x", f"{fast['gather'] * 1e3:.1f}", f"{fast['blocks'] * 1e3:.1f}",
                     f"{ratios[context][1]:.2f}x"])
    return rows, ratios


SPEC_KS, SPEC_NEW = (1, 2, 3, 4), 64
SPEC_HEADERS = ["plain greedy vs speculative", "acceptance", "tokens / target pass", "draft passes / token",
                "speed-up wall", "speed-up CPU time", "predicted from pass costs"]


def timed_rounds(candidates: dict, repeats: int) -> tuple[dict, dict]:
    """Fastest wall time and fastest CPU time (this process, every thread) of each candidate, in rounds of
    rotating order (on a loaded machine the CPU time is what the process itself spent)."""
    wall, cpu, names = {n: [] for n in candidates}, {n: [] for n in candidates}, list(candidates)
    for round_ in range(repeats + 1):
        for name in names[round_ % len(names):] + names[: round_ % len(names)]:
            w, c = time.perf_counter(), time.process_time()
            candidates[name]()
            wall[name].append(time.perf_counter() - w)
            cpu[name].append(time.process_time() - c)
    return {n: min(ts[1:]) for n, ts in wall.items()}, {n: min(ts[1:]) for n, ts in cpu.items()}  # first: warm-up


def pass_costs(target, draft, k_max: int, repeats: int = 30) -> dict:
    """Median CPU time of one pass over a warm 64-token cache: the target's 1-token step, its (k+1)-token verify
    pass for each k, and a 1-token step of the draft."""
    out = {}
    for name, model, tokens in [("target 1", target, 1), *[(f"target {k + 1}", target, k + 1)
                                                           for k in range(1, k_max + 1)], ("draft 1", draft, 1)]:
        cache = KVCache(model.num_layers, max_len=128)
        model(torch.arange(64)[None], cache=cache)
        ts = []
        for _ in range(repeats):
            c = time.process_time()
            model(torch.arange(tokens)[None], cache=cache)
            ts.append(time.process_time() - c)
            cache.crop(64)
        out[name] = sorted(ts)[len(ts) // 2]
    return out


def speculative_sweep(rng, repeats: int) -> tuple[list[list], tuple[str, float]]:
    """A 6-layer target, 4 prompts of 64 new tokens: plain greedy against speculative decoding by its first 2
    layers (an early-exit draft) at k = 1..4 and by prompt lookup at k = 3, tokens equal first; then wall and CPU
    time side by side, and what one pass of each kind costs."""
    target = GPT(GPTConfig(**{**MODEL, "num_layers": 6, "init": "gpt2", "embedding_std": 0.05}), seed=0).eval()
    draft = early_exit_draft(target, 2)
    prompts = [[rng.randrange(MODEL["vocab_size"]) for _ in range(16)] for _ in range(4)]
    configs = {f"early exit 2/6, k={k}": (k, draft) for k in SPEC_KS} | {"prompt lookup, k=3": (3, None)}
    stats: dict[str, list] = {}
    with torch.inference_mode():
        plain = [greedy_reference(target, p, SPEC_NEW) for p in prompts]
        for name, (k, d) in configs.items():
            runs = [speculative_generate(target, p, SPEC_NEW, k, d) for p in prompts]
            stats[name] = [s for _, s in runs]
            if [toks for toks, _ in runs] != plain:
                raise SystemExit(f"correctness check failed: {name} changed the tokens")
        print("  check speculative decoding (every draft and k) equals plain greedy: True")
        candidates = {"plain greedy": lambda: [greedy_reference(target, p, SPEC_NEW) for p in prompts]}
        candidates |= {name: (lambda k=k, d=d: [speculative_generate(target, p, SPEC_NEW, k, d) for p in prompts])
                       for name, (k, d) in configs.items()}
        wall, cpu = timed_rounds(candidates, repeats)
        costs = pass_costs(target, draft, max(SPEC_KS))
    rows, base, tokens = [], costs["target 1"], SPEC_NEW * len(prompts)
    for name, runs in stats.items():
        proposed, accepted = sum(s.proposed for s in runs), sum(s.accepted for s in runs)
        passes, drafts = sum(s.target_passes for s in runs), sum(s.draft_passes for s in runs)
        # plain greedy: one 1-token step per token; speculative: per pass, a (k+1)-token verify and its drafts
        per_pass = costs[f"target {configs[name][0] + 1}"] / base + drafts / passes * costs["draft 1"] / base
        rows.append([name, f"{accepted / max(proposed, 1):.2f}", f"{tokens / passes:.2f}", f"{drafts / tokens:.2f}",
                     f"{wall['plain greedy'] / wall[name]:.2f}x", f"{cpu['plain greedy'] / cpu[name]:.2f}x",
                     f"{tokens / passes / per_pass:.2f}x"])
    rows += [[f"CPU time of a {k + 1}-token target pass / a 1-token step", "", "", "", "",
              f"{costs[f'target {k + 1}'] / base:.2f}", ""] for k in SPEC_KS]
    rows.append(["CPU time of a draft pass / a target step", "", "", "", "", f"{costs['draft 1'] / base:.2f}", ""])
    best = max(configs, key=lambda name: wall["plain greedy"] / wall[name])
    return rows, (best, wall["plain greedy"] / wall[best])


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

    spec_rows, best = speculative_sweep(rng, repeats)
    read_model = GPT(GPTConfig(**READ_MODEL), seed=0).eval()
    with torch.inference_mode():
        read_rows, read_ratios = paged_reads(read_model, repeats)

    continuous_over_static = rate["continuous batching"] / rate["static batching"]
    rows += [["paged waste per sequence (positions)", f"{waste:.1f}", "", "", f"block = {BLOCK}"],
             ["contiguous waste per sequence (positions)", f"{waste_contiguous:.1f}", "", "", ""],
             ["shared 256-token prefix: time saved", f"{saved:.0%}", "", "", ""]]
    print()
    print(common.markdown_table(headers, rows))
    targets = [[f"continuous >= {MIN_CONTINUOUS_OVER_STATIC:.0f}x static batching throughput",
                f"{continuous_over_static:.2f}x", common.verdict(continuous_over_static >= MIN_CONTINUOUS_OVER_STATIC)],
               ["paged waste < one block per sequence", f"{waste:.1f} < {BLOCK}", common.verdict(waste < BLOCK)]]
    least_memory = min(m for m, _ in read_ratios.values())
    targets += [[f"blocks read allocates >= {MIN_READ_MEMORY_RATIO:.0f}x fewer bytes than the gather (every context)",
                 f"{least_memory:.1f}x", common.verdict(least_memory >= MIN_READ_MEMORY_RATIO)],
                [f"blocks read no slower than the gather at 8 x {READ_CONTEXTS[-1]}",
                 f"{read_ratios[READ_CONTEXTS[-1]][1]:.2f}x", common.verdict(read_ratios[READ_CONTEXTS[-1]][1] >= 1)],
                [f"speculative faster than plain greedy in wall time at its best draft and k ({best[0]})",
                 f"{best[1]:.2f}x", common.verdict(best[1] > 1)]]
    read_headers = ["decode step, 8 sequences x context", "gather MiB", "blocks MiB", "memory ratio", "gather ms",
                    "blocks ms", "time ratio"]
    print()
    print(common.markdown_table(read_headers, read_rows))
    print()
    print(common.markdown_table(SPEC_HEADERS, spec_rows))
    print()
    print(common.markdown_table(["target", "measured", "result"], targets))
    common.save("bench_serving", config, table={"headers": headers, "rows": rows},
                extra_tables=[{"headers": read_headers, "rows": read_rows},
                              {"headers": SPEC_HEADERS, "rows": spec_rows}], targets=targets)
    return {"continuous_over_static": continuous_over_static, "waste": waste, "saved": saved, "speedup": best[1],
            "reads": read_ratios}


REAL_TEXTS = ["The capital of France is", "def fibonacci(n):\n    ", "Attention is all you", "Once upon a time",
              "The three primary colours are", "import numpy as np\nimport", "The quick brown fox", "Water boils at"]


def real_model(num_requests: int = 8, new_tokens: int = 32) -> dict:
    """The real SmolLM2-135M: the course's engine vs HF generate_batch, then speculative decoding (docstring)."""
    import time

    import transformers

    from attention_course.decoder import Decoder
    from attention_course.pretrained import load_smollm2

    tokenizer, hf = load_smollm2()
    model = Decoder.from_hf(hf)
    prompts = [tokenizer(t).input_ids for t in (REAL_TEXTS * num_requests)[:num_requests]]
    config = transformers.GenerationConfig(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                                           eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.eos_token_id)
    with torch.inference_mode():  # a warm-up request each first: HF sets up its paged cache and workers once
        hf.generate_batch(inputs=prompts[:1], generation_config=config, progress_bar=False)
        Engine(model, num_blocks=64, block_size=BLOCK).run([Request(0, prompts[0], new_tokens)])
        start = time.perf_counter()
        theirs = hf.generate_batch(inputs=prompts, generation_config=config, progress_bar=False)
        hf_s = time.perf_counter() - start
        start = time.perf_counter()
        engine = Engine(model, num_blocks=64 * num_requests, block_size=BLOCK, max_seqs=MAX_SEQS,
                        max_batch_tokens=MAX_TOKENS)
        ours = engine.run([Request(i, p, new_tokens) for i, p in enumerate(prompts)])
        ours_s = time.perf_counter() - start
    hf_tokens = [out.generated_tokens for out in theirs.values()]  # in request order
    same = [ours[i] for i in range(len(prompts))] == hf_tokens
    generated = num_requests * new_tokens
    print(f"  real model: {num_requests} requests x {new_tokens} new tokens; course engine tokens == HF generate_batch "
          f"tokens: {same}")
    print(common.markdown_table(["SmolLM2-135M, float32", "seconds", "tokens / s"],
                                [["HF generate_batch", f"{hf_s:.1f}", f"{generated / hf_s:.1f}"],
                                 ["course Engine (paged, continuous)", f"{ours_s:.1f}", f"{generated / ours_s:.1f}"],
                                 ["course / HF", "", f"{hf_s / ours_s:.2f}x"]]))
    rates = {}
    with torch.inference_mode():
        for name, draft in (("prompt lookup", None), ("early exit, 8 of 30 layers", early_exit_draft(model, 8))):
            runs = [speculative_generate(model, p, new_tokens, 3, draft) for p in prompts[:2]]
            equal = all(toks == ours[i] for i, (toks, _) in enumerate(runs))
            rates[name] = sum(s.accepted for _, s in runs) / max(1, sum(s.proposed for _, s in runs))
            print(f"  speculative k=3 by {name}: tokens == plain greedy: {equal}; acceptance rate {rates[name]:.2f}")
    return {"same": same, "ratio": hf_s / ours_s, "acceptance": rates}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--real", action="store_true", help="only the real SmolLM2-135M against HF generate_batch")
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=32)
    args = parser.parse_args()
    if args.real:
        real_model(args.requests, args.new_tokens)
    else:
        main(args.repeats)
