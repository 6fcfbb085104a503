"""Checks of the mask builders (chapter 4): causal and padding masks, boolean,
True = may attend."""

from __future__ import annotations

import numpy as np

from .. import numpy_ref
from . import hidden
from .diagnosis import diagnose
from .questions import choice_question, number_question
from .runner import (
    DEFAULT_TIMEOUT,
    as_array,
    call,
    display_name,
    fail,
    run_check,
    shape_text,
)

_CAUSAL_TRUE = (
    "your mask is True for the future keys (like nn.MultiheadAttention's "
    "attn_mask); it must be True "
    "where query i may attend key j, i.e. j <= i + (Tk - Tq)"
)


def check_causal_mask(fn, *, timeout: float = DEFAULT_TIMEOUT):
    """Check ``fn(t_q, t_k=None)`` -> boolean (Tq, Tk) mask (torch or NumPy),
    True = may attend, bottom-right
    aligned: query i may attend key j iff j <= i + (Tk - Tq). Called as fn(t)
        and fn(t_q, t_k) with Tq <= Tk."""

    def body():
        calls = [
            (4,),
            (5, 5),
            (1,),
            (6,),
            (3, 7),
            (1, 6),
            (2, 3),
            (4, 9),
            *hidden.causal_sizes(),
        ]
        for i, sizes in enumerate(calls, 1):
            t_q, t_k = sizes[0], sizes[-1]
            text = f"causal_mask({', '.join(map(str, sizes))})"
            case = f"case {i} of {len(calls)}: {text}"
            args = (
                {"t_q": t_q} if len(sizes) == 1 else {"t_q": t_q, "t_k": t_k}
            )
            mask = as_array(
                call(fn, args, "causal_mask", call_text=text),
                "result",
                case,
                kind="bool",
            )
            ref = numpy_ref.causal_mask(t_q, t_k)
            if mask.shape == ref.shape and np.array_equal(mask, ref):
                continue
            ones = np.ones((t_q, t_k), dtype=bool)
            candidates = [
                ("mask-inverted", _CAUSAL_TRUE, lambda: (~ref, None)),
                ("mask-inverted", _CAUSAL_TRUE, lambda: (np.triu(ones), None)),
                (
                    "mask-inverted",
                    _CAUSAL_TRUE,
                    lambda: (np.triu(ones, 1), None),
                ),
                ("causal-top-left-aligned", "", lambda: (np.tril(ones), None)),
                (
                    "causal-excludes-diagonal",
                    "",
                    lambda: (np.tril(ones, t_k - t_q - 1), None),
                ),
                (
                    "causal-excludes-diagonal",
                    "",
                    lambda: (np.tril(ones, -1), None),
                ),
            ]
            diagnose(
                mask.astype(float),
                None,
                [
                    (c, d, lambda f=f: (f()[0].astype(float), None))
                    for c, d, f in candidates
                ],
                case,
                ref.astype(float),
                None,
                what="mask",
            )
        return (
            f"✓ {display_name(fn, 'causal_mask')}: {len(calls)} sizes (Tq "
            "== Tk and Tq < Tk, bottom-right aligned) "
            "match the reference"
        )

    run_check(body, timeout)


