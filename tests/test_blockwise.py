"""Online softmax and blockwise (flash-style) attention: exact against the float64 reference, never (Tq, Tk)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attention_course import numpy_ref
from attention_course.blockwise import blockwise_attention, causal_block_range, measure_peak_memory, naive_attention
from attention_course.online_softmax import (
    init_state,
    online_softmax,
    online_softmax_stats,
    online_softmax_trace,
    safe_max,
    update,
)


def qkv(batch, t_q, t_k, d_k=8, d_v=8, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(*batch, t, d, generator=g, dtype=dtype) for t, d in ((t_q, d_k), (t_k, d_k), (t_k, d_v)))


def reference(q, k, v, mask=None, is_causal=False):
    t_q, t_k = q.shape[-2], k.shape[-2]
    if is_causal:
        causal = numpy_ref.causal_mask(t_q, t_k)
        mask = causal if mask is None else np.logical_and(np.asarray(mask), causal)
    out, _ = numpy_ref.scaled_dot_product_attention(q.double().numpy(), k.double().numpy(), v.double().numpy(), mask)
    return out


def max_diff(a: torch.Tensor, ref: np.ndarray) -> float:
    return float(np.abs(a.double().numpy() - ref).max()) if ref.size else 0.0


# ---------------------------------------------------------------- online softmax


@pytest.mark.parametrize("block_size", [1, 2, 3, 7, 100])
def test_online_softmax_equals_softmax(block_size):
    x = torch.randn(3, 4, 11, generator=torch.Generator().manual_seed(1)) * 10
    np.testing.assert_allclose(online_softmax(x, block_size).numpy(), numpy_ref.softmax(x.double().numpy()), atol=1e-6)


def test_online_softmax_stats_are_row_max_and_sum():
    x = torch.randn(5, 13, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    state = online_softmax_stats(x, block_size=4)
    torch.testing.assert_close(state.max, x.amax(-1, keepdim=True))
    torch.testing.assert_close(state.sum, torch.exp(x - x.amax(-1, keepdim=True)).sum(-1, keepdim=True))


def test_online_softmax_large_scores_and_masked_rows():
    inf = float("inf")
    x = torch.tensor([[1000.0, 1001.0, 999.0, -inf], [-inf] * 4, [-inf, 0.0, -inf, 1.0]])
    out = online_softmax(x, block_size=1)  # the first block of row 0 ... row 1 never sees a finite score
    assert torch.isfinite(out).all()
    np.testing.assert_allclose(out.numpy(), numpy_ref.softmax(x.double().numpy()), atol=1e-6)
    assert out[1].abs().sum() == 0


def test_update_rescales_by_old_over_new_max():
    state = init_state((), dtype=torch.float64)
    state, p, alpha = update(state, torch.tensor([1.0, 2.0], dtype=torch.float64))
    assert float(alpha) == 0.0 and float(state.max) == 2.0  # nothing accumulated before: alpha = exp(-inf)
    state, p, alpha = update(state, torch.tensor([5.0], dtype=torch.float64))
    assert float(alpha) == pytest.approx(np.exp(2.0 - 5.0))
    assert float(state.sum) == pytest.approx(np.exp(-4.0) + np.exp(-3.0) + 1.0)
    assert p.tolist() == [1.0]


def test_safe_max_replaces_only_minus_inf():
    m = torch.tensor([-float("inf"), 3.0, -2.0])
    assert safe_max(m).tolist() == [0.0, 3.0, -2.0]


def test_trace_ends_with_the_true_statistics():
    x = torch.tensor([0.5, 3.0, -1.0, 4.0, 2.0], dtype=torch.float64)
    rows = online_softmax_trace(x, block_size=2)
    assert [r["block"] for r in rows] == [(0, 2), (2, 4), (4, 5)]
    assert [r["running_max"] for r in rows] == [3.0, 4.0, 4.0]
    assert rows[0]["rescale"] == 0.0 and rows[1]["rescale"] == pytest.approx(np.exp(-1.0)) and rows[2]["rescale"] == 1.0
    assert rows[-1]["running_sum"] == pytest.approx(np.exp(x.numpy() - 4.0).sum())


@pytest.mark.parametrize("bad", [0, -1])
def test_online_softmax_rejects_bad_block_size(bad):
    with pytest.raises(ValueError, match="block_size must be >= 1"):
        online_softmax(torch.zeros(3), bad)
    with pytest.raises(ValueError, match="block_size must be >= 1"):
        online_softmax_trace(torch.zeros(3), bad)


def test_trace_needs_1d():
    with pytest.raises(ValueError, match="1-D"):
        online_softmax_trace(torch.zeros(2, 3), 2)


# ---------------------------------------------------------------- blockwise attention


@pytest.mark.parametrize("t_q,t_k", [(7, 7), (16, 16), (33, 33), (5, 13), (13, 5), (1, 9), (9, 1)])
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("block_size,q_block_size", [(1, None), (3, 2), (4, 8), (16, None), (64, 5)])
def test_blockwise_matches_reference(t_q, t_k, is_causal, block_size, q_block_size):
    q, k, v = qkv((2, 3), t_q, t_k, d_v=5)
    out = blockwise_attention(q, k, v, is_causal=is_causal, block_size=block_size, q_block_size=q_block_size)
    assert out.shape == (2, 3, t_q, 5) and out.dtype == torch.float32
    assert max_diff(out, reference(q, k, v, is_causal=is_causal)) < 1e-5


@pytest.mark.parametrize("t_q,t_k", [(6, 6), (4, 10), (10, 4)])
def test_blockwise_causal_flag_equals_explicit_bottom_right_mask(t_q, t_k):
    q, k, v = qkv((2,), t_q, t_k)
    mask = torch.from_numpy(numpy_ref.causal_mask(t_q, t_k))
    torch.testing.assert_close(
        blockwise_attention(q, k, v, is_causal=True, block_size=3),
        blockwise_attention(q, k, v, mask=mask, block_size=3),
        rtol=0, atol=1e-6,
    )


def test_blockwise_with_padding_mask_and_causal():
    q, k, v = qkv((3, 2), 10, 10)
    lengths = np.array([10, 4, 0])  # the last sequence has no visible key at all
    mask = numpy_ref.padding_mask(lengths, 10)  # (B, 1, 1, T)
    for causal in (False, True):
        out = blockwise_attention(q, k, v, mask=torch.from_numpy(mask), is_causal=causal, block_size=3)
        assert max_diff(out, reference(q, k, v, mask, is_causal=causal)) < 1e-5
        assert torch.count_nonzero(out[2]) == 0  # fully masked rows -> zero output, never NaN


def test_fully_masked_rows_are_zero():
    q, k, v = qkv((1,), 6, 8)
    mask = torch.ones(6, 8, dtype=torch.bool)
    mask[[1, 4]] = False
    out = blockwise_attention(q, k, v, mask=mask, block_size=3)
    assert torch.isfinite(out).all() and torch.count_nonzero(out[0, [1, 4]]) == 0
    assert max_diff(out, reference(q, k, v, mask.numpy())) < 1e-5
    causal_out = blockwise_attention(q, k[:, :2], v[:, :2], is_causal=True, block_size=2)  # Tq=6 > Tk=2
    assert torch.count_nonzero(causal_out[0, :4]) == 0  # the first Tq - Tk queries see nothing


def test_broadcast_batch_and_float64():
    q, k, v = qkv((1, 4), 9, 12, d_k=6, d_v=3, dtype=torch.float64)
    k, v = k.expand(2, 4, 12, 6), v.expand(2, 4, 12, 3)  # q broadcasts over the batch
    out = blockwise_attention(q, k, v, is_causal=True, block_size=5)
    assert out.shape == (2, 4, 9, 3) and out.dtype == torch.float64
    assert max_diff(out, reference(q, k, v, is_causal=True)) < 1e-12
    v_only = blockwise_attention(q, k[:1], v, is_causal=True, block_size=5)  # only v has the batch of 2
    assert v_only.shape == (2, 4, 9, 3)
    assert max_diff(v_only, reference(q, k[:1], v, is_causal=True)) < 1e-12


@settings(max_examples=30, deadline=None)
@given(
    t_q=st.integers(1, 20), t_k=st.integers(1, 20), block=st.integers(1, 9), q_block=st.integers(1, 9),
    causal=st.booleans(), seed=st.integers(0, 1000),
)  # fmt: skip
def test_blockwise_property(t_q, t_k, block, q_block, causal, seed):
    q, k, v = qkv((2,), t_q, t_k, d_k=4, d_v=3, seed=seed)
    mask = torch.rand(t_q, t_k, generator=torch.Generator().manual_seed(seed)) > 0.3
    out = blockwise_attention(q, k, v, mask=mask, is_causal=causal, block_size=block, q_block_size=q_block)
    assert max_diff(out, reference(q, k, v, mask.numpy(), is_causal=causal)) < 1e-5


@pytest.mark.parametrize("is_causal", [False, True])
def test_naive_attention_matches_reference(is_causal):
    q, k, v = qkv((2, 2), 7, 9)
    assert max_diff(naive_attention(q, k, v, is_causal=is_causal), reference(q, k, v, is_causal=is_causal)) < 1e-5
    mask = torch.ones(7, 9, dtype=torch.bool)
    mask[3] = False
    out = naive_attention(q, k, v, mask=mask, is_causal=is_causal)
    assert max_diff(out, reference(q, k, v, mask.numpy(), is_causal=is_causal)) < 1e-5


def _largest_tile(fn, t_q, t_k):
    """Run fn under the profiler and return the largest (rows, cols) of any tensor an op received or made."""
    with torch.profiler.profile(record_shapes=True) as prof:
        fn()
    largest = 0
    for event in prof.events():
        for shape in event.input_shapes:
            if isinstance(shape, list | tuple) and len(shape) >= 2 and all(isinstance(s, int) for s in shape):
                if shape[-2] >= t_q and shape[-1] >= t_k:
                    largest = max(largest, shape[-2] * shape[-1])
    return largest


def test_blockwise_never_materialises_the_score_matrix():
    """No op inside blockwise_attention ever sees a (..., Tq, Tk)-sized tensor; the naive version does."""
    t = 96
    q, k, v = qkv((1, 2), t, t, d_k=t // 2, d_v=t // 2)  # feature sizes < T, so only scores can be T x T
    assert _largest_tile(lambda: naive_attention(q, k, v, is_causal=True), t, t) == t * t
    assert _largest_tile(lambda: blockwise_attention(q, k, v, is_causal=True, block_size=16), t, t) == 0


def test_causal_tiles_above_the_diagonal_are_skipped():
    q, k, v = qkv((1,), 64, 64)
    counts = {}
    for causal in (False, True):
        with torch.profiler.profile() as prof:
            blockwise_attention(q, k, v, is_causal=causal, block_size=16)
        counts[causal] = sum(1 for e in prof.events() if e.name == "aten::matmul")
    assert counts[False] == 2 * 16  # 4 x 4 tiles, two matmuls each
    assert counts[True] == 2 * 10  # only the 10 tiles on or below the diagonal


def test_causal_block_range():
    assert causal_block_range(0, 4, 8, 8) == (4, 1)  # queries 0..3 see keys < 4; only key 0 is seen by all
    assert causal_block_range(4, 8, 8, 8) == (8, 5)
    assert causal_block_range(0, 2, 2, 10) == (10, 9)  # bottom-right: the 2 queries are positions 8 and 9
    assert causal_block_range(0, 3, 8, 4) == (0, 0)  # Tq > Tk: the first 4 queries see nothing


def test_errors():
    q, k, v = qkv((1,), 4, 5)
    with pytest.raises(ValueError, match="block sizes must be >= 1"):
        blockwise_attention(q, k, v, block_size=0)
    with pytest.raises(TypeError, match="mask must be boolean"):
        blockwise_attention(q, k, v, mask=torch.ones(4, 5))
    with pytest.raises(ValueError, match=r"mask of shape \(3, 5\) does not broadcast"):
        blockwise_attention(q, k, v, mask=torch.ones(3, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="query feature size 8 != key feature size 6"):
        blockwise_attention(q, k[..., :6], v)
    with pytest.raises(ValueError, match="query feature size"):
        naive_attention(q, k[..., :6], v)


def test_measure_peak_memory_sees_a_large_temporary():
    result, extra = measure_peak_memory(lambda n: float(torch.ones(n).sum()), 16 * 2**20)  # a 64 MiB tensor
    assert result == 16 * 2**20
    assert 60 * 2**20 < extra < 200 * 2**20


def test_gradients_match_naive_attention():
    q, k, v = (t.double().requires_grad_() for t in qkv((2,), 9, 11, d_k=4, d_v=3))
    grads = []
    for fn in (naive_attention, lambda *a, **kw: blockwise_attention(*a, block_size=4, q_block_size=3, **kw)):
        for x in (q, k, v):
            x.grad = None
        (fn(q, k, v, is_causal=True) ** 2).sum().backward()
        grads.append([x.grad.clone() for x in (q, k, v)])
    for ours, theirs in zip(grads[1], grads[0], strict=True):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-10)
