"""Checks of the capstone: the student's RoPE attention with a KV cache, their
pre-LN block, their TinyGPT, its generation with and without the cache, its
training on the induction task and its induction head.

:func:`check_rope_cached_attention`: the module is fed a sequence in chunks (a
prompt, then tokens one or a few at a time), carrying its cache from call to
call; the outputs of all chunks together must equal full causal RoPE attention
over the whole sequence, computed here in float64 NumPy, and the final cache
must hold every key (rotated at its position) and every value. Each known
mistake is the reference with one deliberate deviation, run through the same
chunks. The later checks compare the student's block and model with float64
references and with the library's :class:`~attention_course.gpt.GPT` (same
weights, loaded both ways), and the student's score with
:mod:`attention_course.interpret`'s.
"""

from __future__ import annotations

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

# (d_model, num_heads, chunk lengths): a prompt alone, a prompt then single
# tokens, chunks of several tokens
_CASES = [
    (16, 2, (5,)),
    (24, 4, (3, 1, 1, 2)),
    (32, 4, (1, 1, 1, 1, 1)),
    (12, 2, (2, 4, 1)),
]


def _heads(x, h):
    """(B, T, D) -> (B, H, T, Dh)."""
    b, t, d = x.shape
    return x.reshape(b, t, h, d // h).transpose(0, 2, 1, 3)


def _softmax_masked(scores, allowed):
    scores = np.where(allowed, scores, -np.inf)
    return numpy_ref.softmax(scores)


def chunked_variant(
    x,
    params,
    h,
    chunks,
    *,
    position="ok",
    rerotate=False,
    rotate_values=False,
    pairing="interleaved",
    mask="bottom-right",
    rope=True,
):
    """Float64 reference run chunk by chunk, with one optional deviation.
    Returns out (B, T, D) and the final cache (k (B, H, T, Dh), v (B, H, T,
    Dh))."""

    def rot(a, positions):
        return rope_variant(a, positions, pairing=pairing) if rope else a

    cache_k = cache_v = None
    outs, start = [], 0
    for length in chunks:
        xs = x[:, start : start + length]
        q, k, v = (
            _heads(xs @ params[f"w_{n}"] + params[f"b_{n}"], h) for n in "qkv"
        )
        positions = (
            np.arange(length)
            if position == "restart"
            else np.arange(start, start + length)
        )
        q, k = rot(q, positions), rot(k, positions)
        if rotate_values:
            v = rot(v, positions)
        if cache_k is None:
            cache_k, cache_v = k, v
        else:
            cache_k, cache_v = (
                np.concatenate([cache_k, k], axis=2),
                np.concatenate([cache_v, v], axis=2),
            )
        keys = cache_k
        # the whole cache rotated again at every call: the old keys turn a
        # second time
        if rerotate and start:
            keys = np.concatenate(
                [rot(cache_k[:, :, :start], np.arange(start)), k], axis=2
            )
        t_k = start + length
        i, j = np.arange(length)[:, None], np.arange(t_k)[None, :]
        allowed = {
            "bottom-right": j <= i + start,
            "top-left": j <= i,
            "none": np.ones((length, t_k), bool),
        }[mask]
        weights = _softmax_masked(
            q @ keys.transpose(0, 1, 3, 2) / np.sqrt(q.shape[-1]), allowed
        )
        heads = weights @ cache_v  # (B, H, T, Dh)
        b = heads.shape[0]
        outs.append(
            heads.transpose(0, 2, 1, 3).reshape(b, length, -1) @ params["w_o"]
            + params["b_o"]
        )
        start += length
    return np.concatenate(outs, axis=1), (cache_k, cache_v)


_VARIANTS = [
    (
        "rope-position-not-offset",
        "0: every call starts counting positions again at 0, not at the "
        "cache length",
        {"position": "restart"},
    ),
    ("rope-cache-rotated-twice", "", {"rerotate": True}),
    ("rope-rotates-values", "", {"rotate_values": True}),
    (
        "rope-wrong-pairing",
        "you rotate the halves (x_i, x_i+Dh/2); the capstone uses "
        "neighbours (x_2i, x_2i+1)",
        {"pairing": "halves"},
    ),
    ("causal-top-left-aligned", "", {"mask": "top-left"}),
    ("mask-ignored", "", {"mask": "none"}),
    ("rope-not-applied", "", {"rope": False}),
]


def _load(module, params, case):
    with torch.no_grad():
        for name in "qkvo":
            linear = getattr(module, f"w_{name}", None)
            if not is_instance(linear, torch.nn.Linear) or linear.bias is None:
                raise fail(
                    "missing-attribute",
                    f"Your module needs w_{name}, an nn.Linear(d_model, "
                    "d_model) with "
                    "a bias: the check loads known weights into it.",
                    case=case,
                )
            linear.weight.copy_(
                torch.tensor(params[f"w_{name}"].T, dtype=torch.float32)
            )
            linear.bias.copy_(
                torch.tensor(params[f"b_{name}"], dtype=torch.float32)
            )


def _split(result, case, what):
    pair = (tuple, list)
    if (
        not isinstance(result, pair)
        or len(result) != 2
        or not isinstance(result[1], pair)
        or len(result[1]) != 2
    ):
        raise fail(
            "wrong-type",
            "Your forward must return (out, (k_cache, v_cache)) (tuples or "
            f"lists); {what} "
            f"returned {type(result).__name__}.",
            case=case,
        )
    return result[0], tuple(result[1])


def check_rope_cached_attention(cls, *, timeout: float = DEFAULT_TIMEOUT):
    """Check ``cls(d_model, num_heads)``, a module with ``w_q``, ``w_k``,
    ``w_v``, ``w_o`` (nn.Linear with biases) whose ``forward(x, cache=None)``
    takes new tokens x (B, T, D) and the cache of the earlier ones (None, or
    (k, v), each (B, H, T_past, Dh), keys already rotated) and returns (out (B,
    T, D), (k, v) with the new tokens appended): causal self-attention with
    RoPE (interleaved pairs, base 10000), the new tokens at positions T_past ..
    T_past + T - 1. Diagnoses the mistakes of :data:`_VARIANTS`,
    ``[cache-keys-unrotated]`` (right outputs from a cache of plain keys
    rotated again at every call) and ``[cache-kept-in-module]`` (right for one
    sequence, wrong for two fed in turns to one module, each with its own
    cache)."""
    label = display_name(cls, "module")
    atol, rtol = 2e-5, 1e-4

    def body():
        rng = np.random.default_rng(14)
        cases = _CASES + hidden.capstone_sizes()
        for n, (d, h, chunks) in enumerate(cases, 1):
            case = (
                f"case {n} of {len(cases)}: d_model={d}, num_heads={h}, "
                f"chunks of {list(chunks)} tokens"
            )
            params = numpy_ref.init_mha_params(d, seed=n)
            # hidden: a batch of 5
            x = rng.standard_normal(
                (2 if n <= len(_CASES) else 5, sum(chunks), d)
            )
            torch.manual_seed(0)
            module = call(
                cls, {"d_model": d, "num_heads": h}, label, positional=2
            )
            module.eval()
            _load(module, params, case)
            (out_s,), cache = _interleaved(module, [x], chunks, case)
            ref_out, (ref_k, ref_v) = chunked_variant(x, params, h, chunks)
            if close(out_s, ref_out, atol, rtol):
                _check_cache(
                    cache, x, params, h, chunks, ref_k, ref_v, case, atol, rtol
                )
                # the same module again, two sequences in turns, each with its
                # own cache
                y = rng.standard_normal(x.shape)
                outs, _ = _interleaved(module, [y, x], chunks, case)
                wrong = [
                    name
                    for name, got, seq in (
                        ("the second", outs[0], y),
                        ("the first", outs[1], x),
                    )
                    if not close(
                        got,
                        chunked_variant(seq, params, h, chunks)[0],
                        atol,
                        rtol,
                    )
                ]
                if wrong:
                    raise fail(
                        "cache-kept-in-module",
                        detail=" and ".join(wrong),
                        case=case,
                    )
                continue
            candidates = [
                (
                    code,
                    detail,
                    lambda kw=kw: (
                        chunked_variant(x, params, h, chunks, **kw)[0],
                        None,
                    ),
                )
                for code, detail, kw in _VARIANTS
            ]
            diagnose(
                out_s,
                None,
                candidates,
                case,
                ref_out,
                None,
                atol=atol,
                rtol=rtol,
            )
        return (
            f"✓ {label}: {len(cases)} sequences fed in chunks (a prompt, "
            "single tokens, several at once; "
            "2 to 4 heads) match full causal RoPE attention over the whole "
            "sequence, and the cache holds "
            "every rotated key and value"
        )

    run_check(body, timeout)


def _interleaved(module, sequences, chunks, case):
    """Feed each sequence (B, T, D) to ``module`` chunk by chunk, the sequences
    in turns (chunk 1 of each, then chunk 2 of each...), each with the cache
    its own previous call returned: outputs (one (B, T, D) per sequence) and
    the last sequence's final cache."""
    caches, outs = [None] * len(sequences), [[] for _ in sequences]
    with torch.no_grad():
        for start, length in zip(
            np.cumsum((0,) + chunks[:-1]), chunks, strict=True
        ):
            for i, x in enumerate(sequences):
                xs = torch.tensor(
                    x[:, start : start + length], dtype=torch.float32
                )
                out, caches[i] = _split(
                    call(
                        module,
                        {"x": xs, "cache": caches[i]},
                        "forward",
                        positional=1,
                    ),
                    case,
                    "forward",
                )
                outs[i].append(as_array(out, "output", case))
    joined = [
        np.concatenate(o, axis=1) if all(a.ndim == 3 for a in o) else o[-1]
        for o in outs
    ]
    return joined, caches[-1]


def _check_cache(cache, x, params, h, chunks, ref_k, ref_v, case, atol, rtol):
    """The final cache of right outputs: every key rotated at its position,
    every value."""
    k_s, v_s = (as_array(c, "cache", case) for c in cache)
    if close(v_s, ref_v, atol, rtol) and close(
        k_s,
        chunked_variant(x, params, h, chunks, rope=False)[1][0],
        atol,
        rtol,
    ):
        raise fail("cache-keys-unrotated", case=case)
    if not (close(k_s, ref_k, atol, rtol) and close(v_s, ref_v, atol, rtol)):
        raise fail(
            "wrong-output",
            "Your outputs are right but your final cache is not: it must "
            "hold the keys of "
            f"all {sum(chunks)} tokens, each rotated at its own position, "
            "and their values, each "
            f"(B, H, T, Dh) = {shape_text(ref_k.shape)}; yours are "
            f"{shape_text(k_s.shape)} and "
            f"{shape_text(v_s.shape)}.",
            case=case,
        )


# -----------------------------------------------------------------------------
# The pre-LN block: the student's attention, two LayerNorms and a GELU MLP
# -----------------------------------------------------------------------------

# (d_model, num_heads, d_ff, chunk lengths)
_BLOCK_CASES = [
    (16, 2, 40, (6,)),
    (24, 4, 48, (4, 1, 2)),
    (12, 2, 20, (3, 1, 1, 1)),
]


def _block_params(d, d_ff, seed):
    """Float64 weights of a block in ``y = x @ W + b`` layout; LayerNorm gains
    and shifts away from 1 and 0."""
    rng = np.random.default_rng(seed)
    p = {
        f"attn_{k}": v
        for k, v in numpy_ref.init_mha_params(d, seed=seed).items()
    }
    for n in ("1", "2"):
        p[f"g{n}"], p[f"s{n}"] = (
            1 + 0.3 * rng.standard_normal(d),
            0.3 * rng.standard_normal(d),
        )
    p["w1"], p["b1"] = (
        rng.standard_normal((d, d_ff)) / np.sqrt(d),
        0.1 * rng.standard_normal(d_ff),
    )
    p["w2"], p["b2"] = (
        rng.standard_normal((d_ff, d)) / np.sqrt(d_ff),
        0.1 * rng.standard_normal(d),
    )
    return p


def _layer_norm(x, g, s):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + 1e-5) * g + s


