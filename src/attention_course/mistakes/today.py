"""Mistakes of chapters 14 to 18 (today's models, FlexAttention, Triton, linear
attention, serving)."""

from attention_course.mistakes.catalogue import mistake

# =============================================================================
# Chapter 14: attention in today's open models
# =============================================================================

mistake(
    "cap-on-probabilities",
    "soft-capping applied to the attention probabilities instead of the "
    "scores",
    "Your output matches cap * tanh(.) applied to the softmax's "
    "PROBABILITIES. Gemma 2 caps the SCORES, before "
    "the mask and the softmax: s -> cap * tanh(s / cap). Probabilities are "
    "already in [0, 1]: capping them "
    "changes almost nothing and the rows no longer sum to 1.",
    chapter=14,
    topic="modern",
    examples=[("softcap_on_probabilities", "check_softcap_attention")],
)
mistake(
    "cap-after-mask",
    "soft-capping applied after the mask: the masked scores become -cap, "
    "not -inf",
    "Your output matches scores soft-capped AFTER the mask: tanh(-inf) = "
    "-1, so every masked score becomes -cap "
    "and the future keys get a weight again. The order of the cap and the "
    "mask matters (chapter 14, 'Gemma 2: "
    "logit soft-capping and its own query scale').",
    chapter=14,
    topic="modern",
)
mistake(
    "norm-after-rope",
    "QK-norm applied after RoPE instead of before it",
    "Your result is RoPE first, then the RMSNorm (and its weight). Qwen3 "
    "normalises each head's queries and keys "
    "BEFORE rotating them: the norm's weight scales features one by one, "
    "and scaling then rotating a pair is not "
    "rotating then scaling it (unless both features of the pair have the "
    "same weight).",
    chapter=14,
    topic="modern",
    examples=[("qk_norm_after_rope", "check_qk_norm_rope")],
)
mistake(
    "sink-given-value",
    "an attention sink treated as a token with a value",
    "Your output adds the sink's weight times a value (the first token's). "
    "A sink is only a logit in the "
    "softmax's denominator: its weight is simply not given to any value "
    "(weights @ v over the real keys only).",
    chapter=14,
    topic="modern",
    examples=[("sinks_with_value", "check_sink_attention")],
)
mistake(
    "sink-ignored",
    "attention sinks left out of the softmax",
    "Your output is attention without the sinks: each row of weights sums "
    "to 1. Append the head's sink logit to "
    "every row of scores, take the softmax over Tk + 1 columns, then drop "
    "the sink's column.",
    chapter=14,
    topic="modern",
    examples=[("sinks_ignored", "check_sink_attention")],
)
mistake(
    "absorption-transposed",
    "MLA weight absorption with W_uk transposed",
    "Your scores match q_nope @ w_uk.T @ c.T. The keys are k = c @ "
    "w_uk[h].T (w_uk[h] is (N, C)), so "
    "q . k = q @ w_uk[h] @ c.T: multiply the query by w_uk[h] itself (N -> "
    "C), not by its transpose (which "
    "only has the right shape when N == C).",
    chapter=14,
    topic="modern",
    examples=[("absorbed_scores_transposed", "check_absorbed_scores")],
)
mistake(
    "keys-formed",
    "MLA: the keys formed from the latent cache, where absorption never "
    "forms them",
    "Your scores are right, but your code formed the keys: {detail} "
    "appeared among the tensors it computed. "
    "Weight absorption exists so that a decoding step reads only the small "
    "latent cache c, never the expanded "
    "(B, H, T, N) keys: what can move onto the query instead of onto c? "
    "(chapter 14, 'DeepSeek-V2/V3: "
    "multi-head latent attention')",
    chapter=14,
    topic="modern",
)
mistake(
    "norm-per-head",
    "OLMo 2's QK-norm taken per head instead of over all heads' features",
    "Your result normalises each head's Dh features apart (Qwen3's form). "
    "OLMo 2's q_norm and k_norm are one "
    "RMSNorm over the whole projection, H * Dh features per token, applied "
    "BEFORE the split into heads: the "
    "mean of x^2 runs over all heads at once, and the weight has H * Dh "
    "entries.",
    chapter=14,
    topic="modern",
)
mistake(
    "values-formed",
    "MLA: the values or the heads' outputs formed, where W_uv folds into "
    "the output projection",
    "Your output is right, but your code formed {detail}. Folding W_uv into "
    "W_o exists so that a decoding step "
    "never expands the latent cache into per-head values or outputs: which "
    "product of weights can be computed "
    "once, before any token is seen? (An einsum of several operands picks "
    "its own order of contraction, and "
    "may form them.)",
    chapter=14,
    topic="modern",
)
mistake(
    "heads-split-wrong",
    "the output projection's columns split into heads in the wrong order",
    "Your result matches w_o's columns read as (V, H): feature-major. The "
    "heads are concatenated head-major "
    "before the output projection: head h owns the columns h * V to (h + 1) "
    "* V of w_o "
    "(w_o.view(D, H, V)[:, h]).",
    chapter=14,
    topic="modern",
)
mistake(
    "cache-window-off-by-one",
    "a sliding layer's cache counted with one token more or less than its "
    "window",
    # a known wrong answer of question 14.gemma3-cache, which writes the
    # message
    chapter=14,
    topic="modern",
)


