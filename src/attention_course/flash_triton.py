"""FlashAttention, forward and backward, written in Triton (chapter 16).

A Triton kernel is a Python function decorated with ``@triton.jit`` and launched over a *grid* of programs; each
program handles one block of data, and ``tl.load`` / ``tl.store`` move whole blocks between memory and the program,
with a boolean ``mask`` for the elements past the end of a tensor. The kernels here:

* :func:`_forward_kernel`: one program per (query tile, batch * head). It loads its (BLOCK_M, Dh) queries once and
  walks over key tiles with chapter 9's online softmax: running maximum ``m``, running sum ``l`` and accumulator
  ``acc``, rescaled by ``exp(m_old - m_new)`` when a tile raises the maximum. Tiles that lie entirely before the
  diagonal (and inside the sequence) need no mask; the loop then runs over the tiles that cross the diagonal or the
  end of the keys, with a mask, and **stops** at the last key any row of the tile may see (causal tile skipping).
  It stores the output and the log-sum-exp ``lse = m + log(l)`` of each row, all the backward needs.
* :func:`_backward_d_kernel`: ``D = rowsum(dO * O)``, one number per query row (FlashAttention-2).
* :func:`_backward_dkdv_kernel`: one program per key tile; it walks over the query tiles that may see it, recomputes
  the probabilities ``P = exp(S - lse)`` and accumulates ``dV = P^T dO`` and ``dK = scale * dS^T Q`` with
  ``dS = P * (dO V^T - D)``.
* :func:`_backward_dq_kernel`: one program per query tile; ``dQ = scale * dS K`` over its key tiles.

:func:`flash_attention` joins them in a ``torch.autograd.Function``. The same equations on whole matrices, in
PyTorch, are :mod:`attention_course.flash_reference`.

On a machine without a CUDA GPU the kernels run under Triton's **interpreter** (``TRITON_INTERPRET=1``): each
program is executed in Python with NumPy, one after the other. Same code, same results, about a million times slower
than a GPU, but it runs on any Linux CPU, which is what the course's tests and notebooks need. Triton publishes
wheels for Linux only: on macOS or Windows importing this module fails with an ImportError that says so.
"""

from __future__ import annotations

import os
import sys

import torch

from .validation import check_attention_inputs


def _interpret_without_gpu() -> None:
    """Run Triton's interpreter when there is no CUDA GPU, unless the user chose (TRITON_INTERPRET set to anything).

    This is the one place where the course sets it. Triton reads the variable whenever a function is decorated with
    ``@triton.jit``, and decides there whether the function is compiled for the GPU or interpreted on the CPU;
    without a GPU, compiling fails ("0 active drivers"). Triton's own library (``tl.sum``, ``tl.max``) is decorated
    when Triton is first imported, so the variable must be set before that: if Triton was imported already in the
    other mode (``torch.compile`` imports it), its Python modules are imported afresh (its compiled extension,
    ``triton._C``, cannot be and need not be).
    """
    if not os.environ.get("TRITON_INTERPRET") and not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"
    language = sys.modules.get("triton.language")
    if language is not None and _interpreted(language.sum) != (os.environ.get("TRITON_INTERPRET") == "1"):
        for name in [n for n in sys.modules if n.split(".")[0] == "triton" and not n.startswith("triton._C")]:
            del sys.modules[name]


def _interpreted(fn) -> bool:
    return type(fn).__name__ == "InterpretedFunction"


_interpret_without_gpu()

try:
    import triton
    import triton.language as tl
except ModuleNotFoundError as err:  # pragma: no cover - Linux CI has triton
    raise ImportError("Triton is not installed. It has wheels for Linux only: on macOS or Windows run chapter 16 on "
                      "Colab, or read its stored outputs in the book.") from err

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
HEAD_DIMS = (16, 32, 64, 128)  # powers of two: tl.arange needs one; tl.dot needs every side >= 16
BLOCK_SIZES = (16, 32, 64, 128)
_DTYPES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}


# ------------------------------------------------------------------------------------------------ a first kernel


@triton.jit
def _softmax_kernel(X, Y, n_cols, stride_row, BLOCK: tl.constexpr):
    """Softmax of one row of X per program. BLOCK, a power of two, covers the whole row: the columns past n_cols
    are masked; they load -inf, whose exp is 0, and are not stored."""
    row = tl.program_id(0)  # which program am I? -> which row
    cols = tl.arange(0, BLOCK)  # (BLOCK,) 0, 1, ..., BLOCK - 1
    inside = cols < n_cols
    x = tl.load(X + row * stride_row + cols, mask=inside, other=float("-inf"))  # one block in
    e = tl.exp(x - tl.max(x, 0))
    tl.store(Y + row * stride_row + cols, e / tl.sum(e, 0), mask=inside)  # one block out


