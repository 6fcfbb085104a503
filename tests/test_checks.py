"""The exercise checker: correct code passes with one line, every mistake gets exactly its diagnosis code,
and any student code (raising, looping, returning junk, mutating inputs) gets a clear message."""

import functools
import math
import re
import signal
import threading
import time

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import attention_course as ac
from attention_course import bug_zoo, checks, kv_cache, mistakes, numpy_ref
from attention_course.checks import diagnosis, runner
from attention_course.checks import modules as check_modules

# ---------------------------------------------------------------------------------------------------------------
# Correct implementations, written here from scratch
# ---------------------------------------------------------------------------------------------------------------


def sdpa_scratch(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    return weights @ v, weights


def sdpa_torch_builtin(q, k, v, mask=None):
    """PyTorch's fused SDPA wrapped to the contract: output only, fully masked rows -> 0."""
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    if mask is None:
        return out
    return torch.where(mask.any(-1, keepdim=True), out, 0.0)


def attention_numpy(q, k, v, mask=None):
    return numpy_ref.scaled_dot_product_attention(q, k, v, mask)


def attention_numpy_output_only(q, k, v, mask=None):
    return numpy_ref.scaled_dot_product_attention(q, k, v, mask)[0]


def softmax_np(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def attend_loop(query, keys, values):
    scores = np.array([query @ key / math.sqrt(len(query)) for key in keys])
    weights = softmax_np(scores)
    return sum(w * v for w, v in zip(weights, values, strict=True)), weights


def stream(q, k, v, form="lse", rescale="right", overflow=False, normalize=True):
    """Chapter 9's stream over the keys of one query, right or with one of the known mistakes: ``form`` "lse"
    (running log-sum-exp and output) or "max" (running maximum, sum and accumulator)."""
    ref, total, out = -np.inf, 0.0, np.zeros(v.shape[-1])
    for k_j, v_j in zip(k, v, strict=True):
        s = float(q @ k_j) / math.sqrt(len(q))
        if form == "lse":
            new = np.log(np.exp(ref) + np.exp(s)) if overflow else np.logaddexp(ref, s)
        else:
            new = max(ref, s)
        with np.errstate(all="ignore"):
            factor = {"right": np.exp(ref - new), "none": 1.0, "inverted": np.exp(new - ref)}[rescale]
            factor = 0.0 if ref == -np.inf else factor
            p = np.exp(s - new)
        total, out, ref = total * factor + p, out * factor + p * v_j, new
    return out / total if form == "max" and normalize else out


def stream_max(q, k, v):
    """The chapter's form: running maximum, sum and accumulator, divided at the end."""
    return stream(q, k, v, form="max")


def causal_numpy(t_q, t_k=None):
    t_k = t_q if t_k is None else t_k
    return np.arange(t_k)[None, :] <= np.arange(t_q)[:, None] + (t_k - t_q)


def padding_numpy(lengths, t):
    return numpy_ref.padding_mask(lengths, t)


def sdpa_without_signature(q, k, v, mask=None):
    return sdpa_scratch(q, k, v, mask)


sdpa_without_signature.__signature__ = "not a signature"  # inspect.signature() fails: treated as (q, k, v, mask)


def kv_cache_bytes(num_layers, num_kv_heads, head_dim, seq_len, batch_size=1, bytes_per_element=2):
    """Through the library's per-token size."""
    dtype = {1: torch.int8, 2: torch.float16, 4: torch.float32, 8: torch.float64}[bytes_per_element]
    return kv_cache.cache_bytes_per_token(num_layers, num_kv_heads, head_dim, dtype) * seq_len * batch_size


def gqa_library(q, k, v, mask=None):
    n_rep = q.shape[1] // k.shape[1]
    return ac.scaled_dot_product_attention(q, kv_cache.repeat_kv(k, n_rep), kv_cache.repeat_kv(v, n_rep), mask)


def gqa_torch_builtin(q, k, v, mask=None):
    """PyTorch's SDPA with enable_gqa (no copies of the key/value heads); output only, fully masked rows -> 0."""
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    return out if mask is None else torch.where(mask.any(-1, keepdim=True), out, 0.0)


def gqa_grouped_queries(q, k, v, mask=None):
    """No repetition at all: the queries of each group are stacked against their one key/value head."""
    b, h, tq, dk = q.shape
    h_kv = k.shape[1]
    qg = q.reshape(b, h_kv, h // h_kv, tq, dk)  # query head h -> group h // n_rep
    m = None if mask is None else mask.expand(b, h, tq, k.shape[2]).reshape(b, h_kv, h // h_kv, tq, -1)
    out, weights = ac.scaled_dot_product_attention(qg, k[:, :, None], v[:, :, None], m)
    return out.reshape(b, h, tq, -1), weights.reshape(b, h, tq, -1)


def parameter_count(d_model, num_heads, bias=True):
    return 4 * d_model * d_model + (4 * d_model if bias else 0)


class ScratchSingleHead(nn.Module):
    """Biases on by default, output and weights returned, key/value defaults: still the contract."""

    def __init__(self, d_in, d_out, bias=True, dropout=0.0):
        super().__init__()
        self.w_q, self.w_k, self.w_v = (nn.Linear(d_in, d_out, bias=bias) for _ in range(3))
        self.drop = nn.Dropout(dropout)

    def forward(self, query, key=None, value=None, mask=None):
        key = query if key is None else key
        value = key if value is None else value
        out, weights = sdpa_scratch(self.w_q(query), self.w_k(key), self.w_v(value), mask)
        return out, self.drop(weights)


class LoadableSingleHead(nn.Module):
    """Projections as plain x @ W + b parameters, loaded through load_numpy_params."""

    def __init__(self, d_in, d_out, dropout=0.0):
        super().__init__()
        self.p = nn.ParameterDict({f"{w}_{n}": nn.Parameter(torch.zeros((d_in, d_out) if w == "w" else (d_out,)))
                                   for n in "qkv" for w in "wb"})

    def load_numpy_params(self, params):
        with torch.no_grad():
            for name, tensor in self.p.items():
                tensor.copy_(torch.as_tensor(params[name]))

    def forward(self, query, key=None, value=None, mask=None):
        key = query if key is None else key
        value = key if value is None else value
        q, k, v = (x @ self.p[f"w_{n}"] + self.p[f"b_{n}"] for x, n in ((query, "q"), (key, "k"), (value, "v")))
        return ac.scaled_dot_product_attention(q, k, v, mask)[0]


class LoadableSingleHeadTransposed(LoadableSingleHead):
    """Its loader reads the (d_in, d_out) matrices as nn.Linear's (d_out, d_in): only square ones load."""

    def load_numpy_params(self, params):
        super().load_numpy_params({name: a.T for name, a in params.items()})


class ScratchMHA(nn.Module):
    def __init__(self, d_model, num_heads, dropout=0.0):
        super().__init__()
        self.h = num_heads
        self.w_q, self.w_k, self.w_v, self.w_o = (nn.Linear(d_model, d_model, bias=False) for _ in range(4))
        self.drop = nn.Dropout(dropout)

    def forward(self, query, key, value, mask=None):
        q, k, v = (ac.split_heads(w(x), self.h) for w, x in ((self.w_q, query), (self.w_k, key), (self.w_v, value)))
        out, weights = sdpa_scratch(q, k, v, mask)
        return self.w_o(ac.merge_heads(out)), weights


@pytest.mark.parametrize(
    "check, impl",
    [
        (checks.check_scaled_dot_product_attention, sdpa_scratch),
        (checks.check_scaled_dot_product_attention, ac.scaled_dot_product_attention),
        (checks.check_scaled_dot_product_attention, sdpa_torch_builtin),
        (checks.check_scaled_dot_product_attention, ac.sdpa_fast),
        (checks.check_numpy_attention, attention_numpy),
        (checks.check_numpy_attention, attention_numpy_output_only),
        (checks.check_attention_one_query, attend_loop),
        (checks.check_attention_one_query, stream),
        (checks.check_streaming_attention, stream),
        (checks.check_streaming_attention, stream_max),
        (checks.check_streaming_attention, attend_loop),
        (checks.check_softmax, softmax_np),
        (checks.check_softmax, numpy_ref.softmax),
        (checks.check_causal_mask, causal_numpy),
        (checks.check_causal_mask, ac.causal_mask),
        (checks.check_padding_mask, ac.padding_mask),
        (checks.check_split_heads, ac.split_heads),
        (checks.check_merge_heads, ac.merge_heads),
        (checks.check_multi_head_attention, ac.MultiHeadAttention),
        (checks.check_multi_head_attention, ScratchMHA),
        (checks.check_einsum_attention, ac.EinsumMultiHeadAttention),
        (checks.check_einsum_attention, ac.multi_head_attention_loop),
        (checks.check_einsum_attention, sdpa_scratch),
        (checks.check_einsum_attention, sdpa_without_signature),
        (checks.check_parameter_count, parameter_count),
        (checks.check_single_head_attention, ac.SingleHeadAttention),
        (checks.check_single_head_attention, bug_zoo.ZooSingleHeadAttention),
        (checks.check_single_head_attention, ScratchSingleHead),
        (checks.check_single_head_attention, LoadableSingleHead),
        (checks.check_kv_cache_bytes, kv_cache_bytes),
        (checks.check_repeat_kv, kv_cache.repeat_kv),
        (checks.check_repeat_kv, lambda x, n_rep: x.repeat_interleave(n_rep, dim=1)),
        (checks.check_grouped_query_attention, gqa_library),
        (checks.check_grouped_query_attention, gqa_torch_builtin),
        (checks.check_grouped_query_attention, gqa_grouped_queries),
    ],
    ids=lambda x: getattr(x, "__name__", str(x)),
)
def test_correct_implementations_pass_with_one_line(check, impl, capsys):
    check(impl)
    out = capsys.readouterr().out
    assert out.startswith("✓ ") and out.count("\n") == 1, out


def test_dropout_test_can_be_skipped(capsys):
    checks.check_multi_head_attention(MHANoDropoutArgument, test_dropout=False)
    assert capsys.readouterr().out.endswith("match the reference\n")


def test_candidates_that_do_not_apply_are_skipped():
    def not_applicable():
        raise ValueError("shapes do not fit")

    out = np.zeros(3)
    with pytest.raises(checks.CheckFailed, match=r"^\[missing-scale\]"):
        diagnosis.diagnose(out, None, [("wrong-scale", "", not_applicable), ("missing-scale", "", lambda: (out, None))],
                         "case", np.ones(3), None)


def test_numpy_variants_of_the_checks(capsys):
    checks.check_numpy_attention(attention_numpy, fully_masked_rows=True)
    checks.check_padding_mask(padding_numpy, framework="numpy")
    checks.check_scaled_dot_product_attention(sdpa_scratch, fully_masked_rows=False)
    lines = capsys.readouterr().out.splitlines()
    assert "fully masked rows" in lines[0] and "fully masked rows" not in lines[2]


def test_success_line_says_what_was_verified(capsys):
    checks.check_scaled_dot_product_attention(ac.scaled_dot_product_attention)
    assert capsys.readouterr().out == (
        "✓ scaled_dot_product_attention: 24 random cases (Tq != Tk, masks, batch dims, fully masked rows) "
        "match the reference\n"
    )


def test_success_line_names_the_students_function(capsys):
    """The student's function or class by its name; lambdas and partials by the name the contract gives it."""
    checks.check_scaled_dot_product_attention(sdpa_scratch)
    checks.check_scaled_dot_product_attention(lambda q, k, v, mask=None: sdpa_scratch(q, k, v, mask))
    checks.check_numpy_attention(attention_numpy_output_only)
    checks.check_numpy_attention(functools.partial(attention_numpy))
    checks.check_attention_one_query(attend_loop)
    checks.check_softmax(softmax_np)
    checks.check_causal_mask(causal_numpy)
    checks.check_padding_mask(lambda lengths, t: ac.padding_mask(lengths, t))
    checks.check_split_heads(ac.split_heads)
    checks.check_merge_heads(lambda x: ac.merge_heads(x))
    checks.check_parameter_count(parameter_count)
    checks.check_single_head_attention(ScratchSingleHead, test_dropout=False)
    names = [line.split(":")[0] for line in capsys.readouterr().out.splitlines()]
    assert names == ["✓ sdpa_scratch", "✓ scaled_dot_product_attention", "✓ attention_numpy_output_only",
                     "✓ attention (NumPy)", "✓ attend_loop", "✓ softmax_np", "✓ causal_numpy", "✓ padding_mask",
                     "✓ split_heads", "✓ merge_heads", "✓ parameter_count",
                     "✓ ScratchSingleHead"]


def test_single_head_success_line(capsys):
    checks.check_single_head_attention(ac.SingleHeadAttention)
    assert capsys.readouterr().out == (
        "✓ SingleHeadAttention: 18 cases (3 sizes, d_in != d_out too; self- and cross-attention, Tq != Tk, masks) "
        "match the reference; dropout is off in eval mode\n"
    )


# ---------------------------------------------------------------------------------------------------------------
# Mistakes beyond the zoo (test_bug_zoo.py runs the zoo), and robustness
# ---------------------------------------------------------------------------------------------------------------


def sdpa_not_implemented(q, k, v, mask=None):
    raise NotImplementedError("Exercise 3: scaled dot-product attention")


def sdpa_raises(q, k, v, mask=None):
    return q @ k  # (.., Tq, Dk) @ (.., Tk, Dk): shapes do not match


def sdpa_requires_mask(q, k, v, mask=None):
    scores = (q @ k.transpose(-2, -1)).masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, -1) @ v


def sdpa_returns_none(q, k, v, mask=None):
    sdpa_scratch(q, k, v, mask)


def sdpa_returns_string(q, k, v, mask=None):
    return "attention"


def sdpa_returns_triple(q, k, v, mask=None):
    return (*sdpa_scratch(q, k, v, mask), None)


def sdpa_returns_nan(q, k, v, mask=None):
    out, _ = sdpa_scratch(q, k, v, mask)
    return out * float("nan")


def sdpa_mutates_q(q, k, v, mask=None):
    q /= math.sqrt(q.shape[-1])  # in place!
    scores = q @ k.transpose(-2, -1)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    return weights @ v, weights


def sdpa_returns_scores_shape(q, k, v, mask=None):
    return q @ k.transpose(-2, -1)


def sdpa_off_a_bit(q, k, v, mask=None):
    out, weights = sdpa_scratch(q, k, v, mask)
    return out + 0.01, weights


def sdpa_wrong_weights(q, k, v, mask=None):
    out, weights = sdpa_scratch(q, k, v, mask)
    return out, weights * 2


def sdpa_weights_unmasked(q, k, v, mask=None):
    out, _ = sdpa_scratch(q, k, v, mask)
    return out, sdpa_scratch(q, k, v, None)[1]  # output right, but returns the weights before masking


def sdpa_weights_wrong_shape(q, k, v, mask=None):
    out, weights = sdpa_scratch(q, k, v, mask)
    return out, weights[..., 0]


def sdpa_forever(q, k, v, mask=None):
    while True:
        pass


def sdpa_sleeps_forever(q, k, v, mask=None):
    while True:  # sleeps, so an abandoned thread running it costs no CPU
        time.sleep(0.01)


def softmax_axis0(x):
    e = np.exp(x - x.max(axis=0, keepdims=True))
    return e / e.sum(axis=0, keepdims=True)


def softmax_exp_only(x):
    return np.exp(x - x.max(axis=-1, keepdims=True))


def softmax_returns_list(x):
    return [float(v) for v in softmax_np(np.atleast_1d(x)).ravel()]


def causal_float(t_q, t_k=None):
    return torch.ones(t_q, t_q if t_k is None else t_k).tril(diagonal=(t_k or t_q) - t_q)


def causal_square_only(t_q, t_k=None):
    return np.tril(np.ones((t_q, t_q), dtype=bool))


def split_forgot_reshape(x, num_heads):
    return x


def mha_scale_by_d_model(d_model, num_heads, dropout=0.0):
    return bug_zoo.MHAScaleByDModel(d_model, num_heads, dropout)


class MHANoLinears(nn.Module):
    def __init__(self, d_model, num_heads, dropout=0.0):
        super().__init__()
        self.qkv = nn.Linear(d_model, 3 * d_model)

    def forward(self, query, key, value, mask=None):
        return query


class MHAWrongLinearShape(bug_zoo.ZooMultiHeadAttention):
    def __init__(self, d_model, num_heads, dropout=0.0):
        super().__init__(d_model, num_heads, dropout)
        self.w_q = nn.Linear(d_model, d_model // num_heads)


class MHANoDropoutArgument(bug_zoo.ZooMultiHeadAttention):
    def __init__(self, d_model, num_heads):
        super().__init__(d_model, num_heads)


class MHANoWo(bug_zoo.MHAMissingOutputProjection):
    def __init__(self, d_model, num_heads, dropout=0.0):
        super().__init__(d_model, num_heads, dropout)
        del self.w_o


class MHANoWoLoadable(MHANoLinears):
    loaded = None

    def load_numpy_params(self, params):
        self.loaded = params


class NotAModule:
    def __init__(self, d_model, num_heads, dropout=0.0):
        pass


class MHADropoutWrongWhenOff(bug_zoo.ZooMultiHeadAttention):
    """Deterministic in eval mode, but scales by 1 / (1 - p) as if dropout were on."""

    def attend(self, q, k, v, mask):
        return super().attend(q, k, v, mask) / (1 - self.p)


def mha_loop_missing_out_proj(query, key, value, params, num_heads, mask=None):
    out = ac.multi_head_attention_loop(query, key, value, params, num_heads, mask)
    out = out[0] if isinstance(out, tuple) else out
    return (out - params["b_o"]) @ torch.linalg.pinv(params["w_o"])


def count_without_w_o(d_model, num_heads, bias=True):
    return 3 * d_model * d_model + (3 * d_model if bias else 0)


def count_ignores_bias_flag(d_model, num_heads, bias=True):
    return 4 * d_model * d_model + 4 * d_model


def count_per_head(d_model, num_heads, bias=True):
    return num_heads * 4 * d_model * d_model + (4 * d_model if bias else 0)


def count_wrong(d_model, num_heads, bias=True):
    return 7


class SHAScaleBySeqLen(bug_zoo.ZooSingleHeadAttention):
    def scores(self, q, k):
        return q @ k.transpose(-2, -1) / k.size(-2)


class SHANoDefaults(bug_zoo.ZooSingleHeadAttention):
    def forward(self, query, key, value, mask=None):  # key and value required: self-attention module(x) fails
        return super().forward(query, key, value, mask)


class SHAAlwaysSelf(bug_zoo.ZooSingleHeadAttention):
    def forward(self, query, key=None, value=None, mask=None):
        return super().forward(query, query, query, mask)


class SHANoWv(bug_zoo.ZooSingleHeadAttention):
    def __init__(self, d_in, d_out, bias=False, dropout=0.0):
        super().__init__(d_in, d_out, bias, dropout)
        self.w_v = None


class SHAWrongLinearShape(bug_zoo.ZooSingleHeadAttention):
    def __init__(self, d_in, d_out, bias=False, dropout=0.0):
        super().__init__(d_in, d_out, bias, dropout)
        self.w_k = nn.Linear(d_out, d_in, bias=bias)


class SHANaNOnMaskedRow(bug_zoo.ZooSingleHeadAttention):
    def attend(self, scores, v, mask):
        weights = torch.softmax(scores if mask is None else scores.masked_fill(~mask, float("-inf")), dim=-1)
        return weights @ v, weights


def mha_reads_kv_transposed(query, key, value, params, num_heads, mask=None):
    """Chapter 5's colleague: w_k and w_v read as (d_out, d_in), nn.Linear's layout; right for w_q and w_o."""
    p = dict(params, w_k=params["w_k"].T, w_v=params["w_v"].T)  # only runs when kdim == vdim == d_model
    return ac.multi_head_attention_loop(query, key, value, p, num_heads, mask)


def mha_square_only(query, key, value, params, num_heads, mask=None):
    """Right with square weights; assumes every W is (d_model, d_model)."""
    d = query.shape[-1]
    p = {name: w.reshape(d, d) if name.startswith("w_") else w for name, w in params.items()}
    return ac.multi_head_attention_loop(query, key, value, p, num_heads, mask)


class MHAIgnoresKdim(bug_zoo.ZooMultiHeadAttention):
    """Accepts kdim and vdim, but builds w_k and w_v as d_model -> d_model anyway."""

    def __init__(self, d_model, num_heads, dropout=0.0, kdim=None, vdim=None):
        super().__init__(d_model, num_heads, dropout)


class MHAKdimSquareOnly(ac.MultiHeadAttention):
    """Builds w_k and w_v for kdim and vdim, but its forward insists on keys and values of width d_model."""

    def forward(self, query, key=None, value=None, mask=None):
        if key.shape[-1] != self.d_model or value.shape[-1] != self.d_model:
            raise ValueError(f"key and value must have {self.d_model} features")
        return super().forward(query, key, value, mask)


class LoadableMHALinearLayout(nn.Module):
    """Stores nn.Linear-style (d_out, d_in) weights and computes F.linear, but its loader copies the dict's
    (d_in, d_out) matrices without transposing them."""

    def __init__(self, d_model, num_heads, dropout=0.0):
        super().__init__()
        self.h = num_heads
        self.weight = nn.ParameterDict({n: nn.Parameter(torch.zeros(d_model, d_model)) for n in "qkvo"})
        self.bias = nn.ParameterDict({n: nn.Parameter(torch.zeros(d_model)) for n in "qkvo"})

    def load_numpy_params(self, params):
        with torch.no_grad():
            for n in "qkvo":
                self.weight[n].copy_(torch.as_tensor(params[f"w_{n}"]))  # should be params[...].T
                self.bias[n].copy_(torch.as_tensor(params[f"b_{n}"]))

    def forward(self, query, key, value, mask=None):
        q, k, v = (ac.split_heads(F.linear(x, self.weight[n], self.bias[n]), self.h)
                   for x, n in ((query, "q"), (key, "k"), (value, "v")))
        out, weights = ac.scaled_dot_product_attention(q, k, v, mask)
        return F.linear(ac.merge_heads(out), self.weight["o"], self.bias["o"]), weights


def kv_bytes_per_token(num_layers, num_kv_heads, head_dim, seq_len, batch_size=1, bytes_per_element=2):
    return 2 * num_layers * num_kv_heads * head_dim * bytes_per_element * batch_size  # seq_len left out


def kv_bytes_no_defaults(num_layers, num_kv_heads, head_dim, seq_len, batch_size, bytes_per_element):
    return kv_cache_bytes(num_layers, num_kv_heads, head_dim, seq_len, batch_size, bytes_per_element)


def kv_bytes_not_implemented(num_layers, num_kv_heads, head_dim, seq_len, batch_size=1, bytes_per_element=2):
    raise NotImplementedError("Exercise 1: How big is the cache?")


def gqa_without_repeat(q, k, v, mask=None):
    """Runs for H_kv = H and, by broadcasting, for H_kv = 1; fails in between."""
    return ac.scaled_dot_product_attention(q, k, v, mask)


def gqa_with(sdpa, q, k, v, mask=None):
    n_rep = q.shape[1] // k.shape[1]
    return sdpa(q, k.repeat_interleave(n_rep, dim=1), v.repeat_interleave(n_rep, dim=1), mask)


def gqa_returns_kv_heads(q, k, v, mask=None):
    """Averages each group's query heads: (B, H_kv, Tq, Dv)."""
    out = gqa_library(q, k, v, mask)[0]
    return out.reshape(out.shape[0], k.shape[1], -1, *out.shape[2:]).mean(2)


CASES = [
    # (check, implementation, expected code)
    (checks.check_scaled_dot_product_attention, sdpa_not_implemented, "not-implemented"),
    (checks.check_scaled_dot_product_attention, sdpa_raises, "raised-exception"),
    (checks.check_scaled_dot_product_attention, sdpa_requires_mask, "raised-exception"),
    (checks.check_scaled_dot_product_attention, sdpa_returns_none, "returned-none"),
    (checks.check_scaled_dot_product_attention, sdpa_returns_string, "wrong-type"),
    (checks.check_scaled_dot_product_attention, sdpa_returns_triple, "wrong-type"),
    (checks.check_scaled_dot_product_attention, sdpa_returns_nan, "nan-output"),
    (checks.check_scaled_dot_product_attention, sdpa_mutates_q, "mutates-input"),
    (checks.check_scaled_dot_product_attention, lambda q, k, v, mask=None: sdpa_scratch(q.unsqueeze_(0), k, v, mask),
     "mutates-input"),  # in-place change of shape
    (checks.check_scaled_dot_product_attention, sdpa_returns_scores_shape, "wrong-shape"),
    (checks.check_scaled_dot_product_attention, sdpa_weights_wrong_shape, "wrong-shape"),
    (checks.check_scaled_dot_product_attention, sdpa_off_a_bit, "wrong-output"),
    (checks.check_scaled_dot_product_attention, sdpa_wrong_weights, "wrong-output"),
    (checks.check_scaled_dot_product_attention, sdpa_weights_unmasked, "mask-ignored"),
    (checks.check_numpy_attention, bug_zoo.sdpa_missing_scale, "raised-exception"),  # torch code, NumPy inputs
    (checks.check_softmax, softmax_axis0, "softmax-wrong-axis"),
    (checks.check_softmax, softmax_exp_only, "weights-not-normalized"),
    (checks.check_softmax, lambda x: softmax_np(x) + 0.5, "wrong-output"),
    (checks.check_softmax, lambda x: "softmax", "wrong-type"),
    (checks.check_softmax, softmax_returns_list, "wrong-shape"),  # a list is fine, but not a flattened one
    (checks.check_attention_one_query, lambda q, k, v: attend_loop(q, k, k), "values-from-keys"),
    (checks.check_streaming_attention, functools.partial(stream, rescale="none"), "stream-not-rescaled"),
    (checks.check_streaming_attention, functools.partial(stream, rescale="inverted"), "stream-not-rescaled"),
    (checks.check_streaming_attention, functools.partial(stream, form="max", rescale="none"), "stream-not-rescaled"),
    (checks.check_streaming_attention, functools.partial(stream, form="max", normalize=False),
     "weights-not-normalized"),
    (checks.check_streaming_attention, functools.partial(stream, overflow=True), "softmax-overflow"),
    (checks.check_streaming_attention, lambda q, k, v: stream(q * math.sqrt(len(q)), k, v), "missing-scale"),
    (checks.check_streaming_attention, lambda q, k, v: stream(q, k, k), "values-from-keys"),
    (checks.check_causal_mask, causal_float, "wrong-type"),
    (checks.check_causal_mask, causal_square_only, "wrong-shape"),
    (checks.check_causal_mask, lambda t_q, t_k=None: ac.causal_mask(t_q, t_k)[None], "wrong-shape"),
    (checks.check_padding_mask, lambda lengths, t: ~ac.padding_mask(lengths, t), "mask-inverted"),
    (checks.check_padding_mask, lambda lengths, t: ac.padding_mask(lengths, t).float(), "wrong-type"),
    (checks.check_padding_mask, lambda lengths, t: torch.ones(2, 7, dtype=torch.bool), "wrong-shape"),
    (checks.check_split_heads, split_forgot_reshape, "wrong-shape"),
    (checks.check_merge_heads, lambda x: x.permute(0, 2, 3, 1).reshape(x.shape[0], x.shape[2], -1),
     "merge-heads-wrong-order"),
    (checks.check_multi_head_attention, mha_scale_by_d_model, "wrong-scale"),
    (checks.check_multi_head_attention, MHANoLinears, "missing-attribute"),
    (checks.check_multi_head_attention, MHAWrongLinearShape, "wrong-shape"),
    (checks.check_multi_head_attention, MHANoDropoutArgument, "raised-exception"),
    (checks.check_multi_head_attention, MHANoWo, "missing-output-projection"),
    (checks.check_multi_head_attention, MHANoWoLoadable, "wrong-output"),
    (checks.check_multi_head_attention, NotAModule, "wrong-type"),
    (checks.check_multi_head_attention, MHADropoutWrongWhenOff, "dropout-in-eval"),
    (checks.check_einsum_attention, bug_zoo.MHASplitWithoutTranspose, "heads-split-without-transpose"),
    (checks.check_einsum_attention, mha_loop_missing_out_proj, "missing-output-projection"),
    (checks.check_einsum_attention, bug_zoo.sdpa_mask_inverted, "mask-inverted"),
    (checks.check_einsum_attention, mha_reads_kv_transposed, "weight-layout-transposed"),
    (checks.check_einsum_attention, mha_square_only, "raised-exception"),
    (checks.check_multi_head_attention, MHAIgnoresKdim, "wrong-shape"),
    (checks.check_multi_head_attention, MHAKdimSquareOnly, "raised-exception"),
    (checks.check_multi_head_attention, LoadableMHALinearLayout, "weight-layout-transposed"),
    (checks.check_parameter_count, count_without_w_o, "missing-output-projection"),
    (checks.check_parameter_count, count_ignores_bias_flag, "wrong-value"),
    (checks.check_parameter_count, count_per_head, "wrong-value"),
    (checks.check_parameter_count, count_wrong, "wrong-value"),
    (checks.check_parameter_count, lambda d_model, num_heads, bias=True: None, "returned-none"),
    (checks.check_parameter_count, lambda d_model, num_heads, bias=True: "many", "wrong-type"),
    (checks.check_single_head_attention, SHAScaleBySeqLen, "wrong-scale"),
    (checks.check_single_head_attention, SHANoDefaults, "raised-exception"),
    (checks.check_single_head_attention, SHAAlwaysSelf, "wrong-shape"),
    (checks.check_single_head_attention, SHANoWv, "missing-attribute"),
    (checks.check_single_head_attention, SHAWrongLinearShape, "wrong-shape"),
    (checks.check_single_head_attention, SHANaNOnMaskedRow, "nan-on-masked-row"),
    (checks.check_single_head_attention, LoadableSingleHeadTransposed, "weight-layout-transposed"),
    (checks.check_single_head_attention, NotAModule, "wrong-type"),
    (checks.check_kv_cache_bytes, kv_bytes_per_token, "cache-missing-factor"),
    (checks.check_kv_cache_bytes, lambda *args, **kw: kv_cache_bytes(*args, **kw) / 2**30, "wrong-value"),
    (checks.check_kv_cache_bytes, lambda *args, **kw: kv_cache_bytes(*args, **kw) * 8, "wrong-value"),
    (checks.check_kv_cache_bytes, lambda *args, **kw: kv_cache_bytes(*args, **kw) + 1, "wrong-value"),
    (checks.check_kv_cache_bytes, kv_bytes_no_defaults, "raised-exception"),
    (checks.check_kv_cache_bytes, kv_bytes_not_implemented, "not-implemented"),
    (checks.check_kv_cache_bytes, lambda *args, **kw: None, "returned-none"),
    (checks.check_kv_cache_bytes, lambda *args, **kw: "12 GiB", "wrong-type"),
    (checks.check_kv_cache_bytes, lambda *args, **kw: True, "wrong-type"),
    (checks.check_kv_cache_bytes, lambda *args, **kw: torch.ones(2), "wrong-type"),
    (checks.check_repeat_kv, lambda x, n_rep: x[:, :, None].expand(-1, -1, n_rep, -1, -1), "wrong-shape"),
    (checks.check_repeat_kv, lambda x, n_rep: x.repeat_interleave(n_rep, dim=2), "wrong-shape"),
    (checks.check_repeat_kv, lambda x, n_rep: x, "wrong-shape"),
    (checks.check_repeat_kv, lambda x, n_rep: x.flip(1).repeat_interleave(n_rep, dim=1), "wrong-output"),
    (checks.check_repeat_kv, lambda x, n_rep: kv_cache.repeat_kv(x.mul_(1.5), n_rep), "mutates-input"),
    (checks.check_repeat_kv, lambda x, n_rep: None, "returned-none"),
    (checks.check_grouped_query_attention, gqa_without_repeat, "raised-exception"),
    (checks.check_grouped_query_attention, functools.partial(gqa_with, bug_zoo.sdpa_missing_scale), "missing-scale"),
    (checks.check_grouped_query_attention, functools.partial(gqa_with, bug_zoo.sdpa_mask_inverted), "mask-inverted"),
    (checks.check_grouped_query_attention, functools.partial(gqa_with, bug_zoo.sdpa_nan_on_masked_row),
     "nan-on-masked-row"),
    (checks.check_grouped_query_attention, functools.partial(gqa_with, bug_zoo.sdpa_softmax_wrong_axis),
     "softmax-wrong-axis"),
    (checks.check_grouped_query_attention, gqa_returns_kv_heads, "wrong-shape"),
    (checks.check_grouped_query_attention, lambda q, k, v, mask=None: gqa_library(q, k, v, None), "mask-ignored"),
]


@pytest.mark.parametrize("check, impl, code", CASES, ids=[f"{c[2]}-{i}" for i, c in enumerate(CASES)])
def test_mistakes_get_their_code(check, impl, code, capsys):
    with pytest.raises(AssertionError) as info:
        check(impl)
    message = str(info.value)
    assert message.startswith(f"[{code}] "), message
    assert capsys.readouterr().out == ""  # no success line


def test_every_code_is_produced_somewhere():
    zoo = bug_zoo.ZOO + bug_zoo.SINGLE_HEAD_ZOO + bug_zoo.WEIGHT_LAYOUT_ZOO + bug_zoo.KV_CACHE_ZOO + bug_zoo.SEED_ZOO
    planted_elsewhere = {"timeout", "wrong-value"} | {"wrong-answer", "invalid-answer"}  # the latter: test_questions
    planted_elsewhere |= {m.code for m in mistakes.in_chapter(10)}  # tests/test_checks_positions.py
    planted_elsewhere |= {m.code for m in mistakes.in_chapter(11)}  # tests/test_checks_blocks.py
    planted_elsewhere |= {m.code for m in mistakes.in_chapter(12)}  # tests/test_checks_interpret.py
    planted_elsewhere |= {m.code for m in mistakes.in_chapter(13)}  # tests/test_checks_distributed.py
    planted_elsewhere |= {m.code for m in mistakes.in_chapter(14)}  # bug_zoo.MODERN_ZOO, tests/test_checks_modern.py
    planted_elsewhere |= {m.code for m in mistakes.in_chapter(15)}  # tests/test_checks_capstone.py
    planted_elsewhere |= {"kernel-heads-interleaved", "qkv-chunks-swapped"}  # tests/test_checks_porting.py
    planted_elsewhere |= {"window-off-by-one", "window-ignored", "tiles-not-skipped"}  # tests/test_checks_tiles.py
    # the grader's: test_grade.py, test_grader_hostile.py; the hidden cases': test_checks_hidden.py
    planted_elsewhere |= {"calls-reference", "sandbox-ended", "not-run", "softmax-global-max"}
    codes = {c[2] for c in CASES} | {b.code for b in zoo} | planted_elsewhere
    assert codes == set(checks.CODES)


def test_messages_explain_the_failing_case():
    with pytest.raises(checks.CheckFailed) as info:
        checks.check_scaled_dot_product_attention(bug_zoo.sdpa_missing_scale)
    assert str(info.value) == (
        "[missing-scale] Your scores are not divided by sqrt(d_k): your output matches softmax(q @ k^T) @ v "
        "without the 1/sqrt(d_k) factor. Multiply the scores by 1 / sqrt(d_k), with d_k = q.shape[-1], before "
        "the softmax.\n  Failing case: case 1 of 24: q (4, 8), k (4, 8), v (4, 8), no mask"
    )
    assert info.value.code == "missing-scale"


def test_exception_message_names_the_exception_and_the_call():
    with pytest.raises(checks.CheckFailed) as info:
        checks.check_scaled_dot_product_attention(sdpa_requires_mask)
    msg = str(info.value)
    assert msg.startswith("[raised-exception] Your code raised TypeError: ")
    assert "scaled_dot_product_attention(q of shape (4, 8), k of shape (4, 8), v of shape (4, 8), mask=None)" in msg


def test_not_implemented_quotes_the_exercise():
    with pytest.raises(checks.CheckFailed) as info:
        checks.check_scaled_dot_product_attention(sdpa_not_implemented)
    assert str(info.value).startswith("[not-implemented] Exercise 3: scaled dot-product attention: replace the")


def test_long_and_empty_exception_messages():
    def raises_long(q, k, v, mask=None):
        raise ValueError("x" * 500)

    def raises_empty(q, k, v, mask=None):
        raise RuntimeError

    with pytest.raises(checks.CheckFailed, match=r"ValueError: x{297}\.\.\.\n"):
        checks.check_scaled_dot_product_attention(raises_long)
    with pytest.raises(checks.CheckFailed, match=r"^\[raised-exception\] Your code raised RuntimeError\n"):
        checks.check_scaled_dot_product_attention(raises_empty)
    with pytest.raises(checks.CheckFailed, match=r"^\[not-implemented\] scaled_dot_product_attention is not"):
        checks.check_scaled_dot_product_attention(lambda q, k, v, mask=None: (_ for _ in ()).throw(
            NotImplementedError()))


def test_student_sys_exit_is_caught():
    def exits(x):
        raise SystemExit(3)

    with pytest.raises(checks.CheckFailed, match=r"^\[raised-exception\] Your code raised SystemExit: 3"):
        checks.check_softmax(exits)


def test_failure_hides_the_checker_internals():
    with pytest.raises(checks.CheckFailed) as info:
        checks.check_softmax(softmax_axis0)
    err = info.value
    assert err.__cause__ is None and err.__suppress_context__
    frames = []
    tb = err.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame.f_code.co_name)
        tb = tb.tb_next
    assert frames[1:] == ["check_softmax", "run_check"]  # the test, then two short checker frames
    rendered = err._render_traceback_()
    assert rendered == [f"\x1b[0;31mCheckFailed\x1b[0m: {err}"]
    assert not re.search(r"/work/|/tmp/|site-packages|\.py\b|File ", rendered[0])


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="needs the main thread")
def test_time_limit_with_an_alarm_on_the_main_thread():
    handler, (remaining, _) = signal.getsignal(signal.SIGALRM), signal.getitimer(signal.ITIMER_REAL)
    start = time.monotonic()
    with pytest.raises(checks.CheckFailed, match=r"^\[timeout\] Your code did not finish within 0.3 s"):
        checks.check_scaled_dot_product_attention(sdpa_forever, timeout=0.3)
    assert time.monotonic() - start < 5
    assert signal.getsignal(signal.SIGALRM) is handler  # restored (pytest-timeout may have one)
    assert (signal.getitimer(signal.ITIMER_REAL)[0] > 0) == (remaining > 0)


class OuterAlarm(BaseException):
    pass


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="needs the main thread")
def test_an_outer_alarm_is_kept_and_restored():
    def outer(signum, frame):
        raise OuterAlarm

    previous = signal.signal(signal.SIGALRM, outer)
    try:
        signal.setitimer(signal.ITIMER_REAL, 30)
        with pytest.raises(checks.CheckFailed, match=r"^\[timeout\]"):
            checks.check_softmax(lambda x: sdpa_forever(x, x, x), timeout=0.2)
        assert signal.getsignal(signal.SIGALRM) is outer
        assert 25 < signal.getitimer(signal.ITIMER_REAL)[0] <= 30
        # an outer alarm due before the check's own limit fires as usual
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        with pytest.raises(OuterAlarm):
            checks.check_softmax(lambda x: sdpa_forever(x, x, x), timeout=10)
        assert signal.getitimer(signal.ITIMER_REAL)[0] == 0  # it fired: not re-armed to fire a second time
        # and one due right after a fast check is re-armed (1.5 s: the check may be slow on a loaded machine)
        signal.setitimer(signal.ITIMER_REAL, 1.5)
        checks.check_softmax(softmax_np, timeout=10)
        with pytest.raises(OuterAlarm):
            time.sleep(5)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_time_limit_in_a_thread():
    """Off the main thread no alarm is possible: the check runs in a daemon thread and is abandoned."""
    result = {}

    def run():
        try:
            checks.check_scaled_dot_product_attention(sdpa_sleeps_forever, timeout=0.3)
        except checks.CheckFailed as err:
            result["error"] = str(err)

    worker = threading.Thread(target=run)
    worker.start()
    worker.join(10)
    assert result["error"].startswith("[timeout] Your code did not finish within 0.3 s")


def test_checks_in_a_thread_still_pass_and_fail(capsys):
    result = {}

    def run():
        checks.check_softmax(softmax_np, timeout=30)
        try:
            checks.check_softmax(softmax_axis0, timeout=30)
        except checks.CheckFailed as err:
            result["error"] = err.code

    worker = threading.Thread(target=run)
    worker.start()
    worker.join(60)
    assert result["error"] == "softmax-wrong-axis"
    assert capsys.readouterr().out.startswith("✓ softmax")


def test_no_time_limit(capsys):
    checks.check_softmax(softmax_np, timeout=None)
    checks.check_softmax(softmax_np, timeout=0)
    assert capsys.readouterr().out.count("✓") == 2


def test_lists_tensors_and_tf_like_objects_convert():
    class FakeTF:
        def __init__(self, a):
            self.a = a

        def numpy(self):
            return self.a

    case = "c"
    assert runner.as_array([1, 2], "result", case).dtype == np.float64
    assert runner.as_array(torch.tensor([1, 2]), "result", case).tolist() == [1.0, 2.0]
    assert runner.as_array(FakeTF(np.ones(2)), "result", case).tolist() == [1.0, 1.0]
    assert runner.as_array(3.5, "result", case).shape == ()
    for bad in (["a"], {"x": 1}, torch.tensor([1j])):
        with pytest.raises(checks.CheckFailed, match=r"^\[wrong-type\]"):
            runner.as_array(bad, "result", case)
    with pytest.raises(checks.CheckFailed, match=r"^\[returned-none\] Your function returned None as its weights"):
        runner.as_array(None, "weights", case)


def test_keras_checks():
    pytest.importorskip("tensorflow")
    from attention_course.keras_attention import KerasMultiHeadAttention

    checks.check_keras_attention(KerasMultiHeadAttention)

    class KerasNoLoader(KerasMultiHeadAttention):
        load_numpy_params = None

    with pytest.raises(checks.CheckFailed, match=r"^\[missing-attribute\] Your layer has no load_numpy_params"):
        checks.check_keras_attention(KerasNoLoader, test_dropout=False)

    class KerasDropoutAlwaysOn(KerasMultiHeadAttention):
        def call(self, query, key=None, value=None, mask=None, training=None, return_weights=False):
            return super().call(query, key, value, mask=mask, training=True)

    with pytest.raises(checks.CheckFailed, match=r"^\[dropout-in-eval\]"):
        checks.check_keras_attention(KerasDropoutAlwaysOn)

    class KerasKernelsTransposed(KerasMultiHeadAttention):  # a (d_out, d_in) matrix loaded as a Dense kernel
        def load_numpy_params(self, params):
            super().load_numpy_params({name: a.T for name, a in params.items()})

    with pytest.raises(checks.CheckFailed, match=r"^\[weight-layout-transposed\] .* with all four weights"):
        checks.check_keras_attention(KerasKernelsTransposed, test_dropout=False)


def test_keras_errors_keep_their_own_message():
    """Keras rewrites an error raised in call() into a multi-line dump (ANSI codes, "•" lists of the arguments):
    the check switches that off while it runs, and restores the setting."""
    pytest.importorskip("tensorflow")
    import keras

    from attention_course.keras_attention import KerasMultiHeadAttention

    class KerasNotImplemented(KerasMultiHeadAttention):
        def call(self, query, key=None, value=None, mask=None, training=None):
            raise NotImplementedError("Exercise 4: A multi-head attention layer in Keras")

    class KerasRaises(KerasMultiHeadAttention):
        def call(self, query, key=None, value=None, mask=None, training=None):
            return self.w_q(query) @ self.w_k(key)  # (B, Tq, D) @ (B, Tk, D)

    was_enabled = keras.config.is_traceback_filtering_enabled()
    try:
        keras.config.enable_traceback_filtering()  # Keras' default
        with pytest.raises(checks.CheckFailed) as info:
            checks.check_keras_attention(KerasNotImplemented)
        assert str(info.value) == (
            "[not-implemented] Exercise 4: A multi-head attention layer in Keras: replace the `raise "
            "NotImplementedError(...)` line with your solution, run that cell, then run this check again.")
        assert keras.config.is_traceback_filtering_enabled()  # restored
        keras.config.disable_traceback_filtering()
        with pytest.raises(checks.CheckFailed) as info:
            checks.check_keras_attention(KerasRaises)
        assert not keras.config.is_traceback_filtering_enabled()  # left as it was
    finally:
        (keras.config.enable_traceback_filtering if was_enabled else keras.config.disable_traceback_filtering)()
    assert str(info.value) == (
        "[raised-exception] Your code raised InvalidArgumentError: Matrix size-incompatible: In[0]: [1,2,12], "
        "In[1]: [1,2,12] [Op:BatchMatMulV2]\n  when called as KerasRaises(...)(query of shape (1, 2, 12), key of "
        "shape (1, 2, 12), value of shape (1, 2, 12), training=False).")


def test_single_head_messages():
    with pytest.raises(checks.CheckFailed, match=r"w_v \(and no load_numpy_params method\).*nn\.Linear\(d_in, d_out\)"):
        checks.check_single_head_attention(SHANoWv)
    with pytest.raises(checks.CheckFailed, match=r"^\[wrong-shape\] SHAWrongLinearShape\.w_k\.weight has shape "
                       r"\(6, 4\); expected \(4, 6\) \(nn\.Linear\(6, 4\)\)"):
        checks.check_single_head_attention(SHAWrongLinearShape)
    with pytest.raises(checks.CheckFailed) as info:
        checks.check_single_head_attention(SHANoDefaults)
    assert "when called as SHANoDefaults(...)(query of shape (2, 5, 8))" in str(info.value)


# ---------------------------------------------------------------------------------------------------------------
# Weight layouts and keys/values of other widths (kdim, vdim != d_model)
# ---------------------------------------------------------------------------------------------------------------


def test_weight_layout_diagnosis_names_the_transposed_weights():
    with pytest.raises(checks.CheckFailed) as info:
        checks.check_einsum_attention(mha_reads_kv_transposed)
    assert str(info.value).startswith("[weight-layout-transposed] Your output matches attention computed with w_k and "
                                      "w_v transposed: a weight matrix was read in the other layout.")
    assert str(info.value).endswith("Failing case: d_model=12, num_heads=3, case 1 of 6: self-attention, x (2, 5, D), "
                                    "no mask")
    with pytest.raises(checks.CheckFailed, match=r"^\[weight-layout-transposed\] .* with all four weights \(w_q, w_k, "
                       r"w_v and w_o\) transposed"):
        checks.check_multi_head_attention(LoadableMHALinearLayout)
    with pytest.raises(checks.CheckFailed, match=r"^\[weight-layout-transposed\] .* with w_o transposed"):
        checks.check_einsum_attention(lambda query, key, value, params, num_heads, mask=None: (
            ac.multi_head_attention_loop(query, key, value, dict(params, w_o=params["w_o"].T), num_heads, mask)))


def test_layout_subsets():
    subsets = dict(diagnosis.LAYOUT_SUBSETS)
    assert len(subsets) == 15 and list(subsets)[:2] == ["qkvo", "qkv"]
    assert subsets["qkv"] == "w_q, w_k and w_v" and subsets["kv"] == "w_k and w_v" and subsets["o"] == "w_o"


def test_keys_and_values_of_other_widths(capsys):
    """Functions with params always, classes when their signature has kdim and vdim, get 3 more cases."""
    checks.check_einsum_attention(ac.multi_head_attention_loop)
    checks.check_multi_head_attention(ac.MultiHeadAttention, test_dropout=False)
    checks.check_multi_head_attention(ScratchMHA, test_dropout=False)
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        "✓ multi_head_attention_loop: 15 cases (2 sizes; self- and cross-attention, also with kdim, vdim != d_model; "
        "Tq != Tk, masks) match the reference",
        "✓ MultiHeadAttention: 15 cases (2 sizes; self- and cross-attention, also with kdim, vdim != d_model; "
        "Tq != Tk, masks) match the reference",
        "✓ ScratchMHA: 12 cases (2 sizes; self- and cross-attention, Tq != Tk, masks) match the reference",
    ]
    assert check_modules._accepts_cross_dims(ac.EinsumMultiHeadAttention)
    assert not check_modules._accepts_cross_dims(ScratchMHA)
    assert not check_modules._accepts_cross_dims(sdpa_without_signature)


