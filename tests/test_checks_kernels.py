"""Chapter 16's checks (attention_course.checks.kernels): right kernels pass, with tiles of 16 and 32; planted
mistakes, written as the Triton kernels a student would write, get their codes, and so do answers that are no kernel
(PyTorch, NumPy, autograd, the library's kernel, a log-sum-exp computed outside the kernel). Runs under Triton's
interpreter (tests/test_checks_planted.py runs the tables)."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

# the course's module first: it chooses Triton's interpreter before Triton is imported (Linux-only wheels: else skip)
pytest.importorskip("attention_course.flash_triton", reason="Triton has wheels for Linux only")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from attention_course import checks  # noqa: E402
from attention_course.checks import hidden  # noqa: E402
from attention_course.checks.questions import QUESTIONS  # noqa: E402

# ---------------------------------------------------------------------------------------------------- the kernels


@triton.jit
def _step(s, v, m, l, acc, MISTAKE: tl.constexpr):
    """The online step, right or with MISTAKE; a row that has seen no key yet uses 0 as its maximum."""
    m_new = tl.maximum(m, tl.max(s, 1))
    if MISTAKE == "no-max":  # exp(s) itself: overflows at large scores
        m_new = tl.zeros_like(m)
    elif MISTAKE == "max-frozen":  # the first tile's maximum, kept
        m_new = tl.where(m == float("-inf"), tl.max(s, 1), m)
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp(m - m_safe)
    p = tl.exp(s - m_safe[:, None])
    if MISTAKE == "sum-not-rescaled":
        l = l + tl.sum(p, 1)
    elif MISTAKE == "nothing-rescaled":
        l = l + tl.sum(p, 1)
        alpha = alpha * 0.0 + 1.0
    else:
        l = l * alpha + tl.sum(p, 1)
    if MISTAKE == "acc-not-rescaled":
        acc = acc + tl.dot(p, v)
    else:
        acc = acc * alpha[:, None] + tl.dot(p, v)
    return m_new, l, acc


@triton.jit
def _forward(Q, K, V, O, LSE, T_Q, T_K, scale, D: tl.constexpr, BLOCK: tl.constexpr, CAUSAL: tl.constexpr,
             GUARD: tl.constexpr, MISTAKE: tl.constexpr):
    """One head, one program per query tile; the tile loop of the exercises (Tq != Tk: exercise 6, causal
    bottom-right; GUARD: rows that see no key give 0, not NaN), right or with MISTAKE."""
    start_m = tl.program_id(0) * BLOCK
    rows = start_m + tl.arange(0, BLOCK)
    feats = tl.arange(0, D)
    q = tl.load(Q + rows[:, None] * D + feats[None, :], mask=rows[:, None] < T_Q, other=0.0)
    m = tl.full([BLOCK], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK], tl.float32)
    acc = tl.zeros([BLOCK, D], tl.float32)
    offset = T_K - T_Q
    if MISTAKE == "top-left":
        offset = 0
    below = T_K // BLOCK * BLOCK
    stop = T_K
    if CAUSAL:
        below = tl.minimum(tl.maximum(start_m + offset + 1, 0), T_K) // BLOCK * BLOCK
        stop = tl.minimum(tl.maximum(start_m + BLOCK + offset, 0), T_K)
        if MISTAKE == "diagonal-unmasked":
            below = stop
        if MISTAKE == "diagonal-skipped":
            stop = below
        if MISTAKE == "no-causal-mask":
            below = T_K
            stop = T_K
        if MISTAKE == "stops-late":  # one masked tile too many: the output is right
            stop = tl.minimum(stop + BLOCK, T_K)
        if MISTAKE == "never-stops":  # every later tile, masked: the output is right
            stop = T_K
    for start in range(0, below, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        k = tl.load(K + cols[:, None] * D + feats[None, :])
        v = tl.load(V + cols[:, None] * D + feats[None, :])
        m, l, acc = _step(tl.dot(q, tl.trans(k)) * scale, v, m, l, acc, MISTAKE)
    for start in range(below, stop, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        k = tl.load(K + cols[:, None] * D + feats[None, :], mask=cols[:, None] < T_K, other=0.0)
        v = tl.load(V + cols[:, None] * D + feats[None, :], mask=cols[:, None] < T_K, other=0.0)
        s = tl.dot(q, tl.trans(k)) * scale
        if MISTAKE != "ragged-unmasked":
            s = tl.where(cols[None, :] < T_K, s, float("-inf"))
        if CAUSAL:
            s = tl.where(cols[None, :] <= rows[:, None] + offset, s, float("-inf"))
        m, l, acc = _step(s, v, m, l, acc, MISTAKE)
    seen = l > 0.0
    if MISTAKE == "not-normalized":
        out = acc
    elif GUARD:
        out = acc / tl.where(seen, l, 1.0)[:, None]
    else:
        out = acc / l[:, None]
    tl.store(O + rows[:, None] * D + feats[None, :], out, mask=rows[:, None] < T_Q)
    if MISTAKE == "lse-without-max":
        lse = tl.log(l)
    elif MISTAKE == "lse-without-sum":
        lse = m
    elif MISTAKE == "lse-through-exp":  # right until exp(m) overflows
        lse = tl.log(l * tl.exp(m))
    else:
        lse = tl.where(seen, m + tl.log(tl.where(seen, l, 1.0)), float("-inf"))
    if MISTAKE != "lse-not-stored":
        tl.store(LSE + rows, lse, mask=rows < T_Q)


def triton_forward(q, k, v, causal=False, mistake="", block=16, with_lse=False, guard=False):
    out, lse = torch.empty_like(q), torch.empty(len(q))
    _forward[(triton.cdiv(len(q), block),)](q, k, v, out, lse, len(q), len(k), q.shape[1] ** -0.5, D=q.shape[1],
                                            BLOCK=block, CAUSAL=causal, GUARD=guard, MISTAKE=mistake)
    return (out, lse) if with_lse else out


def triton_flash(q, k, v, is_causal, mistake="", block=16, guard=True):
    """Exercise 6's launcher: (out, lse) for Tq != Tk."""
    return triton_forward(q, k, v, is_causal, mistake, block, with_lse=True, guard=guard)


