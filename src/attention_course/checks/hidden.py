"""Hidden cases: extra inputs the checkers draw at grading time, from a seed
the grader picks.

Students self-check in their notebooks with the fixed public cases only. The
grader (in its own process, never in the submission's) calls :func:`enable`
with a seed; from then on the checkers that take them add the cases
below: larger T and D (code that only works up to some size fails), Tq > Tk and
Tq < Tk, batches of 5 and more (masks with their own row per example), rows
whose maxima are far apart (a softmax that subtracts the global maximum gives
NaN), arrays of more than 60 elements, integer and float32 arrays for the
softmax, and the dtype the public cases do not use (float32 NumPy arrays,
float64 torch tensors) for scaled dot-product attention. The module checks
(single-head, multi-head, blocks, the capstone) add a size of their own: more
heads, wider features, batches of 5 and more, Tq != Tk, a padding mask per
example. The diagnoses work on them as on the public cases.

Each kind of case draws from its own :class:`Topic`: a new checker that takes
hidden cases adds a member (the next free number), a function here returning
its cases (``[]`` when :func:`active` is false) and calls it from its check
next to the public cases.
"""

from __future__ import annotations

import contextlib
import enum

import numpy as np

_seed: int | None = None


def enable(seed: int) -> None:
    """Add the hidden cases, drawn from ``seed``, to every check from now on
    (the grader's process only)."""
    global _seed
    if (
        isinstance(seed, bool)
        or not isinstance(seed, (int, np.integer))
        or seed < 0
    ):
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    _seed = int(seed)


def disable() -> None:
    global _seed
    _seed = None


@contextlib.contextmanager
def drawn_from(seed: int):
    """Hidden cases on, from ``seed``, inside the ``with`` block; the previous
    state is restored after it."""
    global _seed
    previous = _seed
    enable(seed)
    try:
        yield
    finally:
        _seed = previous


def active() -> bool:
    return _seed is not None


class Topic(enum.IntEnum):
    """The hidden cases' topics. Each draws from its own stream,
    ``default_rng([seed, topic])``, so that one topic's draws do not shift when
    another topic draws more. The numbers are part of what the grader draws:
    never renumber a topic; a new topic takes the next free number."""

    SDPA = 1  # scaled dot-product attention (every framework), NumPy attention
    SOFTMAX = 2
    CAUSAL_MASK = 3
    PADDING_MASK = 4
    ONE_QUERY = 5  # attention for one query, streaming attention
    MULTI_HEAD = 6
    SINGLE_HEAD = 7
    BLOCK = 8  # the transformer blocks
    CAPSTONE = 9
    WINDOW = 10  # chapter 9's sliding-window tiles
    SINKS = 11  # chapter 14's sinks in a window
    FLEX = 12  # chapter 15's mask and score mods
    TRITON = 13  # chapter 16's kernels
    LINEAR = 14  # chapter 17's gated delta rule
    SERVING = 15  # chapter 18's block tables (12-14: other chapters)
    # chapter 10's rotary embeddings, ALiBi and RoPE weight layouts
    POSITIONS = 16
    SINKS_LSE = 17  # chapter 15's sinks from FlexAttention's log-sum-exp
    SCHEDULE = 18  # chapter 18's scheduling policy
    SPECULATIVE = 19  # chapter 18's sampled verify pass
    SPEEDUP = 20  # chapter 18's best number of proposals
    # capstone 2's real model: attention sizes, prompts, workloads
    CAPSTONE2 = 21


def _rng(topic: Topic, *part: int) -> np.random.Generator:
    """The stream of ``topic``; ``part``: a stream of its own for one more
    exercise of the topic, whose draws leave the others' as they were."""
    return np.random.default_rng([_seed, int(topic), *part])


def sdpa_shapes(fully_masked_rows: bool) -> list[tuple]:
    """(batch dims, Tq, Tk, Dk, Dv, mask kind) of the hidden scaled dot-product
    attention cases."""
    if not active():
        return []
    rng = _rng(Topic.SDPA)

    def n(lo, hi):
        return int(rng.integers(lo, hi + 1))

    shapes = [
        # T > 9, D > 16, B >= 5
        ((n(5, 7),), n(10, 16), n(10, 16), n(17, 40), n(17, 40), None),
        # Tq > Tk, a mask row per example
        ((n(5, 6),), n(11, 15), n(4, 8), 8, 8, "random-batched"),
        ((n(5, 6), 2), n(3, 6), n(12, 18), 16, 8, "random-batched"),  # Tq < Tk
        # one length per example
        ((n(5, 8),), n(9, 13), n(9, 13), 12, 12, "padding"),
        # causal, Tq < Tk: bottom-right aligned
        ((2,), n(5, 8), n(10, 14), 8, 8, "causal"),
    ]
    if fully_masked_rows:
        # causal with Tq > Tk: empty first rows
        shapes += [
            ((n(5, 6),), n(9, 12), n(3, 6), 8, 8, "causal"),
            ((n(5, 7),), n(4, 8), n(8, 12), 8, 8, "padding-empty"),
        ]
    return shapes


