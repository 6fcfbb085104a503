"""Checks of chapter 18 (serving): block-table arithmetic, copy-on-write, the
verify step's mask, the speculative rejection rule, retiring finished
sequences, a scheduling policy, a sampled verify pass with its bonus token and
the best number of proposals. Each known mistake is the right answer with one
deviation; a wrong answer is named by the first deviation that reproduces every
case."""

from __future__ import annotations

import operator

import numpy as np
import torch

from ..serving.speculative import accept_probability, residual_distribution
from . import hidden, observe
from .questions import number_question
from .runner import (
    DEFAULT_TIMEOUT,
    as_array,
    as_number,
    call,
    display_name,
    fail,
    run_check,
    type_name,
)


def _judge(
    got, expected, mistakes, success: str, unknown: str, same=operator.eq
) -> str:
    """The verdict of a check that ran the student's function on fixed cases:
    ``got`` holds (answer, call text) per case, ``expected(variant)`` yields
    the answers of the right version ("right") or of a known mistake, one per
    case. All right: ``success``. Otherwise the first mistake whose answers
    match every case is named; none: ``unknown``, shown with the first case
    answered wrongly."""
    wrong = [
        i
        for i, ((g, _), want) in enumerate(
            zip(got, expected("right"), strict=True)
        )
        if not same(g, want)
    ]
    if not wrong:
        return success
    case = got[wrong[0]][1]
    for code, variant in mistakes:
        if all(
            same(g, want)
            for (g, _), want in zip(got, expected(variant), strict=True)
        ):
            raise fail(code, case=case)
    raise fail("wrong-value", unknown, case=case)


# ---------------------------------------------------------------- block-table
# arithmetic

_SLOT_CASES = [
    ([3, 0, 5, 1], 4, [0, 3, 4, 7, 9, 11]),
    ([6, 2, 7], 3, [0, 2, 3, 5]),
    ([4, 9, 1, 2], 1, [0, 1, 2]),
    ([8, 1, 6], 16, [0, 5, 15, 16, 20]),
]