def _gelu(x):
    return np.asarray(
        torch.nn.functional.gelu(
            torch.from_numpy(np.asarray(x, dtype=np.float64))
        )
    )


def block_variant(x, p, h, variant="ok"):
    """Float64 pre-LN block over a whole sequence x (B, T, D), with one
    optional deviation."""
    attn_p = {k[5:]: v for k, v in p.items() if k.startswith("attn_")}

    def attn(z):
        return chunked_variant(z, attn_p, h, (z.shape[1],))[0]

    def mlp(z):
        hidden = z @ p["w1"] + p["b1"]
        return (hidden if variant == "no-activation" else _gelu(hidden)) @ p[
            "w2"
        ] + p["b2"]

    def ln1(z):
        return _layer_norm(z, p["g1"], p["s1"])

    def ln2(z):
        return _layer_norm(z, p["g2"], p["s2"])

    if variant == "post-ln":
        y = ln1(x + attn(x))
        return ln2(y + mlp(y))
    if variant == "norm-on-stream":
        x = ln1(x)
        y = x + attn(x)
        y = ln2(y)
        return y + mlp(y)
    y = attn(ln1(x)) if variant == "no-residual-attn" else x + attn(ln1(x))
    return mlp(ln2(y)) if variant == "no-residual-mlp" else y + mlp(ln2(y))