def test_code_that_assumes_square_weights_is_told_so():
    with pytest.raises(checks.CheckFailed) as info:
        checks.check_einsum_attention(mha_square_only)
    msg = str(info.value)
    assert msg.startswith("[raised-exception] Your code raised RuntimeError: shape '[12, 12]' is invalid")
    assert ("when called as mha_square_only(query of shape (2, 4, 12), key of shape (2, 6, 8), value of shape "
            "(2, 6, 5), params={w_q: (12, 12), b_q: (12,), w_k: (8, 12), b_k: (12,), w_v: (5, 12), b_v: (12,), "
            "w_o: (12, 12), b_o: (12,)}, num_heads=3, mask=None).") in msg
    assert msg.endswith("Your code passed the cases with square weights. Here the keys have kdim=8 and the values "
                        "vdim=5 features, not d_model=12: w_k is (8, 12) and w_v (5, 12), each W (d_in, d_out). Does "
                        "your code assume d_in == d_model somewhere?")
    with pytest.raises(checks.CheckFailed, match=r"^\[wrong-shape\] MHAIgnoresKdim\.w_k\.weight has shape \(12, 12\); "
                       r"expected \(12, 8\) \(nn\.Linear\(8, 12\)\)"):
        checks.check_multi_head_attention(MHAIgnoresKdim)
    with pytest.raises(checks.CheckFailed, match=r"(?s)ValueError: key and value must have 12 features\n.*when called "
                       r"as MHAKdimSquareOnly\(\.\.\.\)\(query of shape \(2, 4, 12\), key of shape \(2, 6, 8\).*Does "
                       r"your code assume d_in == d_model somewhere\?$"):
        checks.check_multi_head_attention(MHAKdimSquareOnly)


