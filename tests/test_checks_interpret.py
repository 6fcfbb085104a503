"""Checkers of chapter 12: the solution passes, every named mistake is reported by its code."""

import pytest
import torch
import torch.nn.functional as F

from attention_course import checks
from attention_course.checks import CheckFailed
from attention_course.gpt import GPT, GPTConfig
from attention_course.heads import merge_heads, split_heads
from attention_course.interpret import ablation_mask, induction_targets, path_ablated_forward, prefix_matching_score


def code_of(check, fn):
    with pytest.raises(CheckFailed) as info:
        check(fn)
    return info.value.code


def score_with(targets_fn=induction_targets, reduce="sum", all_queries=False, use_mask=True):
    """A prefix-matching score with one knob turned to a known mistake."""

    def score(weights, ids, query_mask=None):
        targets = targets_fn(ids)
        on_target = (weights * targets[None, :, None]).sum(-1)
        if reduce == "mean":
            on_target = on_target / targets.sum(-1).clamp(min=1)[None, :, None]
        queries = torch.ones_like(ids, dtype=torch.bool) if all_queries else targets.any(-1)
        if query_mask is not None and use_mask:
            queries = queries & query_mask
        return on_target.transpose(2, 3)[:, queries].mean(1)

    return score


def earlier_occurrence(ids):
    targets = induction_targets(ids)
    earlier = torch.zeros_like(targets)
    earlier[..., :-1] = targets[..., 1:]
    return earlier


def including_self(ids):
    previous = torch.cat([torch.full_like(ids[:, :1], -1), ids[:, :-1]], 1)
    diagonal = torch.eye(ids.size(1), dtype=torch.bool) & (ids[:, :, None] == previous[:, None, :])
    return induction_targets(ids) | diagonal


def test_solution_passes(capsys):
    checks.check_prefix_matching_score(prefix_matching_score)
    assert "✓ prefix_matching_score: 4 random cases" in capsys.readouterr().out


@pytest.mark.parametrize(
    "fn, code",
    [
        (score_with(earlier_occurrence), "induction-off-by-one"),
        (score_with(all_queries=True), "induction-all-queries"),
        (score_with(reduce="mean"), "induction-mean-over-targets"),
        (score_with(including_self), "induction-includes-self"),
        (score_with(use_mask=False), "induction-ignores-query-mask"),
        (lambda weights, ids, query_mask=None: prefix_matching_score(weights, ids, query_mask).T, "wrong-shape"),
        (lambda weights, ids, query_mask=None: 1.01 * prefix_matching_score(weights, ids, query_mask),
         "wrong-output"),
        (lambda weights, ids, query_mask=None: None, "returned-none"),
    ],
)
def test_named_mistakes_of_the_score(fn, code):
    assert code_of(checks.check_prefix_matching_score, fn) == code


def test_shift_pattern_question(capsys):
    checks.check_choice("12.shift-pattern", "C")
    assert capsys.readouterr().out.strip()
    for letter, code in (("A", "predicted-reversal-pattern"), ("B", "predicted-identity-pattern"),
                         ("D", "predicted-uniform-pattern")):
        with pytest.raises(CheckFailed) as info:
            checks.check_choice("12.shift-pattern", letter)
        assert info.value.code == code


def test_query_path_question(capsys):
    """B is right; A (the key path's effect) and C (shared work) fail with their codes; D is not an option."""
    checks.check_choice("12.query-path", lambda: "B")
    assert "✓ 12.query-path: B is right" in capsys.readouterr().out
    for letter, code in (("A", "query-path-needs-previous-token"), ("C", "query-path-shares-work")):
        with pytest.raises(CheckFailed) as info:
            checks.check_choice("12.query-path", letter)
        assert info.value.code == code
    with pytest.raises(CheckFailed) as info:
        checks.check_choice("12.query-path", "D")
    assert info.value.code == "invalid-answer"


def test_key_path_solution_passes(capsys):
    checks.check_key_path_ablation(from_state(key_path_by_hook))
    assert "✓ key_path_by_hook: 3 models" in capsys.readouterr().out


# ----------------------------------------------------------------------------------------------------------
# The registry's tables (tests/test_checks_planted.py)
# ----------------------------------------------------------------------------------------------------------


def score_by_einsum(weights, ids, query_mask=None):
    """Another style: the targets from a comparison of shifted ids, the sum as an einsum, the mean by counting."""
    t = ids.size(1)
    targets = torch.zeros(ids.size(0), t, t, dtype=torch.bool)
    targets[:, :, 1:] = ids[:, None, :-1] == ids[:, :, None]  # key j follows an earlier copy of query t's token
    targets &= torch.ones(t, t, dtype=torch.bool).tril(-1)  # 0 < j < t
    on_target = torch.einsum("lbhqk,bqk->lbhq", weights, targets.to(weights.dtype))
    queries = targets.any(-1) if query_mask is None else targets.any(-1) & query_mask
    return (on_target * queries[None, :, None]).sum((1, 3)) / queries.sum()


