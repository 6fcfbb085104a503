"""Chapter 15's checks: right mods pass (public and hidden cases, several styles); each planted mistake gets its code.

CORRECT and PLANTED are run by tests/test_checks_planted.py."""

import functools
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import AuxRequest, create_block_mask, flex_attention

from attention_course import checks, flex, functional, masks, positions
from attention_course.checks import flex as flex_checks
from attention_course.checks import hidden
from attention_course.checks.questions import QUESTIONS
from attention_course.masks import causal_mask

# ---------------------------------------------------------------- right answers, in several styles


def prefix_lm_mod(prefix, b, h, q_idx, kv_idx):
    return (kv_idx < prefix) | (kv_idx <= q_idx)


def prefix_lm_where(prefix, b, h, q_idx, kv_idx):
    return torch.where(kv_idx < prefix, True, q_idx >= kv_idx)


def prefix_lm_and(prefix, b, h, q_idx, kv_idx):  # "not (in the generated part and in the future)"
    return ~((kv_idx >= prefix) & (kv_idx > q_idx))


def document_mod(doc_ids, b, h, q_idx, kv_idx):
    return (doc_ids[b, q_idx] == doc_ids[b, kv_idx]) & (kv_idx <= q_idx)


def document_where(doc_ids, b, h, q_idx, kv_idx):
    query_doc, key_doc = doc_ids[b, q_idx], doc_ids[b, kv_idx]
    return torch.where(kv_idx <= q_idx, query_doc == key_doc, False)


def alibi_mod(slopes, score, b, h, q_idx, kv_idx):
    return score - slopes[h] * (q_idx - kv_idx).abs()


def alibi_where(slopes, score, b, h, q_idx, kv_idx):
    distance = torch.where(q_idx > kv_idx, q_idx - kv_idx, kv_idx - q_idx)
    return score + (-slopes[h]) * distance


