"""Capstone 2's checks: right answers pass; each planted wrong one is diagnosed with its code. The attention on
random weights (float64 reference), the whole model on SmolLM2's real weights against Hugging Face's."""

import functools

import torch
from torch import nn
from torch.nn import functional as F

from attention_course import checks
from attention_course.checks import capstone_model
from attention_course.decoder import Decoder


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def rope(x, positions, base, neighbours=False):
    """x (B, H, T, Dh) rotated at positions (T,): halves (Llama), or neighbours (the planted mistake)."""
    dh = x.shape[-1]
    angles = positions[:, None].float() / base ** (torch.arange(0, dh, 2).float() / dh)  # (T, Dh/2)
    if neighbours:
        cos, sin = angles.cos().repeat_interleave(2, -1), angles.sin().repeat_interleave(2, -1)
        turned = torch.stack([-x[..., 1::2], x[..., 0::2]], -1).flatten(-2)
        return x * cos + turned * sin
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    return x * cos + rotate_half(x) * sin


class Attention(nn.Module):
    """Grouped-query RoPE attention with a cache; ``bug`` plants one mistake."""

    bug = None

    def __init__(self, d_model, num_heads, num_kv_heads, rope_base):
        super().__init__()
        self.h, self.hkv, self.dh, self.base = num_heads, num_kv_heads, d_model // num_heads, rope_base
        self.q_proj = nn.Linear(d_model, num_heads * self.dh, bias=False)
        self.k_proj = nn.Linear(d_model, num_kv_heads * self.dh, bias=False)
        self.v_proj = nn.Linear(d_model, num_kv_heads * self.dh, bias=False)
        self.o_proj = nn.Linear(num_heads * self.dh, d_model, bias=False)

    def forward(self, x, cache=None):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.h, self.dh).transpose(1, 2)  # (B, H, T, Dh)
        k = self.k_proj(x).view(b, t, self.hkv, self.dh).transpose(1, 2)  # (B, Hkv, T, Dh)
        v = self.v_proj(x).view(b, t, self.hkv, self.dh).transpose(1, 2)
        past = 0 if cache is None or self.bug == "restart" else cache[0].shape[2]
        past += 1 if self.bug == "plus-one" and past else 0
        positions = torch.arange(past, past + t)
        base = 10000.0 if self.bug == "base" else self.base
        q, k = (rope(a, positions, base, self.bug == "neighbours") for a in (q, k))
        if cache is not None:
            k, v = torch.cat([cache[0], k], 2), torch.cat([cache[1], v], 2)
        n_rep = self.h // self.hkv
        if self.bug == "tiled":
            keys, values = k.repeat(1, n_rep, 1, 1), v.repeat(1, n_rep, 1, 1)
        else:
            keys, values = k.repeat_interleave(n_rep, 1), v.repeat_interleave(n_rep, 1)
        allowed = torch.ones(t, keys.shape[2], dtype=torch.bool).tril(keys.shape[2] - t)  # bottom-right causal
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=allowed)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1)), (k, v)


def planted(bug):
    return type(f"Attention_{bug.replace('-', '_')}", (Attention,), {"bug": bug})


def _hf():
    return capstone_model.reference_model()[1]


@functools.cache
def _course_model():
    """The course's Decoder (chapter 14) on the same weights, built once."""
    return Decoder.from_hf(_hf())


def course_logits(ids):
    """The course's Decoder on the same weights: another style of a right answer."""
    return _course_model()(ids)


def hf_variant_logits(kind):
    def logits(ids):
        with capstone_model._variant(kind), torch.no_grad():
            return _hf()(ids).logits
    return logits


def shifted_logits(ids):
    with torch.no_grad():
        out = _hf()(ids).logits
    out[0, -1] += 0.05  # one position off: no known mistake
    return out


