"""DeepSeek V4's compressed attention (attention_course.sparse.compressed) against transformers' DeepseekV4Attention:
the sliding, CSA and HCA kinds, prefill and cached decode through each side's own cache, and planted mistakes."""

from __future__ import annotations

import pytest
import torch

from attention_course.interop.hf_models import build_hf_attention, hf_decode, hf_forward, relative_error
from attention_course.kv_cache import KVCache
from attention_course.positions import RotaryTable
from attention_course.sparse import compressed
from attention_course.sparse.compressed import CompressedAttention, entries_visible

KIND_OF = {"sliding": "sliding_attention", "csa": "compressed_sparse_attention", "hca": "heavily_compressed_attention"}


def hf_layer(kind, *, window=5, csa_rate=2, hca_rate=4, top_k=3, index_heads=3, seed=0):
    """One DeepseekV4Attention of ``kind``: 4 heads of 16 (8 rotated), K = V, window 5, 2 output groups."""
    types = list(KIND_OF.values())
    return build_hf_attention(
        "deepseek_v4", types.index(KIND_OF[kind]), seed=seed, hidden_size=32, num_attention_heads=4, head_dim=16,
        q_lora_rank=12, partial_rotary_factor=0.5, sliding_window=window, o_groups=2, o_lora_rank=6,
        compress_rates={"compressed_sparse_attention": csa_rate, "heavily_compressed_attention": hca_rate},
        index_n_heads=index_heads, index_head_dim=8, index_topk=top_k, layer_types=types)