def softmax_rows(x: torch.Tensor) -> torch.Tensor:
    """Softmax over the last axis of a float32 (N, C) tensor by :func:`_softmax_kernel`: a grid of N programs,
    each with a block of the next power of two >= C columns."""
    check_attention_inputs(x, x, x)
    if x.dim() != 2 or x.dtype != torch.float32:
        raise ValueError(f"softmax_rows takes a float32 (N, C) tensor, got {x.dtype} of shape {tuple(x.shape)}")
    x = _contiguous_rows(x)
    y = torch.empty_like(x)
    _softmax_kernel[(x.shape[0],)](x, y, x.shape[1], x.stride(0), BLOCK=triton.next_power_of_2(x.shape[1]))
    return y


# ------------------------------------------------------------------------------------------------ forward


@triton.jit
def _online_step(s, v, m_i, l_i, acc, PRECISION: tl.constexpr):
    """Fold one tile of scaled scores s (BM, BN) and its values v (BN, Dh) into the running m_i, l_i (BM,) and
    acc (BM, Dh): chapter 9's online softmax. Rows whose maximum is still -inf (no key seen) use 0 instead, so
    that exp(-inf - (-inf)) never makes a NaN."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp(m_i - m_safe)  # how much the old maximum overstated: rescale what was summed so far
    p = tl.exp(s - m_safe[:, None])  # (BM, BN)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return m_new, l_i, acc


@triton.jit
def _forward_kernel(Q, K, V, O, LSE, scale, T_Q, T_K, H,
                    stride_qb, stride_qh, stride_qt, stride_kb, stride_kh, stride_kt,
                    stride_vb, stride_vh, stride_vt, stride_ob, stride_oh, stride_ot,
                    IS_CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    HEAD_DIM: tl.constexpr, PRECISION: tl.constexpr):
    start_m = tl.program_id(0) * BLOCK_M  # this program's query tile ...
    bh = tl.program_id(1)  # ... of this (batch, head)
    b, h = bh // H, bh % H
    offs_m = start_m + tl.arange(0, BLOCK_M)  # (BM,) query rows
    offs_n = tl.arange(0, BLOCK_N)  # (BN,) key columns of a tile, from its start
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qt + offs_d[None, :],
                mask=offs_m[:, None] < T_Q, other=0.0)  # (BM, Dh), read once
    k_ptrs = K + b * stride_kb + h * stride_kh + offs_n[:, None] * stride_kt + offs_d[None, :]
    v_ptrs = V + b * stride_vb + h * stride_vh + offs_n[:, None] * stride_vt + offs_d[None, :]

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)

    # keys [0, free) are visible to every row of the tile, keys >= stop to none (bottom-right causal mask)
    free, stop = T_K, T_K
    if IS_CAUSAL:
        free = tl.minimum(tl.maximum(start_m + T_K - T_Q + 1, 0), T_K)
        stop = tl.minimum(tl.maximum(start_m + BLOCK_M + T_K - T_Q, 0), T_K)
    full_stop = (free // BLOCK_N) * BLOCK_N  # whole tiles before it need no mask at all

    for start_n in range(0, full_stop, BLOCK_N):  # tiles below the diagonal: no mask
        k = tl.load(k_ptrs + start_n * stride_kt)
        v = tl.load(v_ptrs + start_n * stride_vt)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale  # (BM, BN)
        m_i, l_i, acc = _online_step(s, v, m_i, l_i, acc, PRECISION)
    for start_n in range(full_stop, stop, BLOCK_N):  # the diagonal and the ragged end: masked; then stop
        cols = start_n + offs_n
        k = tl.load(k_ptrs + start_n * stride_kt, mask=cols[:, None] < T_K, other=0.0)
        v = tl.load(v_ptrs + start_n * stride_vt, mask=cols[:, None] < T_K, other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
        visible = cols[None, :] < T_K
        if IS_CAUSAL:
            visible = visible & (cols[None, :] <= offs_m[:, None] + T_K - T_Q)
        s = tl.where(visible, s, float("-inf"))
        m_i, l_i, acc = _online_step(s, v, m_i, l_i, acc, PRECISION)

    seen = l_i > 0.0  # False for a row that may attend no key: output 0, lse -inf
    out = acc / tl.where(seen, l_i, 1.0)[:, None]
    lse = tl.where(seen, m_i + tl.log(tl.where(seen, l_i, 1.0)), float("-inf"))
    tl.store(O + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_ot + offs_d[None, :],
             out.to(O.dtype.element_ty), mask=offs_m[:, None] < T_Q)
    tl.store(LSE + bh * T_Q + offs_m, lse, mask=offs_m < T_Q)


# ------------------------------------------------------------------------------------------------ backward


@triton.jit
def _backward_d_kernel(O, DO, D, T_Q, H, stride_ob, stride_oh, stride_ot, stride_db, stride_dh, stride_dt,
                       BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr):
    """D = rowsum(dO * O) (B * H, Tq), float32: FlashAttention-2's stand-in for rowsum(dP * P)."""
    bh = tl.program_id(1)
    b, h = bh // H, bh % H
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    rows = offs_m[:, None] < T_Q
    o = tl.load(O + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_ot + offs_d[None, :],
                mask=rows, other=0.0)
    do = tl.load(DO + b * stride_db + h * stride_dh + offs_m[:, None] * stride_dt + offs_d[None, :],
                 mask=rows, other=0.0)
    tl.store(D + bh * T_Q + offs_m, tl.sum(o.to(tl.float32) * do.to(tl.float32), 1), mask=offs_m < T_Q)


