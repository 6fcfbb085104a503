"""Programs that run on every rank (``*_rank``) and their single-process
verification (``run_*``).

``run_tensor_parallel(P, config)`` and ``run_ring_attention(P, config)`` launch
the rank program on P gloo processes, rebuild the same inputs and weights in
the caller from the same seed, and compare: they return a :class:`Report` of
verdicts and measured counts. The chapter and the tests call them; so does
``python -m attention_course.distributed --world-size 4``. ``run_copy_and_sum``
runs tensor-parallel attention with communication operators f and g given by
its caller (the chapter's exercise), on ranks forked from the caller.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict, dataclass, field

import torch
import torch.distributed as dist

from ..functional import scaled_dot_product_attention
from ..masks import causal_mask
from ..multi_head import MultiHeadAttention
from .launch import launch
from .ring_attention import (
    RankStats,
    ring_attention,
    ring_bytes_per_rank,
    ring_memory_per_rank,
    sequence_layout,
    shard_sequence,
    unshard_sequence,
)
from .tensor_parallel import (
    TensorParallelAttention,
    allreduce_bytes,
    check_shardable,
)

# float32 computations split differently across ranks agree to about 1e-7 here
TOLERANCE = 1e-5


@dataclass
class TensorParallelConfig:
    """A multi-head attention problem: query (B, Tq, D), key (B, Tk, kdim),
    value (B, Tk, vdim)."""

    batch: int = 2
    t_q: int = 5
    t_k: int = 7
    d_model: int = 16
    num_heads: int = 4
    kdim: int = 12
    vdim: int = 10
    causal: bool = False
    # key = value = query (then t_k, kdim and vdim are ignored)
    self_attention: bool = False
    seed: int = 0


@dataclass
class RingConfig:
    """An attention problem over one sequence: q, k (B, H, T, Dk), v (B, H, T,
    Dv), split over the ranks."""

    batch: int = 2
    heads: int = 3
    seq_len: int = 16
    d_k: int = 8
    d_v: int = 6
    causal: bool = False
    layout: str = "contiguous"
    seed: int = 0
    # a rank that (wrongly) holds one position fewer, to test the shape check
    short_rank: int | None = None


@dataclass
class Report:
    """Verdicts (True = equal to the single process within ``TOLERANCE``) and
    per-rank counts."""

    verdicts: dict = field(default_factory=dict)
    per_rank: list = field(default_factory=list)


# -----------------------------------------------------------------------------
# Tensor parallelism of the heads
# -----------------------------------------------------------------------------


def _tp_problem(cfg: TensorParallelConfig):
    """The module, inputs and output gradient of ``cfg`` (the same on every
    rank and in the caller)."""
    torch.manual_seed(cfg.seed)
    kdim, vdim = (None, None) if cfg.self_attention else (cfg.kdim, cfg.vdim)
    mha = MultiHeadAttention(cfg.d_model, cfg.num_heads, kdim=kdim, vdim=vdim)
    # (B, Tq, D)
    query = torch.randn(cfg.batch, cfg.t_q, cfg.d_model, requires_grad=True)
    if cfg.self_attention:
        key = value = query
    else:
        # (B, Tk, kdim)
        key = torch.randn(cfg.batch, cfg.t_k, cfg.kdim, requires_grad=True)
        # (B, Tk, vdim)
        value = torch.randn(cfg.batch, cfg.t_k, cfg.vdim, requires_grad=True)
    # d loss / d output: loss = (out * grad_out).sum()
    grad_out = torch.randn(cfg.batch, cfg.t_q, cfg.d_model)
    return mha, (query, key, value), grad_out


def _input_grads(inputs) -> list[torch.Tensor]:
    # self-attention: the query once
    distinct = list({id(x): x for x in inputs}.values())
    return [x.grad for x in distinct]


def tensor_parallel_rank(
    rank: int, world_size: int, cfg: TensorParallelConfig
) -> dict:
    """One rank: shard the module, run forward and backward, return the output,
    gradients and counts."""
    mha, inputs, grad_out = _tp_problem(cfg)
    shard = TensorParallelAttention(mha, rank, world_size)
    # (B, Tq, D), after one all-reduce
    out = shard(*inputs, is_causal=cfg.causal)
    (out * grad_out).sum().backward()
    return {
        "out": out.detach(),
        "input_grads": _input_grads(inputs),
        "param_grads": {name: p.grad for name, p in shard.named_parameters()},
        # the (B, Tq, D) partial output handed to all_reduce
        "allreduce_bytes": out.nbytes,
        "weight_bytes": sum(
            p.nbytes
            for n, p in shard.named_parameters()
            if "weight" in n or "shard" in n
        ),
        "backend": dist.get_backend(),
    }


def _full_param_grads(
    mha: MultiHeadAttention, rank: int, world_size: int
) -> dict:
    """The slices of the single-process gradients that rank ``rank``'s
    parameters correspond to."""
    width = mha.d_model // world_size
    cols = slice(rank * width, (rank + 1) * width)
    out = {}
    for name in ("w_q", "w_k", "w_v"):
        linear = getattr(mha, name)
        out[f"{name}.weight"] = linear.weight.grad[cols]
        out[f"{name}.bias"] = linear.bias.grad[cols]
    out["w_o_shard"] = mha.w_o.weight.grad[:, cols]
    out["b_o"] = mha.w_o.bias.grad
    return out


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and bool((a - b).abs().max() < TOLERANCE)


def run_tensor_parallel(
    world_size: int,
    cfg: TensorParallelConfig | None = None,
    timeout: float = 60.0,
) -> Report:
    """Launch tensor-parallel attention on ``world_size`` ranks and compare
    with the single-process module."""
    cfg = TensorParallelConfig() if cfg is None else cfg
    return run_many(world_size, [cfg], timeout)[0]


def _verify_tensor_parallel(
    world_size: int, cfg: TensorParallelConfig, results: list[dict]
) -> Report:
    """Compare the ranks' outputs and gradients with the single-process
    module."""
    mha, inputs, grad_out = _tp_problem(cfg)
    ref = mha(*inputs, is_causal=cfg.causal)
    (ref * grad_out).sum().backward()
    report = Report()
    report.verdicts["output"] = all(
        _close(r["out"], ref.detach()) for r in results
    )
    report.verdicts["input gradients"] = all(
        _close(g, ref_g)
        for r in results
        for g, ref_g in zip(
            r["input_grads"], _input_grads(inputs), strict=True
        )
    )
    report.verdicts["weight gradients"] = all(
        _close(r["param_grads"][name], want)
        for rank, r in enumerate(results)
        for name, want in _full_param_grads(mha, rank, world_size).items()
    )
    full_weights = sum(lin.weight.nbytes for lin in mha.projections().values())
    report.per_rank = [
        {
            "rank": rank,
            "heads": cfg.num_heads // world_size,
            "weight_bytes": r["weight_bytes"],
            "weight_bytes_single": full_weights,
            "allreduce_bytes": r["allreduce_bytes"],
            "allreduce_formula": allreduce_bytes(
                cfg.batch, cfg.t_q, cfg.d_model
            ),
        }
        for rank, r in enumerate(results)
    ]
    return report


# -----------------------------------------------------------------------------
# Ring attention
# -----------------------------------------------------------------------------


def _ring_problem(
    cfg: RingConfig,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    torch.manual_seed(cfg.seed)
    # (B, H, T, Dk)
    q = torch.randn(cfg.batch, cfg.heads, cfg.seq_len, cfg.d_k)
    # (B, H, T, Dk)
    k = torch.randn(cfg.batch, cfg.heads, cfg.seq_len, cfg.d_k)
    # (B, H, T, Dv)
    v = torch.randn(cfg.batch, cfg.heads, cfg.seq_len, cfg.d_v)
    return q, k, v


def ring_rank(rank: int, world_size: int, cfg: RingConfig) -> dict:
    """One rank: take this rank's positions of q, k, v, run ring attention,
    return the output and counts."""
    chunks = sequence_layout(cfg.seq_len, world_size, cfg.layout)[rank]
    # (B, H, T/P, D*)
    q, k, v = (shard_sequence(x, chunks) for x in _ring_problem(cfg))
    if rank == cfg.short_rank:
        q, k, v = (x[..., 1:, :] for x in (q, k, v))
    stats = RankStats()
    # (B, H, T/P, Dv)
    out = ring_attention(
        q, k, v, causal=cfg.causal, layout=cfg.layout, stats=stats
    )
    # the tensors this rank holds at its peak: q, acc, max and sum, two k/v
    # blocks, the largest score tile
    batch_heads = cfg.batch * cfg.heads
    held = (
        q.nbytes + out.nbytes + 2 * batch_heads * q.size(-2) * q.element_size()
    )
    held += (
        2 * (k.nbytes + v.nbytes)
        + batch_heads * stats.largest_tile * q.element_size()
    )
    return {"out": out, "stats": asdict(stats), "memory_bytes": held}


def run_ring_attention(
    world_size: int, cfg: RingConfig | None = None, timeout: float = 60.0
) -> Report:
    """Launch ring attention on ``world_size`` ranks and compare with
    single-process attention."""
    cfg = RingConfig() if cfg is None else cfg
    return run_many(world_size, [cfg], timeout)[0]


def _verify_ring(
    world_size: int, cfg: RingConfig, results: list[dict]
) -> Report:
    """Compare the ranks' outputs with float64 single-process attention;
    per-rank counts next to formulas."""
    layout = sequence_layout(cfg.seq_len, world_size, cfg.layout)
    q, k, v = _ring_problem(cfg)
    mask = causal_mask(cfg.seq_len) if cfg.causal else None
    # float64 reference
    ref, _ = scaled_dot_product_attention(
        q.double(), k.double(), v.double(), mask
    )
    out = unshard_sequence([r["out"] for r in results], layout)
    report = Report()
    report.verdicts["output"] = _close(out.double(), ref)
    bh = cfg.batch * cfg.heads
    report.per_rank = [
        {
            "rank": rank,
            **r["stats"],
            "bytes_formula": ring_bytes_per_rank(
                bh, cfg.seq_len, cfg.d_k, cfg.d_v, world_size
            ),
            "memory_bytes": r["memory_bytes"],
            "memory_formula": ring_memory_per_rank(
                bh, cfg.seq_len, cfg.d_k, cfg.d_v, world_size, cfg.layout
            ),
        }
        for rank, r in enumerate(results)
    ]
    return report


# -----------------------------------------------------------------------------
# Several problems in one launch (starting processes is the slow part)
# -----------------------------------------------------------------------------


def many_rank(rank: int, world_size: int, configs: list) -> list[dict]:
    """One rank: run the rank program of each config in turn."""
    return [
        _RANK_PROGRAMS[type(cfg)](rank, world_size, cfg) for cfg in configs
    ]


def run_many(
    world_size: int, configs: list, timeout: float = 60.0
) -> list[Report]:
    """Run several :class:`TensorParallelConfig` / :class:`RingConfig` problems
    in ONE launch of ``world_size`` ranks; returns one :class:`Report` per
    config, in order."""
    for cfg in configs:  # bad input fails here, before any process starts
        if isinstance(cfg, TensorParallelConfig):
            check_shardable(cfg.num_heads, world_size)
        elif isinstance(cfg, RingConfig):
            sequence_layout(cfg.seq_len, world_size, cfg.layout)
        else:
            raise TypeError(
                "configs must be TensorParallelConfig or RingConfig, got "
                f"{type(cfg).__name__}"
            )
    # per_rank[rank][i]
    per_rank = launch(many_rank, world_size, configs, timeout=timeout)
    verify = {
        TensorParallelConfig: _verify_tensor_parallel,
        RingConfig: _verify_ring,
    }
    return [
        verify[type(cfg)](world_size, cfg, [r[i] for r in per_rank])
        for i, cfg in enumerate(configs)
    ]


def main(argv: list[str] | None = None) -> None:
    """Command line: run both schemes on P processes and print the verdicts."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=60.0)
    args = parser.parse_args(argv)
    configs = [
        TensorParallelConfig(),
        RingConfig(causal=True, layout="zigzag"),
    ]
    tp, ring = run_many(args.world_size, configs, timeout=args.timeout)
    for name, report in (
        ("tensor parallel", tp),
        ("ring attention (causal, zig-zag)", ring),
    ):
        for what, ok in report.verdicts.items():
            print(
                f"{name}, P={args.world_size}: {what} equal to one process "
                f"within {TOLERANCE:g}: {ok}"
            )