def softmax_inputs() -> list[tuple[str, np.ndarray]]:
    """(description, x) of the hidden softmax cases."""
    if not active():
        return []
    rng = _rng(Topic.SOFTMAX)
    t = int(rng.integers(10, 17))
    far = rng.standard_normal((4, t)) + np.array(
        [[0.0], [2000.0], [-1500.0], [900.0]]
    )
    big = (
        rng.standard_normal(
            (int(rng.integers(5, 8)), 3, int(rng.integers(11, 20)))
        )
        * 4
    )
    ints = rng.integers(-6, 7, size=(3, t))
    single = (rng.standard_normal((3, t)) * 3).astype(np.float32)
    return [
        (
            f"a (4, {t}) matrix whose rows have maxima far apart (0, 2000, "
            "-1500, 900)",
            far,
        ),
        (f"a {big.shape} array of {big.size} values", big),
        (f"a (3, {t}) array of integers (dtype int64)", ints),
        (f"a (3, {t}) array of dtype float32", single),
        ("[[0, 1], [2000, 2001]]", np.array([[0.0, 1.0], [2000.0, 2001.0]])),
    ]


def other_dtype(framework: str) -> str | None:
    """The dtype in which the hidden attention cases are sent once more: the
    one the public cases of ``framework`` do not use (NumPy: float64 ->
    float32; torch: float32 -> float64)."""
    if not active():
        return None
    return {"numpy": "float32", "torch": "float64"}.get(framework)


def _n(rng, lo: int, hi: int) -> int:
    return int(rng.integers(lo, hi + 1))


def mha_sizes() -> list[tuple[int, int, int, int, int]]:
    """(d_model, num_heads, B, Tq, Tk) of the hidden multi-head attention
    cases: 4 to 6 heads of 3 to 5 features, B >= 5, Tq != Tk (one way, then the
    other)."""
    if not active():
        return []
    rng = _rng(Topic.MULTI_HEAD)
    heads = _n(rng, 4, 6)
    return [
        (
            heads * _n(rng, 3, 5),
            heads,
            _n(rng, 5, 7),
            _n(rng, 10, 14),
            _n(rng, 5, 9),
        )
    ]


def single_head_sizes() -> list[tuple[int, int, int, int, int]]:
    """(d_in, d_out, B, Tq, Tk) of the hidden single-head cases: d_in != d_out,
    both > 8, B >= 5, Tq != Tk."""
    if not active():
        return []
    rng = _rng(Topic.SINGLE_HEAD)
    d_in = _n(rng, 9, 14)
    return [
        (
            d_in,
            d_in + _n(rng, 1, 6),
            _n(rng, 5, 7),
            _n(rng, 3, 6),
            _n(rng, 10, 14),
        )
    ]


def block_sizes() -> list[tuple[int, int, int, int, int, int]]:
    """(d_model, num_heads, d_ff, B, T, Tk of the memory) of the hidden
    transformer-block cases (2 to 4 heads, as the public ones), with a padding
    mask per example."""
    if not active():
        return []
    rng = _rng(Topic.BLOCK)
    heads = _n(rng, 2, 4)
    return [
        (
            heads * _n(rng, 3, 6),
            heads,
            _n(rng, 10, 40),
            _n(rng, 5, 7),
            _n(rng, 9, 13),
            _n(rng, 5, 8),
        )
    ]


def window_sizes() -> list[tuple[int, int, int]]:
    """(T, window, block size) of a hidden sliding-window case (chapter 9):
    longer, the window not a multiple of the block."""
    if not active():
        return []
    rng = _rng(Topic.WINDOW)
    return [(_n(rng, 20, 30), _n(rng, 3, 8), _n(rng, 3, 6))]


