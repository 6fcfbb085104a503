"""A field guide to attention bugs: small, deliberately WRONG implementations,
one per kind of mistake.

Each function or class here differs from a correct implementation in one place,
marked ``# BUG:``; its docstring starts with the diagnosis code that
:mod:`attention_course.checks` reports for it, the code that
:mod:`attention_course.mistakes` lists it under (with the check that diagnoses
it). Do not use any of them for real work. :data:`ZOO` lists every bug with the
check that diagnoses it, e.g.::

    from attention_course import bug_zoo, checks
    for bug in bug_zoo.ZOO:
        try:
            getattr(checks, bug.check)(bug.impl)
        except AssertionError as err:
            print(bug.impl.__name__, "->", str(err).splitlines()[0])

:data:`BUGS` maps each diagnosis code to one implementation that triggers it.
:data:`SINGLE_HEAD_ZOO` lists the single-head module's bugs (chapter 2) the
same way, :data:`WEIGHT_LAYOUT_ZOO` the weight-layout bugs of multi-head
attention (a (d_in, d_out) matrix read as (d_out, d_in), chapters 3, 5 and 6),
and :data:`KV_CACHE_ZOO` the bugs of chapter 8 (KV-cache size, key/value heads
shared by grouped queries).
Shapes: q (..., Tq, Dk), k (..., Tk, Dk), v (..., Tk, Dv); masks are boolean,
    True = may attend.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from . import mistakes
from .einsum_attention import EinsumMultiHeadAttention
from .functional import masked_softmax, scaled_dot_product_attention
from .heads import merge_heads, split_heads

# --- scaled dot-product attention: (q, k, v, mask=None) -> (out, weights) ----


def sdpa_missing_scale(q, k, v, mask=None):
    """[missing-scale] The scores are not divided by sqrt(d_k), so the softmax
    saturates as d_k grows."""
    # BUG: should be divided by math.sqrt(q.size(-1))
    scores = q @ k.transpose(-2, -1)
    weights = masked_softmax(scores, mask)
    return weights @ v, weights


def sdpa_scale_by_dk(q, k, v, mask=None):
    """[wrong-scale] The scores are divided by d_k instead of sqrt(d_k)."""
    # BUG: should be math.sqrt(q.size(-1))
    scores = q @ k.transpose(-2, -1) / q.size(-1)
    weights = masked_softmax(scores, mask)
    return weights @ v, weights


def sdpa_scale_by_seq_len(q, k, v, mask=None):
    """[wrong-scale] The scores are divided by sqrt(Tk), the number of keys,
    instead of sqrt(d_k)."""
    # BUG: size(-2) is Tk; d_k is q.size(-1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(k.size(-2))
    weights = masked_softmax(scores, mask)
    return weights @ v, weights


def sdpa_softmax_wrong_axis(q, k, v, mask=None):
    """[softmax-wrong-axis] The softmax normalises over the queries (dim=-2)
    instead of over the keys."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    # BUG: each query's weights over the keys must sum to 1: dim=-1
    weights = torch.softmax(scores, dim=-2)
    return weights @ v, weights


def sdpa_transposed_scores(q, k, v, mask=None):
    """[transposed-scores] The scores are k @ q^T (keys x queries); it only
    runs at all when Tq == Tk."""
    # BUG: should be q @ k.transpose(-2, -1)
    scores = k @ q.transpose(-2, -1) / math.sqrt(q.size(-1))
    weights = masked_softmax(scores, mask)
    return weights @ v, weights


def sdpa_values_from_keys(q, k, v, mask=None):
    """[values-from-keys] The weights average the keys instead of the
    values."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    weights = masked_softmax(scores, mask)
    return weights @ k, weights  # BUG: should be weights @ v


def sdpa_mask_ignored(q, k, v, mask=None):
    """[mask-ignored] masked_fill returns a new tensor; its result is thrown
    away, so the mask does nothing."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        # BUG: should be scores = scores.masked_fill(...)
        scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return weights @ v, weights


