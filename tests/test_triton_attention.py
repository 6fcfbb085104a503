"""Chapter 16's FlashAttention in Triton, run under Triton's interpreter (no GPU here): outputs and gradients
against SDPA in float64 and against chapter 9's blockwise attention, on shapes drawn at test time from seeded
generators; the PyTorch reference of the backward; the errors for what the kernels do not support."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

# the course's module first: it chooses the interpreter before Triton is imported (Linux-only wheels: else skip)
ft = pytest.importorskip("attention_course.flash_triton", reason="Triton has wheels for Linux only")

from attention_course import flash_reference  # noqa: E402
from attention_course.blockwise import blockwise_attention  # noqa: E402
from attention_course.masks import causal_mask  # noqa: E402

ATOL = 3e-5  # float32 kernels against a float64 reference, sums of up to ~100 terms


def draw(seed: int, head_dim: int, same_length: bool, t_max: int = 50):
    """(q, k, v, dO) float64 (B, H, T, Dh) of a shape drawn from ``seed``: B, H in 1..2, T in 1..t_max."""
    rng = np.random.default_rng(seed)
    b, h = (int(x) for x in rng.integers(1, 3, size=2))
    t_q = int(rng.integers(1, t_max + 1))
    t_k = t_q if same_length else int(rng.integers(1, t_max + 1))
    g = torch.Generator().manual_seed(seed)
    q, do = (torch.randn(b, h, t_q, head_dim, generator=g, dtype=torch.float64) for _ in range(2))
    k, v = (torch.randn(b, h, t_k, head_dim, generator=g, dtype=torch.float64) for _ in range(2))
    return q, k, v, do


def sdpa_reference(q, k, v, do, is_causal):
    """float64 SDPA (bottom-right causal mask, fully masked rows -> 0) and its gradients by autograd."""
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    mask = causal_mask(q.shape[-2], k.shape[-2]) if is_causal else None
    out = F.scaled_dot_product_attention(*leaves, attn_mask=mask).nan_to_num(0.0)
    out.backward(do)
    return out.detach(), [x.grad for x in leaves]


def flash(q, k, v, do, is_causal, **blocks):
    """Our kernels on float32 copies: the output and the gradients of q, k, v."""
    leaves = [x.float().requires_grad_() for x in (q, k, v)]
    out = ft.flash_attention(*leaves, is_causal=is_causal, **blocks)
    out.backward(do.float())
    return out.detach().double(), [x.grad.double() for x in leaves]


def assert_close(ours, ref, what):
    assert ours.shape == ref.shape, what
    assert torch.isfinite(ours).all(), f"{what}: not finite"
    diff = (ours - ref).abs().max().item() if ref.numel() else 0.0
    assert diff < ATOL, f"{what}: max |ours - ref| = {diff:.2e}"


@pytest.mark.parametrize("head_dim", [16, 32, 64])
@pytest.mark.parametrize("is_causal", [False, True])
def test_outputs_and_gradients_equal_sdpa(head_dim, is_causal):
    seed = 1000 * head_dim + is_causal
    q, k, v, do = draw(seed, head_dim, same_length=is_causal)  # causal self-attention, cross-attention
    out, grads = flash(q, k, v, do, is_causal, block_m=16, block_n=16)
    ref_out, ref_grads = sdpa_reference(q, k, v, do, is_causal)
    assert_close(out, ref_out, f"output, shapes {tuple(q.shape)} {tuple(k.shape)}")
    for name, ours, ref in zip("qkv", grads, ref_grads, strict=True):
        assert_close(ours, ref, f"d{name}, shapes {tuple(q.shape)} {tuple(k.shape)}")


@pytest.mark.parametrize(("t_q", "t_k", "blocks"), [(37, 21, (16, 32)), (21, 37, (32, 16)), (40, 40, (32, 32))])
def test_causal_bottom_right_with_other_tiles(t_q, t_k, blocks):
    """Tq != Tk (bottom-right, as chapter 4's causal_mask), BLOCK_M != BLOCK_N; with Tq > Tk the first rows may
    attend no key: output 0 and zero gradients, never NaN."""
    g = torch.Generator().manual_seed(t_q * t_k)
    q, do = (torch.randn(1, 2, t_q, 32, generator=g, dtype=torch.float64) for _ in range(2))
    k, v = (torch.randn(1, 2, t_k, 32, generator=g, dtype=torch.float64) for _ in range(2))
    out, grads = flash(q, k, v, do, True, block_m=blocks[0], block_n=blocks[1])
    ref_out, ref_grads = sdpa_reference(q, k, v, do, True)
    assert_close(out, ref_out, "output")
    for name, ours, ref in zip("qkv", grads, ref_grads, strict=True):
        assert_close(ours, ref, f"d{name}")
    if t_q > t_k:
        blind = t_q - t_k  # rows 0 .. blind - 1 see nothing
        assert out[..., :blind, :].abs().max() == 0 and grads[0][..., :blind, :].abs().max() == 0


@pytest.mark.parametrize(("t_q", "t_k"), [(1, 1), (1, 19)])
@pytest.mark.parametrize("is_causal", [False, True])
def test_single_query(t_q, t_k, is_causal):
    """T = 1, and one query against a longer past (a decoding step: causal lets it see every key)."""
    g = torch.Generator().manual_seed(t_k)
    q, do = (torch.randn(2, 1, t_q, 16, generator=g, dtype=torch.float64) for _ in range(2))
    k, v = (torch.randn(2, 1, t_k, 16, generator=g, dtype=torch.float64) for _ in range(2))
    out, grads = flash(q, k, v, do, is_causal)
    ref_out, ref_grads = sdpa_reference(q, k, v, do, is_causal)
    assert_close(out, ref_out, "output")
    for name, ours, ref in zip("qkv", grads, ref_grads, strict=True):
        assert_close(ours, ref, f"d{name}")


@pytest.mark.parametrize("is_causal", [False, True])
def test_forward_equals_chapter_9_blockwise_and_lse(is_causal):
    q, k, v, _ = draw(7 + is_causal, 32, same_length=False, t_max=45)
    out, lse = ft.flash_forward(q.float(), k.float(), v.float(), is_causal, block_m=16, block_n=16)
    ref = blockwise_attention(q, k, v, is_causal=is_causal, block_size=16)
    assert_close(out.double(), ref, "output against blockwise_attention")
    _, ref_lse = flash_reference.forward_with_lse(q, k, v, is_causal)
    seen = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), seen)
    assert_close(lse.double()[seen], ref_lse[seen], "log-sum-exp")


@pytest.mark.parametrize("is_causal", [False, True])
def test_pytorch_reference_backward_equals_autograd(is_causal):
    """flash_reference: P rebuilt from the log-sum-exp, D = rowsum(dO * O), exact in float64."""
    q, k, v, do = draw(11 + is_causal, 8, same_length=False)
    out, lse = flash_reference.forward_with_lse(q, k, v, is_causal)
    ref_out, ref_grads = sdpa_reference(q, k, v, do, is_causal)
    torch.testing.assert_close(out, ref_out, atol=1e-12, rtol=0)
    for ours, ref in zip(flash_reference.backward(q, k, v, out, lse, do, is_causal), ref_grads, strict=True):
        torch.testing.assert_close(ours, ref, atol=1e-12, rtol=0)


def test_triton_backward_equals_pytorch_reference():
    q, k, v, do = draw(13, 16, same_length=False, t_max=40)
    o, lse = flash_reference.forward_with_lse(q, k, v, True)
    ours = ft.flash_backward(*(x.float() for x in (q, k, v, o)), lse.float(), do.float(), True, 16, 16)
    for name, a, b in zip("qkv", ours, flash_reference.backward(q, k, v, o, lse, do, True), strict=True):
        assert_close(a.double(), b, f"d{name}")


def test_float16_and_strided_inputs():
    """float16 in, float16 out (within float16's rounding); q, k, v as transposed views of (B, T, H, Dh)."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(3, 2, 29, 2, 16, generator=g)  # (q|k|v, B, T, H, Dh)
    q, k, v = (t.transpose(1, 2) for t in x)  # (B, H, T, Dh) views, not contiguous
    out = ft.flash_attention(q, k, v, is_causal=True)
    ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True)
    assert (out.double() - ref).abs().max() < ATOL
    half = ft.flash_attention(q.half(), k.half(), v.half(), is_causal=True)
    assert half.dtype == torch.float16 and (half.double() - ref).abs().max() < 5e-3


def test_key_tiles_visited_counts_tiles_with_a_visible_key():
    """The forward's stopping point against a brute-force count from the mask."""
    for t_q, t_k, bm, bn in [(100, 100, 16, 16), (50, 70, 32, 16), (70, 50, 16, 32), (64, 64, 32, 32)]:
        visible = causal_mask(t_q, t_k)
        for tile in range(-(-t_q // bm)):
            cols = visible[tile * bm:(tile + 1) * bm].any(0).nonzero()
            needed = 0 if cols.numel() == 0 else int(cols.max()) // bn + 1
            assert ft.key_tiles_visited(tile, t_q, t_k, bm, bn, True) == needed
        assert ft.key_tiles_visited(0, t_q, t_k, bm, bn, False) == -(-t_k // bn)
        for tile, kinds in enumerate(ft.key_tile_kinds(t_q, t_k, bm, bn, True)):  # no mask: every pair visible
            rows = visible[tile * bm:(tile + 1) * bm]
            for j, kind in enumerate(kinds):
                block = rows[:, j * bn:(j + 1) * bn]
                assert kind != 1 or (block.all() and block.shape[1] == bn)


def qkv(shape=(1, 2, 8, 16), dtype=torch.float32):
    return tuple(torch.zeros(shape, dtype=dtype) for _ in range(3))


@pytest.mark.parametrize(("args", "kwargs", "error", "words"), [
    (qkv((1, 2, 8, 48)), {}, ValueError, "head size Dh=48"),
    (qkv((1, 2, 8, 8)), {}, ValueError, "head size Dh=8"),
    (qkv((1, 2, 8, 256)), {}, ValueError, "head size Dh=256"),
    (qkv(dtype=torch.bfloat16), {}, TypeError, "torch.bfloat16 is not supported under Triton's interpreter"),
    (qkv(dtype=torch.float64), {}, TypeError, "torch.float64 is not supported"),
    (qkv(dtype=torch.int64), {}, TypeError, "query must be a floating-point tensor"),
    (qkv((2, 8, 16)), {}, ValueError, "query must be 4-D (B, H, T, Dh)"),
    (qkv((1, 2, 0, 16)), {}, ValueError, "length T = 0"),
    ((torch.zeros(1, 2, 8, 16), torch.zeros(1, 1, 8, 16), torch.zeros(1, 1, 8, 16)), {}, ValueError,
     "the same (B, H)"),
    ((torch.zeros(1, 2, 8, 16), torch.zeros(1, 2, 8, 16), torch.zeros(1, 2, 8, 32)), {}, ValueError,
     "value head size Dv=32 != query head size Dk=16"),
    (qkv(), {"block_m": 24}, ValueError, "block_m=24 is not supported"),
    (qkv(), {"block_n": 8}, ValueError, "block_n=8 is not supported"),
    (qkv(), {"block_m": 16.0}, TypeError, "block_m must be an int"),
])
def test_clear_errors(args, kwargs, error, words):
    with pytest.raises(error) as info:
        ft.flash_attention(*args, **kwargs)
    assert words in str(info.value)


def test_interpreter_is_chosen_in_one_place_and_triton_imported_only_there():
    """Importing the package or its checks imports no Triton; importing flash_triton without a GPU sets
    TRITON_INTERPRET=1, and the kernels run even when Triton was imported before, in the compiling mode (as
    torch.compile does)."""
    code = ("import os, sys, torch\n"
            "import attention_course, attention_course.checks\n"
            "assert 'triton' not in sys.modules, 'the package imported triton'\n"
            "import triton.language\n"
            "from attention_course import flash_triton\n"
            "q = torch.randn(1, 1, 5, 16)\n"
            "out = flash_triton.flash_attention(q, q, q)\n"
            "ok = (out - torch.nn.functional.scaled_dot_product_attention(q, q, q)).abs().max() < 1e-5\n"
            "print(os.environ.get('TRITON_INTERPRET'), flash_triton.INTERPRETED, bool(ok))\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["CUDA_VISIBLE_DEVICES"] = ""
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["1", "True", "True"]


def test_gpu_summary_reads_the_benchmark_file_or_says_there_is_none(tmp_path):
    missing = ft.gpu_benchmark_summary(tmp_path / "bench_triton.json")
    assert missing[0].startswith("No GPU result yet") and "python benchmarks/bench_triton.py" in missing[2]
    assert max(map(len, missing)) <= 79  # printed in chapter 16: fits the book's output column
    path = tmp_path / "bench_triton.json"
    path.write_text('{"config": {"gpu": "GPU X", "date": "2026-01-01 00:00", "torch": "2.13", "triton": "3.9.0"}, '
                    '"table": {"headers": ["dtype", "fwd ratio"], "rows": [["bf16", "0.91"]]}, '
                    '"targets": [["forward >= 0.7x SDPA flash", "0.91", "PASS"]]}')
    assert ft.gpu_benchmark_summary(path) == ["GPU: GPU X, 2026-01-01 00:00, torch 2.13, triton 3.9.0",
                                              "dtype | fwd ratio", "bf16 | 0.91",
                                              "forward >= 0.7x SDPA flash: 0.91 (PASS)"]


def test_benchmark_without_a_gpu_says_so_and_exits_0():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONPATH=os.pathsep.join(
        [os.path.join(root, "benchmarks"), os.environ.get("PYTHONPATH", "")]))
    run = subprocess.run([sys.executable, os.path.join(root, "benchmarks", "bench_triton.py")], env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and "needs a CUDA GPU" in run.stdout


def test_first_kernel_softmax_rows_and_its_source():
    from attention_course.display import source_markdown

    x = torch.randn(7, 10, generator=torch.Generator().manual_seed(5)) * 10  # 10 columns in a block of 16
    torch.testing.assert_close(ft.softmax_rows(x), torch.softmax(x, -1), atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="float32 \\(N, C\\)"):
        ft.softmax_rows(x.double())
    assert source_markdown(ft._forward_kernel).startswith("```python\n@triton.jit\ndef _forward_kernel(")


def test_the_graders_sandbox_runs_triton_interpreted():
    """The worker sees no GPU; whatever a submission imports first, its kernels run under the interpreter."""
    from attention_course.course import sandbox

    env = sandbox._environment(sandbox.Limits(), "/tmp")
    assert env["TRITON_INTERPRET"] == "1" and env["CUDA_VISIBLE_DEVICES"] == ""
