"""Checks of chapter 8: the KV-cache size, repeated key/value heads, grouped-query attention. Correct code in several
styles passes with one line; each planted wrong answer (PLANTED) gets its own code."""

import functools

import numpy as np
import pytest
import torch

import attention_course as ac
from attention_course import bug_zoo, checks, kv_cache
from attention_impls import (
    gqa_grouped_queries,
    gqa_library,
    gqa_torch_builtin,
    kv_cache_bytes,
    sdpa_raises,
)


def kv_bytes_per_token(num_layers, num_kv_heads, head_dim, seq_len, batch_size=1, bytes_per_element=2):
    return 2 * num_layers * num_kv_heads * head_dim * bytes_per_element * batch_size  # seq_len left out


def kv_bytes_no_defaults(num_layers, num_kv_heads, head_dim, seq_len, batch_size, bytes_per_element):
    return kv_cache_bytes(num_layers, num_kv_heads, head_dim, seq_len, batch_size, bytes_per_element)


def kv_bytes_not_implemented(num_layers, num_kv_heads, head_dim, seq_len, batch_size=1, bytes_per_element=2):
    raise NotImplementedError("Exercise 1: How big is the cache?")


def gqa_without_repeat(q, k, v, mask=None):
    """Runs for H_kv = H and, by broadcasting, for H_kv = 1; fails in between."""
    return ac.scaled_dot_product_attention(q, k, v, mask)


def gqa_with(sdpa, q, k, v, mask=None):
    n_rep = q.shape[1] // k.shape[1]
    return sdpa(q, k.repeat_interleave(n_rep, dim=1), v.repeat_interleave(n_rep, dim=1), mask)


def gqa_returns_kv_heads(q, k, v, mask=None):
    """Averages each group's query heads: (B, H_kv, Tq, Dv)."""
    out = gqa_library(q, k, v, mask)[0]
    return out.reshape(out.shape[0], k.shape[1], -1, *out.shape[2:]).mean(2)


def test_kv_cache_success_lines(capsys):
    checks.check_kv_cache_bytes(kv_cache_bytes)
    checks.check_repeat_kv(kv_cache.repeat_kv)
    checks.check_grouped_query_attention(gqa_library)
    checks.check_grouped_query_attention(lambda q, k, v, mask=None: gqa_library(q, k, v, mask))
    assert capsys.readouterr().out.splitlines() == [
        "✓ kv_cache_bytes: 7 model sizes (MHA, GQA and MQA; with and without batch_size and bytes_per_element) are "
        "right",
        "✓ repeat_kv: 6 random cases (H_kv from 1 to 3, n_rep from 1 to 4; (B, H_kv, T, Dh) -> (B, H_kv * n_rep, T, "
        "Dh)) match the reference",
        "✓ gqa_library: 17 random cases (MHA, GQA and MQA head counts; decoding with Tq = 1, Tq != Tk, causal and "
        "padding masks, fully masked rows) match the reference",
        "✓ grouped_query_attention: 17 random cases (MHA, GQA and MQA head counts; decoding with Tq = 1, Tq != Tk, "
        "causal and padding masks, fully masked rows) match the reference",
    ]


def test_kv_cache_bytes_accepts_any_kind_of_number(capsys):
    checks.check_kv_cache_bytes(lambda *args, **kw: float(kv_cache_bytes(*args, **kw)))
    checks.check_kv_cache_bytes(lambda *args, **kw: np.int64(kv_cache_bytes(*args, **kw)))
    checks.check_kv_cache_bytes(lambda *args, **kw: np.array(kv_cache_bytes(*args, **kw)))
    checks.check_kv_cache_bytes(lambda *args, **kw: torch.tensor(kv_cache_bytes(*args, **kw)))
    assert capsys.readouterr().out.count("✓ kv_cache_bytes: 7 model sizes") == 4