def triton_sizes(multiple_of: int | None = None) -> list[tuple[int, int]]:
    """(T, Dh) of a hidden case of chapter 16's kernels: a longer sequence (a
    multiple of ``multiple_of`` when given) and a wider head."""
    if not active():
        return []
    rng = _rng(Topic.TRITON)
    t = _n(rng, 40, 90)
    if multiple_of:
        t = t // multiple_of * multiple_of
    return [(t, int(rng.choice([32, 64])))]


def sink_sizes() -> list[tuple[int, int, int]]:
    """(H, T, window) of a hidden sinks-in-a-window case (chapter 14): more
    heads, longer, a window inside T."""
    if not active():
        return []
    rng = _rng(Topic.SINKS)
    t = _n(rng, 12, 20)
    return [(_n(rng, 3, 6), t, _n(rng, 2, t - 2))]


def flex_sizes() -> list[tuple[int, int, int]]:
    """(B, H, T) of a hidden case of chapter 15's mods: batches of 5 and more,
    5 to 8 heads, longer rows."""
    if not active():
        return []
    rng = _rng(Topic.FLEX)
    return [(_n(rng, 5, 7), _n(rng, 5, 8), _n(rng, 20, 33))]


def sink_lse_cases() -> list[tuple[int, int, int, int, int, int | None]]:
    """(B, H, Tq, Tk, D, window) of the hidden cases of chapter 15's sinks from
    the log-sum-exp: a batch of 3 to 5, 5 to 8 heads, a cache 10 to 20 longer
    than the queries (Tk + 1 above every other size, for the check that watches
    for a sink column), with a window inside it and without one."""
    if not active():
        return []
    rng = _rng(Topic.SINKS_LSE)
    cases = []
    for windowed in (True, False):
        t_q = _n(rng, 2, 6)
        t_k = t_q + _n(rng, 10, 20)
        window = _n(rng, 2, t_k - 1) if windowed else None
        cases.append(
            (_n(rng, 3, 5), _n(rng, 5, 8), t_q, t_k, 2 * _n(rng, 4, 6), window)
        )
    return cases


def linear_sizes() -> list[tuple[int, int, int, int, int]]:
    """(B, H, T, Dk, Dv) of a hidden gated-delta-rule case (chapter 17): a
    batch of 3 to 5, more heads, a longer sequence, Dk != Dv."""
    if not active():
        return []
    rng = _rng(Topic.LINEAR)
    dk = _n(rng, 5, 12)
    return [
        (_n(rng, 3, 5), _n(rng, 3, 6), _n(rng, 24, 48), dk, dk + _n(rng, 1, 4))
    ]


def capstone_sizes() -> list[tuple[int, int, tuple[int, ...]]]:
    """(d_model, num_heads, chunk lengths) of a hidden capstone case: 2 to 4
    heads of an even width, a prompt, then chunks of 1 to 3 tokens, 10 to 16
    tokens in all."""
    if not active():
        return []
    rng = _rng(Topic.CAPSTONE)
    heads = _n(rng, 2, 4)
    chunks, total = [_n(rng, 4, 7)], _n(rng, 10, 16)
    while sum(chunks) < total:
        chunks.append(_n(rng, 1, 3))
    return [(heads * 2 * _n(rng, 2, 4), heads, tuple(chunks))]


def causal_sizes() -> list[tuple[int, int]]:
    """(Tq, Tk) of the hidden causal-mask cases: larger, and Tq > Tk
    (bottom-right aligned: the first Tq - Tk rows attend nothing)."""
    if not active():
        return []
    rng = _rng(Topic.CAUSAL_MASK)
    return [
        (int(rng.integers(10, 16)), int(rng.integers(17, 24))),
        (int(rng.integers(8, 12)), int(rng.integers(3, 7))),
        (int(rng.integers(12, 20)),) * 2,
    ]


def padding_batches() -> list[tuple[list[int], int]]:
    """(lengths, T) of the hidden padding-mask cases: batches of 5 to 8, T >
    9."""
    if not active():
        return []
    rng = _rng(Topic.PADDING_MASK)
    t = int(rng.integers(10, 17))
    return [
        (
            [
                int(x)
                for x in rng.integers(0, t + 1, size=int(rng.integers(5, 9)))
            ],
            t,
        )
    ]


def one_query_shapes() -> list[tuple[int, int, int]]:
    """(Tk, Dk, Dv) of the hidden one-query cases."""
    if not active():
        return []
    rng = _rng(Topic.ONE_QUERY)
    return [
        (
            int(rng.integers(10, 40)),
            int(rng.integers(17, 33)),
            int(rng.integers(9, 25)),
        )
    ]