def sdpa_mask_inverted(q, k, v, mask=None):
    """[mask-inverted] Blocks the keys where the mask is True
    (nn.MultiheadAttention's convention, not ours)."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        # BUG: True = may attend, so fill where ~mask
        scores = scores.masked_fill(mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    return weights @ v, weights


def sdpa_mask_plus_1e10(q, k, v, mask=None):
    """[mask-wrong-sign] Adds +1e10 to the blocked scores, so the blocked keys
    take all the weight."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        # BUG: the blocked scores must go DOWN: -inf (or - 1e10)
        scores = scores + (~mask) * 1e10
    weights = torch.softmax(scores, dim=-1)
    return weights @ v, weights


def sdpa_mask_zero_before_softmax(q, k, v, mask=None):
    """[mask-zero-before-softmax] Sets blocked scores to 0, but exp(0) = 1, so
    blocked keys keep some weight."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        # BUG: should be scores.masked_fill(~mask, float("-inf"))
        scores = scores * mask
    weights = torch.softmax(scores, dim=-1)
    return weights @ v, weights


def sdpa_mask_zero_after_softmax(q, k, v, mask=None):
    """[weights-not-normalized] Masks the weights after the softmax: the
    remaining weights no longer sum to 1."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    weights = torch.softmax(scores, dim=-1)
    if mask is not None:
        # BUG: mask the scores BEFORE the softmax so that it renormalises
        weights = weights * mask
    return weights @ v, weights


def sdpa_nan_on_masked_row(q, k, v, mask=None):
    """[nan-on-masked-row] A query that may attend no key gets softmax(all
    -inf) = 0/0 = NaN."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    # BUG: rows with no allowed key must be set to zero
    weights = torch.softmax(scores, dim=-1)
    return weights @ v, weights


def sdpa_mask_minus_1e9(q, k, v, mask=None):
    """[masked-row-not-zero] Fills with -1e9: a fully masked row then spreads
    its weight evenly over all keys."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        # BUG: fine for other rows; an all -1e9 row gives 1/Tk each
        scores = scores.masked_fill(~mask, -1e9)
    weights = torch.softmax(scores, dim=-1)
    return weights @ v, weights


# --- masks -------------------------------------------------------------------


def causal_mask_triu(t_q, t_k=None):
    """[mask-inverted] True marks the FUTURE keys (nn.MultiheadAttention's
    convention): the opposite of ours."""
    t_k = t_q if t_k is None else t_k
    # BUG: should be tril(t_k - t_q)
    return torch.ones(t_q, t_k, dtype=torch.bool).triu(diagonal=t_k - t_q + 1)


def causal_mask_top_left(t_q, t_k=None):
    """[causal-top-left-aligned] Right for Tq == Tk; with Tq < Tk the last
    query cannot see the last keys."""
    t_k = t_q if t_k is None else t_k
    # BUG: should be tril(diagonal=t_k - t_q)
    return torch.ones(t_q, t_k, dtype=torch.bool).tril()


def causal_mask_strict(t_q, t_k=None):
    """[causal-excludes-diagonal] Each position is hidden from itself, too."""
    t_k = t_q if t_k is None else t_k
    # BUG: the -1 hides the diagonal
    return torch.ones(t_q, t_k, dtype=torch.bool).tril(diagonal=t_k - t_q - 1)


def padding_mask_2d(lengths, t):
    """[wrong-shape] Returns (B, T): broadcast against (B, H, Tq, Tk) scores it
    would line B up with Tq."""
    # BUG: needs [:, None, None, :] -> (B, 1, 1, T)
    return torch.arange(t) < lengths[:, None]


def padding_mask_off_by_one(lengths, t):
    """[off-by-one] Lets each sequence attend one padding position too."""
    # BUG: should be <
    return (torch.arange(t) <= lengths[:, None])[:, None, None, :]


# --- heads -------------------------------------------------------------------


