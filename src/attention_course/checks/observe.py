"""Watching what the student's code does, not only what it returns: the scores
it computes, the fused attention calls it makes, and a fused kernel that
behaves as older PyTorch versions do.

A check must prove what its exercise asks, and some of that never shows in a
result: "compute only the tiles the window needs" (a dense answer returns the
same numbers), "pass the float mask to the fused function" (the boolean one
gives the same output), "guard the rows that may attend nothing" (PyTorch
2.13's kernels already return zeros there; older ones return NaN). The checks
run the student's call inside these observers:

* :class:`ScoreCounter` (a ``TorchDispatchMode``) counts the query-key dot
  products the code computes: the outputs of matrix products that contract over
  the feature width ``dk`` (``q @ k.T``, ``einsum``), broadcast products with
  ``dk`` as their last axis (``(q[:, None] * k).sum(-1)``) and fused attention
  kernels (Tq x Tk each);
* :class:`FusedAttentionCalls` (a ``TorchFunctionMode``) records every call of
  ``torch.nn.functional.scaled_dot_product_attention`` with the dtype of its
  ``attn_mask``, and makes it return NaN in the query rows whose mask allows no
  key, as PyTorch did before version 2.5 (and as some kernels still do), so
  that code relying on the installed kernel's zeros fails there.

* :class:`FormedTensors` (a ``TorchDispatchMode``) watches every tensor the
  code creates for one the exercise says not to form (MLA's keys, "without
  forming the keys"): a tensor holding the same numbers, in any layout, whole
  or one head's or one sequence's slice, is recorded.

They see torch operations in the process where they are entered. Under the
grader the student's code runs in the
sandbox (:mod:`attention_course.course.sandbox`): the grader's stand-in sends
the observers active around its call (:func:`remote_specs`) with the request,
the worker runs the call inside the same observers there (:func:`run_observed`)
and sends back what they saw, which :func:`absorb` adds to the grader's
observers. A reply without it, or with anything else, fails the check: a count
is never taken as zero.
"""

from __future__ import annotations

import math
import threading

import numpy as np
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from .runner import _sandbox_field

_aten = torch.ops.aten
_MATMULS = {
    _aten.mm.default,
    _aten.bmm.default,
    _aten.addmm.default,
    _aten.baddbmm.default,
}
_FUSED = {
    getattr(_aten, name).default
    for name in (
        "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_cudnn_attention",
    )
    if hasattr(_aten, name)
}


# the module whose stand-ins call a function in the sandbox
_GRADER_STAND_INS = "attention_course.course.judge"


def observable(fn) -> bool:
    """Whether the student's ``fn`` can be observed: in this process, or
    through the grader's stand-in for a function (of
    :mod:`attention_course.course.judge`), which runs the call inside the same
    observers in the sandbox; not a Remote object (a module's methods are not
    forwarded with observers)."""
    return (
        _sandbox_field(fn, "_sandbox", None) is None
        or getattr(fn, "__module__", None) == _GRADER_STAND_INS
    )


def runs_here(fn) -> bool:
    """Whether calling the student's ``fn`` runs their code in this process
    (not the grader's stand-in, which forwards each call to the sandbox): what
    only this process can do with it (hand it to FlexAttention's vmap)."""
    return (
        _sandbox_field(fn, "_sandbox", None) is None
        and getattr(fn, "__module__", None) != _GRADER_STAND_INS
    )


# .observers: the observers entered in this thread, outermost first (a check
# that
_ACTIVE = threading.local()
# timed out leaves its thread running, and its observers with it: they must not
# join another check's call)


def _active() -> list:
    if not hasattr(_ACTIVE, "observers"):
        _ACTIVE.observers = []
    return _ACTIVE.observers


class _Tracked:
    """Enter/exit bookkeeping for :func:`remote_specs`; ``spec``,
    ``from_spec``, ``result`` and ``absorb`` carry an observer to the sandbox
    and what it saw back."""

    def __enter__(self):
        _active().append(self)
        return super().__enter__()

    def __exit__(self, *exc):
        _active().remove(self)
        return super().__exit__(*exc)


def remote_specs() -> list[dict]:
    """The observers active here, as data for a call the sandbox runs
    (:func:`run_observed`)."""
    return [observer.spec() for observer in _active()]


