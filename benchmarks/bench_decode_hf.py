"""Sequential greedy decoding, the course's GPT against Hugging Face ``generate`` on the same weights (CPU fp32).

Model: the StarCoder2 twin of a 4-layer GPT (D=128, H=4, H_kv=2, RoPE, vocabulary 256, random seeded weights;
``interop.hf_models.to_hf_starcoder2``, SDPA attention on both sides). Workload: 4 prompts of 32 tokens, 64 new
tokens each, decoded one request at a time: ``GPT.generate`` (a preallocated ``KVCache``) against
``generate(do_sample=False)`` (HF's ``DynamicCache``). Correctness first: the same tokens. Then both run side by side
in rounds (rotating order), and torch.profiler counts the aten ops of one cached decode step of each.

Paged: the same 4 prompts served together, continuous batching on a paged cache: the course's ``serving.Engine``
(``PagedKVCache``, blocks of 16) against HF's ``generate_batch`` (attention "paged|eager", its paged cache). Each
engine step is timed (HF's in its background thread, by wrapping its loop body); the decode step's time is the median
of the steps after the prefill, the fastest over the rounds; aten ops of one decode step (the 10th step) of each.

Targets: the course's decoding at most 1.0x HF's time, and its paged decode step at most 1.0x HF's (issue 41);
aten ops per step printed for both.

Usage: python benchmarks/bench_decode_hf.py [--repeats N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import common  # first: it sets OMP_WAIT_POLICY and the TF log level before torch or TensorFlow load
import torch
from torch.profiler import ProfilerActivity, profile

from attention_course.gpt import GPT, GPTConfig
from attention_course.kv_cache import KVCache
from attention_course.interop.hf_models import to_hf_starcoder2
from attention_course.serving.scheduler import Engine, Request

os.environ.setdefault("HF_HUB_OFFLINE", "1")
MODEL = dict(vocab_size=256, d_model=128, num_heads=4, num_kv_heads=2, num_layers=4, positions="rope",
             tie_embeddings=False, init="pytorch", backend="sdpa")
PROMPTS, PROMPT_LEN, NEW = 4, 32, 64
MAX_RATIO = 1.0
BLOCK_SIZE, PROFILED_STEP = 16, 10


def aten_ops(step) -> int:
    """aten ops (every call, nested ones included) that one call of ``step`` launches."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    return sum(e.count for e in prof.key_averages() if e.key.startswith("aten::"))


def decode_step_ops(model, hf, prompt) -> tuple[int, int]:
    """aten ops of one cached decode step (after a prefill of ``prompt``): ours, HF's."""
    from transformers import DynamicCache

    token = prompt[:, -1:]
    cache = KVCache(model.num_layers, max_len=prompt.size(1) + 2)
    model(prompt, cache=cache)
    past = DynamicCache(config=hf.config)
    hf(prompt, cache=past, use_cache=True)
    position = torch.tensor([[prompt.size(1)]])
    return (aten_ops(lambda: model(token, cache=cache, last_only=True)),
            aten_ops(lambda: hf(token, cache=past, use_cache=True, position_ids=position)))


def timed_steps(step, record: list) -> bool:
    """Run one engine step (``step()`` returns whether it ran a forward pass); append its seconds, or its aten
    ops as ("ops", n) for the ``PROFILED_STEP``-th step."""
    index = sum(1 for r in record if not isinstance(r, tuple))
    if index == PROFILED_STEP and not any(isinstance(r, tuple) for r in record):  # once: the step is then not timed
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            ran = step()
        record.append(("ops", sum(e.count for e in prof.key_averages() if e.key.startswith("aten::"))))
        return ran
    start = time.perf_counter()
    ran = step()
    if ran:
        record.append(time.perf_counter() - start)
    return ran


def course_paged(model, prompts) -> tuple[dict, list]:
    """Serve the prompts with the course's engine, one step at a time: (tokens by request, step record)."""
    engine, record = Engine(model, num_blocks=4 * PROMPTS, block_size=BLOCK_SIZE, max_seqs=PROMPTS,
                            max_batch_tokens=PROMPTS * PROMPT_LEN), []
    for i, prompt in enumerate(prompts):
        engine.add(Request(i, prompt, NEW))
    while engine.waiting or engine.running:
        timed_steps(lambda: engine.step().batch != [], record)
    return engine.finished, record


def hf_paged(hf, prompts) -> tuple[dict, list]:
    """Serve the prompts with HF's ``generate_batch``; its loop body (prepare the batch, forward, update) timed."""
    from transformers import GenerationConfig
    from transformers.generation.continuous_batching import continuous_api

    manager, record = continuous_api.ContinuousBatchingManager, []
    body = manager._generation_loop_body

    def timed_body(self, processor, bootstrapping):
        before, result = self.current_batch, []
        timed_steps(lambda: result.append(body(self, processor, bootstrapping)) or self.current_batch != before,
                    record)
        return result[0]

    config = GenerationConfig(max_new_tokens=NEW, do_sample=False, eos_token_id=-1, pad_token_id=0)
    manager._generation_loop_body = timed_body
    try:
        out = hf.generate_batch(inputs=prompts, generation_config=config, progress_bar=False)
    finally:
        manager._generation_loop_body = body
    return {int(k.split("_")[1]): v.generated_tokens for k, v in out.items()}, record


