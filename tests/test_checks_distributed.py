"""Chapter 13 checks: the right implementations pass, and each named mistake is reported with its code."""

from __future__ import annotations

import pytest
import torch

from attention_course import checks, online_softmax
from attention_course.checks import CheckFailed
from attention_course.distributed import ring_attention
from attention_course.masks import causal_mask

# ------------------------------------------------------------------------------------------------------------
# The row-parallel output projection
# ------------------------------------------------------------------------------------------------------------


def _cols(local_heads, rank):
    width = local_heads[0].shape[-1]
    return slice(rank * width, (rank + 1) * width)


def row_parallel_right(local_heads, w_o, b_o):
    partial = [h @ w_o[:, _cols(local_heads, r)].T for r, h in enumerate(local_heads)]  # (B, T, D) each
    return sum(partial) + b_o  # the all-reduce, then the bias once


def row_parallel_gather(local_heads, w_o, b_o):
    """Right too (an all-gather of the heads instead of an all-reduce of the outputs: more communication)."""
    return torch.cat(local_heads, dim=-1) @ w_o.T + b_o


def row_parallel_sum_heads_first(local_heads, w_o, b_o):
    return sum(local_heads) @ w_o[:, _cols(local_heads, 0)].T + b_o  # THE BUG: all-reduce of the heads


def row_parallel_bias_per_rank(local_heads, w_o, b_o):
    return sum(h @ w_o[:, _cols(local_heads, r)].T + b_o for r, h in enumerate(local_heads))


def row_parallel_rows_of_weight(local_heads, w_o, b_o):
    return sum(h @ w_o[_cols(local_heads, r), :] for r, h in enumerate(local_heads)) + b_o


@pytest.mark.parametrize("fn", [row_parallel_right, row_parallel_gather])
def test_row_parallel_right(fn, capsys):
    checks.check_row_parallel_output(fn)
    assert capsys.readouterr().out.startswith(f"✓ {fn.__name__}: 5 random cases")


@pytest.mark.parametrize("fn, code", [
    (row_parallel_sum_heads_first, "allreduce-before-output-projection"),
    (row_parallel_bias_per_rank, "tp-bias-per-rank"),
    (row_parallel_rows_of_weight, "row-parallel-wrong-slice"),
])
def test_row_parallel_mistakes_are_named(fn, code):
    with pytest.raises(CheckFailed, match=rf"^\[{code}\]"):
        checks.check_row_parallel_output(fn)


# ------------------------------------------------------------------------------------------------------------
# The ring merge step
# ------------------------------------------------------------------------------------------------------------


def merge_right(m, l, acc, scores, v_block):
    """The library's accumulator (it updates in place: on copies, the checker's arguments stay unchanged)."""
    rows = online_softmax.Accumulator(online_softmax.OnlineSoftmaxState(m, l.clone()), acc.clone())
    merged = online_softmax.merge(rows, scores.clone(), v_block)
    return merged.softmax.max, merged.softmax.sum, merged.acc


def merge_no_rescale(m, l, acc, scores, v_block):
    m_new = torch.maximum(m, scores.amax(dim=-1, keepdim=True))
    p = torch.exp(scores - m_new)
    return m_new, l + p.sum(dim=-1, keepdim=True), acc + p @ v_block  # THE BUG: l and acc not rescaled


def merge_own_max(m, l, acc, scores, v_block):
    m_blk = scores.amax(dim=-1, keepdim=True)
    p = torch.exp(scores - m_blk)
    return torch.maximum(m, m_blk), l + p.sum(dim=-1, keepdim=True), acc + p @ v_block


def merge_guarded_by_nan_to_num(m, l, acc, scores, v_block):
    """Another style: the NaN of a row with no visible key yet replaced by 0 after the fact."""
    m_new = torch.maximum(m, scores.amax(dim=-1, keepdim=True))
    p = torch.exp(scores - m_new).nan_to_num(0.0)
    alpha = torch.exp(m - m_new).nan_to_num(0.0)
    return m_new, alpha * l + p.sum(dim=-1, keepdim=True), alpha * acc + torch.einsum("...nk,...kd->...nd", p, v_block)


def merge_raw_exp(m, l, acc, scores, v_block):
    """No running maximum in the exponent: exact, until a score passes 709."""
    p = torch.exp(scores)  # THE BUG
    return torch.maximum(m, scores.amax(dim=-1, keepdim=True)), l + p.sum(dim=-1, keepdim=True), acc + p @ v_block


def merge_unguarded(m, l, acc, scores, v_block):
    """Right, but -inf - (-inf) = NaN while a row has seen no key."""
    m_new = torch.maximum(m, scores.amax(dim=-1, keepdim=True))
    p, alpha = torch.exp(scores - m_new), torch.exp(m - m_new)  # THE BUG: no guard for m_new = -inf
    return m_new, l * alpha + p.sum(dim=-1, keepdim=True), acc * alpha + p @ v_block


def merge_returns_two(m, l, acc, scores, v_block):
    return merge_right(m, l, acc, scores, v_block)[1:]


def test_merge_right(capsys):
    checks.check_ring_merge(merge_right)
    assert capsys.readouterr().out.startswith("✓ merge_right: 7 simulated rings")


@pytest.mark.parametrize("fn", [merge_no_rescale, merge_own_max])
def test_merge_without_rescale_is_named(fn):
    with pytest.raises(CheckFailed, match=r"^\[merge-without-rescale\]"):
        checks.check_ring_merge(fn)


def test_merge_wrong_return_is_explained():
    with pytest.raises(CheckFailed, match=r"^\[wrong-type\] Return the three updated statistics"):
        checks.check_ring_merge(merge_returns_two)