_BLOCK_VARIANTS = [
    (
        "norm-wrong-place",
        "your block matches post-LN, norm(x + branch(x)); this block is "
        "pre-LN",
        "post-ln",
    ),
    (
        "norm-on-residual-stream",
        "x = norm(x) before each sub-layer",
        "norm-on-stream",
    ),
    ("residual-missing", "around the attention", "no-residual-attn"),
    ("residual-missing", "around the MLP", "no-residual-mlp"),
    ("ffn-activation-missing", " (the GELU)", "no-activation"),
]


def _mlp_linears(mlp, case):
    """The MLP's two linear layers: ``linear1``/``linear2``, or the only two
    nn.Linear among its direct children in order (an ``nn.Sequential`` of
    Linear, GELU, maybe a Dropout, Linear)."""
    try:
        a, b = mlp.linear1, mlp.linear2
    except Exception:  # noqa: BLE001 - the other naming, or neither
        a = b = None
    if is_instance(a, torch.nn.Linear) and is_instance(b, torch.nn.Linear):
        return a, b
    linears = [
        m for m in _numbered_children(mlp) if is_instance(m, torch.nn.Linear)
    ]
    if len(linears) == 2:
        return tuple(linears)
    raise fail(
        "missing-attribute",
        "Your block's mlp needs two nn.Linear layers the check can load: "
        "linear1 and "
        "linear2, or an nn.Sequential whose only nn.Linear layers are "
        "nn.Linear(d_model, d_ff) and "
        "nn.Linear(d_ff, d_model), in that order.",
        case=case,
    )


def _numbered_children(mlp, most: int = 8) -> list:
    """The children ``0``, ``1``, ... of an ``nn.Sequential`` (read by name:
    the grader's stand-in for a module in the sandbox forwards attributes, not
    ``children()``)."""
    found = []
    for i in range(most):
        try:
            found.append(getattr(mlp, str(i)))
        # no such child: the end of the sequence, or not a sequence
        except Exception:  # noqa: BLE001
            break
    return found


def _block_layers(module, case):
    """(norm1, norm2, attention, linear1, linear2) of the student's block."""
    layers = []
    for name, kind in (
        ("norm1", torch.nn.LayerNorm),
        ("norm2", torch.nn.LayerNorm),
    ):
        layer = getattr(module, name, None)
        if not is_instance(layer, kind):
            raise fail(
                "missing-attribute",
                f"Your block needs {name}, an nn.LayerNorm(d_model): the "
                "check loads "
                "known weights into it.",
                case=case,
            )
        layers.append(layer)
    attn = getattr(module, "attn", None)
    if attn is None:
        raise fail(
            "missing-attribute",
            "Your block needs attn, your CachedRopeAttention(d_model, "
            "num_heads).",
            case=case,
        )
    return (*layers, attn, *_mlp_linears(getattr(module, "mlp", None), case))


def _copy(param, value):
    param.copy_(torch.tensor(value, dtype=torch.float32))


def _load_block(module, p, case):
    norm1, norm2, attn, lin1, lin2 = _block_layers(module, case)
    with torch.no_grad():
        _load(
            attn,
            {k[5:]: v for k, v in p.items() if k.startswith("attn_")},
            case,
        )
        for layer, g, s in ((norm1, "g1", "s1"), (norm2, "g2", "s2")):
            _copy(layer.weight, p[g])
            _copy(layer.bias, p[s])
        for layer, w, b in ((lin1, "w1", "b1"), (lin2, "w2", "b2")):
            _copy(layer.weight, p[w].T)
            _copy(layer.bias, p[b])


def _read_block(module, case):
    """The student's block weights, read back as float64 in the layout of
    :func:`_block_params`."""
    norm1, norm2, attn, lin1, lin2 = _block_layers(module, case)
    p = {}
    for n in "qkvo":
        linear = getattr(attn, f"w_{n}", None)
        if not is_instance(linear, torch.nn.Linear) or linear.bias is None:
            raise fail(
                "missing-attribute",
                f"Your block's attn needs w_{n}, an nn.Linear(d_model, "
                "d_model) with a "
                "bias: your CachedRopeAttention.",
                case=case,
            )
        p[f"attn_w_{n}"] = as_array(
            linear.weight, f"attn.w_{n}.weight", case
        ).T
        p[f"attn_b_{n}"] = as_array(linear.bias, f"attn.w_{n}.bias", case)
    for layer, g, s in ((norm1, "g1", "s1"), (norm2, "g2", "s2")):
        p[g], p[s] = (
            as_array(layer.weight, "norm weight", case),
            as_array(layer.bias, "norm bias", case),
        )
    for layer, w, b in ((lin1, "w1", "b1"), (lin2, "w2", "b2")):
        p[w], p[b] = (
            as_array(layer.weight, "mlp weight", case).T,
            as_array(layer.bias, "mlp bias", case),
        )
    return p