@triton.jit
def _recompute_p(s, lse, visible):
    """P = exp(S - lse) on the visible pairs, 0 elsewhere; lse broadcast along s. A row that saw no key (lse =
    -inf) is entirely invisible: lse is replaced by 0 there, so exp(-inf - 0) = 0 instead of NaN."""
    s = tl.where(visible, s, float("-inf"))
    return tl.exp(s - tl.where(lse == float("-inf"), 0.0, lse))


@triton.jit
def _backward_dkdv_kernel(Q, K, V, DO, LSE, D, DK, DV, scale, T_Q, T_K, H,
                          stride_qb, stride_qh, stride_qt, stride_kb, stride_kh, stride_kt,
                          stride_vb, stride_vh, stride_vt, stride_db, stride_dh, stride_dt,
                          IS_CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                          HEAD_DIM: tl.constexpr, PRECISION: tl.constexpr):
    """One program per (key tile, batch * head): dK and dV of its BLOCK_N keys, from every query tile that may
    see them. Computed transposed, (BN, BM), so that the key rows stay rows."""
    start_n = tl.program_id(0) * BLOCK_N
    bh = tl.program_id(1)
    b, h = bh // H, bh % H
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    keys = offs_n[:, None] < T_K
    k = tl.load(K + b * stride_kb + h * stride_kh + offs_n[:, None] * stride_kt + offs_d[None, :],
                mask=keys, other=0.0)
    v = tl.load(V + b * stride_vb + h * stride_vh + offs_n[:, None] * stride_vt + offs_d[None, :],
                mask=keys, other=0.0)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)

    first = 0
    if IS_CAUSAL:  # the first query that may see key start_n is start_n - (Tk - Tq): earlier tiles are skipped
        first = (tl.maximum(start_n - (T_K - T_Q), 0) // BLOCK_M) * BLOCK_M
    for start_m in range(first, T_Q, BLOCK_M):
        rows = start_m + offs_m  # (BM,)
        q = tl.load(Q + b * stride_qb + h * stride_qh + rows[:, None] * stride_qt + offs_d[None, :],
                    mask=rows[:, None] < T_Q, other=0.0)
        do = tl.load(DO + b * stride_db + h * stride_dh + rows[:, None] * stride_dt + offs_d[None, :],
                     mask=rows[:, None] < T_Q, other=0.0)
        lse = tl.load(LSE + bh * T_Q + rows, mask=rows < T_Q, other=0.0)
        d = tl.load(D + bh * T_Q + rows, mask=rows < T_Q, other=0.0)
        visible = keys & (rows[None, :] < T_Q)  # (BN, BM)
        if IS_CAUSAL:
            visible = visible & (offs_n[:, None] <= rows[None, :] + T_K - T_Q)
        s_t = tl.dot(k, tl.trans(q), input_precision=PRECISION) * scale  # (BN, BM) = S^T
        p_t = _recompute_p(s_t, lse[None, :], visible)
        dv += tl.dot(p_t.to(do.dtype), do, input_precision=PRECISION)  # dV = P^T dO
        dp_t = tl.dot(v, tl.trans(do), input_precision=PRECISION)  # dP^T = V dO^T
        ds_t = p_t * (dp_t - d[None, :])  # dS^T = P^T * (dP^T - D)
        dk += tl.dot(ds_t.to(q.dtype), q, input_precision=PRECISION)  # dK = dS^T Q (times scale, below)
    tl.store(DK + b * stride_kb + h * stride_kh + offs_n[:, None] * stride_kt + offs_d[None, :],
             (dk * scale).to(DK.dtype.element_ty), mask=keys)
    tl.store(DV + b * stride_vb + h * stride_vh + offs_n[:, None] * stride_vt + offs_d[None, :],
             dv.to(DV.dtype.element_ty), mask=keys)


@triton.jit
def _backward_dq_kernel(Q, K, V, DO, LSE, D, DQ, scale, T_Q, T_K, H,
                        stride_qb, stride_qh, stride_qt, stride_kb, stride_kh, stride_kt,
                        stride_vb, stride_vh, stride_vt, stride_db, stride_dh, stride_dt,
                        IS_CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        HEAD_DIM: tl.constexpr, PRECISION: tl.constexpr):
    """One program per (query tile, batch * head): dQ = scale * dS K over the key tiles its rows may see."""
    start_m = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1)
    b, h = bh // H, bh % H
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    rows = offs_m[:, None] < T_Q
    q = tl.load(Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qt + offs_d[None, :],
                mask=rows, other=0.0)
    do = tl.load(DO + b * stride_db + h * stride_dh + offs_m[:, None] * stride_dt + offs_d[None, :],
                 mask=rows, other=0.0)
    lse = tl.load(LSE + bh * T_Q + offs_m, mask=offs_m < T_Q, other=0.0)
    d = tl.load(D + bh * T_Q + offs_m, mask=offs_m < T_Q, other=0.0)
    dq = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)

    stop = T_K
    if IS_CAUSAL:  # as in the forward: no row of this tile sees a key at or after stop
        stop = tl.minimum(tl.maximum(start_m + BLOCK_M + T_K - T_Q, 0), T_K)
    for start_n in range(0, stop, BLOCK_N):
        cols = start_n + offs_n
        k = tl.load(K + b * stride_kb + h * stride_kh + cols[:, None] * stride_kt + offs_d[None, :],
                    mask=cols[:, None] < T_K, other=0.0)
        v = tl.load(V + b * stride_vb + h * stride_vh + cols[:, None] * stride_vt + offs_d[None, :],
                    mask=cols[:, None] < T_K, other=0.0)
        visible = rows & (cols[None, :] < T_K)
        if IS_CAUSAL:
            visible = visible & (cols[None, :] <= offs_m[:, None] + T_K - T_Q)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale  # (BM, BN)
        p = _recompute_p(s, lse[:, None], visible)
        dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)  # dP = dO V^T
        ds = p * (dp - d[:, None])
        dq += tl.dot(ds.to(k.dtype), k, input_precision=PRECISION)
    tl.store(DQ + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qt + offs_d[None, :],
             (dq * scale).to(DQ.dtype.element_ty), mask=rows)


