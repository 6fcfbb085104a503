"""The catalogue of attention mistakes: one entry per diagnosis code, in one place.

Each :class:`Mistake` has the ``code`` a check reports (``[missing-scale] ...``), a one-line ``description``,
the ``hint`` the check prints by default (a template: ``{detail}`` is filled in by the check; empty when every
check writes its own message), the ``chapter`` that teaches it (None: any check may report it), the ``topic``
(the :mod:`attention_course.checks` module that diagnoses it) and ``examples``: the deliberately wrong
implementations of :mod:`attention_course.bug_zoo` that commit it, each with the check that diagnoses it.

Readers of the catalogue: the checks (codes and hints: :func:`hint`), :mod:`attention_course.bug_zoo` (each zoo
entry's code and check), the tests (every example is diagnosed with its code) and chapter 7.

Adding a mistake: call :func:`mistake` in the section of your chapter below (a new chapter adds its own section at
the end), with a code that is new, then make a checker report it and plant it in a test.

What a check must prove (a check a student can pass without doing the exercise is a broken promise):

* **training and evaluation mode**: anything with dropout is probed in both: deterministic after ``.eval()``, and
  in ``.train()`` dropping the right tensor at the module's rate (``[dropout-off-in-training]``,
  ``[dropout-wrong-rate]``, ``[dropout-wrong-tensor]``; blocks: ``[branch-dropout-off]``,
  ``[dropout-not-on-branch]``), read back from what the module computed;
* **measured, not reported**: a number about the student's own work (tiles computed, bytes stored) is counted by the
  check (:mod:`attention_course.checks.observe`), never taken from the student's return value;
* **the prompt's rules**: a rule the exercise states ("the float mask, not the boolean one", "without forming the
  keys") is enforced by observing the call, the dtype, the storage or the tensors created, or it is not stated;
* **independent of the installed kernel**: a guard the chapter teaches (a row that may attend nothing) is exercised
  even where this PyTorch version would hide its absence (inside the checks the fused kernel returns NaN there);
* **at the scale of the instability**: inputs large enough for the taught failure to show (scores of about 1000
  for a softmax or a merge without its maximum, maxima that rise for a merge without its rescale, a block in which
  every key is masked for a merge without its -inf guard);
* **named**: each plausible wrong answer gets its own code from this catalogue, not ``[wrong-output]``, and hints
  name the symptom and the diagnosis and point at the chapter's section, without dictating the fix (find-the-bug
  exercises show them).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from types import MappingProxyType
from typing import NamedTuple


class Example(NamedTuple):
    """A bug_zoo implementation that commits a mistake: its ``impl`` name in :mod:`attention_course.bug_zoo` and the
    ``check`` (a function name of :mod:`attention_course.checks`) that diagnoses it."""

    impl: str
    check: str


@dataclass(frozen=True)
class Mistake:
    code: str
    description: str
    hint: str = ""
    chapter: int | None = None
    topic: str = "runner"
    examples: tuple[Example, ...] = ()


#: code -> Mistake, in the order of the sections below.
MISTAKES: dict[str, Mistake] = {}
_DESCRIPTIONS: dict[str, str] = {}
#: code -> one-line description of every code a check can report (a read-only, always up-to-date view).
CODES = MappingProxyType(_DESCRIPTIONS)
_EXAMPLES: dict[str, tuple[str, str]] = {}  # bug_zoo name -> (code, check)
_CODE = re.compile(r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$")
_MESSAGE_CODE = re.compile(r"^\[([A-Za-z0-9_-]+)\]\s*")  # a diagnosis code at the start of a message


def split_code(message: str) -> tuple[str | None, str]:
    """``("missing-scale", "the rest")`` for ``"[missing-scale] the rest"``; ``(None, message)`` without a code.
    The one reader of a message's code (the checks, the grader's verdicts and hints)."""
    match = _MESSAGE_CODE.match(message)
    return (match.group(1), message[match.end():]) if match else (None, message)


def mistake(code: str, description: str, hint: str = "", *, chapter: int | None = None, topic: str = "runner",
            examples: tuple[tuple[str, str], ...] = ()) -> Mistake:
    """Add a mistake to the catalogue; ``examples`` are (bug_zoo name, check name) pairs."""
    if not isinstance(code, str) or not _CODE.match(code):
        raise ValueError(f"code must be lower-case words joined by '-', e.g. 'missing-scale', got {code!r}")
    if code in MISTAKES:
        raise ValueError(f"code {code!r} is already in the catalogue")
    if not description or "\n" in description:
        raise ValueError(f"description of {code!r} must be one non-empty line")
    entry = Mistake(code, description, hint, chapter, topic, tuple(Example(*e) for e in examples))
    for example in entry.examples:
        if example.impl in _EXAMPLES:
            raise ValueError(f"bug_zoo.{example.impl} is already an example of [{_EXAMPLES[example.impl][0]}]")
    MISTAKES[code] = entry
    _DESCRIPTIONS[code] = description
    _EXAMPLES.update({e.impl: (code, e.check) for e in entry.examples})
    return entry


def hint(code: str, detail: str = "") -> str:
    """The default message of ``code`` with ``{detail}`` filled in."""
    entry = MISTAKES[code]
    if not entry.hint:
        raise ValueError(f"[{code}] has no default hint: the check must write its message")
    return entry.hint.format(detail=detail)


def example(impl_name: str) -> tuple[str, str]:
    """(code, check name) of the bug_zoo implementation ``impl_name``."""
    try:
        return _EXAMPLES[impl_name]
    except KeyError:
        raise ValueError(f"bug_zoo.{impl_name} is the example of no mistake in the catalogue") from None


def in_chapter(chapter: int) -> list[Mistake]:
    """The mistakes a chapter teaches, in catalogue order."""
    return [m for m in MISTAKES.values() if m.chapter == chapter]


_SDPA = "check_scaled_dot_product_attention"
_MHA = "check_multi_head_attention"
_SHA = "check_single_head_attention"

# ==================================================================================================================
# Any check: running the student's code, the kind and shape of its result
# ==================================================================================================================

mistake("wrong-shape", "the result has the wrong shape", examples=[("padding_mask_2d", "check_padding_mask")])
mistake("wrong-type", "the result is not an array/tensor of the expected kind (or has the wrong dtype)")
mistake("returned-none", "the function returned None (missing return statement)",
        "Your function returned None: did you forget the `return` statement?")
mistake("not-implemented", "the function still raises NotImplementedError")
mistake("raised-exception", "the function raised an exception")
mistake("timeout", "the function did not return within the time limit")
mistake("calls-reference", "the implementation calls the reference (the library, SDPA, nn.MultiheadAttention, "
        "Keras MultiHeadAttention) or hides or inspects what it calls (grader only)")
mistake("sandbox-ended", "the submission's process stopped answering while its function was checked (grader only)")
mistake("not-run", "the check cell never ran: the notebook stopped before it (grader only)")
mistake("left-torch", "code that moves its inputs to NumPy or Python lists where the check watches torch",
        "Your code converted a tensor with {detail}: this exercise's rule (what may be formed, how it is computed) "
        "is checked by watching the torch operations your code runs, and NumPy or Python lists are out of that "
        "sight. Keep the computation in torch (the inputs are torch tensors).")
mistake("mutates-input", "the function modified one of its input arrays in place",
        "Your function changed its input `{detail}` in place (e.g. with `x -= ...` or `x /= ...`). Compute new arrays "
        "instead of modifying the arguments: the caller still needs them.",
        examples=[("softmax_in_place", "check_softmax")])
mistake("nan-output", "the result contains NaN or inf where the reference is finite",
        "Your result contains NaN or inf values where the reference is finite.")
mistake("missing-attribute", "the module lacks an attribute the exercise asks for (e.g. w_q)")
mistake("wrong-value", "a numeric answer differs from the expected value")
mistake("wrong-output", "the result differs from the reference and matches no known mistake")

# ==================================================================================================================
# Checked questions (checks/questions.py): predict-then-run, read-the-plot, conceptual
# ==================================================================================================================

mistake("wrong-answer", "a question's answer is not the right one", topic="questions")
mistake("invalid-answer", "a question's answer is not one of its letters, or not a number", topic="questions")

# ==================================================================================================================
# Chapter 1: attention as a soft lookup (the attention core, softmax)
# ==================================================================================================================

mistake("missing-scale", "scores not divided by sqrt(d_k)",
        "Your scores are not divided by sqrt(d_k): your output matches softmax(q @ k^T) @ v without the 1/sqrt(d_k) "
        "factor. Multiply the scores by 1 / sqrt(d_k), with d_k = q.shape[-1], before the softmax.",
        chapter=1, topic="core", examples=[("sdpa_missing_scale", _SDPA), ("SHAMissingScale", _SHA)])
mistake("wrong-scale", "scores scaled by the wrong factor (d_k, sqrt(T), sqrt(d_model), ...)",
        "Your scores are scaled by the wrong factor: {detail}. The scale is 1 / sqrt of the number of terms each dot "
        "product sums (chapter 1; for several heads, chapter 3's 'Splitting and merging heads').",
        chapter=1, topic="core", examples=[("sdpa_scale_by_dk", _SDPA), ("sdpa_scale_by_seq_len", _SDPA),
                                           ("MHAScaleByDModel", _MHA), ("SHAScaleByDIn", _SHA)])
mistake("softmax-wrong-axis", "softmax normalised along the wrong axis",
        "Your softmax normalises along the wrong axis ({detail}). Each query's weights over the keys must sum to 1: "
        "take the softmax along the last axis (axis=-1 / dim=-1).",
        chapter=1, topic="core", examples=[("sdpa_softmax_wrong_axis", _SDPA), ("SHASoftmaxWrongAxis", _SHA)])
mistake("softmax-overflow", "softmax without subtracting the maximum overflows to NaN for large inputs",
        "Your softmax overflows: for large inputs (e.g. 1000) exp() gives inf and inf / inf is NaN. Subtract each "
        "row's maximum before exp() (softmax does not change when you shift a row).",
        chapter=1, topic="core", examples=[("softmax_no_max", "check_softmax")])
mistake("softmax-global-max", "softmax subtracting the maximum of the whole array instead of each row's",
        "Your softmax subtracts the maximum of the whole array, not each row's own: a row whose values are all far "
        "below that maximum underflows to 0 / 0 = NaN (e.g. [[0, 1], [2000, 2001]]). Subtract "
        "x.max(axis=-1, keepdims=True).",
        chapter=1, topic="core")
mistake("transposed-scores", "scores computed as k @ q^T instead of q @ k^T",
        "Your scores are transposed: you computed k @ q^T (keys x queries) instead of q @ k^T (queries x keys). Row "
        "i of the scores must belong to query i.",
        chapter=1, topic="core", examples=[("sdpa_transposed_scores", _SDPA)])
mistake("values-from-keys", "output computed from the keys instead of the values",
        "Your output is a weighted sum of the keys, not of the values{detail}. Multiply the attention weights by the "
        "values.",
        chapter=1, topic="core", examples=[("sdpa_values_from_keys", _SDPA), ("MHAValuesFromKeys", _MHA),
                                           ("SHAValuesFromKeys", _SHA)])
mistake("weights-not-normalized", "attention weights do not sum to 1 (masked after the softmax, or no division)",
        "Your attention weights do not sum to 1 over the keys: {detail}. Each query's weights are its exponentials "
        "divided by their sum (chapter 1).",
        chapter=1, topic="core", examples=[("sdpa_mask_zero_after_softmax", _SDPA)])

# ==================================================================================================================
# Chapter 2: a single attention head (nn.Linear projections, dropout)
# ==================================================================================================================

mistake("weight-not-transposed",
        "an nn.Linear weight used as x @ linear.weight (it is stored (d_out, d_in): x @ weight.T)",
        "Your projections compute x @ linear.weight, but nn.Linear stores its weight as (d_out, d_in) and computes "
        "x @ weight.T + bias: call the layer (self.w_q(x)) or transpose the weight. With d_in == d_out the shapes fit "
        "and the result is silently wrong; with d_in != d_out it fails with a shape error.",
        chapter=2, topic="modules", examples=[("SHAWeightNotTransposed", _SHA), ("MHAWeightNotTransposed", _MHA)])
mistake("dropout-in-eval", "dropout still active after .eval() / with training=False",
        "Your module is not deterministic in evaluation mode: built with dropout=0.5, {detail}. Dropout must act in "
        "training mode only: find your dropout and what tells it which mode the module is in (chapter 7, 'Dropout in "
        "evaluation mode').",
        chapter=2, topic="modules", examples=[("MHADropoutInEval", _MHA), ("SHADropoutInEval", _SHA)])
mistake("dropout-off-in-training", "dropout never acts, even in training mode",
        "Your module never drops anything: {detail}. Dropout regularises training: in .train() mode each attention "
        "weight is zeroed with probability p and the others are scaled by 1 / (1 - p). A module that never drops "
        "(no dropout layer, or training=False written in) trains without it (chapter 2).",
        chapter=2, topic="modules")
mistake("dropout-wrong-rate", "dropout in training mode with another probability than the module's p",
        "Your dropout does not use the module's probability: {detail}. Check which number reaches the dropout call "
        "(the drop probability p, not the keep probability 1 - p).",
        chapter=2, topic="modules")
mistake("dropout-wrong-tensor", "dropout applied to another tensor than the attention weights",
        "Your dropout acts on the wrong tensor: {detail}. In attention, dropout zeroes attention WEIGHTS (after the "
        "softmax, before they multiply the values); the output uses the weights that were dropped.",
        chapter=2, topic="modules")

# ==================================================================================================================
# Chapter 3: multi-head attention (splitting and merging heads, the output projection)
# ==================================================================================================================

mistake("heads-split-without-transpose", "heads split with a reshape only, without the transpose",
        "Your heads are split with a reshape only: reshaping (B, T, D) straight to (B, H, T, Dh) scrambles positions "
        "and features. Reshape to (B, T, H, Dh) first, then transpose to (B, H, T, Dh).",
        chapter=3, topic="heads", examples=[("split_heads_view", "check_split_heads"),
                                            ("MHASplitWithoutTranspose", _MHA)])
mistake("merge-heads-wrong-order", "heads merged without transposing back first",
        "Your output mixes positions: the merged (B, T, D) rows hold features of other positions, because the heads "
        "are merged from (B, H, T, Dh) in the wrong order. Chapter 3, 'Splitting and merging heads', shows which axes "
        "must be neighbours before a reshape.",
        chapter=3, topic="heads", examples=[("merge_heads_view", "check_merge_heads"), ("MHAMergeWrongOrder", _MHA)])
mistake("missing-output-projection", "the output projection w_o is not applied",
        "Your output skips the output projection: after merging the heads, apply w_o.",
        chapter=3, topic="modules", examples=[("MHAMissingOutputProjection", _MHA)])

# ==================================================================================================================
# Chapter 4: masking (the mask convention: boolean, True = may attend; causal and padding masks)
# ==================================================================================================================

mistake("mask-ignored", "the mask has no effect",
        "Your output ignores the mask: keys where the mask is False get the weight they would have without a mask. "
        "Follow the masked scores from where they are made to the softmax: does the softmax get them? (chapter 4, "
        "'The causal mask').",
        chapter=4, topic="core", examples=[("sdpa_mask_ignored", _SDPA), ("SHAMaskIgnored", _SHA)])
mistake("mask-inverted", "the mask is applied the wrong way round (True treated as 'blocked')",
        "Your mask is inverted: {detail}. In this course True = may attend (as in PyTorch's "
        "scaled_dot_product_attention; nn.MultiheadAttention's masks use the opposite convention: chapter 4, 'The "
        "other convention').",
        chapter=4, topic="masks", examples=[("sdpa_mask_inverted", _SDPA), ("causal_mask_triu", "check_causal_mask"),
                                            ("SHAMaskInverted", _SHA)])
mistake("mask-wrong-sign", "masked positions get a large positive score instead of -inf",
        "Blocked keys get a large POSITIVE score, so they take all the weight ({detail}). Blocked scores must become "
        "-inf (or a large negative number), e.g. scores.masked_fill(~mask, float('-inf')).",
        chapter=4, topic="core", examples=[("sdpa_mask_plus_1e10", _SDPA)])
mistake("mask-zero-before-softmax", "masked scores set to 0 instead of -inf before the softmax",
        "Blocked scores are set to 0 before the softmax, but exp(0) = 1 still gives them weight. Fill them with -inf "
        "instead, e.g. scores.masked_fill(~mask, float('-inf')).",
        chapter=4, topic="core", examples=[("sdpa_mask_zero_before_softmax", _SDPA)])
mistake("float-mask-not-passed", "the fused attention called without the additive float mask the exercise asks for",
        "The exercise asks for the additive float mask to reach F.scaled_dot_product_attention, and {detail}. "
        "Build a float mask of q's dtype from the boolean one and pass that as attn_mask (chapter 4, 'Float masks: "
        "added, not selected').",
        chapter=4, topic="core")
mistake("nan-on-masked-row", "a fully masked query row gives NaN instead of zeros",
        "Your result has NaN in query rows where every key is masked (the softmax of a row of -inf is 0/0; some "
        "PyTorch kernels return zeros there, others NaN, and the check behaves like the latter). The course's "
        "convention: such rows get all-zero weights and a zero output, decided by your code (chapter 4, 'Fully "
        "masked rows: zeros, not NaN').",
        chapter=4, topic="core", examples=[("sdpa_nan_on_masked_row", _SDPA)])
mistake("masked-row-not-zero", "a fully masked query row gives uniform weights instead of zeros",
        "In query rows where every key is masked your weights are spread evenly over all keys (what filling with a "
        "large negative number such as -1e9 gives). The course's convention: such rows get all-zero weights and a "
        "zero output.",
        chapter=4, topic="core", examples=[("sdpa_mask_minus_1e9", _SDPA)])
mistake("causal-top-left-aligned", "causal mask aligned top-left when Tq < Tk (should be bottom-right)",
        "For Tq < Tk your causal mask is aligned top-left (query i sees keys 0..i). In this course the queries are "
        "the LAST Tq positions: query i may attend key j iff j <= i + (Tk - Tq), e.g. tril with diagonal=Tk - Tq.",
        chapter=4, topic="masks", examples=[("causal_mask_top_left", "check_causal_mask"),
                                            ("causal_mask_buffer_sliced", "check_causal_mask")])
mistake("causal-excludes-diagonal", "causal mask hides each position from itself",
        "Your causal mask hides each position from itself: query i must be able to attend key i (the diagonal is "
        "True).",
        chapter=4, topic="masks", examples=[("causal_mask_strict", "check_causal_mask")])
mistake("off-by-one", "padding mask off by one position",
        "Your padding mask is off by one: key j of sequence b may be attended iff j < lengths[b].",
        chapter=4, topic="masks", examples=[("padding_mask_off_by_one", "check_padding_mask")])

# ==================================================================================================================
# Chapters 5 and 6: einsum and Keras (weights in the y = x @ W + b layout)
# ==================================================================================================================

mistake("weight-layout-transposed",
        "a weight matrix read in the other layout: (d_out, d_in) used as (d_in, d_out) or the reverse (W instead of "
        "W.T)",
        "Your output matches attention computed with {detail} transposed: a weight matrix was read in the other "
        "layout. The course's parameter dictionaries and Keras' Dense kernels store W as (d_in, d_out), for "
        "y = x @ W + b; nn.Linear stores its weight as (d_out, d_in), for y = x @ weight.T + b. Converting from one "
        "layout to the other needs a transpose; reading one as the other only runs when d_in == d_out, and then the "
        "result is silently wrong.",
        chapter=5, topic="modules", examples=[("mha_params_with_f_linear", "check_einsum_attention"),
                                              ("EinsumMHALoadsTransposed", "check_einsum_attention")])
mistake("kernel-heads-interleaved",
        "per-head kernels that give feature f to head f % H (reshaped to (d_in, Dh, H)) instead of head f // Dh",
        "Your {detail} give head h the features h, h + H, h + 2H, ...: the heads are interleaved. PyTorch and Keras "
        "both give head h the consecutive features h * Dh .. (h + 1) * Dh - 1, so a (d_in, H * Dh) kernel becomes "
        "(d_in, H, Dh) by a plain reshape, head axis first, and an (H * Dh, d_out) one becomes (H, Dh, d_out).",
        chapter=6, topic="porting")
mistake("qkv-chunks-swapped",
        "nn.MultiheadAttention's packed in_proj_weight cut in the wrong order (rows 0:D query, D:2D key, 2D:3D value)",
        "Your {detail}. nn.MultiheadAttention packs its three input projections along the ROWS of in_proj_weight "
        "(3 D, D): rows 0 .. D-1 project the queries, D .. 2D-1 the keys, 2D .. 3D-1 the values, and in_proj_bias "
        "follows the same order. When keys and values come from the same tensor a swap of those two still runs; only "
        "the numbers are wrong.",
        chapter=6, topic="porting")

# ==================================================================================================================
# Chapter 7: the field guide's own bugs (a layer created in forward, a float mask that is not additive)
# ==================================================================================================================

mistake("layer-created-in-forward",
        "a layer (e.g. nn.Linear) created inside forward(): new random weights on every call, never trained or saved",
        "Your module is not a fixed function: {detail}. A layer created inside forward() draws new random weights on "
        "every call; they are not among the module's parameters, so the optimiser never trains them and the "
        "state_dict never saves them. Create every layer once, in __init__, and only call it in forward().",
        chapter=7, topic="field_guide", examples=[("MHALinearInForward", "check_layers_created_once")])
mistake("float-mask-not-additive",
        "a boolean mask cast to float (1 = may attend, 0 = hidden) used as an additive float mask",
        "Your float mask is the boolean mask cast to numbers ({detail}). A float attn_mask is ADDED to the scores, so "
        "0/1 entries hide nothing: they only add 1 to the allowed scores. An additive mask is 0 where attending is "
        "allowed and -inf (or a large negative number) where it is not, e.g. "
        "torch.zeros(mask.shape).masked_fill(~mask, float('-inf')).",
        chapter=7, topic="field_guide", examples=[("additive_mask_cast", "check_additive_mask")])

# ==================================================================================================================
# Chapter 8: the KV cache, multi-query and grouped-query attention
# ==================================================================================================================

mistake("kv-heads-tiled", "key/value heads repeated as a tile (heads 0, 1, 0, 1) instead of in groups (0, 0, 1, 1)",
        "Your key/value heads are repeated as a tile, not in groups: {detail}. Query head h uses key/value head "
        "h // n_rep, with n_rep = H / H_kv: each key/value head must be repeated n_rep times in a row (as "
        "x.repeat_interleave(n_rep, dim=1) does), whereas x.repeat(1, n_rep, 1, 1) repeats the whole block of heads.",
        chapter=8, topic="kv_cache", examples=[("repeat_kv_tiled", "check_repeat_kv"),
                                               ("gqa_tiled_heads", "check_grouped_query_attention")])
mistake("cache-keys-only", "KV cache size without the factor 2: only the keys (or only the values) counted",
        "Your cache size is half the right one: it counts the keys only (or the values only). The cache holds both, "
        "for every layer and every token.",
        chapter=8, topic="kv_cache", examples=[("kv_cache_bytes_keys_only", "check_kv_cache_bytes")])
mistake("cache-missing-factor",
        "KV cache size without one of its factors (layers, heads, head size, tokens, batch, bytes per number)",
        "Your cache size leaves out {detail}.",
        chapter=8, topic="kv_cache", examples=[("kv_cache_bytes_in_numbers", "check_kv_cache_bytes"),
                                               ("kv_cache_bytes_one_sequence", "check_kv_cache_bytes")])

# ==================================================================================================================
# Chapter 9: efficient attention (the online softmax, streams over the keys)
# ==================================================================================================================

mistake("stream-not-rescaled", "a stream over the keys that does not rescale what it accumulated when a key arrives",
        "Your output matches a stream in which {detail}. What was accumulated before key j was weighted against the "
        "scores seen so far; once key j arrives, the old keys hold a smaller share of the total weight (the running "
        "sum grew, or the maximum rose): multiply what was accumulated by that share, exp(old - new) of the running "
        "log-sum-exp or maximum, before adding the new key's term.",
        chapter=9, topic="core")
mistake("window-off-by-one", "a sliding window that lets each query see one key too many or too few",
        "Your output matches a window in which {detail}. Query i may attend key j when i - window < j <= i: itself "
        "and the window - 1 keys before it, window keys in all.", chapter=9, topic="tiles")
mistake("window-ignored", "blockwise attention over a sliding window that attends every earlier key",
        "Your output is plain causal attention: each query attends every key up to itself. The window lets query i "
        "see only keys j with i - window < j <= i (chapter 9, exercise 4).", chapter=9, topic="tiles")
mistake("tiles-not-skipped", "blockwise attention that computes tiles holding no allowed (query, key) pair",
        "Your output is right, but {detail}. A tile of a query block and a key block whose pairs are all outside "
        "the window costs as much as any other and adds nothing: skip it. Which tiles hold an allowed pair? Work it "
        "out on paper for a small T, window and block size (chapter 9, 'Blockwise attention').",
        chapter=9, topic="tiles")

# ==================================================================================================================
# Chapter 10: positions (append this chapter's mistakes here)
# ==================================================================================================================

mistake("rope-wrong-pairing", "RoPE rotating the pairs (x_i, x_i+D/2) where (x_2i, x_2i+1) were asked (or back)",
        "Your rotation pairs the wrong features: {detail}. Both pairings exist (LLaMA's reference code uses "
        "neighbours, GPT-NeoX and Hugging Face use halves), but weights trained with one are wrong with the other.",
        chapter=10, topic="positions")
mistake("rope-wrong-frequencies", "RoPE with the wrong angles: not m * base^(-2i/Dh) for pair i at position m",
        "Your rotation angles are wrong: {detail}. Pair i at position m turns by m * theta_i, with "
        "theta_i = base^(-2i/Dh) and i counting pairs (0 .. Dh/2 - 1), not features.",
        chapter=10, topic="positions")
mistake("rope-position-not-offset", "a decoded token rotated by the wrong position (0, not the cache length)",
        "Your new token is rotated as if it were at position {detail}. With a cache of T tokens (positions "
        "0 .. T-1) the new token is at position T: rotate its query and key by T.",
        chapter=10, topic="positions")
mistake("rope-rotates-values", "RoPE applied to the values as well as the queries and keys",
        "You rotate the values too. RoPE rotates queries and keys only, so that their scores depend on the "
        "distance; the values carry the content that is averaged and are never rotated.",
        chapter=10, topic="positions")
mistake("rope-cache-rotated-twice", "cached keys, already rotated, rotated again when a token is decoded",
        "Your cached keys are rotated a second time. The cache stores keys already rotated at their own "
        "positions: rotate only the new key (at position T) and append it.",
        chapter=10, topic="positions")
mistake("rope-angle-layout", "halves RoPE with its angles laid out for neighbour pairs (repeat_interleave)",
        "Your features i and i + Dh/2 turn by different angles: {detail}. In the halves form the two features of "
        "pair i share the angle m * theta_i, so the tables of cos and sin repeat the Dh/2 angles as a whole "
        "(theta_0, ..., theta_{{Dh/2-1}}, theta_0, ...), not each angle twice in a row.",
        chapter=10, topic="positions")
mistake("alibi-query-offset", "ALiBi distances measured from query positions 0..Tq-1 when the queries are the last Tq",
        "Your bias puts query i at position i{detail}. With Tq new queries after a cache, the queries are the LAST Tq "
        "of the Tk positions: query i sits at i + Tk - Tq, and its distance to key j is i + Tk - Tq - j.",
        chapter=10, topic="positions")
mistake("alibi-bias-sign", "the ALiBi bias added with the wrong sign: distant keys rewarded",
        "Your bias has the wrong sign{detail}: distant keys get MORE weight. ALiBi subtracts slope_h * distance "
        "from the score.", chapter=10, topic="positions")
mistake("alibi-bias-scaled", "the ALiBi bias divided by sqrt(Dh) along with the scores",
        "Your bias is divided by sqrt(Dh) together with q . k: you add it before scaling. The bias is added to the "
        "scaled scores, q . k / sqrt(Dh) - slope_h * distance, so that the slope means the same at every width.",
        chapter=10, topic="positions")
mistake("rope-padding-ignored", "a left-padded row rotated as if its first real token sat at its first slot",
        "Your positions do not start at each row's first real token: {detail}. A row with p padding slots in front "
        "holds its first real token at slot p, and that token is at position 0: slot t is position t - p.",
        chapter=10, topic="positions")
mistake("rope-offset-one-row", "one row's padding used for every row of a batch",
        "Every row of your batch is rotated with the positions of row {detail}. Each row has its own number of "
        "padding slots, so each row has its own positions.", chapter=10, topic="positions")
mistake("rope-permutation-inverted", "weights converted between RoPE pairings with the permutation the wrong way round",
        "Your rows are reordered by p = [0, 2, 4, ..., 1, 3, 5, ...] itself{detail}. That is the conversion the "
        "other way. Write down where row j of one layout has to go in the other, for Dh = 6, and compare.",
        chapter=10, topic="positions")
mistake("rope-permutation-not-per-head", "the rows of all heads permuted as if they were one head",
        "Your permutation mixes the heads: {detail}. The output rows of W_q and W_k are H blocks of Dh rows, one per "
        "head, and RoPE pairs features inside a head: reorder each block of Dh rows on its own.",
        chapter=10, topic="positions")
mistake("rope-permutation-on-columns", "the input columns of a projection permuted instead of its output rows",
        "You reorder the columns of the weight (its inputs). RoPE rotates the projection's OUTPUT features, the "
        "rows of a (H * Dh, D) weight: permute rows, per head.", chapter=10, topic="positions")

# ==================================================================================================================
# Chapter 11: the transformer block (append this chapter's mistakes here)
# ==================================================================================================================

mistake("residual-missing", "a residual connection is missing: the sub-layer's input is not added back",
        "Your block drops a residual connection ({detail}): the sub-layer's input x must be added to the branch's "
        "output, x + drop(branch(...)). Without it the stream carries only the branch's output and the direct path "
        "for the gradient is gone.",
        chapter=11, topic="blocks")
mistake("residual-twice", "the residual is added twice (2 x + branch)",
        "Your block adds the input twice ({detail}): the result is 2 x + branch, e.g. from h = x + branch(...) "
        "followed by x = x + h. Add the input once: x = x + drop(branch(...)).",
        chapter=11, topic="blocks")
mistake("norm-wrong-place", "the LayerNorm is applied in the wrong place for the block's order",
        "Your LayerNorm is in the wrong place: {detail}. Pre-LN: x + drop(branch(norm(x))); post-LN: "
        "norm(x + drop(branch(x))).",
        chapter=11, topic="blocks")
mistake("norm-on-residual-stream", "pre-LN block that normalises the residual stream itself (x = norm(x))",
        "Your pre-LN block normalises the residual stream itself ({detail}): with x = norm(x) followed by "
        "x = x + branch(x), the un-normalised input never reaches the output. Only the branch's input is "
        "normalised: x = x + drop(branch(norm(x))).",
        chapter=11, topic="blocks")
mistake("ffn-activation-missing", "the feed-forward network has no activation between its two linear layers",
        "Your feed-forward network has no nonlinearity between linear1 and linear2{detail}: two linear layers in a "
        "row are one linear layer. Apply the activation to the hidden layer: linear2(drop(relu(linear1(x)))).",
        chapter=11, topic="blocks")
mistake("decoder-not-causal", "the decoder's self-attention is not causal (positions see the future)",
        "Your decoder's self-attention is not causal: each target position can see the tokens after it, which are "
        "the ones it must predict. Pass is_causal=True (or a causal mask) to the self-attention.",
        chapter=11, topic="blocks")
mistake("cross-attention-keys-from-decoder", "cross-attention keys and values taken from the decoder, not the memory",
        "Your cross-attention takes its keys and values from {detail} instead of the encoder's output: queries come "
        "from the decoder, keys and values from the memory, self.cross_attn(norm2(x), memory, mask=memory_mask).",
        chapter=11, topic="blocks")
mistake("branch-dropout-off", "a block's dropout never acts in training mode",
        "Your module never drops {detail} in .train() mode. Built with dropout=0.25 and training, each sub-layer's "
        "output is zeroed feature by feature with probability p (the others scaled by 1 / (1 - p)) before it joins "
        "the residual stream, and the feed-forward network drops its hidden features: look at what reaches your "
        "dropout, and at what tells it the mode (chapter 11, 'Residual connections and LayerNorm: two orders').",
        chapter=11, topic="blocks")
mistake("dropout-not-on-branch", "dropout on the residual stream or a branch's input, not on the branch's output",
        "Your dropout acts on another tensor than the one the block drops: {detail}. Only a sub-layer's output (in "
        "the feed-forward network, its hidden features) is dropped; the residual stream carries the input through "
        "untouched (chapter 11, 'Residual connections and LayerNorm: two orders').",
        chapter=11, topic="blocks")
mistake("rmsnorm-mean-subtracted", "RMSNorm that subtracts the mean (a LayerNorm without bias)",
        "Your RMSNorm subtracts each vector's mean{detail}: that is LayerNorm. RMSNorm divides x itself by its root "
        "mean square; the check's inputs have a mean far from 0, where the two differ (chapter 11, 'Modern "
        "variants: RMSNorm and SwiGLU').",
        chapter=11, topic="blocks")
mistake("rmsnorm-eps-misplaced", "RMSNorm's epsilon added outside the square root, or left out",
        "Your RMSNorm puts epsilon in another place ({detail}). It sits inside the square root, added to the mean of "
        "the squares; the check's vectors include tiny ones, where its place decides the result.",
        chapter=11, topic="blocks")
mistake("rmsnorm-not-mean", "RMSNorm divides by the norm (a sum of squares), not by the root MEAN square",
        "Your RMSNorm divides by the square root of the SUM of the squares{detail}: the result is sqrt(D) times "
        "too small. The root mean square averages the squares over the D features.",
        chapter=11, topic="blocks")
mistake("rmsnorm-scale-missing", "RMSNorm's learned scale (weight) is not applied",
        "Your RMSNorm leaves out its learned scale: the normalised vector is multiplied feature by feature by "
        "self.weight (D numbers); the check loads random values into it.",
        chapter=11, topic="blocks")
mistake("norm-wrong-axis", "the norm is computed over another axis than the features (the last one)",
        "Your norm averages over {detail} instead of each position's D features (the last axis): every position "
        "is normalised on its own.",
        chapter=11, topic="blocks")
mistake("swiglu-gate-swapped", "SwiGLU with the SiLU on the 'up' projection instead of the 'gate'",
        "Your SwiGLU passes the wrong projection through the SiLU: in the equation the gate projection goes through "
        "it, and the up projection is multiplied in as it is. The check loads different weights into the two.",
        chapter=11, topic="blocks")
mistake("swiglu-wrong-activation", "SwiGLU with another activation than SiLU on the gate",
        "Your gate goes through {detail} instead of SiLU(z) = z sigmoid(z) (Swish with beta = 1): that is another "
        "member of the GLU family (chapter 11, 'Modern variants: RMSNorm and SwiGLU').",
        chapter=11, topic="blocks")
mistake("swiglu-not-gated", "SwiGLU without its gate: the two projections are not multiplied",
        "Your SwiGLU does not multiply the two projections ({detail}): the gate's SiLU multiplies the up "
        "projection feature by feature before down maps back to D.",
        chapter=11, topic="blocks")
mistake("residual-init-depth", "residual layers scaled by 1/sqrt of the wrong count (blocks, not residual layers)",
        "Your residual layers are scaled by another factor: {detail}. GPT-2 scales them by 1 / sqrt(N), N the "
        "number of residual layers: count the additions to the stream in one block.",
        chapter=11, topic="blocks")
mistake("residual-init-wrong-layers", "the depth scaling applied to other layers than those that write into the stream",
        "Your initialisation scales the wrong matrices: {detail}. Only the layers whose output is added to the "
        "residual stream are scaled; every other matrix keeps standard deviation 0.02.",
        chapter=11, topic="blocks")
mistake("init-norm-or-bias", "a LayerNorm's scale or shift, or a bias, drawn at random or not reset",
        "Your initialisation gives {detail}. Biases and LayerNorm shifts start at 0, LayerNorm scales at 1: only "
        "the weight matrices and the embedding are drawn.",
        chapter=11, topic="blocks")

# ==================================================================================================================
# Chapter 12: watch attention learn (induction heads)
# ==================================================================================================================

mistake("induction-off-by-one",
        "prefix-matching score taken on the earlier occurrence of the token, not the token after it",
        "Your score measures attention on the earlier occurrence of the query's token itself (key j - 1), which is "
        "what a duplicate-token head does. An induction head at token A attends to the token that FOLLOWED the "
        "earlier A (key j with ids[j - 1] == ids[t]): that is the token it copies.",
        chapter=12, topic="interpret")
mistake("induction-all-queries",
        "prefix-matching score averaged over every query, also those with nothing to find",
        "Your score averages over every query, also those whose token never occurred before: they have no target, "
        "add 0 and dilute the score. Average only over the queries with at least one earlier occurrence.",
        chapter=12, topic="interpret")
mistake("induction-mean-over-targets", "prefix-matching score averaged over a query's targets instead of summed",
        "Your score averages the weights over a query's targets; where the token occurred several times, a head "
        "that splits its attention over all the right keys should still score 1. Sum over the targets.",
        chapter=12, topic="interpret")
mistake("induction-includes-self", "prefix-matching score counts the query's own position as a target",
        "Your score counts the query's own position as a target when the token before it is the same token. "
        "Targets are strictly earlier keys: j < t.",
        chapter=12, topic="interpret")
mistake("induction-ignores-query-mask", "prefix-matching score ignores query_mask",
        "Your score ignores query_mask: average only over the queries where it is True (and that have a target).",
        chapter=12, topic="interpret")
mistake("predicted-reversal-pattern", "predicted the anti-diagonal for a task that is not reversal",
        chapter=12, topic="interpret")
mistake("predicted-identity-pattern", "predicted the main diagonal for a shifted copy",
        chapter=12, topic="interpret")
mistake("predicted-uniform-pattern", "predicted uniform attention for a task that needs one key per query",
        chapter=12, topic="interpret")
mistake("query-path-needs-previous-token", "predicted that the induction heads' queries need the previous token",
        chapter=12, topic="interpret")
mistake("query-path-shares-work", "predicted that queries and keys share the previous-token information",
        chapter=12, topic="interpret")
mistake("ablation-every-path", "the heads switched off everywhere instead of in layer 2's keys only",
        "Your logits are those of the model with the heads switched off everywhere (head_mask): then layer 2's "
        "queries and values and the logits lose them too. Only the KEY projection of layer 2 may read the stream "
        "without them; everything else reads the whole stream.",
        chapter=12, topic="interpret")
mistake("ablation-query-path", "the heads removed from layer 2's queries instead of its keys",
        "Your layer 2 computes its QUERIES from the stream without the heads, and its keys from the whole stream: "
        "swap them. The key projection (w_k) reads the ablated stream; w_q and w_v read the whole one.",
        chapter=12, topic="interpret")
mistake("ablation-value-path", "the heads removed from layer 2's values instead of its keys",
        "Your layer 2 computes its VALUES from the stream without the heads. The key projection (w_k) reads the "
        "ablated stream; w_q and w_v read the whole one.",
        chapter=12, topic="interpret")
mistake("key-path-skips-layernorm", "the ablated stream fed to the key projection without layer 2's LayerNorm",
        "Your key projection reads the ablated residual stream as it is; in a pre-LN block every projection reads "
        "the stream through the block's norm1. Apply model.blocks[1].norm1 to the ablated stream first.",
        chapter=12, topic="interpret")
mistake("ablation-not-applied", "the logits of the whole model: no head was removed",
        "Your logits are the whole model's: the heads were removed nowhere (a hook not registered, or removed "
        "before the forward pass, or a head_mask of ones).",
        chapter=12, topic="interpret")

# ==================================================================================================================
# Chapter 13: distributed attention (append this chapter's mistakes here)
# ==================================================================================================================

mistake("allreduce-before-output-projection",
        "tensor parallelism: the heads summed over the ranks (all-reduce) before the output projection",
        "Your output is what you get when the heads are all-reduced BEFORE the output projection: {detail}. The "
        "heads of different ranks are different features (rank 0 has heads 0 .. H/P - 1, rank 1 the next ones), "
        "so adding them mixes unrelated heads. Each rank multiplies ITS heads by ITS rows of W_o (columns of "
        "w_o, in nn.Linear's layout) and the all-reduce sums these (B, T, D) partial outputs.",
        chapter=13, topic="distributed")
mistake("tp-bias-per-rank", "tensor parallelism: the output bias added on every rank before the all-reduce",
        "Your output has the bias b_o {detail} times: every rank added it before the all-reduce, which sums the "
        "biases too. Add b_o once, after the sum (or on one rank only).",
        chapter=13, topic="distributed")
mistake("row-parallel-wrong-slice",
        "tensor parallelism: a rank's slice of W_o taken along its output features instead of its input features",
        "Your ranks slice w_o along the wrong axis: w_o[rows] are OUTPUT features in nn.Linear's (d_out, d_in) "
        "layout. Rank r's heads are the INPUT features r*D/P .. (r+1)*D/P - 1 of the output projection: "
        "w_o[:, r*D/P:(r+1)*D/P].",
        chapter=13, topic="distributed")
mistake("zigzag-contiguous", "zig-zag layout: each rank holds one contiguous block of T / P positions",
        "Your layout gives rank r the contiguous positions r*T/P .. (r+1)*T/P - 1: two NEIGHBOURING chunks. With a "
        "causal mask the last rank then computes P times more than the first. Cut the sequence into 2P chunks and "
        "give rank r one early and one late chunk: r and 2P - 1 - r.",
        chapter=13, topic="distributed")
mistake("zigzag-not-mirrored", "zig-zag layout: rank r's second chunk is P + r instead of 2P - 1 - r",
        "Your layout gives rank r {detail}: the second chunk is shifted, not mirrored, so a later rank still holds "
        "two later chunks and does more causal work. Pair the chunks from both ends: r with 2P - 1 - r, so that "
        "each pair's causal work adds up to the same.",
        chapter=13, topic="distributed")
mistake("zigzag-striped", "zig-zag layout replaced by the striped one (positions r, r + P, r + 2P, ...)",
        "Your layout is the striped one: rank r holds positions r, r + P, r + 2P, .... It balances the entries the "
        "causal mask keeps, but no tile can then be skipped, so with whole tiles every rank computes all of them "
        "(chapter 13). The zig-zag layout holds 2 chunks of T / 2P: r and 2P - 1 - r.",
        chapter=13, topic="distributed")
mistake("f-backward-not-reduced", "tensor parallelism: f (copy to the ranks) returns the gradient unchanged",
        "Your gradients of the inputs differ from rank to rank: each rank kept only its own heads' part. The "
        "input was copied to every rank (f) and each rank's heads used it, so its gradient is the SUM of the "
        "ranks' parts: f's backward all-reduces the gradient (identity forward, all-reduce backward).",
        chapter=13, topic="distributed")
mistake("g-backward-reduced", "tensor parallelism: g (sum over the ranks) all-reduces the gradient backward too",
        "Your gradients are P times too large: g's backward all-reduces the gradient of the output, which every "
        "rank already holds whole (the output is the same on every rank). g is an all-reduce forward and the "
        "identity backward. (torch.distributed.nn.functional.all_reduce sums in both directions.)",
        chapter=13, topic="distributed")
mistake("g-forward-not-reduced", "tensor parallelism: g (sum over the ranks) does not all-reduce the output",
        "Your ranks' outputs differ, each holding only its own heads' partial output: g must all-reduce (sum) "
        "the partial outputs in the forward pass, so that every rank holds the whole output.",
        chapter=13, topic="distributed")
mistake("f-forward-reduced", "tensor parallelism: f (copy to the ranks) all-reduces the input forward",
        "Your output is that of P times the input: f's forward all-reduced the input, which every rank already "
        "holds whole. f is the identity forward (and an all-reduce of the gradient backward).",
        chapter=13, topic="distributed")
mistake("f-and-g-swapped", "tensor parallelism: f and g swapped (all-reduce of the input, not of the output)",
        "Your f and g are swapped: f (before the heads) is the identity forward and an all-reduce backward; g "
        "(after the output projection) is an all-reduce forward and the identity backward.",
        chapter=13, topic="distributed")
mistake("sum-of-two-ranks", "tensor parallelism: f or g adds two ranks' parts, right on 2 processes only",
        "Your output and input gradients equal one process's on 2 processes but not on 3: they are what a sum of "
        "the first two ranks' parts gives. Look at how many ranks your f's backward and g's forward add, and "
        "whether that number depends on the world size.",
        chapter=13, topic="distributed")

# ==================================================================================================================
# Chapter 14: attention in today's open models
# ==================================================================================================================

mistake("cap-on-probabilities", "soft-capping applied to the attention probabilities instead of the scores",
        "Your output matches cap * tanh(.) applied to the softmax's PROBABILITIES. Gemma 2 caps the SCORES, before "
        "the mask and the softmax: s -> cap * tanh(s / cap). Probabilities are already in [0, 1]: capping them "
        "changes almost nothing and the rows no longer sum to 1.",
        chapter=14, topic="modern", examples=[("softcap_on_probabilities", "check_softcap_attention")])
mistake("cap-after-mask", "soft-capping applied after the mask: the masked scores become -cap, not -inf",
        "Your output matches scores soft-capped AFTER the mask: tanh(-inf) = -1, so every masked score becomes -cap "
        "and the future keys get a weight again. The order of the cap and the mask matters (chapter 14, 'Gemma 2: "
        "logit soft-capping and its own query scale').",
        chapter=14, topic="modern")
mistake("norm-after-rope", "QK-norm applied after RoPE instead of before it",
        "Your result is RoPE first, then the RMSNorm (and its weight). Qwen3 normalises each head's queries and keys "
        "BEFORE rotating them: the norm's weight scales features one by one, and scaling then rotating a pair is not "
        "rotating then scaling it (unless both features of the pair have the same weight).",
        chapter=14, topic="modern", examples=[("qk_norm_after_rope", "check_qk_norm_rope")])
mistake("sink-given-value", "an attention sink treated as a token with a value",
        "Your output adds the sink's weight times a value (the first token's). A sink is only a logit in the "
        "softmax's denominator: its weight is simply not given to any value (weights @ v over the real keys only).",
        chapter=14, topic="modern", examples=[("sinks_with_value", "check_sink_attention")])
mistake("sink-ignored", "attention sinks left out of the softmax",
        "Your output is attention without the sinks: each row of weights sums to 1. Append the head's sink logit to "
        "every row of scores, take the softmax over Tk + 1 columns, then drop the sink's column.",
        chapter=14, topic="modern", examples=[("sinks_ignored", "check_sink_attention")])
mistake("absorption-transposed", "MLA weight absorption with W_uk transposed",
        "Your scores match q_nope @ w_uk.T @ c.T. The keys are k = c @ w_uk[h].T (w_uk[h] is (N, C)), so "
        "q . k = q @ w_uk[h] @ c.T: multiply the query by w_uk[h] itself (N -> C), not by its transpose (which "
        "only has the right shape when N == C).",
        chapter=14, topic="modern", examples=[("absorbed_scores_transposed", "check_absorbed_scores")])
mistake("keys-formed", "MLA: the keys formed from the latent cache, where absorption never forms them",
        "Your scores are right, but your code formed the keys: {detail} appeared among the tensors it computed. "
        "Weight absorption exists so that a decoding step reads only the small latent cache c, never the expanded "
        "(B, H, T, N) keys: what can move onto the query instead of onto c? (chapter 14, 'DeepSeek-V2/V3: "
        "multi-head latent attention')",
        chapter=14, topic="modern")
mistake("norm-per-head", "OLMo 2's QK-norm taken per head instead of over all heads' features",
        "Your result normalises each head's Dh features apart (Qwen3's form). OLMo 2's q_norm and k_norm are one "
        "RMSNorm over the whole projection, H * Dh features per token, applied BEFORE the split into heads: the "
        "mean of x^2 runs over all heads at once, and the weight has H * Dh entries.",
        chapter=14, topic="modern")
mistake("values-formed", "MLA: the values or the heads' outputs formed, where W_uv folds into the output projection",
        "Your output is right, but your code formed {detail}. Folding W_uv into W_o exists so that a decoding step "
        "never expands the latent cache into per-head values or outputs: which product of weights can be computed "
        "once, before any token is seen? (An einsum of several operands picks its own order of contraction, and "
        "may form them.)",
        chapter=14, topic="modern")
mistake("heads-split-wrong", "the output projection's columns split into heads in the wrong order",
        "Your result matches w_o's columns read as (V, H): feature-major. The heads are concatenated head-major "
        "before the output projection: head h owns the columns h * V to (h + 1) * V of w_o "
        "(w_o.view(D, H, V)[:, h]).",
        chapter=14, topic="modern")
mistake("cache-window-off-by-one", "a sliding layer's cache counted with one token more or less than its window",
        chapter=14, topic="modern")  # a known wrong answer of question 14.gemma3-cache, which writes the message


# ==================================================================================================================
# The capstone, numbered 19 (chapters 10 to 13 together: RoPE attention with a cache, pre-LN blocks, a TinyGPT
# trained on the induction task, its generation and its induction head, its heads on two processes)
# ==================================================================================================================

mistake("rope-not-applied", "queries and keys not rotated at all (no RoPE)",
        "Your attention ignores the positions: your outputs match causal attention WITHOUT RoPE. Rotate the "
        "queries and the keys of every head by their positions before the scores.",
        chapter=19, topic="capstone")
mistake("cache-keys-unrotated", "the KV cache holds the keys before RoPE, rotated again at every call",
        "Your outputs are right, but your cache holds the keys as projected, before their rotation: every call "
        "then rotates the whole cache again, work that grows with the cache, and a cache handed to other code "
        "(or to the check) is not what the exercise asks for. A key's rotation depends on its own position only "
        "(chapter 10).",
        chapter=19, topic="capstone")
mistake("final-norm-missing", "a pre-LN model without its final LayerNorm before the head",
        "Your logits match the model without its final LayerNorm: in a pre-LN model nothing normalises the "
        "residual stream after the last block, so the head must read norm(x), not x (chapter 11).",
        chapter=19, topic="capstone")
mistake("generate-wrong-position", "greedy generation reads the logits of another position than the last",
        "Your generated tokens come from the logits of the FIRST position: the logits at position t predict "
        "token t + 1, so the next token is chosen from the last position's logits, logits[:, -1].",
        chapter=19, topic="capstone")
mistake("cache-not-passed-back", "cached generation feeds the new token without the cache of the earlier ones",
        "With the cache, your model sees only the newest token at each step: its logits match a model called on "
        "that token alone. Pass the caches the previous call returned back into the next call.",
        chapter=19, topic="capstone")
mistake("cache-fed-whole-sequence", "cached generation feeds the whole sequence again on top of the cache",
        "With the cache, your steps feed the whole sequence AND the cache: every token is cached again and sits "
        "at a second, later position. Once the prompt is cached, feed only the newest token.",
        chapter=19, topic="capstone")
mistake("targets-not-shifted", "next-token training on targets that are the inputs themselves",
        "Your model predicts the CURRENT token: it was trained with the inputs as their own targets. The logits "
        "at position t predict token t + 1: compare model(ids[:, :-1]) with ids[:, 1:].",
        chapter=19, topic="capstone")
mistake("induction-not-learned", "the trained model does not copy the repeated half",
        "After your training the model predicts only {detail} of the repeated half's tokens. A 2-layer model "
        "learns to copy them within a few hundred steps (chapter 12): check that your loss covers every "
        "position's next token, that training runs (the check calls it without autograd, as the grader does: "
        "wrap it in torch.enable_grad()), and the learning rate and number of steps.",
        chapter=19, topic="capstone")
mistake("cache-kept-in-module", "the attention keeps its cache in the module instead of the cache it is passed",
        "Your module gives the right outputs for one sequence at a time, but not for {detail} of two sequences fed "
        "in turns, each with its own cache: your forward reads keys and values from somewhere other than the cache "
        "it is given (an attribute of the module?). A caller may hold several caches for one module.",
        chapter=19, topic="capstone")
mistake("accuracy-not-from-weights", "a trained model whose forward reaches an accuracy its weights do not",
        "Your model predicts {detail}. The check measures the weights your training produced, with its own causal "
        "forward: your model's forward does something those weights do not (a position that reads later tokens, "
        "or predictions computed some other way). Look at the mask in your attention (exercise 2) and at what your "
        "forward returns.",
        chapter=19, topic="capstone")
mistake("scores-from-library", "induction scores computed with the library's own model or score",
        "Your function calls {detail}: the exercise asks for the scores computed from your own model's attention "
        "(a forward pre-hook on each block's attn), not from the library's GPT or interpret functions.",
        chapter=19, topic="capstone")
mistake("shard-not-split", "tensor-parallel attention in which a process computes more than its own heads",
        "Every rank's output is right, but {detail}: each rank must compute only its own heads (its rows of w_q, "
        "w_k, w_v and its columns of w_o), the all-reduce then sums the parts. Look at what each rank computes.",
        chapter=19, topic="capstone")


# ==================================================================================================================
# Chapter 15: FlexAttention (mask_mod and score_mod functions)
# ==================================================================================================================

mistake("mod-roles-swapped", "a mask_mod that compares q_idx and kv_idx the wrong way round",
        "Your mask_mod matches the right mask with the query and key roles swapped: {detail}. A mask_mod answers "
        "whether query q_idx may attend key kv_idx; causally that is kv_idx <= q_idx (the key is not in the "
        "query's future).",
        chapter=15, topic="flex")
mistake("mod-window-off-by-one", "a mask_mod whose boundary (prefix, window edge, diagonal) is off by one",
        "Your mask_mod matches a mask in which {detail}. Check each comparison: < where <= belongs, or the "
        "reverse, moves a boundary by one key.",
        chapter=15, topic="flex")
mistake("bias-sign-flipped", "a score_mod that adds a bias with the wrong sign",
        "Your score_mod matches {detail}: the bias has the wrong sign, so distant keys get MORE attention. ALiBi "
        "SUBTRACTS slope * |distance| from the score.",
        chapter=15, topic="flex")
mistake("doc-id-wrong-index", "a document mask that reads a document id at the wrong index",
        "Your mask_mod matches a document mask that reads {detail}. The query's document is doc_ids[b, q_idx], the "
        "key's is doc_ids[b, kv_idx]: compare those two.",
        chapter=15, topic="flex")
mistake("doc-ids-assumed-sorted", "a document mask that compares document ids by their order",
        "Your mask_mod matches {detail} (with the causal part): that equals 'the same document' only while the ids "
        "rise (or fall) along the row. An id names a document, not its place: here the ids of a row are in no "
        "particular order (see the case's doc_ids).",
        chapter=15, topic="flex")
mistake("chunk-not-causal", "a chunked mask that lets a query see the later keys of its chunk",
        "Your mask_mod matches a chunked mask in which {detail}: inside its chunk a query may still see only the "
        "keys that are not in its future.",
        chapter=15, topic="flex")
mistake("chunk-is-window", "a chunked mask written as a sliding window",
        "Your mask_mod matches {detail}. A chunk's boundaries are fixed positions, the same for every query in it: "
        "a window moves with the query, a chunk does not.",
        chapter=15, topic="flex")
mistake("chunk-boundary-off-by-one", "a chunked mask whose chunk boundaries sit one position off",
        "Your mask_mod matches a chunked mask with {detail}. Chunk 0 holds positions 0 to chunk - 1: check which "
        "chunk position 0, chunk - 1 and chunk fall in.",
        chapter=15, topic="flex")
mistake("decode-offset-ignored", "a decode-time mask_mod that forgets the captured offset",
        "Your mask_mod matches a mask in which {detail}. At decode time q_idx counts the new queries from 0; the "
        "query's place in the sequence is q_idx plus the tokens already in the cache.",
        chapter=15, topic="flex")
mistake("decode-offset-off-by-one", "a decode-time mask_mod that places the query one position off",
        "Your mask_mod matches a mask in which {detail}. Check where the new token stands: the cache holds the keys "
        "before it, and its own key sits in slot offset.",
        chapter=15, topic="flex")
mistake("decode-reads-empty-slots", "a decode-time mask_mod that lets the query read the cache's unwritten slots",
        "Your mask_mod matches a mask in which {detail}: a preallocated cache has slots not yet written, and "
        "nothing after the query's own position may be read.",
        chapter=15, topic="flex")
mistake("mod-from-library", "an exercise's mod that calls the library's own mod, which the notebook forbids",
        "Your mod calls the library's {detail}: the notebook asks for your own mod, written with tensor operations "
        "on the index tensors (that is the exercise).",
        chapter=15, topic="flex")
mistake("mod-fails-in-flex", "a mod right on a broadcast grid that fails inside create_block_mask or flex_attention",
        "Your mod gives the right answers on the check's broadcast grid, but run through the real "
        "create_block_mask / flex_attention {detail}. There vmap hands the mod one index per tensor (0-dim tensors): "
        "look for what your mod reads from the index tensors besides their values (a shape, a Python number, an "
        "axis it expects to broadcast over) (chapter 15, the mods as functions of indices).",
        chapter=15, topic="flex")


# ==================================================================================================================
# Chapter 16: FlashAttention written in Triton
# ==================================================================================================================

mistake("sum-not-rescaled", "online softmax in a kernel: the running sum not rescaled when a tile raises the maximum",
        "Your output matches a tile loop in which {detail}. The running sum l was summed relative to the old "
        "maximum, like the accumulator: when a tile raises the maximum, multiply both by alpha = exp(m_old - m_new) "
        "before adding the tile's terms (chapter 16, 'The forward kernel').",
        chapter=16, topic="kernels")
mistake("causal-bound-off-by-one-tile", "causal kernel: the loop over key tiles bounded one tile off",
        "Your output matches a causal kernel in which {detail}. For the query tile [start, start + BLOCK) the tiles "
        "before start are visible to every row (no mask), the tile [start, start + BLOCK) holds the diagonal (it "
        "needs the mask), and no later tile holds a visible key (chapter 16, 'Where the causal loop stops').",
        chapter=16, topic="kernels")
mistake("ragged-tile-unmasked", "kernel: the key positions past the end of the last, ragged tile not masked",
        "Your output matches a kernel whose last key tile, which runs past the T keys, lets its padding in: {detail}. "
        "Lanes loaded with other=0.0 are zero keys with a score of 0, not nothing; set the scores of the columns "
        ">= T to -inf before the softmax (chapter 16, 'Triton's model: programs and blocks').",
        chapter=16, topic="kernels")
mistake("lse-without-max", "log-sum-exp stored as log(l), without the running maximum",
        "Your log-sum-exp is log(l), the log of the running sum alone. l sums exp(s - m), relative to the row "
        "maximum m, so log(sum exp(s)) = m + log(l); without m the backward's exp(s - lse) is off by exp(m) per row.",
        chapter=16, topic="kernels")
mistake("lse-without-sum", "log-sum-exp stored as the running maximum alone",
        "Your log-sum-exp is the row maximum m. The log-sum-exp is m + log(l), with l the running sum of "
        "exp(s - m); m alone is its largest term only.",
        chapter=16, topic="kernels")
mistake("ds-without-d", "attention backward: dS = P * dP, without subtracting D = rowsum(dO * O)",
        "Your gradient matches dS = P * dP. The softmax couples a row's entries: dS = P * (dP - D) with "
        "D = rowsum(dP * P) = rowsum(dO * O), one number per query row (chapter 16, 'The backward pass').",
        chapter=16, topic="kernels")
mistake("dk-missing-scale", "attention backward: dK without the scale 1 / sqrt(d)",
        "Your dK is sqrt(d) times too large: the scores are S = Q K^T / sqrt(d), so dK = dS^T Q / sqrt(d); the "
        "chain rule passes the scale on to the gradients of Q and K.",
        chapter=16, topic="kernels")
mistake("kernel-not-written", "a kernel exercise answered without a kernel of one's own (PyTorch, SDPA, autograd, "
        "the library's kernel)",
        "Your function {detail}. The exercise is the Triton kernel itself: the launcher only allocates the outputs "
        "and launches it; the scores, the softmax and the sums happen inside the kernel (chapter 16, 'Triton's "
        "model: programs and blocks').",
        chapter=16, topic="kernels")
mistake("scores-overflow", "kernel: exp of the scores overflows at large scores (no running maximum, or one that "
        "stops following the scores)",
        "Your output has inf or NaN where the reference is finite, with {detail}: exp overflows float32 above 88. "
        "Look at what each exp subtracts from the scores, at every tile: it must keep every exponent <= 0 "
        "(chapter 9, the online softmax).",
        chapter=16, topic="kernels")
mistake("lse-overflows", "log-sum-exp formed through exp(m) (log(l * exp(m))), which overflows at large scores",
        "Your log-sum-exp is inf or NaN where the reference is finite, with {detail}: somewhere it takes exp of a "
        "row maximum, which overflows float32 above 88. The log-sum-exp can be formed from m and l without any exp.",
        chapter=16, topic="kernels")
mistake("causal-tiles-not-skipped", "causal kernel: key tiles past the diagonal loaded (the loop stops late or "
        "never), though masked",
        "The values of one key tile were set to inf, and your output has inf or NaN in {detail}, which may not see "
        "that tile: their programs loaded it. Masked scores do not change the output, but every tile loaded past "
        "the diagonal costs a load and a tile product for nothing; where does your causal loop stop (chapter 16, "
        "'Where the causal loop stops')?",
        chapter=16, topic="kernels")


# ==================================================================================================================
# Chapter 17: linear attention, the delta rule and Gated DeltaNet
# ==================================================================================================================

mistake("state-carried-over", "the state of one sequence carried into the next sequence of the batch",
        "Your outputs match a state that is not reset between the sequences of a batch: {detail}. Each sequence "
        "starts from an empty memory (zeros of shape (Dk, Dv) per head); sequence b must never see what "
        "sequence b - 1 wrote.",
        chapter=17, topic="linear")
mistake("read-before-write", "each query reads the state before its own token's write",
        "Your output at step t reads the state S_{{t-1}}, before token t's key and value are written: query t "
        "then never sees its own token (the parallel form with the diagonal masked out). Write first, then read: "
        "o_t = q_t S_t, as the causal mask j <= i includes the diagonal.",
        chapter=17, topic="linear")
mistake("beta-missing", "the delta rule's writing strength beta left out",
        "Your new state matches S + k (v - k S)^T: the error is written at full strength. The delta rule moves "
        "the state only a fraction beta towards v: S + beta k (v - k S)^T.",
        chapter=17, topic="linear")
mistake("beta-on-key", "beta applied to the key (so the state is read with beta k)",
        "Your result matches the delta rule with the key replaced by beta * k, in the read (beta k) S as well as "
        "in the write. beta scales the correction written, not the key the state is queried with: "
        "S + beta k (v - k S)^T.",
        chapter=17, topic="linear")
mistake("no-erase", "the delta rule written as linear attention's update (nothing erased)",
        "Your new state matches S + beta k v^T: the value is added on top of what the state already holds for "
        "k. The delta rule writes the ERROR, v minus the state's prediction k S, so that the old value is erased.",
        chapter=17, topic="linear")
mistake("decay-after-write", "the decay gate applied after the write instead of before it",
        "Your outputs match alpha * (S + beta k (v - k S)^T): the gate decays the new token's write too, and the "
        "error is computed against the undecayed state. Gated DeltaNet decays first, S <- alpha S, then computes "
        "the error against that decayed state and writes it.",
        chapter=17, topic="linear")
mistake("keys-not-normalized", "queries and keys used without L2 normalisation",
        "Your outputs match the rule with {detail}. Gated DeltaNet L2-normalises every query and key "
        "(x / sqrt(|x|^2 + eps)) and then scales the queries by 1 / sqrt(Dk); without it the update "
        "(I - beta k k^T) amplifies the state whenever |k|^2 > 2.",
        chapter=17, topic="linear")
mistake("chunk-mask-diagonal", "the chunk's causal mask with the diagonal on the wrong side",
        "Your chunk matches one in which {detail}. Within a chunk the writes depend only on EARLIER writes (the "
        "triangular system is strictly lower, s < t), while each output reads its own token's write too (the "
        "output's mask includes the diagonal, s <= t).",
        chapter=17, topic="linear")
mistake("chunk-start-state-ignored", "the state from before the chunk left out",
        "Your chunk is right only when it starts from an empty state: {detail}. The chunk's writes correct what "
        "the state before it predicts (V - K S0), its outputs read it (Q S0), and the state after the chunk is "
        "S0 plus the chunk's writes.",
        chapter=17, topic="linear")
mistake("not-token-by-token", "the recurrent exercise answered with the parallel form (or without a state)",
        "Your outputs are right, but your code formed {detail}: exercise 1 asks for the recurrence, one token at a "
        "time through a (Dk, Dv) state per sequence and head, which never needs a (T, T) matrix of scores or of "
        "mask. Where does your code still look at all the tokens at once?",
        chapter=17, topic="linear")
mistake("rule-from-library", "an exercise of chapter 17 answered by calling the library's own rule",
        "Your function calls the library's {detail}: the notebook asks you not to import "
        "attention_course.linear_attention for exercises 1 to 4 (writing the rule is the exercise).",
        chapter=17, topic="linear")
mistake("delta-key-normalized", "the delta update normalises the key it is given",
        "Your new state matches the delta rule with the key made a unit vector first. The update of exercise 2 "
        "takes k as it is given (normalising it is the layer's job, exercise 3): on a key of norm 1 both agree, "
        "on these keys (norms from 0.5 to 1.5) they do not.",
        chapter=17, topic="linear")
mistake("delta-divided-by-norm", "the delta update's write divided by |k|^2",
        "Your new state matches S + beta k (v - k S)^T / |k|^2: a division by the key's squared norm that the "
        "delta rule does not have. It is invisible on unit keys; these keys have norms from 0.5 to 1.5.",
        chapter=17, topic="linear")


# ==================================================================================================================
# Chapter 18: attention at serving time (paged cache, continuous batching, speculative decoding)
# ==================================================================================================================

mistake("block-index-off-by-one", "the block of a position taken one entry too far in the block table",
        "Your slots are those of table[position // block_size + 1]: the block index is off by one. Positions "
        "0 .. block_size - 1 are in the FIRST block of the table, table[0].",
        chapter=18, topic="serving")
mistake("slot-ignores-table", "the slot of a position computed as if the cache were contiguous",
        "Your slot is the position itself: that is a contiguous buffer. In a paged cache the position's block is "
        "table[position // block_size], anywhere in the pool.",
        chapter=18, topic="serving")
mistake("slot-block-not-scaled", "the block id added to the offset without multiplying by the block size",
        "Your slot is table[position // block_size] + offset: a block id counts blocks, not slots. Block n starts "
        "at slot n * block_size.",
        chapter=18, topic="serving")
mistake("shared-block-freed", "a shared block freed while another sequence still references it",
        "Your copy-on-write puts the old block back on the free list (or sets its count to 0) although another "
        "sequence still holds it: the next allocation would overwrite that sequence's keys and values. Drop ONE "
        "reference; a block is free only when its count reaches 0.",
        chapter=18, topic="serving")
mistake("cow-no-copy", "a shared block written in place instead of copied first",
        "Your table still points at the shared block: writing into it changes the other sequences' cache too. A "
        "block with more than one reference must be copied to a free block before the write.",
        chapter=18, topic="serving")
mistake("cow-refs-not-moved", "the copy made but the old block's reference count not lowered",
        "Your copy is right but the old block keeps the reference this sequence gave up: it will never return to "
        "the free list (a leak). The reference moves from the old block to the copy.",
        chapter=18, topic="serving")
mistake("verify-mask-top-left", "the verify pass's causal mask aligned top-left",
        "Your mask lets proposal i see only keys 0 .. i, as if the queries were the FIRST positions. The k + 1 "
        "queries of the verify pass are the LAST positions of the sequence (after the cache): align the causal mask "
        "bottom-right (key j visible iff j <= i + num_cached).",
        chapter=18, topic="serving")
mistake("verify-mask-sees-future", "proposals allowed to see the proposals after them",
        "Your mask lets every query see every key, so proposal i reads the proposals after it: its logits are not "
        "what the target predicts from the tokens before it. Keep the causal part.",
        chapter=18, topic="serving")
mistake("verify-mask-drops-cache", "the verify mask covers only the k + 1 new tokens, not the cache",
        "Your mask has shape (k + 1, k + 1): the keys are the cache AND the new tokens, num_cached + k + 1 of them.",
        chapter=18, topic="serving")
mistake("rejection-not-residual", "after a rejection, drawing from the target p instead of the residual",
        "On a rejection you return the target's p itself. Part of p's mass has already been given out through the "
        "draft tokens that were accepted: drawing the replacement from all of p gives those tokens a second chance "
        "(chapter 18, the rejection rule's proof: what is left of p after the accepted part).",
        chapter=18, topic="serving")
mistake("rejection-ratio-inverted", "a draft token accepted with probability min(1, q/p) instead of min(1, p/q)",
        "Your acceptance probability is upside down: you keep x most often where the DRAFT likes it more than the "
        "target does. Which of the two distributions must the output follow, and which one proposed x?",
        chapter=18, topic="serving")
mistake("rejection-always-accepts", "every draft token accepted",
        "You return the draft's token whatever u is: the output then has the DRAFT's distribution q. The uniform "
        "number u is what makes the decision random.",
        chapter=18, topic="serving")
mistake("finished-left-in-batch", "a finished sequence left in the batch",
        "A sequence that produced its end-of-sequence token or reached max_new_tokens stays in your batch: it keeps "
        "its blocks and its seat and produces tokens nobody asked for. Both events end a sequence.",
        chapter=18, topic="serving")
mistake("retired-too-early", "a sequence retired one token before its limit",
        "Your batch drops a sequence that has max_new_tokens - 1 tokens: it may still produce one. It leaves when it "
        "HAS max_new_tokens tokens.",
        chapter=18, topic="serving")
mistake("eos-zero-ignored", "an end-of-sequence id of 0 taken for 'no end-of-sequence id'",
        "Your batch keeps a sequence whose last token is the end-of-sequence id when that id is 0: 0 is a token id "
        "like any other, and only None means 'no such token'. Look at how your code tests eos_token_id.",
        chapter=18, topic="serving")
