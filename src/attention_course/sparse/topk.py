"""Top-k selection as a mask function: each query may attend to the k keys the
indexer scored highest, among the keys the causal mask allows. Being a mask
function of the course's vocabulary (:mod:`attention_course.masks`), it is
materialised, combined with :func:`~attention_course.masks.and_masks` and cut
into tiles (:func:`~attention_course.tiles.tile_states`) like any other.

Ties: ``torch.topk`` picks among equal scores in an order of its own that
changes with the length of the row, so a query with fewer than k positive
scores (the ReLU makes many exactly 0) may pick different keys in one forward
over T tokens than in a decode step over the same T keys.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..masks import MaskMod, causal_mask
from ..validation import check_int, check_rank


def top_k_selection(
    scores: Tensor, k: int, allowed: Tensor | None = None
) -> Tensor:
    """scores (B, Tq, Tk) -> boolean (B, Tq, Tk): True at each query's k
    highest-scoring allowed keys.

    ``allowed`` (Tq, Tk) or (B, Tq, Tk), True = may attend, default the
    bottom-right causal mask. A query that may see k keys or fewer keeps all of
    them (k larger than the context is no error)."""
    check_rank(scores, "scores", 3, "(B, Tq, Tk)")
    check_int(k, "k")
    t_q, t_k = scores.shape[-2:]
    allowed = (
        causal_mask(t_q, t_k, device=scores.device)
        if allowed is None
        else allowed
    )
    # a hidden key ranks last
    ranked = scores.masked_fill(~allowed, float("-inf"))
    chosen = ranked.topk(min(k, t_k), dim=-1).indices  # (B, Tq, k)
    selected = torch.zeros_like(ranked, dtype=torch.bool).scatter(
        -1, chosen, True
    )
    # when fewer than k keys are allowed, topk also returned hidden ones
    return selected & allowed


def top_k(scores: Tensor, k: int, allowed: Tensor | None = None) -> MaskMod:
    """The mask function of :func:`top_k_selection`: query i may attend key j
    iff j is among its top k."""
    selected = top_k_selection(scores, k, allowed)  # (B, Tq, Tk)

    def top_k_mod(b, h, q_idx, kv_idx):
        return selected[b, q_idx, kv_idx]

    return top_k_mod
