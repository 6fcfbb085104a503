"""functional.attend: every backend against a float64 NumPy reference written here, against PyTorch's SDPA, and
against each other; score mods (ALiBi, soft-capping, relative bias), sinks, the log-sum-exp, fully masked rows."""

import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from attention_course import functional, numpy_ref
from attention_course.functional import BACKENDS, attend, register, softcap_mod
from attention_course.masks import causal_mask
from attention_course.positions import alibi_mod, bias_mod, relative_bias_mod

ALL = ("eager", "sdpa", "blockwise", "flex")
WITH_LSE = ("eager", "blockwise", "flex")  # sdpa keeps its log-sum-exp inside and refuses


def qkv(b, h, t_q, t_k, d=8, d_v=6, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, h, t_q, d, generator=g, dtype=dtype), torch.randn(b, h, t_k, d, generator=g, dtype=dtype),
            torch.randn(b, h, t_k, d_v, generator=g, dtype=dtype))


def random_mask(b, t_q, t_k, seed=0):
    """(B, 1, Tq, Tk) with the last query of the first example fully masked."""
    mask = torch.rand(b, 1, t_q, t_k, generator=torch.Generator().manual_seed(seed)) < 0.6
    mask[0, 0, -1] = False
    return mask


# ---------------------------------------------------------------- the float64 NumPy reference (independent)


def np_slopes(h):
    n = 2 ** int(np.floor(np.log2(h)))
    return np.array([2.0 ** (-8.0 * (i + 1) / n) for i in range(n)]
                    + [2.0 ** (-8.0 * (i + 1) / (2 * n)) for i in range(0, 2 * n, 2)][: h - n])


def np_offsets(t_q, t_k):
    """(Tq, Tk) key position minus query position, queries the last Tq positions."""
    return np.arange(t_k)[None, :] - (np.arange(t_q)[:, None] + t_k - t_q)


