"""Chapter 13: tensor-parallel heads and ring attention, on real gloo processes (2 and 4) and simulated in one.

References: the single-process course MultiHeadAttention (outputs and gradients, autograd) and float64
scaled_dot_product_attention with the course's causal mask.
"""

from __future__ import annotations

import time

import pytest
import torch

from attention_course.distributed import demos, launch
from attention_course.distributed.ring_attention import (
    block_causal_mask,
    causal_tiles_per_rank,
    causal_work_per_rank,
    ring_attention_simulated,
    ring_bytes_per_rank,
    sequence_layout,
    shard_sequence,
    unshard_sequence,
)
from attention_course.distributed.tensor_parallel import (
    TensorParallelAttention,
    check_shardable,
    simulate_tensor_parallel,
)
from attention_course.functional import scaled_dot_product_attention
from attention_course.masks import causal_mask
from attention_course.multi_head import MultiHeadAttention

# ------------------------------------------------------------------------------------------------------------
# Single process: the ranks simulated in a loop (fast property tests)
# ------------------------------------------------------------------------------------------------------------

RING_SHAPES = [(2, 3, 16, 8, 6), (1, 1, 8, 4, 4), (3, 2, 24, 5, 7)]  # (B, H, T, Dk, Dv); Dk != Dv


@pytest.mark.parametrize("shape", RING_SHAPES)
@pytest.mark.parametrize("world_size", [1, 2, 4])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
def test_simulated_ring_equals_attention_with_gradients(shape, world_size, causal, layout):
    b, h, t, dk, dv = shape
    gen = torch.Generator().manual_seed(t * world_size)
    q, k, v = (torch.randn(b, h, t, d, generator=gen, dtype=torch.float64, requires_grad=True) for d in (dk, dk, dv))
    grad_out = torch.randn(b, h, t, dv, generator=gen, dtype=torch.float64)
    ours = ring_attention_simulated(q, k, v, world_size, causal=causal, layout=layout)
    ours_grads = torch.autograd.grad((ours * grad_out).sum(), (q, k, v))
    ref, _ = scaled_dot_product_attention(q, k, v, causal_mask(t) if causal else None)
    ref_grads = torch.autograd.grad((ref * grad_out).sum(), (q, k, v))
    torch.testing.assert_close(ours, ref, rtol=0, atol=1e-12)
    for got, want in zip(ours_grads, ref_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-10)


def test_simulated_ring_matches_torch_sdpa_float32():
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 4, 32, 8, generator=gen) for _ in range(3))
    ours = ring_attention_simulated(q, k, v, 4, causal=True, layout="zigzag")
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert (ours - ref).abs().max() < 1e-5


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_causal_tiles_naive_grow_zigzag_balanced(world_size):
    q = torch.randn(1, 1, 4 * world_size * 2, 4)
    for layout in ("contiguous", "zigzag"):
        stats = []
        ring_attention_simulated(q, q, q, world_size, causal=True, layout=layout, stats=stats)
        assert [s.tiles for s in stats] == causal_tiles_per_rank(world_size, layout)
    naive = causal_tiles_per_rank(world_size, "contiguous")
    assert naive[-1] == world_size * naive[0]
    # the same total number of score entries, spread evenly by zig-zag (tiles are 4x smaller)
    zigzag = causal_tiles_per_rank(world_size, "zigzag")
    assert sum(naive) * 4 == sum(zigzag) + world_size and len(set(zigzag)) == 1


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
def test_causal_work_counts_what_the_ring_computes(world_size, layout):
    t = 8 * world_size
    q = torch.randn(1, 1, t, 4)
    stats = []
    ring_attention_simulated(q, q, q, world_size, causal=True, layout=layout, stats=stats)
    work = causal_work_per_rank(t, world_size, layout)
    assert [w.computed for w in work] == [s.score_entries for s in stats]
    assert sum(w.needed for w in work) == t * (t + 1) // 2  # every causal pair, on exactly one rank