def _library_block(p, d, h, d_ff):
    """The library's GPTBlock (RoPE, float64) holding the weights ``p``."""
    from ..gpt import GPTBlock, GPTConfig

    block = (
        GPTBlock(GPTConfig(2, d, h, 1, d_ff=d_ff, positions="rope"))
        .double()
        .eval()
    )
    state = {
        "norm1.weight": p["g1"],
        "norm1.bias": p["s1"],
        "norm2.weight": p["g2"],
        "norm2.bias": p["s2"],
        "mlp.linear1.weight": p["w1"].T,
        "mlp.linear1.bias": p["b1"],
        "mlp.linear2.weight": p["w2"].T,
        "mlp.linear2.bias": p["b2"],
    }
    state |= {f"attn.w_{n}.weight": p[f"attn_w_{n}"].T for n in "qkvo"}
    state |= {f"attn.w_{n}.bias": p[f"attn_b_{n}"] for n in "qkvo"}
    block.load_state_dict(
        {k: torch.tensor(np.ascontiguousarray(v)) for k, v in state.items()}
    )
    return block


def _run_chunks(module, x, chunks, case, what):
    """Feed x (B, T, D) to ``module(x, cache)`` chunk by chunk; return all
    outputs (B, T, D) and the last cache."""
    cache, outs = None, []
    with torch.no_grad():
        for start, length in zip(
            np.cumsum((0,) + tuple(chunks[:-1])), chunks, strict=True
        ):
            xs = torch.tensor(
                x[:, start : start + length], dtype=torch.float32
            )
            out, cache = _split(
                call(module, {"x": xs, "cache": cache}, what, positional=1),
                case,
                what,
            )
            outs.append(as_array(out, "output", case))
    if not all(o.ndim == 3 for o in outs):
        raise fail(
            "wrong-shape",
            f"Your {what} must return an output (B, T, D) per call.",
            case=case,
        )
    return np.concatenate(outs, axis=1), cache


def check_capstone_block(cls, *, timeout: float = DEFAULT_TIMEOUT):
    """Check ``cls(d_model, num_heads, d_ff)``, a pre-LN block with ``norm1``,
    ``attn`` (the capstone's :class:`CachedRopeAttention`), ``norm2`` and
    ``mlp`` (``linear1``, GELU, ``linear2``, or an ``nn.Sequential`` of them),
    whose ``forward(x, cache=None)`` returns ``(out, cache)``: x +
    attn(norm1(x)), then
    + mlp(norm2(.)). Known weights are loaded into it and compared with a
    float64 block; its own weights are read back into the library's
    ``GPTBlock`` and compared again. Sequences are fed in chunks with the
    cache."""
    label = display_name(cls, "block")
    atol, rtol = 1e-4, 1e-4

    def body():
        rng = np.random.default_rng(19)
        cases = _BLOCK_CASES + [
            (d, h, 2 * d + 4, chunks)
            for d, h, chunks in hidden.capstone_sizes()
        ]
        for n, (d, h, d_ff, chunks) in enumerate(cases, 1):
            case = (
                f"case {n} of {len(cases)}: d_model={d}, num_heads={h}, "
                f"d_ff={d_ff}, chunks of {list(chunks)}"
            )
            x = 2 * rng.standard_normal((2, sum(chunks), d)) + 0.5
            torch.manual_seed(n)
            module = call(
                cls,
                {"d_model": d, "num_heads": h, "d_ff": d_ff},
                label,
                positional=3,
            )
            module.eval()
            # the library's block with the student's own (initial) weights: the
            # same outputs
            theirs = _read_block(module, case)
            out_s, _ = _run_chunks(module, x, chunks, case, "block")
            with torch.no_grad():
                ref = _library_block(theirs, d, h, d_ff)(
                    torch.tensor(x)
                ).numpy()
            if close(out_s, ref, atol, rtol):
                # known weights loaded into the student's block: the float64
                # reference
                p = _block_params(d, d_ff, seed=100 + n)
                _load_block(module, p, case)
                out_s, _ = _run_chunks(module, x, chunks, case, "block")
                ref = block_variant(x, p, h)
                if close(out_s, ref, atol, rtol):
                    continue
            else:
                p = theirs
            candidates = [
                (
                    code,
                    detail,
                    lambda v=v, p=p: (block_variant(x, p, h, v), None),
                )
                for code, detail, v in _BLOCK_VARIANTS
            ]
            diagnose(
                out_s, None, candidates, case, ref, None, atol=atol, rtol=rtol
            )
        return (
            f"✓ {label}: {len(cases)} sequences fed in chunks with the "
            "cache: with its own weights it matches "
            "the library's GPTBlock, with known weights loaded a float64 "
            "pre-LN block"
        )

    run_check(body, timeout)


# -----------------------------------------------------------------------------
# TinyGPT: embedding, the student's blocks, final norm, head; greedy generation
#     with and without the cache
# -----------------------------------------------------------------------------

# (vocab_size, d_model, num_heads, num_layers, d_ff, prompt length, new tokens)
_GPT_CASES = [
    (13, 16, 2, 2, 24, 5, 6),
    (11, 24, 4, 1, 32, 1, 4),
    (17, 12, 2, 3, 16, 3, 5),
]


def _gpt_params(v, d, layers, d_ff, seed):
    rng = np.random.default_rng(seed)
    return {
        "emb": rng.standard_normal((v, d)),
        "g": 1 + 0.3 * rng.standard_normal(d),
        "s": 0.3 * rng.standard_normal(d),
        "head": rng.standard_normal((v, d)) / np.sqrt(d),
        "blocks": [
            _block_params(d, d_ff, seed=seed * 10 + i) for i in range(layers)
        ],
    }