def test_kv_cache_bytes_messages():
    with pytest.raises(checks.CheckFailed) as info:
        checks.check_kv_cache_bytes(bug_zoo.kv_cache_bytes_keys_only)
    assert str(info.value) == (
        "[cache-keys-only] Your cache size is half the right one: it counts the keys only (or the values only). The "
        "cache holds both, for every layer and every token.\n  Failing case: case 1 of 7: kv_cache_bytes(4, 8, 32, "
        "100, batch_size=3, bytes_per_element=4)")
    with pytest.raises(checks.CheckFailed) as info:
        checks.check_kv_cache_bytes(bug_zoo.kv_cache_bytes_one_sequence)
    assert str(info.value) == (
        "[cache-missing-factor] Your cache size leaves out batch_size (every sequence of the batch has its own "
        "cache).\n  Failing case: case 1 of 7: kv_cache_bytes(4, 8, 32, 100, batch_size=3, bytes_per_element=4)")
    with pytest.raises(checks.CheckFailed, match=r"^\[cache-missing-factor\] Your cache size leaves out two factors: "
                       r"the factor 2 \(the cache holds the keys AND the values\) and bytes_per_element \(you "
                       r"counted numbers, not bytes: "):
        checks.check_kv_cache_bytes(lambda n, h, dh, t, batch_size=1, bytes_per_element=2: n * h * dh * t * batch_size)
    with pytest.raises(checks.CheckFailed, match=r"^\[cache-missing-factor\] Your cache size leaves out seq_len "
                       r"\(without it you have the size of ONE token's"):
        checks.check_kv_cache_bytes(kv_bytes_per_token)
    with pytest.raises(checks.CheckFailed, match=r"^\[wrong-value\] Your answer is the size in MiB \(bytes / "
                       r"1,048,576\); return the number of bytes"):
        checks.check_kv_cache_bytes(lambda *args, **kw: kv_cache_bytes(*args, **kw) / 2**20)
    with pytest.raises(checks.CheckFailed, match=r"^\[wrong-value\] Your answer is 8 times too large: bits"):
        checks.check_kv_cache_bytes(lambda *args, **kw: kv_cache_bytes(*args, **kw) * 8)
    with pytest.raises(checks.CheckFailed) as info:
        checks.check_kv_cache_bytes(lambda *args, **kw: kv_cache_bytes(*args, **kw) + 1)
    assert str(info.value).startswith("[wrong-value] 2,457,601 is not the number of bytes of this cache, and it "
                                      "matches none of the mistakes")
    with pytest.raises(checks.CheckFailed, match=r"^\[wrong-value\] 1,228,800\.5 is not the number of bytes.*\n.*"
                       r"case 1 of 7"):
        checks.check_kv_cache_bytes(lambda *args, **kw: kv_cache_bytes(*args, **kw) / 2 + 0.5)
    with pytest.raises(checks.CheckFailed, match=r"(?s)^\[wrong-value\] .*Failing case: case 2 of 7: kv_cache_bytes"
                       r"\(32, 32, 128, 4096\)$"):  # right when the defaults are passed, wrong defaults
        checks.check_kv_cache_bytes(lambda L, h, dh, t, batch_size=1, bytes_per_element=4: kv_cache_bytes(
            L, h, dh, t, batch_size, bytes_per_element))
    with pytest.raises(checks.CheckFailed) as info:
        checks.check_kv_cache_bytes(kv_bytes_no_defaults)
    assert str(info.value).endswith("when called as kv_cache_bytes(32, 32, 128, 4096).")
    with pytest.raises(checks.CheckFailed, match=r"^\[wrong-type\] Your function returned a torch tensor of dtype "
                       r"torch.float32; expected a number of bytes \(an int\)\.\n  Failing case: case 1 of 7"):
        checks.check_kv_cache_bytes(lambda *args, **kw: torch.ones(2))


def test_repeat_kv_messages():
    with pytest.raises(checks.CheckFailed) as info:
        checks.check_repeat_kv(bug_zoo.repeat_kv_tiled)
    assert str(info.value).startswith(
        "[kv-heads-tiled] Your key/value heads are repeated as a tile, not in groups: for H_kv=2 and n_rep=3 your "
        "output heads copy the input heads [0, 1, 0, 1, 0, 1], in groups they would be [0, 0, 0, 1, 1, 1]. Query "
        "head h uses key/value head h // n_rep")
    assert str(info.value).endswith("Failing case: case 1 of 6: x of shape (2, 2, 3, 4), n_rep=3")
    with pytest.raises(checks.CheckFailed, match=r"^\[wrong-shape\] Your result has shape \(2, 2, 3, 3, 4\); expected "
                       r"\(B, H_kv \* n_rep, T, Dh\) = \(2, 6, 3, 4\)\. You have the repeated heads on an axis of "
                       r"their own"):
        checks.check_repeat_kv(lambda x, n_rep: x[:, :, None].expand(-1, -1, n_rep, -1, -1))
    with pytest.raises(checks.CheckFailed, match=r"^\[wrong-shape\] .* \(2, 2, 9, 4\); .*You repeated along another "
                       r"axis: the heads are axis 1\."):
        checks.check_repeat_kv(lambda x, n_rep: x.repeat_interleave(n_rep, dim=2))
    with pytest.raises(checks.CheckFailed, match=r"^\[wrong-shape\] Your result has shape \(2, 2, 3, 4\); expected "
                       r"\(B, H_kv \* n_rep, T, Dh\) = \(2, 6, 3, 4\)\.\n"):
        checks.check_repeat_kv(lambda x, n_rep: x)