@torch.no_grad()
def hf_generate(ids, max_new_tokens, bug=None):
    """Greedy decoding with Hugging Face's model and its own cache; ``bug`` plants one mistake."""
    model, past, fed, new, rows = _hf(), None, ids, [], []
    for step in range(max_new_tokens):
        if step:
            fed = {"recompute": torch.cat([ids, torch.cat(new, 1)], 1), "drop-cache": new[-1]}.get(bug, new[-1])
            past = None if bug in ("recompute", "drop-cache") else past
        out = model(fed, cache=past, use_cache=True)
        past = out.cache
        rows.append(out.logits[:, -1])
        token = rows[-1].topk(2).indices[:, 1:] if bug == "second-best" else rows[-1].argmax(-1, keepdim=True)
        new.append(token)
    logits = torch.stack(rows, 1)
    if bug == "logits-of-the-prompt":
        logits = logits + 0.05
    return torch.cat(new, 1), logits


@torch.no_grad()
def course_generate(ids, max_new_tokens):
    """The course's Decoder (chapter 14) through the course's KVCache: another style of a right answer."""
    from attention_course.kv_cache import KVCache

    model = _course_model()
    cache, fed, new, rows = KVCache(model.num_layers), ids, [], []
    for _ in range(max_new_tokens):
        rows.append(model(fed, cache=cache)[:, -1])
        fed = rows[-1].argmax(-1, keepdim=True)
        new.append(fed)
    return torch.cat(new, 1), torch.stack(rows, 1)


def generate_with(bug):
    return lambda ids, max_new_tokens: hf_generate(ids, max_new_tokens, bug)


def _accepted(draft, best):
    """How many draft tokens equal the model's choices (best[i]: its choice after draft token i - 1)."""
    kept = 0
    while kept < len(draft) and draft[kept] == best[kept]:
        kept += 1
    return kept


@torch.no_grad()
def hf_speculate(ids, max_new_tokens, k, bug=None):
    """Prompt-lookup decoding on Hugging Face's model, its DynamicCache cropped; ``bug`` plants one mistake."""
    from transformers import DynamicCache

    model, cache = _hf(), DynamicCache(config=_hf().config)
    logits = model(ids, cache=cache, use_cache=True).logits  # the prompt, once
    seq, rows = ids[0].tolist(), [logits[0, -1]]
    seq.append(int(rows[-1].argmax()))
    while len(rows) < max_new_tokens:
        want = 0 if bug == "no-draft" else min(k, max_new_tokens - len(rows) - 1)
        draft = capstone_model.lookup_draft(seq, want)
        if bug == "recompute":  # the whole sequence again, without the cache
            cache = DynamicCache(config=model.config)
            logits = model(torch.tensor([seq + draft]), cache=cache, use_cache=True).logits[:, len(seq) - 1:]
        else:
            logits = model(torch.tensor([seq[-1:] + draft]), cache=cache, use_cache=True).logits  # (1, 1 + d, V)
        best = logits[0].argmax(-1).tolist()
        kept = _accepted(draft, best)
        if bug == "unverified":
            seq, kept = seq + draft + [best[len(draft)]], len(draft)
        elif bug == "off-by-one" and kept < len(draft):
            seq = seq + draft[: kept + 1]
        else:
            seq = seq + draft[:kept] + [best[kept]]
        rows += list(logits[0, : kept + 1])
        if bug != "no-crop":
            cache.crop(len(seq) - 1 - cache.get_seq_length())  # all but the newest token
    return torch.tensor([seq[len(seq) - len(rows):]])[:, :max_new_tokens], torch.stack(rows[:max_new_tokens])[None]


@torch.no_grad()
def course_speculate(ids, max_new_tokens, k):
    """The course's Decoder through the course's KVCache, cropped to the kept tokens: another right style (a draft
    always k long, the extra tokens cut at the end)."""
    from attention_course.kv_cache import KVCache

    model = _course_model()
    cache, seq, new_rows = KVCache(model.num_layers), ids[0].tolist(), []
    logits = model(ids, cache=cache)
    new_rows.append(logits[0, -1])
    seq.append(int(new_rows[-1].argmax()))
    while len(new_rows) < max_new_tokens:
        draft = capstone_model.lookup_draft(seq, k)
        logits = model(torch.tensor([seq[-1:] + draft]), cache=cache)[0]  # (1 + d, V)
        kept = _accepted(draft, logits.argmax(-1).tolist())
        seq += draft[:kept] + [int(logits[kept].argmax())]
        new_rows += list(logits[: kept + 1])
        cache.crop(len(seq) - 1)
    start = len(seq) - len(new_rows)
    return torch.tensor([seq[start: start + max_new_tokens]]), torch.stack(new_rows[:max_new_tokens])[None]


