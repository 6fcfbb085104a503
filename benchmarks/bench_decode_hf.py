"""Sequential greedy decoding, the course's GPT against Hugging Face ``generate`` on the same weights (CPU fp32).

Model: the StarCoder2 twin of a 4-layer GPT (D=128, H=4, H_kv=2, RoPE, vocabulary 256, random seeded weights;
``serving.hf.to_hf_starcoder2``, SDPA attention on both sides). Workload: 4 prompts of 32 tokens, 64 new tokens each,
decoded one request at a time: ``GPT.generate`` (a preallocated ``KVCache``) against ``generate(do_sample=False)``
(HF's ``DynamicCache``). Correctness first: the same tokens. Then both run side by side in rounds (rotating order),
and torch.profiler counts the aten ops of one cached decode step of each.

Targets: the course's decoding at most 1.0x HF's time (issue 41); aten ops per step printed for both.

Usage: python benchmarks/bench_decode_hf.py [--repeats N]
"""

from __future__ import annotations

import argparse
import os

import common  # first: it sets OMP_WAIT_POLICY and the TF log level before torch or TensorFlow load
import torch
from torch.profiler import ProfilerActivity, profile

from attention_course.gpt import GPT, GPTConfig
from attention_course.kv_cache import KVCache
from attention_course.serving.hf import to_hf_starcoder2

os.environ.setdefault("HF_HUB_OFFLINE", "1")
MODEL = dict(vocab_size=256, d_model=128, num_heads=4, num_kv_heads=2, num_layers=4, positions="rope",
             tie_embeddings=False, init="pytorch", backend="sdpa")
PROMPTS, PROMPT_LEN, NEW = 4, 32, 64
MAX_RATIO = 1.0


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
    print()
    print(common.markdown_table(["target", "measured", "result"], targets))
    common.save("bench_decode_hf", config, table={"headers": headers, "rows": rows}, targets=targets)
    return {"ratio": ratio, "ops_ours": ops_ours, "ops_hf": ops_hf}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    main(parser.parse_args().repeats)