def np_attend(q, k, v, mask=None, *, scale=None, mod=None, sinks=None):
    """(out, weights, lse) in float64 NumPy: scores, mod, mask, a softmax with an optional sink column."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    t_q, t_k = q.shape[-2], k.shape[-2]
    scale = 1 / np.sqrt(q.shape[-1]) if scale is None else scale
    s = q @ np.swapaxes(k, -1, -2) * scale  # (B, H, Tq, Tk)
    if mod is not None:
        kind, arg = mod
        if kind == "alibi":
            s = s - np_slopes(s.shape[1])[:, None, None] * np.abs(np_offsets(t_q, t_k))
        elif kind == "softcap":
            s = arg * np.tanh(s / arg)
        else:  # relative bias: arg (H, 2M + 1)
            reach = (arg.shape[1] - 1) // 2
            s = s + arg[:, np.clip(np_offsets(t_q, t_k), -reach, reach) + reach]
    allowed = np.ones(s.shape, bool) if mask is None else np.broadcast_to(np.asarray(mask), s.shape)
    s = np.where(allowed, s, -np.inf)
    if sinks is not None:
        s = np.concatenate([s, np.broadcast_to(np.asarray(sinks)[:, None, None], (*s.shape[:-1], 1))], -1)
    top = np.max(s, axis=-1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    e = np.exp(s - top)
    total = e.sum(-1, keepdims=True)
    with np.errstate(divide="ignore"):
        lse = (top + np.log(total))[..., 0]
    w = np.where(total > 0, e / np.where(total > 0, total, 1), 0.0)[..., :t_k]
    return w @ v, w, lse


def close(ours, ref, tol=1e-9):
    ours, ref = np.asarray(ours.detach()), np.asarray(ref)
    both_inf = np.isneginf(ours) & np.isneginf(ref)  # an lse of a row that sees nothing: -inf in both
    return np.abs(np.where(both_inf, 0, ours - np.where(both_inf, 0, ref))).max() < tol


def torch_mod(mod, h, t_q, t_k):
    kind, arg = mod
    if kind == "alibi":
        return alibi_mod(h, t_q, t_k)
    if kind == "softcap":
        return softcap_mod(arg)
    return relative_bias_mod(torch.from_numpy(arg), t_q, t_k)


# ---------------------------------------------------------------- every backend, every option


@pytest.mark.parametrize("backend", ALL)
@pytest.mark.parametrize("b, h, t_q, t_k", [(2, 3, 5, 9), (1, 4, 7, 7), (2, 2, 1, 6)])
@pytest.mark.parametrize("is_causal", [False, True])
def test_masked_attention_matches_numpy_and_sdpa(backend, b, h, t_q, t_k, is_causal):
    q, k, v = qkv(b, h, t_q, t_k)
    mask = random_mask(b, t_q, t_k)
    full = mask & causal_mask(t_q, t_k) if is_causal else mask
    out, _ = attend(q, k, v, mask, is_causal=is_causal, backend=backend)
    assert close(out, np_attend(q, k, v, full)[0])
    assert close(out, numpy_ref.scaled_dot_product_attention(q.numpy(), k.numpy(), v.numpy(), full.numpy())[0])
    sdpa = F.scaled_dot_product_attention(q, k, v, attn_mask=full)
    visible = full.any(-1, keepdim=True)
    assert close(torch.where(visible, out, 0), torch.where(visible, sdpa, 0).numpy())
    assert not out.isnan().any() and (out[0, :, -1] == 0).all()  # the fully masked row gives zeros


MODS = [("alibi", None), ("softcap", 1.5),
        ("relative", np.random.default_rng(0).normal(size=(3, 7)))]


@pytest.mark.parametrize("backend", ALL)
@pytest.mark.parametrize("mod", MODS, ids=lambda m: m[0])
def test_score_mods_are_written_once_and_run_on_every_backend(backend, mod):
    b, h, t_q, t_k = 2, 3, 5, 9
    q, k, v = qkv(b, h, t_q, t_k, seed=1)
    mask = random_mask(b, t_q, t_k, seed=1)
    ref, _, _ = np_attend(q, k, v, mask, mod=mod)
    if backend == "sdpa" and mod[0] == "softcap":  # a float mask can only add a bias
        with pytest.raises(ValueError, match="backend 'sdpa'.*score \\+ bias"):
            attend(q, k, v, mask, score_mod=torch_mod(mod, h, t_q, t_k), backend=backend)
        return
    out, _ = attend(q, k, v, mask, score_mod=torch_mod(mod, h, t_q, t_k), backend=backend)
    assert close(out, ref)


def test_sdpa_runs_a_bias_mod_over_the_scores_once():
    """The sdpa backend turns a score + bias mod into a float mask: one pass of the mod over every pair, and a probe
    of its form on one row of queries (ALiBi ran twice over every pair before)."""
    b, h, t_q, t_k = 2, 3, 5, 9
    q, k, v = qkv(b, h, t_q, t_k, seed=2)
    alibi = torch_mod(("alibi", None), h, t_q, t_k)
    pairs = []

    def counted(score, b_idx, h_idx, q_idx, kv_idx):
        pairs.append(score.numel())
        return alibi(score, b_idx, h_idx, q_idx, kv_idx)

    out, _ = attend(q, k, v, score_mod=counted, backend="sdpa")
    assert sorted(pairs) == [b * h * t_k, b * h * t_q * t_k]
    assert close(out, np_attend(q, k, v, None, mod=("alibi", None))[0])


@pytest.mark.parametrize("backend", ALL)
def test_sinks_and_lse_on_every_backend_or_a_clear_refusal(backend):
    b, h, t_q, t_k = 2, 3, 4, 6
    q, k, v = qkv(b, h, t_q, t_k, seed=2)
    mask = random_mask(b, t_q, t_k, seed=2)
    sinks = torch.tensor([0.5, -1.0, 2.0], dtype=torch.float64)
    if backend not in WITH_LSE:
        for options in ({"sinks": sinks}, {"return_lse": True}):
            with pytest.raises(ValueError, match=f"backend '{backend}' gives no log-sum-exp"):
                attend(q, k, v, mask, backend=backend, **options)
        return
    ref_out, _, ref_lse = np_attend(q, k, v, mask, mod=MODS[0], sinks=sinks.numpy())
    out, lse = attend(q, k, v, mask, score_mod=alibi_mod(h, t_q, t_k), sinks=sinks, return_lse=True,
                      backend=backend)
    assert close(out, ref_out) and close(lse, ref_lse)
    _, plain_lse = attend(q, k, v, mask, return_lse=True, backend=backend)
    assert close(plain_lse, np_attend(q, k, v, mask)[2])
    assert torch.isneginf(plain_lse[0, :, -1]).all()  # a row that may attend nothing: lse = -inf, never NaN


def test_eager_weights_with_sinks_sum_to_less_than_one():
    q, k, v = qkv(1, 2, 3, 4, seed=3)
    sinks = torch.tensor([0.0, 3.0], dtype=torch.float64)
    out, weights = attend(q, k, v, sinks=sinks)
    _, ref_w, _ = np_attend(q, k, v, sinks=sinks.numpy())
    assert close(weights, ref_w) and (weights.sum(-1) < 1).all()
    assert close(out, weights @ v)


@pytest.mark.parametrize("backend", ["eager", "blockwise"])
def test_gradients_stay_finite_through_a_fully_masked_row_with_sinks(backend):
    q, k, v = (x.requires_grad_() for x in qkv(1, 2, 3, 4, seed=4))
    mask = torch.ones(3, 4, dtype=torch.bool)
    mask[1] = False
    out, lse = attend(q, k, v, mask, sinks=torch.tensor([0.1, 0.2], dtype=torch.float64), return_lse=True,
                      backend=backend)
    (out.sum() + lse.sum()).backward()
    assert all(torch.isfinite(x.grad).all() for x in (q, k, v))


def test_bias_score_mod_equals_adding_the_bias():
    q, k, v = qkv(2, 3, 4, 5, seed=5)
    bias = torch.randn(3, 4, 5, dtype=torch.float64)
    for backend in ("eager", "sdpa", "blockwise"):
        out, _ = attend(q, k, v, score_mod=bias_mod(bias), backend=backend)
        ref = torch.softmax(q @ k.transpose(-1, -2) / 8 ** 0.5 + bias, -1) @ v
        assert (out - ref).abs().max() < 1e-12, backend


def test_scale_and_dropout():
    q, k, v = qkv(1, 2, 3, 5, seed=6)
    assert close(attend(q, k, v, scale=0.3)[0], np_attend(q, k, v, scale=0.3)[0])
    torch.manual_seed(0)
    out, weights = attend(q, k, v, dropout_p=0.5)
    assert close(out, weights @ v) and ((weights == 0) | (weights > 0)).all() and (weights == 0).any()
    for backend in ("blockwise", "flex"):
        with pytest.raises(ValueError, match=f"backend '{backend}' has no dropout"):
            attend(q, k, v, dropout_p=0.1, backend=backend)


def test_bad_options_are_named():
    q, k, v = qkv(1, 2, 3, 5)
    with pytest.raises(ValueError, match="unknown attention backend 'fast'"):
        attend(q, k, v, backend="fast")
    with pytest.raises(TypeError, match="score_mod must be a function"):
        attend(q, k, v, score_mod=3)
    with pytest.raises(ValueError, match="sinks must be \\(H,\\)"):
        attend(q, k, v, sinks=torch.zeros(3, dtype=torch.float64))
    with pytest.raises(TypeError, match="sinks must be a float tensor"):
        attend(q, k, v, sinks=torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match="scale must be a finite number > 0"):
        attend(q, k, v, scale=0.0)
    with pytest.raises(TypeError, match="mask must be boolean"):
        attend(q, k, v, torch.ones(3, 5))
    with pytest.raises(TypeError, match="scale must be a number"):
        attend(q, k, v, scale="1")
    with pytest.raises(ValueError, match="at most 4 dimensions"):
        attend(*(x[None] for x in (q, k, v)), score_mod=softcap_mod(2.0))
    with pytest.raises(ValueError, match="score_mod returned shape \\(1, 2, 3, 5\\)"):  # two heads' biases, one head
        attend(q[0, 0], k[0, 0], v[0, 0], score_mod=lambda score, b, h, q_idx, kv_idx: score + torch.zeros(2, 1, 1))


def test_a_planted_wrong_backend_fails_the_comparison():
    """A backend that forgets the scale is registered like any other; the reference catches it."""

    def unscaled(q, k, v, mask, *, is_causal, scale, score_mod, dropout_p, need_lse):
        return functional.eager_backend(q, k, v, mask, is_causal=is_causal, scale=1.0, score_mod=score_mod,
                                        dropout_p=dropout_p, need_lse=need_lse)

    register("planted", unscaled)
    try:
        q, k, v = qkv(2, 3, 5, 9)
        mask = random_mask(2, 5, 9)
        assert not close(attend(q, k, v, mask, backend="planted")[0], np_attend(q, k, v, mask)[0])
    finally:
        del BACKENDS["planted"]


def test_importing_functional_imports_neither_flex_nor_blockwise():
    code = ("import sys, attention_course.functional; "
            "assert not any(m in sys.modules for m in ('attention_course.flex', 'attention_course.blockwise', "
            "'torch.nn.attention.flex_attention')), 'imported too early'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_modules_name_their_backend_when_built():
    from attention_course import MultiHeadAttention

    with pytest.raises(ValueError, match="unknown attention backend 'fused'"):
        MultiHeadAttention(8, 2, backend="fused")
    with pytest.raises(TypeError, match="backend must be a string"):
        MultiHeadAttention(8, 2, backend=True)
    with pytest.raises(TypeError, match="register\\(name, fn\\)"):
        register("broken", None)
    module = MultiHeadAttention(8, 2, backend="blockwise").double().eval()
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    eager = MultiHeadAttention(8, 2).double().eval()
    eager.load_state_dict(module.state_dict())
    assert (module(x, is_causal=True) - eager(x, is_causal=True)).abs().max() < 1e-12


# ---------------------------------------------------------------- chapter 16's kernel as the backend "triton"


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("t_q,t_k", [(5, 5), (3, 9), (6, 3)])  # (6, 3) causal: the first 3 queries see no key
def test_triton_backend_equals_eager_with_lse_sinks_and_gradients(is_causal, t_q, t_k):
    """GQA-expanded keys (one key head viewed four times), Dv != Dk, a scale, sinks and the lse: outputs and all
    three gradients (through the lse too) equal the eager backend's in float32."""
    q, k, v = qkv(2, 4, t_q, t_k, d=16, d_v=8, seed=t_q + t_k, dtype=torch.float32)
    k = k[:, :1].expand(2, 4, t_k, 16)
    sinks = torch.randn(4, generator=torch.Generator().manual_seed(1))
    weight = torch.arange(2 * 4 * t_q * 8).reshape(2, 4, t_q, 8).sin()
    results = []
    for backend in ("eager", "triton"):
        x = [t.clone().requires_grad_() for t in (q, k, v)]
        out, lse = attend(*x, is_causal=is_causal, scale=0.3, sinks=sinks, return_lse=True, backend=backend)
        ((out * weight).sum() + torch.where(lse.isfinite(), lse, 0).sin().sum()).backward()
        results.append([out, lse] + [t.grad for t in x])
    for ours, eager in zip(results[1], results[0], strict=True):
        assert torch.isfinite(ours).any() and not ours.isnan().any()
        torch.testing.assert_close(ours, eager, atol=2e-5, rtol=1e-4)