def split_heads_view(x, num_heads):
    """[heads-split-without-transpose] Reshapes (B, T, D) straight to (B, H, T,
    Dh), scrambling positions."""
    b, t, d = x.shape
    # BUG: view(b, t, H, Dh) then .transpose(1, 2)
    return x.view(b, num_heads, t, d // num_heads)


def merge_heads_view(x):
    """[merge-heads-wrong-order] Reshapes (B, H, T, Dh) straight to (B, T, D),
    mixing heads and positions."""
    b, h, t, dh = x.shape
    # BUG: x.transpose(1, 2) first, then reshape
    return x.reshape(b, t, h * dh)


# --- NumPy softmax (chapter 1) -----------------------------------------------


def softmax_no_max(x):
    """[softmax-overflow] exp(1000) is inf in float64, and inf / inf is NaN."""
    e = np.exp(x)  # BUG: subtract x.max(axis=-1, keepdims=True) first
    return e / e.sum(axis=-1, keepdims=True)


def softmax_in_place(x):
    """[mutates-input] Right result, but it changes the caller's array."""
    # BUG: x = x - ... would leave the caller's array alone
    x -= x.max(axis=-1, keepdims=True)
    e = np.exp(x)
    return e / e.sum(axis=-1, keepdims=True)


# --- single-head attention (chapter 2): module(query, key=None, value=None,
# mask=None) -> (out, weights) ---


class ZooSingleHeadAttention(nn.Module):
    """A CORRECT compact single-head attention; each class below changes one of
    its methods."""

    def __init__(self, d_in, d_out, bias=False, dropout=0.0):
        super().__init__()
        self.p = dropout
        self.w_q, self.w_k, self.w_v = (
            nn.Linear(d_in, d_out, bias=bias) for _ in range(3)
        )

    def project(self, query, key, value):  # (B, T, d_in) -> (B, T, d_out)
        return self.w_q(query), self.w_k(key), self.w_v(value)

    def scores(self, q, k):  # -> (B, Tq, Tk)
        return q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))

    def attend(self, scores, v, mask):  # -> (B, Tq, d_out), (B, Tq, Tk)
        weights = masked_softmax(scores, mask)
        # the weights applied are the ones returned
        weights = F.dropout(weights, self.p, training=self.training)
        return weights @ v, weights

    def forward(self, query, key=None, value=None, mask=None):
        key = query if key is None else key
        value = key if value is None else value
        q, k, v = self.project(query, key, value)
        return self.attend(self.scores(q, k), v, mask)


class SHAWeightNotTransposed(ZooSingleHeadAttention):
    """[weight-not-transposed] Projects with x @ linear.weight; runs only when
    d_in == d_out, and is wrong then."""

    def project(self, query, key, value):
        # BUG: nn.Linear stores weight as (d_out, d_in): x @ w.weight.T, or
        #     simply self.w_q(query)
        return (
            query @ self.w_q.weight,
            key @ self.w_k.weight,
            value @ self.w_v.weight,
        )


class SHAValuesFromKeys(ZooSingleHeadAttention):
    """[values-from-keys] The values are projected from the key input
    (invisible in self-attention)."""

    def project(self, query, key, value):
        # BUG: should be self.w_v(value)
        return self.w_q(query), self.w_k(key), self.w_v(key)


class SHAMissingScale(ZooSingleHeadAttention):
    """[missing-scale] The scores are not divided by sqrt(d_k)."""

    def scores(self, q, k):
        # BUG: should be divided by math.sqrt(q.size(-1))
        return q @ k.transpose(-2, -1)


class SHAScaleByDIn(ZooSingleHeadAttention):
    """[wrong-scale] Divides by sqrt(d_in), the input size, instead of
    sqrt(d_out), the size of q and k."""

    def scores(self, q, k):
        # BUG: d_k = q.size(-1) = d_out
        return q @ k.transpose(-2, -1) / math.sqrt(self.w_q.in_features)


class SHASoftmaxWrongAxis(ZooSingleHeadAttention):
    """[softmax-wrong-axis] Normalises over the queries (dim=-2) instead of
    over the keys."""

    def attend(self, scores, v, mask):
        scores = (
            scores
            if mask is None
            else scores.masked_fill(~mask, float("-inf"))
        )
        # BUG: each query's weights over the keys must sum to 1: dim=-1
        weights = torch.softmax(scores, dim=-2)
        return weights @ v, weights


class SHAMaskIgnored(ZooSingleHeadAttention):
    """[mask-ignored] The mask is accepted but never used."""

    def attend(self, scores, v, mask):
        return super().attend(scores, v, None)  # BUG: should pass mask


class SHAMaskInverted(ZooSingleHeadAttention):
    """[mask-inverted] Treats True as 'blocked' (nn.MultiheadAttention's
    convention, not ours)."""

    def attend(self, scores, v, mask):
        # BUG: True = may attend: pass mask
        return super().attend(scores, v, None if mask is None else ~mask)


