"""Checks of chapter 8: the size of a KV cache, repeating key/value heads,
grouped-query attention."""

from __future__ import annotations

import contextlib
import itertools
import math

import numpy as np

from .. import numpy_ref
from ..mistakes import hint
from .cases import make_mask, mixed_mask, to_framework
from .diagnosis import core_variants, diagnose, sdpa_variant
from .questions import number_question
from .runner import (
    DEFAULT_TIMEOUT,
    CheckFailed,
    as_array,
    as_number,
    call,
    close,
    display_name,
    fail,
    run_check,
    shape_text,
    split_result,
    type_name,
)

# The factors of a KV cache's size, in the order of kv_cache_bytes' arguments
# (the 2 of keys AND values first):
# (name, what leaving it out means). The hints explain one factor each; they
# never spell out the whole formula.
_CACHE_FACTORS = (
    ("the factor 2", "the cache holds the keys AND the values"),
    ("num_layers", "every attention layer caches its own keys and values"),
    ("num_kv_heads", "each layer caches num_kv_heads key/value heads"),
    ("head_dim", "each key/value head caches head_dim numbers per token"),
    (
        "seq_len",
        "without it you have the size of ONE token's keys and values, and "
        "the cache holds seq_len tokens",
    ),
    ("batch_size", "every sequence of the batch has its own cache"),
    (
        "bytes_per_element",
        "you counted numbers, not bytes: a float16 number takes 2 bytes, a "
        "float32 number 4",
    ),
)

# (num_layers, num_kv_heads, head_dim, seq_len, batch_size, bytes_per_element);
# None = left out (default 1 / 2).
_CACHE_CASES = [
    (4, 8, 32, 100, 3, 4),
    (32, 32, 128, 4096, None, None),  # Llama 2 7B (MHA), float16, defaults
    (32, 8, 128, 4096, 16, 2),  # GQA, 16 sequences
    (80, 8, 128, 2048, 4, 2),  # Llama 2 70B
    (2, 1, 64, 7, 1, 1),  # MQA, one byte per number
    (12, 12, 64, 1024, 8, None),
    (6, 2, 16, 50, None, 8),
]

_CACHE_UNITS = [
    (2**10, "KiB"),
    (2**20, "MiB"),
    (2**30, "GiB"),
    (10**3, "kB"),
    (10**6, "MB"),
    (10**9, "GB"),
]


def _cache_known_mistakes(cases):
    """(code, message, expected answers) for each known mistake: one or two
    factors left out, a unit other than bytes. ``cases`` are the full argument
    tuples (defaults filled in)."""
    out = []
    for size in (1, 2):
        for subset in itertools.combinations(range(len(_CACHE_FACTORS)), size):
            values = []
            for args in cases:
                factors = (2,) + tuple(args)
                values.append(
                    math.prod(factors) // math.prod(factors[i] for i in subset)
                )
            if subset == (0,):
                code, message = "cache-keys-only", None
            else:
                code = "cache-missing-factor"
                parts = [
                    f"{name} ({why})"
                    for name, why in (_CACHE_FACTORS[i] for i in subset)
                ]
                message = hint(
                    code,
                    parts[0]
                    if size == 1
                    else f"two factors: {' and '.join(parts)}",
                )
            out.append((code, message, values))
    right = [math.prod((2,) + tuple(args)) for args in cases]
    for divisor, unit in _CACHE_UNITS:
        out.append(
            (
                "wrong-value",
                f"Your answer is the size in {unit} (bytes / {divisor:,}); "
                "return the number of "
                "bytes, unrounded.",
                [r / divisor for r in right],
            )
        )
    out.append(
        (
            "wrong-value",
            "Your answer is 8 times too large: bits instead of bytes? "
            "bytes_per_element is "
            "already in bytes.",
            [8 * r for r in right],
        )
    )
    return out