def serving_tables() -> list[tuple[list[int], int]]:
    """(block table, block size) of a hidden block-table case (chapter 18): a
    longer table of shuffled blocks."""
    if not active():
        return []
    rng = _rng(Topic.SERVING)
    blocks = _n(rng, 6, 10)
    return [
        ([int(b) for b in rng.permutation(3 * blocks)[:blocks]], _n(rng, 2, 7))
    ]


def rope_sizes() -> list[tuple[tuple[int, int, int, int], int]]:
    """(shape (B, H, T, Dh), first position) of a hidden RoPE case (chapter
    10): more heads, a longer sequence, a wider head, positions starting far
    from 0."""
    if not active():
        return []
    rng = _rng(Topic.POSITIONS)
    return [
        (
            (
                _n(rng, 2, 4),
                _n(rng, 3, 6),
                _n(rng, 12, 24),
                2 * _n(rng, 5, 12),
            ),
            _n(rng, 20, 500),
        )
    ]


def alibi_sizes() -> list[tuple[int, int, int, int, int]]:
    """(B, H, Tq, Tk, Dh) of a hidden ALiBi case (chapter 10): a batch of 3 to
    5, more heads, a longer cache, several new queries."""
    if not active():
        return []
    rng = _rng(Topic.POSITIONS)
    t_q = _n(rng, 2, 6)
    return [
        (
            _n(rng, 3, 5),
            _n(rng, 5, 9),
            t_q,
            t_q + _n(rng, 10, 20),
            _n(rng, 5, 12),
        )
    ]


def left_padded_batches() -> list[tuple[int, int, int, list[int]]]:
    """(H, T, Dh, padding per row) of a hidden left-padded RoPE case (chapter
    10): a batch of 5 to 7, a longer row, each row its own padding."""
    if not active():
        return []
    rng = _rng(Topic.POSITIONS)
    t = _n(rng, 10, 16)
    pads = [int(x) for x in rng.integers(0, t, size=_n(rng, 5, 7))]
    return [(_n(rng, 2, 4), t, 2 * _n(rng, 4, 8), pads)]


def rope_weight_sizes() -> list[tuple[int, int, int]]:
    """(H, Dh, D) of a hidden RoPE weight conversion (chapter 10): more heads,
    a wider head, D != H * Dh."""
    if not active():
        return []
    rng = _rng(Topic.POSITIONS)
    return [(_n(rng, 4, 8), 2 * _n(rng, 5, 8), _n(rng, 9, 20))]


def schedule_steps() -> list[tuple[list[int], list[int], int, int, int]]:
    """(computed, pending, free blocks, block size, token budget) of hidden
    scheduling steps (chapter 18): 5 to 7 running sequences, decodes and
    prefills mixed, a block size of 4, 8 or 16, few free blocks (a preemption
    is likely) and a budget that chunks a prefill."""
    if not active():
        return []
    rng = _rng(Topic.SCHEDULE)
    steps = []
    for _ in range(2):
        n = _n(rng, 5, 7)
        pending = [
            1 if rng.random() < 0.5 else _n(rng, 2, 40) for _ in range(n)
        ]
        computed = [
            _n(rng, 0, 60) if x == 1 else _n(rng, 0, 20) for x in pending
        ]
        steps.append(
            (
                computed,
                pending,
                _n(rng, 0, 3),
                int(rng.choice([4, 8, 16])),
                _n(rng, n + 2, 40),
            )
        )
    return steps


def verify_passes() -> list[
    tuple[np.ndarray, np.ndarray, list[int], list[float]]
]:
    """(p (k + 1, V), q (k, V), proposals, u) of hidden sampled verify passes
    (chapter 18): k of 4 to 6 proposals over 5 to 8 tokens; one pass keeps
    every proposal (the bonus token), the other rejects one at a drawn place (a
    token the draft favours more than the target)."""
    if not active():
        return []
    rng = _rng(Topic.SPECULATIVE)
    k, vocab = _n(rng, 4, 6), _n(rng, 5, 8)
    p, q = (
        rng.dirichlet(np.ones(vocab), size=k + 1),
        rng.dirichlet(np.ones(vocab), size=k),
    )
    proposals = [int(x) for x in rng.integers(0, vocab, size=k)]
    accept = [min(1.0, p[i, x] / q[i, x]) for i, x in enumerate(proposals)]
    # below each acceptance probability
    kept = [float(a * rng.uniform(0.1, 0.9)) for a in accept]
    at = _n(rng, 0, k - 1)
    rejected = list(proposals)
    # p < q there: accepted with probability p / q < 1
    rejected[at] = int(np.argmax(q[at] - p[at]))
    a = p[at, rejected[at]] / q[at, rejected[at]]
    u = list(kept)
    u[at] = float(a + (1 - a) * rng.uniform(0.2, 0.8))
    return [(p, q, proposals, kept), (p, q, rejected, u)]