def _gpt_blocks(model, layers, case):
    blocks = getattr(model, "blocks", None)
    if blocks is None:
        raise fail(
            "missing-attribute",
            "Your TinyGPT needs blocks, an nn.ModuleList of your Blocks.",
            case=case,
        )
    return [getattr(blocks, str(i)) for i in range(layers)]


def _gpt_layers(model, case):
    found = [
        getattr(model, name, None) for name in ("tok_emb", "norm", "head")
    ]
    kinds = (torch.nn.Embedding, torch.nn.LayerNorm, torch.nn.Linear)
    if not all(
        is_instance(layer, kind)
        for layer, kind in zip(found, kinds, strict=True)
    ):
        raise fail(
            "missing-attribute",
            "Your TinyGPT needs tok_emb (nn.Embedding), norm (nn.LayerNorm) "
            "and head "
            "(nn.Linear(d_model, vocab_size, bias=False)): the check loads "
            "known weights into them.",
            case=case,
        )
    return found


def _load_gpt(model, p, case):
    emb, norm, head = _gpt_layers(model, case)
    with torch.no_grad():
        _copy(emb.weight, p["emb"])
        _copy(norm.weight, p["g"])
        _copy(norm.bias, p["s"])
        _copy(head.weight, p["head"])
    for block, bp in zip(
        _gpt_blocks(model, len(p["blocks"]), case), p["blocks"], strict=True
    ):
        _load_block(block, bp, case)


def read_gpt(model, layers, case=""):
    """The student's TinyGPT weights as float64 arrays (the layout of
    :func:`_gpt_params`)."""
    emb, norm, head = _gpt_layers(model, case)
    return {
        "emb": as_array(emb.weight, "tok_emb.weight", case),
        "g": as_array(norm.weight, "norm.weight", case),
        "s": as_array(norm.bias, "norm.bias", case),
        "head": as_array(head.weight, "head.weight", case),
        "blocks": [
            _read_block(b, case) for b in _gpt_blocks(model, layers, case)
        ],
    }


def library_gpt(p, num_heads):
    """The library's GPT (RoPE, untied head, float64, eval mode) holding the
    weights ``p``."""
    from ..gpt import GPT, GPTConfig

    v, d = p["emb"].shape
    d_ff = p["blocks"][0]["w1"].shape[1]
    model = (
        GPT(
            GPTConfig(
                v,
                d,
                num_heads,
                len(p["blocks"]),
                d_ff=d_ff,
                positions="rope",
                tie_embeddings=False,
                max_len=1024,
            )
        )
        .double()
        .eval()
    )
    with torch.no_grad():
        model.tok_emb.weight.copy_(torch.tensor(p["emb"]))
        model.norm.weight.copy_(torch.tensor(p["g"]))
        model.norm.bias.copy_(torch.tensor(p["s"]))
        model.head.weight.copy_(torch.tensor(p["head"]))
        for i, bp in enumerate(p["blocks"]):
            model.blocks[i].load_state_dict(
                _library_block(bp, d, num_heads, d_ff).state_dict()
            )
    return model


def _no_final_norm(model):
    """The library GPT without its final LayerNorm (the head reads the residual
    stream)."""
    model.norm = torch.nn.Identity()
    return model


def generate_variant(model, ids, steps, variant="ok"):
    """Greedy generation with the library GPT (float64): (ids (B, T0 + steps),
    logits (B, steps, V)), as right code does it or with one deviation of a
    cached loop."""
    from ..kv_cache import KVCache

    cache = KVCache(model.num_layers)
    step_input, all_logits = ids, []
    with torch.no_grad():
        for _ in range(steps):
            if variant == "uncached":
                logits = model(ids)
            elif variant == "first-position":
                logits = model(ids)[:, :1]
            elif variant == "no-cache-passed":
                logits = model(step_input)
            elif variant == "whole-sequence":
                logits = model(ids, cache=cache)
            else:
                logits = model(step_input, cache=cache)
            next_logits = logits[:, -1]
            next_ids = next_logits.argmax(-1, keepdim=True)
            ids = torch.cat([ids, next_ids], dim=1)
            step_input = next_ids
            all_logits.append(next_logits)
    return ids, torch.stack(all_logits, dim=1)


def _split_gpt(result, case, what):
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        raise fail(
            "wrong-type",
            f"{what} must return a pair, got {type(result).__name__}.",
            case=case,
        )
    return result