def decode_step(record: list) -> float:
    """Median seconds of a decode step: every timed step after the first (the prefill)."""
    return statistics.median(r for r in record[1:] if not isinstance(r, tuple))


def paged(model, prompts, repeats: int) -> dict:
    """Time the paged decode step of both engines in interleaved rounds; check they give the same tokens."""
    hf = to_hf_starcoder2(model, attn_implementation="paged|eager")
    prompts = [p[0].tolist() for p in prompts]
    runs = {"course Engine (PagedKVCache)": lambda: course_paged(model, prompts),
            "HF generate_batch (paged, eager)": lambda: hf_paged(hf, prompts)}
    steps, ops, tokens = {name: [] for name in runs}, {}, {}
    with torch.inference_mode():
        for r in range(repeats):
            for name in list(runs)[r % 2 :] + list(runs)[: r % 2]:
                tokens[name], record = runs[name]()
                steps[name].append(decode_step(record))
                ops[name] = next(x[1] for x in record if isinstance(x, tuple))
    same = len({str(sorted(t.items())) for t in tokens.values()}) == 1
    print(f"  check: paged, the same tokens as HF generate_batch: {same}")
    if not same:
        raise SystemExit("correctness check failed: the course's paged tokens differ from HF's")
    return {"steps": steps, "ops": ops}


def main(repeats: int = 3) -> dict:
    config = common.setup("bench_decode_hf", {"model": MODEL, "prompts": PROMPTS, "prompt_len": PROMPT_LEN,
                                              "new_tokens": NEW})
    model = GPT(GPTConfig(**MODEL), seed=0).eval()
    hf = to_hf_starcoder2(model, attn_implementation="sdpa")
    prompts = torch.randint(0, MODEL["vocab_size"], (PROMPTS, 1, PROMPT_LEN),
                            generator=torch.Generator().manual_seed(0))

    def ours():
        return [model.generate(p, NEW) for p in prompts]

    def theirs():
        return [hf.generate(p, max_new_tokens=NEW, do_sample=False, min_new_tokens=NEW, pad_token_id=0)
                for p in prompts]

    with torch.inference_mode():
        same = all(torch.equal(a, b) for a, b in zip(ours(), theirs(), strict=True))
        ops_ours, ops_hf = decode_step_ops(model, hf, prompts[0])
    print(f"  check: the same tokens as HF generate: {same}")
    if not same:
        raise SystemExit("correctness check failed: the course's greedy tokens differ from HF's")
    times = common.interleaved({"course GPT.generate": ours, "HF generate": theirs}, repeats)
    paged_run = paged(model, prompts, repeats)
    ratio = common.fastest(times["course GPT.generate"]) / common.fastest(times["HF generate"])
    tokens = PROMPTS * NEW
    headers = ["decoder", "fastest s", "median s", "ms / token", "aten ops / decode step"]
    rows = [[name, f"{common.fastest(ts):.2f}", f"{common.median(ts):.2f}",
             f"{1e3 * common.fastest(ts) / tokens:.2f}", ops]
            for (name, ts), ops in zip(times.items(), (ops_ours, ops_hf), strict=True)]
    print()
    print(common.markdown_table(headers, rows))
    targets = [[f"course decoding <= {MAX_RATIO:.1f}x HF generate's time", f"{ratio:.2f}x",
                common.verdict(ratio <= MAX_RATIO)]]
    paged_headers = ["paged engine", "fastest ms / decode step", "median ms / decode step",
                     "aten ops / decode step"]
    paged_rows = [[name, f"{1e3 * min(ts):.2f}", f"{1e3 * statistics.median(ts):.2f}", paged_run["ops"][name]]
                  for name, ts in paged_run["steps"].items()]
    paged_ratio = min(paged_run["steps"]["course Engine (PagedKVCache)"]) / \
        min(paged_run["steps"]["HF generate_batch (paged, eager)"])
    targets.append([f"course paged decode step <= {MAX_RATIO:.1f}x HF's paged step", f"{paged_ratio:.2f}x",
                    common.verdict(paged_ratio <= MAX_RATIO)])
    print()
    print(common.markdown_table(paged_headers, paged_rows))
    print()
    print(common.markdown_table(["target", "measured", "result"], targets))
    common.save("bench_decode_hf", config, table={"headers": headers, "rows": rows},
                extra_tables=[{"headers": paged_headers, "rows": paged_rows}], targets=targets)
    return {"ratio": ratio, "ops_ours": ops_ours, "ops_hf": ops_hf, "paged_ratio": paged_ratio,
            "paged_ops": paged_run["ops"]}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    main(parser.parse_args().repeats)
