"""Mistakes of chapter 19 (learned sparse attention: the lightning indexer and
top-k selection)."""

from attention_course.mistakes.catalogue import mistake

# =============================================================================
# Chapter 19: learned sparse attention
# =============================================================================

mistake(
    "relu-after-weights",
    "the indexer's ReLU applied after the heads are mixed, not to each head",
    "Your scores match relu(sum_h w[h] * q[h] . k): the ReLU acts on each "
    "head's score BEFORE the weighted sum, "
    "sum_h w[h] * relu(q[h] . k / sqrt(Dh)). A head that finds a key "
    "irrelevant then adds 0: it cannot vote "
    "against the key, and the weights may be negative.",
    chapter=19,
    topic="sparse",
)
mistake(
    "index-no-relu",
    "the indexer's scores without the ReLU",
    "Your scores match sum_h w[h] * q[h] . k / sqrt(Dh) with no ReLU at "
    "all: each head's score goes through a "
    "ReLU before the heads are mixed (DeepSeek V3.2's lightning indexer).",
    chapter=19,
    topic="sparse",
)
mistake(
    "index-scale-missing",
    "the indexer's scores without the 1/sqrt(Dh) scale",
    "Your scores are sqrt(Dh) times too large: each head's dot product is "
    "scaled by 1/sqrt(Dh) (the scale "
    "argument) before the ReLU. Top-k would not notice, but a score that is "
    "compared or mixed with others does.",
    chapter=19,
    topic="sparse",
)
mistake(
    "topk-not-causal",
    "top-k chosen among every key, the future included (the indexer without "
    "the causal mask)",
    "Your selection matches the top k over ALL keys: query i may only "
    "choose among the keys it may see, j <= i + "
    "(Tk - Tq). Hide the future keys (score -inf) BEFORE top-k, not after: "
    "otherwise a future key takes a slot "
    "and the query keeps fewer than k keys it may see.",
    chapter=19,
    topic="sparse",
)
mistake(
    "topk-wrong-axis",
    "top-k taken over the queries (axis -2) instead of over the keys",
    "Your selection keeps, for each KEY, the k queries that score it "
    "highest: top-k runs over the last axis, the "
    "keys (dim=-1), so that each query keeps its own k keys.",
    chapter=19,
    topic="sparse",
)
mistake(
    "topk-off-by-one",
    "one key more or one fewer than k per query",
    "Your selection keeps a different number of keys than k per query (one "
    "more or one fewer): each query keeps "
    "exactly min(k, visible keys) keys.",
    chapter=19,
    topic="sparse",
)
mistake(
    "tie-anywhere",
    "a row called ambiguous for any two equal scores, not a tie at the k-th "
    "place",
    "Your rows are ambiguous whenever two visible scores are equal. Top-k "
    "is ambiguous only when the tie straddles "
    "the cut: the k-th highest visible score equals the (k+1)-th. Equal "
    "scores both kept, or both dropped, leave "
    "the selection unique.",
    chapter=19,
    topic="sparse",
)
mistake(
    "ties-by-position",
    "ties assumed to be broken by position, so that no row is ambiguous",
    "You report no ambiguous row: as if top-k broke ties by position. "
    "torch.topk picks among equal scores in an "
    "order of its own, which changes with the length of the row (chapter "
    "19, 'The trap: ties'): a row whose k-th "
    "and (k+1)-th highest visible scores are equal has no single answer.",
    chapter=19,
    topic="sparse",
)