# ------------------------------------------------------------------------------------------------------------
# The causal mask of a block pair
# ------------------------------------------------------------------------------------------------------------


def mask_right(q_rank, k_rank, block):
    return ring_attention.block_causal_mask(q_rank * block, block, k_rank * block, block)


def mask_local_positions(q_rank, k_rank, block):
    return causal_mask(block)  # THE BUG: the same triangle for every pair of ranks


def mask_offsets_swapped(q_rank, k_rank, block):
    return ring_attention.block_causal_mask(k_rank * block, block, q_rank * block, block)


def mask_strict(q_rank, k_rank, block):
    q_pos = torch.arange(q_rank * block, (q_rank + 1) * block)[:, None]
    return torch.arange(k_rank * block, (k_rank + 1) * block)[None, :] < q_pos


def test_mask_right(capsys):
    checks.check_ring_causal_mask(mask_right)
    assert capsys.readouterr().out.startswith("✓ mask_right: every (q_rank, k_rank) pair")


@pytest.mark.parametrize("fn, code", [
    (mask_local_positions, "causal-wrong-rank-offset"),
    (mask_offsets_swapped, "causal-wrong-rank-offset"),
    (mask_strict, "causal-excludes-diagonal"),
])
def test_mask_mistakes_are_named(fn, code):
    with pytest.raises(CheckFailed, match=rf"^\[{code}\]"):
        checks.check_ring_causal_mask(fn)


# ------------------------------------------------------------------------------------------------------------
# Questions
# ------------------------------------------------------------------------------------------------------------


def test_questions(capsys):
    checks.check_choice("13.allreduce-place", "C")
    checks.check_number("13.ring-bytes", 7 * 32 * 4096 * 2 * 128 * 2)
    checks.check_number("13.causal-imbalance", 8)
    assert capsys.readouterr().out.count("✓") == 3
    with pytest.raises(CheckFailed, match=r"^\[allreduce-before-output-projection\]"):
        checks.check_choice("13.allreduce-place", "B")
    with pytest.raises(CheckFailed, match=r"^\[wrong-answer\] .*keys only"):
        checks.check_number("13.ring-bytes", 7 * 32 * 4096 * 128 * 2)
    with pytest.raises(CheckFailed, match=r"^\[wrong-answer\] .*last step sends nothing"):
        checks.check_number("13.ring-bytes", 8 * 32 * 4096 * 2 * 128 * 2)
    with pytest.raises(CheckFailed, match=r"^\[wrong-answer\] .*zig-zag"):
        checks.check_number("13.causal-imbalance", 1)


# ------------------------------------------------------------------------------------------------------------
# The registry's tables (tests/test_checks_planted.py)
# ------------------------------------------------------------------------------------------------------------


def row_parallel_einsum(local_heads, w_o, b_o):
    """Another style: the weight split into per-rank chunks, one einsum per rank."""
    chunks = w_o.chunk(len(local_heads), dim=1)  # (D, D / P) each: the input features of rank r
    return sum(torch.einsum("btf,of->bto", h, w) for h, w in zip(local_heads, chunks, strict=True)) + b_o


def mask_by_tril_offset(q_rank, k_rank, block):
    """Another style: the diagonal of a triangle shifted by the ranks' offset."""
    return torch.ones(block, block).tril(diagonal=(q_rank - k_rank) * block).bool()


CORRECT = [
    (checks.check_row_parallel_output, row_parallel_right),
    (checks.check_row_parallel_output, row_parallel_einsum),
    (checks.check_ring_merge, merge_right),
    (checks.check_ring_merge, merge_guarded_by_nan_to_num),
    (checks.check_ring_causal_mask, mask_right),
    (checks.check_ring_causal_mask, mask_by_tril_offset),
]
PLANTED = [
    (checks.check_row_parallel_output, row_parallel_sum_heads_first, "allreduce-before-output-projection"),
    (checks.check_row_parallel_output, row_parallel_bias_per_rank, "tp-bias-per-rank"),
    (checks.check_row_parallel_output, row_parallel_rows_of_weight, "row-parallel-wrong-slice"),
    (checks.check_ring_merge, merge_no_rescale, "merge-without-rescale"),
    (checks.check_ring_merge, merge_own_max, "merge-without-rescale"),
    (checks.check_ring_merge, merge_raw_exp, "merge-without-max"),
    (checks.check_ring_merge, merge_unguarded, "merge-nan-on-empty-row"),
    (checks.check_ring_merge, merge_returns_two, "wrong-type"),
    (checks.check_ring_causal_mask, mask_local_positions, "causal-wrong-rank-offset"),
    (checks.check_ring_causal_mask, mask_offsets_swapped, "causal-wrong-rank-offset"),
    (checks.check_ring_causal_mask, mask_strict, "causal-excludes-diagonal"),
]


def test_the_raw_exponential_is_exact_at_small_scale_and_overflows_at_large():
    """Why the check has a case of large scores: without it, a merge with no maximum passes."""
    m, l, acc = torch.full((1, 1), -torch.inf, dtype=torch.float64), torch.zeros(1, 1, dtype=torch.float64), \
        torch.zeros(1, 2, dtype=torch.float64)
    v = torch.eye(2, dtype=torch.float64)
    for scale, finite in ((1.0, True), (1000.0, False)):
        out = merge_raw_exp(m, l, acc, torch.tensor([[0.5, 0.9]], dtype=torch.float64) * scale, v)
        assert bool(torch.isfinite(out[2] / out[1]).all()) is finite