def check_capstone_generation(cls, generate, *, timeout: float = 30.0):
    """Check ``cls(vocab_size, d_model, num_heads, num_layers, d_ff)``, a
    TinyGPT with ``tok_emb``, ``blocks`` (the student's blocks), ``norm`` and
    ``head`` whose ``forward(ids, caches=None)`` returns ``(logits (B, T, V),
    caches)``, and ``generate(model, ids, max_new_tokens, use_cache)`` ->
    ``(ids (B, T0 + N), logits (B, N, V))``, greedy. The model's logits must
    equal the library's GPT with the same weights (loaded both ways);
    generation with and without the cache must give the same ids and close
    logits, each id the argmax of its logits and the logits those of the whole
    sequence."""
    label = display_name(cls, "TinyGPT")
    gen_label = display_name(generate, "generate")
    atol, rtol = 2e-4, 1e-4

    def body():
        rng = np.random.default_rng(91)
        extra = [
            (19, d, h, 2, d + 8, chunks[0], sum(chunks[1:]))
            for d, h, chunks in hidden.capstone_sizes()
        ]
        cases = _GPT_CASES + extra
        for n, (v, d, h, layers, d_ff, t0, steps) in enumerate(cases, 1):
            case = (
                f"case {n} of {len(cases)}: vocab_size={v}, d_model={d}, "
                f"num_heads={h}, num_layers={layers}, "
                f"d_ff={d_ff}, a prompt of {t0}, {steps} new tokens"
            )
            torch.manual_seed(n)
            model = call(
                cls,
                {
                    "vocab_size": v,
                    "d_model": d,
                    "num_heads": h,
                    "num_layers": layers,
                    "d_ff": d_ff,
                },
                label,
                positional=5,
            )
            model.eval()
            ids = torch.tensor(rng.integers(0, v, (2, 9)))
            for p in (
                read_gpt(model, layers, case),
                _gpt_params(v, d, layers, d_ff, seed=n),
            ):
                # the first: its own weights, read back; then known ones
                _load_gpt(model, p, case)
                reference = library_gpt(p, h)
                with torch.no_grad():
                    logits, _ = _split_gpt(
                        call(model, {"ids": ids}, "forward", positional=1),
                        case,
                        label,
                    )
                    logits = as_array(logits, "logits", case)
                    expected = reference(ids).numpy()
                if not close(logits, expected, atol, rtol):
                    candidates = [
                        (
                            "final-norm-missing",
                            "",
                            lambda p=p: (
                                _no_final_norm(library_gpt(p, h))(ids)
                                .detach()
                                .numpy(),
                                None,
                            ),
                        )
                    ]
                    diagnose(
                        logits,
                        None,
                        candidates,
                        case,
                        expected,
                        None,
                        what="logits",
                        atol=atol,
                        rtol=rtol,
                    )
            prompt = ids[:, :t0]
            runs = {}
            for use_cache in (False, True):
                with torch.no_grad():
                    out = _split_gpt(
                        call(
                            generate,
                            {
                                "model": model,
                                "ids": prompt,
                                "max_new_tokens": steps,
                                "use_cache": use_cache,
                            },
                            gen_label,
                            positional=3,
                        ),
                        case,
                        gen_label,
                    )
                runs[use_cache] = (
                    as_array(out[0], "ids", case),
                    as_array(out[1], "logits", case),
                )
            _check_generation(runs, reference, prompt, steps, case, atol, rtol)
        return (
            f"✓ {label}, {gen_label}: {len(cases)} models with the library "
            "GPT's logits (weights loaded both "
            "ways); generation with and without the cache gives the same "
            "greedy ids and logits"
        )

    run_check(body, timeout)


def _check_generation(runs, reference, prompt, steps, case, atol, rtol):
    t0 = prompt.shape[1]
    for use_cache, (ids_s, logits_s) in runs.items():
        what = "with the cache" if use_cache else "without the cache"
        want_ids = (prompt.shape[0], t0 + steps)
        if ids_s.shape != want_ids or logits_s.shape[:2] != (
            prompt.shape[0],
            steps,
        ):
            raise fail(
                "wrong-shape",
                f"Generating {what}, your ids are {shape_text(ids_s.shape)} "
                "and logits "
                f"{shape_text(logits_s.shape)}; expected ids "
                f"{shape_text(want_ids)} (the prompt, then the "
                f"new tokens) and logits (B, {steps}, V), one row per new "
                "token.",
                case=case,
            )
        if not np.array_equal(ids_s[:, :t0], prompt.numpy()):
            raise fail(
                "wrong-output",
                f"Generating {what}, your ids do not start with the prompt.",
                case=case,
            )
        if not np.array_equal(ids_s[:, t0:], logits_s.argmax(-1)):
            raise fail(
                "wrong-output",
                f"Generating {what}, a new id is not the argmax of the "
                "logits you "
                "returned for it: greedy decoding takes the most likely "
                "token.",
                case=case,
            )
        # the logits that chose each token, recomputed from the whole sequence
        # the student generated
        with torch.no_grad():
            whole = reference(torch.tensor(ids_s[:, :-1], dtype=torch.long))[
                :, t0 - 1 :
            ].numpy()
        if close(logits_s, whole, atol, rtol):
            continue
        variants = (
            [("generate-wrong-position", "first-position")]
            if not use_cache
            else [
                ("cache-not-passed-back", "no-cache-passed"),
                ("cache-fed-whole-sequence", "whole-sequence"),
            ]
        )
        candidates = [
            (
                code,
                "",
                lambda v=v: (
                    generate_variant(reference, prompt, steps, v)[1].numpy(),
                    None,
                ),
            )
            for code, v in variants
        ]
        diagnose(
            logits_s,
            None,
            candidates,
            case + f", generating {what}",
            whole,
            None,
            what="logits",
            atol=atol,
            rtol=rtol,
        )
    (ids_a, logits_a), (ids_b, logits_b) = runs[False], runs[True]
    if not (
        np.array_equal(ids_a, ids_b) and close(logits_a, logits_b, atol, rtol)
    ):
        raise fail(
            "wrong-output",
            "Your generation with the cache and without it differ.",
            case=case,
        )


# -----------------------------------------------------------------------------
# Training on the induction task; the induction head found with the student's
# own score
# -----------------------------------------------------------------------------

# the task: 64 token ids, sequences of 16 whose second half repeats the first
INDUCTION = {
    "vocab_size": 64,
    "seq_len": 16,
    "d_model": 32,
    "num_heads": 2,
    "num_layers": 2,
    "d_ff": 64,
}
INDUCTION_THRESHOLD = 0.9


def induction_test_set(batch=200, seed=123):
    """Held-out sequences (B, 16) whose second half repeats the first, and
    their copy targets (B, 16)."""
    from ..tasks import repeated_segment_batch

    c = INDUCTION
    return repeated_segment_batch(
        batch,
        c["seq_len"],
        c["vocab_size"],
        torch.Generator().manual_seed(seed),
        min_segment=c["seq_len"] // 2,
    )


def _trained(cls, train_fn, label, case):
    """Build the capstone's model from ``cls`` (seeded) and train it with
    ``train_fn`` under ``torch.no_grad()`` (as the grader calls code) on one
    thread (as the grader's sandbox runs): returns the trained model."""
    c = INDUCTION
    torch.manual_seed(0)
    model = call(
        cls,
        {
            k: c[k]
            for k in (
                "vocab_size",
                "d_model",
                "num_heads",
                "num_layers",
                "d_ff",
            )
        },
        display_name(cls, "TinyGPT"),
        positional=5,
    )
    threads = torch.get_num_threads()
    # as in the grader's sandbox: a model this small trains fastest on one
    # thread
    torch.set_num_threads(1)
    try:
        with torch.no_grad():
            trained = call(train_fn, {"model": model}, label)
    finally:
        torch.set_num_threads(threads)
    if trained is None:
        raise fail(
            "returned-none",
            "Your training function returned None: return the trained model.",
            case=case,
        )
    trained.eval()
    return trained