def absorb(results) -> None:
    """Add what the sandbox's observers saw (:func:`run_observed`'s list) to
    the active ones, in order; anything else raises ValueError (a reply without
    its counts must not pass as a count of zero)."""
    if not isinstance(results, list) or len(results) != len(_active()):
        raise ValueError("the sandbox did not report what its observers saw")
    for observer, result in zip(_active(), results, strict=True):
        observer.absorb(result)


def run_observed(specs: list, call, args: list | None = None):
    """In the sandbox: ``call()`` inside the observers ``specs`` describes ->
    (its value, what each observer saw).
    ``args``: the call's positional arguments (the list ``call`` reads), which
    an observer with ``stand_in`` may replace by a watched stand-in before the
    call."""
    import contextlib

    observers = [_KINDS[spec["kind"]].from_spec(spec) for spec in specs]
    for observer in observers:
        if args is not None and hasattr(observer, "stand_in"):
            observer.stand_in(args)
    with contextlib.ExitStack() as stack:
        for observer in observers:
            stack.enter_context(observer)
        value = call()
    return value, [observer.result() for observer in observers]


def warm_up() -> None:
    """Enter a :class:`ScoreCounter` once: the first entry loads PyTorch's
    dispatch machinery (a second or more), which a check does before its time
    limit starts."""
    with ScoreCounter(1):
        torch.zeros(1) + 1


class ScoreCounter(_Tracked, TorchDispatchMode):
    """Counts, in ``scores``, the dot products of width ``dk`` the code inside
    the ``with`` block computes."""

    def __init__(self, dk: int):
        super().__init__()
        self.dk, self.scores = dk, 0

    def spec(self) -> dict:
        return {"kind": "scores", "dk": self.dk}

    @classmethod
    def from_spec(cls, spec):
        return cls(int(spec["dk"]))

    def result(self) -> dict:
        return {"scores": self.scores}

    def absorb(self, result) -> None:
        self.scores += int(result["scores"])

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in _MATMULS:
            # mm(a, b), bmm(a, b); addmm(bias, a, b), baddbmm(bias, a, b)
            a = args[-2]
            if a.shape[-1] == self.dk:
                self.scores += out.numel()
        elif (
            func in (_aten.mul.Tensor,)
            and out.dim() >= 3
            and out.shape[-1] == self.dk
        ):
            # (..., Tq, Tk, dk): broadcast products, summed next
            self.scores += out.numel() // self.dk
        elif func in _FUSED:
            q, k = args[0], args[1]
            self.scores += math.prod(q.shape[:-1]) * k.shape[-2]
        return out


