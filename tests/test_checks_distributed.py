"""Chapter 13 checks: the right implementations pass, and each named mistake is reported with its code."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_nn

from attention_course import checks
from attention_course.checks import CheckFailed
from attention_course.distributed import demos, tensor_parallel

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
# Questions
# ------------------------------------------------------------------------------------------------------------


def test_questions(capsys):
    checks.check_number("13.hide-block", 400e12 / 50e9)
    assert capsys.readouterr().out.count("✓") == 1
    with pytest.raises(CheckFailed, match=r"^\[wrong-answer\] .*AND a value block"):
        checks.check_number("13.hide-block", 4000)
    with pytest.raises(CheckFailed, match=r"^\[wrong-answer\] .*only the scores"):
        checks.check_number("13.hide-block", 16000)


def test_hide_block_answer_is_where_compute_equals_transfer():
    """The question's number, from the chapter's per-step counts: compute time = transfer time at n = 8000,
    for any H and Dh."""
    for heads, dh in ((32, 128), (8, 64)):
        n = 8000
        compute = 4 * heads * n * n * dh / 400e12
        transfer = 2 * heads * n * dh * 2 / 50e9
        assert compute == pytest.approx(transfer)


# ------------------------------------------------------------------------------------------------------------
# The zig-zag layout
# ------------------------------------------------------------------------------------------------------------


def zigzag_right(seq_len, world_size):
    n = seq_len // (2 * world_size)
    return torch.stack([torch.cat([torch.arange(r * n, (r + 1) * n),
                                   torch.arange((2 * world_size - 1 - r) * n, (2 * world_size - r) * n)])
                        for r in range(world_size)])  # (P, T / P)


def zigzag_chunks_as_lists(seq_len, world_size):
    """Another style: nested lists, (P, 2, T / 2P), the late chunk first."""
    chunks = torch.arange(seq_len).chunk(2 * world_size)
    return [[chunks[2 * world_size - 1 - r].tolist(), chunks[r].tolist()] for r in range(world_size)]


def zigzag_contiguous(seq_len, world_size):
    return torch.arange(seq_len).reshape(world_size, -1)  # THE BUG: neighbouring chunks


def zigzag_shifted(seq_len, world_size):
    chunks = torch.arange(seq_len).chunk(2 * world_size)
    return torch.stack([torch.cat([chunks[r], chunks[world_size + r]]) for r in range(world_size)])  # THE BUG


def zigzag_striped(seq_len, world_size):
    return torch.arange(seq_len).reshape(-1, world_size).T  # rank r: r, r + P, ...


# ------------------------------------------------------------------------------------------------------------
# f and g, on real processes (each answer below launches 2 gloo processes per case)
# ------------------------------------------------------------------------------------------------------------


class CopyRight(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad


class SumRight(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        x = x.clone()
        dist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad


class CopyIdentityBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return grad  # THE BUG: each rank keeps its own part of the input's gradient


def _tp(copy_op, sum_op):
    def tp_on_processes(query, key, value, grad_out, num_heads, world_size, seed):
        return demos.run_copy_and_sum(copy_op, sum_op, query, key, value, grad_out, num_heads, world_size, seed)
    return tp_on_processes


tp_right = _tp(CopyRight, SumRight)
tp_library_functions = _tp(tensor_parallel.copy_to_ranks, tensor_parallel.sum_over_ranks)  # plain functions
tp_f_identity_backward = _tp(CopyIdentityBackward, SumRight)
tp_g_differentiable_all_reduce = _tp(CopyRight, dist_nn.all_reduce)  # sums the gradient backward as well
tp_swapped = _tp(SumRight, CopyRight)
tp_f_differentiable_all_reduce = _tp(dist_nn.all_reduce, SumRight)  # f sums the input forward as well
tp_no_all_reduce = _tp(CopyRight, lambda x: x)


def _sum_of_two(x):
    """A sum written for two processes: gathers every rank's tensor, adds the first two."""
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, x.contiguous())
    return parts[0] + parts[1]