class SHADropoutInEval(ZooSingleHeadAttention):
    """[dropout-in-eval] F.dropout(..., training=True) keeps dropping weights
    after .eval()."""

    def attend(self, scores, v, mask):
        weights = masked_softmax(scores, mask)
        # BUG: should be training=self.training
        return F.dropout(weights, self.p, training=True) @ v, weights


# --- multi-head attention ----------------------------------------------------


class ZooMultiHeadAttention(nn.Module):
    """A CORRECT compact multi-head attention; each class below changes one of
    its methods."""

    def __init__(self, d_model, num_heads, dropout=0.0):
        super().__init__()
        self.num_heads, self.p = num_heads, dropout
        self.w_q, self.w_k, self.w_v, self.w_o = (
            nn.Linear(d_model, d_model) for _ in range(4)
        )

    def split(self, x):  # (B, T, D) -> (B, H, T, Dh)
        b, t, d = x.shape
        return x.reshape(b, t, self.num_heads, d // self.num_heads).transpose(
            1, 2
        )

    def merge(self, x):  # (B, H, T, Dh) -> (B, T, D)
        b, h, t, dh = x.shape
        return x.transpose(1, 2).reshape(b, t, h * dh)

    def attend(self, q, k, v, mask):  # -> (B, H, Tq, Dh)
        weights = masked_softmax(
            q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)), mask
        )
        return F.dropout(weights, self.p, training=self.training) @ v

    def forward(self, query, key, value, mask=None):
        q, k, v = (
            self.split(self.w_q(query)),
            self.split(self.w_k(key)),
            self.split(self.w_v(value)),
        )
        return self.w_o(self.merge(self.attend(q, k, v, mask)))


class MHAValuesFromKeys(ZooMultiHeadAttention):
    """[values-from-keys] The values are projected from the key input
    (invisible in self-attention)."""

    def forward(self, query, key, value, mask=None):
        q, k = self.split(self.w_q(query)), self.split(self.w_k(key))
        v = self.split(self.w_v(key))  # BUG: should be self.w_v(value)
        return self.w_o(self.merge(self.attend(q, k, v, mask)))


class MHASplitWithoutTranspose(ZooMultiHeadAttention):
    """[heads-split-without-transpose] Splits heads with a view only; merge
    undoes it, attention does not."""

    def split(self, x):
        b, t, d = x.shape
        # BUG: view (b, t, H, Dh), then transpose(1, 2)
        return x.view(b, self.num_heads, t, d // self.num_heads)


class MHAMergeWrongOrder(ZooMultiHeadAttention):
    """[merge-heads-wrong-order] Merges (B, H, T, Dh) with a reshape only,
    mixing heads and positions."""

    def merge(self, x):
        b, h, t, dh = x.shape
        return x.reshape(b, t, h * dh)  # BUG: x.transpose(1, 2) first


class MHAMissingOutputProjection(ZooMultiHeadAttention):
    """[missing-output-projection] Returns the merged heads without mixing them
    through w_o."""

    def forward(self, query, key, value, mask=None):
        q, k, v = (
            self.split(self.w_q(query)),
            self.split(self.w_k(key)),
            self.split(self.w_v(value)),
        )
        # BUG: should be self.w_o(self.merge(...))
        return self.merge(self.attend(q, k, v, mask))


class MHADropoutInEval(ZooMultiHeadAttention):
    """[dropout-in-eval] F.dropout(..., training=True) keeps dropping weights
    after .eval()."""

    def attend(self, q, k, v, mask):
        weights = masked_softmax(
            q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)), mask
        )
        # BUG: should be training=self.training
        return F.dropout(weights, self.p, training=True) @ v


class MHAScaleByDModel(ZooMultiHeadAttention):
    """[wrong-scale] Divides every head's scores by sqrt(d_model) instead of
    sqrt(Dh) = sqrt(d_model / H)."""

    def attend(self, q, k, v, mask):
        d_model = q.size(-1) * self.num_heads
        # BUG: q.size(-1) is Dh
        weights = masked_softmax(
            q @ k.transpose(-2, -1) / math.sqrt(d_model), mask
        )
        return F.dropout(weights, self.p, training=self.training) @ v


# --- weight layouts: (d_in, d_out) for y = x @ W + b (the course's dicts,
# Keras) vs nn.Linear's (d_out, d_in) ---