class FusedAttentionCalls(_Tracked, TorchFunctionMode):
    """Records ``F.scaled_dot_product_attention`` calls: ``mask_dtypes`` lists
    the dtype of each call's ``attn_mask`` (None without one). Rows whose mask
    allows no key come back as NaN, as older kernels return them. Given the
    boolean mask ``expected`` (True = may attend, broadcast to the case's
    scores), ``encodes`` lists, per call with a float ``attn_mask``, whether
    that mask adds 0 where ``expected`` allows a key and at most -1e4 where it
    blocks one (None where the two cannot be compared): a float mask that
    reaches the call, but not the one the output needs, is seen."""

    # an additive mask at or below this leaves a key a weight under e^-9000 of
    # its row's top key
    BLOCKS = -1e4

    def __init__(self, expected=None):
        super().__init__()
        self.mask_dtypes: list[torch.dtype | None] = []
        self.expected = (
            None
            if expected is None
            else torch.from_numpy(np.array(expected, dtype=bool))
        )
        self.encodes: list[bool | None] = []

    def spec(self) -> dict:
        expected = (
            None if self.expected is None else self.expected.numpy().copy()
        )
        return {"kind": "fused", "expected": expected}

    @classmethod
    def from_spec(cls, spec):
        return cls(spec.get("expected"))

    def result(self) -> dict:
        dtypes = [
            None if d is None else str(d).removeprefix("torch.")
            for d in self.mask_dtypes
        ]
        return (
            {"mask_dtypes": dtypes}
            if self.expected is None
            else {"mask_dtypes": dtypes, "encodes": self.encodes}
        )

    def absorb(self, result) -> None:
        names = result["mask_dtypes"]
        dtypes = [None if n is None else getattr(torch, str(n)) for n in names]
        if not all(d is None or isinstance(d, torch.dtype) for d in dtypes):
            raise ValueError("not a dtype")
        self.mask_dtypes += dtypes
        self.encodes += [
            None if e is None else e is True for e in result.get("encodes", [])
        ]

    def _encodes(self, q, k, mask) -> bool | None:
        """Whether the call's float ``mask`` is ``expected`` made additive:
        compared entry by entry once both are broadcast to the call's scores,
        or, where the code reshaped the batch axes (one flattened axis for
        batch and heads), once both are flattened."""
        try:
            scores = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2]) + (
                q.shape[-2],
                k.shape[-2],
            )
            added = (
                mask.detach()
                .to(torch.float64)
                .broadcast_to(torch.broadcast_shapes(scores, mask.shape))
            )
        except RuntimeError:
            return None
        pairs = []
        if added.numel() == self.expected.numel():
            pairs.append((added.flatten(), self.expected.flatten()))
        try:
            shape = torch.broadcast_shapes(added.shape, self.expected.shape)
            pairs.append(
                (added.broadcast_to(shape), self.expected.broadcast_to(shape))
            )
        except RuntimeError:
            pass
        if not pairs:
            return None
        return any(
            bool((a[e] == 0).all() and (a[~e] <= self.BLOCKS).all())
            for a, e in pairs
        )

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func is not F.scaled_dot_product_attention:
            return out
        mask = kwargs.get("attn_mask", args[3] if len(args) > 3 else None)
        self.mask_dtypes.append(None if mask is None else mask.dtype)
        if mask is None:
            return out
        if self.expected is not None and mask.is_floating_point():
            q, k = (
                kwargs.get("query", args[0] if args else None),
                kwargs.get("key", args[1] if len(args) > 1 else None),
            )
            self.encodes.append(self._encodes(q, k, mask))
        allowed = mask if mask.dtype == torch.bool else mask > float("-inf")
        # (..., Tq, 1): rows that may attend no key
        empty = ~allowed.any(dim=-1, keepdim=True)
        return torch.where(empty, torch.full_like(out, float("nan")), out)


class FormedTensors(_Tracked, TorchDispatchMode):
    """Records, in ``formed``, whether the code inside the ``with`` block
    creates a tensor holding the numbers of ``target`` (B, H, ...) or of one of
    its slices ``target[b]``, ``target[:, h]``, ``target[b, h]`` and, for a (B,
    H, T, ...) target, one token's ``target[:, :, t]``, ``target[b, :, t]``,
    ``target[b, h, t]``, in any layout (compared as sorted values, within
    ``rtol`` of the largest)."""

    def __init__(self, target, rtol: float = 1e-4):
        super().__init__()
        target = torch.as_tensor(target, dtype=torch.float64)
        b, h = target.shape[:2]
        slices = (
            [target]
            + [target[i] for i in range(b)]
            + [target[:, j] for j in range(h)]
        )
        slices += [target[i, j] for i in range(b) for j in range(h)]
        # one token's: all sequences and heads, one sequence's heads, one
        # head's vector
        if target.dim() >= 4:
            t = target.shape[2]
            slices += [target[:, :, s] for s in range(t)] + [
                target[i, :, s] for i in range(b) for s in range(t)
            ]
            slices += [
                target[i, j, s]
                for i in range(b)
                for j in range(h)
                for s in range(t)
            ]
        self._sorted = {}
        for part in slices:
            self._sorted.setdefault(part.numel(), []).append(
                part.flatten().sort().values
            )
        self._atol = rtol * float(target.abs().max())
        # built outside the mode
        self._spec = {
            "kind": "formed",
            "target": target.numpy().copy(),
            "rtol": rtol,
        }
        self.formed = False

    def spec(self) -> dict:
        return self._spec

    @classmethod
    def from_spec(cls, spec):
        return cls(spec["target"], float(spec["rtol"]))

    def result(self) -> dict:
        return {"formed": self.formed}

    def absorb(self, result) -> None:
        self.formed = self.formed or result["formed"] is True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if (
            not self.formed
            and isinstance(out, torch.Tensor)
            and out.is_floating_point()
            and out.numel() > 1
        ):
            candidates = self._sorted.get(out.numel(), ())
            if candidates:
                values = out.detach().to(torch.float64).flatten().sort().values
                self.formed = any(
                    bool(((values - c).abs() <= self._atol).all())
                    for c in candidates
                )
        return out