def test_triton_backend_without_lse_equals_sdpa():
    q, k, v = qkv(1, 2, 7, 7, d=16, d_v=16, dtype=torch.float32)
    out, extra = attend(q, k, v, is_causal=True, backend="triton")
    assert extra is None
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=True), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("options,named", [
    (dict(mask=torch.ones(4, 4, dtype=torch.bool)), "boolean mask"),
    (dict(score_mod=softcap_mod(5.0)), "score_mod"),
    (dict(dropout_p=0.1), "dropout"),
])
def test_triton_backend_refuses_what_the_kernel_cannot_do(options, named):
    q, k, v = qkv(1, 2, 4, 4, d=16, d_v=16, dtype=torch.float32)
    mask = options.pop("mask", None)
    with pytest.raises(ValueError, match=f"backend 'triton' does not take .*{named}"):
        attend(q, k, v, mask, backend="triton", **options)


# ---------------------------------------------------------------- grouped-query keys and values (issue 41)


def grouped(b, h, h_kv, t_q, t_k, seed=0):
    """q (B, H, Tq, D) and k, v (B, H_kv, Tk, D) with the NumPy reference's inputs: each kv head repeated in a row.
    (Equal key and value sizes: torch's CPU flash kernel reads grouped heads in place; its math fallback copies.)"""
    q, _, _ = qkv(b, h, t_q, t_k, seed=seed, d_v=8)
    _, k, v = qkv(b, h_kv, t_q, t_k, seed=seed + 1, d_v=8)
    return q, k, v, k.repeat_interleave(h // h_kv, 1), v.repeat_interleave(h // h_kv, 1)


@pytest.mark.parametrize("backend", ALL)
@pytest.mark.parametrize("h, h_kv", [(4, 1), (4, 2), (6, 3), (4, 4)])
@pytest.mark.parametrize("is_causal", [False, True])
def test_grouped_keys_and_values_on_every_backend_match_numpy(backend, h, h_kv, is_causal):
    b, t_q, t_k = 2, 5, 9
    q, k, v, k_rep, v_rep = grouped(b, h, h_kv, t_q, t_k)
    mask = random_mask(b, t_q, t_k)
    full = mask & causal_mask(t_q, t_k) if is_causal else mask
    mod = alibi_mod(h, t_q, t_k)
    out, _ = functional._attend(q, k, v, mask, is_causal=is_causal, score_mod=mod, backend=backend)
    assert out.shape == (b, h, t_q, 8)
    assert close(out, np_attend(q, k_rep, v_rep, full, mod=("alibi", None))[0])


def test_sdpa_reads_grouped_heads_without_copies_and_equals_the_expanded_path(monkeypatch):
    from torch.profiler import profile

    copies = []
    expand = functional.expand_kv
    monkeypatch.setattr(functional, "expand_kv", lambda x, n: copies.append(n) or expand(x, n))
    q, k, v, k_rep, v_rep = grouped(2, 8, 2, 7, 11, seed=3)
    mask = random_mask(2, 7, 11, seed=3)
    with profile() as prof:
        out, _ = functional._attend(q, k, v, mask, is_causal=True, score_mod=alibi_mod(8, 7, 11), backend="sdpa")
    ops = {e.name for e in prof.events()}
    assert copies == [] and not ops & {"aten::repeat_interleave", "aten::repeat"}  # expand_kv not called
    assert "aten::_scaled_dot_product_flash_attention_for_cpu" in ops  # not the math fallback, which repeats
    old, _ = functional._attend(q, k_rep, v_rep, mask, is_causal=True, score_mod=alibi_mod(8, 7, 11), backend="sdpa")
    assert close(out, old.numpy(), tol=1e-12)
    functional._attend(q, k, v, mask, backend="eager")  # the eager math needs one key head per query head
    assert copies == [4, 4]
    torch.manual_seed(0)
    dropped, _ = functional._attend(q, k, v, mask, dropout_p=0.5, backend="sdpa")
    torch.manual_seed(0)
    dropped_old, _ = functional._attend(q, k_rep, v_rep, mask, dropout_p=0.5, backend="sdpa")
    assert close(dropped, dropped_old.numpy(), tol=1e-12)


@pytest.mark.parametrize("h_kv", [1, 2])
def test_a_gqa_layer_on_sdpa_copies_no_heads_and_equals_eager(monkeypatch, h_kv):
    from attention_course.gpt import GPT, GPTConfig
    from attention_course.kv_cache import KVCache

    copies = []
    expand = functional.expand_kv
    monkeypatch.setattr(functional, "expand_kv", lambda x, n: copies.append(n) or expand(x, n))
    config = GPTConfig(vocab_size=50, d_model=32, num_heads=4, num_kv_heads=h_kv, num_layers=2, positions="rope")
    ids = torch.randint(0, 50, (2, 9), generator=torch.Generator().manual_seed(0))
    logits = {}
    for backend in ("sdpa", "eager"):
        model = GPT(GPTConfig(**{**config.__dict__, "backend": backend}), seed=0).double().eval()
        cache = KVCache(model.num_layers)
        with torch.no_grad():
            logits[backend] = torch.cat([model(ids[:, :6], cache=cache), model(ids[:, 6:], cache=cache)], 1)
        if backend == "sdpa":
            assert copies == []
    # eager: k and v of 2 layers, prefill and decode; one key/value head broadcasts without a copy
    assert copies == ([] if h_kv == 1 else [4 // h_kv] * 8)
    assert close(logits["sdpa"], logits["eager"].numpy(), tol=1e-10)