# ------------------------------------------------------------------------------------------------ launchers


def _power_of_two_in(value, allowed, name: str, why: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value not in allowed:
        raise ValueError(f"{name}={value} is not supported: {why} {allowed}")
    return value


def check_flash_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """Raise, naming the problem, unless q, k, v (B, H, T, Dh) are what the kernels handle.

    The kernels read one (batch, head) per program with no broadcasting, a head size Dh in :data:`HEAD_DIMS` for
    queries, keys and values alike, float32 / float16 (bfloat16 on a GPU only: the interpreter computes it wrongly),
    on the GPU when the kernels are compiled and on the CPU when they are interpreted.
    """
    check_attention_inputs(q, k, v)
    for name, x in (("query", q), ("key", k), ("value", v)):
        if x.dim() != 4:
            raise ValueError(f"{name} must be 4-D (B, H, T, Dh), got shape {tuple(x.shape)}")
        if x.shape[-2] == 0:
            raise ValueError(f"{name} has length T = 0: there is nothing to attend")
    if q.shape[:2] != k.shape[:2] or k.shape[:2] != v.shape[:2]:
        raise ValueError(f"query, key and value must have the same (B, H), got {tuple(q.shape[:2])}, "
                         f"{tuple(k.shape[:2])}, {tuple(v.shape[:2])} (the kernel does not broadcast)")
    if v.shape[-1] != q.shape[-1]:
        raise ValueError(f"value head size Dv={v.shape[-1]} != query head size Dk={q.shape[-1]}: the kernel "
                         "needs one head size")
    _power_of_two_in(q.shape[-1], HEAD_DIMS, "head size Dh", "the kernel's tiles need a power of two in")
    if q.dtype not in _DTYPES or (INTERPRETED and q.dtype == torch.bfloat16):
        where = "under Triton's interpreter (no GPU)" if INTERPRETED else "on the GPU"
        allowed = ("float32", "float16") if INTERPRETED else tuple(_DTYPES.values())
        raise TypeError(f"dtype {q.dtype} is not supported {where}: use one of {allowed}")
    if INTERPRETED and q.device.type != "cpu":
        raise ValueError(f"the tensors are on {q.device}, but Triton's interpreter runs on the CPU")
    if not INTERPRETED and q.device.type != "cuda":
        raise ValueError(f"the tensors are on {q.device}, but the kernels are compiled for the GPU: move them with "
                         ".cuda()")


def _blocks(block_m, block_n, head_dim: int) -> tuple[int, int]:
    """Tile sizes: small under the interpreter (each program is Python), larger on a GPU (fewer programs)."""
    default_m, default_n = (32, 32) if INTERPRETED else ((128, 64) if head_dim <= 64 else (64, 64))
    why = "a tile needs a power of two in"
    return (_power_of_two_in(default_m if block_m is None else block_m, BLOCK_SIZES, "block_m", why),
            _power_of_two_in(default_n if block_n is None else block_n, BLOCK_SIZES, "block_n", why))


def _launch_options(head_dim: int) -> dict:
    """Warps and software-pipelining stages of a compiled launch (a GPU's business; the interpreter has neither)."""
    return {} if INTERPRETED else {"num_warps": 8 if head_dim > 64 else 4, "num_stages": 3}  # pragma: no cover


def _contiguous_rows(x: torch.Tensor) -> torch.Tensor:
    """The kernels address (B, H, T) by strides but assume the Dh features of a row lie side by side."""
    return x if x.stride(-1) == 1 else x.contiguous()


def _strides(x: torch.Tensor) -> tuple[int, int, int]:
    return x.stride(0), x.stride(1), x.stride(2)


def _precision(dtype: torch.dtype) -> str | None:
    """tl.dot's precision: float32 is multiplied exactly ("ieee"), not in TensorFloat-32 as a GPU would by default;
    None (Triton's default) for 16-bit inputs."""
    return "ieee" if dtype == torch.float32 else None


def flash_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False,
                  block_m: int | None = None, block_n: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the forward kernel: the output (B, H, Tq, Dh) and the log-sum-exp of each row (B, H, Tq), float32.

    q (B, H, Tq, Dh), k and v (B, H, Tk, Dh). ``is_causal``: bottom-right aligned (query i may attend key j iff
    j <= i + Tk - Tq); a row that may attend no key gets output 0 and lse -inf.
    """
    check_flash_inputs(q, k, v)
    q, k, v = (_contiguous_rows(x) for x in (q, k, v))
    bm, bn = _blocks(block_m, block_n, q.shape[-1])
    b, h, t_q, dh = q.shape
    o = torch.empty_like(q)
    lse = torch.empty((b, h, t_q), dtype=torch.float32, device=q.device)
    grid = (triton.cdiv(t_q, bm), b * h)  # one program per (query tile, batch * head)
    _forward_kernel[grid](q, k, v, o, lse, dh**-0.5, t_q, k.shape[2], h, *_strides(q), *_strides(k), *_strides(v),
                          *_strides(o), IS_CAUSAL=bool(is_causal), BLOCK_M=bm, BLOCK_N=bn, HEAD_DIM=dh,
                          PRECISION=_precision(q.dtype), **_launch_options(dh))
    return o, lse


def flash_backward(q, k, v, o, lse, do, is_causal: bool = False, block_m: int | None = None,
                   block_n: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Run the backward kernels: (dQ, dK, dV) from the inputs, the output ``o``, its ``lse`` and the output's
    gradient ``do`` (B, H, Tq, Dh). Three launches: D = rowsum(dO * O), then dK and dV per key tile, then dQ per
    query tile (two kernels rather than one, so that no two programs add into the same rows)."""
    check_flash_inputs(q, k, v)
    q, k, v, o, do = (_contiguous_rows(x) for x in (q, k, v, o, do))
    bm, bn = _blocks(block_m, block_n, q.shape[-1])
    b, h, t_q, dh = q.shape
    t_k = k.shape[2]
    d = torch.empty((b, h, t_q), dtype=torch.float32, device=q.device)
    _backward_d_kernel[(triton.cdiv(t_q, bm), b * h)](o, do, d, t_q, h, *_strides(o), *_strides(do),
                                                       BLOCK_M=bm, HEAD_DIM=dh)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    common = dict(IS_CAUSAL=bool(is_causal), BLOCK_M=bm, BLOCK_N=bn, HEAD_DIM=dh, PRECISION=_precision(q.dtype),
                  **_launch_options(dh))
    args = (dh**-0.5, t_q, t_k, h, *_strides(q), *_strides(k), *_strides(v), *_strides(do))
    _backward_dkdv_kernel[(triton.cdiv(t_k, bn), b * h)](q, k, v, do, lse, d, dk, dv, *args, **common)
    _backward_dq_kernel[(triton.cdiv(t_q, bm), b * h)](q, k, v, do, lse, d, dq, *args, **common)
    return dq, dk, dv


class FlashAttentionFunction(torch.autograd.Function):
    """Autograd's view of the kernels: forward saves q, k, v, the output and the log-sum-exp (never P)."""

    @staticmethod
    def forward(ctx, q, k, v, is_causal, block_m, block_n):
        o, lse = flash_forward(q, k, v, is_causal, block_m, block_n)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.options = (is_causal, block_m, block_n)
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = flash_backward(q, k, v, o, lse, do, *ctx.options)
        return dq, dk, dv, None, None, None


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False,
                    block_m: int | None = None, block_n: int | None = None) -> torch.Tensor:
    """Scaled dot-product attention (B, H, Tq, Dh) by the Triton kernels, differentiable in q, k and v.

    Equal to ``F.scaled_dot_product_attention(q, k, v, is_causal=...)`` up to float rounding when Tq == Tk; for
    Tq != Tk the causal mask is bottom-right aligned, as the course's ``causal_mask``.
    """
    return FlashAttentionFunction.apply(q, k, v, is_causal, block_m, block_n)