# =============================================================================
# Chapter 15: FlexAttention (mask_mod and score_mod functions)
# =============================================================================

mistake(
    "mod-roles-swapped",
    "a mask_mod that compares q_idx and kv_idx the wrong way round",
    "Your mask_mod matches the right mask with the query and key roles "
    "swapped: {detail}. A mask_mod answers "
    "whether query q_idx may attend key kv_idx; causally that is kv_idx <= "
    "q_idx (the key is not in the "
    "query's future).",
    chapter=15,
    topic="flex",
)
mistake(
    "mod-window-off-by-one",
    "a mask_mod whose boundary (prefix, window edge, diagonal) is off by one",
    "Your mask_mod matches a mask in which {detail}. Check each comparison: "
    "< where <= belongs, or the "
    "reverse, moves a boundary by one key.",
    chapter=15,
    topic="flex",
)
mistake(
    "bias-sign-flipped",
    "a score_mod that adds a bias with the wrong sign",
    "Your score_mod matches {detail}: the bias has the wrong sign, so "
    "distant keys get MORE attention. ALiBi "
    "SUBTRACTS slope * |distance| from the score.",
    chapter=15,
    topic="flex",
)
mistake(
    "doc-id-wrong-index",
    "a document mask that reads a document id at the wrong index",
    "Your mask_mod matches a document mask that reads {detail}. The query's "
    "document is doc_ids[b, q_idx], the "
    "key's is doc_ids[b, kv_idx]: compare those two.",
    chapter=15,
    topic="flex",
)
mistake(
    "doc-ids-assumed-sorted",
    "a document mask that compares document ids by their order",
    "Your mask_mod matches {detail} (with the causal part): that equals "
    "'the same document' only while the ids "
    "rise (or fall) along the row. An id names a document, not its place: "
    "here the ids of a row are in no "
    "particular order (see the case's doc_ids).",
    chapter=15,
    topic="flex",
)
mistake(
    "chunk-not-causal",
    "a chunked mask that lets a query see the later keys of its chunk",
    "Your mask_mod matches a chunked mask in which {detail}: inside its "
    "chunk a query may still see only the "
    "keys that are not in its future.",
    chapter=15,
    topic="flex",
)
mistake(
    "chunk-is-window",
    "a chunked mask written as a sliding window",
    "Your mask_mod matches {detail}. A chunk's boundaries are fixed "
    "positions, the same for every query in it: "
    "a window moves with the query, a chunk does not.",
    chapter=15,
    topic="flex",
)
mistake(
    "chunk-boundary-off-by-one",
    "a chunked mask whose chunk boundaries sit one position off",
    "Your mask_mod matches a chunked mask with {detail}. Chunk 0 holds "
    "positions 0 to chunk - 1: check which "
    "chunk position 0, chunk - 1 and chunk fall in.",
    chapter=15,
    topic="flex",
)
mistake(
    "decode-offset-ignored",
    "a decode-time mask_mod that forgets the captured offset",
    "Your mask_mod matches a mask in which {detail}. At decode time q_idx "
    "counts the new queries from 0; the "
    "query's place in the sequence is q_idx plus the tokens already in the "
    "cache.",
    chapter=15,
    topic="flex",
)
mistake(
    "decode-offset-off-by-one",
    "a decode-time mask_mod that places the query one position off",
    "Your mask_mod matches a mask in which {detail}. Check where the new "
    "token stands: the cache holds the keys "
    "before it, and its own key sits in slot offset.",
    chapter=15,
    topic="flex",
)
mistake(
    "decode-reads-empty-slots",
    "a decode-time mask_mod that lets the query read the cache's unwritten "
    "slots",
    "Your mask_mod matches a mask in which {detail}: a preallocated cache "
    "has slots not yet written, and "
    "nothing after the query's own position may be read.",
    chapter=15,
    topic="flex",
)
mistake(
    "masks-or-not-and",
    "two masks joined by or where both must hold",
    "Your answer matches {detail}. Documents AND a window: a pair is "
    "allowed only when BOTH allow it (&, "
    "and_masks); with | a query would also see the window's keys of the "
    "previous document.",
    chapter=15,
    topic="flex",
)
mistake(
    "mask-term-missing",
    "a combined mask with one of its two parts left out",
    "Your answer matches {detail}: one of the two conditions is missing. "
    "Each pair must lie in the same "
    "document AND within the window.",
    chapter=15,
    topic="flex",
)
mistake(
    "tiles-dense-count",
    "a block mask's computed tiles counted as every tile of the grid",
    "Your count is every tile of the grid: what a dense mask computes. A "
    "tile is computed only if it holds at "
    "least one allowed pair; the others are skipped.",
    chapter=15,
    topic="flex",
)
mistake(
    "partial-tiles-skipped",
    "a block mask's partial tiles counted as skipped",
    "Your count leaves out the partial tiles: a tile holding some allowed "
    "pairs is computed too, with the mask "
    "applied inside it. Only a tile without any allowed pair is skipped.",
    chapter=15,
    topic="flex",
)
mistake(
    "sink-in-numerator",
    "a sink's exp added to the numerator of the rescaling instead of the "
    "denominator",
    "Your output is the sink-free output times (Z + e^sink) / Z, with Z = "
    "e^lse: it grows where it must "
    "shrink. The sink adds e^sink to the softmax's DENOMINATOR only (it has "
    "no value): every weight becomes "
    "e^s / (Z + e^sink), so the output is scaled by Z / (Z + e^sink).",
    chapter=15,
    topic="flex",
)
mistake(
    "lse-wrong-base",
    "FlexAttention's log-sum-exp read in base 2 (or converted as if it were)",
    "Your output rescales with the log-sum-exp converted between bases (a "
    "factor ln 2). FlexAttention's kernel "
    "works in base 2 inside, but the lse it returns is the natural log of "
    "the row's sum of e^score, the same "
    "base as the sink logit: compare them directly.",
    chapter=15,
    topic="flex",
)
mistake(
    "sinks-per-query",
    "the sinks (H,) broadcast along the queries instead of the heads",
    "Your output uses sinks[i] for query i: the (H,) sinks met the lse (B, "
    "H, Tq) on its LAST axis, which "
    "only broadcasts here because Tq == H. One sink per head: index it as "
    "sinks[:, None] against (B, H, Tq).",
    chapter=15,
    topic="flex",
)
mistake(
    "sink-renormalised-twice",
    "the sink's rescaling applied twice",
    "Your output is the sink-free output times sigmoid(lse - sink) squared: "
    "the sink's share was taken out "
    "twice (for example the weights rescaled and the output rescaled "
    "again). FlexAttention's output is "
    "already normalised over the keys; one factor Z / (Z + e^sink) adds the "
    "sink.",
    chapter=15,
    topic="flex",
)
mistake(
    "sink-as-column",
    "the sink appended as a column of the scores (or a key) instead of "
    "taken from the lse",
    "Your code formed {detail}: one more column than there are keys, the "
    "sink appended to the scores (by hand, "
    "in SDPA's mask with an extra key, or in a softmax). The values are "
    "right, but the exercise is the other "
    "road, the one FlexAttention needs: it cannot add a column, so take the "
    "output and the log-sum-exp it "
    "returns and rescale the output by sigmoid(lse - sink).",
    chapter=15,
    topic="flex",
)
mistake(
    "lse-not-requested",
    "sinks added without FlexAttention's log-sum-exp",
    "The exercise asks for the sink from FlexAttention's log-sum-exp, and "
    "{detail}. Call flex_attention(..., "
    "return_aux=AuxRequest(lse=True)) and correct its output with the lse "
    "it returns.",
    chapter=15,
    topic="flex",
)
mistake(
    "scores-outside-flex",
    "sinks added to attention computed beside FlexAttention, not from its lse",
    "Your code computed query-key scores (or attention) itself ({detail}): "
    "the exercise asks FlexAttention for "
    "the output and the log-sum-exp, and corrects them with the sink; "
    "nothing else computes attention.",
    chapter=15,
    topic="flex",
)
mistake(
    "sinks-from-library",
    "the sinks added by the library's own function, which the exercise asks "
    "you to write",
    "Your function calls the library's {detail}: the exercise asks you to "
    "correct FlexAttention's output from "
    "its log-sum-exp yourself (that is the exercise).",
    chapter=15,
    topic="flex",
)
mistake(
    "mod-from-library",
    "an exercise's mod that calls the library's own mod, which the notebook "
    "forbids",
    "Your mod calls the library's {detail}: the notebook asks for your own "
    "mod, written with tensor operations "
    "on the index tensors (that is the exercise).",
    chapter=15,
    topic="flex",
)
mistake(
    "mod-fails-in-flex",
    "a mod right on a broadcast grid that fails inside create_block_mask or "
    "flex_attention",
    "Your mod gives the right answers on the check's broadcast grid, but "
    "run through the real "
    "create_block_mask / flex_attention {detail}. There vmap hands the mod "
    "one index per tensor (0-dim tensors): "
    "look for what your mod reads from the index tensors besides their "
    "values (a shape, a Python number, an "
    "axis it expects to broadcast over) (chapter 15, the mods as functions "
    "of indices).",
    chapter=15,
    topic="flex",
)