class StepShapes(_Tracked, TorchDispatchMode):
    """Watches the shapes of the tensors the code inside the ``with`` block
    creates, for "token by token, with a (Dk, Dv) state": ``square`` records a
    tensor with two axes of length ``t`` (a (T, T) matrix: the scores or the
    mask of a parallel form, never needed one token at a time; the check picks
    T unlike every other size), and ``state`` a tensor whose last two axes are
    ``state`` = (Dk, Dv)."""

    def __init__(self, t: int, state: tuple[int, int]):
        super().__init__()
        self.t, self.state_shape = t, tuple(state)
        self.square = self.state = False

    def spec(self) -> dict:
        return {"kind": "steps", "t": self.t, "state": list(self.state_shape)}

    @classmethod
    def from_spec(cls, spec):
        return cls(int(spec["t"]), tuple(int(n) for n in spec["state"]))

    def result(self) -> dict:
        return {"square": self.square, "state": self.state}

    def absorb(self, result) -> None:
        self.square = self.square or result["square"] is True
        self.state = self.state or result["state"] is True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if isinstance(out, torch.Tensor):
            self.square = (
                self.square or sum(n == self.t for n in out.shape) >= 2
            )
            self.state = (
                self.state or tuple(out.shape[-2:]) == self.state_shape
            )
        return out


class LeavesTorch(_Tracked, TorchFunctionMode):
    """Records, in ``left``, the first conversion of a tensor of more than one
    number to NumPy or Python lists (``.numpy()``, ``np.asarray``,
    ``.tolist()``) by the code inside the ``with`` block: where a check watches
    the tensors the code forms (a rule such as "never form the keys"), code
    that computes in NumPy is out of its sight, and the check says so instead
    of passing it unseen."""

    _ESCAPES = ("numpy", "__array__", "tolist")

    def __init__(self):
        super().__init__()
        self.left = ""

    def spec(self) -> dict:
        return {"kind": "leaves"}

    @classmethod
    def from_spec(cls, spec):
        return cls()

    def result(self) -> dict:
        return {"left": self.left}

    def absorb(self, result) -> None:
        self.left = self.left or str(result["left"])[:40]

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if (
            not self.left
            and name in self._ESCAPES
            and args
            and isinstance(args[0], torch.Tensor)
            and args[0].numel() > 1
            and not _from_the_grader()
        ):
            self.left = f".{name}()"
        return func(*args, **(kwargs or {}))


def _from_the_grader() -> bool:
    """Whether the conversion under way is the grader's own (its stand-in
    sending a tensor to the sandbox): the first caller outside torch and NumPy
    is a module of :mod:`attention_course.course`."""
    import sys

    frame = sys._getframe(2)
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if not module.startswith(("torch", "numpy", __name__)):
            return module.startswith("attention_course.course")
        frame = frame.f_back
    return False


