"""Check of the capstone: causal multi-head self-attention with RoPE and a KV cache, end to end.

The student's module is fed a sequence in chunks (a prompt, then tokens one or a few at a time), carrying its cache
from call to call; the outputs of all chunks together must equal full causal RoPE attention over the whole sequence,
computed here in float64 NumPy, and the final cache must hold every key (rotated at its position) and every value.
Each known mistake is the reference with one deliberate deviation, run through the same chunks.
"""

from __future__ import annotations

import numpy as np
import torch

from .. import numpy_ref
from . import hidden
from .diagnosis import diagnose
from .positions import rope_variant
from .questions import choice_question, number_question
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

# (d_model, num_heads, chunk lengths): a prompt alone, a prompt then single tokens, chunks of several tokens
_CASES = [(16, 2, (5,)), (24, 4, (3, 1, 1, 2)), (32, 4, (1, 1, 1, 1, 1)), (12, 2, (2, 4, 1))]


def _heads(x, h):
    """(B, T, D) -> (B, H, T, Dh)."""
    b, t, d = x.shape
    return x.reshape(b, t, h, d // h).transpose(0, 2, 1, 3)


def _softmax_masked(scores, allowed):
    scores = np.where(allowed, scores, -np.inf)
    return numpy_ref.softmax(scores)


def chunked_variant(x, params, h, chunks, *, position="ok", rerotate=False, rotate_values=False,
                    pairing="interleaved", mask="bottom-right", rope=True):
    """Float64 reference run chunk by chunk, with one optional deviation. Returns out (B, T, D) and the final
    cache (k (B, H, T, Dh), v (B, H, T, Dh))."""
    def rot(a, positions):
        return rope_variant(a, positions, pairing=pairing) if rope else a

    cache_k = cache_v = None
    outs, start = [], 0
    for length in chunks:
        xs = x[:, start:start + length]
        q, k, v = (_heads(xs @ params[f"w_{n}"] + params[f"b_{n}"], h) for n in "qkv")
        positions = np.arange(length) if position == "restart" else np.arange(start, start + length)
        q, k = rot(q, positions), rot(k, positions)
        if rotate_values:
            v = rot(v, positions)
        if cache_k is None:
            cache_k, cache_v = k, v
        else:
            cache_k, cache_v = np.concatenate([cache_k, k], axis=2), np.concatenate([cache_v, v], axis=2)
        keys = cache_k
        if rerotate and start:  # the whole cache rotated again at every call: the old keys turn a second time
            keys = np.concatenate([rot(cache_k[:, :, :start], np.arange(start)), k], axis=2)
        t_k = start + length
        i, j = np.arange(length)[:, None], np.arange(t_k)[None, :]
        allowed = {"bottom-right": j <= i + start, "top-left": j <= i, "none": np.ones((length, t_k), bool)}[mask]
        weights = _softmax_masked(q @ keys.transpose(0, 1, 3, 2) / np.sqrt(q.shape[-1]), allowed)
        heads = weights @ cache_v  # (B, H, T, Dh)
        b = heads.shape[0]
        outs.append(heads.transpose(0, 2, 1, 3).reshape(b, length, -1) @ params["w_o"] + params["b_o"])
        start += length
    return np.concatenate(outs, axis=1), (cache_k, cache_v)


_VARIANTS = [
    ("rope-position-not-offset", "0: every call starts counting positions again at 0, not at the cache length",
     {"position": "restart"}),
    ("rope-cache-rotated-twice", "", {"rerotate": True}),
    ("rope-rotates-values", "", {"rotate_values": True}),
    ("rope-wrong-pairing", "you rotate the halves (x_i, x_i+Dh/2); the capstone uses neighbours (x_2i, x_2i+1)",
     {"pairing": "halves"}),
    ("causal-top-left-aligned", "", {"mask": "top-left"}),
    ("mask-ignored", "", {"mask": "none"}),
    ("rope-not-applied", "", {"rope": False}),
]


def _load(module, params, case):
    with torch.no_grad():
        for name in "qkvo":
            linear = getattr(module, f"w_{name}", None)
            if not is_instance(linear, torch.nn.Linear) or linear.bias is None:
                raise fail("missing-attribute", f"Your module needs w_{name}, an nn.Linear(d_model, d_model) with "
                           "a bias: the check loads known weights into it.", case=case)
            linear.weight.copy_(torch.tensor(params[f"w_{name}"].T, dtype=torch.float32))
            linear.bias.copy_(torch.tensor(params[f"b_{name}"], dtype=torch.float32))


def _split(result, case, what):
    if not isinstance(result, tuple) or len(result) != 2 or not isinstance(result[1], tuple) or len(result[1]) != 2:
        raise fail("wrong-type", f"Your forward must return (out, (k_cache, v_cache)); {what} returned "
                   f"{type(result).__name__}.", case=case)
    return result[0], result[1]


def check_rope_cached_attention(cls, *, timeout: float = DEFAULT_TIMEOUT):
    """Check ``cls(d_model, num_heads)``, a module with ``w_q``, ``w_k``, ``w_v``, ``w_o`` (nn.Linear with biases)
    whose ``forward(x, cache=None)`` takes new tokens x (B, T, D) and the cache of the earlier ones (None, or
    (k, v), each (B, H, T_past, Dh), keys already rotated) and returns (out (B, T, D), (k, v) with the new tokens
    appended): causal self-attention with RoPE (interleaved pairs, base 10000), the new tokens at positions
    T_past .. T_past + T - 1. Diagnoses the mistakes of :data:`_VARIANTS` and ``[cache-keys-unrotated]`` (right
    outputs from a cache of plain keys rotated again at every call)."""
    label = display_name(cls, "module")
    atol, rtol = 2e-5, 1e-4

    def body():
        rng = np.random.default_rng(14)
        cases = _CASES + hidden.capstone_sizes()
        for n, (d, h, chunks) in enumerate(cases, 1):
            case = f"case {n} of {len(cases)}: d_model={d}, num_heads={h}, chunks of {list(chunks)} tokens"
            params = numpy_ref.init_mha_params(d, seed=n)
            x = rng.standard_normal((2 if n <= len(_CASES) else 5, sum(chunks), d))  # hidden: a batch of 5
            torch.manual_seed(0)
            module = call(cls, {"d_model": d, "num_heads": h}, label, positional=2)
            module.eval()
            _load(module, params, case)
            cache, outs = None, []
            with torch.no_grad():
                for start, length in zip(np.cumsum((0,) + chunks[:-1]), chunks, strict=True):
                    xs = torch.tensor(x[:, start:start + length], dtype=torch.float32)
                    out, cache = _split(call(module, {"x": xs, "cache": cache}, "forward", positional=1), case,
                                        "forward")
                    outs.append(as_array(out, "output", case))
            out_s = np.concatenate(outs, axis=1) if all(o.ndim == 3 for o in outs) else outs[-1]
            ref_out, (ref_k, ref_v) = chunked_variant(x, params, h, chunks)
            if close(out_s, ref_out, atol, rtol):
                k_s, v_s = (as_array(c, "cache", case) for c in cache)
                if close(v_s, ref_v, atol, rtol) and close(k_s, chunked_variant(x, params, h, chunks, rope=False)[1][0],
                                                            atol, rtol):
                    raise fail("cache-keys-unrotated", case=case)
                if not (close(k_s, ref_k, atol, rtol) and close(v_s, ref_v, atol, rtol)):
                    raise fail("wrong-output", f"Your outputs are right but your final cache is not: it must hold "
                               f"the keys of all {sum(chunks)} tokens, each rotated at its own position, and their "
                               f"values, each (B, H, T, Dh) = {shape_text(ref_k.shape)}; yours are "
                               f"{shape_text(k_s.shape)} and {shape_text(v_s.shape)}.", case=case)
                continue
            candidates = [(code, detail, lambda kw=kw: (chunked_variant(x, params, h, chunks, **kw)[0], None))
                          for code, detail, kw in _VARIANTS]
            diagnose(out_s, None, candidates, case, ref_out, None, atol=atol, rtol=rtol)
        return (f"✓ {label}: {len(cases)} sequences fed in chunks (a prompt, single tokens, several at once; "
                "2 to 4 heads) match full causal RoPE attention over the whole sequence, and the cache holds "
                "every rotated key and value")

    run_check(body, timeout)


choice_question(
    "19.cache-what",
    answer="A",
    why="a key's rotation depends only on its own position, which never changes: rotate it once, when it is "
        "computed, and cache it rotated; each new query is rotated at its own position.",
    wrong={
        "B": ("rope-cache-rotated-twice", "the cached keys are already rotated: rotating the whole cache by "
                                          "0 .. T-1 at every step turns the old keys a second time."),
        "C": ("rope-rotates-values", "values are never rotated: RoPE acts on queries and keys only, so that their "
                                     "scores depend on the distance."),
    },
)
number_question(
    "19.cache-numbers",
    answer=2 * 2 * 4 * 8 * 8,
    why="keys and values (2) x batch 2 x 4 heads x 8 tokens x Dh = 32 / 4 = 8 features = 1024 numbers.",
    known={
        2 * 4 * 8 * 8: ("cache-keys-only", "that counts the keys only (or the values only): the cache holds both."),
        2 * 2 * 4 * 3 * 8: ("cache-missing-factor", "that counts the 3 decoded tokens only: the prompt's 5 tokens "
                                                    "are cached too."),
        2 * 2 * 4 * 8 * 32: "that gives every head d_model = 32 features; each head caches Dh = 32 / 4 = 8.",
    },
    hint="Count keys and values, batch, heads, tokens (prompt and decoded) and features per head.",
)
