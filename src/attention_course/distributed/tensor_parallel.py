"""Tensor parallelism of the heads (Megatron-LM, Shoeybi et al. 2019): each of
P ranks computes H / P heads.

Multi-head attention is already split by heads: head h reads only columns h*Dh
.. (h+1)*Dh - 1 of the Q, K and V projections' outputs, and only writes rows
h*Dh .. (h+1)*Dh - 1 of the output projection's input. So rank r keeps

* the *columns* of W_q, W_k, W_v that produce its heads (column-parallel: in
  nn.Linear's (d_out, d_in) layout, a block of rows of ``weight``), and
  computes its H / P heads with no communication at all;
* the matching *rows* of W_o (row-parallel: a block of columns of ``weight``),
  and computes a partial output ``heads_r @ W_o[rows of r]`` of full width D.

The output is the SUM of the P partial outputs (a matrix product split along
its inner dimension), so one all-reduce completes the forward pass; the output
bias is added once, after it. Summing before W_o instead (the heads of
different ranks are different features, not parts of a sum) gives a wrong
answer.

Gradients need the mirror image (Megatron's f and g): the all-reduce of the
output is the identity in the backward pass (every rank already holds the full
gradient of the output), and the input, copied to every rank in the forward
pass, needs its gradient all-reduced in the backward pass (each rank's heads
contribute a part).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor, nn

from ..functional import scaled_dot_product_attention
from ..heads import merge_heads, split_heads
from ..masks import causal_mask, combine_masks
from ..multi_head import MultiHeadAttention
from ..validation import check_int, check_module_inputs, check_world_size


class _CopyToRanks(torch.autograd.Function):
    """Megatron's f: identity forward; all-reduce (sum) of the gradient
    backward."""

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        grad = grad.clone()
        # each rank's heads contributed a part of d loss / d input
        dist.all_reduce(grad)
        return grad


class _SumOverRanks(torch.autograd.Function):
    """Megatron's g: all-reduce (sum) forward; identity backward."""

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:
        x = x.clone()
        dist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        # the output is replicated: every rank already has its full gradient
        return grad


def copy_to_ranks(x: Tensor) -> Tensor:
    """Identity in the forward pass; sums the gradient over the ranks in the
    backward pass."""
    return _CopyToRanks.apply(x)


def sum_over_ranks(x: Tensor) -> Tensor:
    """All-reduce (sum over the ranks) in the forward pass; identity in the
    backward pass."""
    return _SumOverRanks.apply(x)


def check_shardable(num_heads: int, world_size: int) -> None:
    """Raise ValueError unless the heads split evenly over the ranks."""
    check_int(num_heads, "num_heads")
    check_world_size(world_size)
    if num_heads % world_size:
        raise ValueError(
            f"num_heads={num_heads} is not divisible by "
            f"world_size={world_size}: each rank must hold "
            "the same number of whole heads"
        )


def _rows(linear: nn.Linear, rows: slice) -> nn.Linear:
    """A Linear keeping output features ``rows`` of ``linear`` (a
    column-parallel shard, weights copied)."""
    shard = nn.Linear(
        linear.in_features,
        rows.stop - rows.start,
        bias=linear.bias is not None,
    )
    shard = shard.to(linear.weight)
    with torch.no_grad():
        shard.weight.copy_(linear.weight[rows])
        if linear.bias is not None:
            shard.bias.copy_(linear.bias[rows])
    return shard


