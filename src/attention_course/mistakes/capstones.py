"""Mistakes of the capstones."""

from attention_course.mistakes.catalogue import mistake

# =============================================================================
# Capstone 1, "capstone1" (chapters 10 to 13 together: RoPE attention with a
# cache, pre-LN blocks, a TinyGPT trained on the induction task, its generation
# and its induction head, its heads on two processes)
# =============================================================================

mistake(
    "rope-not-applied",
    "queries and keys not rotated at all (no RoPE)",
    "Your attention ignores the positions: your outputs match causal "
    "attention WITHOUT RoPE. Rotate the "
    "queries and the keys of every head by their positions before the scores.",
    chapter="capstone1",
    topic="capstone",
)
mistake(
    "cache-keys-unrotated",
    "the KV cache holds the keys before RoPE, rotated again at every call",
    "Your outputs are right, but your cache holds the keys as projected, "
    "before their rotation: every call "
    "then rotates the whole cache again, work that grows with the cache, "
    "and a cache handed to other code "
    "(or to the check) is not what the exercise asks for. A key's rotation "
    "depends on its own position only "
    "(chapter 10).",
    chapter="capstone1",
    topic="capstone",
)
mistake(
    "final-norm-missing",
    "a pre-LN model without its final LayerNorm before the head",
    "Your logits match the model without its final LayerNorm: in a pre-LN "
    "model nothing normalises the "
    "residual stream after the last block, so the head must read norm(x), "
    "not x (chapter 11).",
    chapter="capstone1",
    topic="capstone",
)
mistake(
    "generate-wrong-position",
    "greedy generation reads the logits of another position than the last",
    "Your generated tokens come from the logits of the FIRST position: the "
    "logits at position t predict "
    "token t + 1, so the next token is chosen from the last position's "
    "logits, logits[:, -1].",
    chapter="capstone1",
    topic="capstone",
)
mistake(
    "cache-not-passed-back",
    "cached generation feeds the new token without the cache of the earlier "
    "ones",
    "With the cache, your model sees only the newest token at each step: "
    "its logits match a model called on "
    "that token alone. Pass the caches the previous call returned back into "
    "the next call.",
    chapter="capstone1",
    topic="capstone",
)
mistake(
    "cache-fed-whole-sequence",
    "cached generation feeds the whole sequence again on top of the cache",
    "With the cache, your steps feed the whole sequence AND the cache: "
    "every token is cached again and sits "
    "at a second, later position. Once the prompt is cached, feed only the "
    "newest token.",
    chapter="capstone1",
    topic="capstone",
)
mistake(
    "targets-not-shifted",
    "next-token training on targets that are the inputs themselves",
    "Your model predicts the CURRENT token: it was trained with the inputs "
    "as their own targets. The logits "
    "at position t predict token t + 1: compare model(ids[:, :-1]) with "
    "ids[:, 1:].",
    chapter="capstone1",
    topic="capstone",
)
mistake(
    "induction-not-learned",
    "the trained model does not copy the repeated half",
    "After your training the model predicts only {detail} of the repeated "
    "half's tokens. A 2-layer model "
    "learns to copy them within a few hundred steps (chapter 12): check "
    "that your loss covers every "
    "position's next token, that training runs (the check calls it without "
    "autograd, as the grader does: "
    "wrap it in torch.enable_grad()), and the learning rate and number of "
    "steps.",
    chapter="capstone1",
    topic="capstone",
)
mistake(
    "cache-kept-in-module",
    "the attention keeps its cache in the module instead of the cache it is "
    "passed",
    "Your module gives the right outputs for one sequence at a time, but "
    "not for {detail} of two sequences fed "
    "in turns, each with its own cache: your forward reads keys and values "
    "from somewhere other than the cache "
    "it is given (an attribute of the module?). A caller may hold several "
    "caches for one module.",
    chapter="capstone1",
    topic="capstone",
)
mistake(
    "accuracy-not-from-weights",
    "a trained model whose forward reaches an accuracy its weights do not",
    "Your model predicts {detail}. The check measures the weights your "
    "training produced, with its own causal "
    "forward: your model's forward does something those weights do not (a "
    "position that reads later tokens, "
    "or predictions computed some other way). Look at the mask in your "
    "attention (exercise 2) and at what your "
    "forward returns.",
    chapter="capstone1",
    topic="capstone",
)
mistake(
    "scores-from-library",
    "induction scores computed with the library's own model or score",
    "Your function calls {detail}: the exercise asks for the scores "
    "computed from your own model's attention "
    "(a forward pre-hook on each block's attn), not from the library's GPT "
    "or interpret functions.",
    chapter="capstone1",
    topic="capstone",
)
mistake(
    "shard-not-split",
    "tensor-parallel attention in which a process computes more than its "
    "own heads",
    "Every rank's output is right, but {detail}: each rank must compute "
    "only its own heads (its rows of w_q, "
    "w_k, w_v and its columns of w_o), the all-reduce then sums the parts. "
    "Look at what each rank computes.",
    chapter="capstone1",
    topic="capstone",
)
mistake(
    "shard-not-seen",
    "tensor-parallel attention whose ranks compute out of the check's sight",
    "Every rank's output is right, but {detail}, so the check cannot see "
    "that each rank computes only its own heads. Start the ranks as the "
    'notebook does (launch(..., start_method="fork")) and compute each '
    "rank's heads with PyTorch.",
    chapter="capstone1",
    topic="capstone",
)