_RANK_PROGRAMS = {
    TensorParallelConfig: tensor_parallel_rank,
    RingConfig: ring_rank,
}


# -----------------------------------------------------------------------------
# The smallest programs: one collective, a rank that fails, a rank that hangs
# (for the timeouts)
# -----------------------------------------------------------------------------


def sleep_on_rank(
    rank: int, world_size: int, hung_rank: int, seconds: float = 3600.0
) -> dict:
    """A deliberately hung program, to test timeouts: rank ``hung_rank`` sleeps
    instead of joining the all-reduce that every other rank waits in."""
    if rank == hung_rank:
        time.sleep(seconds)
    return sum_of_ranks(rank, world_size)


def fail_on_rank(rank: int, world_size: int, bad_rank: int) -> int:
    """A rank that raises (to test error reporting): ``bad_rank`` raises
    ValueError, the others return their rank."""
    if rank == bad_rank:
        raise ValueError(f"bad input on rank {rank}")
    return rank


def sum_of_ranks(rank: int, world_size: int) -> dict:
    """The smallest collective program: every rank contributes its rank number
    to an all-reduce (sum)."""
    value = torch.tensor([float(rank)])
    dist.all_reduce(value)  # afterwards every rank holds 0 + 1 + ... + (P - 1)
    return {
        "rank": rank,
        "world_size": world_size,
        "backend": dist.get_backend(),
        "sum": int(value.item()),
    }


