"""Chapter 19's checks: right answers in several styles pass, planted wrong ones get their own codes (the tables
are run by tests/test_checks_planted.py)."""

from __future__ import annotations

import numpy as np
import torch

from attention_course import checks, sparse
from attention_course.checks.sparse import top_k_reference


def scores_loop(q, k, weights, scale):
    """One head at a time, in torch."""
    total = 0
    for h in range(q.size(1)):
        total = total + weights[:, h, :, None] * torch.relu(q[:, h] @ k[:, 0].transpose(-2, -1) * scale)
    return total


def scores_einsum(q, k, weights, scale):
    return torch.einsum("bhi,bhij->bij", weights, torch.einsum("bhid,bjd->bhij", q, k[:, 0]).mul(scale).relu())


def relu_after_weights(q, k, weights, scale):
    return torch.relu(torch.einsum("bhi,bhij->bij", weights, q @ k.transpose(-2, -1)) * scale)


def no_relu(q, k, weights, scale):
    return torch.einsum("bhi,bhij->bij", weights, q @ k.transpose(-2, -1)) * scale


def no_scale(q, k, weights, scale):
    return sparse.index_scores(q, k, weights, 1.0)


def top_k_numpy(scores, k):
    """A sort per row, in NumPy."""
    return top_k_reference(scores.numpy(), k)


def top_k_library(scores, k):
    return sparse.top_k_selection(scores, k)


def _ranked(scores):
    t_q, t_k = scores.shape[-2:]
    return scores.masked_fill(~torch.ones(t_q, t_k, dtype=torch.bool).tril(t_k - t_q), float("-inf"))


def top_k_not_causal(scores, k):
    chosen = scores.topk(min(k, scores.size(-1)), dim=-1).indices
    return torch.zeros_like(scores, dtype=torch.bool).scatter(-1, chosen, True)


def top_k_wrong_axis(scores, k):
    ranked = _ranked(scores)
    chosen = ranked.topk(min(k, scores.size(-2)), dim=-2).indices
    return torch.zeros_like(scores, dtype=torch.bool).scatter(-2, chosen, True) & (ranked > float("-inf"))


def top_k_one_more(scores, k):
    return sparse.top_k_selection(scores, k + 1)


def tied_rows_sorted(scores, k):
    ranked = _ranked(scores).sort(-1, descending=True).values
    if k >= scores.size(-1):
        return torch.zeros(scores.shape[:-1], dtype=torch.bool)
    seen = (ranked > float("-inf")).sum(-1)
    return (seen > k) & (ranked[..., k - 1] == ranked[..., k])


def tied_rows_loop(scores, k):
    out = np.zeros(scores.shape[:-1], dtype=bool)
    t_q, t_k = scores.shape[-2:]
    for b in range(scores.size(0)):
        for i in range(t_q):
            row = sorted(scores[b, i, : i + t_k - t_q + 1].tolist(), reverse=True)
            out[b, i] = len(row) > k and row[k - 1] == row[k]
    return out


def tied_never(scores, k):
    return torch.zeros(scores.shape[:-1], dtype=torch.bool)


def tied_anywhere(scores, k):
    t_q, t_k = scores.shape[-2:]
    out = torch.zeros(scores.shape[:-1], dtype=torch.bool)
    for b in range(scores.size(0)):
        for i in range(t_q):
            row = scores[b, i, : i + t_k - t_q + 1]
            out[b, i] = row.numel() > k and row.unique().numel() < row.numel()
    return out


def tied_not_causal(scores, k):
    ranked = scores.sort(-1, descending=True).values
    if k >= scores.size(-1):
        return torch.zeros(scores.shape[:-1], dtype=torch.bool)
    return ranked[..., k - 1] == ranked[..., k]


CORRECT = [
    (checks.check_index_scores, sparse.index_scores),
    (checks.check_index_scores, scores_loop),
    (checks.check_index_scores, scores_einsum),
    (checks.check_top_k_mask, top_k_library),
    (checks.check_top_k_mask, top_k_numpy),
    (checks.check_tied_rows, tied_rows_sorted),
    (checks.check_tied_rows, tied_rows_loop),
]
PLANTED = [
    (checks.check_index_scores, relu_after_weights, "relu-after-weights"),
    (checks.check_index_scores, no_relu, "index-no-relu"),
    (checks.check_index_scores, no_scale, "index-scale-missing"),
    (checks.check_top_k_mask, top_k_not_causal, "topk-not-causal"),
    (checks.check_top_k_mask, top_k_wrong_axis, "topk-wrong-axis"),
    (checks.check_top_k_mask, top_k_one_more, "topk-off-by-one"),
    (checks.check_tied_rows, tied_never, "ties-by-position"),
    (checks.check_tied_rows, tied_anywhere, "tie-anywhere"),
    (checks.check_tied_rows, tied_not_causal, "topk-not-causal"),
]