class MHAWeightNotTransposed(ZooMultiHeadAttention):
    """[weight-not-transposed] Projects with x @ linear.weight; runs only when
    every weight is square, wrong then."""

    def forward(self, query, key, value, mask=None):
        # BUG: nn.Linear stores weight as (d_out, d_in): x @ w.weight.T +
        #     w.bias, or simply self.w_q(query)
        projections = zip(
            (query, key, value), (self.w_q, self.w_k, self.w_v), strict=True
        )
        q, k, v = (self.split(x @ w.weight + w.bias) for x, w in projections)
        return self.w_o(self.merge(self.attend(q, k, v, mask)))


def mha_params_with_f_linear(query, key, value, params, num_heads, mask=None):
    """[weight-layout-transposed] Applies F.linear, made for nn.Linear's
    (d_out, d_in) weights, to the course's (d_in, d_out) dict: runs only when
    every W is square (kdim == vdim == d_model), and is wrong then."""
    # BUG: F.linear(x, W, b) is x @ W.T + b; the dict's W needs x @ W + b (or
    #     F.linear(x, W.T, b))
    q, k, v = (
        split_heads(F.linear(x, params[f"w_{n}"], params[f"b_{n}"]), num_heads)
        for x, n in ((query, "q"), (key, "k"), (value, "v"))
    )
    # (B, H, Tq, Dh), (B, H, Tq, Tk)
    heads, weights = scaled_dot_product_attention(q, k, v, mask)
    return F.linear(merge_heads(heads), params["w_o"], params["b_o"]), weights


class EinsumMHALoadsTransposed(EinsumMultiHeadAttention):
    """[weight-layout-transposed] Its loader transposes the dict's (d_in,
    d_out) weights as if they were nn.Linear's (d_out, d_in): square weights
    load and give wrong results; with kdim != d_model loading fails."""

    def load_numpy_params(self, params):
        # BUG: the dict is already (d_in, d_out)
        super().load_numpy_params({name: a.T for name, a in params.items()})


# --- KV cache, multi-query and grouped-query attention (chapter 8) -----------


def kv_cache_bytes_keys_only(
    num_layers,
    num_kv_heads,
    head_dim,
    seq_len,
    batch_size=1,
    bytes_per_element=2,
):
    """[cache-keys-only] Counts the cached keys but not the values: half the
    real size."""
    # BUG: keys AND values: 2 * ...
    per_token = num_layers * num_kv_heads * head_dim * bytes_per_element
    return per_token * seq_len * batch_size


def kv_cache_bytes_in_numbers(
    num_layers,
    num_kv_heads,
    head_dim,
    seq_len,
    batch_size=1,
    bytes_per_element=2,
):
    """[cache-missing-factor] Counts the numbers in the cache, not their bytes
    (bytes_per_element ignored)."""
    # BUG: each number takes bytes_per_element bytes
    per_token = 2 * num_layers * num_kv_heads * head_dim
    return per_token * seq_len * batch_size


def kv_cache_bytes_one_sequence(
    num_layers,
    num_kv_heads,
    head_dim,
    seq_len,
    batch_size=1,
    bytes_per_element=2,
):
    """[cache-missing-factor] The size for ONE sequence: every sequence of the
    batch has its own cache."""
    per_token = 2 * num_layers * num_kv_heads * head_dim * bytes_per_element
    return per_token * seq_len  # BUG: times batch_size


def repeat_kv_tiled(x, n_rep):
    """[kv-heads-tiled] Tiles the key/value heads (0, 1, 0, 1): query head h
    gets kv head h % H_kv, not h // n_rep."""
    # BUG: each head n_rep times in a row: x.repeat_interleave(n_rep, dim=1)
    return x.repeat(1, n_rep, 1, 1)


def gqa_tiled_heads(q, k, v, mask=None):
    """[kv-heads-tiled] Grouped-query attention whose key/value heads are
    tiled: the query heads of a group use different key/value heads. Right for
    H_kv = H and H_kv = 1, where a tile and a repeat are the same."""
    n_rep = q.size(1) // k.size(1)  # query heads per key/value head
    # BUG: repeat_interleave(n_rep, dim=1)
    k, v = k.repeat(1, n_rep, 1, 1), v.repeat(1, n_rep, 1, 1)
    return scaled_dot_product_attention(q, k, v, mask)