# -----------------------------------------------------------------------------
# Your own f and g (chapter 13's exercise): tensor-parallel attention with
# given communication operators
# -----------------------------------------------------------------------------


def _apply(op, x: torch.Tensor) -> torch.Tensor:
    """``op`` is a ``torch.autograd.Function`` (called through ``apply``) or a
    plain function."""
    return (
        op.apply(x)
        if isinstance(op, type) and issubclass(op, torch.autograd.Function)
        else op(x)
    )


def copy_and_sum_problem(
    query: torch.Tensor,
    key: torch.Tensor,
    num_heads: int,
    seed: int,
    value_dim: int,
) -> MultiHeadAttention:
    """The float64 module of :func:`run_copy_and_sum`: ``MultiHeadAttention``
    built under ``torch.manual_seed(seed)`` with d_model = query's width, kdim
    = key's and vdim = ``value_dim`` (the same weights in every process)."""
    torch.manual_seed(seed)
    return MultiHeadAttention(
        query.size(-1), num_heads, kdim=key.size(-1), vdim=value_dim
    ).double()


def copy_and_sum_rank(
    rank: int,
    world_size: int,
    copy_op,
    sum_op,
    mha: MultiHeadAttention,
    inputs: tuple,
    grad_out: torch.Tensor,
) -> dict:
    """One rank of tensor-parallel attention whose communication is ``copy_op``
    (f, on each input) and
    ``sum_op`` (g, on the partial output): forward, then backward of ``(out *
        grad_out).sum()``."""
    # even when the caller runs without autograd (a grader calling a function)
    with torch.enable_grad():
        # this rank's replicated inputs
        leaves = [x.detach().clone().requires_grad_(True) for x in inputs]
        shard = TensorParallelAttention(mha, rank, world_size)
        query, key, value = (_apply(copy_op, x) for x in leaves)
        # (B, Tq, D)
        out = _apply(sum_op, shard.partial_output(query, key, value))
        out = out + shard.b_o  # the bias once, after the sum
        (out * grad_out).sum().backward()
    return {"out": out.detach(), "grads": [x.grad for x in leaves]}


