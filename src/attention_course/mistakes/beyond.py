"""Mistakes of chapters 7 to 13."""

from attention_course.mistakes.catalogue import mistake

# =============================================================================
# Chapter 7: the field guide's own bugs (a layer created in forward, a float
# mask that is not additive)
# =============================================================================

mistake(
    "layer-created-in-forward",
    "a layer (e.g. nn.Linear) created inside forward(): new random weights "
    "on every call, never trained or saved",
    "Your module is not a fixed function: {detail}. A layer created inside "
    "forward() draws new random weights on "
    "every call; they are not among the module's parameters, so the "
    "optimiser never trains them and the "
    "state_dict never saves them. Create every layer once, in __init__, and "
    "only call it in forward().",
    chapter=7,
    topic="field_guide",
    examples=[("MHALinearInForward", "check_layers_created_once")],
)
mistake(
    "float-mask-not-additive",
    "a boolean mask cast to float (1 = may attend, 0 = hidden) used as an "
    "additive float mask",
    "Your float mask is the boolean mask cast to numbers ({detail}). A "
    "float attn_mask is ADDED to the scores, so "
    "0/1 entries hide nothing: they only add 1 to the allowed scores. An "
    "additive mask is 0 where attending is "
    "allowed and -inf (or a large negative number) where it is not, e.g. "
    "torch.zeros(mask.shape).masked_fill(~mask, float('-inf')).",
    chapter=7,
    topic="field_guide",
    examples=[("additive_mask_cast", "check_additive_mask")],
)

# =============================================================================
# Chapter 8: the KV cache, multi-query and grouped-query attention
# =============================================================================

mistake(
    "kv-heads-tiled",
    "key/value heads repeated as a tile (heads 0, 1, 0, 1) instead of in "
    "groups (0, 0, 1, 1)",
    "Your key/value heads are repeated as a tile, not in groups: {detail}. "
    "Query head h uses key/value head "
    "h // n_rep, with n_rep = H / H_kv: each key/value head must be "
    "repeated n_rep times in a row (as "
    "x.repeat_interleave(n_rep, dim=1) does), whereas x.repeat(1, n_rep, 1, "
    "1) repeats the whole block of heads.",
    chapter=8,
    topic="kv_cache",
    examples=[
        ("repeat_kv_tiled", "check_repeat_kv"),
        ("gqa_tiled_heads", "check_grouped_query_attention"),
    ],
)
mistake(
    "cache-keys-only",
    "KV cache size without the factor 2: only the keys (or only the values) "
    "counted",
    "Your cache size is half the right one: it counts the keys only (or the "
    "values only). The cache holds both, "
    "for every layer and every token.",
    chapter=8,
    topic="kv_cache",
    examples=[("kv_cache_bytes_keys_only", "check_kv_cache_bytes")],
)
mistake(
    "cache-missing-factor",
    "KV cache size without one of its factors (layers, heads, head size, "
    "tokens, batch, bytes per number)",
    "Your cache size leaves out {detail}.",
    chapter=8,
    topic="kv_cache",
    examples=[
        ("kv_cache_bytes_in_numbers", "check_kv_cache_bytes"),
        ("kv_cache_bytes_one_sequence", "check_kv_cache_bytes"),
    ],
)

# =============================================================================
# Chapter 9: efficient attention (the online softmax, streams over the keys)
# =============================================================================