# =============================================================================
# Capstone 2, "capstone2" (chapters 14 to 18 together: SmolLM2 from the
# student's own parts, the real weights, equal to Hugging Face). It also names
# chapter 8's [kv-heads-tiled], chapter 10's [rope-wrong-pairing] and
# [rope-position-not-offset] and chapter 11's RMSNorm codes: the same mistakes,
# made in the real model.
# =============================================================================

mistake(
    "cache-position-off-by-one",
    "tokens fed after a cache rotated at one position past where they stand",
    "Your first call is right, but the tokens you feed with a cache are "
    "rotated at {detail}: a new token "
    "stands right after the cached ones, at position T_past (0-based), the "
    "cache's length.",
    chapter="capstone2",
    topic="capstone_model",
)
mistake(
    "rope-base-default",
    "RoPE with the textbook base 10000 instead of the checkpoint's rope_theta",
    "Your outputs match RoPE with the textbook base 10000: SmolLM2 was "
    "trained with rope_theta = 100000 "
    "(config.rope_parameters); use the base the model is built with, as "
    "chapter 14's from_hf reads it.",
    chapter="capstone2",
    topic="capstone_model",
)
mistake(
    "model-final-norm-missing",
    "a Llama's logits read from the last layer without the final RMSNorm",
    "Your logits match the real model without its final RMSNorm: the head "
    "reads norm(x) after the last "
    "layer (model.norm.weight), not the residual stream itself.",
    chapter="capstone2",
    topic="capstone_model",
)
mistake(
    "logits-differ-from-hf",
    "the assembled model's logits differ from Hugging Face's on the same "
    "weights",
    "Your logits differ from Hugging Face's LlamaForCausalLM on the same "
    "weights: {detail}. Check each part "
    "on its own first (exercises 2 and 3), then the order in a layer: x + "
    "attn(norm1(x)), then "
    "x + ffn(norm2(x)); SwiGLU is down(silu(gate(x)) * up(x)); the head is "
    "tied to the embedding.",
    chapter="capstone2",
    topic="capstone_model",
)
mistake(
    "decode-cache-dropped",
    "greedy decoding that feeds each new token without the cache",
    "Your first logits are right, then each step's match the new token "
    "given alone, at position 0: the caches your model returned were not "
    "passed back. Keep them from the prompt's call and pass them with each "
    "new token.",
    chapter="capstone2",
    topic="capstone_model",
)
mistake(
    "decode-recomputes-prefix",
    "greedy decoding that runs the model over the whole sequence at every "
    "step",
    "Your tokens are right, but {detail}: after the prompt, each step must "
    "feed only the newest token (and, when speculating, its draft), with "
    "the caches, so a step costs one token's work instead of the whole "
    "sequence's.",
    chapter="capstone2",
    topic="capstone_model",
)
mistake(
    "lookup-draft-unverified",
    "prompt-lookup drafts kept without comparing them with the model's "
    "choices",
    "Your tokens are those of a lookup that keeps every draft token: a "
    "draft is only a guess copied from earlier in the text. Feed the newest "
    "token and the draft in one pass; row i of its logits is your model's "
    "choice after draft token i - 1: keep draft tokens while they equal "
    "those choices, then the model's own next token.",
    chapter="capstone2",
    topic="capstone_model",
)
mistake(
    "lookup-keeps-mismatch",
    "the first draft token that differs from the model's choice kept (one "
    "too many)",
    "Your tokens are those of a lookup that also keeps the first draft "
    "token the model disagrees with: where draft token i differs from row "
    "i's argmax, keep row i's argmax instead and throw away draft token i "
    "and everything after it.",
    chapter="capstone2",
    topic="capstone_model",
)
mistake(
    "lookup-cache-not-cropped",
    "caches that keep the keys and values of rejected draft tokens",
    "Your tokens are those of a lookup whose caches keep the rejected draft "
    "tokens: the next pass attends to tokens that are not in the sequence, "
    "at positions shifted by them. After each pass, cut every layer's cache "
    "back to the tokens kept (all but the newest one, which the next pass "
    "feeds): k[:, :, :length], v[:, :, :length].",
    chapter="capstone2",
    topic="capstone_model",
)
mistake(
    "lookup-too-many-passes",
    "speculative decoding that takes more model passes than its drafts allow",
    "Your tokens are right, but you ran {detail}: each pass should feed the "
    "newest token with a draft of up to k tokens (what followed the latest "
    "earlier occurrence of the last two tokens) and keep every draft token "
    "the model agrees with, so that a repetitive text takes few passes. One "
    "token a pass is plain greedy decoding, not speculation.",
    chapter="capstone2",
    topic="capstone_model",
)
mistake(
    "serve-too-many-running",
    "a scheduler that runs more requests at once than max_running",
    "A step of yours ran {detail}: at most max_running requests are in "
    "flight at once; the others wait in the queue until a slot frees.",
    chapter="capstone2",
    topic="capstone_model",
)
mistake(
    "serve-static-batching",
    "a finished request's slot left empty until the whole batch ends",
    "A request waited while a slot was free ({detail}): that is static "
    "batching. In continuous batching, when a request finishes, the next "
    "waiting one takes its slot at the very next step.",
    chapter="capstone2",
    topic="capstone_model",
)
mistake(
    "serve-blocks-reserved",
    "a request's blocks reserved for its longest length up front, not "
    "allocated as it grows",
    "A block table of yours holds {detail}: a paged cache gives a request "
    "a new block only when its next token finds its last block full, so a "
    "table holds ceil(tokens cached / block_size) blocks, never a "
    "reservation for tokens not yet written.",
    chapter="capstone2",
    topic="capstone_model",
)
mistake(
    "serve-blocks-shared",
    "two running requests' block tables pointing at the same block (their "
    "caches mixed)",
    "Two requests in flight at once hold the same block ({detail}): each "
    "would overwrite the other's keys and values. A block belongs to one "
    "request from its allocation until that request finishes.",
    chapter="capstone2",
    topic="capstone_model",
)
mistake(
    "serve-blocks-not-freed",
    "a finished request's blocks never given back to the pool",
    "Your tables use block {detail}: the pool has only as many blocks as "
    "the busiest step needs, so a finished request must give its blocks "
    "back to the pool, for the next requests to reuse.",
    chapter="capstone2",
    topic="capstone_model",
)
mistake(
    "serve-tokens-differ",
    "a served request's tokens that are not greedy decoding of it alone",
    "Your schedule and tables are right, but {detail} is not greedy "
    "decoding of that request alone: Hugging Face's model gives another "
    "token a clear margin higher. Read each request's keys and values "
    "from its own blocks, in its table's order, exactly as many as it has "
    "cached, and write the new ones at its own next positions.",
    chapter="capstone2",
    topic="capstone_model",
)