def run_copy_and_sum(
    copy_op,
    sum_op,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    grad_out: torch.Tensor,
    num_heads: int,
    world_size: int,
    seed: int = 0,
    timeout: float = 60.0,
) -> tuple[torch.Tensor, ...]:
    """Tensor-parallel attention on ``world_size`` real gloo processes, with
    YOUR communication operators.

    ``copy_op`` (f) and ``sum_op`` (g) are ``torch.autograd.Function`` classes
    (or functions of one tensor); each rank applies f to the query, key and
    value, computes its heads' partial output, applies g and adds the bias. The
    module is :func:`copy_and_sum_problem` (float64, from ``seed``). The ranks
    are forked from this process (``start_method="fork"``), so classes defined
    in a notebook reach them.

    Returns ``(out, grad_query, grad_key, grad_value)``, each with a leading
    axis of one entry per rank: (P, B, Tq, D), (P, B, Tq, D), (P, B, Tk, kdim),
    (P, B, Tk, vdim). A rank that hangs in a collective fails after 10 s; a
    rank that raises makes this raise, naming the rank.
    """
    mha = copy_and_sum_problem(query, key, num_heads, seed, value.size(-1))
    check_shardable(num_heads, world_size)
    inputs = tuple(x.detach().double() for x in (query, key, value))
    results = launch(
        copy_and_sum_rank,
        world_size,
        copy_op,
        sum_op,
        mha,
        inputs,
        grad_out.detach().double(),
        timeout=timeout,
        group_timeout=min(10.0, timeout),
        start_method="fork",
    )
    out = torch.stack([r["out"] for r in results])
    grads = [torch.stack([r["grads"][i] for r in results]) for i in range(3)]
    return (out, *grads)