mistake(
    "stream-not-rescaled",
    "a stream over the keys that does not rescale what it accumulated when "
    "a key arrives",
    "Your output matches a stream in which {detail}. What was accumulated "
    "before key j was weighted against the "
    "scores seen so far; once key j arrives, the old keys hold a smaller "
    "share of the total weight (the running "
    "sum grew, or the maximum rose): multiply what was accumulated by that "
    "share, exp(old - new) of the running "
    "log-sum-exp or maximum, before adding the new key's term.",
    chapter=9,
    topic="core",
)
mistake(
    "not-streamed",
    "a stream over the keys answered without a loop over them: every score "
    "computed at once",
    "Your output is right, but your function never reads the keys one at a "
    "time, and {detail}: it computes "
    "every score at once, as plain attention does. The exercise is the "
    "stream: one key per step, "
    "with a running log-sum-exp and output that are the answer for the keys "
    "read so far (chapter 9, the "
    "online softmax).",
    chapter=9,
    topic="core",
)
mistake(
    "scores-stored",
    "a stream over the keys that keeps a score for every key and normalizes "
    "at the end",
    "Your output is right, but {detail}: your function holds a score (or a "
    "weight) for every key at once and "
    "normalizes at the end, which a stream never needs. After each key, "
    "only the running values may be "
    "kept, and they must already be the answer for the keys read so far "
    "(chapter 9, the online softmax).",
    chapter=9,
    topic="core",
)
mistake(
    "keys-read-twice",
    "a stream over the keys that reads them in several passes (the maximum "
    "first, then "
    "the sums)",
    "Your output is right and holds no score per key, but your function "
    "read {detail}: more than one pass. "
    "A stream sees each key once, as it arrives, and cannot go back to it "
    "(chapter 9, the online softmax: "
    "what must change in what was accumulated when a larger score arrives?).",
    chapter=9,
    topic="core",
)
mistake(
    "window-off-by-one",
    "a sliding window that lets each query see one key too many or too few",
    "Your output matches a window in which {detail}. Query i may attend key "
    "j when i - window < j <= i: itself "
    "and the window - 1 keys before it, window keys in all.",
    chapter=9,
    topic="tiles",
)
mistake(
    "window-ignored",
    "blockwise attention over a sliding window that attends every earlier key",
    "Your output is plain causal attention: each query attends every key up "
    "to itself. The window lets query i "
    "see only keys j with i - window < j <= i (chapter 9, exercise 4).",
    chapter=9,
    topic="tiles",
)
mistake(
    "tiles-not-skipped",
    "blockwise attention that computes tiles holding no allowed (query, "
    "key) pair",
    "Your output is right, but {detail}. A tile of a query block and a key "
    "block whose pairs are all outside "
    "the window costs as much as any other and adds nothing: skip it. Which "
    "tiles hold an allowed pair? Work it "
    "out on paper for a small T, window and block size (chapter 9, "
    "'Blockwise attention').",
    chapter=9,
    topic="tiles",
)

# =============================================================================
# Chapter 10: positions (append this chapter's mistakes here)
# =============================================================================