# =============================================================================
# Chapter 16: FlashAttention written in Triton
# =============================================================================

mistake(
    "sum-not-rescaled",
    "online softmax in a kernel: the running sum not rescaled when a tile "
    "raises the maximum",
    "Your output matches a tile loop in which {detail}. The running sum l "
    "was summed relative to the old "
    "maximum, like the accumulator: when a tile raises the maximum, "
    "multiply both by alpha = exp(m_old - m_new) "
    "before adding the tile's terms (chapter 16, 'The forward kernel').",
    chapter=16,
    topic="kernels",
)
mistake(
    "causal-bound-off-by-one-tile",
    "causal kernel: the loop over key tiles bounded one tile off",
    "Your output matches a causal kernel in which {detail}. For the query "
    "tile [start, start + BLOCK) the tiles "
    "before start are visible to every row (no mask), the tile [start, "
    "start + BLOCK) holds the diagonal (it "
    "needs the mask), and no later tile holds a visible key (chapter 16, "
    "'Where the causal loop stops').",
    chapter=16,
    topic="kernels",
)
mistake(
    "ragged-tile-unmasked",
    "kernel: the key positions past the end of the last, ragged tile not "
    "masked",
    "Your output matches a kernel whose last key tile, which runs past the "
    "T keys, lets its padding in: {detail}. "
    "Lanes loaded with other=0.0 are zero keys with a score of 0, not "
    "nothing; set the scores of the columns "
    ">= T to -inf before the softmax (chapter 16, 'Triton's model: programs "
    "and blocks').",
    chapter=16,
    topic="kernels",
)
mistake(
    "lse-without-max",
    "log-sum-exp stored as log(l), without the running maximum",
    "Your log-sum-exp is log(l), the log of the running sum alone. l sums "
    "exp(s - m), relative to the row "
    "maximum m, so log(sum exp(s)) = m + log(l); without m the backward's "
    "exp(s - lse) is off by exp(m) per row.",
    chapter=16,
    topic="kernels",
)
mistake(
    "lse-without-sum",
    "log-sum-exp stored as the running maximum alone",
    "Your log-sum-exp is the row maximum m. The log-sum-exp is m + log(l), "
    "with l the running sum of "
    "exp(s - m); m alone is its largest term only.",
    chapter=16,
    topic="kernels",
)
mistake(
    "ds-without-d",
    "attention backward: dS = P * dP, without subtracting D = rowsum(dO * O)",
    "Your gradient matches dS = P * dP. The softmax couples a row's "
    "entries: dS = P * (dP - D) with "
    "D = rowsum(dP * P) = rowsum(dO * O), one number per query row (chapter "
    "16, 'The backward pass').",
    chapter=16,
    topic="kernels",
)
mistake(
    "dk-missing-scale",
    "attention backward: dK without the scale 1 / sqrt(d)",
    "Your dK is sqrt(d) times too large: the scores are S = Q K^T / "
    "sqrt(d), so dK = dS^T Q / sqrt(d); the "
    "chain rule passes the scale on to the gradients of Q and K.",
    chapter=16,
    topic="kernels",
)
mistake(
    "kernel-not-written",
    "a kernel exercise answered without a kernel of one's own (PyTorch, "
    "SDPA, autograd, "
    "the library's kernel)",
    "Your function {detail}. The exercise is the Triton kernel itself: the "
    "launcher only allocates the outputs "
    "and launches it; the scores, the softmax and the sums happen inside "
    "the kernel (chapter 16, 'Triton's "
    "model: programs and blocks').",
    chapter=16,
    topic="kernels",
)
mistake(
    "scores-overflow",
    "kernel: exp of the scores overflows at large scores (no running "
    "maximum, or one that "
    "stops following the scores)",
    "Your output has inf or NaN where the reference is finite, with "
    "{detail}: exp overflows float32 above 88. "
    "Look at what each exp subtracts from the scores, at every tile: it "
    "must keep every exponent <= 0 "
    "(chapter 9, the online softmax).",
    chapter=16,
    topic="kernels",
)
mistake(
    "lse-overflows",
    "log-sum-exp formed through exp(m) (log(l * exp(m))), which overflows "
    "at large scores",
    "Your log-sum-exp is inf or NaN where the reference is finite, with "
    "{detail}: somewhere it takes exp of a "
    "row maximum, which overflows float32 above 88. The log-sum-exp can be "
    "formed from m and l without any exp.",
    chapter=16,
    topic="kernels",
)
mistake(
    "lse-not-stored",
    "kernel: the log-sum-exp returned is not what the kernel stored "
    "(computed by the launcher "
    "before or after the launch, or changed after it)",
    "Your log-sum-exp is right, but it is not what your kernel stored: no "
    "launch wrote these numbers. The "
    "backward pass reads the log-sum-exp the forward kernel leaves in "
    "memory; it is formed inside the kernel, "
    "from the m and l each program holds after its loop (chapter 16, 'The "
    "forward kernel').",
    chapter=16,
    topic="kernels",
)
mistake(
    "causal-tiles-not-skipped",
    "causal kernel: key tiles past the diagonal loaded (the loop stops late "
    "or "
    "never), though masked",
    "The values of one key tile were set to inf, and your output has inf or "
    "NaN in {detail}, which may not see "
    "that tile: their programs loaded it. Masked scores do not change the "
    "output, but every tile loaded past "
    "the diagonal costs a load and a tile product for nothing; where does "
    "your causal loop stop (chapter 16, "
    "'Where the causal loop stops')?",
    chapter=16,
    topic="kernels",
)


