"""Watching what the student's code does, not only what it returns: the scores it computes, the fused attention
calls it makes, and a fused kernel that behaves as older PyTorch versions do.

A check must prove what its exercise asks, and some of that never shows in a result: "compute only the tiles the
window needs" (a dense answer returns the same numbers), "pass the float mask to the fused function" (the boolean one
gives the same output), "guard the rows that may attend nothing" (PyTorch 2.13's kernels already return zeros there;
older ones return NaN). The checks run the student's call inside these observers:

* :class:`ScoreCounter` (a ``TorchDispatchMode``) counts the query-key dot products the code computes: the outputs
  of matrix products that contract over the feature width ``dk`` (``q @ k.T``, ``einsum``), broadcast products with
  ``dk`` as their last axis (``(q[:, None] * k).sum(-1)``) and fused attention kernels (Tq x Tk each);
* :class:`FusedAttentionCalls` (a ``TorchFunctionMode``) records every call of
  ``torch.nn.functional.scaled_dot_product_attention`` with the dtype of its ``attn_mask``, and makes it return NaN
  in the query rows whose mask allows no key, as PyTorch did before version 2.5 (and as some kernels still do), so
  that code relying on the installed kernel's zeros fails there.

* :class:`FormedTensors` (a ``TorchDispatchMode``) watches every tensor the code creates for one the exercise says
  not to form (MLA's keys, "without forming the keys"): a tensor holding the same numbers, in any layout, whole or one
  head's or one sequence's slice, is recorded.

They see torch operations in this process only. The grader calls a stand-in for the student's function, which runs
in the sandbox (:mod:`attention_course.course.sandbox`): there nothing is observed (:func:`observable` is False)
and the checks fall back to what the results show.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from .runner import _sandbox_field

_aten = torch.ops.aten
_MATMULS = {_aten.mm.default, _aten.bmm.default, _aten.addmm.default, _aten.baddbmm.default}
_FUSED = {getattr(_aten, name).default for name in ("_scaled_dot_product_flash_attention_for_cpu",
                                                    "_scaled_dot_product_efficient_attention",
                                                    "_scaled_dot_product_flash_attention",
                                                    "_scaled_dot_product_cudnn_attention") if hasattr(_aten, name)}


_GRADER_STAND_INS = "attention_course.course.judge"  # the module whose stand-ins call a function in the sandbox


def observable(fn) -> bool:
    """Whether the student's ``fn`` runs in this process, where its torch operations can be observed (False for the
    grader's stand-ins: a Remote object, or a function of :mod:`attention_course.course.judge` that forwards the
    call to the sandbox)."""
    return _sandbox_field(fn, "_sandbox", None) is None and getattr(fn, "__module__", None) != _GRADER_STAND_INS


def warm_up() -> None:
    """Enter a :class:`ScoreCounter` once: the first entry loads PyTorch's dispatch machinery (a second or more),
    which a check does before its time limit starts."""
    with ScoreCounter(1):
        torch.zeros(1) + 1


class ScoreCounter(TorchDispatchMode):
    """Counts, in ``scores``, the dot products of width ``dk`` the code inside the ``with`` block computes."""

    def __init__(self, dk: int):
        super().__init__()
        self.dk, self.scores = dk, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in _MATMULS:
            a = args[-2]  # mm(a, b), bmm(a, b); addmm(bias, a, b), baddbmm(bias, a, b)
            if a.shape[-1] == self.dk:
                self.scores += out.numel()
        elif func in (_aten.mul.Tensor,) and out.dim() >= 3 and out.shape[-1] == self.dk:
            self.scores += out.numel() // self.dk  # (..., Tq, Tk, dk): broadcast products, summed next
        elif func in _FUSED:
            q, k = args[0], args[1]
            self.scores += math.prod(q.shape[:-1]) * k.shape[-2]
        return out


class FusedAttentionCalls(TorchFunctionMode):
    """Records ``F.scaled_dot_product_attention`` calls: ``mask_dtypes`` lists the dtype of each call's ``attn_mask``
    (None without one). Rows whose mask allows no key come back as NaN, as older kernels return them."""

    def __init__(self):
        super().__init__()
        self.mask_dtypes: list[torch.dtype | None] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func is not F.scaled_dot_product_attention:
            return out
        mask = kwargs.get("attn_mask", args[3] if len(args) > 3 else None)
        self.mask_dtypes.append(None if mask is None else mask.dtype)
        if mask is None:
            return out
        allowed = mask if mask.dtype == torch.bool else mask > float("-inf")
        empty = ~allowed.any(dim=-1, keepdim=True)  # (..., Tq, 1): rows that may attend no key
        return torch.where(empty, torch.full_like(out, float("nan")), out)


class FormedTensors(TorchDispatchMode):
    """Records, in ``formed``, whether the code inside the ``with`` block creates a tensor holding the numbers of
    ``target`` (B, H, ...) or of one of its slices ``target[b]``, ``target[:, h]``, ``target[b, h]``, in any layout
    (compared as sorted values, within ``rtol`` of the largest)."""

    def __init__(self, target, rtol: float = 1e-4):
        super().__init__()
        target = torch.as_tensor(target, dtype=torch.float64)
        b, h = target.shape[:2]
        slices = [target] + [target[i] for i in range(b)] + [target[:, j] for j in range(h)]
        slices += [target[i, j] for i in range(b) for j in range(h)]
        self._sorted = {}
        for part in slices:
            self._sorted.setdefault(part.numel(), []).append(part.flatten().sort().values)
        self._atol = rtol * float(target.abs().max())
        self.formed = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not self.formed and isinstance(out, torch.Tensor) and out.is_floating_point() and out.numel() > 1:
            candidates = self._sorted.get(out.numel(), ())
            if candidates:
                values = out.detach().to(torch.float64).flatten().sort().values
                self.formed = any(bool(((values - c).abs() <= self._atol).all()) for c in candidates)
        return out