mistake(
    "rope-wrong-pairing",
    "RoPE rotating the pairs (x_i, x_i+D/2) where (x_2i, x_2i+1) were asked "
    "(or back)",
    "Your rotation pairs the wrong features: {detail}. Both pairings exist "
    "(LLaMA's reference code uses "
    "neighbours, GPT-NeoX and Hugging Face use halves), but weights trained "
    "with one are wrong with the other.",
    chapter=10,
    topic="positions",
)
mistake(
    "rope-wrong-frequencies",
    "RoPE with the wrong angles: not m * base^(-2i/Dh) for pair i at "
    "position m",
    "Your rotation angles are wrong: {detail}. Pair i at position m turns "
    "by m * theta_i, with "
    "theta_i = base^(-2i/Dh) and i counting pairs (0 .. Dh/2 - 1), not "
    "features.",
    chapter=10,
    topic="positions",
)
mistake(
    "rope-position-not-offset",
    "a decoded token rotated by the wrong position (0, not the cache length)",
    "Your new token is rotated as if it were at position {detail}. With a "
    "cache of T tokens (positions "
    "0 .. T-1) the new token is at position T: rotate its query and key by T.",
    chapter=10,
    topic="positions",
)
mistake(
    "rope-rotates-values",
    "RoPE applied to the values as well as the queries and keys",
    "You rotate the values too. RoPE rotates queries and keys only, so that "
    "their scores depend on the "
    "distance; the values carry the content that is averaged and are never "
    "rotated.",
    chapter=10,
    topic="positions",
)
mistake(
    "rope-cache-rotated-twice",
    "cached keys, already rotated, rotated again when a token is decoded",
    "Your cached keys are rotated a second time. The cache stores keys "
    "already rotated at their own "
    "positions: rotate only the new key (at position T) and append it.",
    chapter=10,
    topic="positions",
)
mistake(
    "rope-angle-layout",
    "halves RoPE with its angles laid out for neighbour pairs "
    "(repeat_interleave)",
    "Your features i and i + Dh/2 turn by different angles: {detail}. In "
    "the halves form the two features of "
    "pair i share the angle m * theta_i, so the tables of cos and sin "
    "repeat the Dh/2 angles as a whole "
    "(theta_0, ..., theta_{{Dh/2-1}}, theta_0, ...), not each angle twice "
    "in a row.",
    chapter=10,
    topic="positions",
)
mistake(
    "alibi-query-offset",
    "ALiBi distances measured from query positions 0..Tq-1 when the queries "
    "are the last Tq",
    "Your bias puts query i at position i{detail}. With Tq new queries "
    "after a cache, the queries are the LAST Tq "
    "of the Tk positions: query i sits at i + Tk - Tq, and its distance to "
    "key j is i + Tk - Tq - j.",
    chapter=10,
    topic="positions",
)
mistake(
    "alibi-bias-sign",
    "the ALiBi bias added with the wrong sign: distant keys rewarded",
    "Your bias has the wrong sign{detail}: distant keys get MORE weight. "
    "ALiBi subtracts slope_h * distance "
    "from the score.",
    chapter=10,
    topic="positions",
)
mistake(
    "alibi-bias-scaled",
    "the ALiBi bias divided by sqrt(Dh) along with the scores",
    "Your bias is divided by sqrt(Dh) together with q . k: you add it "
    "before scaling. The bias is added to the "
    "scaled scores, q . k / sqrt(Dh) - slope_h * distance, so that the "
    "slope means the same at every width.",
    chapter=10,
    topic="positions",
)
mistake(
    "rope-padding-ignored",
    "a left-padded row rotated as if its first real token sat at its first "
    "slot",
    "Your positions do not start at each row's first real token: {detail}. "
    "A row with p padding slots in front "
    "holds its first real token at slot p, and that token is at position 0: "
    "slot t is position t - p.",
    chapter=10,
    topic="positions",
)
mistake(
    "rope-offset-one-row",
    "one row's padding used for every row of a batch",
    "Every row of your batch is rotated with the positions of row {detail}. "
    "Each row has its own number of "
    "padding slots, so each row has its own positions.",
    chapter=10,
    topic="positions",
)
mistake(
    "rope-permutation-inverted",
    "weights converted between RoPE pairings with the permutation the wrong "
    "way round",
    "Your rows are reordered by p = [0, 2, 4, ..., 1, 3, 5, ...] "
    "itself{detail}. That is the conversion the "
    "other way. Write down where row j of one layout has to go in the "
    "other, for Dh = 6, and compare.",
    chapter=10,
    topic="positions",
)
mistake(
    "rope-permutation-not-per-head",
    "the rows of all heads permuted as if they were one head",
    "Your permutation mixes the heads: {detail}. The output rows of W_q and "
    "W_k are H blocks of Dh rows, one per "
    "head, and RoPE pairs features inside a head: reorder each block of Dh "
    "rows on its own.",
    chapter=10,
    topic="positions",
)
mistake(
    "rope-permutation-on-columns",
    "the input columns of a projection permuted instead of its output rows",
    "You reorder the columns of the weight (its inputs). RoPE rotates the "
    "projection's OUTPUT features, the "
    "rows of a (H * Dh, D) weight: permute rows, per head.",
    chapter=10,
    topic="positions",
)

# =============================================================================
# Chapter 11: the transformer block (append this chapter's mistakes here)
# =============================================================================