@triton.jit
def _dk(Q, K, V, DO, LSE, DELTA, DK, T, scale, D: tl.constexpr, BLOCK: tl.constexpr, MISTAKE: tl.constexpr):
    cols = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    feats = tl.arange(0, D)
    k = tl.load(K + cols[:, None] * D + feats[None, :], mask=cols[:, None] < T, other=0.0)
    v = tl.load(V + cols[:, None] * D + feats[None, :], mask=cols[:, None] < T, other=0.0)
    dk = tl.zeros([BLOCK, D], tl.float32)
    for start in range(0, T, BLOCK):
        rows = start + tl.arange(0, BLOCK)
        q = tl.load(Q + rows[:, None] * D + feats[None, :], mask=rows[:, None] < T, other=0.0)
        do = tl.load(DO + rows[:, None] * D + feats[None, :], mask=rows[:, None] < T, other=0.0)
        lse = tl.load(LSE + rows, mask=rows < T, other=0.0)
        d = tl.load(DELTA + rows, mask=rows < T, other=0.0)
        inside = (cols[:, None] < T) & (rows[None, :] < T)
        p_t = tl.where(inside, tl.exp(tl.dot(k, tl.trans(q)) * scale - lse[None, :]), 0.0)
        dp_t = tl.dot(v, tl.trans(do))
        if MISTAKE == "ds-without-d":
            ds_t = p_t * dp_t
        elif MISTAKE == "ds-sign":
            ds_t = p_t * (d[None, :] - dp_t)
        else:
            ds_t = p_t * (dp_t - d[None, :])
        if MISTAKE == "dk-missing-scale":
            dk += tl.dot(ds_t, q)
        else:
            dk += tl.dot(ds_t, q) * scale
    tl.store(DK + cols[:, None] * D + feats[None, :], dk, mask=cols[:, None] < T)


def triton_dk(q, k, v, o, lse, do, mistake="", block=16):
    t, d = q.shape
    dk = torch.empty_like(k)
    _dk[(triton.cdiv(t, block),)](q, k, v, do, lse, (do * o).sum(-1), dk, t, d**-0.5, D=d, BLOCK=block,
                                  MISTAKE=mistake)
    return dk