class RankScores(_Tracked, TorchDispatchMode):
    """Counts the query-key scores of width ``dk`` over ``t`` keys ((..., t, t)
    matrix products, broadcast products, fused kernels) that the code inside
    the ``with`` block computes, per process: in this process and in every
    process it forks (a forked child inherits the mode), each count appended to
    a file as "pid count". :meth:`counts` reads back (this process's count, the
    other processes' counts): what ran on which rank."""

    def __init__(self, dk: int, t: int):
        import os
        import tempfile

        super().__init__()
        self.dk, self.t, self._pid = dk, t, os.getpid()
        handle, self._path = tempfile.mkstemp(prefix="attention-course-ranks-")
        os.close(handle)
        self._absorbed: tuple[int, list[int]] | None = None

    def spec(self) -> dict:
        return {"kind": "ranks", "dk": self.dk, "t": self.t}

    @classmethod
    def from_spec(cls, spec):
        return cls(int(spec["dk"]), int(spec["t"]))

    def result(self) -> dict:
        here, others = self.counts()
        return {"here": here, "others": others}

    def absorb(self, result) -> None:
        self._absorbed = (
            int(result["here"]),
            [int(n) for n in result["others"]],
        )

    def counts(self) -> tuple[int, list[int]]:
        """(scores computed in this process, [scores computed in each other
        process that computed any])."""
        import os

        if self._absorbed is None:
            per_pid: dict[int, int] = {}
            with open(self._path) as f:
                for line in f:
                    pid, n = (int(x) for x in line.split())
                    per_pid[pid] = per_pid.get(pid, 0) + n
            self._absorbed = (
                per_pid.pop(self._pid, 0),
                [per_pid[pid] for pid in sorted(per_pid)],
            )
        if os.path.exists(self._path):
            os.unlink(self._path)
        return self._absorbed

    def _scores(self, func, args, out) -> int:
        square = tuple(out.shape[-2:]) == (self.t, self.t)
        if func in _MATMULS and square and args[-2].shape[-1] == self.dk:
            return out.numel()
        if (
            func is _aten.mul.Tensor
            and out.dim() >= 3
            and out.shape[-1] == self.dk
            and tuple(out.shape[-3:-1]) == (self.t, self.t)
        ):
            return out.numel() // self.dk
        if func in _FUSED:
            return math.prod(args[0].shape[:-1]) * args[1].shape[-2]
        return 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        import os

        out = func(*args, **(kwargs or {}))
        # fused kernels return (output, log-sum-exp, ...): the output counts
        first = out[0] if isinstance(out, (tuple, list)) and out else out
        n = (
            self._scores(func, args, first)
            if isinstance(first, torch.Tensor)
            else 0
        )
        if n:
            with open(self._path, "a") as f:
                f.write(f"{os.getpid()} {n}\n")
        return out