mistake(
    "residual-missing",
    "a residual connection is missing: the sub-layer's input is not added "
    "back",
    "Your block drops a residual connection ({detail}): the sub-layer's "
    "input x must be added to the branch's "
    "output, x + drop(branch(...)). Without it the stream carries only the "
    "branch's output and the direct path "
    "for the gradient is gone.",
    chapter=11,
    topic="blocks",
)
mistake(
    "residual-twice",
    "the residual is added twice (2 x + branch)",
    "Your block adds the input twice ({detail}): the result is 2 x + "
    "branch, e.g. from h = x + branch(...) "
    "followed by x = x + h. Add the input once: x = x + drop(branch(...)).",
    chapter=11,
    topic="blocks",
)
mistake(
    "norm-wrong-place",
    "the LayerNorm is applied in the wrong place for the block's order",
    "Your LayerNorm is in the wrong place: {detail}. Pre-LN: x + "
    "drop(branch(norm(x))); post-LN: "
    "norm(x + drop(branch(x))).",
    chapter=11,
    topic="blocks",
)
mistake(
    "norm-on-residual-stream",
    "pre-LN block that normalises the residual stream itself (x = norm(x))",
    "Your pre-LN block normalises the residual stream itself ({detail}): "
    "with x = norm(x) followed by "
    "x = x + branch(x), the un-normalised input never reaches the output. "
    "Only the branch's input is "
    "normalised: x = x + drop(branch(norm(x))).",
    chapter=11,
    topic="blocks",
)
mistake(
    "ffn-activation-missing",
    "the feed-forward network has no activation between its two linear layers",
    "Your feed-forward network has no nonlinearity between linear1 and "
    "linear2{detail}: two linear layers in a "
    "row are one linear layer. Apply the activation to the hidden layer: "
    "linear2(drop(relu(linear1(x)))).",
    chapter=11,
    topic="blocks",
)
mistake(
    "decoder-not-causal",
    "the decoder's self-attention is not causal (positions see the future)",
    "Your decoder's self-attention is not causal: each target position can "
    "see the tokens after it, which are "
    "the ones it must predict. Pass is_causal=True (or a causal mask) to "
    "the self-attention.",
    chapter=11,
    topic="blocks",
)
mistake(
    "cross-attention-keys-from-decoder",
    "cross-attention keys and values taken from the decoder, not the memory",
    "Your cross-attention takes its keys and values from {detail} instead "
    "of the encoder's output: queries come "
    "from the decoder, keys and values from the memory, "
    "self.cross_attn(norm2(x), memory, mask=memory_mask).",
    chapter=11,
    topic="blocks",
)
mistake(
    "branch-dropout-off",
    "a block's dropout never acts in training mode",
    "Your module never drops {detail} in .train() mode. Built with "
    "dropout=0.25 and training, each sub-layer's "
    "output is zeroed feature by feature with probability p (the others "
    "scaled by 1 / (1 - p)) before it joins "
    "the residual stream, and the feed-forward network drops its hidden "
    "features: look at what reaches your "
    "dropout, and at what tells it the mode (chapter 11, 'Residual "
    "connections and LayerNorm: two orders').",
    chapter=11,
    topic="blocks",
)
mistake(
    "dropout-not-on-branch",
    "dropout on the residual stream or a branch's input, not on the "
    "branch's output",
    "Your dropout acts on another tensor than the one the block drops: "
    "{detail}. Only a sub-layer's output (in "
    "the feed-forward network, its hidden features) is dropped; the "
    "residual stream carries the input through "
    "untouched (chapter 11, 'Residual connections and LayerNorm: two "
    "orders').",
    chapter=11,
    topic="blocks",
)
mistake(
    "rmsnorm-mean-subtracted",
    "RMSNorm that subtracts the mean (a LayerNorm without bias)",
    "Your RMSNorm subtracts each vector's mean{detail}: that is LayerNorm. "
    "RMSNorm divides x itself by its root "
    "mean square; the check's inputs have a mean far from 0, where the two "
    "differ (chapter 11, 'Modern "
    "variants: RMSNorm and SwiGLU').",
    chapter=11,
    topic="blocks",
)
mistake(
    "rmsnorm-eps-misplaced",
    "RMSNorm's epsilon added outside the square root, or left out",
    "Your RMSNorm puts epsilon in another place ({detail}). It sits inside "
    "the square root, added to the mean of "
    "the squares; the check's vectors include tiny ones, where its place "
    "decides the result.",
    chapter=11,
    topic="blocks",
)
mistake(
    "rmsnorm-not-mean",
    "RMSNorm divides by the norm (a sum of squares), not by the root MEAN "
    "square",
    "Your RMSNorm divides by the square root of the SUM of the "
    "squares{detail}: the result is sqrt(D) times "
    "too small. The root mean square averages the squares over the D "
    "features.",
    chapter=11,
    topic="blocks",
)
mistake(
    "rmsnorm-scale-missing",
    "RMSNorm's learned scale (weight) is not applied",
    "Your RMSNorm leaves out its learned scale: the normalised vector is "
    "multiplied feature by feature by "
    "self.weight (D numbers); the check loads random values into it.",
    chapter=11,
    topic="blocks",
)
mistake(
    "norm-wrong-axis",
    "the norm is computed over another axis than the features (the last one)",
    "Your norm averages over {detail} instead of each position's D features "
    "(the last axis): every position "
    "is normalised on its own.",
    chapter=11,
    topic="blocks",
)
mistake(
    "swiglu-gate-swapped",
    "SwiGLU with the SiLU on the 'up' projection instead of the 'gate'",
    "Your SwiGLU passes the wrong projection through the SiLU: in the "
    "equation the gate projection goes through "
    "it, and the up projection is multiplied in as it is. The check loads "
    "different weights into the two.",
    chapter=11,
    topic="blocks",
)
mistake(
    "swiglu-wrong-activation",
    "SwiGLU with another activation than SiLU on the gate",
    "Your gate goes through {detail} instead of SiLU(z) = z sigmoid(z) "
    "(Swish with beta = 1): that is another "
    "member of the GLU family (chapter 11, 'Modern variants: RMSNorm and "
    "SwiGLU').",
    chapter=11,
    topic="blocks",
)
mistake(
    "swiglu-not-gated",
    "SwiGLU without its gate: the two projections are not multiplied",
    "Your SwiGLU does not multiply the two projections ({detail}): the "
    "gate's SiLU multiplies the up "
    "projection feature by feature before down maps back to D.",
    chapter=11,
    topic="blocks",
)
mistake(
    "residual-init-depth",
    "residual layers scaled by 1/sqrt of the wrong count (blocks, not "
    "residual layers)",
    "Your residual layers are scaled by another factor: {detail}. GPT-2 "
    "scales them by 1 / sqrt(N), N the "
    "number of residual layers: count the additions to the stream in one "
    "block.",
    chapter=11,
    topic="blocks",
)
mistake(
    "residual-init-wrong-layers",
    "the depth scaling applied to other layers than those that write into "
    "the stream",
    "Your initialisation scales the wrong matrices: {detail}. Only the "
    "layers whose output is added to the "
    "residual stream are scaled; every other matrix keeps standard "
    "deviation 0.02.",
    chapter=11,
    topic="blocks",
)
mistake(
    "init-norm-or-bias",
    "a LayerNorm's scale or shift, or a bias, drawn at random or not reset",
    "Your initialisation gives {detail}. Biases and LayerNorm shifts start "
    "at 0, LayerNorm scales at 1: only "
    "the weight matrices and the embedding are drawn.",
    chapter=11,
    topic="blocks",
)

