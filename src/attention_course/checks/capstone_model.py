"""Checks of capstone 2: SmolLM2 from the student's own parts and its real
weights, equal to Hugging Face.

:func:`check_llama_attention` feeds the student's grouped-query RoPE attention
a sequence in chunks, carrying its cache, and compares every output with
float64 NumPy over the whole sequence (RoPE on halves, base of the case,
key/value heads repeated in groups), then the final cache. The model checks
call the student's functions on token ids and compare what they return with
``transformers``' ``LlamaForCausalLM`` holding the same weights, loaded here
(:func:`attention_course.pretrained.load_smollm2`, once per process): in the
grader, in its trusted process; the student's notebook loads its own copy in
the sandbox.
"""

from __future__ import annotations

import functools
from contextlib import contextmanager

import numpy as np
import torch

from .. import numpy_ref
from . import hidden, observe
from .diagnosis import diagnose
from .positions import rope_variant
from .questions import choice_question
from .runner import (
    DEFAULT_TIMEOUT,
    as_array,
    call,
    close,
    display_name,
    fail,
    is_instance,
    run_check,
    shape_text,
)

ROPE_BASE = 100000.0  # SmolLM2's rope_theta
# float32 through 30 layers: the course's Decoder is within about 1e-4 of HF's
LOGITS_ATOL = 2e-3
# the real model on a shared CPU: the HF reference and the student's model,
# each prompt
MODEL_TIMEOUT = 240.0

# (d_model, num_heads, num_kv_heads, chunk lengths): MHA-like, GQA 3:1 as
# SmolLM2, MQA
_ATTN_CASES = [
    (24, 6, 2, (5,)),
    (36, 9, 3, (4, 1, 1, 2)),
    (32, 4, 1, (3, 2, 1)),
]


