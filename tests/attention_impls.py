"""Correct attention code written from scratch (in several styles), and a few wrong answers, shared by the checker
tests (tests/test_checks_<topic>.py): each topic file plants its own wrong answers."""

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import attention_course as ac
from attention_course import kv_cache, numpy_ref


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
        q, k, v = self.w_q(query), self.w_k(key), self.w_v(value)
        scores = (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill(
            torch.zeros((), dtype=torch.bool) if mask is None else ~mask, float("-inf"))
        weights = self.drop(torch.softmax(scores, dim=-1).nan_to_num(0.0))
        return weights @ v, weights


class LoadableSingleHead(nn.Module):
    """Projections as plain x @ W + b parameters, loaded through load_numpy_params."""

    def __init__(self, d_in, d_out, dropout=0.0):
        super().__init__()
        self.p = nn.ParameterDict({f"{w}_{n}": nn.Parameter(torch.zeros((d_in, d_out) if w == "w" else (d_out,)))
                                   for n in "qkv" for w in "wb"})
        self.dropout = dropout

    def load_numpy_params(self, params):
        with torch.no_grad():
            for name, tensor in self.p.items():
                tensor.copy_(torch.as_tensor(params[name]))

    def forward(self, query, key=None, value=None, mask=None):
        key = query if key is None else key
        value = key if value is None else value
        q, k, v = (x @ self.p[f"w_{n}"] + self.p[f"b_{n}"] for x, n in ((query, "q"), (key, "k"), (value, "v")))
        return ac.scaled_dot_product_attention(q, k, v, mask, self.dropout if self.training else 0.0)[0]


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
        weights = self.drop(sdpa_scratch(q, k, v, mask)[1])
        return self.w_o(ac.merge_heads(weights @ v)), weights


def sdpa_not_implemented(q, k, v, mask=None):
    raise NotImplementedError("Exercise 3: scaled dot-product attention")


def sdpa_raises(q, k, v, mask=None):
    return q @ k  # (.., Tq, Dk) @ (.., Tk, Dk): shapes do not match


def sdpa_requires_mask(q, k, v, mask=None):
    scores = (q @ k.transpose(-2, -1)).masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, -1) @ v


def softmax_axis0(x):
    e = np.exp(x - x.max(axis=0, keepdims=True))
    return e / e.sum(axis=0, keepdims=True)


class NotAModule:
    def __init__(self, d_model, num_heads, dropout=0.0):
        pass