# =============================================================================
# Chapter 17: linear attention, the delta rule and Gated DeltaNet
# =============================================================================

mistake(
    "state-carried-over",
    "the state of one sequence carried into the next sequence of the batch",
    "Your outputs match a state that is not reset between the sequences of "
    "a batch: {detail}. Each sequence "
    "starts from an empty memory (zeros of shape (Dk, Dv) per head); "
    "sequence b must never see what "
    "sequence b - 1 wrote.",
    chapter=17,
    topic="linear",
)
mistake(
    "read-before-write",
    "each query reads the state before its own token's write",
    "Your output at step t reads the state S_{{t-1}}, before token t's key "
    "and value are written: query t "
    "then never sees its own token (the parallel form with the diagonal "
    "masked out). Write first, then read: "
    "o_t = q_t S_t, as the causal mask j <= i includes the diagonal.",
    chapter=17,
    topic="linear",
)
mistake(
    "beta-missing",
    "the delta rule's writing strength beta left out",
    "Your new state matches S + k (v - k S)^T: the error is written at full "
    "strength. The delta rule moves "
    "the state only a fraction beta towards v: S + beta k (v - k S)^T.",
    chapter=17,
    topic="linear",
)
mistake(
    "beta-on-key",
    "beta applied to the key (so the state is read with beta k)",
    "Your result matches the delta rule with the key replaced by beta * k, "
    "in the read (beta k) S as well as "
    "in the write. beta scales the correction written, not the key the "
    "state is queried with: "
    "S + beta k (v - k S)^T.",
    chapter=17,
    topic="linear",
)
mistake(
    "no-erase",
    "the delta rule written as linear attention's update (nothing erased)",
    "Your new state matches S + beta k v^T: the value is added on top of "
    "what the state already holds for "
    "k. The delta rule writes the ERROR, v minus the state's prediction k "
    "S, so that the old value is erased.",
    chapter=17,
    topic="linear",
)
mistake(
    "decay-after-write",
    "the decay gate applied after the write instead of before it",
    "Your outputs match alpha * (S + beta k (v - k S)^T): the gate decays "
    "the new token's write too, and the "
    "error is computed against the undecayed state. Gated DeltaNet decays "
    "first, S <- alpha S, then computes "
    "the error against that decayed state and writes it.",
    chapter=17,
    topic="linear",
)
mistake(
    "keys-not-normalized",
    "queries and keys used without L2 normalisation",
    "Your outputs match the rule with {detail}. Gated DeltaNet "
    "L2-normalises every query and key "
    "(x / sqrt(|x|^2 + eps)) and then scales the queries by 1 / sqrt(Dk); "
    "without it the update "
    "(I - beta k k^T) amplifies the state whenever |k|^2 > 2.",
    chapter=17,
    topic="linear",
)
mistake(
    "chunk-mask-diagonal",
    "the chunk's causal mask with the diagonal on the wrong side",
    "Your chunk matches one in which {detail}. Within a chunk the writes "
    "depend only on EARLIER writes (the "
    "triangular system is strictly lower, s < t), while each output reads "
    "its own token's write too (the "
    "output's mask includes the diagonal, s <= t).",
    chapter=17,
    topic="linear",
)
mistake(
    "chunk-start-state-ignored",
    "the state from before the chunk left out",
    "Your chunk is right only when it starts from an empty state: {detail}. "
    "The chunk's writes correct what "
    "the state before it predicts (V - K S0), its outputs read it (Q S0), "
    "and the state after the chunk is "
    "S0 plus the chunk's writes.",
    chapter=17,
    topic="linear",
)
mistake(
    "not-token-by-token",
    "the recurrent exercise answered with the parallel form (or without a "
    "state)",
    "Your outputs are right, but your code formed {detail}: exercise 1 asks "
    "for the recurrence, one token at a "
    "time through a (Dk, Dv) state per sequence and head, which never needs "
    "a (T, T) matrix of scores or of "
    "mask. Where does your code still look at all the tokens at once?",
    chapter=17,
    topic="linear",
)
mistake(
    "rule-from-library",
    "an exercise of chapter 17 answered by calling the library's own rule",
    "Your function calls the library's {detail}: the notebook asks you not "
    "to import "
    "attention_course.linear_attention for exercises 1 to 4 (writing the "
    "rule is the exercise).",
    chapter=17,
    topic="linear",
)
mistake(
    "delta-key-normalized",
    "the delta update normalises the key it is given",
    "Your new state matches the delta rule with the key made a unit vector "
    "first. The update of exercise 2 "
    "takes k as it is given (normalising it is the layer's job, exercise "
    "3): on a key of norm 1 both agree, "
    "on these keys (norms from 0.5 to 1.5) they do not.",
    chapter=17,
    topic="linear",
)
mistake(
    "delta-divided-by-norm",
    "the delta update's write divided by |k|^2",
    "Your new state matches S + beta k (v - k S)^T / |k|^2: a division by "
    "the key's squared norm that the "
    "delta rule does not have. It is invisible on unit keys; these keys "
    "have norms from 0.5 to 1.5.",
    chapter=17,
    topic="linear",
)