def check_padding_mask(
    fn, *, framework: str = "torch", timeout: float = DEFAULT_TIMEOUT
):
    """Check ``fn(lengths, t)`` -> boolean mask broadcastable to (B, 1, 1, T):
    key j of sequence b may be attended iff j < lengths[b]. ``lengths`` is a
    LongTensor (or a NumPy int array with ``framework="numpy"``)."""

    def body():
        batches = [
            ([3, 5, 1], 5),
            ([2, 2], 4),
            ([4], 6),
            ([6, 1, 3, 2], 6),
            ([0, 3], 3),
            ([7, 2, 5], 8),
            *hidden.padding_batches(),
        ]
        for i, (lengths, t) in enumerate(batches, 1):
            text = f"padding_mask({lengths}, {t})"
            case = f"case {i} of {len(batches)}: {text}"
            if framework == "torch":
                import torch  # here: chapter 1's mask check never needs it

                arg = torch.tensor(lengths, dtype=torch.long)
            else:
                arg = np.array(lengths)
            mask = as_array(
                call(
                    fn,
                    {"lengths": arg, "t": t},
                    "padding_mask",
                    call_text=text,
                ),
                "result",
                case,
                kind="bool",
            )
            ref = numpy_ref.padding_mask(lengths, t)  # (B, 1, 1, T)
            try:
                ok_shape = (
                    mask.ndim <= 4
                    and np.broadcast_shapes(mask.shape, ref.shape) == ref.shape
                )
            except ValueError:
                ok_shape = False
            if not ok_shape:
                hint = (
                    " A (B, T) mask would be lined up with the (Tq, Tk) "
                    "axes of the scores: add the two "
                    "singleton axes, e.g. mask[:, None, None, :]."
                    if mask.shape == (len(lengths), t)
                    else ""
                )
                raise fail(
                    "wrong-shape",
                    f"Your mask has shape {shape_text(mask.shape)}, which "
                    "does not broadcast to "
                    f"(B, 1, 1, T) = {shape_text(ref.shape)}.{hint}",
                    case=case,
                )
            full = np.broadcast_to(mask, ref.shape).astype(float)
            if np.array_equal(full, ref):
                continue
            pos = np.arange(t)[None, None, None, :]
            n = np.array(lengths)[:, None, None, None]
            candidates = [
                (
                    "mask-inverted",
                    "your mask is True at the padding positions; it must be "
                    "True for the real "
                    "tokens (j < lengths[b])",
                    lambda: ((~ref).astype(float), None),
                ),
                ("off-by-one", "", lambda: ((pos <= n).astype(float), None)),
                (
                    "off-by-one",
                    "",
                    lambda: ((pos < n - 1).astype(float), None),
                ),
            ]
            diagnose(
                full,
                None,
                candidates,
                case,
                ref.astype(float),
                None,
                what="mask",
            )
        return (
            f"✓ {display_name(fn, 'padding_mask')}: {len(batches)} batches "
            "of lengths match the reference (shape "
            "(B, 1, 1, T), True = may attend)"
        )

    run_check(body, timeout)


# -----------------------------------------------------------------------------
# Checked questions of chapter 4 (see .questions); the read-the-plot data is
# drawn from a seeded hidden choice
# -----------------------------------------------------------------------------


def mask_mystery(t_q: int = 3, t_k: int = 6, seed: int = 4) -> np.ndarray:
    """Chapter 4, read-the-plot: (t_q, t_k) attention weights of random queries
    and keys under the mask that question ``4.which-mask`` asks about."""
    rng = np.random.default_rng(seed)
    q, k = rng.standard_normal((t_q, 8)), rng.standard_normal((t_k, 8))
    # the hidden choice: bottom-right causal
    mask = np.tril(np.ones((t_q, t_k), dtype=bool), k=t_k - t_q)
    return numpy_ref.softmax(np.where(mask, q @ k.T / np.sqrt(8), -np.inf))


choice_question(
    "4.which-mask",
    answer="B",
    why="the last query sees every key and each earlier query one key "
    "fewer: the triangle is aligned bottom-right, "
    "as when 3 new tokens attend a cache of 6 (query i sees keys j <= i + "
    "Tk - Tq).",
    wrong={
        "A": (
            "causal-top-left-aligned",
            "a top-left triangle (is_causal=True: tril of a (3, 6) mask, "
            "diagonal kept) would let query 0 see key 0 only and the last "
            "query keys "
            "0..2.",
        ),
        "C": "a padding mask hides the same keys from EVERY query; here "
        "each query sees a different number of keys.",
        "D": (
            "causal-excludes-diagonal",
            "without the diagonal each query would see one key fewer: the "
            "last query "
            "would not see the last key.",
        ),
    },
)
number_question(
    "4.allowed-pairs",
    answer=35,
    why="query i sees min(i + 1, length) keys: sequence 0 (length 5): 1 "
    "+ 2 + 3 + 4 + 5 + 5 = 20 pairs; sequence 1 "
    "(length 3): 1 + 2 + 3 + 3 + 3 + 3 = 15; 20 + 15 = 35.",
    known={
        42: (
            "mask-ignored",
            "42 = 2 x 21 leaves out the padding masks: only the causal "
            "triangle is counted.",
        ),
        48: (
            "mask-ignored",
            "48 = 6 x 5 + 6 x 3 leaves out the causal mask: query i must "
            "not see the keys after i.",
        ),
        21: "the padding mask hides padded KEYS only; padded queries "
        "still attend (their outputs are ignored later).",
    },
    hint="Count sequence by sequence: how many keys may query i of each "
    "sequence attend?",
)