def chunked_mod(chunk, b, h, q_idx, kv_idx):
    return (q_idx // chunk == kv_idx // chunk) & (kv_idx <= q_idx)


def chunked_start(chunk, b, h, q_idx, kv_idx):  # the key lies between its query's chunk start and the query
    start = q_idx - q_idx % chunk
    return (kv_idx >= start) & (kv_idx <= q_idx)


def chunked_where(chunk, b, h, q_idx, kv_idx):
    return torch.where(kv_idx > q_idx, False, torch.div(kv_idx, chunk, rounding_mode="floor") == q_idx // chunk)


def decode_mod(offset, window, b, h, q_idx, kv_idx):
    position = offset + q_idx
    return (kv_idx <= position) & (position - kv_idx < window)


def decode_between(offset, window, b, h, q_idx, kv_idx):  # Tq = 1: the one query stands at offset
    return (kv_idx > offset - window) & (kv_idx <= offset)


def doc_window_mod(doc_ids, window, b, h, q_idx, kv_idx):
    same_document = doc_ids[b, q_idx] == doc_ids[b, kv_idx]
    return same_document & (kv_idx <= q_idx) & (q_idx - kv_idx < window)


def doc_window_where(doc_ids, window, b, h, q_idx, kv_idx):  # the window first, then the documents
    near = (q_idx - kv_idx >= 0) & (q_idx - kv_idx <= window - 1)
    return torch.where(near, doc_ids[b, kv_idx] == doc_ids[b, q_idx], False)


def _flex_lse(q, k, v, window):
    """FlexAttention's output and natural-log lse, bottom-right causal within ``window`` keys (None: causal)."""
    t_q, t_k = q.size(-2), k.size(-2)
    reach = t_k if window is None else window

    def mask_mod(b, h, q_idx, kv_idx):
        distance = q_idx + (t_k - t_q) - kv_idx
        return (distance >= 0) & (distance < reach)

    blocks = create_block_mask(mask_mod, None, None, t_q, t_k, device="cpu")
    out, aux = flex_attention(q, k, v, block_mask=blocks, return_aux=AuxRequest(lse=True))
    return out, aux.lse  # (B, H, Tq, D), (B, H, Tq)


def sinks_sigmoid(q, k, v, sinks, window):
    out, lse = _flex_lse(q, k, v, window)
    return out * torch.sigmoid(lse - sinks[:, None])[..., None]


def sinks_logaddexp(q, k, v, sinks, window):  # rescale by exp(lse - lse_with_sink)
    out, lse = _flex_lse(q, k, v, window)
    with_sink = torch.logaddexp(lse, sinks.view(1, -1, 1).to(lse.dtype))
    return out * torch.exp(lse - with_sink).unsqueeze(-1)


# ---------------------------------------------------------------- wrong answers a student would write


def prefix_roles_swapped(prefix, b, h, q_idx, kv_idx):
    return (kv_idx < prefix) | (q_idx <= kv_idx)


def prefix_inclusive(prefix, b, h, q_idx, kv_idx):
    return (kv_idx <= prefix) | (kv_idx <= q_idx)


def prefix_strict_diagonal(prefix, b, h, q_idx, kv_idx):
    return (kv_idx < prefix) | (kv_idx < q_idx)


def prefix_forgets_causal(prefix, b, h, q_idx, kv_idx):
    return kv_idx < prefix


def document_key_twice(doc_ids, b, h, q_idx, kv_idx):
    return (doc_ids[b, kv_idx] == doc_ids[b, kv_idx]) & (kv_idx <= q_idx)


def document_first_row(doc_ids, b, h, q_idx, kv_idx):
    return (doc_ids[0, q_idx] == doc_ids[0, kv_idx]) & (kv_idx <= q_idx)


def document_roles_swapped(doc_ids, b, h, q_idx, kv_idx):
    return (doc_ids[b, q_idx] == doc_ids[b, kv_idx]) & (kv_idx >= q_idx)


def document_not_causal(doc_ids, b, h, q_idx, kv_idx):
    return doc_ids[b, q_idx] == doc_ids[b, kv_idx]


def chunked_not_causal(chunk, b, h, q_idx, kv_idx):
    return q_idx // chunk == kv_idx // chunk


def chunked_roles_swapped(chunk, b, h, q_idx, kv_idx):
    return (q_idx // chunk == kv_idx // chunk) & (kv_idx >= q_idx)


def chunked_as_window(chunk, b, h, q_idx, kv_idx):
    return (kv_idx <= q_idx) & (q_idx - kv_idx < chunk)


def chunked_wider(chunk, b, h, q_idx, kv_idx):  # "chunk = 3 means up to index 3"
    return (q_idx // (chunk + 1) == kv_idx // (chunk + 1)) & (kv_idx <= q_idx)


def chunked_early(chunk, b, h, q_idx, kv_idx):  # 1-based positions
    return ((q_idx + 1) // chunk == (kv_idx + 1) // chunk) & (kv_idx <= q_idx)


def chunked_start_strict(chunk, b, h, q_idx, kv_idx):  # the chunk's first key left out
    start = q_idx - q_idx % chunk
    return (kv_idx > start) & (kv_idx <= q_idx)


def decode_offset_ignored(offset, window, b, h, q_idx, kv_idx):
    return (kv_idx <= q_idx) & (q_idx - kv_idx < window)


def decode_one_late(offset, window, b, h, q_idx, kv_idx):  # "the new token comes after the offset cached keys"
    position = offset + 1 + q_idx
    return (kv_idx <= position) & (position - kv_idx < window)


def decode_window_inclusive(offset, window, b, h, q_idx, kv_idx):
    position = offset + q_idx
    return (kv_idx <= position) & (position - kv_idx <= window)


def decode_reads_empty(offset, window, b, h, q_idx, kv_idx):
    return offset + q_idx - kv_idx < window


def decode_no_window(offset, window, b, h, q_idx, kv_idx):
    return kv_idx <= offset + q_idx


def doc_window_or(doc_ids, window, b, h, q_idx, kv_idx):
    return document_mod(doc_ids, b, h, q_idx, kv_idx) | ((kv_idx <= q_idx) & (q_idx - kv_idx < window))


def doc_window_inclusive(doc_ids, window, b, h, q_idx, kv_idx):
    return document_mod(doc_ids, b, h, q_idx, kv_idx) & (q_idx - kv_idx <= window)


def doc_window_sorted(doc_ids, window, b, h, q_idx, kv_idx):
    later_doc = doc_ids[b, kv_idx] >= doc_ids[b, q_idx]
    return later_doc & (kv_idx <= q_idx) & (q_idx - kv_idx < window)


def doc_window_no_window(doc_ids, window, b, h, q_idx, kv_idx):
    return document_mod(doc_ids, b, h, q_idx, kv_idx)


def doc_window_library(doc_ids, window, b, h, q_idx, kv_idx):
    return masks.document(doc_ids)(b, h, q_idx, kv_idx) & (q_idx - kv_idx < window)


def sinks_in_numerator(q, k, v, sinks, window):
    out, lse = _flex_lse(q, k, v, window)
    return out * (1 + torch.exp(sinks[:, None] - lse))[..., None]


def sinks_base_2(q, k, v, sinks, window):  # "the kernel works in base 2": lse converted to natural log again
    out, lse = _flex_lse(q, k, v, window)
    return out * torch.sigmoid(lse * math.log(2) - sinks[:, None])[..., None]


def sinks_per_query(q, k, v, sinks, window):
    out, lse = _flex_lse(q, k, v, window)
    return out * torch.sigmoid(lse - sinks)[..., None]  # (H,) against (B, H, Tq): the last axis, the queries


def sinks_twice(q, k, v, sinks, window):
    out, lse = _flex_lse(q, k, v, window)
    keep = torch.sigmoid(lse - sinks[:, None])[..., None]
    return out * keep * keep


def sinks_ignored(q, k, v, sinks, window):
    return _flex_lse(q, k, v, window)[0]


def _bottom_right(t_q, t_k, window):
    """(Tq, Tk) bool: bottom-right causal within ``window`` keys (None: all)."""
    distance = torch.arange(t_q)[:, None] + (t_k - t_q) - torch.arange(t_k)[None, :]
    return (distance >= 0) & (distance < (t_k if window is None else window))


def sinks_as_column(q, k, v, sinks, window):  # chapter 14's road: the sink a column of the scores, then softmax
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, H, Tq, Tk)
    scores = scores.masked_fill(~_bottom_right(q.size(-2), k.size(-2), window), float("-inf"))
    column = sinks.view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)  # (B, H, Tq, 1)
    weights = torch.softmax(torch.cat([scores, column], dim=-1), dim=-1)[..., :-1]
    return weights @ v


def sinks_column_after_flex(q, k, v, sinks, window):  # asks FlexAttention for its lse, then takes the column road
    _flex_lse(q, k, v, window)
    return sinks_as_column(q, k, v, sinks, window)


def sinks_sdpa_extra_key(q, k, v, sinks, window):  # SDPA with one more key: score = the sink, value 0
    b, h, t_q, _ = q.shape
    mask = torch.zeros(b, h, t_q, k.size(-2), dtype=q.dtype)  # (B, H, Tq, Tk) float: 0 or -inf
    mask = mask.masked_fill(~_bottom_right(t_q, k.size(-2), window), float("-inf"))
    scale = 1 / math.sqrt(q.size(-1))
    sink_bias = sinks.view(1, -1, 1, 1).expand(b, h, t_q, 1).to(q.dtype)  # the sink key's score, q . 0 = 0 + bias
    zero = torch.zeros(b, h, 1, q.size(-1), dtype=q.dtype)
    return F.scaled_dot_product_attention(q, torch.cat([k, zero], -2), torch.cat([v, zero], -2),
                                          attn_mask=torch.cat([mask, sink_bias], -1), scale=scale)


def sinks_library(q, k, v, sinks, window):  # the library's add_sinks on FlexAttention's output and lse
    out, lse = _flex_lse(q, k, v, window)
    return functional.add_sinks(sinks, out, None, lse)[0]


def sinks_lse_by_hand(q, k, v, sinks, window):  # the right rescaling, but the lse computed without FlexAttention
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    scores = scores.masked_fill(~_bottom_right(q.size(-2), k.size(-2), window), float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)  # (B, H, Tq)
    out = torch.softmax(scores, dim=-1) @ v
    return out * torch.sigmoid(lse - sinks[:, None])[..., None]


def sinks_ignoring_lse(q, k, v, sinks, window):  # FlexAttention's output, the lse never asked for: no sink
    t_q, t_k = q.size(-2), k.size(-2)
    reach = t_k if window is None else window

    def mask_mod(b, h, q_idx, kv_idx):
        distance = q_idx + (t_k - t_q) - kv_idx
        return (distance >= 0) & (distance < reach)

    return flex_attention(q, k, v, block_mask=create_block_mask(mask_mod, None, None, t_q, t_k, device="cpu"))


def sinks_lse_by_hand_after_flex(q, k, v, sinks, window):  # asks FlexAttention for its lse, then its own
    _flex_lse(q, k, v, window)
    return sinks_lse_by_hand(q, k, v, sinks, window)


def sinks_sdpa_after_flex(q, k, v, sinks, window):  # FlexAttention's lse, SDPA's output
    _, lse = _flex_lse(q, k, v, window)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=_bottom_right(q.size(-2), k.size(-2), window))
    return out * torch.sigmoid(lse - sinks[:, None])[..., None]


def sinks_in_numpy(q, k, v, sinks, window):  # the right answer, computed where the check cannot watch
    out, lse = _flex_lse(q, k, v, window)
    keep = 1 / (1 + np.exp(sinks.numpy()[:, None] - lse.numpy()))
    return torch.from_numpy(out.numpy() * keep[..., None])


def chunked_library(chunk, b, h, q_idx, kv_idx):
    return masks.chunked(chunk, 64)(b, h, q_idx, kv_idx)


def prefix_lm_library(prefix, b, h, q_idx, kv_idx):  # the library's mod, which the notebook forbids
    return flex.prefix_lm(prefix, 64)(b, h, q_idx, kv_idx)


def document_library(doc_ids, b, h, q_idx, kv_idx):
    return flex.document(doc_ids)(b, h, q_idx, kv_idx)


def prefix_reads_length(prefix, b, h, q_idx, kv_idx):  # right on the grid; .item() inside vmap
    last = int(q_idx.max())
    return (kv_idx < prefix) | ((kv_idx <= q_idx) & (q_idx <= last))


def prefix_reads_shape(prefix, b, h, q_idx, kv_idx):  # right on the grid; a 0-dim index has no axis 2
    return (kv_idx < min(prefix, q_idx.shape[2])) | (kv_idx <= q_idx)


def document_ids_in_order(doc_ids, b, h, q_idx, kv_idx):  # right while the ids rise along the row
    return (doc_ids[b, kv_idx] >= doc_ids[b, q_idx]) & (kv_idx <= q_idx)


def document_ids_at_most(doc_ids, b, h, q_idx, kv_idx):  # right while the ids fall along the row
    return (doc_ids[b, kv_idx] <= doc_ids[b, q_idx]) & (kv_idx <= q_idx)


def alibi_heads_by_broadcast(slopes, score, b, h, q_idx, kv_idx):  # ignores h: the grid's head axis does it
    return score - slopes.view(-1, 1, 1) * (q_idx - kv_idx).abs()


def alibi_plus(slopes, score, b, h, q_idx, kv_idx):
    return score + slopes[h] * (q_idx - kv_idx).abs()


def alibi_plus_where(slopes, score, b, h, q_idx, kv_idx):
    return score + slopes[h] * torch.where(q_idx > kv_idx, q_idx - kv_idx, kv_idx - q_idx)


def alibi_no_abs(slopes, score, b, h, q_idx, kv_idx):
    return score - slopes[h] * (q_idx - kv_idx)


def alibi_one_slope(slopes, score, b, h, q_idx, kv_idx):
    return score - slopes[0] * (q_idx - kv_idx).abs()


CORRECT = [
    (checks.check_prefix_lm_mask, prefix_lm_mod),
    (checks.check_prefix_lm_mask, prefix_lm_where),
    (checks.check_prefix_lm_mask, prefix_lm_and),
    (checks.check_document_mask, document_mod),
    (checks.check_document_mask, document_where),
    (checks.check_alibi_score_mod, alibi_mod),
    (checks.check_alibi_score_mod, alibi_where),
    (checks.check_chunked_mask, chunked_mod),
    (checks.check_chunked_mask, chunked_start),
    (checks.check_chunked_mask, chunked_where),
    (checks.check_decode_mask, decode_mod),
    (checks.check_decode_mask, decode_between),
    (checks.check_doc_window_mask, doc_window_mod),
    (checks.check_doc_window_mask, doc_window_where),
    (checks.check_sinks_from_lse, sinks_sigmoid),
    (checks.check_sinks_from_lse, sinks_logaddexp),
]

PLANTED = [
    (checks.check_prefix_lm_mask, prefix_roles_swapped, "mod-roles-swapped"),
    (checks.check_prefix_lm_mask, prefix_inclusive, "mod-window-off-by-one"),
    (checks.check_prefix_lm_mask, prefix_strict_diagonal, "mod-window-off-by-one"),
    (checks.check_prefix_lm_mask, prefix_forgets_causal, "wrong-output"),
    (checks.check_document_mask, document_key_twice, "doc-id-wrong-index"),
    (checks.check_document_mask, document_first_row, "doc-id-wrong-index"),
    (checks.check_document_mask, document_roles_swapped, "mod-roles-swapped"),
    (checks.check_document_mask, document_not_causal, "wrong-output"),
    (checks.check_alibi_score_mod, alibi_plus, "bias-sign-flipped"),
    (checks.check_alibi_score_mod, alibi_plus_where, "bias-sign-flipped"),
    (checks.check_alibi_score_mod, alibi_no_abs, "wrong-output"),
    (checks.check_alibi_score_mod, alibi_one_slope, "wrong-output"),
    # the notebook's rule, the mods run by FlexAttention itself, ids in no order (issue 42)
    (checks.check_prefix_lm_mask, prefix_lm_library, "mod-from-library"),
    (checks.check_document_mask, document_library, "mod-from-library"),
    (checks.check_prefix_lm_mask, prefix_reads_length, "mod-fails-in-flex"),
    (checks.check_prefix_lm_mask, prefix_reads_shape, "mod-fails-in-flex"),
    (checks.check_alibi_score_mod, alibi_heads_by_broadcast, "mod-fails-in-flex"),
    (checks.check_document_mask, document_ids_in_order, "doc-ids-assumed-sorted"),
    (checks.check_document_mask, document_ids_at_most, "doc-ids-assumed-sorted"),
    # Llama 4's chunked attention (issue 43)
    (checks.check_chunked_mask, chunked_not_causal, "chunk-not-causal"),
    (checks.check_chunked_mask, chunked_roles_swapped, "mod-roles-swapped"),
    (checks.check_chunked_mask, chunked_as_window, "chunk-is-window"),
    (checks.check_chunked_mask, chunked_wider, "chunk-boundary-off-by-one"),
    (checks.check_chunked_mask, chunked_early, "chunk-boundary-off-by-one"),
    (checks.check_chunked_mask, chunked_start_strict, "wrong-output"),
    (checks.check_chunked_mask, chunked_library, "mod-from-library"),
    # a decode step's mask with a captured offset (issue 43)
    (checks.check_decode_mask, decode_offset_ignored, "decode-offset-ignored"),
    (checks.check_decode_mask, decode_one_late, "decode-offset-off-by-one"),
    (checks.check_decode_mask, decode_window_inclusive, "mod-window-off-by-one"),
    (checks.check_decode_mask, decode_reads_empty, "decode-reads-empty-slots"),
    (checks.check_decode_mask, decode_no_window, "wrong-output"),
    # documents and a window (issue 43)
    (checks.check_doc_window_mask, doc_window_or, "masks-or-not-and"),
    (checks.check_doc_window_mask, doc_window_inclusive, "mod-window-off-by-one"),
    (checks.check_doc_window_mask, doc_window_sorted, "doc-ids-assumed-sorted"),
    (checks.check_doc_window_mask, doc_window_no_window, "mask-term-missing"),
    (checks.check_doc_window_mask, doc_window_library, "mod-from-library"),
    # sinks from FlexAttention's log-sum-exp (issue 43)
    (checks.check_sinks_from_lse, sinks_in_numerator, "sink-in-numerator"),
    (checks.check_sinks_from_lse, sinks_base_2, "lse-wrong-base"),
    (checks.check_sinks_from_lse, sinks_per_query, "sinks-per-query"),
    (checks.check_sinks_from_lse, sinks_twice, "sink-renormalised-twice"),
    (checks.check_sinks_from_lse, sinks_ignored, "wrong-output"),
    # the exercise's rule, from the lse and not as a column, observed (issue 43 follow-up)
    (checks.check_sinks_from_lse, sinks_as_column, "sink-as-column"),
    (checks.check_sinks_from_lse, sinks_column_after_flex, "sink-as-column"),
    (checks.check_sinks_from_lse, sinks_sdpa_extra_key, "sink-as-column"),
    (checks.check_sinks_from_lse, sinks_library, "sinks-from-library"),
    (checks.check_sinks_from_lse, sinks_lse_by_hand, "scores-outside-flex"),
    (checks.check_sinks_from_lse, sinks_lse_by_hand_after_flex, "scores-outside-flex"),
    (checks.check_sinks_from_lse, sinks_sdpa_after_flex, "scores-outside-flex"),
    (checks.check_sinks_from_lse, sinks_ignoring_lse, "lse-not-requested"),
    (checks.check_sinks_from_lse, sinks_in_numpy, "left-torch"),
]


def _code(check, fn):
    with pytest.raises(checks.CheckFailed) as info:
        check(fn)
    return info.value.code


@pytest.mark.parametrize("check, fn", CORRECT[::2] + CORRECT[1::2][:1])
@pytest.mark.parametrize("seed", [0, 7])
def test_right_mods_pass_the_hidden_cases(check, fn, seed, capsys):
    with hidden.drawn_from(seed):
        check(fn)
    assert capsys.readouterr().out.startswith("✓ ")


def test_hidden_cases_catch_a_mod_that_only_works_on_few_heads():
    def few_heads_only(slopes, score, b, h, q_idx, kv_idx):
        return alibi_mod(slopes if len(slopes) <= 4 else slopes[:1].expand(len(slopes)), score, b, h, q_idx, kv_idx)

    checks.check_alibi_score_mod(few_heads_only)  # the public cases have 1 to 4 heads
    with hidden.drawn_from(3):
        assert all(h >= 5 and b >= 5 for b, h, _ in hidden.flex_sizes())
        assert _code(checks.check_alibi_score_mod, few_heads_only) == "wrong-output"


def test_the_chunked_mod_equals_the_librarys():
    mine = flex.block_mask(functools.partial(chunked_mod, 4), 12, block_size=4)
    library = flex.block_mask(masks.chunked(4, 12), 12, block_size=4)
    assert torch.equal(flex.tile_states(mine), flex.tile_states(library))


def test_the_mods_work_inside_flex_attention():
    """The right answers, bound to their data with partial, are real mask_mods and score_mods."""
    t, h = 12, 3
    doc_ids = torch.tensor([[0, 0, 0, 0, 1, 1, 1, 2, 2, 2, 2, 2]])
    q, k, v = (torch.randn(1, h, t, 8, generator=torch.Generator().manual_seed(i)) for i in range(3))
    document_blocks = flex.block_mask(functools.partial(document_mod, doc_ids), t, block_size=4, batch=1)
    prefix_blocks = flex.block_mask(functools.partial(prefix_lm_mod, 5), t, block_size=4)
    library = {"document": flex.block_mask(flex.document(doc_ids), t, block_size=4, batch=1),
               "prefix": flex.block_mask(flex.prefix_lm(5, t), t, block_size=4)}
    assert torch.equal(flex.tile_states(document_blocks), flex.tile_states(library["document"]))
    assert torch.equal(flex.tile_states(prefix_blocks), flex.tile_states(library["prefix"]))
    slopes = positions.alibi_slopes(h)
    ours = flex.attention(q, k, v, block_mask=flex.block_mask(flex.causal(t), t, block_size=4),
                          score_mod=functools.partial(alibi_mod, slopes))
    ref = positions.attention_with_bias(q, k, v, positions.alibi_bias(h, t), causal_mask(t))[0]
    assert (ours - ref).abs().max() < 1e-5


def test_messages_name_the_case_and_the_pair():
    with pytest.raises(checks.CheckFailed) as info:
        checks.check_prefix_lm_mask(prefix_forgets_causal)
    assert "Failing case: case 1 of 4" in str(info.value) and "query" in str(info.value)


def test_bad_results_get_clear_codes():
    assert _code(checks.check_prefix_lm_mask, lambda p, b, h, q, kv: (kv < p).float()) == "wrong-type"
    assert _code(checks.check_prefix_lm_mask, lambda p, b, h, q, kv: (kv <= q)[..., :2]) == "wrong-shape"
    assert _code(checks.check_alibi_score_mod, lambda s, x, b, h, q, kv: x[..., 0]) == "wrong-shape"
    assert _code(checks.check_document_mask, lambda d, b, h, q, kv: None) == "returned-none"


def test_a_python_if_on_the_indices_is_a_clear_error():
    def branching(prefix, b, h, q_idx, kv_idx):
        if kv_idx < prefix:
            return True
        return kv_idx <= q_idx

    assert _code(checks.check_prefix_lm_mask, branching) == "raised-exception"


def test_questions_match_the_library():
    bm = flex.block_mask(flex.sliding_window(16, 128), 128, block_size=16)
    assert QUESTIONS["15.sparsity"].answer() == pytest.approx(bm.sparsity()) == pytest.approx(100 * 49 / 64)
    assert flex.tiles_computed(bm) == 15
    assert QUESTIONS["15.recompile"].answer == "B"


def test_the_tile_question_matches_create_block_mask():
    """The answer of 15.doc-window-tiles (chapter 9's count on the reference mask) is what the real
    create_block_mask computes for the right mod; its known wrong counts all differ from it and from each other."""
    case = flex_checks.DOC_WINDOW_CASE
    ids = flex_checks.doc_window_ids()
    bm = flex.block_mask(functools.partial(doc_window_mod, ids, case["window"]), ids.size(-1),
                         block_size=case["block"], batch=1)
    assert flex.tiles_computed(bm) == QUESTIONS["15.doc-window-tiles"].answer() == 19
    known = QUESTIONS["15.doc-window-tiles"].known()
    assert len(known) == 7 and 19 not in known
    assert int((flex.tile_states(bm) == 2).sum()) in known  # the partial tiles counted as skipped


def test_a_mod_whose_block_mask_differs_fails_in_flex(monkeypatch):
    monkeypatch.setattr(flex_checks, "doc_window_tiles", lambda: 18)
    assert _code(checks.check_doc_window_mask, doc_window_mod) == "mod-fails-in-flex"


def test_the_sink_reference_is_the_librarys_add_sinks():
    """The check's float64 NumPy (a sink column in the softmax) equals functional.add_sinks on the output and lse of
    attention without the sink, with a window and Tq != Tk."""
    import numpy as np

    from attention_course import functional

    rng = np.random.default_rng(0)
    q, k, v, sinks = rng.standard_normal((2, 3, 4, 8)), rng.standard_normal((2, 3, 9, 8)), \
        rng.standard_normal((2, 3, 9, 8)), rng.standard_normal(3)
    out, lse = _flex_lse(*(torch.from_numpy(x) for x in (q, k, v)), 3)
    ours = functional.add_sinks(torch.from_numpy(sinks), out, None, lse)[0]
    ref = flex_checks.sink_reference(q, k, v, sinks, 3)
    assert np.allclose(ours.numpy(), ref, atol=1e-12)


def sinks_few_heads_only(q, k, v, sinks, window):  # one sink for all heads once there are more than 4
    out, lse = _flex_lse(q, k, v, window)
    sink = sinks[:, None] if sinks.numel() <= 4 else sinks[:1, None].expand(sinks.numel(), 1)
    return out * torch.sigmoid(lse - sink)[..., None]


@pytest.mark.parametrize("seed", [0, 7])
def test_hidden_sink_cases_catch_an_answer_fitted_to_few_heads(seed, capsys):
    checks.check_sinks_from_lse(sinks_few_heads_only)  # the public cases have 1 to 4 heads
    with hidden.drawn_from(seed):
        cases = hidden.sink_lse_cases()
        assert any(window is None for *_, window in cases) and any(window is not None for *_, window in cases)
        for b, h, t_q, t_k, d, _ in cases:  # the column the check watches for is a length no other axis has
            assert h >= 5 and t_q < t_k and t_k + 1 not in (b, h, t_q, t_k, d)
        assert _code(checks.check_sinks_from_lse, sinks_few_heads_only) == "wrong-output"
        checks.check_sinks_from_lse(sinks_sigmoid)
    assert capsys.readouterr().out.count("✓ ") == 2


def test_the_sink_watchers_report_from_the_sandbox():
    """What the grader's sandbox sees travels back as data (observe.run_observed, observe.absorb): the lse request
    of each flex_attention call and the first widened tensor."""
    from attention_course.checks import observe

    q = torch.randn(1, 2, 3, 4, dtype=torch.float64)
    k = torch.randn(1, 2, 5, 4, dtype=torch.float64)
    specs = [observe.FlexCalls().spec(), observe.OutsideFlex(6, (3, 5, 4)).spec()]
    _, seen = observe.run_observed(specs, lambda: sinks_column_after_flex(q, k, k, torch.zeros(2), None))
    here = [observe.FlexCalls(), observe.OutsideFlex(6, (3, 5, 4))]
    with here[0], here[1]:
        observe.absorb(seen)
    assert here[0].calls == [True] and here[1].widened == "(1, 2, 3, 6)" and here[1].scores.endswith(", 3, 5)")
    with pytest.raises(ValueError), observe.FlexCalls():
        observe.absorb([{"calls": ["yes"]}])


def test_the_eager_switch_is_restored_after_overlapping_checks_and_errors():
    """The checks run FlexAttention eagerly by setting PyTorch's module global: overlapping uses (two threads, or a
    check inside a check) keep it set until the last one leaves, then put back what was there, also after an error."""
    import threading

    from torch.nn.attention import flex_attention as module

    switch = flex_checks._EAGER_FLEX
    before = module._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG
    inside, leave = threading.Event(), threading.Event()

    def other_check():
        with switch:
            inside.set()
            leave.wait(10)

    worker = threading.Thread(target=other_check)
    with switch:  # this check enters first ...
        worker.start()
        assert inside.wait(10)
    # ... and leaves while the other still runs: the switch stays on for it
    assert module._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG is True
    leave.set()
    worker.join(10)
    assert module._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG == before
    with pytest.raises(RuntimeError, match="a mod that raised"), switch, switch:
        assert module._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG is True
        raise RuntimeError("a mod that raised")
    assert module._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG == before and switch._users == 0