# ---------------------------------------------------------------------------------------------------------------
# Frameworks: TensorFlow tensors for the attention core, Keras layers
# ---------------------------------------------------------------------------------------------------------------


def test_attention_core_framework_option(capsys):
    checks.check_scaled_dot_product_attention(attention_numpy, framework="numpy")
    assert capsys.readouterr().out.startswith("✓ attention_numpy: 24 random cases")
    with pytest.raises(checks.CheckFailed, match=r"^\[raised-exception\] Your code raised ValueError: matmul"):
        checks.check_scaled_dot_product_attention(sdpa_scratch, framework="numpy")  # torch code, NumPy inputs
    with pytest.raises(ValueError, match=r"framework must be one of 'torch', 'tf', 'numpy', got 'jax'"):
        checks.check_scaled_dot_product_attention(sdpa_scratch, framework="jax")


def tf_attention(q, k, v, mask=None, scale=True):
    import tensorflow as tf

    scores = tf.matmul(q, k, transpose_b=True)
    scores = scores / tf.sqrt(tf.cast(tf.shape(q)[-1], q.dtype)) if scale else scores
    if mask is not None:
        scores = tf.where(mask, scores, tf.constant(float("-inf"), dtype=scores.dtype))
    weights = tf.nn.softmax(scores, axis=-1)
    if mask is not None:
        weights = tf.where(tf.reduce_any(mask, axis=-1, keepdims=True), weights, tf.zeros_like(weights))
    return tf.matmul(weights, v), weights


