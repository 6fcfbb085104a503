"""FlashAttention, forward and backward, written in Triton (chapter 16).

A Triton kernel is a Python function decorated with ``@triton.jit`` and
launched over a *grid* of programs; each program handles one block of data, and
``tl.load`` / ``tl.store`` move whole blocks between memory and the program,
with a boolean ``mask`` for the elements past the end of a tensor. The kernels
here:

* :func:`_forward_kernel`: one program per (query tile, batch * query head). It
  loads its (BLOCK_M, Dk) queries once and walks over key tiles with chapter
  9's online softmax: running maximum ``m``, running sum ``l`` and accumulator
  ``acc``, rescaled by ``exp(m_old - m_new)`` when a tile raises the maximum.
  :func:`_key_range` says which key tiles its rows may see (a causal mask
  **stops** the walk at the diagonal, a sliding window also **starts** it late,
  a padded batch row stops it at the row's last key) and which of them every
  row sees whole: those need no mask; the others are masked by
  :func:`_visible`. It stores the output and the log-sum-exp ``lse = m +
  log(l)`` of each row, all the backward needs. With GQA a group of query heads
  reads one key/value head, never copied; heads of any size up to 256 travel in
  blocks of the next power of two, padded with zeros.
* :func:`_backward_d_kernel`: ``D = rowsum(dO * O)``, one number per query row
  (FlashAttention-2).
* :func:`_backward_dkdv_kernel`: one program per key tile of a key/value head;
  it walks over the query tiles of every query head of its group that may see
  it, recomputes the probabilities ``P = exp(S - lse)`` and accumulates ``dV =
  P^T dO`` and ``dK = scale * dS^T Q`` with ``dS = P * (dO V^T - D)``.
* :func:`_backward_dq_kernel`: one program per query tile; ``dQ = scale * dS
  K`` over its key tiles.

:func:`flash_attention` joins them in a ``torch.autograd.Function``. The same
equations on whole matrices, in PyTorch, are
:mod:`attention_course.flash_reference`.

On a machine without a CUDA GPU the kernels run under Triton's **interpreter**
(``TRITON_INTERPRET=1``): each program is executed in Python with NumPy, one
after the other: the same code and the same arithmetic (bfloat16 aside, which
it computes wrongly), about a million times slower than a GPU, and blind to the
GPU's limits (shared memory, registers), but it runs on any Linux CPU, which is
what the course's tests and notebooks need. Triton publishes wheels for Linux
only: on macOS or Windows importing this module fails with an ImportError that
says so.
"""

from __future__ import annotations

import os
import sys

import torch

from . import functional
from .masks import check_doc_ids
from .validation import (
    check_attention_inputs,
    check_floating,
    check_int,
    check_lengths,
    check_tensor,
)


def _interpret_without_gpu() -> None:
    """Run Triton's interpreter when there is no CUDA GPU, unless the user
    chose (TRITON_INTERPRET set to anything).

    This is the one place where the course sets it. Triton reads the variable
    whenever a function is decorated with ``@triton.jit``, and decides there
    whether the function is compiled for the GPU or interpreted on the CPU;
    without a GPU, compiling fails ("0 active drivers"). Triton's own library
    (``tl.sum``, ``tl.max``) is decorated when Triton is first imported, so the
    variable must be set before that: if Triton was imported already in the
    other mode (``torch.compile`` imports it), its Python modules are imported
    afresh (its compiled extension, ``triton._C``, cannot be and need not be).
    """
    if (
        not os.environ.get("TRITON_INTERPRET")
        and not torch.cuda.is_available()
    ):
        os.environ["TRITON_INTERPRET"] = "1"
    language = sys.modules.get("triton.language")
    if language is not None and _interpreted(language.sum) != (
        os.environ.get("TRITON_INTERPRET") == "1"
    ):
        for name in [
            n
            for n in sys.modules
            if n.split(".")[0] == "triton" and not n.startswith("triton._C")
        ]:
            del sys.modules[name]


def _interpreted(fn) -> bool:
    return type(fn).__name__ == "InterpretedFunction"


_interpret_without_gpu()

try:
    import triton
    import triton.language as tl
except ModuleNotFoundError as err:  # pragma: no cover - Linux CI has triton
    raise ImportError(
        "Triton is not installed. It has wheels for Linux only: on macOS or "
        "Windows run chapter 16 on "
        "Colab, or read its stored outputs in the book."
    ) from err

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
# a head is padded to a power of two >= 16 (tl.arange needs one; tl.dot needs
# sides >= 16)
MAX_HEAD_DIM = 256
BLOCK_SIZES = (16, 32, 64, 128)
_DTYPES = {
    torch.float32: "float32",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
}


# -----------------------------------------------------------------------------
# a first kernel


@triton.jit
def _softmax_kernel(X, Y, n_cols, stride_row, BLOCK: tl.constexpr):
    """Softmax of one row of X per program. BLOCK, a power of two, covers the
    whole row: the columns past n_cols are masked; they load -inf, whose exp is
    0, and are not stored."""
    row = tl.program_id(0)  # which program am I? -> which row
    cols = tl.arange(0, BLOCK)  # (BLOCK,) 0, 1, ..., BLOCK - 1
    inside = cols < n_cols
    # one block in
    x = tl.load(X + row * stride_row + cols, mask=inside, other=float("-inf"))
    e = tl.exp(x - tl.max(x, 0))
    # one block out
    tl.store(Y + row * stride_row + cols, e / tl.sum(e, 0), mask=inside)


def softmax_rows(x: torch.Tensor) -> torch.Tensor:
    """Softmax over the last axis of a float32 (N, C) tensor by
    :func:`_softmax_kernel`: a grid of N programs, each with a block of the
    next power of two >= C columns."""
    check_attention_inputs(x, x, x)
    if x.dim() != 2 or x.dtype != torch.float32:
        raise ValueError(
            f"softmax_rows takes a float32 (N, C) tensor, got {x.dtype} of "
            f"shape {tuple(x.shape)}"
        )
    x = _contiguous_rows(x)
    y = torch.empty_like(x)
    _softmax_kernel[(x.shape[0],)](
        x, y, x.shape[1], x.stride(0), BLOCK=triton.next_power_of_2(x.shape[1])
    )
    return y


# -----------------------------------------------------------------------------
# forward