def _heads(x, h):
    """(B, T, h * Dh) -> (B, h, T, Dh)."""
    b, t, d = x.shape
    return x.reshape(b, t, h, d // h).transpose(0, 2, 1, 3)


def llama_attention_variant(
    x,
    p,
    h,
    hkv,
    chunks,
    *,
    base=ROPE_BASE,
    pairing="halves",
    position="ok",
    repeat="groups",
):
    """Float64 Llama attention run chunk by chunk with one optional deviation:
    x (B, T, D), weights ``p`` in ``nn.Linear`` layout (out, in), no biases.
    Returns out (B, T, D) and the cache (k, v), each (B, Hkv, T, Dh)."""
    cache_k = cache_v = None
    outs, start = [], 0
    for length in chunks:
        xs = x[:, start : start + length]
        q, k, v = (
            _heads(xs @ p["q"].T, h),
            _heads(xs @ p["k"].T, hkv),
            _heads(xs @ p["v"].T, hkv),
        )
        shift = {"ok": 0, "restart": -start, "plus-one": 1 if start else 0}[
            position
        ]
        positions = np.arange(start, start + length) + shift
        q, k = (
            rope_variant(a, positions, pairing=pairing, base=base)
            for a in (q, k)
        )
        cache_k = (
            k if cache_k is None else np.concatenate([cache_k, k], axis=2)
        )
        cache_v = (
            v if cache_v is None else np.concatenate([cache_v, v], axis=2)
        )
        n_rep = h // hkv
        if repeat == "groups":  # query head i reads key/value head i // n_rep
            keys, values = (
                np.repeat(cache_k, n_rep, axis=1),
                np.repeat(cache_v, n_rep, axis=1),
            )
        else:
            keys, values = (
                np.tile(cache_k, (1, n_rep, 1, 1)),
                np.tile(cache_v, (1, n_rep, 1, 1)),
            )
        i, j = np.arange(length)[:, None], np.arange(start + length)[None, :]
        scores = np.where(
            j <= i + start,
            q @ keys.transpose(0, 1, 3, 2) / np.sqrt(q.shape[-1]),
            -np.inf,
        )
        heads = numpy_ref.softmax(scores) @ values  # (B, H, T, Dh)
        outs.append(
            heads.transpose(0, 2, 1, 3).reshape(x.shape[0], length, -1)
            @ p["o"].T
        )
        start += length
    return np.concatenate(outs, axis=1), (cache_k, cache_v)


_ATTN_VARIANTS = [
    (
        "rope-wrong-pairing",
        "you rotate neighbours (x_2i, x_2i+1); Llama's checkpoints pair the "
        "halves "
        "(x_i, x_i+Dh/2)",
        {"pairing": "interleaved"},
    ),
    (
        "kv-heads-tiled",
        "query head h read key/value head h % H_kv",
        {"repeat": "tiled"},
    ),
    (
        "rope-position-not-offset",
        "0: every call starts counting positions again at 0, not at the "
        "cache length",
        {"position": "restart"},
    ),
    ("cache-position-off-by-one", "T_past + 1", {"position": "plus-one"}),
    ("rope-base-default", "", {"base": 10000.0}),
]


def _attn_params(d, h, hkv, seed):
    rng = np.random.default_rng(seed)
    dh = d // h
    return {
        "q": rng.standard_normal((h * dh, d)) / np.sqrt(d),
        "k": rng.standard_normal((hkv * dh, d)) / np.sqrt(d),
        "v": rng.standard_normal((hkv * dh, d)) / np.sqrt(d),
        "o": rng.standard_normal((d, h * dh)) / np.sqrt(d),
    }


def _load_attention(module, p, case):
    with torch.no_grad():
        for name in "qkvo":
            linear = getattr(module, f"{name}_proj", None)
            if (
                not is_instance(linear, torch.nn.Linear)
                or linear.bias is not None
            ):
                raise fail(
                    "missing-attribute",
                    f"Your module needs {name}_proj, an nn.Linear without a "
                    "bias: the "
                    "check loads known weights into it.",
                    case=case,
                )
            if tuple(linear.weight.shape) != p[name].shape:
                raise fail(
                    "wrong-shape",
                    f"Your {name}_proj has a weight of shape "
                    f"{shape_text(linear.weight.shape)}"
                    f", expected {shape_text(p[name].shape)} (out_features, "
                    "in_features).",
                    case=case,
                )
            linear.weight.copy_(torch.tensor(p[name], dtype=torch.float32))


def _feed(module, x, chunks, case):
    """Feed x (B, T, D) chunk by chunk with the cache each call returned:
    (outputs (B, T, D), final cache)."""
    cache, outs, start = None, [], 0
    with torch.no_grad():
        for length in chunks:
            xs = torch.tensor(
                x[:, start : start + length], dtype=torch.float32
            )
            result = call(
                module, {"x": xs, "cache": cache}, "forward", positional=1
            )
            if (
                not isinstance(result, (tuple, list))
                or len(result) != 2
                or not isinstance(result[1], (tuple, list))
            ):
                raise fail(
                    "wrong-type",
                    "Your forward must return (out, (k_cache, v_cache)).",
                    case=case,
                )
            out, cache = result[0], tuple(result[1])
            outs.append(as_array(out, "output", case))
            start += length
    return np.concatenate(outs, axis=1), cache


def check_llama_attention(cls, *, timeout: float = DEFAULT_TIMEOUT):
    """Check ``cls(d_model, num_heads, num_kv_heads, rope_base)``: ``q_proj``,
    ``k_proj``, ``v_proj``, ``o_proj`` (nn.Linear, no bias; keys and values
    ``num_kv_heads * Dh`` wide) and ``forward(x, cache=None)`` -> ``(out, (k,
    v))``: causal grouped-query attention with RoPE on halves, the new tokens
    at positions T_past ...; the cache holds the rotated keys and the values of
    the key/value heads, each (B, H_kv, T, Dh). Diagnoses the mistakes of
    :data:`_ATTN_VARIANTS`."""
    label = display_name(cls, "module")
    atol, rtol = 2e-5, 1e-4

    def body():
        rng = np.random.default_rng(44)
        cases = _ATTN_CASES + hidden.capstone2_attention_sizes()
        for n, (d, h, hkv, chunks) in enumerate(cases, 1):
            # a small base turns the pairs fast: pairing mistakes show
            base = ROPE_BASE if n % 2 else 500.0
            case = (
                f"case {n} of {len(cases)}: d_model={d}, num_heads={h}, "
                f"num_kv_heads={hkv}, rope_base={base:g}"
                f", chunks of {list(chunks)} tokens"
            )
            p = _attn_params(d, h, hkv, seed=n)
            x = rng.standard_normal((2, sum(chunks), d))
            module = call(
                cls,
                {
                    "d_model": d,
                    "num_heads": h,
                    "num_kv_heads": hkv,
                    "rope_base": base,
                },
                label,
                positional=4,
            )
            _load_attention(module, p, case)
            out_s, cache = _feed(module, x, chunks, case)
            ref, (ref_k, ref_v) = llama_attention_variant(
                x, p, h, hkv, chunks, base=base
            )
            if not close(out_s, ref, atol, rtol):
                candidates = [
                    (
                        code,
                        detail,
                        lambda kw=kw: (
                            llama_attention_variant(
                                x, p, h, hkv, chunks, **{"base": base, **kw}
                            )[0],
                            None,
                        ),
                    )
                    for code, detail, kw in _ATTN_VARIANTS
                    if kw.get("base") != base
                ]
                diagnose(
                    out_s,
                    None,
                    candidates,
                    case,
                    ref,
                    None,
                    atol=atol,
                    rtol=rtol,
                )
            k_s, v_s = (as_array(c, "cache", case) for c in cache)
            if not (
                close(k_s, ref_k, atol, rtol) and close(v_s, ref_v, atol, rtol)
            ):
                raise fail(
                    "wrong-output",
                    "Your outputs are right but your final cache is not: "
                    "it must hold the "
                    f"rotated keys and the values of the {hkv} key/value "
                    "heads, each (B, H_kv, T, Dh) = "
                    f"{shape_text(ref_k.shape)}; yours are "
                    f"{shape_text(k_s.shape)} and "
                    f"{shape_text(v_s.shape)}.",
                    case=case,
                )
        return (
            f"✓ {label}: {len(cases)} sequences fed in chunks (GQA 3:1 as "
            "SmolLM2, MQA, another base) match "
            "float64 grouped-query RoPE attention over the whole sequence, "
            "and the cache holds the rotated "
            "keys and the values"
        )

    run_check(body, timeout)


# -----------------------------------------------------------------------------
# The real model: the reference, loaded once per process
# -----------------------------------------------------------------------------

PROMPTS = ["The capital of France is", "def fib(n):\n    return"]


@functools.cache
def reference_model():
    """(tokenizer, HF LlamaForCausalLM) of SmolLM2-135M, loaded once per
    process."""
    from ..pretrained import load_smollm2

    return load_smollm2()


def _prompts() -> list[list[int]]:
    tokenizer, model = reference_model()
    return [
        tokenizer(text)["input_ids"] for text in PROMPTS
    ] + hidden.capstone2_prompts(model.config.vocab_size)


@torch.no_grad()
def _hf_logits(ids: list[int]) -> np.ndarray:
    # (T, V)
    return reference_model()[1](torch.tensor([ids])).logits[0].double().numpy()


def _hf_choosing_logits(ids: list[int], new: list[int]) -> np.ndarray:
    """(N, V): HF's logits that choose each of the ``new`` tokens after the
    prompt ``ids`` (the prompt's last row, then each new token's but the
    last), in one pass over the sequence."""
    return _hf_logits(ids + new[:-1])[len(ids) - 1 :]


@contextmanager
def _variant(kind: str):
    """The reference model with one deliberate deviation, restored
    afterwards."""
    model = reference_model()[1]
    if kind == "no-final-norm":
        handle = model.model.norm.register_forward_hook(
            lambda module, args, out: args[0]
        )
        try:
            yield
        finally:
            handle.remove()
        return
    rotary = model.model.rotary_emb
    saved = rotary.inv_freq.clone()
    dim = saved.numel() * 2
    rotary.inv_freq.copy_(
        1.0 / 10000.0 ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    )
    try:
        yield
    finally:
        rotary.inv_freq.copy_(saved)


def _logit_candidates(ids):
    def thunk(kind):
        def run():
            with _variant(kind):
                return _hf_logits(ids), None

        return run

    return [
        ("model-final-norm-missing", "", thunk("no-final-norm")),
        ("rope-base-default", "", thunk("base")),
    ]


def check_smollm2_logits(fn, *, timeout: float = MODEL_TIMEOUT):
    """Check ``fn(ids)``: ids (1, T) int64 -> logits (1, T, V) of the student's
    SmolLM2 with the real weights, against HF's ``LlamaForCausalLM`` on the
    same weights: max |ours - HF| < :data:`LOGITS_ATOL` at every position of
    each prompt. Diagnoses ``[model-final-norm-missing]`` and
    ``[rope-base-default]``; else ``[logits-differ-from-hf]``."""
    label = display_name(fn, "function")

    def body():
        prompts = _prompts()
        for n, ids in enumerate(prompts, 1):
            case = f"prompt {n} of {len(prompts)}: {len(ids)} tokens"
            with torch.no_grad():
                got = as_array(
                    call(
                        fn, {"ids": torch.tensor([ids])}, label, positional=1
                    ),
                    "logits",
                    case,
                )
            ref = _hf_logits(ids)
            if got.shape != (1, *ref.shape):
                raise fail(
                    "wrong-shape",
                    f"Your logits have shape {shape_text(got.shape)}, "
                    "expected "
                    f"{shape_text((1, *ref.shape))} (B, T, V).",
                    case=case,
                )
            if not close(got[0], ref, LOGITS_ATOL, 0.0):
                for code, detail, thunk in _logit_candidates(ids):
                    if close(got[0], thunk()[0], LOGITS_ATOL, 0.0):
                        raise fail(code, detail=detail, case=case)
                worst = np.abs(got[0] - ref).max(axis=-1)
                first = int(np.argmax(worst > LOGITS_ATOL))
                raise fail(
                    "logits-differ-from-hf",
                    detail=f"first at position {first} of {len(ids)}",
                    case=case,
                )
        return (
            f"✓ {label}: the logits of {len(prompts)} prompts equal Hugging "
            "Face's LlamaForCausalLM on the "
            f"same weights (max |ours - HF| < {LOGITS_ATOL:g} at every "
            "position)"
        )

    run_check(body, timeout)


# new tokens each greedy-decoding case generates
DECODE_STEPS = 6


def _new_and_logits(result, case, steps, vocab):
    """The student's (new ids (1, N), logits (1, N, V)) as arrays."""
    if not isinstance(result, tuple | list) or len(result) != 2:
        raise fail(
            "wrong-output",
            "Return a pair (new ids (1, N), logits (1, N, V)), got "
            f"{type(result).__name__}.",
            case=case,
        )
    new, logits = (
        as_array(result[0], "new ids", case),
        as_array(result[1], "logits", case),
    )
    if new.shape != (1, steps) or logits.shape != (1, steps, vocab):
        raise fail(
            "wrong-shape",
            f"Your new ids are {shape_text(new.shape)} and logits "
            f"{shape_text(logits.shape)}; expected {shape_text((1, steps))} "
            f"and {shape_text((1, steps, vocab))}: one row per new token.",
            case=case,
        )
    return new[0].astype(np.int64), logits[0]


@torch.no_grad()
def _logits_token_alone(ids: list[int], new: np.ndarray) -> np.ndarray:
    """(N, V): the prompt's last logits, then each new token's given alone,
    at position 0 (steps that drop the cache)."""
    model = reference_model()[1]
    rows = [_hf_logits(ids)[-1]]
    for token in new[:-1]:
        rows.append(
            model(torch.tensor([[int(token)]])).logits[0, -1].double().numpy()
        )
    return np.stack(rows)


def _call_watched(fn, args: dict, label: str, vocab: int):
    """Call the student's decoding ``fn`` with ``args`` (positionally, in
    order) while :class:`~.observe.TokensFed` watches its model's embedding
    lookups: (its result, the ids each lookup read)."""
    with observe.TokensFed(vocab) as watched, torch.no_grad():
        result = call(fn, args, label, positional=len(args))
    return result, watched.fed


def _require_lookups(fed: list[int], case: str) -> None:
    """The model must have looked up token embeddings: what it was fed is
    what the decoding checks read."""
    if not fed:
        raise fail(
            "wrong-output",
            "The check saw your model look up no token embedding "
            "(nn.Embedding or F.embedding): decode with your SmolLM2, "
            "whose embed is an nn.Embedding.",
            case=case,
        )


def _logits_differ(logits: np.ndarray, ref: np.ndarray, case: str):
    """``[logits-differ-from-hf]``, naming the first new token whose row
    differs from HF's by more than :data:`LOGITS_ATOL`."""
    worst = np.abs(logits - ref).max(axis=-1)
    return fail(
        "logits-differ-from-hf",
        detail=f"first at new token {int(np.argmax(worst > LOGITS_ATOL))}",
        case=case,
    )


def _check_fed(fed: list[int], prompt: int, steps: int, case: str) -> None:
    """The model's token lookups: the prompt once, then one token a step."""
    _require_lookups(fed, case)
    if fed[0] != prompt or any(n != 1 for n in fed[1:]) or len(fed) < steps:
        raise fail(
            "decode-recomputes-prefix",
            detail=f"tokens fed to your model, call by call: {fed}",
            case=case,
        )


def check_greedy_decoding(fn, *, timeout: float = MODEL_TIMEOUT):
    """Check ``fn(ids, max_new_tokens)``: ids (1, T) -> (new ids (1, N),
    logits (1, N, V)), greedy decoding with the student's SmolLM2 and its
    cache. Each new id must be the argmax of its row of logits; the logits
    must equal HF's ``LlamaForCausalLM``'s on the sequence the student
    generated (so a near-tie decided the other way is no error), within
    :data:`LOGITS_ATOL`; and the model's embedding lookups, watched
    (:class:`~.observe.TokensFed`), must be the prompt once, then one token
    per step. Diagnoses ``[decode-cache-dropped]`` and
    ``[decode-recomputes-prefix]``; else ``[logits-differ-from-hf]``."""
    label = display_name(fn, "function")

    def body():
        # one fixed prompt (each step is a pass of the real model), then
        # the hidden ones when grading
        prompts = _prompts()
        prompts = prompts[:1] + prompts[len(PROMPTS) :]
        vocab = reference_model()[1].config.vocab_size
        for n, ids in enumerate(prompts, 1):
            case = (
                f"prompt {n} of {len(prompts)}: {len(ids)} tokens, "
                f"{DECODE_STEPS} new"
            )
            result, fed = _call_watched(
                fn,
                {"ids": torch.tensor([ids]), "max_new_tokens": DECODE_STEPS},
                label,
                vocab,
            )
            new, logits = _new_and_logits(result, case, DECODE_STEPS, vocab)
            if not np.array_equal(new, logits.argmax(-1)):
                raise fail(
                    "wrong-output",
                    "A new id is not the argmax of the logits you returned "
                    "for it: greedy decoding takes the most likely token.",
                    case=case,
                )
            ref = _hf_choosing_logits(ids, new.tolist())
            if not close(logits, ref, LOGITS_ATOL, 0.0):
                alone = _logits_token_alone(ids, new)
                if close(logits, alone, LOGITS_ATOL, 0.0):
                    raise fail("decode-cache-dropped", case=case)
                raise _logits_differ(logits, ref, case)
            _check_fed(fed, len(ids), DECODE_STEPS, case)
        return (
            f"✓ {label}: {len(prompts)} "
            f"prompt{'s' if len(prompts) > 1 else ''}, {DECODE_STEPS} greedy "
            "tokens each, the logits equal Hugging Face's on the sequence you "
            "generated; after the prompt, one new token a step through your "
            "cache"
        )

    run_check(body, timeout)


# -----------------------------------------------------------------------------
# Exercise 6: prompt-lookup speculative decoding through the student's cache
# -----------------------------------------------------------------------------

# A text the model continues by repeating it: most drafts are kept, and one
# is rejected on the way (" mat" where the model says " rug"), so that a
# draft kept unverified, one token too many or a cache left uncropped all
# change the tokens
LOOKUP_PROMPT = (
    "The cat sat on the mat. The dog sat on the rug. "
    "The cat sat on the mat. The dog sat"
)
LOOKUP_STEPS = 12  # new tokens each case generates
LOOKUP_K = 4  # draft tokens at most per pass


def lookup_draft(seq: list[int], k: int) -> list[int]:
    """Up to ``k`` tokens that followed the latest earlier occurrence of the
    last two tokens of ``seq`` ([] where they never occurred before)."""
    tail = seq[-2:]
    for start in range(len(seq) - 3, -1, -1):
        if seq[start : start + 2] == tail:
            return seq[start + 2 : start + 2 + k]
    return []


def _kept(draft: list[int], choices: list[int]) -> int:
    """How many draft tokens equal the model's choices (``choices[i]``: its
    choice after draft token i - 1)."""
    kept = 0
    while kept < len(draft) and draft[kept] == choices[kept]:
        kept += 1
    return kept


def _made(draft: list[int], choices: list[int], rule: str) -> list[int]:
    """The tokens one verify pass adds: the draft tokens the model agrees
    with, then its own choice; or, by a mistaken ``rule``, the whole draft
    and the choice after it ("unverified"), or the agreed tokens and the
    first draft token it disagrees with ("off-by-one")."""
    kept = _kept(draft, choices)
    if rule == "unverified":
        return draft + [choices[len(draft)]]
    if rule == "off-by-one" and kept < len(draft):
        return draft[: kept + 1]
    return draft[:kept] + [choices[kept]]


def _replay(seq, prompt, k, choices=None, rule="right") -> list[int] | None:
    """Replay prompt-lookup decoding on ``seq`` (the prompt's ``prompt``
    tokens, then the new ones): the tokens each pass feeds (the prompt, then
    the newest token and its draft). ``choices``: the model's choice for each
    new token given the tokens before it in ``seq``; where given, None unless
    every pass adds the tokens ``rule`` keeps."""
    fed, end = [prompt], prompt + 1  # the prompt's pass chose one token
    if choices is not None and seq[prompt] != choices[0]:
        return None
    while end < len(seq):
        draft = lookup_draft(seq[:end], min(k, len(seq) - end - 1))
        if choices is None:  # seq's own tokens are the model's choices
            made = _made(draft, seq[end:], rule)
        else:
            at = end - prompt
            made = _made(draft, choices[at : at + len(draft) + 1], rule)
            made = made[: len(seq) - end]
            if seq[end : end + len(made)] != made:
                return None
        fed.append(1 + len(draft))
        end += len(made)
    return fed


def lookup_passes(seq: list[int], prompt: int, k: int) -> list[int]:
    """The tokens each pass of prompt-lookup decoding feeds to produce
    ``seq`` (the prompt's ``prompt`` tokens, then the new ones): the prompt,
    then per pass the newest token and its draft, of which the tokens equal
    to ``seq``'s are kept, plus the model's own next token."""
    return _replay(seq, prompt, k)


@torch.no_grad()
def _uncropped_lookup(ids: list[int], steps: int, k: int) -> np.ndarray:
    """The new tokens of prompt-lookup decoding with HF's model and a cache
    never cropped (the rejected draft tokens stay in it)."""
    from transformers import DynamicCache

    model = reference_model()[1]
    cache = DynamicCache(config=model.config)
    logits = model(torch.tensor([ids]), cache=cache, use_cache=True).logits
    seq = [*ids, int(logits[0, -1].argmax())]
    while len(seq) - len(ids) < steps:
        draft = lookup_draft(seq, min(k, steps - (len(seq) - len(ids)) - 1))
        logits = model(
            torch.tensor([seq[-1:] + draft]), cache=cache, use_cache=True
        ).logits  # (1, 1 + len(draft), V)
        seq += _made(draft, logits[0].argmax(-1).tolist(), "right")
    return np.array(seq[len(ids) :][:steps])


def _diagnose_lookup(ids, new, choices, case) -> None:
    """Raise the code of the mistake whose tokens the student's are, if any:
    replayed with ``choices``, HF's choice for each new token given the
    student's tokens before it; the uncropped cache run with HF's model."""
    seq = ids + new.tolist()
    if _replay(seq, len(ids), LOOKUP_K, choices) is None:
        for code, rule in (
            ("lookup-draft-unverified", "unverified"),
            ("lookup-keeps-mismatch", "off-by-one"),
        ):
            if _replay(seq, len(ids), LOOKUP_K, choices, rule) is not None:
                raise fail(code, case=case)
    if np.array_equal(new, _uncropped_lookup(ids, len(new), LOOKUP_K)):
        raise fail("lookup-cache-not-cropped", case=case)


def _check_lookup_fed(fed: list[int], seq: list[int], prompt: int, case):
    """The model's token lookups: the prompt once, then at most k + 1 tokens
    a pass, in no more passes than the lookup needs for these tokens."""
    _require_lookups(fed, case)
    if fed[0] != prompt or any(n > LOOKUP_K + 1 for n in fed[1:]):
        raise fail(
            "decode-recomputes-prefix",
            detail=f"tokens fed to your model, pass by pass: {fed}",
            case=case,
        )
    needed = lookup_passes(seq, prompt, LOOKUP_K)
    if len(fed) > len(needed):
        raise fail(
            "lookup-too-many-passes",
            detail=f"{len(fed) - 1} passes after the prompt, fed {fed[1:]}; "
            f"the lookup needs {len(needed) - 1}, fed {needed[1:]}",
            case=case,
        )


def check_prompt_lookup(fn, *, timeout: float = MODEL_TIMEOUT):
    """Check ``fn(ids, max_new_tokens, k)``: ids (1, T) -> (new ids (1, N),
    logits (1, N, V)), greedy decoding with the student's SmolLM2 and its
    caches, drafting up to ``k`` tokens by prompt lookup (what followed the
    latest earlier occurrence of the last two tokens) and verifying each
    draft in one pass. The tokens must be greedy decoding's, judged as
    :func:`check_greedy_decoding` judges them (the logits equal HF's on the
    student's sequence, within :data:`LOGITS_ATOL`); the model's embedding
    lookups (:class:`~.observe.TokensFed`) must be the prompt once, then at
    most k + 1 tokens a pass, in no more passes than :func:`lookup_passes`
    counts for the student's own tokens (on :data:`LOOKUP_PROMPT`, 3 for 12
    tokens). Diagnoses ``[lookup-draft-unverified]``,
    ``[lookup-keeps-mismatch]``, ``[lookup-cache-not-cropped]``,
    ``[decode-recomputes-prefix]`` and ``[lookup-too-many-passes]``."""
    label = display_name(fn, "function")

    def body():
        tokenizer, model = reference_model()
        vocab = model.config.vocab_size
        prompts = [
            tokenizer(LOOKUP_PROMPT)["input_ids"]
        ] + hidden.capstone2_lookup_prompts(vocab)
        for n, ids in enumerate(prompts, 1):
            case = (
                f"prompt {n} of {len(prompts)}: {len(ids)} tokens, "
                f"{LOOKUP_STEPS} new, k = {LOOKUP_K}"
            )
            result, fed = _call_watched(
                fn,
                {
                    "ids": torch.tensor([ids]),
                    "max_new_tokens": LOOKUP_STEPS,
                    "k": LOOKUP_K,
                },
                label,
                vocab,
            )
            new, logits = _new_and_logits(result, case, LOOKUP_STEPS, vocab)
            ref = _hf_choosing_logits(ids, new.tolist())
            greedy = np.array_equal(new, logits.argmax(-1))
            if not (greedy and close(logits, ref, LOGITS_ATOL, 0.0)):
                _diagnose_lookup(ids, new, ref.argmax(-1).tolist(), case)
                if not greedy:
                    raise fail(
                        "wrong-output",
                        "A new id is not the argmax of the logits you "
                        "returned for it: keep a draft token only where it "
                        "is your model's greedy choice.",
                        case=case,
                    )
                raise _logits_differ(logits, ref, case)
            _check_lookup_fed(fed, ids + new.tolist(), len(ids), case)
        return (
            f"✓ {label}: {len(prompts)} "
            f"prompt{'s' if len(prompts) > 1 else ''}, {LOOKUP_STEPS} greedy "
            "tokens each, the logits equal Hugging Face's on the sequence you "
            f"generated; after the prompt, drafts of up to {LOOKUP_K} tokens "
            "verified in one pass each, in no more passes than the lookup "
            "needs"
        )

    run_check(body, timeout)


# -----------------------------------------------------------------------------
# Exercise 7: serving with a paged cache and continuous batching
# -----------------------------------------------------------------------------

# the public workload: requests finish at different steps, so that a freed
# slot (and its blocks) goes to a waiting request
SERVE_TEXTS = [
    "The capital of France is",
    "def fib(n):",
    "Once upon a time",
    "1, 2, 3,",
]
SERVE_NEW = [4, 2, 5, 3]  # new tokens per request
SERVE_RUNNING = 2  # max_running
SERVE_BLOCK = 4  # block_size


def serving_schedule(
    new: list[int], max_running: int, static: bool = False
) -> list[list[int]]:
    """The requests each step runs, admitted in order: a request runs its
    prompt in its first step, then one token a step, ``new[r]`` steps in
    all. Continuous batching fills a slot at the step after it frees;
    ``static`` batching only once the whole batch has finished."""
    waiting, running, left, steps = list(range(len(new))), [], list(new), []
    while waiting or running:
        if not static or not running:
            while waiting and len(running) < max_running:
                running.append(waiting.pop(0))
        steps.append(list(running))
        for r in running:
            left[r] -= 1
        running = [r for r in running if left[r]]
    return steps


def _blocks(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


def serving_pool_size(prompts, new, max_running, block_size) -> int:
    """The blocks the busiest step holds: a request ``j`` steps in has
    ``len(prompt) + j - 1`` tokens cached (its newest token is fed at the
    next step), in ceil(tokens / block_size) blocks."""
    seen = [0] * len(prompts)
    peak = 0
    for step in serving_schedule(new, max_running):
        for r in step:
            seen[r] += 1
        held = [len(prompts[r]) + seen[r] - 1 for r in step]
        peak = max(peak, sum(_blocks(t, block_size) for t in held))
    return peak


def _ints(value, what: str, case: str) -> list[int]:
    """A student's list of ids (a list, array or tensor) as Python ints."""
    arr = as_array(value, what, case, kind="int")
    if arr.ndim != 1 or not np.array_equal(arr, np.round(arr)):
        raise fail(
            "wrong-type",
            f"Your {what} must be one list of integer ids, got "
            f"{shape_text(arr.shape)}.",
            case=case,
        )
    return [int(t) for t in arr]


def _served(result, new: list[int], case: str):
    """The student's (tokens per request, steps of (request, table) pairs)
    as lists of ints."""
    if not isinstance(result, tuple | list) or len(result) != 2:
        raise fail(
            "wrong-output",
            "Return a pair (new ids per request, steps), got "
            f"{type(result).__name__}.",
            case=case,
        )
    tokens, steps = result
    if not isinstance(tokens, tuple | list) or len(tokens) != len(new):
        raise fail(
            "wrong-output",
            f"Return one list of new ids per request ({len(new)}).",
            case=case,
        )
    tokens = [
        _ints(t, f"request {r}'s new ids", case) for r, t in enumerate(tokens)
    ]
    for r, (got, n) in enumerate(zip(tokens, new, strict=True)):
        if len(got) != n:
            raise fail(
                "wrong-shape",
                f"Request {r} asked for {n} new tokens; you returned "
                f"{len(got)}.",
                case=case,
            )
    if not isinstance(steps, tuple | list) or not all(
        isinstance(step, tuple | list)
        and all(
            isinstance(pair, tuple | list) and len(pair) == 2 for pair in step
        )
        for step in steps
    ):
        raise fail(
            "wrong-output",
            "Your steps must be a list with one entry per step: the list "
            "of (request index, block table) pairs it ran, in order.",
            case=case,
        )
    parsed = []
    for step in steps:
        pairs = []
        for r, table in step:
            r = _ints([r], "request index", case)[0]
            if not 0 <= r < len(new):
                raise fail(
                    "wrong-output",
                    f"Your steps name request {r}; there are {len(new)}.",
                    case=case,
                )
            pairs.append((r, _ints(list(table), "block table", case)))
        parsed.append(pairs)
    return tokens, parsed


def _check_schedule(runs: list[list[int]], new, max_running, case) -> None:
    """Replay the steps against the rules of continuous batching."""
    for s, step in enumerate(runs, 1):
        if len(step) > max_running:
            raise fail(
                "serve-too-many-running",
                detail=f"{len(step)} requests at step {s}, {step} "
                f"(max_running = {max_running})",
                case=case,
            )
    at = {
        r: [s for s, step in enumerate(runs) if r in step]
        for r in range(len(new))
    }
    for r, mine in at.items():
        if (
            len(mine) != new[r]
            or mine != list(range(mine[0], mine[0] + len(mine)))
            or any(runs[s].count(r) != 1 for s in mine)
        ):
            raise fail(
                "wrong-output",
                f"Request {r} ran at steps {[s + 1 for s in mine]}: it must "
                f"run once in each of {new[r]} consecutive steps (its "
                "prompt in the first, then one token a step).",
                case=case,
            )
    starts = [at[r][0] for r in range(len(new))]
    if starts != sorted(starts):
        raise fail(
            "wrong-output",
            f"Your requests started at steps {[s + 1 for s in starts]}: "
            "admit them in order (first come, first served).",
            case=case,
        )
    for s, step in enumerate(runs):
        late = [r for r in range(len(new)) if starts[r] > s]
        if len(step) < max_running and late:
            raise fail(
                "serve-static-batching",
                detail=f"step {s + 1} ran {len(step)} of max_running = "
                f"{max_running}, request {late[0]} waited until step "
                f"{starts[late[0]] + 1}",
                case=case,
            )


def _check_tables(steps, prompts, new, block_size, num_blocks, case):
    """Each request's table after each of its steps: exactly the blocks its
    cached tokens fill, grown at its end, of the pool, its own until it
    finishes (its blocks may go to a request run later in the same step)."""
    tables: dict[int, list[int]] = {}
    seen = [0] * len(prompts)
    owner: dict[int, int] = {}  # block -> the unfinished request holding it
    for s, step in enumerate(steps, 1):
        for r, table in step:
            seen[r] += 1
            tokens = len(prompts[r]) + seen[r] - 1
            need = _blocks(tokens, block_size)
            where = f"request {r} at step {s}: {tokens} tokens cached"
            if len(table) > need:
                raise fail(
                    "serve-blocks-reserved",
                    detail=f"{len(table)} blocks for {where} (blocks of "
                    f"{block_size}: {need})",
                    case=case,
                )
            if len(table) < need or table[: len(tables.get(r, []))] != (
                tables.get(r, [])
            ):
                raise fail(
                    "wrong-output",
                    f"The block table of {where}, is {table}; after "
                    f"{tables.get(r, [])} it must hold {need} blocks (of "
                    f"{block_size} tokens), the earlier ones kept in "
                    "order, a new one added at the end when the last is "
                    "full.",
                    case=case,
                )
            tables[r] = table
            if len(set(table)) != len(table):
                raise fail(
                    "serve-blocks-shared",
                    detail=f"a block twice in the table of {where}: {table}",
                    case=case,
                )
            for b in table:
                if b >= num_blocks:
                    raise fail(
                        "serve-blocks-not-freed",
                        detail=f"{b} of a pool of {num_blocks} (blocks 0 "
                        f"to {num_blocks - 1})",
                        case=case,
                    )
                if b < 0:
                    raise fail(
                        "wrong-output",
                        f"Block {b} in the table of {where}: the pool's "
                        f"blocks are 0 to {num_blocks - 1}.",
                        case=case,
                    )
                if owner.get(b, r) != r:
                    raise fail(
                        "serve-blocks-shared",
                        detail=f"block {b}, in the tables of requests "
                        f"{owner[b]} and {r} at step {s}",
                        case=case,
                    )
                owner[b] = r
            if seen[r] == new[r]:  # finished: its blocks back to the pool
                owner = {b: o for b, o in owner.items() if o != r}


def _check_serve_fed(fed: list[int], steps, prompts, case) -> None:
    """The model's token lookups, call by call: one request at a time, in
    the order of the steps, its prompt on its first step, then one token."""
    expected, started = [], set()
    for step in steps:
        for r, _ in step:
            expected.append(1 if r in started else len(prompts[r]))
            started.add(r)
    if fed == expected:
        return
    detail = (
        f"tokens fed to your model, call by call: {fed}; your steps need "
        f"{expected}"
    )
    if len(fed) == len(expected) and sum(fed) > sum(expected):
        raise fail("decode-recomputes-prefix", detail=detail, case=case)
    raise fail(
        "wrong-output",
        f"What your model was fed does not match your steps: {detail}. Run "
        "the requests of a step one at a time, in the order you list "
        "them: a request's prompt on its first step, then its newest token.",
        case=case,
    )


def _check_serve_tokens(tokens, prompts, case) -> None:
    """Each request's tokens greedy decoding of it alone: each one HF's
    argmax on the request's own sequence, or within twice
    :data:`LOGITS_ATOL` of it (a near-tie two models within LOGITS_ATOL of
    HF may decide either way)."""
    for r, (prompt, new) in enumerate(zip(prompts, tokens, strict=True)):
        ref = _hf_choosing_logits(prompt, new)  # (N, V)
        chosen = ref[np.arange(len(new)), new]
        short = chosen < ref.max(axis=-1) - 2 * LOGITS_ATOL
        if short.any():
            raise fail(
                "serve-tokens-differ",
                detail=f"request {r}'s new token {int(np.argmax(short))} "
                f"(of {len(new)})",
                case=case,
            )


def _serving_workloads():
    tokenizer, model = reference_model()
    fixed = (
        [tokenizer(text)["input_ids"] for text in SERVE_TEXTS],
        SERVE_NEW,
        SERVE_RUNNING,
        SERVE_BLOCK,
    )
    return [fixed] + hidden.capstone2_serving_workloads(
        model.config.vocab_size
    )


def check_serving(fn, *, timeout: float = MODEL_TIMEOUT):
    """Check ``fn(prompts, max_new_tokens, max_running, block_size,
    num_blocks)`` -> ``(tokens, steps)``: the requests (lists of ids, and
    new tokens wanted per request) served greedily with the student's
    SmolLM2 through a paged cache of ``num_blocks`` blocks of
    ``block_size`` tokens, at most ``max_running`` in flight, one request
    at a time in each step. ``tokens``: the new ids of each request;
    ``steps``: per scheduler step, the (request index, block table) pairs
    it ran, tables as they are after the step. Replays the steps against
    continuous batching (:func:`serving_schedule`), the tables against
    paging (ceil(cached / block_size) blocks, grown at the end, no block in
    two tables, a pool of :func:`serving_pool_size` blocks), what the model
    was fed (:class:`~.observe.TokensFed`) against the steps, and each
    request's tokens against HF's greedy choices on its own sequence.
    Diagnoses ``[serve-too-many-running]``, ``[serve-static-batching]``,
    ``[serve-blocks-reserved]``, ``[serve-blocks-shared]``,
    ``[serve-blocks-not-freed]``, ``[decode-recomputes-prefix]`` and
    ``[serve-tokens-differ]``."""
    label = display_name(fn, "function")

    def body():
        workloads = _serving_workloads()
        vocab = reference_model()[1].config.vocab_size
        for n, (prompts, new, running, size) in enumerate(workloads, 1):
            pool = serving_pool_size(prompts, new, running, size)
            case = (
                f"workload {n} of {len(workloads)}: prompts of "
                f"{[len(p) for p in prompts]} tokens, {new} new, "
                f"max_running = {running}, blocks of {size}, a pool of "
                f"{pool}"
            )
            result, fed = _call_watched(
                fn,
                {
                    "prompts": [list(p) for p in prompts],
                    "max_new_tokens": list(new),
                    "max_running": running,
                    "block_size": size,
                    "num_blocks": pool,
                },
                label,
                vocab,
            )
            tokens, steps = _served(result, new, case)
            runs = [[r for r, _ in step] for step in steps]
            _check_schedule(runs, new, running, case)
            _check_tables(steps, prompts, new, size, pool, case)
            _check_serve_fed(fed, steps, prompts, case)
            _check_serve_tokens(tokens, prompts, case)
        return (
            f"✓ {label}: {len(workloads)} "
            f"workload{'s' if len(workloads) > 1 else ''} served by "
            "continuous batching (a freed slot refilled at the next step, "
            "never more than max_running in flight), each request's blocks "
            "allocated as it grows, its own, given back when it finishes; "
            "every request's tokens greedy decoding of it alone"
        )

    run_check(body, timeout)


choice_question(
    "capstone2.kv-heads",
    answer="B",
    why="each layer caches one key and one value per key/value head: 3 "
    "heads of 64 features, so 2 x 3 x 64 = 384 "
    "numbers per token per layer, a third of what 9 heads would need; the 9 "
    "query heads read them in groups.",
    wrong={
        "A": (
            "kv-heads-tiled",
            "the 9 query heads are not cached at all; the cache holds the "
            "keys and values of "
            "the 3 key/value heads, each read by a group of 3 query heads.",
        ),
        "C": "the cache holds keys AND values: two vectors per key/value "
        "head, not one per layer.",
    },
)
