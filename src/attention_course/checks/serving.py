"""Checks of chapter 18 (serving): block-table arithmetic, copy-on-write, the verify step's mask, the speculative
rejection rule, and retiring finished sequences. Each known mistake is the right answer with one deviation; a wrong
answer is named by the first deviation that reproduces every case."""

from __future__ import annotations

import operator

import numpy as np
import torch

from ..serving.speculative import accept_probability, residual_distribution
from . import hidden
from .questions import number_question
from .runner import DEFAULT_TIMEOUT, as_array, as_number, call, display_name, fail, run_check, type_name


def _judge(got, expected, mistakes, success: str, unknown: str, same=operator.eq) -> str:
    """The verdict of a check that ran the student's function on fixed cases: ``got`` holds (answer, call text) per
    case, ``expected(variant)`` yields the answers of the right version ("right") or of a known mistake, one per case.
    All right: ``success``. Otherwise the first mistake whose answers match every case is named; none: ``unknown``,
    shown with the first case answered wrongly."""
    wrong = [i for i, ((g, _), want) in enumerate(zip(got, expected("right"), strict=True)) if not same(g, want)]
    if not wrong:
        return success
    case = got[wrong[0]][1]
    for code, variant in mistakes:
        if all(same(g, want) for (g, _), want in zip(got, expected(variant), strict=True)):
            raise fail(code, case=case)
    raise fail("wrong-value", unknown, case=case)


# ---------------------------------------------------------------- block-table arithmetic

_SLOT_CASES = [([3, 0, 5, 1], 4, [0, 3, 4, 7, 9, 11]), ([6, 2, 7], 3, [0, 2, 3, 5]), ([4, 9, 1, 2], 1, [0, 1, 2]),
               ([8, 1, 6], 16, [0, 5, 15, 16, 20])]