def test_striped_balances_needed_entries_but_computes_whole_tiles():
    """Brandon et al.'s layout: rank r holds r, r + P, ...; no tile lies wholly in the future, so whole-tile
    work is T^2 / P per rank (nothing skipped: twice zig-zag's), while the entries the mask keeps are balanced
    to within (T / P) (P - 1) of each other."""
    t, p = 256, 4
    striped = causal_work_per_rank(t, p, "striped")
    zigzag = causal_work_per_rank(t, p, "zigzag")
    assert [w.computed for w in striped] == [t * t // p] * p
    needed = [w.needed for w in striped]
    assert sum(needed) == t * (t + 1) // 2 and max(needed) - min(needed) == (t // p) * (p - 1)
    assert len({w.computed for w in zigzag}) == 1 and len({w.needed for w in zigzag}) == 1
    assert striped[0].computed / zigzag[0].computed > 1.7
    with pytest.raises(ValueError, match=r"layout must be one of \('contiguous', 'zigzag', 'striped'\)"):
        causal_work_per_rank(t, p, "diagonal")


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_bytes_sent_match_formula(world_size):
    b, h, t, dk, dv = 2, 3, 12 * world_size, 8, 5
    q, k, v = torch.randn(b, h, t, dk), torch.randn(b, h, t, dk), torch.randn(b, h, t, dv)
    stats = []
    ring_attention_simulated(q, k, v, world_size, stats=stats)
    assert [s.bytes_sent for s in stats] == [ring_bytes_per_rank(b * h, t, dk, dv, world_size)] * world_size
    assert stats[0].bytes_sent == (world_size - 1) * (k.nbytes + v.nbytes) // world_size


def test_layouts_and_round_trip():
    assert sequence_layout(8, 2) == [[(0, 4)], [(4, 8)]]
    assert sequence_layout(8, 2, "zigzag") == [[(0, 2), (6, 8)], [(2, 4), (4, 6)]]
    x = torch.arange(24.0).reshape(1, 24, 1)
    for layout in ("contiguous", "zigzag"):
        chunks = sequence_layout(24, 3, layout)
        parts = [shard_sequence(x, c) for c in chunks]
        assert torch.equal(unshard_sequence(parts, chunks), x)


def test_block_causal_mask_is_a_block_of_the_global_mask():
    full = causal_mask(12)
    for q0, k0 in [(0, 0), (4, 0), (4, 8), (8, 4), (6, 2)]:
        assert torch.equal(block_causal_mask(q0, 4, k0, 4), full[q0 : q0 + 4, k0 : k0 + 4])


@pytest.mark.parametrize("d_model, heads, world_size", [(16, 4, 2), (16, 4, 4), (24, 6, 3), (12, 2, 1)])
@pytest.mark.parametrize("causal", [False, True])
def test_simulated_tensor_parallel_equals_module(d_model, heads, world_size, causal):
    torch.manual_seed(heads)
    mha = MultiHeadAttention(d_model, heads, kdim=7, vdim=5).double()
    query = torch.randn(2, 4, d_model).double()  # (B, Tq, D)
    key, value = torch.randn(2, 6, 7).double(), torch.randn(2, 6, 5).double()  # (B, Tk, kdim), (B, Tk, vdim)
    ours = simulate_tensor_parallel(mha, world_size, query, key, value, is_causal=causal)
    torch.testing.assert_close(ours, mha(query, key, value, is_causal=causal), rtol=0, atol=1e-12)
    torch_mha = mha.to_torch()
    mask = None if not causal else ~causal_mask(4, 6)  # nn.MultiheadAttention: True = NOT allowed
    ref, _ = torch_mha(query, key, value, attn_mask=mask)
    torch.testing.assert_close(ours, ref, rtol=0, atol=1e-12)


def test_all_reduce_before_output_projection_is_wrong():
    """The mistake the chapter warns about: summing the heads over the ranks before W_o."""
    torch.manual_seed(0)
    mha = MultiHeadAttention(8, 4).double()
    x = torch.randn(1, 3, 8).double()
    shards = [TensorParallelAttention(mha, r, 2) for r in range(2)]
    heads = [s.local_heads_output(x, x, x, None, False) for s in shards]  # (B, T, D/2) each
    summed = sum(heads)
    for shard in shards:
        assert (summed @ shard.w_o_shard.T + mha.w_o.bias - mha(x)).abs().max() > 1e-3
    right = sum(h @ s.w_o_shard.T for h, s in zip(heads, shards, strict=True)) + mha.w_o.bias
    torch.testing.assert_close(right, mha(x), rtol=0, atol=1e-12)


def test_verification_catches_a_wrong_rank():
    """The process tests can fail: the caller's comparison flags one rank's perturbed output or gradient."""
    cfg = demos.RingConfig(causal=True, layout="zigzag")
    q, k, v = demos._ring_problem(cfg)
    out, _ = scaled_dot_product_attention(q, k, v, causal_mask(cfg.seq_len))
    layout = sequence_layout(cfg.seq_len, 2, "zigzag")
    stats = {"bytes_sent": 0, "tiles": 0, "score_entries": 0, "largest_tile": 0}
    results = [{"out": shard_sequence(out, c).clone(), "stats": stats, "memory_bytes": 0} for c in layout]
    assert demos._verify_ring(2, cfg, results).verdicts == {"output": True}
    results[1]["out"][0, 0, 0, 0] += 1e-3
    assert demos._verify_ring(2, cfg, results).verdicts == {"output": False}

    tp_cfg = demos.TensorParallelConfig()
    mha, inputs, grad_out = demos._tp_problem(tp_cfg)
    ref = mha(*inputs)
    (ref * grad_out).sum().backward()
    rank_results = [{"out": ref.detach(), "input_grads": [x.grad for x in inputs],
                     "param_grads": demos._full_param_grads(mha, r, 2), "allreduce_bytes": 0, "weight_bytes": 0}
                    for r in range(2)]
    assert all(demos._verify_tensor_parallel(2, tp_cfg, rank_results).verdicts.values())
    rank_results[1]["param_grads"]["w_o_shard"] = rank_results[1]["param_grads"]["w_o_shard"] * 1.01
    assert demos._verify_tensor_parallel(2, tp_cfg, rank_results).verdicts["weight gradients"] is False


# ------------------------------------------------------------------------------------------------------------
# Bad input
# ------------------------------------------------------------------------------------------------------------


def test_errors_name_the_argument():
    mha = MultiHeadAttention(12, 3)
    with pytest.raises(ValueError, match=r"num_heads=3 is not divisible by world_size=2"):
        TensorParallelAttention(mha, 0, 2)
    with pytest.raises(ValueError, match=r"rank must be in \[0, world_size=3\), got 3"):
        TensorParallelAttention(mha, 3, 3)
    with pytest.raises(ValueError, match=r"num_heads=3 is not divisible by world_size=2"):
        demos.run_tensor_parallel(2, demos.TensorParallelConfig(d_model=12, num_heads=3))
    with pytest.raises(ValueError, match=r"T=10 is not divisible by 4 \(zigzag layout, world_size=2\)"):
        sequence_layout(10, 2, "zigzag")
    with pytest.raises(ValueError, match=r"T=10 is not divisible by 4 \(contiguous layout"):
        demos.run_ring_attention(4, demos.RingConfig(seq_len=10))
    with pytest.raises(ValueError, match=r"layout must be one of"):
        sequence_layout(8, 2, "striped!")
    q = torch.randn(1, 1, 8, 4)
    with pytest.raises(ValueError, match=r"query length 4 != key length 8"):
        ring_attention_simulated(q[..., :4, :], q, q, 2)
    with pytest.raises(ValueError, match=r"world_size must be >= 1, got world_size=0"):
        launch.launch(demos.fail_on_rank, 0, 0)
    with pytest.raises(TypeError, match=r"fn must be a function"):
        launch.launch("fail_on_rank", 2, 0)
    with pytest.raises(ValueError, match=r"backend='nccl' is not available in this PyTorch build"):
        launch.launch(demos.sum_of_ranks, 2, backend="nccl")  # CPU-only torch: refused before any process starts
    with pytest.raises(TypeError, match=r"backend must be a str"):
        launch.launch(demos.sum_of_ranks, 2, backend=None)
    with pytest.raises(ValueError, match=r"start_method must be one of \('forkserver', 'fork'\)"):
        launch.launch(demos.sum_of_ranks, 2, start_method="spawn")


@pytest.mark.parametrize("call", [lambda p: launch.launch(demos.fail_on_rank, p, 0),
                                  lambda p: sequence_layout(8, p), lambda p: check_shardable(4, p)],
                         ids=["launch", "sequence_layout", "check_shardable"])
@pytest.mark.parametrize(("world_size", "error", "message"), [
    (2.0, TypeError, "world_size must be an int, got float 2.0"),
    (True, TypeError, "world_size must be an int, got bool True"),
    (0, ValueError, "world_size must be >= 1, got world_size=0"),
])
def test_world_size_is_checked_once_the_same_way(call, world_size, error, message):
    with pytest.raises(error, match=message):
        call(world_size)


@pytest.mark.parametrize(("call", "error", "message"), [
    (lambda: sequence_layout(8.0, 2), TypeError, "seq_len must be an int, got float"),
    (lambda: check_shardable(0, 2), ValueError, "num_heads must be >= 1"),
    (lambda: check_shardable("4", 2), TypeError, "num_heads must be an int, got str"),
])
def test_layout_and_sharding_check_their_sizes(call, error, message):
    with pytest.raises(error, match=message):
        call()


# ------------------------------------------------------------------------------------------------------------
# Real processes: gloo, 2 and 4 ranks
# ------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("world_size", [2, 4])
def test_both_schemes_on_processes(world_size):
    tp_configs = [demos.TensorParallelConfig(num_heads=4, causal=True),
                  demos.TensorParallelConfig(num_heads=8, self_attention=True)]
    ring_configs = [demos.RingConfig(seq_len=8 * world_size, causal=causal, layout=layout)
                    for causal, layout in [(False, "contiguous"), (True, "contiguous"), (True, "zigzag")]]
    reports = demos.run_many(world_size, tp_configs + ring_configs)  # one launch
    for report in reports[:2]:
        assert report.verdicts == {"output": True, "input gradients": True, "weight gradients": True}
        for row in report.per_rank:
            assert row["allreduce_bytes"] == row["allreduce_formula"]
            assert row["weight_bytes"] * world_size == row["weight_bytes_single"]
    for cfg, report in zip(ring_configs, reports[2:], strict=True):
        assert report.verdicts == {"output": True}
        assert [r["bytes_sent"] for r in report.per_rank] == [r["bytes_formula"] for r in report.per_rank]
        assert [r["memory_bytes"] for r in report.per_rank] == [r["memory_formula"] for r in report.per_rank]
        if cfg.causal:
            assert [r["tiles"] for r in report.per_rank] == causal_tiles_per_rank(world_size, cfg.layout)


@pytest.mark.parametrize("start_method", ["forkserver", "fork"])
def test_the_backend_is_a_parameter_tested_on_gloo(start_method):
    rows = launch.launch(demos.sum_of_ranks, 2, backend="gloo", start_method=start_method, timeout=30)
    assert rows == [{"rank": r, "world_size": 2, "backend": "gloo", "sum": 1} for r in range(2)]


def _defined_here(rank, world_size):
    """A function the forkserver's fresh processes could import; "fork" does not need to."""
    return rank * 10


def test_fork_runs_a_function_the_ranks_could_not_import():
    nested = lambda rank, world_size: _defined_here(rank, world_size) + world_size  # noqa: E731 - not importable
    assert launch.launch(nested, 2, start_method="fork", timeout=30) == [2, 12]


def test_mismatched_shapes_across_ranks_are_refused():
    with pytest.raises(ValueError, match=r"mismatched shapes across ranks: rank 1 has \(2, 3, 7, 8\)"):
        demos.run_ring_attention(2, demos.RingConfig(short_rank=1))


def test_a_rank_that_raises_is_named():
    with pytest.raises(ValueError, match=r"rank 1 raised ValueError: bad input on rank 1"):
        launch.launch(demos.fail_on_rank, 2, 1)


def test_a_hung_rank_fails_within_the_timeout():
    start = time.monotonic()
    with pytest.raises(TimeoutError, match=r"rank 1 did not finish within timeout=10 s"):
        launch.launch(demos.sleep_on_rank, 2, 1, timeout=10, group_timeout=3)
    assert time.monotonic() - start < 20  # 10 s, plus killing and reporting



def test_copy_and_sum_runs_under_no_grad():
    """The grader calls a student's function under torch.no_grad(): the ranks still differentiate."""
    from attention_course.distributed.tensor_parallel import _CopyToRanks, _SumOverRanks

    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 4, d, generator=gen, dtype=torch.float64) for d in (8, 6, 5))
    grad_out = torch.randn(1, 4, 8, generator=gen, dtype=torch.float64)
    with torch.no_grad():
        out, gq, gk, gv = demos.run_copy_and_sum(_CopyToRanks, _SumOverRanks, q, k, v, grad_out, 2, 2, seed=1)
    mha = demos.copy_and_sum_problem(q, k, 2, 1, 5)
    leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
    ref = mha(*leaves)
    ref_grads = torch.autograd.grad((ref * grad_out).sum(), leaves)
    assert out.shape == (2, 1, 4, 8)
    for got, want in zip((out, gq, gk, gv), (ref.detach(), *ref_grads), strict=True):
        torch.testing.assert_close(got, want.expand_as(got), rtol=0, atol=1e-12)