def check_kv_cache_bytes(fn, *, timeout: float = DEFAULT_TIMEOUT):
    """Check ``fn(num_layers, num_kv_heads, head_dim, seq_len, batch_size=1,
    bytes_per_element=2)`` -> the number of bytes of a KV cache: keys and
    values of every layer, for ``batch_size`` sequences of ``seq_len`` tokens
    (:func:`attention_course.kv_cache.cache_bytes_per_token` times ``seq_len *
    batch_size``). Called with and without the two optional arguments; an
    ``int`` (or a float or 0-d tensor of the same value) is expected. Diagnoses
    a factor left out (``[cache-keys-only]`` for the 2 of keys and values,
    ``[cache-missing-factor]``), and answers in KiB/MiB/GiB or bits."""
    label = "kv_cache_bytes"

    def body():
        full = [
            tuple(a[:4])
            + (1 if a[4] is None else a[4], 2 if a[5] is None else a[5])
            for a in _CACHE_CASES
        ]
        answers = []
        for i, args in enumerate(_CACHE_CASES, 1):
            kwargs = {
                "num_layers": args[0],
                "num_kv_heads": args[1],
                "head_dim": args[2],
                "seq_len": args[3],
            }
            if args[4] is not None:
                kwargs["batch_size"] = args[4]
            if args[5] is not None:
                kwargs["bytes_per_element"] = args[5]
            text = (
                f"{label}({', '.join(map(str, args[:4]))}"
                + "".join(
                    f", {k}={v}"
                    for k, v in kwargs.items()
                    if k in ("batch_size", "bytes_per_element")
                )
                + ")"
            )
            case = f"case {i} of {len(_CACHE_CASES)}: {text}"
            got = call(fn, kwargs, label, positional=4, call_text=text)
            if got is None:
                raise fail("returned-none", case=case)
            number = as_number(got)
            if number is None:
                raise fail(
                    "wrong-type",
                    f"Your function returned a {type_name(got)}; expected a "
                    "number of bytes "
                    "(an int).",
                    case=case,
                )
            answers.append((number, case))
        expected = [math.prod((2,) + args) for args in full]
        wrong = [
            i
            for i, ((got, _), want) in enumerate(
                zip(answers, expected, strict=True)
            )
            if got != want
        ]
        if not wrong:
            return (
                f"✓ {display_name(fn, label)}: {len(_CACHE_CASES)} model "
                "sizes (MHA, GQA and MQA; with and without "
                "batch_size and bytes_per_element) are right"
            )
        case = answers[wrong[0]][1]
        got = [a for a, _ in answers]
        for code, message, values in _cache_known_mistakes(full):
            if all(
                math.isclose(g, v, rel_tol=1e-6)
                for g, v in zip(got, values, strict=True)
            ):
                raise fail(code, message, case=case)
        raise fail(
            "wrong-value",
            f"{got[wrong[0]]:,} is not the number of bytes of this cache, "
            "and it matches none "
            "of the mistakes this checker knows. Which numbers does the "
            "cache hold, and how many bytes does "
            "each take?",
            case=case,
        )

    run_check(body, timeout)