class CopyTwoRanks(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return _sum_of_two(grad)


class SumTwoRanks(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return _sum_of_two(x)

    @staticmethod
    def backward(ctx, grad):
        return grad


tp_sum_of_two_ranks = _tp(CopyTwoRanks, SumTwoRanks)  # right on 2 processes, wrong on 3


def tp_returns_output_only(query, key, value, grad_out, num_heads, world_size, seed):
    return tp_right(query, key, value, grad_out, num_heads, world_size, seed)[0]


def test_simulated_mistakes_are_distinct_and_the_right_flags_give_one_process():
    """The checker's simulation of f and g in one process: the right flags reproduce one process, and each
    known mistake gives a different answer (so a code cannot shadow another)."""
    from attention_course.checks import distributed as d

    rng = np.random.default_rng(0)
    query, key, value, grad_out = d._copy_sum_inputs(rng, 2, 5, 7, 12, 9, 10)
    mha = d._copy_sum_module(query, key, value, 3, 3)  # 3 processes: a sum of two ranks is wrong there
    ref = d._copy_sum_reference(mha, (query, key, value), grad_out, 3)
    right = d._copy_sum_simulated(mha, (query, key, value), grad_out, 3, False, True, True, False)
    np.testing.assert_allclose(right, ref, atol=1e-12, rtol=0)
    wrong = [d._copy_sum_simulated(mha, (query, key, value), grad_out, 3, *flags) for _, flags in
             d._COPY_SUM_MISTAKES]
    for i, a in enumerate([ref, *wrong]):
        for b in [ref, *wrong][i + 1:]:
            assert not np.allclose(a, b, atol=1e-6)


# ------------------------------------------------------------------------------------------------------------
# The registry's tables (tests/test_checks_planted.py)
# ------------------------------------------------------------------------------------------------------------


def row_parallel_einsum(local_heads, w_o, b_o):
    """Another style: the weight split into per-rank chunks, one einsum per rank."""
    chunks = w_o.chunk(len(local_heads), dim=1)  # (D, D / P) each: the input features of rank r
    return sum(torch.einsum("btf,of->bto", h, w) for h, w in zip(local_heads, chunks, strict=True)) + b_o


CORRECT = [
    (checks.check_zigzag_layout, zigzag_right),
    (checks.check_zigzag_layout, zigzag_chunks_as_lists),
    (checks.check_copy_and_sum, tp_right),
    (checks.check_copy_and_sum, tp_library_functions),
    (checks.check_row_parallel_output, row_parallel_right),
    (checks.check_row_parallel_output, row_parallel_einsum),
]
PLANTED = [
    (checks.check_zigzag_layout, zigzag_contiguous, "zigzag-contiguous"),
    (checks.check_zigzag_layout, zigzag_shifted, "zigzag-not-mirrored"),
    (checks.check_zigzag_layout, zigzag_striped, "zigzag-striped"),
    (checks.check_copy_and_sum, tp_f_identity_backward, "f-backward-not-reduced"),
    (checks.check_copy_and_sum, tp_g_differentiable_all_reduce, "g-backward-reduced"),
    (checks.check_copy_and_sum, tp_swapped, "f-and-g-swapped"),
    (checks.check_copy_and_sum, tp_f_differentiable_all_reduce, "f-forward-reduced"),
    (checks.check_copy_and_sum, tp_no_all_reduce, "g-forward-not-reduced"),
    (checks.check_copy_and_sum, tp_returns_output_only, "wrong-type"),
    (checks.check_copy_and_sum, tp_sum_of_two_ranks, "sum-of-two-ranks"),
    (checks.check_row_parallel_output, row_parallel_sum_heads_first, "allreduce-before-output-projection"),
    (checks.check_row_parallel_output, row_parallel_bias_per_rank, "tp-bias-per-rank"),
    (checks.check_row_parallel_output, row_parallel_rows_of_weight, "row-parallel-wrong-slice"),
]