def test_attention_core_in_tensorflow(capsys):
    tf = pytest.importorskip("tensorflow")
    checks.check_scaled_dot_product_attention(tf_attention, framework="tf")
    assert capsys.readouterr().out == ("✓ tf_attention: 24 random cases (Tq != Tk, masks, batch dims, fully masked "
                                       "rows) match the reference\n")
    with pytest.raises(checks.CheckFailed, match=r"^\[missing-scale\]"):
        checks.check_scaled_dot_product_attention(functools.partial(tf_attention, scale=False), framework="tf")
    with pytest.raises(checks.CheckFailed) as info:
        checks.check_scaled_dot_product_attention(lambda q, k, v, mask=None: tf.matmul(q, k), framework="tf")
    assert str(info.value) == (  # TensorFlow's "{{function_node ...}}" prefix and empty " name:" are dropped
        "[raised-exception] Your code raised InvalidArgumentError: Matrix size-incompatible: In[0]: [4,8], In[1]: "
        "[4,8] [Op:MatMul]\n  when called as scaled_dot_product_attention(q of shape (4, 8), k of shape (4, 8), v of "
        "shape (4, 8), mask=None).")


def test_exception_messages_are_cleaned():
    def wrapped(cls, inner_message):
        try:
            try:
                raise cls(inner_message)
            except cls:
                raise cls("Exception encountered when calling Layer.call().\n\n\x1b[1m" + inner_message +
                          "\x1b[0m\n\nArguments received by Layer.call():\n  • x=tf.Tensor(shape=(2,))") from None
        except cls as outer:
            assert outer.__cause__ is None and str(outer.__context__) == inner_message  # what Keras raises
            return outer

    err = wrapped(NotImplementedError, "Exercise 4: A layer")
    assert str(runner.original_error(err)) == "Exercise 4: A layer"
    lonely = ValueError("Exception encountered when calling Layer.call(). Nothing else.")
    assert runner.original_error(lonely) is lonely
    assert runner.first_line(RuntimeError("{{function_node __wrapped__Op}} bad shapes\nmore [Op:X] name: ")) == (
        "bad shapes")
    assert runner.first_line(RuntimeError("bad [Op:X] name: ")) == "bad [Op:X]"

    def raises_wrapped(x):
        raise wrapped(NotImplementedError, "Exercise 1: Softmax")

    def raises_wrapped_value_error(x):
        raise wrapped(ValueError, "the real error")

    with pytest.raises(checks.CheckFailed, match=r"^\[not-implemented\] Exercise 1: Softmax: replace the"):
        checks.check_softmax(raises_wrapped)
    with pytest.raises(checks.CheckFailed, match=r"^\[raised-exception\] Your code raised ValueError: the real "
                       r"error\n"):
        checks.check_softmax(raises_wrapped_value_error)


