"""Chapter 19: learned sparse attention (lightning indexer + top-k) against SDPA causal over all keys, CPU fp32.

Attention H=8 heads of Dh=64 (a KV cache of 8 keys and 8 values per token); indexer H_I=4 heads of D_I=64 over one
shared key per token; k=2048 keys per query; batch 1, T from 8k to 32k.

Decode (one new query over a cache of T tokens), side by side: *dense*, SDPA over all T keys; *indexer + top-k*,
the indexer's scores over T keys and ``topk``; *sparse*, those then SDPA over the k gathered keys and values (the
gather is what DeepSeek's FlashMLA sparse kernel does on a GPU). Prefill (T queries): SDPA causal against the
indexer's scores and top-k in blocks of 512 queries (the (T, T) scores never exist whole), and against *sparse*:
the same indexer blocks, then each query over its own k keys, gathered GATHER_BLOCK queries at a time (H x 32 x k
keys and values copied per sub-block: with PyTorch's eager kernels the gather is a copy, where a GPU kernel reads the
keys in place), timed at T = 8192 only (the copies cost about a minute there, and grow linearly with T). Bytes per
token: the dense KV cache, the indexer's key, and DeepSeek V3.2's latent and key (``sparse.costs``).

Targets: a sparse decode step at least 2x faster than dense at T=32k; the indexer + top-k over a prefill of 8k
cheaper than SDPA causal (reported with its ratio at every T: the indexer's own quadratic cost).

Usage: python benchmarks/bench_sparse.py [--repeats N]
"""

from __future__ import annotations

import argparse
import functools

import common  # noqa: I001  (before torch: it sets the TF log level and OMP_WAIT_POLICY)
import torch
import torch.nn.functional as F

from attention_course import sparse
from attention_course.sparse import costs

H, DH, HI, DI, TOP_K = 8, 64, 4, 64, 2048
DECODE_LENGTHS = (8192, 16384, 32768)
PREFILL_LENGTHS = (8192, 16384, 32768)
BLOCK = 512
SPARSE_PREFILL_LENGTH = 8192  # the one length whose whole sparse prefill is timed (see prefill)
GATHER_BLOCK = 32  # queries whose k keys are gathered at once: H * 32 * 2048 * 64 floats, 128 MiB each for K and V
MIN_DECODE_SPEEDUP = 2.0


def inputs(t: int, t_q: int, seed: int = 0):
    """Attention q (1, H, Tq, Dh), k, v (1, H, T, Dh); indexer q (1, HI, Tq, DI), key (1, 1, T, DI), weights."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, H, n, DH, generator=g) for n in (t_q, t, t))
    iq, ik = torch.randn(1, HI, t_q, DI, generator=g), torch.randn(1, 1, t, DI, generator=g)
    return q, k, v, iq, ik, torch.randn(1, HI, t_q, generator=g) * HI**-0.5


def select(iq, ik, w, t: int, top_k: int = TOP_K):
    """Top-k key indices (1, Tq, k) of the last Tq positions over t keys (bottom-right causal)."""
    scores = sparse.index_scores(iq, ik, w, DI**-0.5)  # (1, Tq, T)
    if iq.size(2) > 1:  # a prefill block: hide the future
        scores = scores.masked_fill(~torch.ones(iq.size(2), t, dtype=torch.bool).tril(t - iq.size(2)), -torch.inf)
    return scores.topk(min(top_k, t), dim=-1).indices


def sparse_decode(q, k, v, iq, ik, w):
    """One query over its top-k keys: (1, H, 1, Dh)."""
    chosen = select(iq, ik, w, k.size(2))[0, 0]  # (k,)
    return F.scaled_dot_product_attention(q, k.index_select(2, chosen), v.index_select(2, chosen))


def indexer_prefill(iq, ik, w):
    """The indexer's scores and top-k for every query, BLOCK queries at a time."""
    t = ik.size(2)
    for start in range(0, t, BLOCK):
        stop = min(start + BLOCK, t)
        select(iq[:, :, start:stop], ik[:, :, :stop], w[:, :, start:stop], stop)


def gathered_attention(q, k, v, chosen, first: int):
    """Queries q (1, H, Bq, Dh) at positions first.. over their own keys ``chosen`` (Bq, k): (1, H, Bq, Dh). A query
    with fewer than k keys up to it got future keys from topk (scored -inf): they are masked out here."""
    keys, values = k[0][:, chosen], v[0][:, chosen]  # (H, Bq, k, Dh): the gather, a copy
    visible = chosen <= torch.arange(first, first + chosen.size(0))[:, None]  # (Bq, k)
    scores = torch.einsum("hqd,hqkd->hqk", q[0], keys) * q.size(-1) ** -0.5
    weights = scores.masked_fill(~visible, -torch.inf).softmax(-1)
    return torch.einsum("hqk,hqkd->hqd", weights, values)[None]