# ---------------------------------------------------------------------------------------------------- other styles


def torch_forward(q, k, v, causal=False):
    s = q @ k.T / q.shape[-1] ** 0.5
    if causal:
        s = s.masked_fill(~torch.ones(len(q), len(k), dtype=torch.bool).tril(), float("-inf"))
    return torch.softmax(s, -1) @ v


def torch_forward_with_lse(q, k, v):
    s = q @ k.T / q.shape[-1] ** 0.5
    return torch.softmax(s, -1) @ v, torch.logsumexp(s, -1)


def torch_dk(q, k, v, o, lse, do):
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    torch_forward(*leaves).backward(do)
    return leaves[1].grad


def named(fn, name, **kwargs):
    out = functools.partial(fn, **kwargs)
    out.__name__ = name
    return out


attention_forward = named(triton_forward, "attention_forward")
attention_forward_32 = named(triton_forward, "attention_forward_32", block=32)
causal_forward = named(triton_forward, "causal_forward", causal=True)
forward_with_lse = named(triton_forward, "forward_with_lse", with_lse=True)
attention_dk = named(triton_dk, "attention_dk")

def library_forward(q, k, v, causal=False):
    """The course's own kernel on one head: no kernel written."""
    from attention_course import flash_triton

    return flash_triton.flash_attention(q[None, None], k[None, None], v[None, None], is_causal=causal)[0, 0]


def library_forward_with_lse(q, k, v):
    from attention_course import flash_triton

    out, lse = flash_triton.flash_forward(q[None, None], k[None, None], v[None, None])
    return out[0, 0], lse[0, 0]


def numpy_lse(q, k, is_causal=False):
    """The log-sum-exp of each row, by NumPy (out of PyTorch's sight), causal bottom-right: what a launcher can
    compute besides its kernel."""
    s = q.numpy().astype(np.float64) @ k.numpy().T.astype(np.float64) / q.shape[-1] ** 0.5
    if is_causal:
        s = np.where(np.arange(len(k))[None, :] <= np.arange(len(q))[:, None] + len(k) - len(q), s, -np.inf)
    with np.errstate(divide="ignore"):
        return torch.from_numpy(np.logaddexp.reduce(s, axis=1).astype(np.float32))


def kernel_then_numpy_lse(q, k, v):
    """The kernel's output; the log-sum-exp computed after the launch, in NumPy."""
    return triton_forward(q, k, v), numpy_lse(q, k)


def kernel_lse_overwritten(q, k, v):
    """The kernel stores a wrong log-sum-exp (its m), which the launcher overwrites in place after the launch."""
    out, lse = triton_forward(q, k, v, mistake="lse-without-sum", with_lse=True)
    return out, lse.copy_(numpy_lse(q, k))


def lse_before_launch(q, k, v, is_causal=False):
    """The log-sum-exp computed before the launch into the buffer the kernel is given, which never stores it."""
    out, lse = torch.empty_like(q), numpy_lse(q, k, is_causal)
    _forward[(triton.cdiv(len(q), 16),)](q, k, v, out, lse, len(q), len(k), q.shape[1] ** -0.5, D=q.shape[1],
                                         BLOCK=16, CAUSAL=is_causal, GUARD=True, MISTAKE="lse-not-stored")
    return out, lse


def _f64(*tensors):
    return [t.numpy().astype(np.float64) for t in tensors]


def numpy_forward(q, k, v, causal=False):
    """No kernel: attention in NumPy (out of the score counter's sight), causal bottom-right."""
    qq, kk, vv = _f64(q, k, v)
    s = qq @ kk.T / q.shape[-1] ** 0.5
    if causal:
        s = np.where(np.arange(len(k))[None, :] <= np.arange(len(q))[:, None] + len(k) - len(q), s, -np.inf)
    p = np.exp(s - s.max(axis=1, keepdims=True))
    return torch.from_numpy(p / p.sum(axis=1, keepdims=True) @ vv).float()