def speculate_with(bug):
    return lambda ids, max_new_tokens, k: hf_speculate(ids, max_new_tokens, k, bug)



class Pool:
    """Block ids of a paged cache: ``bug`` "no-free" never reuses a block, "shared" hands one block out again and
    again."""

    def __init__(self, num_blocks, bug=None):
        self.free, self.next, self.bug = list(range(num_blocks)), num_blocks, bug

    def take(self):
        if self.bug == "no-free":
            self.next += 1
            return self.next - 1 - len(self.free)
        return self.free[-1] if self.bug == "shared" else self.free.pop()  # "shared": read, never taken off

    def give_back(self, table):
        if self.bug != "no-free":
            self.free += table[::-1]


def schedule(max_new_tokens, max_running, static=False):
    """Continuous batching, first come first served: yields each step's running requests (their list, which the
    caller's loop retires from when each finishes)."""
    waiting, running = list(range(len(max_new_tokens))), []
    while waiting or running:
        if not static or not running:
            while waiting and len(running) < max_running + (1 if static == "one-more" else 0):
                running.append(waiting.pop(0))
        yield running


@torch.no_grad()
def hf_serve(prompts, max_new_tokens, max_running, block_size, num_blocks, bug=None):
    """Round-robin over Hugging Face's model, one DynamicCache per request, the block tables kept as bookkeeping;
    ``bug`` plants one mistake."""
    from transformers import DynamicCache

    model, pool = _hf(), Pool(num_blocks, bug)
    new, caches, tables, steps = [[] for _ in prompts], {}, {}, []
    static = {"static": True, "too-many": "one-more"}.get(bug, False)
    for running in schedule(max_new_tokens, max_running, static):
        step = []
        for r in list(running):
            if r not in caches or bug == "recompute":  # "recompute": the whole sequence again, a fresh cache
                caches[r], tables[r], fed = DynamicCache(config=model.config), tables.get(r, []), prompts[r] + new[r]
            else:
                fed = new[r][-1:]
            logits = model(torch.tensor([fed]), cache=caches[r], use_cache=True).logits[0, -1]
            new[r].append(int(logits.topk(2).indices[1] if bug == "second-best" and r == 1 else logits.argmax()))
            held = len(prompts[r]) + max_new_tokens[r] - 1 if bug == "reserve" else caches[r].get_seq_length()
            want = -(-held // block_size)  # "reserve": for its longest length up front
            while len(tables[r]) < want:
                tables[r].append(pool.take())
            step.append((r, list(tables[r])))
            if len(new[r]) == max_new_tokens[r]:
                running.remove(r)
                pool.give_back(tables[r])
        steps.append(step)
    return new, steps


@torch.no_grad()
def course_serve(prompts, max_new_tokens, max_running, block_size, num_blocks):
    """The course's Decoder with its keys and values really in blocks: a pool (L, num_blocks, H_kv, block_size, Dh),
    gathered into a KVCache for each request's pass and the new positions written back."""
    from attention_course.kv_cache import KVCache

    model = _course_model()
    cfg = _hf().config
    dh = cfg.hidden_size // cfg.num_attention_heads
    shape = (model.num_layers, num_blocks, cfg.num_key_value_heads, block_size, dh)
    keys, values, pool = torch.zeros(shape), torch.zeros(shape), Pool(num_blocks)
    new, lengths, tables, steps = [[] for _ in prompts], {}, {}, []
    for running in schedule(max_new_tokens, max_running):
        step = []
        for r in list(running):
            fed = new[r][-1:] if r in tables else prompts[r]
            past, tables[r] = lengths.get(r, 0), tables.get(r, [])
            cache = KVCache(model.num_layers)
            if past:
                for layer in range(model.num_layers):  # (1, H_kv, past, Dh) from the table's blocks
                    cache.keys[layer], cache.values[layer] = (
                        a[layer, tables[r]].transpose(0, 1).flatten(1, 2)[None, :, :past] for a in (keys, values))
                cache.lengths = [past] * model.num_layers
            new[r].append(int(model(torch.tensor([fed]), cache=cache)[0, -1].argmax()))
            lengths[r] = past + len(fed)
            while len(tables[r]) * block_size < lengths[r]:
                tables[r].append(pool.take())
            for pos in range(past, lengths[r]):
                block, slot = tables[r][pos // block_size], pos % block_size
                for layer in range(model.num_layers):
                    keys[layer, block, :, slot] = cache.keys[layer][0, :, pos]
                    values[layer, block, :, slot] = cache.values[layer][0, :, pos]
            step.append((r, list(tables[r])))
            if len(new[r]) == max_new_tokens[r]:
                running.remove(r)
                pool.give_back(tables[r])
        steps.append(step)
    return new, steps


def serve_with(bug):
    return lambda prompts, max_new_tokens, max_running, block_size, num_blocks: hf_serve(
        prompts, max_new_tokens, max_running, block_size, num_blocks, bug)

CORRECT = [
    (checks.check_llama_attention, Attention),
    (checks.check_smollm2_logits, course_logits),
    (checks.check_greedy_decoding, hf_generate),
    (checks.check_greedy_decoding, course_generate),
    (checks.check_prompt_lookup, hf_speculate),
    (checks.check_prompt_lookup, course_speculate),
    (checks.check_serving, hf_serve),
    (checks.check_serving, course_serve),
]
PLANTED = [
    (checks.check_llama_attention, planted("neighbours"), "rope-wrong-pairing"),
    (checks.check_llama_attention, planted("tiled"), "kv-heads-tiled"),
    (checks.check_llama_attention, planted("restart"), "rope-position-not-offset"),
    (checks.check_llama_attention, planted("plus-one"), "cache-position-off-by-one"),
    (checks.check_llama_attention, planted("base"), "rope-base-default"),
    (checks.check_smollm2_logits, hf_variant_logits("no-final-norm"), "model-final-norm-missing"),
    (checks.check_smollm2_logits, hf_variant_logits("base"), "rope-base-default"),
    (checks.check_smollm2_logits, shifted_logits, "logits-differ-from-hf"),
    (checks.check_greedy_decoding, generate_with("recompute"), "decode-recomputes-prefix"),
    (checks.check_greedy_decoding, generate_with("drop-cache"), "decode-cache-dropped"),
    (checks.check_greedy_decoding, generate_with("second-best"), "wrong-output"),
    (checks.check_greedy_decoding, generate_with("logits-of-the-prompt"), "logits-differ-from-hf"),
    (checks.check_prompt_lookup, speculate_with("unverified"), "lookup-draft-unverified"),
    (checks.check_prompt_lookup, speculate_with("off-by-one"), "lookup-keeps-mismatch"),
    (checks.check_prompt_lookup, speculate_with("no-crop"), "lookup-cache-not-cropped"),
    (checks.check_prompt_lookup, speculate_with("no-draft"), "lookup-too-many-passes"),
    (checks.check_prompt_lookup, speculate_with("recompute"), "decode-recomputes-prefix"),
    (checks.check_serving, serve_with("too-many"), "serve-too-many-running"),
    (checks.check_serving, serve_with("static"), "serve-static-batching"),
    (checks.check_serving, serve_with("reserve"), "serve-blocks-reserved"),
    (checks.check_serving, serve_with("shared"), "serve-blocks-shared"),
    (checks.check_serving, serve_with("no-free"), "serve-blocks-not-freed"),
    (checks.check_serving, serve_with("second-best"), "serve-tokens-differ"),
    (checks.check_serving, serve_with("recompute"), "decode-recomputes-prefix"),
]


def test_the_reference_model_is_restored_after_a_variant():
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        before = _hf()(ids).logits
        hf_variant_logits("base")(ids)
        hf_variant_logits("no-final-norm")(ids)
        assert torch.equal(_hf()(ids).logits, before)


def test_lookup_draft_copies_what_followed_the_latest_occurrence():
    assert capstone_model.lookup_draft([1, 2, 3, 1, 2, 4, 5, 1, 2], 3) == [4, 5, 1]  # the latest, not the first
    assert capstone_model.lookup_draft([1, 2, 3, 1, 2], 9) == [3, 1, 2]  # up to the end
    assert capstone_model.lookup_draft([7, 1, 2, 3], 2) == []  # never seen before
    assert capstone_model.lookup_draft([5, 5, 5], 2) == [5]  # overlapping occurrence


def test_lookup_passes_replays_the_drafts():
    # prompt [1, 2, 3, 1], first new token 2 from the prompt's pass; draft [3, 1] (k = 2): 3 kept, then 9 chosen;
    # draft after (3, 9): none, one token; the last token needs no draft
    assert capstone_model.lookup_passes([1, 2, 3, 1, 2, 3, 9, 8, 7], 4, 2) == [4, 3, 1, 1]


def test_the_lookup_prompt_takes_at_most_half_the_passes():
    """On the fixed prompt, greedy decoding by prompt lookup needs at most half as many passes as new tokens after the
    prompt's pass, with a draft rejected on the way (without one, the planted mistakes would go unseen)."""
    ids = capstone_model.reference_model()[0](capstone_model.LOOKUP_PROMPT)["input_ids"]
    steps, k = capstone_model.LOOKUP_STEPS, capstone_model.LOOKUP_K
    new, _ = hf_speculate(torch.tensor([ids]), steps, k)
    passes = capstone_model.lookup_passes(ids + new[0].tolist(), len(ids), k)
    assert 3 <= len(passes) - 1 <= steps // 2 and sum(passes[1:]) > steps - 1, passes


def test_hidden_lookup_prompts_repeat_their_last_two_tokens():
    from attention_course.checks import hidden

    assert hidden.capstone2_lookup_prompts(49152) == []
    with hidden.drawn_from(3):
        (prompt,) = hidden.capstone2_lookup_prompts(49152)
    assert 17 <= len(prompt) <= 27 and capstone_model.lookup_draft(prompt, 4)


def test_serving_schedule_refills_a_freed_slot_at_the_next_step():
    assert capstone_model.serving_schedule([4, 2, 5, 3], 2) == [[0, 1], [0, 1], [0, 2], [0, 2], [2, 3], [2, 3], [2, 3]]
    assert capstone_model.serving_schedule([4, 2, 5, 3], 2, static=True)[4] == [2, 3]  # steps 3, 4: request 0 alone
    # prompts of 5 and 3 tokens, blocks of 2: step 2 holds 6 + 4 tokens in 3 + 2 blocks
    assert capstone_model.serving_pool_size([[1] * 5, [1] * 3], [3, 2], 2, 2) == 5


def test_hidden_serving_workloads_tell_the_mistakes_apart():
    """Every hidden workload (8 draws) differs under static batching, and a pool that never frees needs more blocks
    than the check's pool holds: the planted mistakes stay visible on them."""
    from attention_course.checks import hidden

    assert hidden.capstone2_serving_workloads(49152) == []
    for seed in range(8):
        with hidden.drawn_from(seed):
            ((prompts, new, running, size),) = hidden.capstone2_serving_workloads(49152)
        assert len(prompts) == 4 and sorted(new) == [2, 3, 4, 5] and running in (2, 3)
        static = capstone_model.serving_schedule(new, running, static=True)
        assert static != capstone_model.serving_schedule(new, running)
        never_freed = sum(-(-(len(p) + n - 1) // size) for p, n in zip(prompts, new, strict=True))
        assert never_freed > capstone_model.serving_pool_size(prompts, new, running, size)


def test_serving_passes_on_a_hidden_workload():
    from attention_course.checks import hidden

    with hidden.drawn_from(5):
        checks.check_serving(course_serve)