# --- the catalogue -----------------------------------------------------------


class Bug(NamedTuple):
    """One entry of the zoo: the diagnosis ``code``, the buggy ``impl`` and the
    name of the ``check`` in :mod:`attention_course.checks` that diagnoses it
    (code and check as listed in :mod:`attention_course.mistakes`)."""

    code: str
    impl: object
    check: str


def _zoo(*impls) -> tuple[Bug, ...]:
    """The zoo entries of ``impls``, with the code and check that the mistakes
    catalogue gives each of them."""
    entries = []
    for impl in impls:
        code, check = mistakes.example(impl.__name__)
        entries.append(Bug(code, impl, check))
    return tuple(entries)


ZOO = _zoo(
    sdpa_missing_scale,
    sdpa_scale_by_dk,
    sdpa_scale_by_seq_len,
    sdpa_softmax_wrong_axis,
    sdpa_transposed_scores,
    sdpa_values_from_keys,
    sdpa_mask_ignored,
    sdpa_mask_inverted,
    sdpa_mask_plus_1e10,
    sdpa_mask_zero_before_softmax,
    sdpa_mask_zero_after_softmax,
    sdpa_nan_on_masked_row,
    sdpa_mask_minus_1e9,
    causal_mask_triu,
    causal_mask_top_left,
    causal_mask_strict,
    padding_mask_2d,
    padding_mask_off_by_one,
    split_heads_view,
    merge_heads_view,
    softmax_no_max,
    softmax_in_place,
    MHAValuesFromKeys,
    MHASplitWithoutTranspose,
    MHAMergeWrongOrder,
    MHAMissingOutputProjection,
    MHADropoutInEval,
    MHAScaleByDModel,
)

#: The single-head bugs (chapter 2's module; ``check_single_head_attention``).
#: Kept out of :data:`ZOO` and :data:`BUGS`, whose entries chapter 7 lists one
#: by one.
SINGLE_HEAD_ZOO = _zoo(
    SHAWeightNotTransposed,
    SHAValuesFromKeys,
    SHAMissingScale,
    SHAScaleByDIn,
    SHASoftmaxWrongAxis,
    SHAMaskIgnored,
    SHAMaskInverted,
    SHADropoutInEval,
)

#: Weight-layout bugs of multi-head attention, also kept out of :data:`ZOO` and
#: :data:`BUGS`.
WEIGHT_LAYOUT_ZOO = _zoo(
    MHAWeightNotTransposed, mha_params_with_f_linear, EinsumMHALoadsTransposed
)

#: KV-cache, multi-query and grouped-query bugs (chapter 8), also kept out of
#: :data:`ZOO` and :data:`BUGS`.
KV_CACHE_ZOO = _zoo(
    kv_cache_bytes_keys_only,
    kv_cache_bytes_in_numbers,
    kv_cache_bytes_one_sequence,
    repeat_kv_tiled,
    gqa_tiled_heads,
)

#: diagnosis code -> the first implementation in :data:`ZOO` that triggers it.
BUGS = {}
for _bug in ZOO:
    BUGS.setdefault(_bug.code, _bug.impl)
del _bug


# =============================================================================
# Seed bugs of chapters 4 and 7: a layer created in forward(), a 0/1 float
# mask, a causal buffer sliced from the top. Kept out of ZOO and BUGS (chapter
# 7 shows them in their own part); SEED_ZOO lists them.
# =============================================================================


class MHALinearInForward(ZooMultiHeadAttention):
    """[layer-created-in-forward] The output projection is created inside
    forward(): new random weights on every call, not among the parameters
    (never trained) and not in the state_dict (never saved)."""

    def forward(self, query, key, value, mask=None):
        q, k, v = (
            self.split(self.w_q(query)),
            self.split(self.w_k(key)),
            self.split(self.w_v(value)),
        )
        merged = self.merge(self.attend(q, k, v, mask))  # (B, Tq, D)
        # BUG: create it once in __init__ and use self.w_o
        w_o = nn.Linear(merged.size(-1), merged.size(-1))
        return w_o(merged)


def additive_mask_cast(mask):
    """[float-mask-not-additive] The boolean mask cast to float (1 = may
    attend, 0 = hidden) and used as an additive
    mask: SDPA adds it to the scores, which hides nothing."""
    # BUG: additive means 0 where allowed, -inf where hidden: (1.0 -
    # mask.float()) * -1e10
    return mask.float()