def _slot_variant(table, p, b, variant):
    index = {"off-by-one": p // b + 1}.get(variant, p // b)
    if index >= len(table):
        return None
    if variant == "no-table":
        return p
    if variant == "not-scaled":
        return table[index] + p % b
    return table[index] * b + p % b


_SLOT_MISTAKES = [
    ("block-index-off-by-one", "off-by-one"),
    ("slot-ignores-table", "no-table"),
    ("slot-block-not-scaled", "not-scaled"),
]


def _slot_cases():
    cases = [(t, b, p) for t, b, ps in _SLOT_CASES for p in ps]
    for table, b in hidden.serving_tables():
        cases += [(table, b, p) for p in range(0, len(table) * b - b)]
    return cases


def check_block_slot(fn, *, timeout: float = DEFAULT_TIMEOUT):
    """Check ``fn(table, position, block_size)`` -> the pool slot (an int) of a
    sequence's ``position``: its block is ``table[position // block_size]`` and
    it sits ``position % block_size`` into that block of ``block_size`` slots.
    Tables hold one block more than the positions asked need (reserved for the
    next tokens)."""
    label = display_name(fn, "slot")

    def body():
        cases = _slot_cases()
        got = []
        for table, b, p in cases:
            text = f"{label}({table}, {p}, {b})"
            value = as_number(
                call(
                    fn,
                    {"table": list(table), "position": p, "block_size": b},
                    label,
                    call_text=text,
                )
            )
            if value is None:
                raise fail(
                    "wrong-type",
                    "Your function must return the slot, an int.",
                    case=text,
                )
            got.append((value, text))
        return _judge(
            got,
            lambda variant: (
                _slot_variant(t, p, b, variant) for t, b, p in cases
            ),
            _SLOT_MISTAKES,
            f"✓ {label}: {len(cases)} positions in tables with blocks of 1, "
            "3, 4 and 16 slots are right",
            "That slot is not where this position lives, and it matches "
            "none of the mistakes this checker "
            "knows. Which block holds the position, and how far into it is "
            "the position?",
        )

    run_check(body, timeout)


# ----------------------------------------------------------------
# copy-on-write

_COW_CASES = [
    ([2, 5, 7], 1, [0, 0, 1, 0, 0, 2, 0, 1, 0, 0], [0, 4, 9]),
    ([2, 5, 7], 2, [0, 0, 1, 0, 0, 2, 0, 1, 0, 0], [0, 4, 9]),
    ([3, 1], 0, [0, 1, 0, 3, 0, 0, 0, 0, 0], [6, 8]),
    ([4], 0, [0, 0, 0, 0, 1], [0]),
]


def _cow_variant(table, index, refs, free, variant):
    table, refs, free = list(table), list(refs), list(free)
    old = table[index]
    if refs[old] == 1 or variant == "no-copy":
        return table, refs, free
    new = free.pop()
    table[index], refs[new] = new, 1
    if variant != "refs-not-moved":
        refs[old] -= 1
    if variant == "freed":
        refs[old] = 0
        free.append(old)
    return table, refs, free


_COW_MISTAKES = [
    ("shared-block-freed", "freed"),
    ("cow-no-copy", "no-copy"),
    ("cow-refs-not-moved", "refs-not-moved"),
]


def _int_list(value, what: str, case: str) -> list[int]:
    """A sequence of whole numbers (a list, a tuple, a 1-D NumPy array or
    tensor) as a list of ints."""
    if isinstance(value, (np.ndarray, torch.Tensor)):
        value = value.tolist() if value.ndim == 1 else None
    if not isinstance(value, (list, tuple)) or not all(
        as_number(v) is not None and float(as_number(v)).is_integer()
        for v in value
    ):
        raise fail(
            "wrong-type",
            f"{what} must be a list of whole numbers (a tuple or a 1-D "
            "array is fine too); it "
            f"is {type_name(value)}.",
            case=case,
        )
    return [int(as_number(v)) for v in value]


def _three_lists(result, case: str):
    if not isinstance(result, (tuple, list)) or len(result) != 3:
        raise fail(
            "wrong-type",
            "Your function must return the three lists table, refs and "
            "free (a tuple or a list "
            f"of them); it returned {type_name(result)}.",
            case=case,
        )
    return tuple(
        _int_list(x, f"Your {name}", case)
        for x, name in zip(result, ("table", "refs", "free"), strict=True)
    )


def check_copy_on_write(fn, *, timeout: float = DEFAULT_TIMEOUT):
    """Check ``fn(table, index, refs, free)`` -> ``(table, refs, free)`` after
    making block ``table[index]`` safe to
    write: if other sequences also hold it (``refs[block] > 1``), take the last
    block of ``free`` (``free.pop()``), put it at ``table[index]`` with one
    reference, and drop one reference from the old block (which stays in use);
    a block held once is written in place (nothing changes). ``refs`` is the
    list of every block's reference count (indexed by block), ``free`` the list
    of free blocks. Return lists (the copy of the keys and values is not
    asked)."""
    label = display_name(fn, "copy_on_write")

    def body():
        got = []
        for table, index, refs, free in _COW_CASES:
            text = f"{label}({table}, {index}, {refs}, {free})"
            result = call(
                fn,
                {
                    "table": list(table),
                    "index": index,
                    "refs": list(refs),
                    "free": list(free),
                },
                label,
                call_text=text,
            )
            got.append((_three_lists(result, text), text))
        return _judge(
            got,
            lambda variant: (
                tuple(_cow_variant(*c, variant)) for c in _COW_CASES
            ),
            _COW_MISTAKES,
            f"✓ {label}: shared and private blocks, {len(_COW_CASES)} "
            "cases, are right",
            "That is not the state after copy-on-write, and it matches none "
            "of the mistakes this checker "
            "knows. Who else holds the block, and which counts change when "
            "you copy it?",
        )

    run_check(body, timeout)


# ---------------------------------------------------------------- the verify
# step's mask

_VERIFY_CASES = [(4, 3), (0, 2), (7, 1), (2, 5)]


def _verify_variant(cached, k, variant):
    t_q, t_k = k + 1, cached + k + 1
    if variant == "drops-cache":
        return np.tril(np.ones((t_q, t_q), bool))
    offset = {"top-left": 0, "sees-future": t_k}.get(variant, cached)
    return np.tril(np.ones((t_q, t_k), bool), offset)


_VERIFY_MISTAKES = [
    ("verify-mask-top-left", "top-left"),
    ("verify-mask-sees-future", "sees-future"),
    ("verify-mask-drops-cache", "drops-cache"),
]


def check_verify_mask(fn, *, timeout: float = DEFAULT_TIMEOUT):
    """Check ``fn(num_cached, k)`` -> the boolean mask (k + 1, num_cached + k +
    1), True = may attend, of the target's verify pass: the last accepted token
    and k proposals (the queries) over the cache and themselves (the keys)."""
    label = display_name(fn, "verify_mask")

    def body():
        got = []
        for cached, k in _VERIFY_CASES:
            text = f"{label}({cached}, {k})"
            got.append(
                (
                    as_array(
                        call(
                            fn,
                            {"num_cached": cached, "k": k},
                            label,
                            call_text=text,
                        ),
                        "mask",
                        text,
                        kind="bool",
                    ),
                    text,
                )
            )
        return _judge(
            got,
            lambda variant: (
                _verify_variant(c, k, variant) for c, k in _VERIFY_CASES
            ),
            _VERIFY_MISTAKES,
            f"✓ {label}: {len(_VERIFY_CASES)} verify masks (k = 1 to 5, "
            "with and without a cache) are right",
            "That is not the verify pass's mask, and it matches none of the "
            "mistakes this checker knows. "
            "Where in the sequence are the k + 1 queries?",
            same=_same,
        )

    run_check(body, timeout)


def _same(a, b) -> bool:
    return a.shape == b.shape and bool((a == b).all())


# ---------------------------------------------------------------- the
# rejection rule

_P = [[0.5, 0.3, 0.15, 0.05], [0.2, 0.2, 0.6], [0.1, 0.6, 0.3]]
_Q = [[0.1, 0.2, 0.3, 0.4], [0.5, 0.25, 0.25], [0.3, 0.3, 0.4]]


def _rejection_cases():
    """(p, q, x, u): u just below and just above each draft token's acceptance
    probability."""
    cases = []
    for p, q in zip(_P, _Q, strict=True):
        p, q = (
            torch.tensor(p, dtype=torch.float64),
            torch.tensor(q, dtype=torch.float64),
        )
        a = accept_probability(p, q)
        for x in range(len(p)):
            cases += [
                (p, q, x, max(float(a[x]) - 0.01, 0.0)),
                (p, q, x, min(float(a[x]) + 0.01, 0.999)),
            ]
    return cases


def _rejection_variant(p, q, x, u, variant):
    a = {"inverted": accept_probability(q, p)}.get(
        variant, accept_probability(p, q)
    )
    if u < float(a[x]) or variant == "always":
        return x
    return p if variant == "target" else residual_distribution(p, q)


_REJECTION_MISTAKES = [
    ("rejection-not-residual", "target"),
    ("rejection-ratio-inverted", "inverted"),
    ("rejection-always-accepts", "always"),
]


def _rejection_matches(got, want) -> bool:
    if isinstance(want, int):
        return isinstance(got, int) and got == want
    return (
        isinstance(got, np.ndarray)
        and got.shape == tuple(want.shape)
        and bool(np.allclose(got, want.numpy(), atol=1e-9))
    )


def check_rejection_rule(fn, *, timeout: float = DEFAULT_TIMEOUT):
    """Check ``fn(p, q, x, u)``: the target's distribution p (V,), the draft's
    q (V,), the draft's token x drawn from q and a uniform number u in [0, 1).
    Return x (an int) if it is accepted, else the (V,) distribution to draw the
    replacement from. The rule must keep p exactly: accept with probability
    min(1, p(x) / q(x)), else draw from max(0, p - q) normalised."""
    label = display_name(fn, "rejection_step")

    def body():
        cases, got = _rejection_cases(), []
        for p, q, x, u in cases:
            text = f"{label}(p={p.tolist()}, q={q.tolist()}, x={x}, u={u:.3f})"
            result = call(
                fn, {"p": p, "q": q, "x": x, "u": u}, label, call_text=text
            )
            if isinstance(result, (int, np.integer)) or (
                isinstance(result, torch.Tensor)
                and result.dim() == 0
                and not result.is_floating_point()
            ):
                got.append((int(result), text))
            else:
                got.append((as_array(result, "distribution", text), text))
        return _judge(
            got,
            lambda variant: (_rejection_variant(*c, variant) for c in cases),
            _REJECTION_MISTAKES,
            f"✓ {label}: {len(cases)} accept/reject decisions on 3 "
            "vocabularies keep the target's "
            "distribution",
            "That decision does not keep the target's distribution, and it "
            "matches none of the mistakes "
            "this checker knows. When is x kept, and what is drawn otherwise?",
            same=_rejection_matches,
        )

    run_check(body, timeout)


# ---------------------------------------------------------------- retiring
# finished sequences

_RETIRE_CASES = [
    ([[4, 2], [7, 9, 1], [3]], [5, 3, 4], 9),
    ([[1, 2, 3], [9], [5, 5]], [3, 4, 6], 9),
    # id 0 is an id
    ([[0], [0, 0]], [1, 8], None),
    ([[9, 0], [2, 9, 9], [0]], [4, 4, 3], 0),
]


def _retire_variant(outputs, max_new, eos, variant):
    keep = []
    for i, (out, limit) in enumerate(zip(outputs, max_new, strict=True)):
        at_eos = (
            out[-1] == eos
            and variant != "ignores-eos"
            and (eos or variant != "eos-zero-ignored")
        )
        at_limit = {
            "ignores-limit": False,
            "too-early": len(out) >= limit - 1,
        }.get(variant, len(out) >= limit)
        if not (at_eos or at_limit):
            keep.append(i)
    return keep


_RETIRE_MISTAKES = [
    ("finished-left-in-batch", "ignores-eos"),
    ("finished-left-in-batch", "ignores-limit"),
    ("retired-too-early", "too-early"),
    ("eos-zero-ignored", "eos-zero-ignored"),
]


def check_retire(fn, *, timeout: float = DEFAULT_TIMEOUT):
    """Check ``fn(outputs, max_new_tokens, eos_token_id)`` -> the indices (a
    list, in order) of the sequences that stay in the batch after a step:
    ``outputs[i]`` are sequence i's generated tokens, the one just produced
    last; a sequence leaves when that token is ``eos_token_id`` (None: no such
    token) or it has ``max_new_tokens[i]``."""
    label = display_name(fn, "still_running")

    def body():
        got = []
        for outputs, max_new, eos in _RETIRE_CASES:
            text = f"{label}({outputs}, {max_new}, {eos})"
            result = call(
                fn,
                {
                    "outputs": [list(o) for o in outputs],
                    "max_new_tokens": list(max_new),
                    "eos_token_id": eos,
                },
                label,
                call_text=text,
            )
            got.append(
                (
                    _int_list(
                        result,
                        "Your function's result (the indices that stay)",
                        text,
                    ),
                    text,
                )
            )
        return _judge(
            got,
            lambda variant: (
                _retire_variant(*c, variant) for c in _RETIRE_CASES
            ),
            _RETIRE_MISTAKES,
            f"✓ {label}: {len(_RETIRE_CASES)} steps with end-of-sequence "
            "tokens and length limits are right",
            "That is not the set of sequences that stay, and it matches "
            "none of the mistakes this checker "
            "knows. Which two events end a sequence?",
        )

    run_check(body, timeout)


# ---------------------------------------------------------------- a scheduling
# policy

# (computed, pending, free_blocks, block_size, token_budget): sequences in
# admission order, oldest first
_SCHEDULE_CASES = [
    ([30, 0, 17], [1, 40, 1], 1, 16, 24),
    ([15, 31, 47, 8], [1, 1, 1, 20], 1, 16, 16),
    ([5, 9, 16, 0], [1, 3, 1, 12], 0, 4, 10),
    ([12, 7, 3], [1, 1, 1], 0, 4, 8),
    ([10, 0, 20], [6, 1, 1], 2, 8, 6),
]


def _ceil_div(n: int, size: int) -> int:
    return -(-n // size)


def _plan_tokens(alive, pending, budget, variant) -> list[int]:
    """Tokens per sequence this step: decodes (one pending token) first, then
    prefills in chunks, oldest first."""
    decodes = [i for i in alive if pending[i] == 1]
    order = (
        alive
        if variant == "arrival"
        else decodes + [i for i in alive if pending[i] != 1]
    )
    left, tokens = budget, [0] * len(pending)
    for i in order:
        take = min(pending[i], left)
        tokens[i] = 0 if variant == "no-chunk" and take < pending[i] else take
        left -= tokens[i]
    return tokens


def _schedule_variant(computed, pending, free, size, budget, variant):
    """(tokens, preempted) of the policy, or of one known mistake: plan, and
    while the new blocks the plan needs exceed the free ones (with those of the
    preempted), preempt the youngest sequence left and plan again."""
    alive, preempted = list(range(len(computed))), []
    while True:
        tokens = _plan_tokens(alive, pending, budget, variant)
        # a new block for every started block_size tokens, as if no block had
        # room
        if variant == "partial":
            need = sum(_ceil_div(tokens[i], size) for i in alive)
        else:
            need = sum(
                _ceil_div(computed[i] + tokens[i], size)
                - _ceil_div(computed[i], size)
                for i in alive
            )
        freed = (
            0
            if variant == "freed-ignored"
            else sum(_ceil_div(computed[j], size) for j in preempted)
        )
        if need <= free + freed or len(alive) == 1:
            return tokens, preempted
        victim = alive[0] if variant == "oldest" else alive[-1]
        alive.remove(victim)
        preempted.append(victim)


_SCHEDULE_MISTAKES = [
    ("decode-not-first", "arrival"),
    ("prefill-not-chunked", "no-chunk"),
    ("block-room-ignored", "partial"),
    ("preempt-frees-ignored", "freed-ignored"),
    ("preempt-wrong-victim", "oldest"),
]


def check_schedule(fn, *, timeout: float = DEFAULT_TIMEOUT):
    """Check ``fn(computed, pending, free_blocks, block_size, token_budget)``
    -> ``(tokens, preempted)``: one step's plan for the running sequences,
    listed oldest first; ``computed[i]`` positions of sequence i are in its
    blocks (it holds ceil(computed[i] / block_size) of them), ``pending[i]``
    tokens wait to run (1: it is decoding). Decodes first, one token each,
    oldest first; then prefills, oldest first, each taking what is left of the
    ``token_budget`` (a chunk when its whole prompt does not fit). The new
    blocks the plan needs (a sequence fills its last block before it takes a
    new one) must fit in ``free_blocks``: otherwise preempt the youngest
    sequence still running (its blocks become free) and plan again.
    ``tokens[i]``: sequence i's tokens this step (0 if preempted or left out);
    ``preempted``: the indices preempted, in order."""
    label = display_name(fn, "schedule")

    def body():
        got, cases = [], _SCHEDULE_CASES + hidden.schedule_steps()
        for computed, pending, free, size, budget in cases:
            text = f"{label}({computed}, {pending}, {free}, {size}, {budget})"
            result = call(
                fn,
                {
                    "computed": list(computed),
                    "pending": list(pending),
                    "free_blocks": free,
                    "block_size": size,
                    "token_budget": budget,
                },
                label,
                call_text=text,
            )
            if not isinstance(result, (tuple, list)) or len(result) != 2:
                raise fail(
                    "wrong-type",
                    "Your function must return (tokens, preempted), two "
                    "lists; it returned "
                    f"{type_name(result)}.",
                    case=text,
                )
            got.append(
                (
                    tuple(
                        _int_list(x, f"Your {name}", text)
                        for x, name in zip(
                            result, ("tokens", "preempted"), strict=True
                        )
                    ),
                    text,
                )
            )
        return _judge(
            got,
            lambda variant: (_schedule_variant(*c, variant) for c in cases),
            _SCHEDULE_MISTAKES,
            f"✓ {label}: {len(cases)} steps (decodes and chunked prefills, "
            "blocks with room "
            "left, preemptions) are planned right",
            "That is not the policy's plan, and it matches none of the "
            "mistakes this checker knows. Who "
            "runs first, how many new blocks does each sequence need, and "
            "whom does a shortage preempt?",
            same=lambda g, want: g == tuple(want),
        )

    run_check(body, timeout)


# ---------------------------------------------------------------- the verify
# step with sampling: k proposals, bonus

_SAMPLED_P = [
    [0.4, 0.3, 0.2, 0.1],
    [0.1, 0.6, 0.2, 0.1],
    [0.25, 0.25, 0.25, 0.25],
    [0.05, 0.15, 0.3, 0.5],
]
_SAMPLED_Q = [[0.2, 0.5, 0.2, 0.1], [0.3, 0.3, 0.3, 0.1], [0.1, 0.2, 0.6, 0.1]]
# (proposals, u): every proposal kept (the bonus token), the first rejected,
# the second rejected and the third one that would pass, u between min(1, p/q)
# and min(1, q/p) so that an inverted ratio decides otherwise
_SAMPLED_CASES = [
    ([0, 1, 0], [0.5, 0.3, 0.9]),
    ([1, 1, 3], [0.7, 0.2, 0.3]),
    ([2, 0, 1], [0.9, 0.5, 0.1]),
    ([0, 2, 2], [0.1, 0.8, 0.3]),
    ([3, 1, 2], [0.95, 0.95, 0.2]),
]


def _sampled_cases() -> list[
    tuple[torch.Tensor, torch.Tensor, list[int], list[float]]
]:
    """(p, q, proposals, u) of the public passes, then the hidden ones (longer
    passes, larger vocabularies)."""
    p, q = (
        torch.tensor(_SAMPLED_P, dtype=torch.float64),
        torch.tensor(_SAMPLED_Q, dtype=torch.float64),
    )
    cases = [(p, q, list(x), list(u)) for x, u in _SAMPLED_CASES]
    return cases + [
        (torch.from_numpy(p), torch.from_numpy(q), x, u)
        for p, q, x, u in hidden.verify_passes()
    ]


def _sampled_variant(p, q, proposals, u, variant):
    """(accepted, distribution of the pass's last token) of the rule, or of a
    known mistake."""
    k = len(proposals)
    top, bottom = (q, p) if variant == "inverted" else (p, q)
    kept = [
        u[i] < float(accept_probability(top[i], bottom[i])[x])
        for i, x in enumerate(proposals)
    ]
    # the first rejection ends the pass
    n = kept.index(False) if False in kept else k
    if n == k:
        return k, {"no-bonus": None, "bonus-row": p[k - 1]}.get(variant, p[k])
    count = sum(kept) if variant == "continues" else n
    return count, p[n] if variant == "target" else residual_distribution(
        p[n], q[n]
    )


_SAMPLED_MISTAKES = [
    ("rejection-not-residual", "target"),
    ("rejection-ratio-inverted", "inverted"),
    ("accepts-after-rejection", "continues"),
    ("bonus-token-missing", "no-bonus"),
    ("bonus-row-off-by-one", "bonus-row"),
]


def _sampled_matches(got, want) -> bool:
    (n, dist), (n_want, dist_want) = got, want
    if n != n_want or (dist is None) != (dist_want is None):
        return False
    return dist is None or (
        dist.shape == tuple(dist_want.shape)
        and bool(np.allclose(dist, dist_want.numpy(), atol=1e-9))
    )


def check_verify_sampled(fn, *, timeout: float = DEFAULT_TIMEOUT):
    """Check ``fn(p, q, proposals, u)`` -> ``(accepted, distribution)``: one
    verify pass of sampled speculative decoding. ``p`` (k + 1, V): the target's
    distributions after the last accepted token and after each proposal;
    ``q`` (k, V): the draft's, from which proposal i was drawn; ``u`` k uniform
    numbers. Proposals are kept in order while u[i] < min(1, p[i][x] /
    q[i][x]); the first rejection ends the pass. Return how many were kept and
    the (V,) distribution of the pass's last token: the residual max(0, p[n] -
    q[n]) normalised after a rejection at n, p[k] (the bonus token) when all k
    were kept."""
    label = display_name(fn, "verify")

    def body():
        got, cases = [], _sampled_cases()
        ks = sorted({len(proposals) for _, _, proposals, _ in cases})
        for p, q, proposals, u in cases:
            shown = [round(x, 3) for x in u]
            text = (
                f"{label}(p {tuple(p.shape)}, q {tuple(q.shape)}, "
                f"proposals={proposals}, u={shown})"
            )
            result = call(
                fn,
                {
                    "p": p.clone(),
                    "q": q.clone(),
                    "proposals": list(proposals),
                    "u": list(u),
                },
                label,
                call_text=text,
            )
            if (
                not isinstance(result, (tuple, list))
                or len(result) != 2
                or as_number(result[0]) is None
            ):
                raise fail(
                    "wrong-type",
                    "Your function must return (accepted, distribution): an "
                    "int and a (V,) "
                    f"tensor; it returned {type_name(result)}.",
                    case=text,
                )
            dist = (
                None
                if result[1] is None
                else as_array(result[1], "distribution", text)
            )
            got.append(((int(as_number(result[0])), dist), text))
        return _judge(
            got,
            lambda variant: (_sampled_variant(*c, variant) for c in cases),
            _SAMPLED_MISTAKES,
            f"✓ {label}: {len(cases)} verify passes of k = "
            f"{' and '.join(map(str, ks))} (the first or "
            "second proposal rejected, or none and the bonus token) keep "
            "the target's distribution",
            "That pass does not keep the target's distribution, and it "
            "matches none of the mistakes this "
            "checker knows. Which proposals count, and which row of p does "
            "the last token come from?",
            same=_sampled_matches,
        )

    run_check(body, timeout)


# ---------------------------------------------------------------- the best k
# from alpha and the draft's cost

# (alpha, draft_cost, max_k): the chapter's measured alpha and cost, cheap and
# dear drafts, good and poor ones
_BEST_K_CASES = [
    (0.68, 1 / 3, 10),
    (0.9, 0.05, 16),
    (0.8, 0.1, 12),
    (0.5, 0.3, 8),
    (0.3, 0.4, 8),
    (0.6, 0.02, 16),
]


def _best_k_variant(alpha, cost, max_k, variant) -> int:
    def tokens(k):  # expected tokens of one verify pass, or a known mistake's
        if variant == "linear":
            return 1 + k * alpha
        first = 1 if variant == "no-bonus" else 0
        return sum(alpha**i for i in range(first, k + 1))

    def speedup(k):
        return tokens(k) / {
            "cost-ignored": 1,
            "target-forgotten": k * cost,
        }.get(variant, 1 + k * cost)

    # the smallest of equal k
    return max(range(1, max_k + 1), key=lambda k: (speedup(k), -k))


_BEST_K_MISTAKES = [
    ("spec-cost-ignored", "cost-ignored"),
    ("spec-acceptance-not-compounded", "linear"),
    ("spec-bonus-forgotten", "no-bonus"),
    ("spec-target-pass-forgotten", "target-forgotten"),
]


def check_best_k(fn, *, timeout: float = DEFAULT_TIMEOUT):
    """Check ``fn(alpha, draft_cost, max_k)`` -> the k in 1 .. max_k with the
    highest expected speed-up of speculative decoding: each proposal accepted
    with probability ``alpha`` independently, a draft pass costing
    ``draft_cost`` target passes (the smallest k of equal speed-ups). Without
    the library's ``serving.speculative`` (``[spec-from-library]``)."""
    label = display_name(fn, "best_k")

    def body():
        got, cases = [], _BEST_K_CASES + hidden.speedup_cases()
        for alpha, cost, max_k in cases:
            text = (
                f"{label}(alpha={alpha}, draft_cost={cost:.4g}, max_k={max_k})"
            )
            with observe.LibraryCalls("serving") as library:
                value = as_number(
                    call(
                        fn,
                        {"alpha": alpha, "draft_cost": cost, "max_k": max_k},
                        label,
                        call_text=text,
                    )
                )
            if library.called:
                raise fail(
                    "spec-from-library", detail=library.called[0], case=text
                )
            if value is None or not float(value).is_integer():
                raise fail(
                    "wrong-type",
                    "Your function must return k, a whole number.",
                    case=text,
                )
            got.append((int(value), text))
        return _judge(
            got,
            lambda variant: (_best_k_variant(*c, variant) for c in cases),
            _BEST_K_MISTAKES,
            f"✓ {label}: {len(cases)} pairs of alpha and draft cost give "
            "the k of the highest "
            "expected speed-up",
            "That k does not give the highest expected speed-up, and it "
            "matches none of the mistakes this "
            "checker knows. How many tokens does a pass bring on average, "
            "and what does it cost?",
        )

    run_check(body, timeout)


# ---------------------------------------------------------------- questions


def _perfect_draft_passes() -> int:
    from ..gpt import GPT, GPTConfig
    from ..serving import speculative_generate

    model = GPT(
        GPTConfig(
            vocab_size=16,
            d_model=8,
            num_heads=2,
            num_layers=1,
            positions="rope",
        ),
        seed=0,
    )
    return speculative_generate(model, [1, 2, 3], 12, 4, draft=model)[
        1
    ].target_passes


number_question(
    "18.blocks-wasted",
    answer=14,
    why="1010 tokens need ceil(1010 / 16) = 64 blocks = 1024 slots: 14 "
    "are reserved but unused.",
    known={
        8: (
            "wrong-answer",
            "that is half a block, the AVERAGE waste over many lengths; this "
            "sequence has a length of its own.",
        ),
        2: (
            "wrong-answer",
            "1010 % 16 = 2 is how many tokens the last block holds; the "
            "unused slots "
            "are the rest of that block.",
        ),
        1024: (
            "wrong-answer",
            "that is the number of slots of 64 blocks; count the UNUSED ones.",
        ),
        -2: (
            "block-index-off-by-one",
            "1010 // 16 = 63 blocks hold only 1008 tokens: the last "
            "2 tokens need one more block.",
        ),
        64: (
            "wrong-answer",
            "that is the number of blocks; the question asks for unused "
            "slots.",
        ),
    },
    hint="How many blocks of 16 does a sequence of 1010 tokens need, and "
    "how many slots do they have?",
)
number_question(
    "18.perfect-draft-passes",
    answer=_perfect_draft_passes,
    why="the prefill gives the first token; then each pass accepts all "
    "4 proposals and adds the target's "
    "own token: 5 tokens per pass, 1 + 5 + 5 = 11, and one last pass for "
    "the 12th.",
    known={
        12: (
            "wrong-answer",
            "that is plain greedy decoding: one pass per token.",
        ),
        3: (
            "wrong-answer",
            "12 / 4 = 3 forgets the prefill and the token the target adds "
            "per pass.",
        ),
    },
    hint="Count the prefill pass, then how many tokens one verify pass "
    "yields when every proposal is "
    "accepted.",
)
