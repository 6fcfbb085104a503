"""Mistakes of chapters 1 to 6 and of any check (running the student's code,
checked questions)."""

from attention_course.mistakes.catalogue import _MHA, _SDPA, _SHA, mistake

# =============================================================================
# Any check: running the student's code, the kind and shape of its result
# =============================================================================

mistake(
    "wrong-shape",
    "the result has the wrong shape",
    examples=[("padding_mask_2d", "check_padding_mask")],
)
mistake(
    "wrong-type",
    "the result is not an array/tensor of the expected kind (or has the "
    "wrong dtype)",
)
mistake(
    "returned-none",
    "the function returned None (missing return statement)",
    "Your function returned None: did you forget the `return` statement?",
)
mistake("not-implemented", "the function still raises NotImplementedError")
mistake("raised-exception", "the function raised an exception")
mistake("timeout", "the function did not return within the time limit")
mistake(
    "calls-reference",
    "the implementation calls the reference (the library, SDPA, "
    "nn.MultiheadAttention, "
    "Keras MultiHeadAttention) or hides or inspects what it calls (grader "
    "only)",
)
mistake(
    "sandbox-ended",
    "the submission's process stopped answering while its function was "
    "checked (grader only)",
)
mistake(
    "not-run",
    "the check cell never ran: the notebook stopped before it (grader only)",
)
mistake(
    "left-torch",
    "code that moves its inputs to NumPy or Python lists where the check "
    "watches torch",
    "Your code converted a tensor with {detail}: this exercise's rule (what "
    "may be formed, how it is computed) "
    "is checked by watching the torch operations your code runs, and NumPy "
    "or Python lists are out of that "
    "sight. Keep the computation in torch (the inputs are torch tensors).",
)
mistake(
    "mutates-input",
    "the function modified one of its input arrays in place",
    "Your function changed its input `{detail}` in place (e.g. with `x -= "
    "...` or `x /= ...`). Compute new arrays "
    "instead of modifying the arguments: the caller still needs them.",
    examples=[("softmax_in_place", "check_softmax")],
)
mistake(
    "nan-output",
    "the result contains NaN or inf where the reference is finite",
    "Your result contains NaN or inf values where the reference is finite.",
)
mistake(
    "missing-attribute",
    "the module lacks an attribute the exercise asks for (e.g. w_q)",
)
mistake("wrong-value", "a numeric answer differs from the expected value")
mistake(
    "wrong-output",
    "the result differs from the reference and matches no known mistake",
)

# =============================================================================
# Checked questions (checks/questions.py): predict-then-run, read-the-plot,
# conceptual
# =============================================================================

mistake(
    "wrong-answer",
    "a question's answer is not the right one",
    topic="questions",
)
mistake(
    "invalid-answer",
    "a question's answer is not one of its letters, or not a number",
    topic="questions",
)

# =============================================================================
# Chapter 1: attention as a soft lookup (the attention core, softmax)
# =============================================================================