# =============================================================================
# Chapter 12: watch attention learn (induction heads)
# =============================================================================

mistake(
    "induction-off-by-one",
    "prefix-matching score taken on the earlier occurrence of the token, "
    "not the token after it",
    "Your score measures attention on the earlier occurrence of the query's "
    "token itself (key j - 1), which is "
    "what a duplicate-token head does. An induction head at token A attends "
    "to the token that FOLLOWED the "
    "earlier A (key j with ids[j - 1] == ids[t]): that is the token it "
    "copies.",
    chapter=12,
    topic="interpret",
)
mistake(
    "induction-all-queries",
    "prefix-matching score averaged over every query, also those with "
    "nothing to find",
    "Your score averages over every query, also those whose token never "
    "occurred before: they have no target, "
    "add 0 and dilute the score. Average only over the queries with at "
    "least one earlier occurrence.",
    chapter=12,
    topic="interpret",
)
mistake(
    "induction-mean-over-targets",
    "prefix-matching score averaged over a query's targets instead of summed",
    "Your score averages the weights over a query's targets; where the "
    "token occurred several times, a head "
    "that splits its attention over all the right keys should still score "
    "1. Sum over the targets.",
    chapter=12,
    topic="interpret",
)
mistake(
    "induction-includes-self",
    "prefix-matching score counts the query's own position as a target",
    "Your score counts the query's own position as a target when the token "
    "before it is the same token. "
    "Targets are strictly earlier keys: j < t.",
    chapter=12,
    topic="interpret",
)
mistake(
    "induction-ignores-query-mask",
    "prefix-matching score ignores query_mask",
    "Your score ignores query_mask: average only over the queries where it "
    "is True (and that have a target).",
    chapter=12,
    topic="interpret",
)
mistake(
    "predicted-reversal-pattern",
    "predicted the anti-diagonal for a task that is not reversal",
    chapter=12,
    topic="interpret",
)
mistake(
    "predicted-identity-pattern",
    "predicted the main diagonal for a shifted copy",
    chapter=12,
    topic="interpret",
)
mistake(
    "predicted-uniform-pattern",
    "predicted uniform attention for a task that needs one key per query",
    chapter=12,
    topic="interpret",
)
mistake(
    "query-path-needs-previous-token",
    "predicted that the induction heads' queries need the previous token",
    chapter=12,
    topic="interpret",
)
mistake(
    "query-path-shares-work",
    "predicted that queries and keys share the previous-token information",
    chapter=12,
    topic="interpret",
)
mistake(
    "ablation-every-path",
    "the heads switched off everywhere instead of in layer 2's keys only",
    "Your logits are those of the model with the heads switched off "
    "everywhere (head_mask): then layer 2's "
    "queries and values and the logits lose them too. Only the KEY "
    "projection of layer 2 may read the stream "
    "without them; everything else reads the whole stream.",
    chapter=12,
    topic="interpret",
)
mistake(
    "ablation-query-path",
    "the heads removed from layer 2's queries instead of its keys",
    "Your layer 2 computes its QUERIES from the stream without the heads, "
    "and its keys from the whole stream: "
    "swap them. The key projection (w_k) reads the ablated stream; w_q and "
    "w_v read the whole one.",
    chapter=12,
    topic="interpret",
)
mistake(
    "ablation-value-path",
    "the heads removed from layer 2's values instead of its keys",
    "Your layer 2 computes its VALUES from the stream without the heads. "
    "The key projection (w_k) reads the "
    "ablated stream; w_q and w_v read the whole one.",
    chapter=12,
    topic="interpret",
)
mistake(
    "key-path-skips-layernorm",
    "the ablated stream fed to the key projection without layer 2's LayerNorm",
    "Your key projection reads the ablated residual stream as it is; in a "
    "pre-LN block every projection reads "
    "the stream through the block's norm1. Apply model.blocks[1].norm1 to "
    "the ablated stream first.",
    chapter=12,
    topic="interpret",
)
mistake(
    "ablation-not-applied",
    "the logits of the whole model: no head was removed",
    "Your logits are the whole model's: the heads were removed nowhere (a "
    "hook not registered, or removed "
    "before the forward pass, or a head_mask of ones).",
    chapter=12,
    topic="interpret",
)

