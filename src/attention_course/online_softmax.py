"""The online (streaming) softmax: softmax computed one block of scores at a
time.

Softmax needs two numbers per row before any output can be produced: the row
maximum ``m`` (for numerical stability) and the sum ``l = sum_j exp(x_j - m)``.
The online algorithm reads the row block by block and keeps only a *running*
maximum and a *running* sum. When a block brings a larger maximum ``m_new``,
everything summed so far was computed relative to the old maximum, so it is
rescaled by ``exp(m_old - m_new)``:

    m_new = max(m_old, max(block))
    l_new = l_old * exp(m_old - m_new) + sum(exp(block - m_new))

After the last block, ``softmax(x)_j = exp(x_j - m) / l``. The same rescaling
trick applied to a running weighted sum of value vectors is what lets
:func:`attention_course.blockwise.blockwise_attention` (and FlashAttention)
compute attention without ever storing a full (Tq, Tk) score matrix.

All functions work on the last axis of a torch tensor of any shape (..., N).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .validation import check_floating, check_int


@dataclass
class OnlineSoftmaxState:
    """Running statistics of the rows seen so far.

    Attributes:
        max: (..., 1) running maximum per row (``-inf`` while a row has seen
            only ``-inf`` scores).
        sum: (..., 1) running sum of ``exp(x - max)`` per row.
    """

    max: torch.Tensor
    sum: torch.Tensor


def init_state(shape, dtype=torch.float32, device=None) -> OnlineSoftmaxState:
    """State for rows of leading shape ``shape`` (the (...) part): max = -inf,
    sum = 0."""
    shape = (*tuple(shape), 1)
    return OnlineSoftmaxState(
        max=torch.full(shape, float("-inf"), dtype=dtype, device=device),
        sum=torch.zeros(shape, dtype=dtype, device=device),
    )


def safe_max(m: torch.Tensor) -> torch.Tensor:
    """Replace ``-inf`` maxima (rows with nothing visible yet) by 0 so that
    ``exp(x - m)`` never computes ``-inf - (-inf) = nan``; with ``m = 0`` those
    rows give ``exp(-inf) = 0`` as they should."""
    return torch.where(torch.isfinite(m), m, torch.zeros_like(m))


def update(
    state: OnlineSoftmaxState, block: torch.Tensor, inplace: bool = False
) -> tuple[OnlineSoftmaxState, torch.Tensor, torch.Tensor]:
    """Fold one block of scores (..., n) into the running state.

    ``inplace``: overwrite ``block`` with ``p`` and the state's sum with the
        new one (no second score tile in
    memory: blockwise attention). The maximum only stabilises ``exp``: no
    result depends on it, so no gradient flows through it.

    Returns:
        (new_state, p, alpha):
        ``p`` (..., n) = ``exp(block - new_max)``: the block's unnormalised
        weights relative to the new maximum; ``alpha`` (..., 1) = ``exp(old_max
        - new_max)``: the factor by which anything accumulated so far (the
        running sum, or a running weighted sum of values) must be rescaled.
    """
    new_max = torch.maximum(
        state.max, block.detach().amax(dim=-1, keepdim=True)
    )
    m = safe_max(new_max)
    p = block.sub_(m).exp_() if inplace else torch.exp(block - m)
    # old max -inf -> alpha = 0: nothing was accumulated anyway
    alpha = torch.exp(state.max - m)
    old_sum = state.sum.mul_(alpha) if inplace else state.sum * alpha
    new_sum = (
        old_sum.add_(p.sum(dim=-1, keepdim=True))
        if inplace
        else old_sum + p.sum(dim=-1, keepdim=True)
    )
    return OnlineSoftmaxState(max=new_max, sum=new_sum), p, alpha


# ---------------------------------------------------------------- attention
# rows: the accumulator


@dataclass
class Accumulator:
    """Running state of attention rows that read their keys block by block: the
    online softmax's max and sum (..., n, 1), and ``acc`` (..., n, Dv), the
    running sum of ``exp(score - max) * value``."""

    softmax: OnlineSoftmaxState
    acc: torch.Tensor


def init(rows, d_v: int, dtype=torch.float32, device=None) -> Accumulator:
    """Nothing seen yet for rows of leading shape ``rows`` (..., n): max =
    -inf, sum = 0, acc = 0 (..., n, Dv)."""
    return Accumulator(
        init_state(rows, dtype, device),
        torch.zeros((*rows, d_v), dtype=dtype, device=device),
    )


def merge(
    state: Accumulator, scores: torch.Tensor, values: torch.Tensor
) -> Accumulator:
    """Fold a block of scores (..., n, m) and its values (..., m, Dv) into
    ``state``, in place; returns it.

    :func:`update` raises the running maximum if needed and returns ``alpha`` =
    exp(old - new max): what was accumulated so far was weighted relative to
    the old maximum, so ``acc`` is rescaled by it too. ``scores`` is
    overwritten (it becomes exp(scores - max)): the only score tile in memory.
    """
    # p (..., n, m), alpha (..., n, 1)
    state.softmax, p, alpha = update(state.softmax, scores, inplace=True)
    state.acc.mul_(alpha).add_(p @ values)
    return state


def finish(state: Accumulator) -> torch.Tensor:
    """The attention output (..., n, Dv) = acc / sum; rows that saw no visible
    key give zeros (never NaN)."""
    total = state.softmax.sum
    visible = total > 0
    return torch.where(
        visible,
        state.acc / torch.where(visible, total, torch.ones_like(total)),
        0.0,
    )


def log_sum_exp(state: Accumulator) -> torch.Tensor:
    """(..., n) log-sum-exp of each row's scores, max + log(sum): all
    FlashAttention keeps for its backward; -inf for rows that saw no visible
    key."""
    stats = state.softmax
    visible = stats.sum > 0
    lse = safe_max(stats.max) + torch.log(
        torch.where(visible, stats.sum, torch.ones_like(stats.sum))
    )
    return torch.where(visible, lse, float("-inf"))[..., 0]


def online_softmax_stats(
    x: torch.Tensor, block_size: int
) -> OnlineSoftmaxState:
    """Row maximum and row sum of ``exp(x - max)`` of x (..., N), reading x in
    blocks of ``block_size`` columns."""
    check_floating(x, "x")
    check_int(block_size, "block_size")
    state = init_state(x.shape[:-1], dtype=x.dtype, device=x.device)
    for start in range(0, x.shape[-1], block_size):
        state, _, _ = update(state, x[..., start : start + block_size])
    return state


def online_softmax(x: torch.Tensor, block_size: int = 4) -> torch.Tensor:
    """Softmax of x (..., N) along the last axis, computed with one streaming
    pass for the statistics.

    The first pass reads x block by block and keeps only the running max and
    sum (O(1) memory per row); the second pass normalises. Rows that are
    entirely ``-inf`` give all zeros (like the course's reference). Equal to
    ``torch.softmax(x, -1)`` up to float rounding; see
    :func:`online_softmax_trace` for a step-by-step view.
    """
    state = online_softmax_stats(x, block_size)
    total = state.sum
    out = torch.exp(x - safe_max(state.max))
    return torch.where(
        total > 0,
        out / torch.where(total > 0, total, torch.ones_like(total)),
        torch.zeros_like(out),
    )


def online_softmax_trace(x: torch.Tensor, block_size: int) -> list[dict]:
    """The running statistics after each block of a 1-D score vector x (N,),
    for teaching.

    Returns a list with one dict per block: ``block`` (start, stop),
    ``block_max``, ``running_max``, ``rescale`` (= exp(old_max - new_max)),
    ``running_sum`` — all Python floats.
    """
    check_floating(x, "x")
    if x.dim() != 1:
        raise ValueError(
            "online_softmax_trace expects a 1-D tensor, got shape "
            f"{tuple(x.shape)}"
        )
    check_int(block_size, "block_size")
    state = init_state((), dtype=x.dtype, device=x.device)
    rows = []
    for start in range(0, x.shape[0], block_size):
        block = x[start : start + block_size]
        state, _, alpha = update(state, block)
        rows.append(
            {
                "block": (start, start + block.shape[0]),
                "block_max": float(block.max()),
                "running_max": float(state.max),
                "rescale": float(alpha),
                "running_sum": float(state.sum),
            }
        )
    return rows