def test_describe_call():
    args = {"x": np.zeros((2, 3)), "params": {"w": torch.zeros(4, 5)}, "n": 3, "d": {"a": 1}}
    assert runner.describe_call("f", args) == "f(x of shape (2, 3), params={w: (4, 5)}, n=3, d={'a': 1})"


# ---------------------------------------------------------------------------------------------------------------
# Chapter 8: KV-cache size, repeated key/value heads, grouped-query attention
# ---------------------------------------------------------------------------------------------------------------


def test_kv_cache_success_lines(capsys):
    checks.check_kv_cache_bytes(kv_cache_bytes)
    checks.check_repeat_kv(kv_cache.repeat_kv)
    checks.check_grouped_query_attention(gqa_library)
    checks.check_grouped_query_attention(lambda q, k, v, mask=None: gqa_library(q, k, v, mask))
    assert capsys.readouterr().out.splitlines() == [
        "✓ kv_cache_bytes: 7 model sizes (MHA, GQA and MQA; with and without batch_size and bytes_per_element) are "
        "right",
        "✓ repeat_kv: 6 random cases (H_kv from 1 to 3, n_rep from 1 to 4; (B, H_kv, T, Dh) -> (B, H_kv * n_rep, T, "
        "Dh)) match the reference",
        "✓ gqa_library: 17 random cases (MHA, GQA and MQA head counts; decoding with Tq = 1, Tq != Tk, causal and "
        "padding masks, fully masked rows) match the reference",
        "✓ grouped_query_attention: 17 random cases (MHA, GQA and MQA head counts; decoding with Tq = 1, Tq != Tk, "
        "causal and padding masks, fully masked rows) match the reference",
    ]