def prefill_selection(iq, ik, w, top_k: int = TOP_K, block: int = BLOCK):
    """(start, stop, top-k key indices (Bq, k)) for each block of ``block`` queries: the indexer over the keys up to
    the block's end, as at decode (a row shorter than k also gets future keys, scored -inf)."""
    t = ik.size(2)
    for start in range(0, t, block):
        stop = min(start + block, t)
        yield start, stop, select(iq[:, :, start:stop], ik[:, :, :stop], w[:, :, start:stop], stop, top_k)[0]


def sparse_prefill(q, k, v, iq, ik, w, top_k: int = TOP_K, block: int = BLOCK, gather_block: int = GATHER_BLOCK):
    """Every query over its own top-k keys: the indexer's blocks of ``block`` queries, then the attention over the
    gathered keys ``gather_block`` queries at a time: (1, H, T, Dh)."""
    out = torch.empty_like(q)
    for start, stop, chosen in prefill_selection(iq, ik, w, top_k, block):
        for first in range(start, stop, gather_block):
            last = min(first + gather_block, stop)
            out[:, :, first:last] = gathered_attention(q[:, :, first:last], k, v, chosen[first - start:last - start],
                                                       first)
    return out


def correctness() -> None:
    """Small float64 case: the gathered sparse step equals the course's top-k mask under masked SDPA."""
    q, k, v, iq, ik, w = (x.double() for x in inputs(300, 1, seed=1))
    scores = sparse.index_scores(iq, ik, w, DI**-0.5)
    mask = sparse.top_k_selection(scores, 40)[:, None]  # (1, 1, 1, 300)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    chosen = scores[0, 0].topk(40).indices
    out = F.scaled_dot_product_attention(q, k[:, :, chosen], v[:, :, chosen])
    common.check("gathered top-40 vs masked SDPA (float64, T=300)", common.max_abs_diff(out, ref), 1e-12)
    # prefill: every query over its own top-40 of the keys up to it (the first 40 queries see fewer than 40), against
    # SDPA with those keys as its mask. The selection is the indexer's, block by block: with 4 ReLU heads many scores
    # are exactly 0, and which of the tied keys topk keeps depends on the row's length (chapter 19's ties trap)
    q, k, v, iq, ik, w = (x.double() for x in inputs(300, 300, seed=2))
    mask = torch.zeros(300, 300, dtype=torch.bool)
    for start, _, chosen in prefill_selection(iq, ik, w, top_k=40, block=128):
        mask[torch.arange(start, start + chosen.size(0))[:, None], chosen] = True
    mask &= torch.ones(300, 300, dtype=torch.bool).tril()
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    out = sparse_prefill(q, k, v, iq, ik, w, top_k=40, block=128, gather_block=48)
    common.check("sparse prefill, top-40 gathered vs masked SDPA (float64, T=300)", common.max_abs_diff(out, ref),
                 1e-12)


def decode(repeats: int) -> tuple[list, dict]:
    rows, ratios = [], {}
    for t in DECODE_LENGTHS:
        q, k, v, iq, ik, w = inputs(t, 1)
        times = common.interleaved({
            "dense": functools.partial(F.scaled_dot_product_attention, q, k, v),
            "indexer + top-k": functools.partial(select, iq, ik, w, t),
            "sparse": functools.partial(sparse_decode, q, k, v, iq, ik, w),
        }, repeats=20 * repeats, warmup=3)  # fmt: skip
        ms = {name: common.fastest(ts) * 1e3 for name, ts in times.items()}
        ratios[t] = ms["dense"] / ms["sparse"]
        rows.append([t, f"{ms['dense']:.2f}", f"{ms['indexer + top-k']:.2f}", f"{ms['sparse']:.2f}",
                     f"{ratios[t]:.1f}x", f"{ms['indexer + top-k'] / ms['sparse']:.2f}"])
        print(f"  decode T={t}: " + ", ".join(f"{n} {m:.2f} ms" for n, m in ms.items()), flush=True)
    return rows, ratios