def from_state(fn):
    """fn(model, ids, heads) as the check calls it: fn(state, config, ids, heads)."""

    def run(state, config, ids, heads):
        model = GPT(GPTConfig(**config))
        model.load_state_dict(state)
        return fn(model.eval(), ids, heads)

    run.__name__ = fn.__name__
    return run


def key_path_by_hook(model, ids, heads):
    """The library's way, written out: the stream without the heads, through norm1, replaces w_k's input."""
    return path_ablated_forward(model, ids, heads, "k")[0]


def key_path_by_hand(model, ids, heads):
    """Another style: no hooks; layer 1 run twice by calling its block, layer 2's attention computed by hand with
    SDPA from the whole stream's queries and values and the ablated stream's keys."""
    block0, block1 = model.blocks
    with torch.no_grad():
        x = model.tok_emb(ids) + model.pos_emb(torch.arange(ids.size(1)))
        keep = torch.ones(model.num_heads)
        keep[[h for _, h in heads]] = 0.0
        whole, ablated = block0(x), block0(x, head_mask=keep)
        attn = block1.attn
        q = split_heads(attn.w_q(block1.norm1(whole)), model.num_heads)
        k = split_heads(attn.w_k(block1.norm1(ablated)), model.num_heads)
        v = split_heads(attn.w_v(block1.norm1(whole)), model.num_heads)
        out = whole + attn.w_o(merge_heads(F.scaled_dot_product_attention(q, k, v, is_causal=True)))
        return model.head(model.norm(out))


def key_path_on_values(model, ids, heads):
    return path_ablated_forward(model, ids, heads, "v")[0]


def key_path_on_queries(model, ids, heads):
    return path_ablated_forward(model, ids, heads, "q")[0]


def key_path_everywhere(model, ids, heads):
    with torch.no_grad():
        return model(ids, head_mask=ablation_mask(2, model.num_heads, *heads))


def key_path_without_norm(model, ids, heads):
    """Feeds the ablated stream straight to w_k."""
    seen = {}
    hook = model.blocks[1].register_forward_pre_hook(lambda m, args: seen.update(x=args[0]))
    with torch.no_grad():
        model(ids, head_mask=ablation_mask(2, model.num_heads, *heads))
        hook.remove()
        swap = model.blocks[1].attn.w_k.register_forward_pre_hook(lambda m, args: (seen["x"],))
        logits = model(ids)
        swap.remove()
    return logits


def key_path_hook_removed_too_early(model, ids, heads):
    """Registers the replacement, removes it, then runs the model: nothing is ablated."""
    logits = path_ablated_forward(model, ids, heads, "k")[0]  # computed, then thrown away
    with torch.no_grad():
        return model(ids) + 0 * logits


CORRECT = [
    (checks.check_prefix_matching_score, prefix_matching_score),
    (checks.check_prefix_matching_score, score_by_einsum),
    (checks.check_key_path_ablation, from_state(key_path_by_hook)),
    (checks.check_key_path_ablation, from_state(key_path_by_hand)),
]
PLANTED = [
    (checks.check_prefix_matching_score, score_with(earlier_occurrence), "induction-off-by-one"),
    (checks.check_prefix_matching_score, score_with(all_queries=True), "induction-all-queries"),
    (checks.check_prefix_matching_score, score_with(reduce="mean"), "induction-mean-over-targets"),
    (checks.check_prefix_matching_score, score_with(including_self), "induction-includes-self"),
    (checks.check_prefix_matching_score, score_with(use_mask=False), "induction-ignores-query-mask"),
    (checks.check_prefix_matching_score,
     lambda weights, ids, query_mask=None: prefix_matching_score(weights, ids, query_mask).T, "wrong-shape"),
    (checks.check_key_path_ablation, from_state(key_path_everywhere), "ablation-every-path"),
    (checks.check_key_path_ablation, from_state(key_path_on_queries), "ablation-query-path"),
    (checks.check_key_path_ablation, from_state(key_path_on_values), "ablation-value-path"),
    (checks.check_key_path_ablation, from_state(key_path_without_norm), "key-path-skips-layernorm"),
    (checks.check_key_path_ablation, from_state(key_path_hook_removed_too_early), "ablation-not-applied"),
    (checks.check_key_path_ablation, from_state(lambda model, ids, heads: key_path_by_hook(model, ids, heads)[:, :-1]),
     "wrong-shape"),
    (checks.check_key_path_ablation, from_state(lambda model, ids, heads: 1.01 * key_path_by_hook(model, ids, heads)),
     "wrong-output"),
]