def key_tile_kinds(t_q: int, t_k: int, block_m: int, block_n: int, is_causal: bool) -> list[list[int]]:
    """What the forward kernel does with each (query tile, key tile), by the kernel's own bounds: 0 never loaded,
    1 loaded without a mask (before ``full_stop``), 2 loaded with the mask (the diagonal, the ragged end)."""
    kinds = []
    for start_m in range(0, t_q, block_m):
        free, stop = t_k, t_k
        if is_causal:
            free = min(max(start_m + t_k - t_q + 1, 0), t_k)
            stop = min(max(start_m + block_m + t_k - t_q, 0), t_k)
        full_stop = free // block_n * block_n
        kinds.append([0 if start_n >= stop else 1 if start_n < full_stop else 2 for start_n in range(0, t_k, block_n)])
    return kinds


def key_tiles_visited(query_tile: int, t_q: int, t_k: int, block_m: int, block_n: int, is_causal: bool) -> int:
    """How many key tiles the forward program of query tile ``query_tile`` loads."""
    return sum(kind > 0 for kind in key_tile_kinds(t_q, t_k, block_m, block_n, is_causal)[query_tile])


# ------------------------------------------------------------------------------------------------ what the GPU adds


def gpu_benchmark_summary(path) -> list[str]:
    """The lines chapter 16 prints about the GPU: the table of ``benchmarks/bench_triton.py``'s results file
    (``benchmarks/results/bench_triton.json``), with the GPU and the date of the run, or, where no GPU run was
    recorded, a line that says so and how to make one. Nothing here is measured: it only reads the file."""
    import json
    from pathlib import Path

    path = Path(path)
    if not path.exists():
        # lines of at most 79 characters: the book's output column holds 81 (tests/test_browser.py)
        return ["No GPU result yet: no run on a GPU has been recorded. On a Linux machine",
                "with a CUDA GPU run",
                "    python benchmarks/bench_triton.py",
                "which times the kernels against SDPA's flash backend and writes",
                f"{path.name}; this cell reads it."]
    result = json.loads(path.read_text())
    config, table = result["config"], result["table"]
    lines = [f"GPU: {config['gpu']}, {config['date']}, torch {config['torch']}, triton {config['triton']}",
             " | ".join(table["headers"])]
    lines += [" | ".join(str(cell) for cell in row) for row in table["rows"]]
    lines += [f"{target}: {measured} ({verdict})" for target, measured, verdict in result["targets"]]
    return lines