def prefill(repeats: int) -> tuple[list, dict]:
    rows, ratios = [], {}
    for t in PREFILL_LENGTHS:
        q, k, v, iq, ik, w = inputs(t, t)
        long = t > PREFILL_LENGTHS[0]  # seconds per call: one timed round, no warm-up
        candidates = {
            "sdpa causal": functools.partial(F.scaled_dot_product_attention, q, k, v, is_causal=True),
            "indexer + top-k": functools.partial(indexer_prefill, iq, ik, w),
        }  # fmt: skip
        if t == SPARSE_PREFILL_LENGTH:  # the gathers copy k keys per query: 76 s at 8k on one thread, ~linear in T
            candidates["sparse"] = functools.partial(sparse_prefill, q, k, v, iq, ik, w)
        times = common.interleaved(candidates, repeats=1 if long or "sparse" in candidates else repeats,
                                   warmup=0 if long or "sparse" in candidates else 1)
        ms = {name: common.fastest(ts) * 1e3 for name, ts in times.items()}
        ratios[t] = ms["indexer + top-k"] / ms["sdpa causal"]
        sparse_ms = ms.get("sparse")
        rows.append([t, f"{ms['sdpa causal']:.0f}", f"{ms['indexer + top-k']:.0f}",
                     "-" if sparse_ms is None else f"{sparse_ms:.0f}", f"{ratios[t]:.2f}",
                     "-" if sparse_ms is None else f"{sparse_ms / ms['sdpa causal']:.1f}"])
        print(f"  prefill T={t}: " + ", ".join(f"{n} {m:.0f} ms" for n, m in ms.items()), flush=True)
    return rows, ratios


def cache_rows() -> list:
    dense = 2 * H * DH * 4
    v32 = costs.cache_bytes_per_token(costs.DEEPSEEK_V32)
    return [["this run: K and V, 8 heads of 64, fp32", dense],
            ["this run: indexer key, 64, fp32", DI * 4],
            ["DeepSeek V3.2: latent + rotated key, bf16", f"{v32['latent']:.0f}"],
            ["DeepSeek V3.2: indexer key, FP8 + scale", f"{v32['indexer key']:.0f}"]]


def main(repeats: int = 3) -> dict:
    config = common.setup("bench_sparse", {"heads": H, "head_dim": DH, "indexer heads": HI, "indexer dim": DI,
                                           "top_k": TOP_K, "prefill block": BLOCK})
    correctness()
    decode(1)  # a warm-up pass, not reported: the first lengths timed in a fresh process ran several times slower
    decode_rows, decode_ratio = decode(repeats)
    decode_headers = ["decode, T", "dense ms", "indexer + top-k ms", "sparse ms", "dense / sparse",
                      "indexer share of sparse"]
    print()
    print(common.markdown_table(decode_headers, decode_rows))
    prefill_rows, prefill_ratio = prefill(repeats)
    sparse_ratio = float(next(row[-1] for row in prefill_rows if row[0] == SPARSE_PREFILL_LENGTH))
    prefill_headers = ["prefill, T", "sdpa causal ms", "indexer + top-k ms", "sparse ms", "indexer + top-k / sdpa",
                       "sparse / sdpa"]
    print()
    print(common.markdown_table(prefill_headers, prefill_rows))
    bytes_headers = ["cache, per token and layer", "bytes"]
    print()
    print(common.markdown_table(bytes_headers, cache_rows()))
    longest, first = DECODE_LENGTHS[-1], PREFILL_LENGTHS[0]
    targets = [
        [f"sparse decode >= {MIN_DECODE_SPEEDUP:.0f}x faster than dense at T={longest}",
         f"{decode_ratio[longest]:.1f}x", common.verdict(decode_ratio[longest] >= MIN_DECODE_SPEEDUP)],
        [f"indexer + top-k over a prefill of {first} cheaper than SDPA causal", f"{prefill_ratio[first]:.2f}",
         common.verdict(prefill_ratio[first] < 1)],
        [f"indexer + top-k / SDPA causal at prefill T={PREFILL_LENGTHS[-1]} (reported)",
         f"{prefill_ratio[PREFILL_LENGTHS[-1]]:.2f}", "-"],
        [f"sparse prefill (indexer, top-k, gathered attention) / SDPA causal at T={SPARSE_PREFILL_LENGTH} (reported)",
         f"{sparse_ratio:.1f}", "-"],
    ]
    print()
    print(common.markdown_table(["target", "measured", "result"], targets))
    common.save("bench_sparse", config, table={"headers": decode_headers, "rows": decode_rows},
                time_table={"headers": prefill_headers, "rows": prefill_rows},
                extra_tables=[{"headers": bytes_headers, "rows": cache_rows()}], targets=targets)
    return {"decode": decode_ratio, "prefill": prefill_ratio}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    main(parser.parse_args().repeats)