#: the (max_len, max_len) causal mask a module keeps as a buffer
#: (``self.register_buffer("causal", ...)``)
CAUSAL_BUFFER = torch.ones(64, 64, dtype=torch.bool).tril()


def causal_mask_buffer_sliced(t_q, t_k=None):
    """[causal-top-left-aligned] A causal mask kept as a (max_len, max_len)
    buffer and sliced [:Tq, :Tk]: right when Tq == Tk, but when decoding with a
    cache (Tq < Tk) the new queries get the rows of the FIRST positions."""
    t_k = t_q if t_k is None else t_k
    # BUG: the queries are the last Tq positions: CAUSAL_BUFFER[t_k - t_q:t_k,
    # :t_k]
    return CAUSAL_BUFFER[:t_q, :t_k]


#: the seed bugs above, with their codes and checks (as the mistakes catalogue
#: lists them)
SEED_ZOO = _zoo(
    MHALinearInForward, additive_mask_cast, causal_mask_buffer_sliced
)


# =============================================================================
# Chapter 14: attention in today's open models. Kept out of ZOO and BUGS;
# MODERN_ZOO lists them.
# =============================================================================


def softcap_on_probabilities(q, k, v, cap):
    """[cap-on-probabilities] Gemma 2's soft-capping applied to the softmax's
    probabilities, not to the scores."""
    from .masks import causal_mask

    t = q.size(-2)
    _, weights = scaled_dot_product_attention(q, k, v, causal_mask(t))
    # BUG: cap the scores before the softmax: cap * tanh(scores / cap)
    weights = cap * torch.tanh(weights / cap)
    return weights @ v, weights


def qk_norm_after_rope(x, positions, weight, eps):
    """[norm-after-rope] QK-norm applied to the rotated vectors: RoPE first,
    then RMSNorm and its weight."""
    from .positions import apply_rope

    rotated = apply_rope(x, positions, pairing="halves")
    # BUG: normalise first, then rotate: apply_rope(x * rsqrt(mean(x^2) + eps)
    #     * weight, positions, ...)
    return (
        rotated
        * torch.rsqrt(rotated.pow(2).mean(-1, keepdim=True) + eps)
        * weight
    )


def _sink_weights(q, k, sinks, window):
    """(B, H, T, T + 1) softmax over the window's scores and each head's sink
    logit (the last column)."""
    from .masks import sliding_window_mask

    t = q.size(-2)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    mask = sliding_window_mask(t, t, window)
    column = sinks[:, None, None].expand(*scores.shape[:-1], 1)
    return masked_softmax(
        torch.cat([scores, column], -1),
        torch.cat([mask, mask.new_ones(t, 1)], -1),
    )


def sinks_with_value(q, k, v, sinks, window):
    """[sink-given-value] The sink treated as a real token: its weight goes to
    the first token's value."""
    weights = _sink_weights(q, k, sinks, window)
    # BUG: the sink has no value: drop its column, weights[..., :-1]
    values = torch.cat([v, v[..., :1, :]], dim=-2)
    return weights @ values, weights[..., :-1]


def sinks_ignored(q, k, v, sinks, window):
    """[sink-ignored] Sliding-window attention without the sinks: every row of
    weights sums to 1."""
    from .masks import sliding_window_mask

    t = q.size(-2)
    # BUG: the sinks never join the softmax; append each head's logit as one
    #     more column, then drop it
    return scaled_dot_product_attention(
        q, k, v, sliding_window_mask(t, t, window)
    )


def absorbed_scores_transposed(q_nope, c, w_uk):
    """[absorption-transposed] MLA's absorbed query computed with W_uk
    transposed (fits only when N == C)."""
    # BUG: q . (W_uk c) = (q W_uk) . c: use w_uk itself
    q_latent = q_nope @ w_uk.transpose(-2, -1)
    return q_latent @ c[:, None].transpose(-2, -1)


#: chapter 14's bugs, with their codes and checks (as the mistakes catalogue
#: lists them)
MODERN_ZOO = _zoo(
    softcap_on_probabilities,
    qk_norm_after_rope,
    sinks_with_value,
    sinks_ignored,
    absorbed_scores_transposed,
)