def check_capstone_training(cls, train_fn, *, timeout: float = 120.0):
    """Check ``train_fn(model)`` -> the model trained (next-token loss, every
    position) on sequences whose second half repeats the first: built from
    ``cls`` with :data:`INDUCTION`'s sizes, called under ``torch.no_grad()``,
    its greedy next-token accuracy on the second halves of held-out sequences
    must reach :data:`INDUCTION_THRESHOLD`, measured by the check: the
    library's causal GPT holding the trained weights. Diagnoses
    ``[targets-not-shifted]``, ``[induction-not-learned]`` and
    ``[accuracy-not-from-weights]`` (the model's own forward reaches what its
    weights do not)."""
    label = display_name(train_fn, "train")

    def body():
        case = (
            "the held-out sequences of 16 tokens whose second half "
            "repeats the first"
        )
        model = _trained(cls, train_fn, label, case)
        ids, copy_target = induction_test_set()
        # measured with the check's own forward: the library's causal GPT
        # holding the trained weights
        reference = library_gpt(
            read_gpt(model, INDUCTION["num_layers"], case),
            INDUCTION["num_heads"],
        )
        with torch.no_grad():
            predicted = reference(ids[:, :-1]).argmax(-1)  # (B, T - 1)
        accuracy = (
            (predicted == ids[:, 1:])[copy_target[:, :-1]]
            .double()
            .mean()
            .item()
        )
        if accuracy >= INDUCTION_THRESHOLD:
            return (
                f"✓ {label}: after training, next-token accuracy on the "
                "repeated halves of 200 held-out "
                f"sequences >= {INDUCTION_THRESHOLD:.0%}"
            )
        with torch.no_grad():
            logits, _ = _split_gpt(
                call(model, {"ids": ids[:, :-1]}, "forward", positional=1),
                case,
                "forward",
            )
        own = torch.tensor(as_array(logits, "logits", case)).argmax(-1)
        own_accuracy = (
            (own == ids[:, 1:])[copy_target[:, :-1]].double().mean().item()
        )
        if own_accuracy >= INDUCTION_THRESHOLD:
            raise fail(
                "accuracy-not-from-weights",
                detail=f"{own_accuracy:.0%} with its own forward, "
                f"{accuracy:.0%} in the course's causal GPT holding the "
                "same weights",
                case=case,
            )
        if (predicted == ids[:, :-1]).double().mean().item() > 0.5:
            raise fail("targets-not-shifted", case=case)
        raise fail(
            "induction-not-learned", detail=f"{accuracy:.0%}", case=case
        )

    run_check(body, timeout)


def induction_score_variant(weights, ids, query_mask, variant="ok"):
    """Prefix-matching score (L, H) of :mod:`attention_course.interpret`, or
    one of its known mistakes."""
    from ..interpret import prefix_matching_score

    if variant == "ok":
        return prefix_matching_score(weights, ids, query_mask).numpy()
    t = ids.shape[1]
    if variant == "off-by-one":  # the earlier occurrence itself
        targets = (ids[:, :, None] == ids[:, None, :]) & torch.ones(
            t, t, dtype=torch.bool
        ).tril(-1)
    else:
        previous = torch.cat(
            [torch.full_like(ids[:, :1], -1), ids[:, :-1]], dim=1
        )
        targets = (ids[:, :, None] == previous[:, None, :]) & torch.ones(
            t, t, dtype=torch.bool
        ).tril(0)
    on_target = (weights * targets[None, :, None]).sum(-1)  # (L, B, H, T)
    queries = targets.any(-1) & query_mask
    return on_target.transpose(2, 3)[:, queries].mean(1).numpy()


def check_capstone_induction_scores(
    cls, train_fn, score_fn, *, timeout: float = 120.0
):
    """Check ``score_fn(model, ids, copy_target)`` -> (L, H): each head's
    prefix-matching score in the student's own trained model (the model of
    :func:`check_capstone_training`), read from the model's attention weights.
    It must equal :func:`attention_course.interpret.prefix_matching_score` on
    the library GPT holding the same weights (queries where ``copy_target`` is
    True), computed without the library's GPT or interpret functions
    (``[scores-from-library]``)."""
    label = display_name(score_fn, "score")
    atol = 1e-3

    def body():
        case = "your trained model on 100 held-out sequences of 16 tokens"
        model = _trained(cls, train_fn, display_name(train_fn, "train"), case)
        ids, copy_target = induction_test_set(100, seed=7)
        with (
            torch.no_grad(),
            observe.LibraryCalls(
                "interpret", "gpt", "checks/capstone"
            ) as library,
        ):
            result = call(
                score_fn,
                {"model": model, "ids": ids, "copy_target": copy_target},
                label,
            )
        if library.called:
            raise fail(
                "scores-from-library", detail=library.called[0], case=case
            )
        got = as_array(result, "result", case)
        from ..interpret import attention_maps

        reference = library_gpt(
            read_gpt(model, INDUCTION["num_layers"], case),
            INDUCTION["num_heads"],
        )
        weights = attention_maps(reference, ids)  # (L, B, H, T, T)
        expected = induction_score_variant(weights, ids, copy_target)
        if not close(got, expected, atol, 0.0):
            candidates = [
                (
                    code,
                    "",
                    lambda v=v: (
                        induction_score_variant(weights, ids, copy_target, v),
                        None,
                    ),
                )
                for code, v in (
                    ("induction-off-by-one", "off-by-one"),
                    ("induction-includes-self", "includes-self"),
                )
            ]
            candidates.append(
                (
                    "induction-ignores-query-mask",
                    "",
                    lambda: (
                        induction_score_variant(
                            weights, ids, torch.ones_like(copy_target)
                        ),
                        None,
                    ),
                )
            )
            diagnose(
                got,
                None,
                candidates,
                case,
                expected,
                None,
                what="scores",
                atol=atol,
                rtol=0.0,
            )
        layer = int(expected.argmax()) // expected.shape[1]
        return (
            f"✓ {label}: your scores equal the library's on your trained "
            "model; its strongest head is in "
            f"layer {layer + 1}"
        )

    run_check(body, timeout)