def _head_sources(h_kv: int, n_rep: int, tiled: bool) -> list[int]:
    """The input key/value head that each of the H_kv * n_rep output heads
    copies."""
    return [h % h_kv if tiled else h // n_rep for h in range(h_kv * n_rep)]


# (B, H_kv, T, Dh, n_rep); a tile and a repeat differ only when H_kv > 1 and
# n_rep > 1: those come first.
_REPEAT_KV_CASES = [
    (2, 2, 3, 4, 3),
    (1, 3, 5, 2, 2),
    (2, 1, 4, 8, 4),
    (3, 2, 1, 4, 2),
    (2, 3, 6, 4, 1),
    (1, 2, 7, 16, 4),
]


def check_repeat_kv(fn, *, timeout: float = DEFAULT_TIMEOUT):
    """Check ``fn(x, n_rep)``: x a float32 torch tensor (B, H_kv, T, Dh) -> (B,
    H_kv * n_rep, T, Dh) in which output head h is input head ``h // n_rep``
    (each key/value head repeated n_rep times in a row, as
    :func:`attention_course.kv_cache.repeat_kv` and
    ``x.repeat_interleave(n_rep, dim=1)``); x must not be modified. Diagnoses
    ``[kv-heads-tiled]`` (``x.repeat(1, n_rep, 1, 1)``: head h is input head h
    % H_kv)."""
    label = "repeat_kv"

    def body():
        rng = np.random.default_rng(8)
        for i, (b, h_kv, t, dh, n_rep) in enumerate(_REPEAT_KV_CASES, 1):
            x = rng.standard_normal((b, h_kv, t, dh))
            case = (
                f"case {i} of {len(_REPEAT_KV_CASES)}: x of shape "
                f"{shape_text(x.shape)}, n_rep={n_rep}"
            )
            out = as_array(
                call(
                    fn, {"x": to_framework(x, "torch"), "n_rep": n_rep}, label
                ),
                "result",
                case,
            )
            ref = np.repeat(x, n_rep, axis=1)
            if close(out, ref, 1e-6, 1e-6):
                continue
            if out.shape != ref.shape:
                advice = ""
                if out.shape == (b, h_kv, n_rep, t, dh):
                    advice = (
                        " You have the repeated heads on an axis of "
                        "their own: merge (H_kv, n_rep) into one axis."
                    )
                elif (
                    out.ndim == 4
                    and out.shape[1] == h_kv
                    and out.size == ref.size
                ):
                    advice = (
                        " You repeated along another axis: the heads "
                        "are axis 1."
                    )
                raise fail(
                    "wrong-shape",
                    f"Your result has shape {shape_text(out.shape)}; "
                    "expected (B, H_kv * n_rep, "
                    f"T, Dh) = {shape_text(ref.shape)}.{advice}",
                    case=case,
                )
            tiled = _head_sources(h_kv, n_rep, tiled=True)
            detail = (
                f"for H_kv={h_kv} and n_rep={n_rep} your output heads copy "
                f"the input heads {tiled}, in "
                "groups they would be "
                f"{_head_sources(h_kv, n_rep, tiled=False)}"
            )
            candidates = [
                (
                    "kv-heads-tiled",
                    detail,
                    lambda x=x, n_rep=n_rep: (
                        np.tile(x, (1, n_rep, 1, 1)),
                        None,
                    ),
                )
            ]
            diagnose(
                out,
                None,
                candidates,
                case,
                ref,
                None,
                what="result",
                atol=1e-6,
                rtol=1e-6,
            )
        return (
            f"✓ {display_name(fn, label)}: {len(_REPEAT_KV_CASES)} random "
            "cases (H_kv from 1 to 3, n_rep from 1 "
            "to 4; (B, H_kv, T, Dh) -> (B, H_kv * n_rep, T, Dh)) match the "
            "reference"
        )

    run_check(body, timeout)


# (B, H, H_kv, Tq, Tk, Dk, Dv, mask kind): ordinary multi-head attention (H_kv
# = H) first, then multi-query (H_kv = 1, where even code that forgets to
# repeat the heads runs, by broadcasting), then grouped-query.
_GQA_CASES = [
    (2, 4, 4, 5, 5, 8, 8, None),
    (2, 4, 1, 1, 6, 8, 8, None),
    (2, 4, 2, 1, 7, 8, 8, None),
    (1, 6, 2, 4, 4, 8, 4, None),
    (2, 4, 4, 6, 6, 8, 8, "causal"),
    (3, 4, 1, 5, 5, 8, 8, "causal"),
    (2, 4, 2, 6, 6, 8, 8, "causal"),
    (2, 8, 2, 3, 9, 4, 4, "causal"),
    (1, 4, 1, 6, 10, 8, 8, "causal"),
    (2, 6, 3, 1, 8, 8, 8, "padding"),
    (2, 4, 2, 4, 7, 8, 6, "padding"),
    (2, 4, 2, 5, 5, 8, 8, "random"),
    (2, 4, 4, 3, 6, 8, 8, "random-full"),
    (2, 6, 2, 4, 6, 8, 8, "random-full"),
    (3, 4, 2, 1, 5, 8, 8, "padding-empty"),
    (2, 4, 2, 4, 4, 8, 8, "random-empty"),
    (2, 8, 4, 3, 3, 4, 4, "padding-empty"),
]


def _gqa_cases(seed=9):
    rng = np.random.default_rng(seed)
    for b, h, h_kv, tq, tk, dk, dv, kind in _GQA_CASES:
        q = rng.standard_normal((b, h, tq, dk))
        k = rng.standard_normal((b, h_kv, tk, dk))
        v = rng.standard_normal((b, h_kv, tk, dv))
        if kind == "random-full":
            mask = mixed_mask(rng, (b, h, tq, tk))
            mask_text = f"random mask of shape {shape_text(mask.shape)}"
        else:
            mask, mask_text = make_mask(kind, rng, (b, h), tq, tk)
        heads = "MHA" if h_kv == h else "MQA" if h_kv == 1 else "GQA"
        desc = (
            f"{heads}, H={h}, H_kv={h_kv}: q {shape_text(q.shape)}, k "
            f"{shape_text(k.shape)}, "
            f"v {shape_text(v.shape)}, {mask_text}"
        )
        yield q, k, v, mask, desc


@contextlib.contextmanager
def _grouped_heads_note(h, h_kv):
    """When code that ran for H_kv = H (and H_kv = 1) raises with 1 < H_kv < H,
    say what differs."""
    try:
        yield
    except CheckFailed as err:
        if err.code != "raised-exception" or h_kv in (1, h):
            raise
        raise CheckFailed(
            f"{err}\n  Here q has H={h} heads and k, v have H_kv={h_kv}: "
            "query head h uses key/value "
            "head h // (H / H_kv), so each key/value head must be repeated "
            f"H / H_kv = {h // h_kv} "
            "times (in a row) before the matrix products."
        ) from None


def check_grouped_query_attention(fn, *, timeout: float = DEFAULT_TIMEOUT):
    """Check grouped-query attention ``fn(q, k, v, mask=None)`` (multi-query
    attention when H_kv = 1).

    q (B, H, Tq, Dk), k (B, H_kv, Tk, Dk), v (B, H_kv, Tk, Dv) are float32
    torch tensors with H_kv dividing H; ``mask`` is None or a boolean tensor
    broadcastable to (B, H, Tq, Tk), True = may attend. Query head h attends
    with key/value head ``h // (H / H_kv)``. ``fn`` returns out (B, H, Tq, Dv)
    or (out, weights (B, H, Tq, Tk)), compared with
    :func:`numpy_ref.scaled_dot_product_attention` of q and the repeated keys
    and values. Cases: H_kv = H, H_kv = 1 and in between; decoding (Tq = 1),
    chunks with a bottom-right causal mask (Tq < Tk), padding masks (B, 1, 1,
    Tk), per-head masks, fully masked rows (which must give zeros). Diagnoses
    ``[kv-heads-tiled]`` and the attention mistakes of
    :func:`check_scaled_dot_product_attention`.
    """
    label = "grouped_query_attention"
    atol, rtol = 2e-5, 1e-4

    def body():
        cases = list(_gqa_cases())
        for i, (q, k, v, mask, desc) in enumerate(cases, 1):
            case = f"case {i} of {len(cases)}: {desc}"
            h, h_kv = q.shape[1], k.shape[1]
            n_rep = h // h_kv
            args = {
                "q": to_framework(q, "torch"),
                "k": to_framework(k, "torch"),
                "v": to_framework(v, "torch"),
                "mask": to_framework(mask, "torch"),
            }
            with _grouped_heads_note(h, h_kv):
                result = call(fn, args, label, positional=3)
            out_s, w_s = split_result(result, case)
            out_s = as_array(
                out_s, "output" if w_s is not None else "result", case
            )
            w_s = None if w_s is None else as_array(w_s, "weights", case)
            # (B, H, Tk, D)
            k_rep, v_rep = (
                np.repeat(k, n_rep, axis=1),
                np.repeat(v, n_rep, axis=1),
            )
            ref_out, ref_w = numpy_ref.scaled_dot_product_attention(
                q, k_rep, v_rep, mask
            )
            if close(out_s, ref_out, atol, rtol) and (
                w_s is None or close(w_s, ref_w, atol, rtol)
            ):
                continue
            tq, dk = q.shape[-2:]
            tk, dv = v.shape[-2:]
            candidates = []
            if 1 < h_kv < h:  # a tile and a repeat only differ here
                k_tile, v_tile = (
                    np.tile(k, (1, n_rep, 1, 1)),
                    np.tile(v, (1, n_rep, 1, 1)),
                )
                detail = (
                    f"for H={h} and H_kv={h_kv} your query heads use the "
                    "key/value heads "
                    f"{_head_sources(h_kv, n_rep, tiled=True)}, in groups "
                    "they would be "
                    f"{_head_sources(h_kv, n_rep, tiled=False)}"
                )
                candidates.append(
                    (
                        "kv-heads-tiled",
                        detail,
                        lambda: sdpa_variant(q, k_tile, v_tile, mask),
                    )
                )
            candidates += [
                (c, d, lambda kw=kw: sdpa_variant(q, k_rep, v_rep, mask, **kw))
                for c, d, kw in core_variants(
                    dk, dv, tq, tk, 4, mask is not None, True
                )
            ]
            diagnose(
                out_s,
                w_s,
                candidates,
                case,
                ref_out,
                ref_w,
                atol=atol,
                rtol=rtol,
            )
        return (
            f"✓ {display_name(fn, label)}: {len(cases)} random cases (MHA, "
            "GQA and MQA head counts; decoding with "
            "Tq = 1, Tq != Tk, causal and padding masks, fully masked rows) "
            "match the reference"
        )

    run_check(body, timeout)


# -----------------------------------------------------------------------------
# Checked questions of chapter 8 (see .questions)
# -----------------------------------------------------------------------------

number_question(
    "8.cache-gib",
    answer=2.0,
    rtol=1e-3,
    why="2 (K and V) x 32 layers x 32 heads x 128 features x 2 bytes = "
    "512 KiB per token; x 4096 tokens = 2 GiB.",
    known={
        1.0: (
            "cache-keys-only",
            "1 GiB counts the keys only: the cache holds keys AND values.",
        ),
        4.0: (
            "cache-missing-factor",
            "4 GiB is float32 (4 bytes per number); the model stores float16.",
        ),
        0.5: (
            "cache-missing-factor",
            "0.5 GiB is what grouped-query attention with 8 key/value heads "
            "would need; "
            "this model caches all 32 heads.",
        ),
    },
    hint="Multiply: 2 (keys and values) x layers x heads x head size x "
    "bytes x tokens, then divide by 2^30.",
)
number_question(
    "8.gqa-saving",
    answer=4,
    why="the cache holds H_kv = 8 key/value heads instead of H = 32: it "
    "is H / H_kv = 4 times smaller.",
    known={
        8: "8 is H_kv, the number of key/value heads; the saving is H / H_kv.",
        32: "32 is what multi-query attention (H_kv = 1) saves.",
    },
    hint="How many key/value heads does each layer cache, with MHA and "
    "with GQA?",
)
number_question(
    "8.kv-head-of",
    answer=1,
    why="with H = 6 and H_kv = 2, n = 3 query heads share each "
    "key/value head: heads 0-2 use 0, heads 3-5 use 1; "
    "4 // 3 = 1.",
    known={
        0: (
            "kv-heads-tiled",
            "0 = 4 % 2 is the tiled order (0, 1, 0, 1, ...): query heads "
            "are grouped, "
            "h // n, not h % H_kv.",
        )
    },
    hint="Query head h uses key/value head h // (H / H_kv).",
)
