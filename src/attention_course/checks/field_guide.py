"""Checks of the field guide's own bugs (chapter 7): layers created inside
forward(), additive float masks."""

from __future__ import annotations

import numpy as np
import torch

from .runner import (
    DEFAULT_TIMEOUT,
    as_array,
    call,
    display_name,
    fail,
    run_check,
    shape_text,
)


def check_layers_created_once(cls, *, timeout: float = DEFAULT_TIMEOUT):
    """Check that ``cls(d_model, num_heads)`` is a fixed function of its input
    and its state_dict.

    Built with dropout off and in ``.eval()`` mode, ``module(x, x, x)`` on x
    (B, T, D) must give the same output on two calls, and a second instance
    loaded with the first one's ``state_dict`` must give that output too. Both
    fail when a layer is created inside forward(): its weights are drawn anew
    on every call.
    """
    label = display_name(cls, "MultiHeadAttention")

    def body():
        d_model, num_heads = 12, 3
        case = (
            f"{label}({d_model}, {num_heads}).eval(), self-attention on "
            f"x (2, 5, {d_model})"
        )
        torch.manual_seed(0)
        module = call(
            cls,
            {"d_model": d_model, "num_heads": num_heads},
            label,
            positional=2,
        ).eval()
        copy = call(
            cls,
            {"d_model": d_model, "num_heads": num_heads},
            label,
            positional=2,
        ).eval()
        copy.load_state_dict(module.state_dict())
        x = torch.randn(2, 5, d_model)
        with torch.no_grad():
            outputs = [
                as_array(
                    call(
                        m,
                        {"query": x, "key": x, "value": x},
                        label,
                        positional=3,
                    ),
                    "output",
                    case,
                )
                for m in (module, module, copy)
            ]
        if not np.allclose(outputs[0], outputs[1], atol=1e-6):
            raise fail(
                "layer-created-in-forward",
                detail="two calls on the same input in .eval() mode, with no "
                "dropout, gave different outputs",
                case=case,
            )
        if not np.allclose(outputs[0], outputs[2], atol=1e-6):
            raise fail(
                "layer-created-in-forward",
                detail="a copy loaded with its state_dict gives a "
                "different output",
                case=case,
            )
        return (
            f"✓ {label}: deterministic in .eval() mode, and a copy "
            "loaded with its state_dict gives the same output"
        )

    run_check(body, timeout)


def _reference_additive(mask: np.ndarray) -> np.ndarray:
    return np.where(mask, 0.0, -np.inf)


def check_additive_mask(fn, *, timeout: float = DEFAULT_TIMEOUT):
    """Check ``fn(mask)`` -> additive float mask: for a boolean torch ``mask``
    (True = may attend) a float tensor of the same shape, 0 where allowed and
    -inf (or any number <= -1e4) where hidden, to be added to the scores."""
    label = display_name(fn, "additive_mask")

    def body():
        gen = torch.Generator().manual_seed(0)
        masks = [
            (
                "a causal mask (4, 4)",
                torch.ones(4, 4, dtype=torch.bool).tril(),
            ),
            (
                "a padding mask (2, 1, 1, 5)",
                torch.arange(5) < torch.tensor([3, 5])[:, None, None, None],
            ),
            ("a random mask (3, 6)", torch.rand(3, 6, generator=gen) < 0.5),
        ]
        for i, (text, mask) in enumerate(masks, 1):
            case = f"case {i} of {len(masks)}: {text}"
            result = call(fn, {"mask": mask.clone()}, label, positional=1)
            if (
                isinstance(result, torch.Tensor)
                and not result.dtype.is_floating_point
            ):
                raise fail(
                    "wrong-type",
                    f"Your result has dtype {result.dtype}; an additive "
                    "mask is a float tensor "
                    "(0 where allowed, -inf where hidden). PyTorch reads a "
                    "bool attn_mask as a selection, not "
                    "as numbers to add.",
                    case=case,
                )
            out = as_array(result, "result", case)
            allowed = mask.numpy()
            if out.shape != allowed.shape:
                raise fail(
                    "wrong-shape",
                    f"Your mask has shape {shape_text(out.shape)}; it must "
                    "have the shape of "
                    f"the boolean mask, {shape_text(allowed.shape)}.",
                    case=case,
                )
            hidden_ok = np.all(out[~allowed] <= -1e4)
            if np.all(out[allowed] == 0) and hidden_ok:
                continue
            if np.array_equal(out, allowed.astype(float)):
                raise fail(
                    "float-mask-not-additive",
                    detail="1 where allowed, 0 where hidden",
                    case=case,
                )
            if np.all(out[~allowed] >= 1e4):
                raise fail(
                    "mask-wrong-sign",
                    detail="+1e10 or +inf where hidden",
                    case=case,
                )
            if np.all(out[allowed] <= -1e4) and np.all(out[~allowed] == 0):
                raise fail(
                    "mask-inverted",
                    detail="your float mask is large and negative where "
                    "attending is allowed "
                    "and 0 where it is not",
                    case=case,
                )
            raise fail(
                "wrong-output",
                "Your float mask differs from the additive mask (0 where "
                "allowed, -inf where "
                "hidden) and matches none of the mistakes this checker knows.",
                case=case,
            )
        return (
            f"✓ {label}: {len(masks)} boolean masks become additive "
            "float masks (0 allowed, -inf hidden)"
        )

    run_check(body, timeout)
