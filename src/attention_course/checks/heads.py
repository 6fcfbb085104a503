"""Checks of splitting a (B, T, D) tensor into heads (B, H, T, Dh) and merging them back (chapter 3)."""

from __future__ import annotations

import numpy as np

from .. import numpy_ref
from .cases import to_framework
from .diagnosis import diagnose
from .runner import DEFAULT_TIMEOUT, as_array, call, close, display_name, run_check, shape_text

_HEAD_SHAPES = [(2, 5, 12, 3), (1, 4, 8, 2), (3, 6, 16, 4), (2, 3, 6, 6), (2, 7, 12, 2)]


def check_split_heads(fn, *, timeout: float = DEFAULT_TIMEOUT):
    """Check ``fn(x, num_heads)``: (B, T, D) torch tensor -> (B, H, T, Dh)."""

    def body():
        rng = np.random.default_rng(3)
        for i, (b, t, d, h) in enumerate(_HEAD_SHAPES, 1):
            x = rng.standard_normal((b, t, d))
            case = f"case {i} of {len(_HEAD_SHAPES)}: x of shape {shape_text(x.shape)}, num_heads={h}"
            out = as_array(call(fn, {"x": to_framework(x, "torch"), "num_heads": h}, "split_heads"), "result",
                            case)
            ref = numpy_ref.split_heads(x, h)
            if close(out, ref, 1e-6, 1e-6):
                continue
            candidates = [
                ("heads-split-without-transpose", "", lambda x=x, h=h: (x.reshape(b, h, t, d // h), None)),
                ("heads-split-without-transpose", "", lambda x=x, h=h: (x.reshape(b, t, h, d // h), None)),
            ]
            diagnose(out, None, candidates, case, ref, None, what="result", atol=1e-6, rtol=1e-6)
        return (f"✓ {display_name(fn, 'split_heads')}: {len(_HEAD_SHAPES)} random cases ((B, T, D) -> (B, H, T, Dh)) "
                "match the reference")

    run_check(body, timeout)


def check_merge_heads(fn, *, timeout: float = DEFAULT_TIMEOUT):
    """Check ``fn(x)``: (B, H, T, Dh) torch tensor -> (B, T, D) with D = H * Dh."""

    def body():
        rng = np.random.default_rng(4)
        for i, (b, t, d, h) in enumerate(_HEAD_SHAPES, 1):
            x = rng.standard_normal((b, h, t, d // h))
            case = f"case {i} of {len(_HEAD_SHAPES)}: x of shape {shape_text(x.shape)}"
            out = as_array(call(fn, {"x": to_framework(x, "torch")}, "merge_heads"), "result", case)
            ref = numpy_ref.merge_heads(x)
            if close(out, ref, 1e-6, 1e-6):
                continue
            candidates = [
                ("merge-heads-wrong-order", "", lambda x=x: (x.reshape(b, t, d), None)),
                ("merge-heads-wrong-order", "", lambda x=x: (x.transpose(0, 2, 3, 1).reshape(b, t, d), None)),
            ]
            diagnose(out, None, candidates, case, ref, None, what="result", atol=1e-6, rtol=1e-6)
        return (f"✓ {display_name(fn, 'merge_heads')}: {len(_HEAD_SHAPES)} random cases ((B, H, T, Dh) -> (B, T, D)) "
                "match the reference")

    run_check(body, timeout)
