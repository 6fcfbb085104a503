"""The capstone's check: a right module passes; each deliberately wrong one is diagnosed with its code."""

import copy
import functools
import math

import numpy as np
import pytest
import torch
from torch import nn

from attention_course import causal_mask, checks, merge_heads, scaled_dot_product_attention, split_heads
from attention_course.checks import hidden
from attention_course.checks.questions import QUESTIONS
from attention_course.distributed.launch import launch
from attention_course.positions import apply_rope
from attention_course.tasks import repeated_segment_batch
from attention_course.training import tagging_loss, train


def make_module(position="ok", rerotate=False, rotate_values=False, pairing="interleaved", mask="bottom-right",
                rope=True, cache_unrotated=False, cache_plain_keys=False):
    """A RoPE + KV-cache attention module, right by default, with one planted mistake on request."""

    class Module(nn.Module):
        def __init__(self, d_model, num_heads):
            super().__init__()
            self.num_heads = num_heads
            self.w_q, self.w_k, self.w_v, self.w_o = (nn.Linear(d_model, d_model) for _ in range(4))

        def rot(self, x, positions):
            return apply_rope(x, positions, pairing=pairing) if rope else x

        def forward(self, x, cache=None):
            past = 0 if cache is None else cache[0].shape[2]
            t = x.shape[1]
            positions = torch.arange(t) if position == "restart" else torch.arange(past, past + t)
            q, k, v = (split_heads(w(x), self.num_heads) for w in (self.w_q, self.w_k, self.w_v))
            if cache_plain_keys:  # the cache holds plain keys: all of them rotated again at every call
                k_plain = k if cache is None else torch.cat([cache[0], k], dim=2)
                q, k_all = self.rot(q, positions), self.rot(k_plain, torch.arange(past + t))
                v_all = v if cache is None else torch.cat([cache[1], v], dim=2)
                weights = torch.softmax((q @ k_all.transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill(
                    torch.arange(past + t)[None, :] > torch.arange(past, past + t)[:, None], float("-inf")), -1)
                return self.w_o(merge_heads(weights @ v_all)), (k_plain, v_all)
            q, k = self.rot(q, positions), self.rot(k, positions)
            if rotate_values:
                v = self.rot(v, positions)
            if cache is not None:
                old_k = self.rot(cache[0], torch.arange(past)) if rerotate else cache[0]
                k_all, v_all = torch.cat([old_k, k], dim=2), torch.cat([cache[1], v], dim=2)
                stored_k = torch.cat([cache[0], k], dim=2)
            else:
                k_all, v_all, stored_k = k, v, k
            i, j = torch.arange(t)[:, None], torch.arange(past + t)[None, :]
            allowed = {"bottom-right": j <= i + past, "top-left": j <= i, "none": j >= 0}[mask]
            scores = q @ k_all.transpose(-2, -1) / math.sqrt(q.shape[-1])
            weights = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
            out = self.w_o(merge_heads(weights @ v_all))
            if cache_unrotated:
                stored_k = stored_k + 1.0
            return out, (stored_k, v_all)

    return Module


def test_right_module_passes(capsys):
    checks.check_rope_cached_attention(make_module())
    assert capsys.readouterr().out.startswith("✓ Module: 4 sequences fed in chunks")


@pytest.mark.parametrize("seed", [0, 3])
def test_the_grader_adds_a_hidden_sequence(seed, capsys):
    """At grading time: a fifth sequence of random width, heads and chunks, in a batch of 5; mistakes still named."""
    with hidden.drawn_from(seed):
        checks.check_rope_cached_attention(make_module())
        assert capsys.readouterr().out.startswith("✓ Module: 5 sequences fed in chunks")
        with pytest.raises(checks.CheckFailed, match=r"^\[rope-position-not-offset\]"):
            checks.check_rope_cached_attention(make_module(position="restart"))


@pytest.mark.parametrize("kwargs, code", [
    ({"position": "restart"}, "rope-position-not-offset"),
    ({"rerotate": True}, "rope-cache-rotated-twice"),
    ({"rotate_values": True}, "rope-rotates-values"),
    ({"pairing": "halves"}, "rope-wrong-pairing"),
    ({"mask": "top-left"}, "causal-top-left-aligned"),
    ({"mask": "none"}, "mask-ignored"),
    ({"rope": False}, "rope-not-applied"),
    ({"cache_unrotated": True}, "wrong-output"),
    ({"cache_plain_keys": True}, "cache-keys-unrotated"),
])
def test_each_mistake_is_named(kwargs, code):
    with pytest.raises(checks.CheckFailed) as info:
        checks.check_rope_cached_attention(make_module(**kwargs))
    assert str(info.value).startswith(f"[{code}]"), str(info.value)


def test_missing_layer_and_wrong_return():
    class NoLayers(nn.Module):
        def __init__(self, d_model, num_heads):
            super().__init__()

    with pytest.raises(checks.CheckFailed, match=r"^\[missing-attribute\] Your module needs w_q"):
        checks.check_rope_cached_attention(NoLayers)

    class NoCache(make_module()):
        def forward(self, x, cache=None):
            return super().forward(x, cache)[0]

    with pytest.raises(checks.CheckFailed, match=r"^\[wrong-type\] Your forward must return"):
        checks.check_rope_cached_attention(NoCache)


# ----------------------------------------------------------------------------------------------------------
# The registry's tables (tests/test_checks_planted.py)
# ----------------------------------------------------------------------------------------------------------


class FusedCachedAttention(nn.Module):
    """Another style: heads by view/transpose, RoPE as complex numbers, the fused kernel with a boolean mask."""

    def __init__(self, d_model, num_heads):
        super().__init__()
        self.h = num_heads
        self.w_q, self.w_k, self.w_v, self.w_o = (nn.Linear(d_model, d_model) for _ in range(4))

    def rotate(self, x, start):
        dh = x.shape[-1]
        theta = 10000.0 ** (-torch.arange(0, dh, 2, dtype=torch.float64) / dh)
        angles = torch.arange(start, start + x.shape[-2], dtype=torch.float64)[:, None] * theta
        z = torch.view_as_complex(x.double().reshape(*x.shape[:-1], dh // 2, 2).contiguous())
        return torch.view_as_real(z * torch.polar(torch.ones_like(angles), angles)).flatten(-2).to(x.dtype)

    def forward(self, x, cache=None):
        b, t, d = x.shape
        past = 0 if cache is None else cache[0].shape[2]
        q, k, v = (w(x).view(b, t, self.h, d // self.h).transpose(1, 2) for w in (self.w_q, self.w_k, self.w_v))
        q, k = self.rotate(q, past), self.rotate(k, past)
        if cache is not None:
            k, v = torch.cat([cache[0], k], 2), torch.cat([cache[1], v], 2)
        allowed = torch.arange(past + t)[None, :] <= torch.arange(past, past + t)[:, None]
        heads = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
        return self.w_o(heads.transpose(1, 2).reshape(b, t, d)), (k, v)


class NoCacheReturned(make_module()):
    def forward(self, x, cache=None):
        return super().forward(x, cache)[0]


class NoLinears(nn.Module):
    def __init__(self, d_model, num_heads):
        super().__init__()


class CacheInModule(make_module()):
    """Keeps its cache in the module (reset when called without one): right for one sequence at a time."""

    def forward(self, x, cache=None):
        if cache is None:
            self.kv = None
        out, self.kv = super().forward(x, self.kv)
        return out, self.kv


class ReturnsLists(make_module()):
    """Right, returning lists where the prompt shows tuples."""

    def forward(self, x, cache=None):
        out, (k, v) = super().forward(x, None if cache is None else tuple(cache))
        return [out, [k, v]]


rope_cached = checks.check_rope_cached_attention
CORRECT = [(rope_cached, make_module()), (rope_cached, FusedCachedAttention), (rope_cached, ReturnsLists)]
PLANTED = [
    (rope_cached, make_module(position="restart"), "rope-position-not-offset"),
    (rope_cached, make_module(rerotate=True), "rope-cache-rotated-twice"),
    (rope_cached, make_module(rotate_values=True), "rope-rotates-values"),
    (rope_cached, make_module(pairing="halves"), "rope-wrong-pairing"),
    (rope_cached, make_module(mask="top-left"), "causal-top-left-aligned"),
    (rope_cached, make_module(mask="none"), "mask-ignored"),
    (rope_cached, make_module(rope=False), "rope-not-applied"),
    (rope_cached, make_module(cache_plain_keys=True), "cache-keys-unrotated"),
    (rope_cached, NoCacheReturned, "wrong-type"),
    (rope_cached, NoLinears, "missing-attribute"),
    (rope_cached, CacheInModule, "cache-kept-in-module"),
]


# ----------------------------------------------------------------------------------------------------------
# The block, the TinyGPT and its generation, training, the induction score
# ----------------------------------------------------------------------------------------------------------

Attention = make_module()


def make_block(order="pre", residual_attn=True, residual_mlp=True, activation=True, norm_stream=False,
               named=False, dropout=False, attention=None):
    """The pre-LN block (an nn.Sequential MLP, with a Dropout before its last layer if ``dropout``; ``named``:
    linear1/linear2 and F.gelu; ``attention``: another attention class), or one planted mistake."""
    attention = attention or Attention

    class Block(nn.Module):
        def __init__(self, d_model, num_heads, d_ff):
            super().__init__()
            self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
            self.attn = attention(d_model, num_heads)
            if named:
                self.mlp = nn.Module()
                self.mlp.linear1, self.mlp.linear2 = nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model)
            else:
                self.mlp = nn.Sequential(nn.Linear(d_model, d_ff), nn.GELU() if activation else nn.Identity(),
                                         *([nn.Dropout(0.1)] if dropout else []), nn.Linear(d_ff, d_model))

        def ffn(self, x):
            if named:
                return self.mlp.linear2(nn.functional.gelu(self.mlp.linear1(x)))
            return self.mlp(x)

        def forward(self, x, cache=None):
            if order == "post":
                a, cache = self.attn(x, cache)
                x = self.norm1(x + a)
                return self.norm2(x + self.ffn(x)), cache
            if norm_stream:
                x = self.norm1(x)
                a, cache = self.attn(x, cache)
                x = self.norm2(x + a)
                return x + self.ffn(x), cache
            a, cache = self.attn(self.norm1(x), cache)
            x = x + a if residual_attn else a
            h = self.ffn(self.norm2(x))
            return (x + h if residual_mlp else h), cache

    return Block


def make_gpt(block=None, final_norm=True):
    block = block or make_block()

    class TinyGPT(nn.Module):
        def __init__(self, vocab_size, d_model, num_heads, num_layers, d_ff):
            super().__init__()
            self.tok_emb = nn.Embedding(vocab_size, d_model)
            self.blocks = nn.ModuleList(block(d_model, num_heads, d_ff) for _ in range(num_layers))
            self.norm = nn.LayerNorm(d_model)
            self.head = nn.Linear(d_model, vocab_size, bias=False)

        def forward(self, ids, caches=None):
            x, new = self.tok_emb(ids), []
            for i, b in enumerate(self.blocks):
                x, c = b(x, None if caches is None else caches[i])
                new.append(c)
            return self.head(self.norm(x) if final_norm else x), new

    return TinyGPT


TinyGPT = make_gpt()


def make_generate(variant="ok"):
    def generate(model, ids, max_new_tokens, use_cache=True):
        caches, step, out = None, ids, []
        for _ in range(max_new_tokens):
            if not use_cache:
                logits = model(ids)[0][:, :1] if variant == "first-position" else model(ids)[0]
            elif variant == "no-cache-passed":
                logits, _ = model(step)
            elif variant == "whole-sequence":
                logits, caches = model(ids, caches)
            else:
                logits, caches = model(step, caches)
            nxt = logits[:, -1].argmax(-1, keepdim=True)
            ids, step = torch.cat([ids, nxt], 1), nxt
            out.append(logits[:, -1])
        return ids, torch.stack(out, 1)

    return generate


def generate_while(model, ids, max_new_tokens, use_cache=True):
    """Another style: a while loop, the prompt fed once, logits gathered in a preallocated tensor."""
    caches, new = None, ids
    rows = []
    while len(rows) < max_new_tokens:
        logits, fresh = model(new if use_cache else ids, caches if use_cache else None)
        caches = fresh if use_cache else None
        last = logits[:, -1, :]
        rows.append(last)
        new = last.argmax(dim=-1)[:, None]
        ids = torch.cat((ids, new), dim=-1)
    return ids, torch.stack(rows, dim=1)


def make_train(shift=True, steps=150, grad=True):
    def train_induction(model):
        def batch(g):
            return repeated_segment_batch(32, 16, 64, g, min_segment=8)

        def loss(m, b):
            ids = b[0]
            if not shift:
                return tagging_loss(m(ids)[0], ids)
            return tagging_loss(m(ids[:, :-1])[0], ids[:, 1:])

        if steps:
            with torch.enable_grad() if grad else torch.no_grad():
                train(model, batch, loss, steps=steps, lr=1e-2)
        return model

    return train_induction


_TRAINED = {}


def trained_once(model):
    """The right training, run once per test session (the score checks only need a trained model)."""
    if "model" not in _TRAINED:
        _TRAINED["model"] = make_train()(model)
    return copy.deepcopy(_TRAINED["model"])


def _attention_inputs(model, ids):
    """What each block's attention receives on ids (forward pre-hooks), one (B, T, D) tensor per block."""
    seen = []
    hooks = [b.attn.register_forward_pre_hook(lambda m, a: seen.append(a[0])) for b in model.blocks]
    try:
        model(ids)
    finally:
        for hook in hooks:
            hook.remove()
    return seen


def _previous_token_targets(ids, diagonal):
    """(B, T, T): key j is a target of query t when ids[j - 1] == ids[t] and j <= t + diagonal."""
    t = ids.size(1)
    previous = torch.cat([torch.full_like(ids[:, :1], -1), ids[:, :-1]], dim=1)
    return (ids[:, :, None] == previous[:, None, :]) & torch.ones(t, t, dtype=torch.bool).tril(diagonal)


def induction_scores(model, ids, copy_target, targets=None):
    """Attention weights recomputed from the inputs each block's attention receives, summed over each query's
    targets (by default the tokens after earlier occurrences of the query's token), averaged over the queries."""
    seen = _attention_inputs(model, ids)
    targets = _previous_token_targets(ids, -1) if targets is None else targets
    t = ids.size(1)
    queries = targets.any(-1) & copy_target
    rows = []
    for block, x in zip(model.blocks, seen, strict=True):
        a, pos = block.attn, torch.arange(t)
        q = apply_rope(split_heads(a.w_q(x), a.num_heads), pos)
        k = apply_rope(split_heads(a.w_k(x), a.num_heads), pos)
        _, w = scaled_dot_product_attention(q, k, k, causal_mask(t, t))  # (B, H, T, T)
        rows.append((w * targets[:, None]).sum(-1).transpose(1, 2)[queries].mean(0))
    return torch.stack(rows)


def score_variant(kind):
    """Planted scores: on the earlier occurrence of the token itself, over every query, or counting the query's own
    position."""
    def scores(model, ids, copy_target):
        if kind == "off-by-one":  # key j matches when ids[j] == ids[t]
            t = ids.size(1)
            same = (ids[:, :, None] == ids[:, None, :]) & torch.ones(t, t, dtype=torch.bool).tril(-1)
            return induction_scores(model, ids, copy_target, same)
        if kind == "no-mask":
            return induction_scores(model, ids, torch.ones_like(copy_target))
        return induction_scores(model, ids, copy_target, _previous_token_targets(ids, 0))

    return scores


block_check = checks.check_capstone_block
gen_check = checks.check_capstone_generation
train_check = functools.partial(checks.check_capstone_training, TinyGPT)


score_check = functools.partial(checks.check_capstone_induction_scores, TinyGPT, trained_once)

def scores_from_library(model, ids, copy_target):  # [scores-from-library]: the library's GPT and score
    from attention_course.checks.capstone import library_gpt, read_gpt
    from attention_course.interpret import attention_maps, prefix_matching_score

    return prefix_matching_score(attention_maps(library_gpt(read_gpt(model, 2), 2), ids), ids, copy_target)


def scores_with_library_score(model, ids, copy_target):  # [scores-from-library]: own weights, library's score
    from attention_course.interpret import prefix_matching_score

    seen, t = _attention_inputs(model, ids), ids.size(1)
    maps = []
    for block, x in zip(model.blocks, seen, strict=True):
        a, pos = block.attn, torch.arange(t)
        q = apply_rope(split_heads(a.w_q(x), a.num_heads), pos)
        k = apply_rope(split_heads(a.w_k(x), a.num_heads), pos)
        maps.append(scaled_dot_product_attention(q, k, k, causal_mask(t, t))[1])
    return prefix_matching_score(torch.stack(maps), ids, copy_target)


def train_oracle(model):  # [accuracy-not-from-weights]: no training, a forward that copies the first half itself
    forward = model.forward

    def copying_forward(ids, caches=None):
        logits, caches = forward(ids, caches)
        copied = torch.nn.functional.one_hot(ids[:, :ids.size(1) - 7], logits.size(-1)).to(logits.dtype)
        return torch.cat([logits[:, :7], 100.0 * copied], dim=1), caches

    model.forward = copying_forward
    return model

CORRECT += [
    (block_check, make_block()),
    (block_check, make_block(named=True)),
    (block_check, make_block(dropout=True)),
    (functools.partial(gen_check, generate=make_generate()), TinyGPT),
    (functools.partial(gen_check, generate=generate_while), make_gpt(make_block(named=True))),
    (train_check, make_train()),
    (score_check, induction_scores),
]
PLANTED += [
    (block_check, make_block(order="post"), "norm-wrong-place"),
    (block_check, make_block(residual_attn=False), "residual-missing"),
    (block_check, make_block(residual_mlp=False), "residual-missing"),
    (block_check, make_block(activation=False), "ffn-activation-missing"),
    (block_check, make_block(norm_stream=True), "norm-on-residual-stream"),
    (functools.partial(gen_check, generate=make_generate()), make_gpt(final_norm=False), "final-norm-missing"),
    (functools.partial(gen_check, generate=make_generate("first-position")), TinyGPT, "generate-wrong-position"),
    (functools.partial(gen_check, generate=make_generate("no-cache-passed")), TinyGPT, "cache-not-passed-back"),
    (functools.partial(gen_check, generate=make_generate("whole-sequence")), TinyGPT, "cache-fed-whole-sequence"),
    (train_check, make_train(steps=0), "induction-not-learned"),
    (train_check, make_train(shift=False), "targets-not-shifted"),
    (train_check, make_train(grad=False), "raised-exception"),
    (score_check, score_variant("off-by-one"), "induction-off-by-one"),
    (score_check, score_variant("self"), "induction-includes-self"),
    (score_check, score_variant("no-mask"), "induction-ignores-query-mask"),
    (train_check, train_oracle, "accuracy-not-from-weights"),
    (score_check, scores_from_library, "scores-from-library"),
    (score_check, scores_with_library_score, "scores-from-library"),
]


def test_block_with_the_attention_of_the_capstone_under_hidden_cases(capsys):
    with hidden.drawn_from(1):
        checks.check_capstone_block(make_block())
        checks.check_capstone_generation(TinyGPT, make_generate())
    out = capsys.readouterr().out
    assert "✓ Block: 4 sequences" in out and "✓ TinyGPT, generate: 4 models" in out


def test_the_induction_question_is_registered():
    assert QUESTIONS["capstone1.induction-layer"].answer == "B"


# ----------------------------------------------------------------------------------------------------------
# Challenge: the heads sharded over two real processes
# ----------------------------------------------------------------------------------------------------------


def make_shard_rank(variant="ok"):
    def shard_rank(rank, world_size, module, x):
        local, width = module.num_heads // world_size, module.w_o.in_features // world_size
        cols = slice(rank * width, (rank + 1) * width)
        pos = torch.arange(x.size(1))
        with torch.no_grad():
            q, k, v = (split_heads(nn.functional.linear(x, w.weight[cols], w.bias[cols]), local)
                       for w in (module.w_q, module.w_k, module.w_v))
            q, k = apply_rope(q, pos), apply_rope(k, pos)
            heads, _ = scaled_dot_product_attention(q, k, v, causal_mask(x.size(1), x.size(1)))
            merged = merge_heads(heads)  # (B, T, D / P)
            if variant == "reduced-heads":
                torch.distributed.all_reduce(merged)
            partial = merged @ module.w_o.weight[:, cols].T
            if variant == "bias-per-rank":
                partial = partial + module.w_o.bias
            if variant not in ("not-reduced", "reduced-heads"):
                torch.distributed.all_reduce(partial)
            return partial if variant == "bias-per-rank" else partial + module.w_o.bias

    return shard_rank


def make_sharded(variant="ok"):
    def sharded_attention(module, x, world_size):
        return torch.stack(launch(make_shard_rank(variant), world_size, module, x, start_method="fork"))

    return sharded_attention


def gathered_heads_rank(rank, world_size, module, x):
    """Another style: each rank runs a copy of the module whose w_o keeps only its heads' columns (the bias on
    rank 0 only), then all_gather and a sum."""
    width = module.w_o.in_features // world_size
    local = copy.deepcopy(module)
    with torch.no_grad():
        keep = torch.zeros(module.w_o.in_features, dtype=torch.bool)
        keep[rank * width:(rank + 1) * width] = True
        local.w_o.weight[:, ~keep] = 0.0
        if rank:
            local.w_o.bias.zero_()
        partial, _ = local(x)
        parts = [torch.empty_like(partial) for _ in range(world_size)]
        torch.distributed.all_gather(parts, partial)
    return sum(parts)


def gathered_sharded(module, x, world_size):  # [shard-not-split]: every rank runs the whole module
    return torch.stack(launch(gathered_heads_rank, world_size, module, x, start_method="fork"))


def computed_in_parent(module, x, world_size):  # [shard-not-split]: no rank does the work
    with torch.no_grad():
        out = module(x)[0]
    return torch.stack([out] * world_size)


def numpy_heads_rank(rank, world_size, module, x):
    """Each rank's heads computed in NumPy, out of the check's sight; only the all-reduce is PyTorch's."""
    local, width = module.num_heads // world_size, module.w_o.in_features // world_size
    cols = slice(rank * width, (rank + 1) * width)
    as_np = lambda w: w.detach().double().numpy()  # noqa: E731
    qkv = [x.double().numpy() @ as_np(w.weight[cols]).T + as_np(w.bias[cols])
           for w in (module.w_q, module.w_k, module.w_v)]
    b, t, _ = x.shape
    q, k, v = (torch.from_numpy(z.reshape(b, t, local, -1).transpose(0, 2, 1, 3).copy()) for z in qkv)
    pos = torch.arange(t)
    q, k = (apply_rope(z, pos).numpy() for z in (q, k))
    scores = q @ k.swapaxes(-1, -2) / np.sqrt(q.shape[-1]) + np.triu(np.full((t, t), -np.inf), 1)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    heads = (weights / weights.sum(-1, keepdims=True)) @ v.numpy()
    partial = torch.from_numpy(heads.transpose(0, 2, 1, 3).reshape(b, t, width) @ as_np(module.w_o.weight[:, cols]).T)
    torch.distributed.all_reduce(partial)
    return (partial + module.w_o.bias.detach().double()).float()


def numpy_sharded(module, x, world_size):  # [shard-not-seen]: the ranks' scores computed in NumPy
    return torch.stack(launch(numpy_heads_rank, world_size, module, x, start_method="fork"))


def gather_heads_rank(rank, world_size, module, x):
    """Another style: each rank computes its heads (einsum, the fused kernel), all_gather of the heads, then the
    whole output projection on every rank."""
    b, t, d = x.shape
    local, width = module.num_heads // world_size, d // world_size
    rows = slice(rank * width, (rank + 1) * width)
    pos = torch.arange(t)
    with torch.no_grad():
        q, k, v = (torch.einsum("btd,ed->bte", x, w.weight[rows]) + w.bias[rows]
                   for w in (module.w_q, module.w_k, module.w_v))
        q, k, v = (z.view(b, t, local, -1).transpose(1, 2) for z in (q, k, v))
        q, k = apply_rope(q, pos), apply_rope(k, pos)
        heads = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        mine = heads.transpose(1, 2).reshape(b, t, width)
        parts = [torch.empty_like(mine) for _ in range(world_size)]
        torch.distributed.all_gather(parts, mine)
        return module.w_o(torch.cat(parts, dim=-1))


def gather_sharded(module, x, world_size):
    return torch.stack(launch(gather_heads_rank, world_size, module, x, start_method="fork"))


shard_check = functools.partial(checks.check_capstone_sharding, Attention)
CORRECT += [(shard_check, make_sharded()), (shard_check, gather_sharded)]
PLANTED += [
    (shard_check, gathered_sharded, "shard-not-split"),
    (shard_check, computed_in_parent, "shard-not-split"),
    (shard_check, numpy_sharded, "shard-not-seen"),
    (shard_check, make_sharded("not-reduced"), "g-forward-not-reduced"),
    (shard_check, make_sharded("bias-per-rank"), "tp-bias-per-rank"),
    (shard_check, make_sharded("reduced-heads"), "allreduce-before-output-projection"),
]


def test_a_failure_with_a_cache_in_the_call_stays_short():
    """The call that failed is named by its shapes: a cache of tensors is not printed whole (it was 136 lines)."""
    class FailsWithCache(make_module()):
        def forward(self, x, cache=None):
            if cache is not None:
                raise RuntimeError("no cache yet")
            return super().forward(x, cache)

    with pytest.raises(checks.CheckFailed) as info:
        checks.check_rope_cached_attention(FailsWithCache)
    message = str(info.value)
    assert message.startswith("[raised-exception]") and message.count("\n") <= 3, message
    assert "cache=(shape (2, 4, 3, 6), shape (2, 4, 3, 6))" in message, message
