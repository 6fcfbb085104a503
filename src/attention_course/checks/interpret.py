"""Checks of chapter 12: the prefix-matching (induction) score, finding the induction head, a predicted pattern,
a predicted ablation."""

from __future__ import annotations

import numpy as np
import torch

from ..interpret import induction_targets, prefix_matching_score
from .questions import choice_question
from .runner import DEFAULT_TIMEOUT, as_array, call, close, display_name, fail, run_check, shape_text

choice_question(
    "12.shift-pattern",
    answer="C",
    why="output i needs input (i + 3) mod 12: some head attends from each query to the key 3 places to its right, "
        "and the last 3 queries wrap around to keys 0, 1, 2.",
    wrong={
        "A": ("predicted-reversal-pattern", ("the anti-diagonal serves reversal, where output i needs input "
                                             "11 - i; here output i needs input i + 3.")),
        "B": ("predicted-identity-pattern", ("the main diagonal would copy each digit to its own place; the "
                                             "target at i is the digit 3 places further on.")),
        "D": ("predicted-uniform-pattern", ("uniform attention averages all digits, which cannot name one of "
                                            "them; with positions, the model can and does look up exactly one key.")),
    },
)

choice_question(
    "12.ablate-previous-token",
    answer="B",
    why="an induction head finds the token to copy as the key whose PREVIOUS token matches the query's token, and "
        "only the previous-token heads of layer 1 write 'my previous token was A' into that key. Without them the "
        "four induction heads, though intact, have nothing to match: the circuit needs both of its halves.",
    wrong={
        "A": "the induction heads are intact, but they find their target through what the previous-token heads "
             "wrote into it. Switching off one stage of a circuit breaks it, wherever the copying itself happens.",
        "C": "heads cover for each other when they do the SAME job, as the four induction heads did in the chapter. "
             "Here every head with a high previous-token score is off, and no other head does that job.",
    },
)


def _cases():
    """(weights (L, B, H, T, T), ids (B, T), query_mask (B, T) or None, description); small vocabularies so that
    tokens occur more than twice (several targets per query) and some queries have none."""
    out = []
    for i, (layers, batch, heads, t, vocab, use_mask) in enumerate(
            [(2, 3, 4, 10, 4, False), (1, 2, 2, 12, 3, True), (3, 4, 3, 9, 5, True), (2, 2, 1, 16, 6, False)]):
        gen = torch.Generator().manual_seed(100 + i)
        ids = torch.randint(0, vocab, (batch, t), generator=gen)
        scores = 3 * torch.randn(layers, batch, heads, t, t, generator=gen, dtype=torch.float64)
        causal = torch.ones(t, t, dtype=torch.bool).tril()
        weights = scores.masked_fill(~causal, float("-inf")).softmax(-1)
        mask = None
        if use_mask:
            mask = torch.rand(batch, t, generator=gen) < 0.7
            mask[0, -1] = True
        text = f"L={layers}, B={batch}, H={heads}, T={t}, vocab {vocab}" + (", with query_mask" if use_mask else "")
        out.append((weights, ids, mask, text))
    return out


def _score(weights, targets, queries, reduce="sum"):
    """Mean over the chosen queries of the weight on the targets (summed, or averaged over the targets)."""
    on_target = (weights * targets[None, :, None]).sum(-1)  # (L, B, H, T)
    if reduce == "mean":
        on_target = on_target / targets.sum(-1).clamp(min=1)[None, :, None]
    return on_target.transpose(2, 3)[:, queries].mean(1).numpy()


def _variants(weights, ids, mask):
    """(code, detail, score) of each known-wrong way to compute the score."""
    targets = induction_targets(ids)  # (B, T, T)
    has = targets.any(-1)
    queries = has if mask is None else has & mask
    earlier = torch.zeros_like(targets)
    earlier[..., :-1] = targets[..., 1:]  # the earlier occurrence itself, one key before each target
    t = ids.size(1)
    including_self = targets | (torch.eye(t, dtype=torch.bool) & (ids[:, :, None] == torch.cat(
        [torch.full_like(ids[:, :1], -1), ids[:, :-1]], 1)[:, None, :]))
    every_query = torch.ones_like(has) if mask is None else mask
    out = [
        ("induction-off-by-one", "", _score(weights, earlier, queries & earlier.any(-1))),
        ("induction-all-queries", "", _score(weights, targets, every_query)),
        ("induction-mean-over-targets", "", _score(weights, targets, queries, reduce="mean")),
        ("induction-includes-self", "", _score(weights, including_self, queries | (including_self.any(-1) & (
            torch.ones_like(has) if mask is None else mask))))
    ]
    if mask is not None:
        out.append(("induction-ignores-query-mask", "", _score(weights, targets, has)))
    return out