# =============================================================================
# Chapter 18: attention at serving time (paged cache, continuous batching,
# speculative decoding)
# =============================================================================

mistake(
    "block-index-off-by-one",
    "the block of a position taken one entry too far in the block table",
    "Your slots are those of table[position // block_size + 1]: the block "
    "index is off by one. Positions "
    "0 .. block_size - 1 are in the FIRST block of the table, table[0].",
    chapter=18,
    topic="serving",
)
mistake(
    "slot-ignores-table",
    "the slot of a position computed as if the cache were contiguous",
    "Your slot is the position itself: that is a contiguous buffer. In a "
    "paged cache the position's block is "
    "table[position // block_size], anywhere in the pool.",
    chapter=18,
    topic="serving",
)
mistake(
    "slot-block-not-scaled",
    "the block id added to the offset without multiplying by the block size",
    "Your slot is table[position // block_size] + offset: a block id counts "
    "blocks, not slots. Block n starts "
    "at slot n * block_size.",
    chapter=18,
    topic="serving",
)
mistake(
    "shared-block-freed",
    "a shared block freed while another sequence still references it",
    "Your copy-on-write puts the old block back on the free list (or sets "
    "its count to 0) although another "
    "sequence still holds it: the next allocation would overwrite that "
    "sequence's keys and values. Drop ONE "
    "reference; a block is free only when its count reaches 0.",
    chapter=18,
    topic="serving",
)
mistake(
    "cow-no-copy",
    "a shared block written in place instead of copied first",
    "Your table still points at the shared block: writing into it changes "
    "the other sequences' cache too. A "
    "block with more than one reference must be copied to a free block "
    "before the write.",
    chapter=18,
    topic="serving",
)
mistake(
    "cow-refs-not-moved",
    "the copy made but the old block's reference count not lowered",
    "Your copy is right but the old block keeps the reference this sequence "
    "gave up: it will never return to "
    "the free list (a leak). The reference moves from the old block to the "
    "copy.",
    chapter=18,
    topic="serving",
)
mistake(
    "verify-mask-top-left",
    "the verify pass's causal mask aligned top-left",
    "Your mask lets proposal i see only keys 0 .. i, as if the queries were "
    "the FIRST positions. The k + 1 "
    "queries of the verify pass are the LAST positions of the sequence "
    "(after the cache): align the causal mask "
    "bottom-right (key j visible iff j <= i + num_cached).",
    chapter=18,
    topic="serving",
)
mistake(
    "verify-mask-sees-future",
    "proposals allowed to see the proposals after them",
    "Your mask lets every query see every key, so proposal i reads the "
    "proposals after it: its logits are not "
    "what the target predicts from the tokens before it. Keep the causal "
    "part.",
    chapter=18,
    topic="serving",
)
mistake(
    "verify-mask-drops-cache",
    "the verify mask covers only the k + 1 new tokens, not the cache",
    "Your mask has shape (k + 1, k + 1): the keys are the cache AND the new "
    "tokens, num_cached + k + 1 of them.",
    chapter=18,
    topic="serving",
)
mistake(
    "rejection-not-residual",
    "after a rejection, drawing from the target p instead of the residual",
    "On a rejection you return the target's p itself. Part of p's mass has "
    "already been given out through the "
    "draft tokens that were accepted: drawing the replacement from all of p "
    "gives those tokens a second chance "
    "(chapter 18, the rejection rule's proof: what is left of p after the "
    "accepted part).",
    chapter=18,
    topic="serving",
)
mistake(
    "rejection-ratio-inverted",
    "a draft token accepted with probability min(1, q/p) instead of min(1, "
    "p/q)",
    "Your acceptance probability is upside down: you keep x most often "
    "where the DRAFT likes it more than the "
    "target does. Which of the two distributions must the output follow, "
    "and which one proposed x?",
    chapter=18,
    topic="serving",
)
mistake(
    "rejection-always-accepts",
    "every draft token accepted",
    "You return the draft's token whatever u is: the output then has the "
    "DRAFT's distribution q. The uniform "
    "number u is what makes the decision random.",
    chapter=18,
    topic="serving",
)
mistake(
    "finished-left-in-batch",
    "a finished sequence left in the batch",
    "A sequence that produced its end-of-sequence token or reached "
    "max_new_tokens stays in your batch: it keeps "
    "its blocks and its seat and produces tokens nobody asked for. Both "
    "events end a sequence.",
    chapter=18,
    topic="serving",
)
mistake(
    "retired-too-early",
    "a sequence retired one token before its limit",
    "Your batch drops a sequence that has max_new_tokens - 1 tokens: it may "
    "still produce one. It leaves when it "
    "HAS max_new_tokens tokens.",
    chapter=18,
    topic="serving",
)
mistake(
    "eos-zero-ignored",
    "an end-of-sequence id of 0 taken for 'no end-of-sequence id'",
    "Your batch keeps a sequence whose last token is the end-of-sequence id "
    "when that id is 0: 0 is a token id "
    "like any other, and only None means 'no such token'. Look at how your "
    "code tests eos_token_id.",
    chapter=18,
    topic="serving",
)
mistake(
    "decode-not-first",
    "a step planned in arrival order: an older prefill takes the budget a "
    "decode needs",
    "Your plan serves the sequences in arrival order, so a long prefill of "
    "an older sequence eats the token "
    "budget and a decoding sequence waits a step (its user sees a stall). "
    "The policy runs every decode first, "
    "one token each, and gives prefills what is left.",
    chapter=18,
    topic="serving",
)
mistake(
    "prefill-not-chunked",
    "a prefill that does not fit the budget left out instead of chunked",
    "Your plan skips a prefill whose whole prompt does not fit in what is "
    "left of the token budget. Chunked "
    "prefill runs the part that fits now and the rest in later steps: no "
    "budget is left unused.",
    chapter=18,
    topic="serving",
)
mistake(
    "block-room-ignored",
    "new blocks counted as if a sequence's last block had no room left",
    "Your plan counts ceil(tokens / block_size) new blocks per sequence, so "
    "it preempts when nothing needs to "
    "go. A sequence first fills the free slots of its last block: it needs "
    "ceil((computed + tokens) / "
    "block_size) - ceil(computed / block_size) new ones.",
    chapter=18,
    topic="serving",
)
mistake(
    "preempt-frees-ignored",
    "a preempted sequence's blocks not counted as free again",
    "Your plan preempts more sequences than the shortage needs: the blocks "
    "of a preempted sequence go back to "
    "the free list, and the next plan may use them.",
    chapter=18,
    topic="serving",
)
mistake(
    "preempt-wrong-victim",
    "the oldest sequence preempted instead of the youngest",
    "Your plan preempts the OLDEST running sequence: it has waited longest "
    "and holds the most work, which is "
    "recomputed from scratch. The policy preempts the youngest (the last "
    "admitted), which loses least.",
    chapter=18,
    topic="serving",
)
mistake(
    "accepts-after-rejection",
    "proposals after the first rejection counted as accepted",
    "Your count includes proposals kept AFTER a rejected one. Proposal i + "
    "1 was drawn after proposal i: once "
    "i is rejected and replaced, everything the draft proposed after it is "
    "conditioned on a token that is not "
    "in the sequence, and is thrown away.",
    chapter=18,
    topic="serving",
)
mistake(
    "bonus-token-missing",
    "no distribution for the extra token when every proposal is kept",
    "When all k proposals are kept your pass returns no distribution: it "
    "wastes the target's last row. Row k "
    "of p is the target's prediction after the k-th proposal; the pass "
    "draws one more token from it (the bonus "
    "token), so a pass yields between 1 and k + 1 tokens.",
    chapter=18,
    topic="serving",
)
mistake(
    "bonus-row-off-by-one",
    "the bonus token drawn from the last proposal's row instead of the row "
    "after it",
    "When all k proposals are kept you return p[k - 1]: the target's "
    "distribution for the k-th proposal "
    "itself, which is already in the sequence. The bonus token follows it: "
    "p[k], the last of the k + 1 rows.",
    chapter=18,
    topic="serving",
)
mistake(
    "spec-cost-ignored",
    "the best k chosen without the draft's cost",
    "Your k is the largest allowed: more proposals always bring more "
    "expected tokens, but each costs a draft "
    "pass. Divide the expected tokens by the pass's cost, 1 + k * "
    "draft_cost, before you compare.",
    chapter=18,
    topic="serving",
)
mistake(
    "spec-acceptance-not-compounded",
    "expected tokens per pass taken as 1 + k * alpha",
    "Your k follows from 1 + k * alpha tokens per pass: it counts proposal "
    "i as kept with probability alpha "
    "whatever happened before it. Proposal i counts only if all the ones "
    "before it were kept too: "
    "probability alpha^i, so the pass brings 1 + alpha + ... + alpha^k "
    "tokens.",
    chapter=18,
    topic="serving",
)
mistake(
    "spec-bonus-forgotten",
    "expected tokens per pass without the target's own token",
    "Your k follows from alpha + ... + alpha^k tokens per pass: the "
    "accepted proposals only. Every pass also "
    "yields the target's own token (the replacement after a rejection, the "
    "bonus token otherwise): add 1.",
    chapter=18,
    topic="serving",
)
mistake(
    "spec-target-pass-forgotten",
    "the cost of a speculative pass counted without the target's pass",
    "Your k follows from a cost of k * draft_cost per pass: the target's "
    "verify pass costs 1 on top of the k "
    "draft passes, so one pass costs 1 + k * draft_cost.",
    chapter=18,
    topic="serving",
)
mistake(
    "spec-from-library",
    "the best k computed with the library's speculative formulas",
    "Your function calls the library's {detail}: the exercise asks you to "
    "write the expected speed-up "
    "yourself (that is the exercise).",
    chapter=18,
    topic="serving",
)