def test_kv_cache_bytes_accepts_any_kind_of_number(capsys):
    checks.check_kv_cache_bytes(lambda *args, **kw: float(kv_cache_bytes(*args, **kw)))
    checks.check_kv_cache_bytes(lambda *args, **kw: np.int64(kv_cache_bytes(*args, **kw)))
    checks.check_kv_cache_bytes(lambda *args, **kw: np.array(kv_cache_bytes(*args, **kw)))
    checks.check_kv_cache_bytes(lambda *args, **kw: torch.tensor(kv_cache_bytes(*args, **kw)))
    assert capsys.readouterr().out.count("✓ kv_cache_bytes: 7 model sizes") == 4


def test_kv_cache_bytes_messages():
    with pytest.raises(checks.CheckFailed) as info:
        checks.check_kv_cache_bytes(bug_zoo.kv_cache_bytes_keys_only)
    assert str(info.value) == (
        "[cache-keys-only] Your cache size is half the right one: it counts the keys only (or the values only). The "
        "cache holds both, for every layer and every token.\n  Failing case: case 1 of 7: kv_cache_bytes(4, 8, 32, "
        "100, batch_size=3, bytes_per_element=4)")
    with pytest.raises(checks.CheckFailed) as info:
        checks.check_kv_cache_bytes(bug_zoo.kv_cache_bytes_one_sequence)
    assert str(info.value) == (
        "[cache-missing-factor] Your cache size leaves out batch_size (every sequence of the batch has its own "
        "cache).\n  Failing case: case 1 of 7: kv_cache_bytes(4, 8, 32, 100, batch_size=3, bytes_per_element=4)")
    with pytest.raises(checks.CheckFailed, match=r"^\[cache-missing-factor\] Your cache size leaves out two factors: "
                       r"the factor 2 \(the cache holds the keys AND the values\) and bytes_per_element \(you "
                       r"counted numbers, not bytes: "):
        checks.check_kv_cache_bytes(lambda n, h, dh, t, batch_size=1, bytes_per_element=2: n * h * dh * t * batch_size)
    with pytest.raises(checks.CheckFailed, match=r"^\[cache-missing-factor\] Your cache size leaves out seq_len "
                       r"\(without it you have the size of ONE token's"):
        checks.check_kv_cache_bytes(kv_bytes_per_token)
    with pytest.raises(checks.CheckFailed, match=r"^\[wrong-value\] Your answer is the size in MiB \(bytes / "
                       r"1,048,576\); return the number of bytes"):
        checks.check_kv_cache_bytes(lambda *args, **kw: kv_cache_bytes(*args, **kw) / 2**20)
    with pytest.raises(checks.CheckFailed, match=r"^\[wrong-value\] Your answer is 8 times too large: bits"):
        checks.check_kv_cache_bytes(lambda *args, **kw: kv_cache_bytes(*args, **kw) * 8)
    with pytest.raises(checks.CheckFailed) as info:
        checks.check_kv_cache_bytes(lambda *args, **kw: kv_cache_bytes(*args, **kw) + 1)
    assert str(info.value).startswith("[wrong-value] 2,457,601 is not the number of bytes of this cache, and it "
                                      "matches none of the mistakes")
    with pytest.raises(checks.CheckFailed, match=r"^\[wrong-value\] 1,228,800\.5 is not the number of bytes.*\n.*"
                       r"case 1 of 7"):
        checks.check_kv_cache_bytes(lambda *args, **kw: kv_cache_bytes(*args, **kw) / 2 + 0.5)
    with pytest.raises(checks.CheckFailed, match=r"(?s)^\[wrong-value\] .*Failing case: case 2 of 7: kv_cache_bytes"
                       r"\(32, 32, 128, 4096\)$"):  # right when the defaults are passed, wrong defaults
        checks.check_kv_cache_bytes(lambda L, h, dh, t, batch_size=1, bytes_per_element=4: kv_cache_bytes(
            L, h, dh, t, batch_size, bytes_per_element))
    with pytest.raises(checks.CheckFailed) as info:
        checks.check_kv_cache_bytes(kv_bytes_no_defaults)
    assert str(info.value).endswith("when called as kv_cache_bytes(32, 32, 128, 4096).")
    with pytest.raises(checks.CheckFailed, match=r"^\[wrong-type\] Your function returned a torch tensor of dtype "
                       r"torch.float32; expected a number of bytes \(an int\)\.\n  Failing case: case 1 of 7"):
        checks.check_kv_cache_bytes(lambda *args, **kw: torch.ones(2))