def speedup_cases() -> list[tuple[float, float, int]]:
    """(alpha, draft cost, max k) of hidden best-k cases (chapter 18):
    acceptance rates and draft costs the public cases do not use, max k from 6
    to 24."""
    if not active():
        return []
    rng = _rng(Topic.SPEEDUP)
    return [
        (
            round(float(rng.uniform(0.3, 0.95)), 3),
            round(float(rng.uniform(0.01, 0.5)), 3),
            _n(rng, 6, 24),
        )
        for _ in range(3)
    ]


def capstone2_attention_sizes() -> list[tuple[int, int, int, tuple[int, ...]]]:
    """(d_model, num_heads, num_kv_heads, chunk lengths) of a hidden capstone-2
    attention case: 2 to 4 key/value heads shared by 2 or 3 query heads each, a
    head width of 4 to 8 (even), a prompt then chunks of 1 to 3."""
    if not active():
        return []
    rng = _rng(Topic.CAPSTONE2)
    kv, rep, dh = _n(rng, 2, 4), _n(rng, 2, 3), 2 * _n(rng, 2, 4)
    chunks, total = [_n(rng, 3, 6)], _n(rng, 8, 12)
    while sum(chunks) < total:
        chunks.append(_n(rng, 1, 3))
    return [(kv * rep * dh, kv * rep, kv, tuple(chunks))]


def capstone2_prompts(vocab_size: int) -> list[list[int]]:
    """Hidden prompts for the real model: two of random token ids (6 to 12
    tokens), the second with a repeated stretch (what an induction head
    copies)."""
    if not active():
        return []
    rng = _rng(Topic.CAPSTONE2)
    first = [
        int(t) for t in rng.integers(100, vocab_size, size=_n(rng, 6, 12))
    ]
    stretch = [
        int(t) for t in rng.integers(100, vocab_size, size=_n(rng, 4, 6))
    ]
    return [first, stretch + [int(rng.integers(100, vocab_size))] + stretch]


def capstone2_lookup_prompts(vocab_size: int) -> list[list[int]]:
    """Hidden prompts for prompt-lookup decoding: a stretch of 5 to 8 random
    token ids three times, then its first 2 or 3 again, so that the last two
    tokens occur earlier (what the lookup finds, and the induction heads
    copy). The ids come from the tokenizer's first merges (100 to 2000,
    common pieces), which SmolLM2 goes on repeating more often than rare
    ones: 4.4 passes for 12 new tokens on average over 8 draws, against 9.3
    with ids from the whole vocabulary and two copies."""
    if not active():
        return []
    rng = _rng(Topic.CAPSTONE2, 6)  # exercise 6's own stream
    common = min(2000, vocab_size)
    stretch = [int(t) for t in rng.integers(100, common, size=_n(rng, 5, 8))]
    return [stretch * 3 + stretch[: _n(rng, 2, 3)]]


def capstone2_serving_workloads(
    vocab_size: int,
) -> list[tuple[list[list[int]], list[int], int, int]]:
    """A hidden serving workload (prompts, max_new_tokens, max_running,
    block_size): 4 requests of 3 to 7 common token ids (100 to 2000), 2 to 5
    new tokens each, all different (so that a request finishes while others
    wait, and static batching differs from continuous), 2 or 3 in flight,
    blocks of 2 or 3 tokens."""
    if not active():
        return []
    rng = _rng(Topic.CAPSTONE2, 7)  # exercise 7's own stream
    common = min(2000, vocab_size)
    prompts = [
        [int(t) for t in rng.integers(100, common, size=_n(rng, 3, 7))]
        for _ in range(4)
    ]
    new = [int(n) for n in rng.permutation([2, 3, 4, 5])]
    return [(prompts, new, _n(rng, 2, 3), _n(rng, 2, 3))]