def check_prefix_matching_score(fn, *, timeout: float = DEFAULT_TIMEOUT):
    """Check ``fn(weights, ids, query_mask=None)`` -> (L, H): for every query whose token occurred earlier, the
    attention summed over the keys right after those earlier occurrences, averaged over such queries (and over
    ``query_mask`` True only, when given). Compared with :func:`attention_course.interpret.prefix_matching_score`
    on random causal maps and token ids from small vocabularies. Diagnoses ``[induction-off-by-one]`` (the earlier
    occurrence itself scored), ``[induction-all-queries]``, ``[induction-mean-over-targets]``,
    ``[induction-includes-self]`` and ``[induction-ignores-query-mask]``."""
    label = "prefix_matching_score"

    def body():
        cases = _cases()
        for i, (weights, ids, mask, text) in enumerate(cases, 1):
            case = f"case {i} of {len(cases)}: {text}"
            args = {"weights": weights.clone(), "ids": ids.clone()}
            if mask is not None:
                args["query_mask"] = mask.clone()
            got = call(fn, args, label, positional=2)
            got = as_array(got, "result", case)
            expected = prefix_matching_score(weights, ids, mask).numpy()
            if got.shape != expected.shape:
                raise fail("wrong-shape", f"Your score has shape {shape_text(got.shape)}; expected (L, H) = "
                           f"{shape_text(expected.shape)}: one number per layer and head.", case=case)
            if close(got, expected, 1e-6, 1e-5):
                continue
            for code, detail, wrong in _variants(weights, ids, mask):
                if close(got, wrong, 1e-6, 1e-5):
                    raise fail(code, detail=detail, case=case)
            raise fail("wrong-output", "Your scores differ from the reference and match none of the known "
                       f"mistakes (largest difference {np.abs(got - expected).max():.2g}).", case=case)
        return (f"✓ {display_name(fn, label)}: {len(cases)} random cases (several layers, heads and lengths, "
                "repeated tokens, with and without query_mask) match the reference")

    run_check(body, timeout)


def _planted_maps(layer: int, head: int, seed: int):
    """Maps (L, B, H, T, T) in which (layer, head) is an induction head, layer 0 holds a previous-token head and a
    duplicate-token head, and the rest attend uniformly; ids (B, T) with a copied segment."""
    from ..tasks import repeated_segment_batch

    gen = torch.Generator().manual_seed(seed)
    ids, copy_target = repeated_segment_batch(8, 20, 40, gen, 4, 8)
    layers, heads, t = 3, 4, ids.size(1)
    uniform = torch.ones(t, t).tril()
    weights = (uniform / uniform.sum(-1, keepdim=True)).expand(layers, 8, heads, t, t).clone()
    targets = induction_targets(ids).float()  # (B, T, T)
    earlier = torch.zeros_like(targets)
    earlier[..., :-1] = targets[..., 1:]
    previous = torch.zeros(t, t)
    previous[0, 0] = 1.0
    previous[torch.arange(1, t), torch.arange(t - 1)] = 1.0

    def planted(pattern):  # (B, T, T) with rows lacking a target falling back to the previous token
        rows = pattern.sum(-1, keepdim=True)
        return torch.where(rows > 0, pattern / rows.clamp(min=1), previous)

    others = [(0, h) for h in range(heads) if (0, h) != (layer, head)]
    weights[others[0][0], :, others[0][1]] = previous
    weights[others[1][0], :, others[1][1]] = planted(earlier)  # a duplicate-token head in layer 0
    weights[layer, :, head] = planted(targets)
    return weights, ids, copy_target


def check_find_induction_head(fn, *, timeout: float = DEFAULT_TIMEOUT):
    """Check ``fn(weights, ids, copy_target)`` -> (layer, head) of the induction head, on attention maps with a
    planted induction head (in varying places), a previous-token head and a duplicate-token head. Diagnoses
    ``[found-previous-token-head]`` and ``[found-duplicate-token-head]``."""
    label = "find_induction_head"

    def body():
        places = [(1, 2), (2, 0), (1, 3), (0, 3)]
        for i, (layer, head) in enumerate(places, 1):
            weights, ids, copy_target = _planted_maps(layer, head, seed=i)
            case = f"case {i} of {len(places)}: weights {shape_text(tuple(weights.shape))}"
            got = call(fn, {"weights": weights.clone(), "ids": ids.clone(), "copy_target": copy_target.clone()},
                       label, positional=3)
            try:
                found = tuple(int(v) for v in got)
            except (TypeError, ValueError):
                raise fail("wrong-type", f"Your function returned {type(got).__name__}; expected a pair of ints "
                           "(layer, head).", case=case) from None
            if found == (layer, head):
                continue
            heads = [(0, h) for h in range(4) if (0, h) != (layer, head)]
            if found == heads[0]:
                raise fail("found-previous-token-head", case=case)
            if found == heads[1]:
                raise fail("found-duplicate-token-head", case=case)
            raise fail("wrong-value", f"Your function returned {found}; the induction head is elsewhere. Score every "
                       "head with the prefix-matching score and take the largest.", case=case)
        return f"✓ {display_name(fn, label)}: finds the induction head in {len(places)} planted cases"

    run_check(body, timeout)