def test_repeat_kv_messages():
    with pytest.raises(checks.CheckFailed) as info:
        checks.check_repeat_kv(bug_zoo.repeat_kv_tiled)
    assert str(info.value).startswith(
        "[kv-heads-tiled] Your key/value heads are repeated as a tile, not in groups: for H_kv=2 and n_rep=3 your "
        "output heads copy the input heads [0, 1, 0, 1, 0, 1], in groups they would be [0, 0, 0, 1, 1, 1]. Query "
        "head h uses key/value head h // n_rep")
    assert str(info.value).endswith("Failing case: case 1 of 6: x of shape (2, 2, 3, 4), n_rep=3")
    with pytest.raises(checks.CheckFailed, match=r"^\[wrong-shape\] Your result has shape \(2, 2, 3, 3, 4\); expected "
                       r"\(B, H_kv \* n_rep, T, Dh\) = \(2, 6, 3, 4\)\. You have the repeated heads on an axis of "
                       r"their own"):
        checks.check_repeat_kv(lambda x, n_rep: x[:, :, None].expand(-1, -1, n_rep, -1, -1))
    with pytest.raises(checks.CheckFailed, match=r"^\[wrong-shape\] .* \(2, 2, 9, 4\); .*You repeated along another "
                       r"axis: the heads are axis 1\."):
        checks.check_repeat_kv(lambda x, n_rep: x.repeat_interleave(n_rep, dim=2))
    with pytest.raises(checks.CheckFailed, match=r"^\[wrong-shape\] Your result has shape \(2, 2, 3, 4\); expected "
                       r"\(B, H_kv \* n_rep, T, Dh\) = \(2, 6, 3, 4\)\.\n"):
        checks.check_repeat_kv(lambda x, n_rep: x)