def _slot_variant(table, p, b, variant):
    index = {"off-by-one": p // b + 1}.get(variant, p // b)
    if index >= len(table):
        return None
    if variant == "no-table":
        return p
    if variant == "not-scaled":
        return table[index] + p % b
    return table[index] * b + p % b


_SLOT_MISTAKES = [("block-index-off-by-one", "off-by-one"), ("slot-ignores-table", "no-table"),
                  ("slot-block-not-scaled", "not-scaled")]


def _slot_cases():
    cases = [(t, b, p) for t, b, ps in _SLOT_CASES for p in ps]
    for table, b in hidden.serving_tables():
        cases += [(table, b, p) for p in range(0, len(table) * b - b)]
    return cases


def check_block_slot(fn, *, timeout: float = DEFAULT_TIMEOUT):
    """Check ``fn(table, position, block_size)`` -> the pool slot (an int) of a sequence's ``position``: its block
    is ``table[position // block_size]`` and it sits ``position % block_size`` into that block of ``block_size``
    slots. Tables hold one block more than the positions asked need (reserved for the next tokens)."""
    label = display_name(fn, "slot")

    def body():
        cases = _slot_cases()
        got = []
        for table, b, p in cases:
            text = f"{label}({table}, {p}, {b})"
            value = as_number(call(fn, {"table": list(table), "position": p, "block_size": b}, label,
                                   call_text=text))
            if value is None:
                raise fail("wrong-type", "Your function must return the slot, an int.", case=text)
            got.append((value, text))
        return _judge(got, lambda variant: (_slot_variant(t, p, b, variant) for t, b, p in cases), _SLOT_MISTAKES,
                      f"✓ {label}: {len(cases)} positions in tables with blocks of 1, 3, 4 and 16 slots are right",
                      "That slot is not where this position lives, and it matches none of the mistakes this checker "
                      "knows. Which block holds the position, and how far into it is the position?")

    run_check(body, timeout)


# ---------------------------------------------------------------- copy-on-write

_COW_CASES = [([2, 5, 7], 1, [0, 0, 1, 0, 0, 2, 0, 1, 0, 0], [0, 4, 9]),
              ([2, 5, 7], 2, [0, 0, 1, 0, 0, 2, 0, 1, 0, 0], [0, 4, 9]),
              ([3, 1], 0, [0, 1, 0, 3, 0, 0, 0, 0, 0], [6, 8]), ([4], 0, [0, 0, 0, 0, 1], [0])]


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


_COW_MISTAKES = [("shared-block-freed", "freed"), ("cow-no-copy", "no-copy"), ("cow-refs-not-moved", "refs-not-moved")]


def _int_list(value, what: str, case: str) -> list[int]:
    """A sequence of whole numbers (a list, a tuple, a 1-D NumPy array or tensor) as a list of ints."""
    if isinstance(value, (np.ndarray, torch.Tensor)):
        value = value.tolist() if value.ndim == 1 else None
    if not isinstance(value, (list, tuple)) or not all(as_number(v) is not None and float(as_number(v)).is_integer()
                                                       for v in value):
        raise fail("wrong-type", f"{what} must be a list of whole numbers (a tuple or a 1-D array is fine too); it "
                   f"is {type_name(value)}.", case=case)
    return [int(as_number(v)) for v in value]


def _three_lists(result, case: str):
    if not isinstance(result, (tuple, list)) or len(result) != 3:
        raise fail("wrong-type", f"Your function must return the three lists table, refs and free (a tuple or a list "
                   f"of them); it returned {type_name(result)}.", case=case)
    return tuple(_int_list(x, f"Your {name}", case) for x, name in zip(result, ("table", "refs", "free"), strict=True))


def check_copy_on_write(fn, *, timeout: float = DEFAULT_TIMEOUT):
    """Check ``fn(table, index, refs, free)`` -> ``(table, refs, free)`` after making block ``table[index]`` safe to
    write: if other sequences also hold it (``refs[block] > 1``), take the last block of ``free`` (``free.pop()``),
    put it at ``table[index]`` with one reference, and drop one reference from the old block (which stays in use);
    a block held once is written in place (nothing changes). ``refs`` is the list of every block's reference count
    (indexed by block), ``free`` the list of free blocks. Return lists (the copy of the keys and values is not
    asked)."""
    label = display_name(fn, "copy_on_write")

    def body():
        got = []
        for table, index, refs, free in _COW_CASES:
            text = f"{label}({table}, {index}, {refs}, {free})"
            result = call(fn, {"table": list(table), "index": index, "refs": list(refs), "free": list(free)}, label,
                          call_text=text)
            got.append((_three_lists(result, text), text))
        return _judge(got, lambda variant: (tuple(_cow_variant(*c, variant)) for c in _COW_CASES), _COW_MISTAKES,
                      f"✓ {label}: shared and private blocks, {len(_COW_CASES)} cases, are right",
                      "That is not the state after copy-on-write, and it matches none of the mistakes this checker "
                      "knows. Who else holds the block, and which counts change when you copy it?")

    run_check(body, timeout)


# ---------------------------------------------------------------- the verify step's mask

_VERIFY_CASES = [(4, 3), (0, 2), (7, 1), (2, 5)]


def _verify_variant(cached, k, variant):
    t_q, t_k = k + 1, cached + k + 1
    if variant == "drops-cache":
        return np.tril(np.ones((t_q, t_q), bool))
    offset = {"top-left": 0, "sees-future": t_k}.get(variant, cached)
    return np.tril(np.ones((t_q, t_k), bool), offset)


_VERIFY_MISTAKES = [("verify-mask-top-left", "top-left"), ("verify-mask-sees-future", "sees-future"),
                    ("verify-mask-drops-cache", "drops-cache")]


def check_verify_mask(fn, *, timeout: float = DEFAULT_TIMEOUT):
    """Check ``fn(num_cached, k)`` -> the boolean mask (k + 1, num_cached + k + 1), True = may attend, of the target's
    verify pass: the last accepted token and k proposals (the queries) over the cache and themselves (the keys)."""
    label = display_name(fn, "verify_mask")

    def body():
        got = []
        for cached, k in _VERIFY_CASES:
            text = f"{label}({cached}, {k})"
            got.append((as_array(call(fn, {"num_cached": cached, "k": k}, label, call_text=text), "mask", text,
                                 kind="bool"), text))
        return _judge(got, lambda variant: (_verify_variant(c, k, variant) for c, k in _VERIFY_CASES),
                      _VERIFY_MISTAKES,
                      f"✓ {label}: {len(_VERIFY_CASES)} verify masks (k = 1 to 5, with and without a cache) are right",
                      "That is not the verify pass's mask, and it matches none of the mistakes this checker knows. "
                      "Where in the sequence are the k + 1 queries?", same=_same)

    run_check(body, timeout)


def _same(a, b) -> bool:
    return a.shape == b.shape and bool((a == b).all())


# ---------------------------------------------------------------- the rejection rule

_P = [[0.5, 0.3, 0.15, 0.05], [0.2, 0.2, 0.6], [0.1, 0.6, 0.3]]
_Q = [[0.1, 0.2, 0.3, 0.4], [0.5, 0.25, 0.25], [0.3, 0.3, 0.4]]


def _rejection_cases():
    """(p, q, x, u): u just below and just above each draft token's acceptance probability."""
    cases = []
    for p, q in zip(_P, _Q, strict=True):
        p, q = torch.tensor(p, dtype=torch.float64), torch.tensor(q, dtype=torch.float64)
        a = accept_probability(p, q)
        for x in range(len(p)):
            cases += [(p, q, x, max(float(a[x]) - 0.01, 0.0)), (p, q, x, min(float(a[x]) + 0.01, 0.999))]
    return cases


def _rejection_variant(p, q, x, u, variant):
    a = {"inverted": accept_probability(q, p)}.get(variant, accept_probability(p, q))
    if u < float(a[x]) or variant == "always":
        return x
    return p if variant == "target" else residual_distribution(p, q)


_REJECTION_MISTAKES = [("rejection-not-residual", "target"), ("rejection-ratio-inverted", "inverted"),
                       ("rejection-always-accepts", "always")]


def _rejection_matches(got, want) -> bool:
    if isinstance(want, int):
        return isinstance(got, int) and got == want
    return isinstance(got, np.ndarray) and got.shape == tuple(want.shape) and bool(np.allclose(got, want.numpy(),
                                                                                               atol=1e-9))


def check_rejection_rule(fn, *, timeout: float = DEFAULT_TIMEOUT):
    """Check ``fn(p, q, x, u)``: the target's distribution p (V,), the draft's q (V,), the draft's token x drawn from q
    and a uniform number u in [0, 1). Return x (an int) if it is accepted, else the (V,) distribution to draw the
    replacement from. The rule must keep p exactly: accept with probability min(1, p(x) / q(x)), else draw from
    max(0, p - q) normalised."""
    label = display_name(fn, "rejection_step")

    def body():
        cases, got = _rejection_cases(), []
        for p, q, x, u in cases:
            text = f"{label}(p={p.tolist()}, q={q.tolist()}, x={x}, u={u:.3f})"
            result = call(fn, {"p": p, "q": q, "x": x, "u": u}, label, call_text=text)
            if isinstance(result, (int, np.integer)) or (isinstance(result, torch.Tensor) and result.dim() == 0
                                                         and not result.is_floating_point()):
                got.append((int(result), text))
            else:
                got.append((as_array(result, "distribution", text), text))
        return _judge(got, lambda variant: (_rejection_variant(*c, variant) for c in cases), _REJECTION_MISTAKES,
                      f"✓ {label}: {len(cases)} accept/reject decisions on 3 vocabularies keep the target's "
                      "distribution",
                      "That decision does not keep the target's distribution, and it matches none of the mistakes "
                      "this checker knows. When is x kept, and what is drawn otherwise?", same=_rejection_matches)

    run_check(body, timeout)


# ---------------------------------------------------------------- retiring finished sequences

_RETIRE_CASES = [([[4, 2], [7, 9, 1], [3]], [5, 3, 4], 9), ([[1, 2, 3], [9], [5, 5]], [3, 4, 6], 9),
                 ([[0], [0, 0]], [1, 8], None), ([[9, 0], [2, 9, 9], [0]], [4, 4, 3], 0)]  # id 0 is an id


def _retire_variant(outputs, max_new, eos, variant):
    keep = []
    for i, (out, limit) in enumerate(zip(outputs, max_new, strict=True)):
        at_eos = out[-1] == eos and variant != "ignores-eos" and (eos or variant != "eos-zero-ignored")
        at_limit = {"ignores-limit": False, "too-early": len(out) >= limit - 1}.get(variant, len(out) >= limit)
        if not (at_eos or at_limit):
            keep.append(i)
    return keep


_RETIRE_MISTAKES = [("finished-left-in-batch", "ignores-eos"), ("finished-left-in-batch", "ignores-limit"),
                    ("retired-too-early", "too-early"), ("eos-zero-ignored", "eos-zero-ignored")]


def check_retire(fn, *, timeout: float = DEFAULT_TIMEOUT):
    """Check ``fn(outputs, max_new_tokens, eos_token_id)`` -> the indices (a list, in order) of the sequences that
    stay in the batch after a step: ``outputs[i]`` are sequence i's generated tokens, the one just produced last; a
    sequence leaves when that token is ``eos_token_id`` (None: no such token) or it has ``max_new_tokens[i]``."""
    label = display_name(fn, "still_running")

    def body():
        got = []
        for outputs, max_new, eos in _RETIRE_CASES:
            text = f"{label}({outputs}, {max_new}, {eos})"
            result = call(fn, {"outputs": [list(o) for o in outputs], "max_new_tokens": list(max_new),
                               "eos_token_id": eos}, label, call_text=text)
            got.append((_int_list(result, "Your function's result (the indices that stay)", text), text))
        return _judge(got, lambda variant: (_retire_variant(*c, variant) for c in _RETIRE_CASES), _RETIRE_MISTAKES,
                      f"✓ {label}: {len(_RETIRE_CASES)} steps with end-of-sequence tokens and length limits are right",
                      "That is not the set of sequences that stay, and it matches none of the mistakes this checker "
                      "knows. Which two events end a sequence?")

    run_check(body, timeout)


# ---------------------------------------------------------------- questions


def _perfect_draft_passes() -> int:
    from ..gpt import GPT, GPTConfig
    from ..serving import speculative_generate

    model = GPT(GPTConfig(vocab_size=16, d_model=8, num_heads=2, num_layers=1, positions="rope"), seed=0)
    return speculative_generate(model, [1, 2, 3], 12, 4, draft=model)[1].target_passes


number_question("18.blocks-wasted", answer=8,
                why="1000 tokens need ceil(1000 / 16) = 63 blocks = 1008 slots: 8 are reserved but unused.",
                known={1048: ("wrong-answer", "that is the number of slots of 63 blocks + 1; count the UNUSED ones."),
                       7: ("block-index-off-by-one", "62 blocks hold only 992 tokens: the last block is needed.")},
                hint="How many blocks of 16 does a sequence of 1000 tokens need, and how many slots do they have?")
number_question("18.perfect-draft-passes", answer=_perfect_draft_passes,
                why="the prefill gives the first token; then each pass accepts all 4 proposals and adds the target's "
                    "own token: 5 tokens per pass, 1 + 5 + 5 = 11, and one last pass for the 12th.",
                known={12: ("wrong-answer", "that is plain greedy decoding: one pass per token."),
                       3: ("wrong-answer", "12 / 4 = 3 forgets the prefill and the token the target adds per pass.")},
                hint="Count the prefill pass, then how many tokens one verify pass yields when every proposal is "
                     "accepted.")