# -----------------------------------------------------------------------------
# Challenge: the student's attention with its heads sharded over real processes
# -----------------------------------------------------------------------------

# (d_model, num_heads, world_size, T): 1 and 2 heads per rank, 2 and 3 ranks
_SHARD_CASES = [(16, 2, 2, 5), (24, 4, 2, 7), (24, 6, 3, 6)]


def shard_variant(x, params, h, world_size, variant="ok"):
    """Every rank's output (P, B, T, D) of tensor-parallel RoPE attention,
    float64, or one known mistake."""
    d = params["w_o"].shape[0]
    # merged
    heads = chunked_variant(
        x, params | {"w_o": np.eye(d), "b_o": np.zeros(d)}, h, (x.shape[1],)
    )[0]
    rows = [
        slice(r * d // world_size, (r + 1) * d // world_size)
        for r in range(world_size)
    ]
    # (B, T, D) per rank
    partial = [heads[..., cols] @ params["w_o"][cols] for cols in rows]
    b = params["b_o"]
    if variant == "not-reduced":
        return np.stack([p + b for p in partial])
    if variant == "bias-per-rank":
        return np.stack([sum(partial) + world_size * b] * world_size)
    if variant == "reduced-heads":
        # (B, T, D / P): unrelated heads added
        summed = sum(heads[..., cols] for cols in rows)
        return np.stack([summed @ params["w_o"][cols] + b for cols in rows])
    return np.stack([sum(partial) + b] * world_size)


def check_capstone_sharding(cls, fn, *, timeout: float = 60.0):
    """Check ``fn(module, x, world_size)`` -> (P, B, T, D): each rank's output
    of ``module`` (a ``cls(d_model, num_heads)``, the capstone's
    CachedRopeAttention with known weights) run tensor-parallel over its heads
    on ``world_size`` real processes (each rank computes its heads with its
    slices of w_q, w_k, w_v and w_o, then an all-reduce sums the partial
    outputs and the bias is added once). Every rank's output must equal the
    whole module's causal RoPE attention over x, and what ran where is counted
    (:class:`~.observe.RankScores`): no rank computes more than its heads'
    scores, the launching process none (``[shard-not-split]``)."""
    label = display_name(fn, "sharded")
    atol, rtol = 2e-5, 1e-4

    def body():
        rng = np.random.default_rng(13)
        for n, (d, h, p, t) in enumerate(_SHARD_CASES, 1):
            case = (
                f"case {n} of {len(_SHARD_CASES)}: d_model={d}, "
                f"num_heads={h}, {p} processes, x (2, {t}, {d})"
            )
            params = numpy_ref.init_mha_params(d, seed=40 + n)
            torch.manual_seed(0)
            module = call(
                cls,
                {"d_model": d, "num_heads": h},
                display_name(cls, "module"),
                positional=2,
            )
            module.eval()
            _load(module, params, case)
            x = rng.standard_normal((2, t, d))
            with observe.RankScores(d // h, t) as ranks:
                result = call(
                    fn,
                    {
                        "module": module,
                        "x": torch.tensor(x, dtype=torch.float32),
                        "world_size": p,
                    },
                    label,
                    positional=3,
                )
            got = as_array(result, "result", case)
            expected = shard_variant(x, params, h, p)
            if close(got, expected, atol, rtol):
                _check_split(ranks.counts(), 2 * (h // p) * t * t, case)
                continue
            candidates = [
                (
                    code,
                    detail,
                    lambda v=v: (shard_variant(x, params, h, p, v), None),
                )
                for code, detail, v in (
                    ("g-forward-not-reduced", "", "not-reduced"),
                    ("tp-bias-per-rank", str(p), "bias-per-rank"),
                    (
                        "allreduce-before-output-projection",
                        "the ranks' heads "
                        "added together, then each rank's rows of w_o",
                        "reduced-heads",
                    ),
                )
            ]
            diagnose(
                got,
                None,
                candidates,
                case,
                expected,
                None,
                what="outputs (P, B, T, D)",
                atol=atol,
                rtol=rtol,
            )
        return (
            f"✓ {label}: {len(_SHARD_CASES)} problems on 2 and 3 real "
            "processes, the heads split between the "
            "ranks: every rank's output equals the whole module's"
        )

    observe.warm_up()
    run_check(body, timeout)


def _check_split(counts, share: int, case: str) -> None:
    """What ran where: the launching process computes no attention scores, and
    no rank more than its heads' share (``share`` query-key scores). Nothing
    seen at all (scores computed outside PyTorch, or in processes that did not
    inherit the watch) is refused: a split nobody saw is no split proven."""
    here, ranks = counts
    if not here and not any(ranks):
        raise fail(
            "shard-not-seen",
            detail="no process computed query-key scores with PyTorch "
            "where the check can count them",
            case=case,
        )
    if here:
        raise fail(
            "shard-not-split",
            detail=f"the launching process itself computed {here} "
            "query-key scores",
            case=case,
        )
    if any(n > share for n in ranks):
        raise fail(
            "shard-not-split",
            detail=f"your ranks computed {sorted(ranks)} query-key scores "
            "each, where "
            f"one rank's heads need {share}",
            case=case,
        )


choice_question(
    "capstone1.induction-layer",
    answer="B",
    why="to attend to the token AFTER an earlier copy of the current "
    "one, a key must carry what came just before "
    "it; only a first-layer head (a previous-token head) can write that "
    "into the stream, so the head that "
    "matches it reads the first layer's output: it sits in the second layer.",
    wrong={
        "A": "a first-layer head sees each position's own token (and, "
        "with RoPE, distances): no key there knows "
        "its previous token yet, so none can be matched against the current "
        "one.",
        "C": "the two layers do different halves of the circuit: the "
        "first moves each token's predecessor into "
        "it, the second matches the current token against those predecessors.",
    },
)