mistake(
    "missing-scale",
    "scores not divided by sqrt(d_k)",
    "Your scores are not divided by sqrt(d_k): your output matches "
    "softmax(q @ k^T) @ v without the 1/sqrt(d_k) "
    "factor. Multiply the scores by 1 / sqrt(d_k), with d_k = q.shape[-1], "
    "before the softmax.",
    chapter=1,
    topic="core",
    examples=[("sdpa_missing_scale", _SDPA), ("SHAMissingScale", _SHA)],
)
mistake(
    "wrong-scale",
    "scores scaled by the wrong factor (d_k, sqrt(T), sqrt(d_model), ...)",
    "Your scores are scaled by the wrong factor: {detail}. The scale is 1 / "
    "sqrt of the number of terms each dot "
    "product sums (chapter 1; for several heads, chapter 3's 'Splitting and "
    "merging heads').",
    chapter=1,
    topic="core",
    examples=[
        ("sdpa_scale_by_dk", _SDPA),
        ("sdpa_scale_by_seq_len", _SDPA),
        ("MHAScaleByDModel", _MHA),
        ("SHAScaleByDIn", _SHA),
    ],
)
mistake(
    "softmax-wrong-axis",
    "softmax normalised along the wrong axis",
    "Your softmax normalises along the wrong axis ({detail}). Each query's "
    "weights over the keys must sum to 1: "
    "take the softmax along the last axis (axis=-1 / dim=-1).",
    chapter=1,
    topic="core",
    examples=[
        ("sdpa_softmax_wrong_axis", _SDPA),
        ("SHASoftmaxWrongAxis", _SHA),
    ],
)
mistake(
    "softmax-overflow",
    "softmax without subtracting the maximum overflows to NaN for large "
    "inputs",
    "Your softmax overflows: for large inputs (e.g. 1000) exp() gives inf "
    "and inf / inf is NaN. Subtract each "
    "row's maximum before exp() (softmax does not change when you shift a "
    "row).",
    chapter=1,
    topic="core",
    examples=[("softmax_no_max", "check_softmax")],
)
mistake(
    "softmax-global-max",
    "softmax subtracting the maximum of the whole array instead of each row's",
    "Your softmax subtracts the maximum of the whole array, not each row's "
    "own: a row whose values are all far "
    "below that maximum underflows to 0 / 0 = NaN (e.g. [[0, 1], [2000, "
    "2001]]). Subtract "
    "x.max(axis=-1, keepdims=True).",
    chapter=1,
    topic="core",
)
mistake(
    "transposed-scores",
    "scores computed as k @ q^T instead of q @ k^T",
    "Your scores are transposed: you computed k @ q^T (keys x queries) "
    "instead of q @ k^T (queries x keys). Row "
    "i of the scores must belong to query i.",
    chapter=1,
    topic="core",
    examples=[("sdpa_transposed_scores", _SDPA)],
)
mistake(
    "values-from-keys",
    "output computed from the keys instead of the values",
    "Your output is a weighted sum of the keys, not of the values{detail}. "
    "Multiply the attention weights by the "
    "values.",
    chapter=1,
    topic="core",
    examples=[
        ("sdpa_values_from_keys", _SDPA),
        ("MHAValuesFromKeys", _MHA),
        ("SHAValuesFromKeys", _SHA),
    ],
)
mistake(
    "weights-not-normalized",
    "attention weights do not sum to 1 (masked after the softmax, or no "
    "division)",
    "Your attention weights do not sum to 1 over the keys: {detail}. Each "
    "query's weights are its exponentials "
    "divided by their sum (chapter 1).",
    chapter=1,
    topic="core",
    examples=[("sdpa_mask_zero_after_softmax", _SDPA)],
)

# =============================================================================
# Chapter 2: a single attention head (nn.Linear projections, dropout)
# =============================================================================

mistake(
    "weight-not-transposed",
    "an nn.Linear weight used as x @ linear.weight (it is stored (d_out, "
    "d_in): x @ weight.T)",
    "Your projections compute x @ linear.weight, but nn.Linear stores its "
    "weight as (d_out, d_in) and computes "
    "x @ weight.T + bias: call the layer (self.w_q(x)) or transpose the "
    "weight. With d_in == d_out the shapes fit "
    "and the result is silently wrong; with d_in != d_out it fails with a "
    "shape error.",
    chapter=2,
    topic="modules",
    examples=[
        ("SHAWeightNotTransposed", _SHA),
        ("MHAWeightNotTransposed", _MHA),
    ],
)
mistake(
    "dropout-in-eval",
    "dropout still active after .eval() / with training=False",
    "Your module is not deterministic in evaluation mode: built with "
    "dropout=0.5, {detail}. Dropout must act in "
    "training mode only: find your dropout and what tells it which mode the "
    "module is in (chapter 7, 'Dropout in "
    "evaluation mode').",
    chapter=2,
    topic="modules",
    examples=[("MHADropoutInEval", _MHA), ("SHADropoutInEval", _SHA)],
)
mistake(
    "dropout-off-in-training",
    "dropout never acts, even in training mode",
    "Your module never drops anything: {detail}. Dropout regularises "
    "training: in .train() mode each attention "
    "weight is zeroed with probability p and the others are scaled by 1 / "
    "(1 - p). A module that never drops "
    "(no dropout layer, or training=False written in) trains without it "
    "(chapter 2).",
    chapter=2,
    topic="modules",
)
mistake(
    "dropout-wrong-rate",
    "dropout in training mode with another probability than the module's p",
    "Your dropout does not use the module's probability: {detail}. Check "
    "which number reaches the dropout call "
    "(the drop probability p, not the keep probability 1 - p).",
    chapter=2,
    topic="modules",
)
mistake(
    "dropout-wrong-tensor",
    "dropout applied to another tensor than the attention weights",
    "Your dropout acts on the wrong tensor: {detail}. In attention, dropout "
    "zeroes attention WEIGHTS (after the "
    "softmax, before they multiply the values); the output uses the weights "
    "that were dropped.",
    chapter=2,
    topic="modules",
)