def numpy_dk(q, k, v, o, lse, do):
    """No kernel: dK in NumPy."""
    qq, kk, vv, dd = _f64(q, k, v, do)
    s = qq @ kk.T / q.shape[-1] ** 0.5
    p = np.exp(s - s.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    dp = dd @ vv.T
    return torch.from_numpy((p * (dp - (dp * p).sum(axis=1, keepdims=True))).T @ qq / q.shape[-1] ** 0.5).float()


def kernel_then_torch_lse(q, k, v):
    """The kernel's output, but the log-sum-exp computed outside the kernel, by PyTorch."""
    return triton_forward(q, k, v), torch.logsumexp(q @ k.T / q.shape[-1] ** 0.5, -1)


attention_forward = named(triton_forward, "attention_forward")
attention_forward_32 = named(triton_forward, "attention_forward_32", block=32)
causal_forward = named(triton_forward, "causal_forward", causal=True)
causal_forward_32 = named(triton_forward, "causal_forward_32", causal=True, block=32)
forward_with_lse = named(triton_forward, "forward_with_lse", with_lse=True)
attention_dk = named(triton_dk, "attention_dk")

CORRECT = [
    (checks.check_tile_loop, attention_forward),
    (checks.check_tile_loop, attention_forward_32),
    (checks.check_causal_tiles, causal_forward),
    (checks.check_causal_tiles, causal_forward_32),
    (checks.check_lse, forward_with_lse),
    (checks.check_lse, named(lambda q, k, v: [x.clone().double() for x in forward_with_lse(q, k, v)], "as_copies")),
    (checks.check_dk, attention_dk),
    (checks.check_flash_forward, named(triton_flash, "flash_forward")),
    (checks.check_flash_forward, named(triton_flash, "flash_forward_32", block=32)),
]


def wrong(fn, mistake, **kwargs):
    return named(fn, mistake.replace("-", "_"), mistake=mistake, **kwargs)


PLANTED = [
    (checks.check_tile_loop, wrong(triton_forward, "sum-not-rescaled"), "sum-not-rescaled"),
    (checks.check_tile_loop, wrong(triton_forward, "sum-not-rescaled", block=32), "sum-not-rescaled"),
    (checks.check_tile_loop, wrong(triton_forward, "acc-not-rescaled"), "stream-not-rescaled"),
    (checks.check_tile_loop, wrong(triton_forward, "nothing-rescaled"), "stream-not-rescaled"),
    (checks.check_tile_loop, wrong(triton_forward, "ragged-unmasked"), "ragged-tile-unmasked"),
    (checks.check_tile_loop, wrong(triton_forward, "not-normalized"), "weights-not-normalized"),
    (checks.check_tile_loop, wrong(triton_forward, "no-max"), "scores-overflow"),
    (checks.check_tile_loop, wrong(triton_forward, "max-frozen"), "scores-overflow"),
    (checks.check_tile_loop, torch_forward, "kernel-not-written"),
    (checks.check_tile_loop, named(library_forward, "library_forward"), "kernel-not-written"),
    (checks.check_tile_loop, numpy_forward, "kernel-not-written"),  # NumPy: no score counted
    (checks.check_causal_tiles, wrong(triton_forward, "diagonal-unmasked", causal=True),
     "causal-bound-off-by-one-tile"),
    (checks.check_causal_tiles, wrong(triton_forward, "diagonal-skipped", causal=True),
     "causal-bound-off-by-one-tile"),
    (checks.check_causal_tiles, wrong(triton_forward, "no-causal-mask", causal=True), "mask-ignored"),
    (checks.check_causal_tiles, wrong(triton_forward, "stops-late", causal=True), "causal-tiles-not-skipped"),
    (checks.check_causal_tiles, wrong(triton_forward, "never-stops", causal=True), "causal-tiles-not-skipped"),
    (checks.check_causal_tiles, wrong(triton_forward, "never-stops", causal=True, block=32),
     "causal-tiles-not-skipped"),
    (checks.check_causal_tiles, wrong(triton_forward, "no-max", causal=True), "scores-overflow"),
    (checks.check_causal_tiles, named(torch_forward, "torch_causal", causal=True), "kernel-not-written"),
    (checks.check_causal_tiles, named(library_forward, "library_causal", causal=True), "kernel-not-written"),
    (checks.check_lse, wrong(triton_forward, "lse-without-max", with_lse=True), "lse-without-max"),
    (checks.check_lse, wrong(triton_forward, "lse-without-sum", with_lse=True), "lse-without-sum"),
    (checks.check_lse, wrong(triton_forward, "sum-not-rescaled", with_lse=True), "sum-not-rescaled"),
    (checks.check_lse, wrong(triton_forward, "lse-through-exp", with_lse=True), "lse-overflows"),
    (checks.check_lse, named(lambda q, k, v: triton_forward(q, k, v), "out_only"), "wrong-type"),
    (checks.check_lse, torch_forward_with_lse, "kernel-not-written"),
    (checks.check_lse, kernel_then_torch_lse, "kernel-not-written"),
    (checks.check_lse, named(library_forward_with_lse, "library_with_lse"), "kernel-not-written"),
    (checks.check_lse, kernel_then_numpy_lse, "lse-not-stored"),
    (checks.check_lse, kernel_lse_overwritten, "lse-not-stored"),
    (checks.check_lse, lse_before_launch, "lse-not-stored"),
    (checks.check_dk, wrong(triton_dk, "ds-without-d"), "ds-without-d"),
    (checks.check_dk, wrong(triton_dk, "dk-missing-scale"), "dk-missing-scale"),
    (checks.check_dk, wrong(triton_dk, "ds-sign"), "wrong-output"),
    (checks.check_dk, torch_dk, "kernel-not-written"),
    (checks.check_dk, numpy_dk, "kernel-not-written"),
    (checks.check_lse, named(lambda q, k, v: (numpy_forward(q, k, v), triton_forward(q, k, v, with_lse=True)[1]),
                             "numpy_out"), "kernel-not-written"),
    (checks.check_flash_forward, named(lambda q, k, v, is_causal: (numpy_forward(q, k, v, is_causal),
                                                                   triton_flash(q, k, v, is_causal)[1]),
                                       "numpy_flash_out"), "kernel-not-written"),
    (checks.check_flash_forward, wrong(triton_flash, "top-left"), "causal-top-left-aligned"),
    (checks.check_flash_forward, named(triton_flash, "no_guard", guard=False), "nan-on-masked-row"),
    (checks.check_flash_forward, wrong(triton_flash, "never-stops"), "causal-tiles-not-skipped"),
    (checks.check_flash_forward, named(lambda q, k, v, is_causal: (torch_forward(q, k, v), None), "no_lse"),
     "kernel-not-written"),
    (checks.check_flash_forward, named(lambda q, k, v, is_causal: library_forward_with_lse(q, k, v), "library"),
     "kernel-not-written"),
    (checks.check_flash_forward, named(lambda q, k, v, is_causal: (triton_flash(q, k, v, is_causal)[0],
                                                                   numpy_lse(q, k, is_causal)), "numpy_lse"),
     "lse-not-stored"),
    (checks.check_flash_forward, named(lse_before_launch, "lse_before_launch"), "lse-not-stored"),
]


# ---------------------------------------------------------------------------------------------------- more


@pytest.mark.parametrize("seed", [0, 5])
def test_right_kernels_pass_the_hidden_cases(seed, capsys):
    with hidden.drawn_from(seed):
        checks.check_tile_loop(attention_forward)
        checks.check_causal_tiles(causal_forward)
    out = capsys.readouterr().out
    assert out.count("✓ ") == 2 and "6 random cases" in out and "6 random cases (causal" in out


def test_a_kernel_not_written_yet_is_not_implemented():
    """The exercise's stub raises inside the kernel; Triton's interpreter wraps it, the check unwraps it."""

    @triton.jit
    def stub(X):
        raise NotImplementedError("Exercise 2: The tile loop")

    def attention(q, k, v):
        stub[(1,)](q)

    with pytest.raises(checks.CheckFailed) as info:
        checks.check_tile_loop(attention)
    assert str(info.value).startswith("[not-implemented] Exercise 2: The tile loop: replace")


def test_tiles_visited_question_is_what_the_kernel_loads():
    from attention_course import tiles

    question = QUESTIONS["16.tiles-visited"]
    assert question.answer() == tiles.key_tiles_visited(7, 1000, 1000, 64, 64, True) == 8