class TensorParallelAttention(nn.Module):
    """Rank ``rank``'s shard of a
    :class:`~attention_course.multi_head.MultiHeadAttention`: heads ``rank *
    H/P .. (rank + 1) * H/P - 1``.

    ``TensorParallelAttention(mha, rank, world_size)`` copies this rank's rows
    of the weights. ``forward`` returns the full output (B, Tq, D), the same on
    every rank, after one all-reduce; ``partial_output`` returns this rank's
    term of the sum without communicating (used to simulate the ranks in one
    process).
    """

    def __init__(self, mha: MultiHeadAttention, rank: int, world_size: int):
        super().__init__()
        check_shardable(mha.num_heads, world_size)
        if not 0 <= rank < world_size:
            raise ValueError(
                f"rank must be in [0, world_size={world_size}), got {rank}"
            )
        self.rank, self.world_size = rank, world_size
        self.d_model, self.local_heads = (
            mha.d_model,
            mha.num_heads // world_size,
        )
        self.kdim, self.vdim = mha.kdim, mha.vdim
        # D / P features: this rank's heads side by side
        width = self.local_heads * mha.head_dim
        cols = slice(rank * width, (rank + 1) * width)
        self.w_q, self.w_k, self.w_v = (
            _rows(lin, cols) for lin in (mha.w_q, mha.w_k, mha.w_v)
        )
        # row-parallel: the rows of W_o (in y = x @ W_o) that read this rank's
        # heads = columns of weight (D, D / P)
        self.w_o_shard = nn.Parameter(mha.w_o.weight.detach()[:, cols].clone())
        has_bias = mha.w_o.bias is not None
        # added once, after the sum
        self.b_o = (
            nn.Parameter(mha.w_o.bias.detach().clone()) if has_bias else None
        )

    def local_heads_output(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        mask: Tensor | None,
        is_causal: bool,
    ) -> Tensor:
        """This rank's heads: (B, Tq, D), (B, Tk, kdim), (B, Tk, vdim) -> (B,
        Tq, D / P), no communication."""
        check_module_inputs(
            query, key, value, (self.d_model, self.kdim, self.vdim)
        )
        q = split_heads(self.w_q(query), self.local_heads)  # (B, H/P, Tq, Dh)
        k = split_heads(self.w_k(key), self.local_heads)  # (B, H/P, Tk, Dh)
        v = split_heads(self.w_v(value), self.local_heads)  # (B, H/P, Tk, Dh)
        if is_causal:
            mask = combine_masks(
                mask, causal_mask(q.size(-2), k.size(-2), device=q.device)
            )
        # (B, H/P, Tq, Dh)
        heads, _ = scaled_dot_product_attention(q, k, v, mask)
        return merge_heads(heads)  # (B, Tq, D / P)

    def partial_output(
        self,
        query: Tensor,
        key: Tensor | None = None,
        value: Tensor | None = None,
        mask: Tensor | None = None,
        is_causal: bool = False,
    ) -> Tensor:
        """This rank's term of the output, (B, Tq, D): its heads times its rows
        of W_o, without the bias."""
        key = query if key is None else key
        value = key if value is None else value
        # (B, Tq, D)
        return (
            self.local_heads_output(query, key, value, mask, is_causal)
            @ self.w_o_shard.T
        )

    def forward(
        self,
        query: Tensor,
        key: Tensor | None = None,
        value: Tensor | None = None,
        mask: Tensor | None = None,
        is_causal: bool = False,
    ) -> Tensor:
        """The full attention output (B, Tq, D) on every rank: one all-reduce
        of the partial outputs.

        Call it on every rank of an initialised process group with the same
        (replicated) inputs.
        """
        key = query if key is None else key
        value = key if value is None else value
        # one copy_to_ranks per distinct input: self-attention all-reduces the
        # input's gradient once
        query, key, value = _copies(query, key, value)
        # (B, Tq, D)
        out = sum_over_ranks(
            self.partial_output(query, key, value, mask, is_causal)
        )
        return out if self.b_o is None else out + self.b_o


def _copies(
    query: Tensor, key: Tensor, value: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """copy_to_ranks of each distinct input tensor, keeping ``key is query``
    and ``value is key``."""
    q = copy_to_ranks(query)
    k = q if key is query else copy_to_ranks(key)
    v = k if value is key else q if value is query else copy_to_ranks(value)
    return q, k, v


def simulate_tensor_parallel(
    mha: MultiHeadAttention,
    world_size: int,
    query: Tensor,
    key: Tensor | None = None,
    value: Tensor | None = None,
    mask: Tensor | None = None,
    is_causal: bool = False,
) -> Tensor:
    """All P ranks in one process: the sum of the partial outputs plus the bias
    (what the all-reduce computes)."""
    shards = [
        TensorParallelAttention(mha, r, world_size) for r in range(world_size)
    ]
    out = sum(
        s.partial_output(query, key, value, mask, is_causal) for s in shards
    )
    return out if mha.w_o.bias is None else out + mha.w_o.bias


def allreduce_bytes(
    batch: int, t_q: int, d_model: int, bytes_per_element: int = 4
) -> int:
    """Bytes of the tensor each rank hands to the forward all-reduce: the (B,
    Tq, D) partial output."""
    return batch * t_q * d_model * bytes_per_element


def ring_allreduce_traffic(payload_bytes: int, world_size: int) -> int:
    """Bytes each rank sends in a ring all-reduce of ``payload_bytes``: 2 (P -
    1) / P of it (reduce-scatter, then all-gather, each moving P - 1 chunks of
    payload / P). Libraries may choose another algorithm."""
    return 2 * (world_size - 1) * payload_bytes // world_size