# =============================================================================
# Chapter 3: multi-head attention (splitting and merging heads, the output
# projection)
# =============================================================================

mistake(
    "heads-split-without-transpose",
    "heads split with a reshape only, without the transpose",
    "Your heads are split with a reshape only: reshaping (B, T, D) straight "
    "to (B, H, T, Dh) scrambles positions "
    "and features. Reshape to (B, T, H, Dh) first, then transpose to (B, H, "
    "T, Dh).",
    chapter=3,
    topic="heads",
    examples=[
        ("split_heads_view", "check_split_heads"),
        ("MHASplitWithoutTranspose", _MHA),
    ],
)
mistake(
    "merge-heads-wrong-order",
    "heads merged without transposing back first",
    "Your output mixes positions: the merged (B, T, D) rows hold features "
    "of other positions, because the heads "
    "are merged from (B, H, T, Dh) in the wrong order. Chapter 3, "
    "'Splitting and merging heads', shows which axes "
    "must be neighbours before a reshape.",
    chapter=3,
    topic="heads",
    examples=[
        ("merge_heads_view", "check_merge_heads"),
        ("MHAMergeWrongOrder", _MHA),
    ],
)
mistake(
    "missing-output-projection",
    "the output projection w_o is not applied",
    "Your output skips the output projection: after merging the heads, "
    "apply w_o.",
    chapter=3,
    topic="modules",
    examples=[("MHAMissingOutputProjection", _MHA)],
)

# =============================================================================
# Chapter 4: masking (the mask convention: boolean, True = may attend; causal
# and padding masks)
# =============================================================================

mistake(
    "mask-ignored",
    "the mask has no effect",
    "Your output ignores the mask: keys where the mask is False get the "
    "weight they would have without a mask. "
    "Follow the masked scores from where they are made to the softmax: does "
    "the softmax get them? (chapter 4, "
    "'The causal mask').",
    chapter=4,
    topic="core",
    examples=[("sdpa_mask_ignored", _SDPA), ("SHAMaskIgnored", _SHA)],
)
mistake(
    "mask-inverted",
    "the mask is applied the wrong way round (True treated as 'blocked')",
    "Your mask is inverted: {detail}. In this course True = may attend (as "
    "in PyTorch's "
    "scaled_dot_product_attention; nn.MultiheadAttention's masks use the "
    "opposite convention: chapter 4, 'The "
    "other convention').",
    chapter=4,
    topic="masks",
    examples=[
        ("sdpa_mask_inverted", _SDPA),
        ("causal_mask_triu", "check_causal_mask"),
        ("SHAMaskInverted", _SHA),
    ],
)
mistake(
    "mask-wrong-sign",
    "masked positions get a large positive score instead of -inf",
    "Blocked keys get a large POSITIVE score, so they take all the weight "
    "({detail}). Blocked scores must become "
    "-inf (or a large negative number), e.g. scores.masked_fill(~mask, "
    "float('-inf')).",
    chapter=4,
    topic="core",
    examples=[("sdpa_mask_plus_1e10", _SDPA)],
)
mistake(
    "mask-zero-before-softmax",
    "masked scores set to 0 instead of -inf before the softmax",
    "Blocked scores are set to 0 before the softmax, but exp(0) = 1 still "
    "gives them weight. Fill them with -inf "
    "instead, e.g. scores.masked_fill(~mask, float('-inf')).",
    chapter=4,
    topic="core",
    examples=[("sdpa_mask_zero_before_softmax", _SDPA)],
)
mistake(
    "float-mask-not-passed",
    "the fused attention called without the additive float mask the "
    "exercise asks for",
    "The exercise asks for the additive float mask to reach "
    "F.scaled_dot_product_attention, and {detail}. "
    "Build a float mask of q's dtype from the boolean one and pass that as "
    "attn_mask (chapter 4, 'Float masks: "
    "added, not selected').",
    chapter=4,
    topic="core",
)
mistake(
    "float-mask-not-used",
    "a float mask passed to the fused attention that is not the boolean "
    "mask made additive",
    "Your output is right, but no float attn_mask your function passes to "
    "F.scaled_dot_product_attention adds 0 "
    "where the boolean mask allows a key and a large negative number where "
    "it blocks one: the output does not "
    "come from the fused call with the float mask. Print the float mask you "
    "pass next to the boolean one "
    "(chapter 4, 'Float masks: added, not selected').",
    chapter=4,
    topic="core",
)
mistake(
    "nan-on-masked-row",
    "a fully masked query row gives NaN instead of zeros",
    "Your result has NaN in query rows where every key is masked (the "
    "softmax of a row of -inf is 0/0; some "
    "PyTorch kernels return zeros there, others NaN, and the check behaves "
    "like the latter). The course's "
    "convention: such rows get all-zero weights and a zero output, decided "
    "by your code (chapter 4, 'Fully "
    "masked rows: zeros, not NaN').",
    chapter=4,
    topic="core",
    examples=[("sdpa_nan_on_masked_row", _SDPA)],
)
mistake(
    "masked-row-not-zero",
    "a fully masked query row gives uniform weights instead of zeros",
    "In query rows where every key is masked your weights are spread evenly "
    "over all keys (what filling with a "
    "large negative number such as -1e9 gives). The course's convention: "
    "such rows get all-zero weights and a "
    "zero output.",
    chapter=4,
    topic="core",
    examples=[("sdpa_mask_minus_1e9", _SDPA)],
)
mistake(
    "causal-top-left-aligned",
    "causal mask aligned top-left when Tq < Tk (should be bottom-right)",
    "For Tq < Tk your causal mask is aligned top-left (query i sees keys "
    "0..i). In this course the queries are "
    "the LAST Tq positions: query i may attend key j iff j <= i + (Tk - "
    "Tq), e.g. tril with diagonal=Tk - Tq.",
    chapter=4,
    topic="masks",
    examples=[
        ("causal_mask_top_left", "check_causal_mask"),
        ("causal_mask_buffer_sliced", "check_causal_mask"),
    ],
)
mistake(
    "causal-excludes-diagonal",
    "causal mask hides each position from itself",
    "Your causal mask hides each position from itself: query i must be able "
    "to attend key i (the diagonal is "
    "True).",
    chapter=4,
    topic="masks",
    examples=[("causal_mask_strict", "check_causal_mask")],
)
mistake(
    "off-by-one",
    "padding mask off by one position",
    "Your padding mask is off by one: key j of sequence b may be attended "
    "iff j < lengths[b].",
    chapter=4,
    topic="masks",
    examples=[("padding_mask_off_by_one", "check_padding_mask")],
)

