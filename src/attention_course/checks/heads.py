"""Checks of splitting a (B, T, D) tensor into heads (B, H, T, Dh) and merging
them back (chapter 3)."""

from __future__ import annotations

import numpy as np

from .. import numpy_ref
from .cases import to_framework
from .diagnosis import diagnose
from .questions import choice_question, number_question
from .runner import (
    DEFAULT_TIMEOUT,
    as_array,
    call,
    close,
    display_name,
    run_check,
    shape_text,
)

_HEAD_SHAPES = [
    (2, 5, 12, 3),
    (1, 4, 8, 2),
    (3, 6, 16, 4),
    (2, 3, 6, 6),
    (2, 7, 12, 2),
]


def check_split_heads(fn, *, timeout: float = DEFAULT_TIMEOUT):
    """Check ``fn(x, num_heads)``: (B, T, D) torch tensor -> (B, H, T, Dh)."""

    def body():
        rng = np.random.default_rng(3)
        for i, (b, t, d, h) in enumerate(_HEAD_SHAPES, 1):
            x = rng.standard_normal((b, t, d))
            case = (
                f"case {i} of {len(_HEAD_SHAPES)}: x of shape "
                f"{shape_text(x.shape)}, num_heads={h}"
            )
            out = as_array(
                call(
                    fn,
                    {"x": to_framework(x, "torch"), "num_heads": h},
                    "split_heads",
                ),
                "result",
                case,
            )
            ref = numpy_ref.split_heads(x, h)
            if close(out, ref, 1e-6, 1e-6):
                continue
            candidates = [
                (
                    "heads-split-without-transpose",
                    "",
                    lambda x=x, h=h: (x.reshape(b, h, t, d // h), None),
                ),
                (
                    "heads-split-without-transpose",
                    "",
                    lambda x=x, h=h: (x.reshape(b, t, h, d // h), None),
                ),
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
            f"✓ {display_name(fn, 'split_heads')}: {len(_HEAD_SHAPES)} "
            "random cases ((B, T, D) -> (B, H, T, Dh)) "
            "match the reference"
        )

    run_check(body, timeout)


def check_merge_heads(fn, *, timeout: float = DEFAULT_TIMEOUT):
    """Check ``fn(x)``: (B, H, T, Dh) torch tensor -> (B, T, D) with D = H *
    Dh."""

    def body():
        rng = np.random.default_rng(4)
        for i, (b, t, d, h) in enumerate(_HEAD_SHAPES, 1):
            x = rng.standard_normal((b, h, t, d // h))
            case = (
                f"case {i} of {len(_HEAD_SHAPES)}: x of shape "
                f"{shape_text(x.shape)}"
            )
            out = as_array(
                call(fn, {"x": to_framework(x, "torch")}, "merge_heads"),
                "result",
                case,
            )
            ref = numpy_ref.merge_heads(x)
            if close(out, ref, 1e-6, 1e-6):
                continue
            candidates = [
                (
                    "merge-heads-wrong-order",
                    "",
                    lambda x=x: (x.reshape(b, t, d), None),
                ),
                (
                    "merge-heads-wrong-order",
                    "",
                    lambda x=x: (
                        x.transpose(0, 2, 3, 1).reshape(b, t, d),
                        None,
                    ),
                ),
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
            f"✓ {display_name(fn, 'merge_heads')}: {len(_HEAD_SHAPES)} "
            "random cases ((B, H, T, Dh) -> (B, T, D)) "
            "match the reference"
        )

    run_check(body, timeout)


# -----------------------------------------------------------------------------
# Checked questions of chapter 3 (see .questions)
# -----------------------------------------------------------------------------

number_question(
    "3.split-entry",
    answer=14,
    why="with 3 heads of 2 features, head 2 owns features 4 and 5; its "
    "feature 0 is feature 4 of the model, at "
    "position 1: 10 * 1 + 4 = 14.",
    known={
        22: (
            "heads-split-without-transpose",
            "22 is what reshaping (B, T, D) straight to (B, H, T, Dh) "
            "gives: the "
            "flat memory is cut into heads before the positions are "
            "separated.",
        ),
        24: (
            "heads-split-without-transpose",
            "24 is what transposing (B, T, D) to (B, D, T) and then reshaping "
            "gives: the transpose must come AFTER the reshape to (B, T, H, "
            "Dh).",
        ),
        12: "12 is feature 2 of the model: head 2's features start at 2 "
        "* Dh = 4, not at 2.",
    },
    hint="Head h holds features h * Dh .. (h + 1) * Dh - 1 of every position.",
)
number_question(
    "3.param-count",
    answer=4 * 768 * 768 + 4 * 768,
    why="four 768 x 768 projections (q, k, v, o) and four biases of "
    "768; the heads share them (each uses a slice), "
    "so the count does not depend on H.",
    known={
        3 * 768 * 768 + 3 * 768: (
            "missing-output-projection",
            "that counts w_q, w_k and w_v only: the output "
            "projection w_o has as many parameters again.",
        ),
        4 * 768 * 768: "that leaves out the four bias vectors of 768 numbers.",
        12
        * (
            4 * 768 * 768 + 4 * 768
        ): "the heads do not own full projections each: they share four D x D "
        "matrices, head h using its slice of columns.",
    },
    hint="Count the weights and biases of the four projections q, k, v and o.",
)
choice_question(
    "3.head-width",
    answer="B",
    why="w_q maps d_model = 512 features to H * head_dim = 8 * 32 = "
    "256; nn.Linear stores its weight as "
    "(d_out, d_in) = (256, 512). w_o maps the 256 merged features back to "
    "512.",
    wrong={
        "A": "(512, 512) holds only when head_dim = d_model / H = 64; "
        "here the heads are 32 wide.",
        "C": (
            "weight-not-transposed",
            "(512, 256) is (d_in, d_out): nn.Linear stores its weight the "
            "other way, as "
            "(d_out, d_in).",
        ),
        "D": "(8, 512, 32) is a per-head layout (as einsum code or Keras "
        "may store it), not an nn.Linear weight.",
    },
)