# =============================================================================
# Chapter 13: distributed attention (append this chapter's mistakes here)
# =============================================================================

mistake(
    "allreduce-before-output-projection",
    "tensor parallelism: the heads summed over the ranks (all-reduce) "
    "before the output projection",
    "Your output is what you get when the heads are all-reduced BEFORE the "
    "output projection: {detail}. The "
    "heads of different ranks are different features (rank 0 has heads 0 .. "
    "H/P - 1, rank 1 the next ones), "
    "so adding them mixes unrelated heads. Each rank multiplies ITS heads "
    "by ITS rows of W_o (columns of "
    "w_o, in nn.Linear's layout) and the all-reduce sums these (B, T, D) "
    "partial outputs.",
    chapter=13,
    topic="distributed",
)
mistake(
    "tp-bias-per-rank",
    "tensor parallelism: the output bias added on every rank before the "
    "all-reduce",
    "Your output has the bias b_o {detail} times: every rank added it "
    "before the all-reduce, which sums the "
    "biases too. Add b_o once, after the sum (or on one rank only).",
    chapter=13,
    topic="distributed",
)
mistake(
    "row-parallel-wrong-slice",
    "tensor parallelism: a rank's slice of W_o taken along its output "
    "features instead of its input features",
    "Your ranks slice w_o along the wrong axis: w_o[rows] are OUTPUT "
    "features in nn.Linear's (d_out, d_in) "
    "layout. Rank r's heads are the INPUT features r*D/P .. (r+1)*D/P - 1 "
    "of the output projection: "
    "w_o[:, r*D/P:(r+1)*D/P].",
    chapter=13,
    topic="distributed",
)
mistake(
    "zigzag-contiguous",
    "zig-zag layout: each rank holds one contiguous block of T / P positions",
    "Your layout gives rank r the contiguous positions r*T/P .. (r+1)*T/P - "
    "1: two NEIGHBOURING chunks. With a "
    "causal mask the last rank then computes P times more than the first. "
    "Cut the sequence into 2P chunks and "
    "give rank r one early and one late chunk: r and 2P - 1 - r.",
    chapter=13,
    topic="distributed",
)
mistake(
    "zigzag-not-mirrored",
    "zig-zag layout: rank r's second chunk is P + r instead of 2P - 1 - r",
    "Your layout gives rank r {detail}: the second chunk is shifted, not "
    "mirrored, so a later rank still holds "
    "two later chunks and does more causal work. Pair the chunks from both "
    "ends: r with 2P - 1 - r, so that "
    "each pair's causal work adds up to the same.",
    chapter=13,
    topic="distributed",
)
mistake(
    "zigzag-striped",
    "zig-zag layout replaced by the striped one (positions r, r + P, r + "
    "2P, ...)",
    "Your layout is the striped one: rank r holds positions r, r + P, r + "
    "2P, .... It balances the entries the "
    "causal mask keeps, but no tile can then be skipped, so with whole "
    "tiles every rank computes all of them "
    "(chapter 13). The zig-zag layout holds 2 chunks of T / 2P: r and 2P - "
    "1 - r.",
    chapter=13,
    topic="distributed",
)
mistake(
    "f-backward-not-reduced",
    "tensor parallelism: f (copy to the ranks) returns the gradient unchanged",
    "Your gradients of the inputs differ from rank to rank: each rank kept "
    "only its own heads' part. The "
    "input was copied to every rank (f) and each rank's heads used it, so "
    "its gradient is the SUM of the "
    "ranks' parts: f's backward all-reduces the gradient (identity forward, "
    "all-reduce backward).",
    chapter=13,
    topic="distributed",
)
mistake(
    "g-backward-reduced",
    "tensor parallelism: g (sum over the ranks) all-reduces the gradient "
    "backward too",
    "Your gradients are P times too large: g's backward all-reduces the "
    "gradient of the output, which every "
    "rank already holds whole (the output is the same on every rank). g is "
    "an all-reduce forward and the "
    "identity backward. (torch.distributed.nn.functional.all_reduce sums in "
    "both directions.)",
    chapter=13,
    topic="distributed",
)
mistake(
    "g-forward-not-reduced",
    "tensor parallelism: g (sum over the ranks) does not all-reduce the "
    "output",
    "Your ranks' outputs differ, each holding only its own heads' partial "
    "output: g must all-reduce (sum) "
    "the partial outputs in the forward pass, so that every rank holds the "
    "whole output.",
    chapter=13,
    topic="distributed",
)
mistake(
    "f-forward-reduced",
    "tensor parallelism: f (copy to the ranks) all-reduces the input forward",
    "Your output is that of P times the input: f's forward all-reduced the "
    "input, which every rank already "
    "holds whole. f is the identity forward (and an all-reduce of the "
    "gradient backward).",
    chapter=13,
    topic="distributed",
)
mistake(
    "f-and-g-swapped",
    "tensor parallelism: f and g swapped (all-reduce of the input, not of "
    "the output)",
    "Your f and g are swapped: f (before the heads) is the identity forward "
    "and an all-reduce backward; g "
    "(after the output projection) is an all-reduce forward and the "
    "identity backward.",
    chapter=13,
    topic="distributed",
)
mistake(
    "sum-of-two-ranks",
    "tensor parallelism: f or g adds two ranks' parts, right on 2 processes "
    "only",
    "Your output and input gradients equal one process's on 2 processes but "
    "not on 3: they are what a sum of "
    "the first two ranks' parts gives. Look at how many ranks your f's "
    "backward and g's forward add, and "
    "whether that number depends on the world size.",
    chapter=13,
    topic="distributed",
)