# =============================================================================
# Chapters 5 and 6: einsum and Keras (weights in the y = x @ W + b layout)
# =============================================================================

mistake(
    "weight-layout-transposed",
    "a weight matrix read in the other layout: (d_out, d_in) used as (d_in, "
    "d_out) or the reverse (W instead of "
    "W.T)",
    "Your output matches attention computed with {detail} transposed: a "
    "weight matrix was read in the other "
    "layout. The course's parameter dictionaries and Keras' Dense kernels "
    "store W as (d_in, d_out), for "
    "y = x @ W + b; nn.Linear stores its weight as (d_out, d_in), for y = x "
    "@ weight.T + b. Converting from one "
    "layout to the other needs a transpose; reading one as the other only "
    "runs when d_in == d_out, and then the "
    "result is silently wrong.",
    chapter=5,
    topic="modules",
    examples=[
        ("mha_params_with_f_linear", "check_einsum_attention"),
        ("EinsumMHALoadsTransposed", "check_einsum_attention"),
    ],
)
mistake(
    "kernel-heads-interleaved",
    "per-head kernels that give feature f to head f % H (reshaped to (d_in, "
    "Dh, H)) instead of head f // Dh",
    "Your {detail} give head h the features h, h + H, h + 2H, ...: the "
    "heads are interleaved. PyTorch and Keras "
    "both give head h the consecutive features h * Dh .. (h + 1) * Dh - 1, "
    "so a (d_in, H * Dh) kernel becomes "
    "(d_in, H, Dh) by a plain reshape, head axis first, and an (H * Dh, "
    "d_out) one becomes (H, Dh, d_out).",
    chapter=6,
    topic="porting",
)
mistake(
    "qkv-chunks-swapped",
    "nn.MultiheadAttention's packed in_proj_weight cut in the wrong order "
    "(rows 0:D query, D:2D key, 2D:3D value)",
    "Your {detail}. nn.MultiheadAttention packs its three input projections "
    "along the ROWS of in_proj_weight "
    "(3 D, D): rows 0 .. D-1 project the queries, D .. 2D-1 the keys, 2D .. "
    "3D-1 the values, and in_proj_bias "
    "follows the same order. When keys and values come from the same tensor "
    "a swap of those two still runs; only "
    "the numbers are wrong.",
    chapter=6,
    topic="porting",
)