class _Plain:
    """The base of the observers that are no dispatch mode: entering and
    leaving do nothing more."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class KernelStores(_Tracked, _Plain):
    """Records, in ``written``, what each Triton kernel launched inside the
    ``with`` block stored: for every tensor argument of a launch whose numbers
    the launch changed, its numbers after the launch (float64, flattened). "The
    kernel stores the log-sum-exp" is then checked against what a kernel wrote,
    not against a value the launcher may have computed before or after the
    launch. Launches are seen at ``kernel[grid](...)``, compiled or
    interpreted."""

    def __init__(self, limit: int = 1 << 16):
        # tensors of more numbers are not copied (the course's cases are far
        # smaller)
        self.limit = limit
        self.written: list[list[float]] = []

    def spec(self) -> dict:
        return {"kind": "stores", "limit": self.limit}

    @classmethod
    def from_spec(cls, spec):
        return cls(int(spec["limit"]))

    def result(self) -> dict:
        return {"written": self.written}

    def absorb(self, result) -> None:
        self.written += [
            [float(x) for x in numbers] for numbers in result["written"]
        ]

    def _launch(self, run, args, kwargs):
        tensors = [
            a
            for a in (*args, *kwargs.values())
            if isinstance(a, torch.Tensor)
            and a.is_floating_point()
            and a.numel() <= self.limit
        ]
        before = [
            t.detach().to("cpu", torch.float64).flatten().clone()
            for t in tensors
        ]
        value = run(*args, **kwargs)
        for tensor, old in zip(tensors, before, strict=True):
            new = tensor.detach().to("cpu", torch.float64).flatten()
            same = (new == old) | (new.isnan() & old.isnan())
            if not bool(same.all()):
                self.written.append(new.tolist())
        return value

    def __enter__(self):
        from triton.runtime.jit import KernelInterface

        super().__enter__()
        self._interface, self._getitem = (
            KernelInterface,
            KernelInterface.__getitem__,
        )
        observer, getitem = self, self._getitem

        def launch_observed(kernel, grid):
            run = getitem(kernel, grid)
            return lambda *args, **kwargs: observer._launch(run, args, kwargs)

        KernelInterface.__getitem__ = launch_observed
        # An output from torch.empty may already hold the very numbers the
        # kernel stores (the allocator hands back the block a previous run
        # freed): such a store changes nothing, and would go unseen. Memory
        # from empty() has no defined content, so NaN is as good as any.
        self._empties = torch.empty, torch.empty_like
        torch.empty = _filled_with_nan(torch.empty)
        torch.empty_like = _filled_with_nan(torch.empty_like)
        return self

    def __exit__(self, *exc):
        self._interface.__getitem__ = self._getitem
        torch.empty, torch.empty_like = self._empties
        return super().__exit__(*exc)


def _filled_with_nan(allocate):
    """``allocate`` whose floating-point results are filled with NaN."""

    def allocate_nan(*args, **kwargs):
        out = allocate(*args, **kwargs)
        return out.fill_(math.nan) if out.is_floating_point() else out

    return allocate_nan


class PeakMemory(_Tracked, _Plain):
    """Measures, in ``peak``, the most memory the code inside the ``with``
    block held at once beyond what it started with (Python's ``tracemalloc``,
    which sees Python objects and NumPy's arrays, not PyTorch's): "stream over
    the keys, never holding a score for each" is checked by the memory a call
    needs as the keys grow, which no result shows. No dispatch mode may be
    active around it: PyTorch's mode dispatch creates attribute names on every
    call, which CPython's type-attribute cache keeps, and each slot that swaps
    a long-lived name for a new one counts (up to 35 KiB in 4096 steps, at
    random with the hash seed). PyTorch's own tensors are watched by
    :class:`PerKeyTensors`. Under the grader the sandbox's measurement replaces
    this process's (which then also holds the wire's copies)."""

    def __init__(self):
        self.peak = 0
        self._remote = None

    def spec(self) -> dict:
        return {"kind": "memory"}

    @classmethod
    def from_spec(cls, spec):
        return cls()

    def result(self) -> dict:
        return {"peak": self.peak}

    def absorb(self, result) -> None:
        self._remote = max(self._remote or 0, int(result["peak"]))

    def __enter__(self):
        import tracemalloc

        self._started = not tracemalloc.is_tracing()
        if self._started:
            tracemalloc.start()
        tracemalloc.reset_peak()
        self._base = tracemalloc.get_traced_memory()[0]
        return super().__enter__()

    def __exit__(self, *exc):
        import tracemalloc

        self.peak = max(0, tracemalloc.get_traced_memory()[1] - self._base)
        if self._started:
            tracemalloc.stop()
        if self._remote is not None:
            self.peak = self._remote
        return super().__exit__(*exc)


class PerKeyTensors(_Tracked, TorchFunctionMode):
    """Records, in ``per_key``, whether the code inside the ``with`` block
    created a PyTorch tensor with an axis of ``keys`` (the case's number of
    keys) and none of the feature widths ``widths``: a row of scores or
    weights, not a copy of the keys or values (what :class:`PeakMemory` cannot
    see)."""

    def __init__(self, keys: int, widths: tuple[int, ...]):
        super().__init__()
        self.keys, self.widths = keys, tuple(widths)
        self.per_key = False

    def spec(self) -> dict:
        return {
            "kind": "per-key",
            "keys": self.keys,
            "widths": list(self.widths),
        }

    @classmethod
    def from_spec(cls, spec):
        return cls(int(spec["keys"]), tuple(int(n) for n in spec["widths"]))

    def result(self) -> dict:
        return {"per_key": self.per_key}

    def absorb(self, result) -> None:
        self.per_key = self.per_key or result["per_key"] is True

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if (
            isinstance(out, torch.Tensor)
            and self.keys in out.shape
            and not set(self.widths) & set(out.shape)
        ):
            self.per_key = True
        return out


class TokensFed(_Tracked, _Plain):
    """Records, in ``fed``, how many token ids each lookup in an embedding
    table of ``vocab`` rows reads, in order (``nn.Embedding`` and
    ``F.embedding``, watched by wrapping ``torch.nn.functional.embedding``
    while the ``with`` block runs: a dispatch mode would see every operator
    of a 30-layer model and make a decoding step ten times slower): "after
    the prompt, feed the model one new token per step" is checked by what the
    model is given, which no output shows (recomputing the whole sequence at
    every step gives the same tokens)."""

    def __init__(self, vocab: int):
        self.vocab, self.fed = vocab, []

    def spec(self) -> dict:
        return {"kind": "tokens-fed", "vocab": self.vocab}

    @classmethod
    def from_spec(cls, spec):
        return cls(int(spec["vocab"]))

    def result(self) -> dict:
        return {"fed": self.fed}

    def absorb(self, result) -> None:
        if not all(
            isinstance(n, int) and not isinstance(n, bool)
            for n in result["fed"]
        ):
            raise ValueError("the sandbox's token counts are not integers")
        self.fed += result["fed"]

    def __enter__(self):
        from torch.nn import functional

        self._embedding = original = functional.embedding

        def embedding(input, weight, *args, **kwargs):
            if weight.dim() == 2 and weight.size(0) == self.vocab:
                self.fed.append(int(input.numel()))
            return original(input, weight, *args, **kwargs)

        functional.embedding = embedding
        return super().__enter__()

    def __exit__(self, *exc):
        from torch.nn import functional

        functional.embedding = self._embedding
        return super().__exit__(*exc)


class _RowsCounted(np.ndarray):
    """An array whose rows count, in ``reads`` (a one-item list), being read
    one at a time (``for row in a``, ``a[j]``); arrays derived from it count
    nothing."""

    reads = None

    def __array_finalize__(self, obj):
        self.reads = None

    def __iter__(self):
        return (self[j] for j in range(len(self)))

    def __getitem__(self, index):
        if self.reads is not None and isinstance(index, (int, np.integer)):
            self.reads[0] += 1
        return np.ndarray.__getitem__(self.view(np.ndarray), index)


class RowReads(_Tracked, _Plain):
    """Counts, in ``reads``, the rows of the NumPy argument ``arg`` (its
    position) read one at a time by the code inside the ``with`` block, through
    the stand-in :meth:`wrap` makes (here) or :meth:`stand_in` puts in the
    call's
    arguments (in the sandbox): "one pass over the keys" is a count of key rows
    read. A row read after converting the array (``np.asarray(k)``) is not
    seen: ``reads`` is a lower bound."""

    def __init__(self, arg: int):
        self.arg, self.reads = arg, 0
        self._count = [0]

    def spec(self) -> dict:
        return {"kind": "reads", "arg": self.arg}

    @classmethod
    def from_spec(cls, spec):
        return cls(int(spec["arg"]))

    def result(self) -> dict:
        return {"reads": self._count[0]}

    def absorb(self, result) -> None:
        self._count[0] += int(result["reads"])

    def wrap(self, array):
        """``array`` as the stand-in that counts its rows read (anything else
        as it is)."""
        if not isinstance(array, np.ndarray) or array.ndim < 1:
            return array
        watched = array.view(_RowsCounted)
        watched.reads = self._count
        return watched

    def stand_in(self, args: list) -> None:
        if len(args) > self.arg:
            args[self.arg] = self.wrap(args[self.arg])

    def __exit__(self, *exc):
        self.reads = self._count[0]
        return super().__exit__(*exc)


class OutsideFlex(_Tracked, TorchDispatchMode):
    """Watches the tensors the code inside the ``with`` block creates beside
    FlexAttention, whose own operator passes through unwatched (its insides are
    not the student's). ``widened``: the shape of the first tensor with an axis
    of length ``n`` (a check picks n = Tk + 1, unlike every other size of its
    case, to see a column appended to the scores or a key to the keys: "the
    sink from the log-sum-exp, not as a column"). ``scores``: the first
    query-key scores of ``shape`` (Tq, Tk, dk) computed by the code itself (a
    matrix product over dk into (..., Tq, Tk), a broadcast product (..., Tq,
    Tk, dk), a fused attention kernel): "the output and lse from
    FlexAttention"."""

    supports_higher_order_operators = True

    def __init__(self, n: int, shape: tuple[int, int, int]):
        super().__init__()
        self.n, self.shape = n, tuple(shape)
        self.widened = self.scores = ""

    def spec(self) -> dict:
        return {"kind": "outside-flex", "n": self.n, "shape": list(self.shape)}

    @classmethod
    def from_spec(cls, spec):
        return cls(int(spec["n"]), tuple(int(x) for x in spec["shape"]))

    def result(self) -> dict:
        return {"widened": self.widened, "scores": self.scores}

    def absorb(self, result) -> None:
        self.widened = self.widened or str(result["widened"])[:40]
        self.scores = self.scores or str(result["scores"])[:60]

    def __enter__(self):
        # FlexAttention wraps its op in torch.compile, which refuses a dispatch
        # mode: while this one watches (in the sandbox too, where the check's
        # own switch is not set), PyTorch's switch runs the op plainly
        from torch.nn.attention import flex_attention as module

        self._was_plain = module._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG
        module._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG = True
        return super().__enter__()

    def __exit__(self, *exc):
        from torch.nn.attention import flex_attention as module

        module._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG = self._was_plain
        return super().__exit__(*exc)

    def _own_scores(self, func, args, out) -> bool:
        t_q, t_k, dk = self.shape
        if func in _MATMULS:
            return (
                tuple(out.shape[-2:]) == (t_q, t_k)
                and args[-2].shape[-1] == dk
            )
        if func is _aten.mul.Tensor:
            return tuple(out.shape[-3:]) == (t_q, t_k, dk)
        return func in _FUSED

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if isinstance(out, torch.Tensor):
            if not self.widened and self.n in out.shape:
                self.widened = str(tuple(out.shape))
            if not self.scores and self._own_scores(func, args, out):
                self.scores = f"{func.__name__} -> {tuple(out.shape)}"
        elif not self.scores and func in _FUSED:
            self.scores = f"{func.__name__}"
        return out


class FlexCalls:
    """Records, in ``calls``, each call of PyTorch's ``flex_attention`` the
    code inside the ``with`` block makes:
    True where it asks for the log-sum-exp (``return_lse=True`` or
    ``return_aux`` with ``lse=True``), False where not. The call is seen by its
    Python frame (a profile hook, this thread): the operator below it looks the
    same either way."""

    def __init__(self):
        self.calls: list[bool] = []

    def spec(self) -> dict:
        return {"kind": "flex-calls"}

    @classmethod
    def from_spec(cls, spec):
        return cls()

    def result(self) -> dict:
        return {"calls": list(self.calls)}

    def absorb(self, result) -> None:
        if not all(isinstance(c, bool) for c in result["calls"]):
            raise ValueError("not a list of booleans")
        self.calls += result["calls"]

    def _profile(self, frame, event, arg):
        if event == "call" and frame.f_code is self._code:
            seen = frame.f_locals
            self.calls.append(
                bool(seen.get("return_lse"))
                or bool(getattr(seen.get("return_aux"), "lse", False))
            )
        if self._previous is not None:
            self._previous(frame, event, arg)

    def __enter__(self):
        import sys

        from torch.nn.attention.flex_attention import flex_attention

        self._code, self._previous = flex_attention.__code__, sys.getprofile()
        sys.setprofile(self._profile)
        _active().append(self)
        return self

    def __exit__(self, *exc):
        import sys

        _active().remove(self)
        sys.setprofile(self._previous)
        return False


_KINDS = {
    "scores": ScoreCounter,
    "fused": FusedAttentionCalls,
    "formed": FormedTensors,
    "steps": StepShapes,
    "leaves": LeavesTorch,
    "ranks": RankScores,
    "stores": KernelStores,
    "memory": PeakMemory,
    "per-key": PerKeyTensors,
    "reads": RowReads,
    "outside-flex": OutsideFlex,
    "flex-calls": FlexCalls,
    "tokens-fed": TokensFed,
}


class LibraryCalls:
    """Records, in ``called``, the functions of the course's own modules
    ``names`` (``"flex"``,
    ``"linear_attention"``: a module or a package of :mod:`attention_course`)
    that the code inside the ``with`` block calls, in this thread: an exercise
    that says "do not use the library's version" is checked by what the code
    calls, not by what it returns. Under the grader the call runs in the
    sandbox, unseen here: the grader's static reading (``calls-reference``)
    rejects the same imports there."""

    def __init__(self, *names: str):
        import os

        # .../attention_course
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        self._prefixes = tuple(os.path.join(root, n) for n in names)
        self.called: list[str] = []

    def _profile(self, frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(
            self._prefixes
        ):
            name = (
                frame.f_code.co_qualname
                if hasattr(frame.f_code, "co_qualname")
                else frame.f_code.co_name
            )
            module = frame.f_globals.get("__name__", "")
            if len(self.called) < 8:
                self.called.append(f"{module}.{name}")
        if self._previous is not None:
            self._previous(frame, event, arg)

    def __enter__(self):
        import sys

        self._previous = sys.getprofile()
        sys.setprofile(self._profile)
        return self

    def __exit__(self, *exc):
        import sys

        sys.setprofile(self._previous)
        return False