def test_grouped_query_attention_messages():
    with pytest.raises(checks.CheckFailed) as info:
        checks.check_grouped_query_attention(bug_zoo.gqa_tiled_heads)
    assert str(info.value).startswith("[kv-heads-tiled] Your key/value heads are repeated as a tile, not in groups: "
                                      "for H=4 and H_kv=2 your query heads use the key/value heads [0, 1, 0, 1], in "
                                      "groups they would be [0, 0, 1, 1].")
    assert str(info.value).endswith("Failing case: case 3 of 17: GQA, H=4, H_kv=2: q (2, 4, 1, 8), k (2, 2, 7, 8), "
                                    "v (2, 2, 7, 8), no mask")
    with pytest.raises(checks.CheckFailed) as info:  # passes H_kv = H and H_kv = 1 (broadcasting), then raises
        checks.check_grouped_query_attention(gqa_without_repeat)
    assert str(info.value).endswith(
        "when called as grouped_query_attention(q of shape (2, 4, 1, 8), k of shape (2, 2, 7, 8), v of shape (2, 2, "
        "7, 8), mask=None).\n  Here q has H=4 heads and k, v have H_kv=2: query head h uses key/value head h // (H / "
        "H_kv), so each key/value head must be repeated H / H_kv = 2 times (in a row) before the matrix products.")
    with pytest.raises(checks.CheckFailed) as info:  # an error with H_kv = H gets no note about the heads
        checks.check_grouped_query_attention(sdpa_raises)
    assert str(info.value).startswith("[raised-exception]") and "Here q has" not in str(info.value)
    with pytest.raises(checks.CheckFailed, match=r"^\[mutates-input\] Your function changed its input `k`"):
        checks.check_grouped_query_attention(lambda q, k, v, mask=None: gqa_library(q, k.mul_(2), v, mask))
    with pytest.raises(checks.CheckFailed, match=r"^\[wrong-shape\] Your output has shape \(2, 1, 1, 8\); expected "
                       r"\(2, 4, 1, 8\)\.\n  Failing case: case 2 of 17: MQA"):
        checks.check_grouped_query_attention(gqa_returns_kv_heads)


CORRECT = [
    # (check, a correct implementation in some style)
    (checks.check_kv_cache_bytes, kv_cache_bytes),
    (checks.check_repeat_kv, kv_cache.repeat_kv),
    (checks.check_repeat_kv, lambda x, n_rep: x.repeat_interleave(n_rep, dim=1)),
    (checks.check_grouped_query_attention, gqa_library),
    (checks.check_grouped_query_attention, gqa_torch_builtin),
    (checks.check_grouped_query_attention, gqa_grouped_queries),
]


PLANTED = [
    # (check, a wrong implementation, the code it must get)
    (checks.check_kv_cache_bytes, kv_bytes_per_token, "cache-missing-factor"),
    (checks.check_kv_cache_bytes, lambda *args, **kw: kv_cache_bytes(*args, **kw) / 2**30, "wrong-value"),
    (checks.check_kv_cache_bytes, lambda *args, **kw: kv_cache_bytes(*args, **kw) * 8, "wrong-value"),
    (checks.check_kv_cache_bytes, lambda *args, **kw: kv_cache_bytes(*args, **kw) + 1, "wrong-value"),
    (checks.check_kv_cache_bytes, kv_bytes_no_defaults, "raised-exception"),
    (checks.check_kv_cache_bytes, kv_bytes_not_implemented, "not-implemented"),
    (checks.check_kv_cache_bytes, lambda *args, **kw: None, "returned-none"),
    (checks.check_kv_cache_bytes, lambda *args, **kw: "12 GiB", "wrong-type"),
    (checks.check_kv_cache_bytes, lambda *args, **kw: True, "wrong-type"),
    (checks.check_kv_cache_bytes, lambda *args, **kw: torch.ones(2), "wrong-type"),
    (checks.check_repeat_kv, lambda x, n_rep: x[:, :, None].expand(-1, -1, n_rep, -1, -1), "wrong-shape"),
    (checks.check_repeat_kv, lambda x, n_rep: x.repeat_interleave(n_rep, dim=2), "wrong-shape"),
    (checks.check_repeat_kv, lambda x, n_rep: x, "wrong-shape"),
    (checks.check_repeat_kv, lambda x, n_rep: x.flip(1).repeat_interleave(n_rep, dim=1), "wrong-output"),
    (checks.check_repeat_kv, lambda x, n_rep: kv_cache.repeat_kv(x.mul_(1.5), n_rep), "mutates-input"),
    (checks.check_repeat_kv, lambda x, n_rep: None, "returned-none"),
    (checks.check_grouped_query_attention, gqa_without_repeat, "raised-exception"),
    (checks.check_grouped_query_attention, functools.partial(gqa_with, bug_zoo.sdpa_missing_scale), "missing-scale"),
    (checks.check_grouped_query_attention, functools.partial(gqa_with, bug_zoo.sdpa_mask_inverted), "mask-inverted"),
    (checks.check_grouped_query_attention, functools.partial(gqa_with, bug_zoo.sdpa_nan_on_masked_row),
     "nan-on-masked-row"),
    (checks.check_grouped_query_attention, functools.partial(gqa_with, bug_zoo.sdpa_softmax_wrong_axis),
     "softmax-wrong-axis"),
    (checks.check_grouped_query_attention, gqa_returns_kv_heads, "wrong-shape"),
    (checks.check_grouped_query_attention, lambda q, k, v, mask=None: gqa_library(q, k, v, None), "mask-ignored"),
]