@triton.jit
def _online_step(s, v, m_i, l_i, acc, PRECISION: tl.constexpr):
    """Fold one tile of scaled scores s (BM, BN) and its values v (BN, Dv) into
    the running m_i, l_i (BM,) and
    acc (BM, Dv): chapter 9's online softmax. Rows whose maximum is still -inf
    (no key seen) use 0 instead, so that exp(-inf - (-inf)) never makes a
    NaN."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    # how much the old maximum overstated: rescale what was summed so far
    alpha = tl.exp(m_i - m_safe)
    p = tl.exp(s - m_safe[:, None])  # (BM, BN)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(
        p.to(v.dtype), v, input_precision=PRECISION
    )
    return m_new, l_i, acc


@triton.jit
def _visible(
    rows,
    cols,
    T_Q,
    T_K,
    length,
    window,
    IS_CAUSAL: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    start=0,
    end=0,
    HAS_RANGES: tl.constexpr = False,
):
    """True where query ``rows`` may attend key ``cols`` (broadcast against
    each other: (BM, 1) and (1, BN), or transposed): both inside their
    sequence, the key before this batch row's ``length``, and, causal, at most
    the query's position ``rows + T_K - T_Q`` (bottom-right), within ``window``
    of it for a sliding window, and in the row's own key range [start, end) (a
    document), broadcast like ``rows``."""
    position = rows + T_K - T_Q
    ok = (rows < T_Q) & (cols < length)
    if IS_CAUSAL:
        ok = ok & (cols <= position)
    if HAS_WINDOW:
        ok = ok & (cols > position - window)
    if HAS_RANGES:
        ok = ok & (cols >= start) & (cols < end)
    return ok


@triton.jit
def _key_range(
    start_m,
    T_Q,
    T_K,
    length,
    window,
    IS_CAUSAL: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """The key tiles of the query tile at ``start_m``: keys [lo, hi) hold every
    key a row of it may see, and the tiles in [full_lo, full_hi) lie entirely
    inside what every row sees (no mask needed). ``lo``, ``full_lo`` and
    ``full_hi`` are multiples of BLOCK_N;
    :func:`~attention_course.tiles.kernel_key_range` is the same arithmetic in
    Python."""
    # the positions of the tile's first and last query
    first = start_m + T_K - T_Q
    last = first + BLOCK_M - 1
    # first * 0: a tensor even where length is a plain int
    hi = tl.minimum(first * 0 + length, T_K)
    free_hi = hi
    lo = first * 0
    free_lo = lo
    if IS_CAUSAL:
        hi = tl.minimum(hi, tl.maximum(last + 1, 0))
        free_hi = tl.minimum(free_hi, tl.maximum(first + 1, 0))
    if HAS_WINDOW:
        lo = tl.maximum(first - window + 1, 0)
        free_lo = tl.maximum(last - window + 1, 0)
    lo = (lo // BLOCK_N) * BLOCK_N
    full_lo = tl.maximum(tl.cdiv(free_lo, BLOCK_N) * BLOCK_N, lo)
    full_hi = tl.maximum((free_hi // BLOCK_N) * BLOCK_N, full_lo)
    return lo, full_lo, full_hi, hi


@triton.jit
def _row_ranges(STARTS, ENDS, b, offs_m, T_Q):
    """The key range [start, end) of each query row (BM,) of batch row b; rows
    past T_Q get the empty [0, 0)."""
    inside = offs_m < T_Q
    return (
        tl.load(STARTS + b * T_Q + offs_m, mask=inside, other=0),
        tl.load(ENDS + b * T_Q + offs_m, mask=inside, other=0),
    )


@triton.jit
def _narrow(
    lo,
    full_lo,
    full_hi,
    hi,
    start,
    end,
    offs_m,
    T_Q,
    T_K,
    BLOCK_N: tl.constexpr,
):
    """Narrow a query tile's key tiles to its rows' ranges: nothing before the
    smallest start or from the largest end on is loaded, and only tiles inside
    every row's [start, end) go unmasked."""
    inside = offs_m < T_Q
    lo = tl.maximum(
        lo, (tl.min(tl.where(inside, start, T_K), 0) // BLOCK_N) * BLOCK_N
    )
    hi = tl.minimum(hi, tl.max(tl.where(inside, end, 0), 0))
    full_lo = tl.maximum(
        full_lo,
        tl.cdiv(tl.max(tl.where(inside, start, 0), 0), BLOCK_N) * BLOCK_N,
    )
    full_lo = tl.maximum(full_lo, lo)
    full_hi = tl.maximum(
        tl.minimum(
            full_hi,
            (tl.min(tl.where(inside, end, T_K), 0) // BLOCK_N) * BLOCK_N,
        ),
        full_lo,
    )
    return lo, full_lo, full_hi, hi


@triton.jit
def _query_tile_keys(
    start_m,
    offs_m,
    b,
    LENS,
    STARTS,
    ENDS,
    window,
    T_Q,
    T_K,
    IS_CAUSAL: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    HAS_LENGTHS: tl.constexpr,
    HAS_RANGES: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """What the forward and dQ programs of the query tile at ``start_m`` (rows
    ``offs_m``) of batch row ``b`` walk over: ``(lo, full_lo, full_hi, hi)``
    as :func:`_key_range` gives them, narrowed to the rows' own key ranges,
    and what :func:`_visible` needs: the row's key length and the rows'
    [start, end) (zeros without ranges)."""
    length = T_K
    if HAS_LENGTHS:
        # this batch row's keys: [0, length), the rest is padding
        length = tl.load(LENS + b)
    lo, full_lo, full_hi, hi = _key_range(
        start_m,
        T_Q,
        T_K,
        length,
        window,
        IS_CAUSAL,
        HAS_WINDOW,
        BLOCK_M,
        BLOCK_N,
    )
    start, end = offs_m * 0, offs_m * 0
    if HAS_RANGES:
        start, end = _row_ranges(STARTS, ENDS, b, offs_m, T_Q)
        lo, full_lo, full_hi, hi = _narrow(
            lo, full_lo, full_hi, hi, start, end, offs_m, T_Q, T_K, BLOCK_N
        )
    return lo, full_lo, full_hi, hi, length, start, end


@triton.jit
def _load(ptrs, rows_ok, offs_d, D: tl.constexpr, BLOCK_D: tl.constexpr):
    """A tile (R, BLOCK_D) of rows: zeros where ``rows_ok`` (R, 1) is False and
    in the features D .. BLOCK_D - 1 that pad a head size to a power of two
    (zeros change no dot product)."""
    ok = rows_ok
    if D < BLOCK_D:
        ok = ok & (offs_d[None, :] < D)
    return tl.load(ptrs, mask=ok, other=0.0)


@triton.jit
def _forward_kernel(
    Q,
    K,
    V,
    O,
    LSE,
    LENS,
    STARTS,
    ENDS,
    scale,
    window,
    T_Q,
    T_K,
    H,
    GROUP,
    stride_qb,
    stride_qh,
    stride_qt,
    stride_kb,
    stride_kh,
    stride_kt,
    stride_vb,
    stride_vh,
    stride_vt,
    stride_ob,
    stride_oh,
    stride_ot,
    IS_CAUSAL: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    HAS_LENGTHS: tl.constexpr,
    HAS_RANGES: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    D_K: tl.constexpr,
    D_V: tl.constexpr,
    BLOCK_DK: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    PRECISION: tl.constexpr,
):
    start_m = tl.program_id(0) * BLOCK_M  # this program's query tile ...
    bh = tl.program_id(1)  # ... of this (batch, query head)
    b, h = bh // H, bh % H
    # the key/value head its group of GROUP query heads shares (GQA; GROUP = 1:
    # one each)
    h_kv = h // GROUP
    offs_m = start_m + tl.arange(0, BLOCK_M)  # (BM,) query rows
    # (BN,) key columns of a tile, from its start
    offs_n = tl.arange(0, BLOCK_N)
    offs_dk, offs_dv = tl.arange(0, BLOCK_DK), tl.arange(0, BLOCK_DV)
    q = _load(
        Q
        + b * stride_qb
        + h * stride_qh
        + offs_m[:, None] * stride_qt
        + offs_dk[None, :],
        # (BM, Dk), read once
        offs_m[:, None] < T_Q,
        offs_dk,
        D_K,
        BLOCK_DK,
    )
    k_ptrs = (
        K
        + b * stride_kb
        + h_kv * stride_kh
        + offs_n[:, None] * stride_kt
        + offs_dk[None, :]
    )
    v_ptrs = (
        V
        + b * stride_vb
        + h_kv * stride_vh
        + offs_n[:, None] * stride_vt
        + offs_dv[None, :]
    )

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)

    lo, full_lo, full_hi, hi, length, start, end = _query_tile_keys(
        start_m,
        offs_m,
        b,
        LENS,
        STARTS,
        ENDS,
        window,
        T_Q,
        T_K,
        IS_CAUSAL,
        HAS_WINDOW,
        HAS_LENGTHS,
        HAS_RANGES,
        BLOCK_M,
        BLOCK_N,
    )
    # (BN, 1) all True: the unmasked tiles lie inside the keys
    every = offs_n[:, None] < BLOCK_N
    # tiles every row sees whole: no mask
    for start_n in range(full_lo, full_hi, BLOCK_N):
        k = _load(k_ptrs + start_n * stride_kt, every, offs_dk, D_K, BLOCK_DK)
        v = _load(v_ptrs + start_n * stride_vt, every, offs_dv, D_V, BLOCK_DV)
        # (BM, BN)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
        m_i, l_i, acc = _online_step(s, v, m_i, l_i, acc, PRECISION)
    # then the tiles that cross a mask's edge (the window's start, the
    # diagonal, the padding, the ragged end), with the mask; nothing before lo
    # or from hi on is ever loaded
    for start_n in range(lo, hi, BLOCK_N):
        if (start_n < full_lo) | (start_n >= full_hi):
            cols = start_n + offs_n
            k = _load(
                k_ptrs + start_n * stride_kt,
                cols[:, None] < T_K,
                offs_dk,
                D_K,
                BLOCK_DK,
            )
            v = _load(
                v_ptrs + start_n * stride_vt,
                cols[:, None] < T_K,
                offs_dv,
                D_V,
                BLOCK_DV,
            )
            s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
            visible = _visible(
                offs_m[:, None],
                cols[None, :],
                T_Q,
                T_K,
                length,
                window,
                IS_CAUSAL,
                HAS_WINDOW,
                start[:, None],
                end[:, None],
                HAS_RANGES,
            )
            s = tl.where(visible, s, float("-inf"))
            m_i, l_i, acc = _online_step(s, v, m_i, l_i, acc, PRECISION)

    # False for a row that may attend no key: output 0, lse -inf
    seen = l_i > 0.0
    out = acc / tl.where(seen, l_i, 1.0)[:, None]
    lse = tl.where(seen, m_i + tl.log(tl.where(seen, l_i, 1.0)), float("-inf"))
    o_ok = offs_m[:, None] < T_Q
    if D_V < BLOCK_DV:
        o_ok = o_ok & (offs_dv[None, :] < D_V)
    tl.store(
        O
        + b * stride_ob
        + h * stride_oh
        + offs_m[:, None] * stride_ot
        + offs_dv[None, :],
        out.to(O.dtype.element_ty),
        mask=o_ok,
    )
    tl.store(LSE + bh * T_Q + offs_m, lse, mask=offs_m < T_Q)


# -----------------------------------------------------------------------------
# backward


@triton.jit
def _backward_d_kernel(
    O,
    DO,
    D,
    T_Q,
    H,
    stride_ob,
    stride_oh,
    stride_ot,
    BLOCK_M: tl.constexpr,
    D_V: tl.constexpr,
    BLOCK_DV: tl.constexpr,
):
    """D = rowsum(dO * O) (B * H, Tq), float32: FlashAttention-2's stand-in for
    rowsum(dP * P). O and dO are
    contiguous (B, H, Tq, Dv): one set of strides for both."""
    bh = tl.program_id(1)
    b, h = bh // H, bh % H
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_DV)
    at = (
        b * stride_ob
        + h * stride_oh
        + offs_m[:, None] * stride_ot
        + offs_d[None, :]
    )
    o = _load(O + at, offs_m[:, None] < T_Q, offs_d, D_V, BLOCK_DV)
    do = _load(DO + at, offs_m[:, None] < T_Q, offs_d, D_V, BLOCK_DV)
    tl.store(
        D + bh * T_Q + offs_m,
        tl.sum(o.to(tl.float32) * do.to(tl.float32), 1),
        mask=offs_m < T_Q,
    )


@triton.jit
def _recompute_p(s, lse, visible):
    """P = exp(S - lse) on the visible pairs, 0 elsewhere; lse broadcast along
    s. A row that saw no key (lse = -inf) is entirely invisible: lse is
    replaced by 0 there, so exp(-inf - 0) = 0 instead of NaN."""
    s = tl.where(visible, s, float("-inf"))
    return tl.exp(s - tl.where(lse == float("-inf"), 0.0, lse))


@triton.jit
def _query_range(
    start_n,
    T_Q,
    T_K,
    length,
    window,
    IS_CAUSAL: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """The query rows [lo, hi) that may see a key of the tile at ``start_n``
    (lo a multiple of BLOCK_M): from the first query whose position reaches it
    (causal) to the last whose window still holds it; none past the padding."""
    lo = start_n * 0
    hi = tl.where(start_n < length, T_Q, 0)
    # query i sits at position i + T_K - T_Q and sees keys up to it
    if IS_CAUSAL:
        lo = tl.maximum(start_n - (T_K - T_Q), 0)
    if HAS_WINDOW:  # ... and none more than window - 1 before it
        hi = tl.minimum(
            hi, tl.maximum(start_n + BLOCK_N - 1 + window - (T_K - T_Q), 0)
        )
    return (lo // BLOCK_M) * BLOCK_M, hi


@triton.jit
def _backward_dkdv_kernel(
    Q,
    K,
    V,
    DO,
    LSE,
    D,
    DK,
    DV,
    LENS,
    STARTS,
    ENDS,
    scale,
    window,
    T_Q,
    T_K,
    H,
    GROUP,
    stride_qb,
    stride_qh,
    stride_qt,
    stride_kb,
    stride_kh,
    stride_kt,
    stride_vb,
    stride_vh,
    stride_vt,
    stride_db,
    stride_dh,
    stride_dt,
    IS_CAUSAL: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    HAS_LENGTHS: tl.constexpr,
    HAS_RANGES: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    D_K: tl.constexpr,
    D_V: tl.constexpr,
    BLOCK_DK: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """One program per (key tile, batch * key/value head): dK and dV of its
    BLOCK_N keys, summed over the GROUP query heads that share them and every
    query tile that may see them. Computed transposed, (BN, BM), so that the
    key rows stay rows. DK and DV are written with K's and V's strides: the
    launcher makes them equal."""
    start_n = tl.program_id(0) * BLOCK_N
    bh_kv = tl.program_id(1)
    b, h_kv = bh_kv // (H // GROUP), bh_kv % (H // GROUP)
    length = T_K
    if HAS_LENGTHS:
        length = tl.load(LENS + b)
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_dk, offs_dv = tl.arange(0, BLOCK_DK), tl.arange(0, BLOCK_DV)
    keys = offs_n[:, None] < T_K
    k_at = (
        b * stride_kb
        + h_kv * stride_kh
        + offs_n[:, None] * stride_kt
        + offs_dk[None, :]
    )
    v_at = (
        b * stride_vb
        + h_kv * stride_vh
        + offs_n[:, None] * stride_vt
        + offs_dv[None, :]
    )
    k = _load(K + k_at, keys, offs_dk, D_K, BLOCK_DK)
    v = _load(V + v_at, keys, offs_dv, D_V, BLOCK_DV)
    dk = tl.zeros([BLOCK_N, BLOCK_DK], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_DV], tl.float32)

    lo, hi = _query_range(
        start_n,
        T_Q,
        T_K,
        length,
        window,
        IS_CAUSAL,
        HAS_WINDOW,
        BLOCK_M,
        BLOCK_N,
    )
    # the query heads that read these keys
    for h in range(h_kv * GROUP, (h_kv + 1) * GROUP):
        bh = b * H + h
        for start_m in range(lo, hi, BLOCK_M):
            rows = start_m + offs_m  # (BM,)
            q = _load(
                Q
                + b * stride_qb
                + h * stride_qh
                + rows[:, None] * stride_qt
                + offs_dk[None, :],
                rows[:, None] < T_Q,
                offs_dk,
                D_K,
                BLOCK_DK,
            )
            do = _load(
                DO
                + b * stride_db
                + h * stride_dh
                + rows[:, None] * stride_dt
                + offs_dv[None, :],
                rows[:, None] < T_Q,
                offs_dv,
                D_V,
                BLOCK_DV,
            )
            lse = tl.load(LSE + bh * T_Q + rows, mask=rows < T_Q, other=0.0)
            d = tl.load(D + bh * T_Q + rows, mask=rows < T_Q, other=0.0)
            start, end = rows * 0, rows * 0
            # every query tile of the mask's range is visited: ranges narrow
            # only the forward's
            if HAS_RANGES:
                start, end = _row_ranges(STARTS, ENDS, b, rows, T_Q)
            visible = _visible(
                rows[None, :],
                offs_n[:, None],
                T_Q,
                T_K,
                length,
                window,
                IS_CAUSAL,
                # (BN, BM)
                HAS_WINDOW,
                start[None, :],
                end[None, :],
                HAS_RANGES,
            )
            # (BN, BM) = S^T
            s_t = tl.dot(k, tl.trans(q), input_precision=PRECISION) * scale
            p_t = _recompute_p(s_t, lse[None, :], visible)
            # dV = P^T dO
            dv += tl.dot(p_t.to(do.dtype), do, input_precision=PRECISION)
            # dP^T = V dO^T
            dp_t = tl.dot(v, tl.trans(do), input_precision=PRECISION)
            ds_t = p_t * (dp_t - d[None, :])  # dS^T = P^T * (dP^T - D)
            # dK = dS^T Q (times scale, below)
            dk += tl.dot(ds_t.to(q.dtype), q, input_precision=PRECISION)
    dk_ok, dv_ok = keys, keys
    if D_K < BLOCK_DK:
        dk_ok = dk_ok & (offs_dk[None, :] < D_K)
    if D_V < BLOCK_DV:
        dv_ok = dv_ok & (offs_dv[None, :] < D_V)
    tl.store(DK + k_at, (dk * scale).to(DK.dtype.element_ty), mask=dk_ok)
    tl.store(DV + v_at, dv.to(DV.dtype.element_ty), mask=dv_ok)


@triton.jit
def _backward_dq_kernel(
    Q,
    K,
    V,
    DO,
    LSE,
    D,
    DQ,
    LENS,
    STARTS,
    ENDS,
    scale,
    window,
    T_Q,
    T_K,
    H,
    GROUP,
    stride_qb,
    stride_qh,
    stride_qt,
    stride_kb,
    stride_kh,
    stride_kt,
    stride_vb,
    stride_vh,
    stride_vt,
    stride_db,
    stride_dh,
    stride_dt,
    IS_CAUSAL: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    HAS_LENGTHS: tl.constexpr,
    HAS_RANGES: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    D_K: tl.constexpr,
    D_V: tl.constexpr,
    BLOCK_DK: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """One program per (query tile, batch * query head): dQ = scale * dS K over
    the key tiles its rows may see (the forward's range, every tile masked). DQ
    is written with Q's strides: the launcher makes them equal."""
    start_m = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1)
    b, h = bh // H, bh % H
    h_kv = h // GROUP
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_dk, offs_dv = tl.arange(0, BLOCK_DK), tl.arange(0, BLOCK_DV)
    rows = offs_m[:, None] < T_Q
    q_at = (
        b * stride_qb
        + h * stride_qh
        + offs_m[:, None] * stride_qt
        + offs_dk[None, :]
    )
    q = _load(Q + q_at, rows, offs_dk, D_K, BLOCK_DK)
    do = _load(
        DO
        + b * stride_db
        + h * stride_dh
        + offs_m[:, None] * stride_dt
        + offs_dv[None, :],
        rows,
        offs_dv,
        D_V,
        BLOCK_DV,
    )
    lse = tl.load(LSE + bh * T_Q + offs_m, mask=offs_m < T_Q, other=0.0)
    d = tl.load(D + bh * T_Q + offs_m, mask=offs_m < T_Q, other=0.0)
    dq = tl.zeros([BLOCK_M, BLOCK_DK], tl.float32)

    lo, full_lo, full_hi, hi, length, start, end = _query_tile_keys(
        start_m,
        offs_m,
        b,
        LENS,
        STARTS,
        ENDS,
        window,
        T_Q,
        T_K,
        IS_CAUSAL,
        HAS_WINDOW,
        HAS_LENGTHS,
        HAS_RANGES,
        BLOCK_M,
        BLOCK_N,
    )
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + offs_n
        k = _load(
            K
            + b * stride_kb
            + h_kv * stride_kh
            + cols[:, None] * stride_kt
            + offs_dk[None, :],
            cols[:, None] < T_K,
            offs_dk,
            D_K,
            BLOCK_DK,
        )
        v = _load(
            V
            + b * stride_vb
            + h_kv * stride_vh
            + cols[:, None] * stride_vt
            + offs_dv[None, :],
            cols[:, None] < T_K,
            offs_dv,
            D_V,
            BLOCK_DV,
        )
        visible = _visible(
            offs_m[:, None],
            cols[None, :],
            T_Q,
            T_K,
            length,
            window,
            IS_CAUSAL,
            HAS_WINDOW,
            start[:, None],
            end[:, None],
            HAS_RANGES,
        )
        # (BM, BN)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
        p = _recompute_p(s, lse[:, None], visible)
        dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)  # dP = dO V^T
        ds = p * (dp - d[:, None])
        dq += tl.dot(ds.to(k.dtype), k, input_precision=PRECISION)
    dq_ok = rows
    if D_K < BLOCK_DK:
        dq_ok = dq_ok & (offs_dk[None, :] < D_K)
    tl.store(DQ + q_at, (dq * scale).to(DQ.dtype.element_ty), mask=dq_ok)


# -----------------------------------------------------------------------------
# launchers


def _power_of_two_in(value, allowed, name: str, why: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(
            f"{name} must be an int, got {type(value).__name__} {value!r}"
        )
    if value not in allowed:
        raise ValueError(f"{name}={value} is not supported: {why} {allowed}")
    return value


def check_flash_inputs(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    is_causal: bool = False,
    window: int | None = None,
    key_lengths: torch.Tensor | None = None,
    key_ranges: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> None:
    """Raise, naming the problem, unless q (B, Hq, Tq, Dk), k (B, Hkv, Tk, Dk),
    v (B, Hkv, Tk, Dv) and the mask's arguments are what the kernels handle.

    Hq must be a multiple of Hkv (each key/value head serves Hq / Hkv query
    heads: GQA, MQA); head sizes up to :data:`MAX_HEAD_DIM` (padded to a power
    of two >= 16 inside the kernel); float32 / float16 (bfloat16 on a GPU
    only: the interpreter computes it wrongly), on the GPU when the kernels are
    compiled and on the CPU when they are interpreted. Any strides: the kernels
    read through them, and the backward writes into fresh tensors.
    """
    for name, x in (("query", q), ("key", k), ("value", v)):
        check_floating(x, name)
        if x.dim() != 4:
            raise ValueError(
                f"{name} must be 4-D (B, H, T, Dh), got shape {tuple(x.shape)}"
            )
        if x.shape[-2] == 0:
            raise ValueError(
                f"{name} has length T = 0: there is nothing to attend"
            )
        if 0 in x.shape:
            raise ValueError(
                f"{name} has an empty dimension, shape {tuple(x.shape)}: B, "
                "H and Dh must be >= 1"
            )
        if x.shape[-1] > MAX_HEAD_DIM:
            raise ValueError(
                f"{name} head size {x.shape[-1]} is larger than "
                f"{MAX_HEAD_DIM}, the most a tile of "
                "the kernel holds"
            )
    if q.shape[0] != k.shape[0] or k.shape[:2] != v.shape[:2]:
        raise ValueError(
            "query, key and value must have one batch size B and key and "
            "value the same heads, got "
            f"{tuple(q.shape[:2])}, {tuple(k.shape[:2])}, "
            f"{tuple(v.shape[:2])} (the kernel does not "
            "broadcast)"
        )
    if q.shape[1] % k.shape[1]:
        raise ValueError(
            f"{q.shape[1]} query heads do not split into groups over "
            f"{k.shape[1]} key/value heads: "
            "Hq must be a multiple of Hkv"
        )
    # query heads per key/value head: SDPA's broadcast over (B, Hkv, group)
    groups = q.shape[1] // k.shape[1]
    check_attention_inputs(
        q.unflatten(1, (k.shape[1], groups)), k[:, :, None], v[:, :, None]
    )
    if q.dtype not in _DTYPES or (INTERPRETED and q.dtype == torch.bfloat16):
        where = (
            "under Triton's interpreter (no GPU)"
            if INTERPRETED
            else "on the GPU"
        )
        allowed = (
            ("float32", "float16") if INTERPRETED else tuple(_DTYPES.values())
        )
        raise TypeError(
            f"dtype {q.dtype} is not supported {where}: use one of {allowed}"
        )
    if INTERPRETED and q.device.type != "cpu":
        raise ValueError(
            f"the tensors are on {q.device}, but Triton's interpreter runs "
            "on the CPU"
        )
    if not INTERPRETED and q.device.type != "cuda":
        raise ValueError(
            f"the tensors are on {q.device}, but the kernels are compiled "
            "for the GPU: move them with "
            ".cuda()"
        )
    if window is not None:
        check_int(window, "window")
        if not is_causal:
            raise ValueError(
                "window needs is_causal=True: the sliding window is causal "
                "(query i sees keys i' - "
                "window < j <= i', as masks.sliding_window_mask)"
            )
    if key_lengths is not None:
        check_tensor(key_lengths, "key_lengths")
        check_lengths(key_lengths, k.shape[2])
        if (
            key_lengths.shape[0] != q.shape[0]
            or key_lengths.device != q.device
        ):
            raise ValueError(
                f"key_lengths must be (B,) = ({q.shape[0]},) on {q.device}, "
                "got "
                f"{tuple(key_lengths.shape)} on {key_lengths.device}"
            )
    if key_ranges is not None:
        check_key_ranges(key_ranges, q, k.shape[2])


def check_key_ranges(key_ranges, q: torch.Tensor, t_k: int) -> None:
    """Raise unless ``key_ranges`` is (starts, ends), integer tensors (B, Tq)
    on q's device, 0 <= start <= end <= Tk (an empty range is a query that
    attends nothing)."""
    if not isinstance(key_ranges, tuple | list) or len(key_ranges) != 2:
        raise TypeError(
            "key_ranges must be a pair (starts, ends) of (B, Tq) integer "
            "tensors"
        )
    shape = (q.shape[0], q.shape[2])
    for name, r in zip(("starts", "ends"), key_ranges, strict=True):
        check_tensor(r, f"key_ranges' {name}")
        if (
            r.dtype.is_floating_point
            or r.dtype.is_complex
            or r.dtype == torch.bool
        ):
            raise TypeError(
                f"key_ranges' {name} must be an integer tensor, got {r.dtype}"
            )
        if tuple(r.shape) != shape or r.device != q.device:
            raise ValueError(
                f"key_ranges' {name} must be (B, Tq) = {shape} on "
                f"{q.device}, got {tuple(r.shape)} "
                f"on {r.device}"
            )
    starts, ends = key_ranges
    if (
        bool((starts < 0).any())
        or bool((ends > t_k).any())
        or bool((starts > ends).any())
    ):
        raise ValueError(
            f"key_ranges must hold 0 <= start <= end <= Tk = {t_k} for "
            "every query"
        )


def _blocks(block_m, block_n, head_dim: int) -> tuple[int, int]:
    """Tile sizes: small under the interpreter (each program is Python), larger
    on a GPU (fewer programs)."""
    # tiles in shared memory
    gpu = (
        (128, 64)
        if head_dim <= 64
        else (64, 64)
        if head_dim <= 128
        else (64, 32)
    )
    default_m, default_n = (32, 32) if INTERPRETED else gpu
    why = "a tile needs a power of two in"
    return (
        _power_of_two_in(
            default_m if block_m is None else block_m,
            BLOCK_SIZES,
            "block_m",
            why,
        ),
        _power_of_two_in(
            default_n if block_n is None else block_n,
            BLOCK_SIZES,
            "block_n",
            why,
        ),
    )


def _launch_options(head_dim: int, dtype: torch.dtype) -> dict:
    """Warps and software-pipelining stages of a compiled launch (a GPU's
    business; the interpreter has neither). Each stage holds a K and a V tile
    in shared memory: two stages where a stage's tiles are large (float32 heads
    over 64 features, any head over 128), so that they fit in the 163 KiB an
    A100 gives a program."""
    large = head_dim > 128 or (head_dim > 64 and dtype == torch.float32)
    return (
        {}
        if INTERPRETED
        else {
            "num_warps": 8 if head_dim > 64 else 4,  # pragma: no cover
            "num_stages": 2 if large else 3,
        }
    )


def _contiguous_rows(x: torch.Tensor) -> torch.Tensor:
    """The kernels address (B, H, T) by strides but assume the features of a
    row lie side by side."""
    return x if x.stride(-1) == 1 else x.contiguous()


def _strides(x: torch.Tensor) -> tuple[int, int, int]:
    return x.stride(0), x.stride(1), x.stride(2)


def _precision(dtype: torch.dtype) -> str | None:
    """tl.dot's precision: float32 is multiplied exactly ("ieee"), not in
    TensorFloat-32 as a GPU would by default; None (Triton's default) for
    16-bit inputs."""
    return "ieee" if dtype == torch.float32 else None


def _mask_args(
    q, k, v, is_causal, window, key_lengths, block_m, block_n, key_ranges=None
) -> tuple[tuple, dict]:
    """What every kernel takes besides its tensors: (lengths, starts, ends,
    scale, window, Tq, Tk, Hq, group) and the compile-time constants (the
    mask's kind, the tiles, the head sizes and their padded blocks)."""
    d_k, d_v = q.shape[-1], v.shape[-1]
    bm, bn = _blocks(block_m, block_n, max(d_k, d_v))
    lengths = (
        q.new_zeros(1, dtype=torch.int32)
        if key_lengths is None
        else key_lengths.to(torch.int32)
    )
    starts, ends = (
        (lengths, lengths)
        if key_ranges is None
        # (B, Tq) each
        else tuple(r.to(torch.int32).contiguous() for r in key_ranges)
    )
    args = (
        lengths,
        starts,
        ends,
        d_k**-0.5,
        0 if window is None else window,
        q.shape[2],
        k.shape[2],
        q.shape[1],
        q.shape[1] // k.shape[1],
    )
    constants = dict(
        IS_CAUSAL=bool(is_causal),
        HAS_WINDOW=window is not None,
        HAS_LENGTHS=key_lengths is not None,
        HAS_RANGES=key_ranges is not None,
        BLOCK_M=bm,
        BLOCK_N=bn,
        D_K=d_k,
        BLOCK_DK=_padded(d_k),
        D_V=d_v,
        BLOCK_DV=_padded(d_v),
        PRECISION=_precision(q.dtype),
        **_launch_options(max(d_k, d_v), q.dtype),
    )
    return args, constants


def _padded(head_dim: int) -> int:
    """The block that holds a head: a power of two (tl.arange) of at least 16
    (tl.dot)."""
    return max(16, triton.next_power_of_2(head_dim))


def flash_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    is_causal: bool = False,
    block_m: int | None = None,
    block_n: int | None = None,
    *,
    window: int | None = None,
    key_lengths: torch.Tensor | None = None,
    key_ranges: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the forward kernel: the output (B, Hq, Tq, Dv) and the log-sum-exp
    of each row (B, Hq, Tq), float32.

    q (B, Hq, Tq, Dk), k (B, Hkv, Tk, Dk), v (B, Hkv, Tk, Dv). Masks:
    ``is_causal`` bottom-right aligned (query i may attend key j iff j <= i' =
    i + Tk - Tq); ``window`` (with ``is_causal``): also j > i' - window;
    ``key_lengths`` (B,): batch row b attends only its first key_lengths[b]
    keys; ``key_ranges`` = (starts, ends), (B, Tq) each: query i of row b
    attends only keys starts[b, i] <= j < ends[b, i] (packed documents: the
    range of its document, :func:`document_ranges`). A query tile loads only
    the key tiles in [min start, max end) of its rows, so packed documents skip
    each other's tiles. A row that may attend no key gets output 0 and lse
    -inf.
    """
    check_flash_inputs(q, k, v, is_causal, window, key_lengths, key_ranges)
    q, k, v = (_contiguous_rows(x) for x in (q, k, v))
    args, constants = _mask_args(
        q, k, v, is_causal, window, key_lengths, block_m, block_n, key_ranges
    )
    b, h, t_q, d_v = *q.shape[:3], v.shape[-1]
    o = torch.empty((b, h, t_q, d_v), dtype=q.dtype, device=q.device)
    lse = torch.empty((b, h, t_q), dtype=torch.float32, device=q.device)
    # one program per (query tile, batch * query head)
    grid = (triton.cdiv(t_q, constants["BLOCK_M"]), b * h)
    _forward_kernel[grid](
        q,
        k,
        v,
        o,
        lse,
        *args,
        *_strides(q),
        *_strides(k),
        *_strides(v),
        *_strides(o),
        **constants,
    )
    return o, lse


def flash_backward(
    q,
    k,
    v,
    o,
    lse,
    do,
    is_causal: bool = False,
    block_m: int | None = None,
    block_n: int | None = None,
    *,
    window: int | None = None,
    key_lengths: torch.Tensor | None = None,
    key_ranges=None,
    dlse: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Run the backward kernels: (dQ, dK, dV) from the inputs, the output
    ``o``, its ``lse`` and the output's gradient ``do`` (B, Hq, Tq, Dv). Three
    launches: D = rowsum(dO * O), then dK and dV per key tile (summed over the
    query heads of its group), then dQ per query tile (two kernels rather than
    one, so that no two programs add into the same rows).

    The kernels write each gradient with the strides of the tensor it is the
    gradient of, so every tensor is made contiguous first and each gradient
    allocated like it: a view (a slice of a fused QKV, of the head dimension,
    an expanded or transposed tensor) is never written through. Autograd then
    maps the gradients back to the views' bases (summing an expanded tensor's
    gradient over its copies). ``dlse`` (B, Hq, Tq), the gradient of the
    log-sum-exp where it is an output too (sinks): d lse / d S = P, so it
    enters as D - dlse."""
    check_flash_inputs(q, k, v, is_causal, window, key_lengths, key_ranges)
    q, k, v, o, lse, do = (x.contiguous() for x in (q, k, v, o, lse, do))
    args, constants = _mask_args(
        q, k, v, is_causal, window, key_lengths, block_m, block_n, key_ranges
    )
    b, h, t_q, d_v = *q.shape[:3], v.shape[-1]
    bm, bn = constants["BLOCK_M"], constants["BLOCK_N"]
    d = torch.empty((b, h, t_q), dtype=torch.float32, device=q.device)
    _backward_d_kernel[(triton.cdiv(t_q, bm), b * h)](
        o,
        do,
        d,
        t_q,
        h,
        *_strides(o),
        BLOCK_M=bm,
        D_V=d_v,
        BLOCK_DV=constants["BLOCK_DV"],
    )
    if dlse is not None:
        d = d - dlse.float()
    dq, dk, dv = (
        torch.empty_like(x, memory_format=torch.contiguous_format)
        for x in (q, k, v)
    )
    strides = (*_strides(q), *_strides(k), *_strides(v), *_strides(do))
    _backward_dkdv_kernel[(triton.cdiv(k.shape[2], bn), b * k.shape[1])](
        q, k, v, do, lse, d, dk, dv, *args, *strides, **constants
    )
    _backward_dq_kernel[(triton.cdiv(t_q, bm), b * h)](
        q, k, v, do, lse, d, dq, *args, *strides, **constants
    )
    return dq, dk, dv


class FlashAttentionFunction(torch.autograd.Function):
    """Autograd's view of the kernels: forward saves q, k, v, the output and
    the log-sum-exp (never P)."""

    @staticmethod
    def forward(
        ctx,
        q,
        k,
        v,
        is_causal,
        block_m,
        block_n,
        window,
        key_lengths,
        key_ranges=None,
    ):
        o, lse = flash_forward(
            q,
            k,
            v,
            is_causal,
            block_m,
            block_n,
            window=window,
            key_lengths=key_lengths,
            key_ranges=key_ranges,
        )
        ctx.save_for_backward(q, k, v, o, lse, key_lengths)
        ctx.options = (is_causal, block_m, block_n, window, key_ranges)
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse, key_lengths = ctx.saved_tensors
        is_causal, block_m, block_n, window, key_ranges = ctx.options
        dq, dk, dv = flash_backward(
            q,
            k,
            v,
            o,
            lse,
            do,
            is_causal,
            block_m,
            block_n,
            window=window,
            key_lengths=key_lengths,
            key_ranges=key_ranges,
        )
        return dq, dk, dv, None, None, None, None, None, None


def flash_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    is_causal: bool = False,
    block_m: int | None = None,
    block_n: int | None = None,
    *,
    window: int | None = None,
    key_lengths: torch.Tensor | None = None,
    key_ranges: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """Scaled dot-product attention (B, Hq, Tq, Dv) by the Triton kernels,
    differentiable in q, k and v.

    q (B, Hq, Tq, Dk), k (B, Hkv, Tk, Dk), v (B, Hkv, Tk, Dv), Hq a multiple of
    Hkv (GQA: query head h reads key/value head h // (Hq / Hkv), as SDPA's
    ``enable_gqa``). Equal to SDPA with the mask ``causal_mask`` (or
    ``sliding_window_mask`` for a ``window``) combined with
    ``padding_mask(key_lengths)`` and the ``key_ranges`` (documents:
    :func:`document_ranges`), up to float rounding; rows that may attend no key
    give 0.
    """
    return FlashAttentionFunction.apply(
        q, k, v, is_causal, block_m, block_n, window, key_lengths, key_ranges
    )


def document_ranges(
    doc_ids: torch.Tensor, t_q: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``key_ranges`` of packed documents, as
    :func:`~attention_course.masks.document_mask`: ``doc_ids`` (B, Tk) the
    document of each key position, the queries the last ``t_q`` positions
    (default all). Query i attends the keys [start, end) of its own document
    (with ``is_causal``, also only up to its position). The documents must lie
    side by side in order (ids nondecreasing along a row): a document is one
    range."""
    check_doc_ids(doc_ids)
    if doc_ids.dim() != 2:
        raise ValueError(
            f"doc_ids must be (B, Tk), got shape {tuple(doc_ids.shape)}"
        )
    t_k = doc_ids.shape[1]
    t_q = t_k if t_q is None else t_q
    check_int(t_q, "t_q")
    if t_q > t_k:
        raise ValueError(
            f"t_q={t_q} is longer than the {t_k} document ids: the queries "
            "are the last positions"
        )
    if bool((doc_ids[:, 1:] < doc_ids[:, :-1]).any()):
        raise ValueError(
            "doc_ids must be nondecreasing along each row: packed documents "
            "lie side by side, each "
            "one range of keys"
        )
    keys = doc_ids.contiguous()
    # (B, Tq) the document of each query, read at its position
    queries = keys[:, t_k - t_q :].contiguous()
    # (B, Tq) each
    return (
        torch.searchsorted(keys, queries),
        torch.searchsorted(keys, queries, right=True),
    )


def triton_backend(
    q, k, v, mask, *, is_causal, scale, score_mod, dropout_p, need_lse
):
    """``functional.attend``'s backend "triton": (B, H, Tq, D) inputs through
    :func:`flash_attention`, with the kernel's log-sum-exp (so ``return_lse``
    and sinks work). Only ``is_causal`` or no mask: the kernel has no general
    boolean mask, no score_mod and no dropout, and refuses them by name."""
    for given, what in (
        (
            mask is not None,
            "a boolean mask (use is_causal, or flash_attention's window= and "
            "key_lengths=)",
        ),
        (score_mod is not None, "a score_mod"),
        (dropout_p > 0.0, "dropout"),
    ):
        if given:
            raise ValueError(
                f"backend 'triton' does not take {what}: use "
                "backend='eager', 'blockwise' or 'flex'"
            )
    # the kernel scales by 1 / sqrt(Dk): another scale goes into q
    # (differentiable, and the lse follows it)
    q = q * (scale * q.size(-1) ** 0.5) if scale != q.size(-1) ** -0.5 else q
    out, lse = _FlashWithLse.apply(q, k, v, is_causal)
    return out, None, (lse.to(q.dtype) if need_lse else None)


class _FlashWithLse(torch.autograd.Function):
    """The kernels with the log-sum-exp as a second, differentiable output
    (attend's sinks read it)."""

    @staticmethod
    def forward(ctx, q, k, v, is_causal):
        o, lse = flash_forward(q, k, v, is_causal)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.is_causal = is_causal
        return o, lse

    @staticmethod
    def backward(ctx, do, dlse):
        q, k, v, o, lse = ctx.saved_tensors
        if do is None:
            do = torch.zeros_like(o)
        dq, dk, dv = flash_backward(
            q, k, v, o, lse, do, ctx.is_causal, dlse=dlse
        )
        return dq, dk, dv, None


def memory_traffic(
    t: int, head_dim: int, block_m: int, bytes_per_element: int = 2
) -> dict[str, int]:
    """Bytes one (batch, head) of a forward pass moves between the GPU's memory
    (HBM) and its processors, counted element by element, without caches (a
    GPU's L2 absorbs part of the repeated reads), for T queries and T keys.

    ``"unfused"``: attention as three kernels, S = Q K^T written out, the
    softmax reading S and writing P, then O = P V reading P: Q, K, V read once,
    S and P (T, T) each written once and read once, O written once.
    ``"tiled"``: the forward kernel here: Q read once, K and V once per query
    tile (ceil(T / block_m) times), O written once, and the float32 log-sum-exp
    of each row.
    """
    for value, name in (
        (t, "t"),
        (head_dim, "head_dim"),
        (block_m, "block_m"),
        (bytes_per_element, "bytes"),
    ):
        check_int(value, name)
    row = t * head_dim  # elements of one (T, Dh) matrix
    unfused = (3 * row + 4 * t * t + row) * bytes_per_element
    tiled = (
        row + 2 * row * -(-t // block_m) + row
    ) * bytes_per_element + 4 * t
    return {"unfused": unfused, "tiled": tiled}


# -----------------------------------------------------------------------------
# what the GPU adds


def gpu_benchmark_summary(path) -> list[str]:
    """The lines chapter 16 prints about the GPU: the table of
    ``benchmarks/bench_triton.py``'s results file
    (``benchmarks/results/bench_triton.json``), with the GPU and the date of
    the run, or, where no GPU run was recorded, a line that says so and how to
    make one. Nothing here is measured: it only reads the file."""
    import json
    from pathlib import Path

    path = Path(path)
    if not path.exists():
        # lines of at most 79 characters: the book's output column holds 81
        # (tests/test_browser.py)
        return [
            "No GPU result yet: no run on a GPU has been recorded. On a "
            "Linux machine",
            "with a CUDA GPU run",
            "    python benchmarks/gpu_check.py",
            "which checks the kernels there, times them against SDPA's "
            "flash backend",
            f"(benchmarks/bench_triton.py) and writes {path.name}; this "
            "cell reads it.",
        ]
    result = json.loads(path.read_text())
    config, table = result["config"], result["table"]
    lines = [
        f"GPU: {config['gpu']}, {config['date']}, torch {config['torch']}, "
        f"triton {config['triton']}",
        " | ".join(table["headers"]),
    ]
    lines += [" | ".join(str(cell) for cell in row) for row in table["rows"]]
    lines += [
        f"{target}: {measured} ({verdict})"
        for target, measured, verdict in result["targets"]
    ]
    return lines


functional.register("triton", triton_backend)