def x_of(b, t, seed=1):
    return torch.randn(b, t, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


def course_decode(ours, x, prefill, chunk=1):
    """The course layer through the course's cache: ``prefill`` tokens at once, then ``chunk`` at a time."""
    cache, outputs, t = KVCache(1, windows=[ours.window]), [], x.size(1)
    with torch.no_grad():
        for start, end in [(0, prefill), *((p, min(p + chunk, t)) for p in range(prefill, t, chunk))]:
            outputs.append(ours(x[:, start:end], cache=cache, layer=0))
    return torch.cat(outputs, dim=1), cache


@pytest.mark.parametrize("kind", ["sliding", "csa", "hca"])
@pytest.mark.parametrize("b, t, prefill", [(2, 13, 5), (1, 17, 8)])
def test_each_kind_equals_transformers_in_prefill_and_cached_decode(kind, b, t, prefill):
    """Forward over T tokens, and prefill then decode (Tq = 1 over a growing Tk) through each side's own cache:
    equal to HF (its float32 RoPE and norms: 1e-6), and the course's decode equal to its own forward (1e-12)."""
    hf = hf_layer(kind)
    ours = CompressedAttention.from_hf(hf)
    x = x_of(b, t)
    with torch.no_grad():
        whole = ours(x)
    assert relative_error(whole, hf_forward(hf, x)) < 1e-6
    decoded, cache = course_decode(ours, x, prefill)
    assert relative_error(decoded, hf_decode(hf, x, prefill)) < 1e-6
    assert relative_error(decoded, whole) < 1e-12
    # K = V: one vector per kept token, stored once (the values are empty), the window's last W - 1 tokens
    assert cache.keys[0].shape == (b, 1, ours.window - 1, 16) and cache.values[0].size(-1) == 0
    if kind != "sliding":
        rate = ours.rate
        assert cache.state(0)["entries"].entries.shape == (b, t // rate, 16)
        assert cache.state(0)["entries"].pending.size(1) == t % rate


@pytest.mark.parametrize("kind", ["sliding", "csa", "hca"])
@pytest.mark.parametrize("prefill", [4, 5])
def test_chunked_prefill_across_block_boundaries(kind, prefill):
    """Chunks of 3 queries over a cache (Tq = 3, Tk up to 16): a chunk ends mid-block (rates 2 and 4) and the next
    completes it; each side's cache equals HF's one shot and the course's own forward. The CSA indexer has 8 heads
    here: with 3, ReLU zeros tie and the chunked top-k may differ from the one shot's (the trap, tested below)."""
    hf = hf_layer(kind, index_heads=8)
    ours = CompressedAttention.from_hf(hf)
    x = x_of(2, 16, seed=2)
    with torch.no_grad():
        whole = ours(x)
    chunked = course_decode(ours, x, prefill, chunk=3)[0]
    assert relative_error(chunked, whole) < 1e-12
    assert relative_error(chunked, hf_decode(hf, x, prefill, chunk=3)) < 1e-6


def test_the_ties_trap_reaches_v4s_indexer_and_transformers_falls_in_alike():
    """With 3 indexer heads the ReLU leaves tied zero scores over compressed entries: chunked prefill picks other
    entries than the one shot does (far apart), and HF's chunked run picks the same ones as the course's (equal)."""
    hf = hf_layer("csa", index_heads=3)
    ours = CompressedAttention.from_hf(hf)
    x = x_of(2, 16, seed=2)
    with torch.no_grad():
        whole = ours(x)
    chunked, hf_chunked = course_decode(ours, x, 5, chunk=3)[0], hf_decode(hf, x, 5, chunk=3)
    assert relative_error(chunked, whole) > 1e-2 and relative_error(hf_chunked, hf_forward(hf, x)) > 1e-2
    assert relative_error(chunked, hf_chunked) < 1e-6


@pytest.mark.parametrize("top_k", [1, 2, 8])
def test_csa_top_k_values_and_k_beyond_the_entries(top_k):
    """The indexer's k entries per query for several k, one larger than every query's entries (all kept)."""
    hf = hf_layer("csa", top_k=top_k, index_heads=4, seed=3)
    ours = CompressedAttention.from_hf(hf)
    x = x_of(2, 15, seed=4)
    with torch.no_grad():
        assert relative_error(ours(x), hf_forward(hf, x)) < 1e-6
    assert relative_error(course_decode(ours, x, 6)[0], hf_decode(hf, x, 6)) < 1e-6


def test_an_entry_is_seen_once_its_whole_block_is():
    visible = entries_visible(torch.arange(8), 3, 3)
    assert visible.int().tolist() == [[0, 0, 0], [0, 0, 0], [1, 0, 0], [1, 0, 0], [1, 0, 0], [1, 1, 0], [1, 1, 0],
                                      [1, 1, 0]]


def _planted(monkeypatch, ours, mistake):
    if mistake == "no-sinks":
        ours.sinks.data.zero_()
    elif mistake == "output-not-rotated-back":  # the identity rotation where the query's angle is undone
        monkeypatch.setattr(ours, "output", lambda heads, rotary: CompressedAttention.output(
            ours, heads, RotaryTable(torch.ones_like(rotary.cos), torch.zeros_like(rotary.sin))))
    elif mistake == "entry-seen-a-token-early":
        monkeypatch.setattr(compressed, "entries_visible", lambda p, n, rate: entries_visible(p + 1, n, rate))
    elif mistake == "values-not-the-keys":
        monkeypatch.setattr(compressed, "attend", lambda q, k, v, mask, **kw: _attend(q, k, v.flip(-1), mask, **kw))
    elif mistake == "csa-no-overlap":
        monkeypatch.setattr(compressed, "pool_blocks", lambda kv, gate, rate, overlap: _pool(kv, gate, rate, overlap))
    elif mistake == "top-k-plus-one":
        ours.top_k += 1


_attend = compressed.attend
_pool_blocks = compressed.pool_blocks


def _pool(kv, gate, rate, overlap):
    """Each entry pools its own block's series b only (the previous block's series a dropped)."""
    if not overlap:
        return _pool_blocks(kv, gate, rate, overlap)
    dh = kv.size(-1) // 2
    b, n = kv.size(0), kv.size(1) // rate
    kv, gate = (z.view(b, n, rate, 2 * dh)[..., dh:] for z in (kv, gate))
    return (kv * gate.softmax(dim=2)).sum(dim=2)


@pytest.mark.parametrize("kind, mistake", [
    ("sliding", "no-sinks"), ("hca", "no-sinks"), ("sliding", "output-not-rotated-back"),
    ("hca", "entry-seen-a-token-early"), ("csa", "values-not-the-keys"), ("csa", "csa-no-overlap"),
    ("csa", "top-k-plus-one"),
])
def test_each_planted_mistake_misses_transformers(monkeypatch, kind, mistake):
    """The comparison can fail: each mistake a rebuild of V4 could make leaves the output far from HF's."""
    hf = hf_layer(kind, seed=5)
    ours = CompressedAttention.from_hf(hf)
    x = x_of(2, 13, seed=6)
    _planted(monkeypatch, ours, mistake)
    with torch.no_grad():
        assert relative_error(ours(x), hf_forward(hf, x)) > 1e-3


def test_bad_options_are_named():
    sizes = dict(window=4, q_lora_rank=8, rope_dim=4, inv_freq=torch.ones(2), o_groups=2, o_lora_rank=4)
    with pytest.raises(ValueError, match="kind must be one of"):
        CompressedAttention(16, 2, 8, kind="dense", **sizes)
    with pytest.raises(ValueError, match="o_groups=3 must divide num_heads \\* head_dim = 16"):
        CompressedAttention(16, 2, 8, **{**sizes, "o_groups": 3})
    with pytest.raises(TypeError, match="rate must be an int"):
        CompressedAttention(16, 2, 8, kind="hca", **sizes)
    with pytest.raises(TypeError, match="top_k must be an int"):
        CompressedAttention(16, 2, 8, kind="csa", rate=2, index_heads=2, index_head_dim=4, **sizes)
    with pytest.raises(TypeError, match="mirrors transformers' DeepseekV4Attention"):
        CompressedAttention.from_hf(torch.nn.Linear(2, 2))