def test_grouped_query_attention_messages():
    with pytest.raises(checks.CheckFailed) as info:
        checks.check_grouped_query_attention(bug_zoo.gqa_tiled_heads)
    assert str(info.value).startswith("[kv-heads-tiled] Your key/value heads are repeated as a tile, not in groups: "
                                      "for H=4 and H_kv=2 your query heads use the key/value heads [0, 1, 0, 1], in "
                                      "groups they would be [0, 0, 1, 1].")
    assert str(info.value).endswith("Failing case: case 3 of 17: GQA, H=4, H_kv=2: q (2, 4, 1, 8), k (2, 2, 7, 8), "
                                    "v (2, 2, 7, 8), no mask")
    with pytest.raises(checks.CheckFailed) as info:  # passes H_kv = H and H_kv = 1 (broadcasting), then raises
        checks.check_grouped_query_attention(gqa_without_repeat)
    assert str(info.value).endswith(
        "when called as grouped_query_attention(q of shape (2, 4, 1, 8), k of shape (2, 2, 7, 8), v of shape (2, 2, "
        "7, 8), mask=None).\n  Here q has H=4 heads and k, v have H_kv=2: query head h uses key/value head h // (H / "
        "H_kv), so each key/value head must be repeated H / H_kv = 2 times (in a row) before the matrix products.")
    with pytest.raises(checks.CheckFailed) as info:  # an error with H_kv = H gets no note about the heads
        checks.check_grouped_query_attention(sdpa_raises)
    assert str(info.value).startswith("[raised-exception]") and "Here q has" not in str(info.value)
    with pytest.raises(checks.CheckFailed, match=r"^\[mutates-input\] Your function changed its input `k`"):
        checks.check_grouped_query_attention(lambda q, k, v, mask=None: gqa_library(q, k.mul_(2), v, mask))
    with pytest.raises(checks.CheckFailed, match=r"^\[wrong-shape\] Your output has shape \(2, 1, 1, 8\); expected "
                       r"\(2, 4, 1, 8\)\.\n  Failing case: case 2 of 17: MQA"):
        checks.check_grouped_query_attention(gqa_returns_kv_heads)
