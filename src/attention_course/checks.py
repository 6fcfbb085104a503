"""Automatic checks for the course's exercises: run the student's code, compare with the reference, explain.

Every ``check_*`` function runs the student's function (or module class) on many random cases with fixed
seeds (several shapes, Tq != Tk, with and without masks), compares the results with the float64 reference
in :mod:`attention_course.numpy_ref`, and then either

* prints ONE line saying what was verified, named after the student's function or class (its ``__name__``;
  the contract's name for a lambda or a partial), e.g. ``✓ attention: 24 random cases (...) match the
  reference``, or
* raises :class:`CheckFailed` (a subclass of ``AssertionError``) whose message starts with a stable
  diagnosis code in brackets, then a plain-language hint, e.g.
  ``[missing-scale] Your scores are not divided by sqrt(d_k): ...``. :data:`CODES` lists every code.

How the diagnosis works: on the first failing case the checker computes what each *known mistake* would
produce (a list of candidate buggy references: no scaling, softmax over the wrong axis, inverted mask, heads
split without a transpose, ...) and reports the mistake whose output the student's output matches. If none
matches, the code is ``[wrong-output]`` (or ``[wrong-shape]`` / ``[nan-output]``).

Robustness: a student function that raises (``NotImplementedError`` -> ``[not-implemented]``, anything else
-> ``[raised-exception]``), returns None, the wrong type or NaN, modifies its inputs in place, or never
returns, gets a clear one-paragraph message, never a traceback from inside the checker.

Time limit (``timeout`` seconds per check, default :data:`DEFAULT_TIMEOUT`): on the main thread of a POSIX
process (a Jupyter kernel, pytest, a script) the check runs under ``signal.setitimer``/``SIGALRM``, which
interrupts pure-Python loops; an alarm that is already pending (e.g. pytest-timeout's) is honoured and
restored afterwards. Elsewhere (another thread, Windows) the check runs in a daemon thread and is abandoned
after ``join(timeout)``. Neither can interrupt a single long-running C call (one huge matmul); Jupyter's
interrupt button and the grader's per-cell time limit cover that.

In IPython/Jupyter a failed check displays only ``CheckFailed: [code] message``: :class:`CheckFailed`
renders its own traceback (``_render_traceback_``), so stored notebook outputs contain no file paths.
"""

from __future__ import annotations

import contextlib
import inspect
import itertools
import math
import signal
import threading
import time
import warnings
from collections.abc import Callable

import numpy as np
import torch

from . import numpy_ref

DEFAULT_TIMEOUT = 10.0

#: Every diagnosis code a check can report, with a one-line description.
CODES = {
    "wrong-shape": "the result has the wrong shape",
    "wrong-type": "the result is not an array/tensor of the expected kind (or has the wrong dtype)",
    "returned-none": "the function returned None (missing return statement)",
    "not-implemented": "the function still raises NotImplementedError",
    "raised-exception": "the function raised an exception",
    "timeout": "the function did not return within the time limit",
    "mutates-input": "the function modified one of its input arrays in place",
    "nan-output": "the result contains NaN or inf where the reference is finite",
    "missing-attribute": "the module lacks an attribute the exercise asks for (e.g. w_q)",
    "missing-scale": "scores not divided by sqrt(d_k)",
    "wrong-scale": "scores scaled by the wrong factor (d_k, sqrt(T), sqrt(d_model), ...)",
    "softmax-wrong-axis": "softmax normalised along the wrong axis",
    "softmax-overflow": "softmax without subtracting the maximum overflows to NaN for large inputs",
    "transposed-scores": "scores computed as k @ q^T instead of q @ k^T",
    "values-from-keys": "output computed from the keys instead of the values",
    "mask-ignored": "the mask has no effect",
    "mask-inverted": "the mask is applied the wrong way round (True treated as 'blocked')",
    "mask-wrong-sign": "masked positions get a large positive score instead of -inf",
    "mask-zero-before-softmax": "masked scores set to 0 instead of -inf before the softmax",
    "weights-not-normalized": "attention weights do not sum to 1 (masked after the softmax, or no division)",
    "nan-on-masked-row": "a fully masked query row gives NaN instead of zeros",
    "masked-row-not-zero": "a fully masked query row gives uniform weights instead of zeros",
    "causal-top-left-aligned": "causal mask aligned top-left when Tq < Tk (should be bottom-right)",
    "causal-excludes-diagonal": "causal mask hides each position from itself",
    "off-by-one": "padding mask off by one position",
    "heads-split-without-transpose": "heads split with a reshape only, without the transpose",
    "merge-heads-wrong-order": "heads merged without transposing back first",
    "missing-output-projection": "the output projection w_o is not applied",
    "weight-not-transposed": "an nn.Linear weight used as x @ linear.weight (it is stored (d_out, d_in): x @ weight.T)",
    "weight-layout-transposed": "a weight matrix read in the other layout: (d_out, d_in) used as (d_in, d_out) or the "
    "reverse (W instead of W.T)",
    "dropout-in-eval": "dropout still active after .eval() / with training=False",
    "kv-heads-tiled": "key/value heads repeated as a tile (heads 0, 1, 0, 1) instead of in groups (0, 0, 1, 1)",
    "cache-keys-only": "KV cache size without the factor 2: only the keys (or only the values) counted",
    "cache-missing-factor": "KV cache size without one of its factors (layers, heads, head size, tokens, batch, "
    "bytes per number)",
    "wrong-value": "a numeric answer differs from the expected value",
    "wrong-output": "the result differs from the reference and matches no known mistake",
}

_HINTS = {
    "missing-scale": "Your scores are not divided by sqrt(d_k): your output matches softmax(q @ k^T) @ v without the "
    "1/sqrt(d_k) factor. Multiply the scores by 1 / sqrt(d_k), with d_k = q.shape[-1], before the softmax.",
    "wrong-scale": "Your scores are scaled by the wrong factor: {detail}. The factor is 1 / sqrt(d_k), where d_k = "
    "q.shape[-1] is the feature size of the queries and keys (per head).",
    "softmax-wrong-axis": "Your softmax normalises along the wrong axis ({detail}). Each query's weights over the keys "
    "must sum to 1: take the softmax along the last axis (axis=-1 / dim=-1).",
    "softmax-overflow": "Your softmax overflows: for large inputs (e.g. 1000) exp() gives inf and inf / inf is NaN. "
    "Subtract each row's maximum before exp() (softmax does not change when you shift a row).",
    "transposed-scores": "Your scores are transposed: you computed k @ q^T (keys x queries) instead of q @ k^T "
    "(queries x keys). Row i of the scores must belong to query i.",
    "values-from-keys": "Your output is a weighted sum of the keys, not of the values{detail}. Multiply the attention "
    "weights by the values.",
    "mask-ignored": "Your output ignores the mask: keys where the mask is False must get zero weight. Fill their "
    "scores with -inf before the softmax.",
    "mask-inverted": "Your mask is inverted: {detail}. In this course True = may attend (as in PyTorch's "
    "scaled_dot_product_attention; nn.MultiheadAttention's masks use the opposite convention).",
    "mask-wrong-sign": "Blocked keys get a large POSITIVE score, so they take all the weight ({detail}). Blocked "
    "scores must become -inf (or a large negative number), e.g. scores.masked_fill(~mask, float('-inf')).",
    "mask-zero-before-softmax": "Blocked scores are set to 0 before the softmax, but exp(0) = 1 still gives them "
    "weight. Fill them with -inf instead, e.g. scores.masked_fill(~mask, float('-inf')).",
    "weights-not-normalized": "Your attention weights do not sum to 1 over the keys: {detail}. Apply the mask to the "
    "scores BEFORE the softmax, and divide by the sum, so every row of weights sums to 1.",
    "nan-on-masked-row": "Your result has NaN in query rows where every key is masked (the softmax of a row of -inf "
    "is 0/0). The course's convention: such rows get all-zero weights and a zero output, e.g. set the weights of "
    "rows with no allowed key to 0 after the softmax.",
    "masked-row-not-zero": "In query rows where every key is masked your weights are spread evenly over all keys "
    "(what filling with a large negative number such as -1e9 gives). The course's convention: such rows get "
    "all-zero weights and a zero output.",
    "causal-top-left-aligned": "For Tq < Tk your causal mask is aligned top-left (query i sees keys 0..i). In this "
    "course the queries are the LAST Tq positions: query i may attend key j iff j <= i + (Tk - Tq), e.g. "
    "tril with diagonal=Tk - Tq.",
    "causal-excludes-diagonal": "Your causal mask hides each position from itself: query i must be able to attend "
    "key i (the diagonal is True).",
    "off-by-one": "Your padding mask is off by one: key j of sequence b may be attended iff j < lengths[b].",
    "heads-split-without-transpose": "Your heads are split with a reshape only: reshaping (B, T, D) straight to "
    "(B, H, T, Dh) scrambles positions and features. Reshape to (B, T, H, Dh) first, then transpose to (B, H, T, Dh).",
    "merge-heads-wrong-order": "Your heads are merged in the wrong order: going from (B, H, T, Dh) back to (B, T, D) "
    "needs a transpose to (B, T, H, Dh) BEFORE the reshape.",
    "missing-output-projection": "Your output skips the output projection: after merging the heads, apply w_o.",
    "weight-not-transposed": "Your projections compute x @ linear.weight, but nn.Linear stores its weight as (d_out, "
    "d_in) and computes x @ weight.T + bias: call the layer (self.w_q(x)) or transpose the weight. With d_in == d_out "
    "the shapes fit and the result is silently wrong; with d_in != d_out it fails with a shape error.",
    "weight-layout-transposed": "Your output matches attention computed with {detail} transposed: a weight matrix "
    "was read in the other layout. The course's parameter dictionaries and Keras' Dense kernels store W as (d_in, "
    "d_out), for y = x @ W + b; nn.Linear stores its weight as (d_out, d_in), for y = x @ weight.T + b. Converting "
    "from one layout to the other needs a transpose; reading one as the other only runs when d_in == d_out, and then "
    "the result is silently wrong.",
    "dropout-in-eval": "Your module is not deterministic in evaluation mode: built with dropout=0.5, {detail}. "
    "Dropout must only act in training mode (nn.Dropout does this; or use dropout_p=p if self.training else 0.0).",
    "kv-heads-tiled": "Your key/value heads are repeated as a tile, not in groups: {detail}. Query head h uses "
    "key/value head h // n_rep, with n_rep = H / H_kv: each key/value head must be repeated n_rep times in a row (as "
    "x.repeat_interleave(n_rep, dim=1) does), whereas x.repeat(1, n_rep, 1, 1) repeats the whole block of heads.",
    "cache-keys-only": "Your cache size is half the right one: it counts the keys only (or the values only). The "
    "cache holds both, for every layer and every token.",
    "cache-missing-factor": "Your cache size leaves out {detail}.",
    "mutates-input": "Your function changed its input `{detail}` in place (e.g. with `x -= ...` or `x /= ...`). "
    "Compute new arrays instead of modifying the arguments: the caller still needs them.",
    "nan-output": "Your result contains NaN or inf values where the reference is finite.",
    "returned-none": "Your function returned None: did you forget the `return` statement?",
}


class CheckFailed(AssertionError):
    """A failed exercise check; ``str(err)`` starts with ``[code]``.

    IPython shows exceptions through ``_render_traceback_`` when they define it: this one shows just
    ``CheckFailed: message`` (no frames, no file paths), so stored notebook outputs are stable.
    """

    @property
    def code(self) -> str:
        msg = str(self)
        return msg[1 : msg.index("]")] if msg.startswith("[") and "]" in msg else ""

    def _render_traceback_(self) -> list[str]:
        return [f"\x1b[0;31m{type(self).__name__}\x1b[0m: {self}"]


class _Timeout(BaseException):
    """Raised by the alarm handler; BaseException so that a student's ``except Exception`` does not swallow it."""


def _name(obj, default: str) -> str:
    """The name of the student's function or class for the success line (``default`` for lambdas and partials)."""
    name = getattr(obj, "__name__", None)
    return name if isinstance(name, str) and name.isidentifier() else default


def _fail(code: str, message: str | None = None, detail: str = "", case: str = "") -> CheckFailed:
    assert code in CODES, code
    text = message if message is not None else _HINTS[code].format(detail=detail)
    if case:
        text += f"\n  Failing case: {case}"
    return CheckFailed(f"[{code}] {text}")


# ----------------------------------------------------------------------------------------------------------
# Running student code: time limit, exceptions, mutation, conversion of results
# ----------------------------------------------------------------------------------------------------------


def _run_with_timeout(func: Callable[[], str], timeout: float | None) -> str:
    """Run ``func()`` under a time limit (see the module docstring); raise CheckFailed[timeout] when exceeded."""
    if timeout is None or timeout <= 0:
        return func()
    message = (
        f"Your code did not finish within {timeout:g} s: is there an infinite loop (e.g. a `while` loop whose "
        "condition never changes)?"
    )
    if hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread():
        return _run_with_alarm(func, timeout, message)
    return _run_in_thread(func, timeout, message)


def _run_with_alarm(func, timeout, message):
    start = time.monotonic()
    old_remaining, _ = signal.getitimer(signal.ITIMER_REAL)
    old_deadline = start + old_remaining if old_remaining > 0 else math.inf
    ours = start + timeout
    old_handler = signal.getsignal(signal.SIGALRM)
    outer_delivered = False

    def handler(signum, frame):
        nonlocal outer_delivered
        if time.monotonic() >= old_deadline - 1e-3 and callable(old_handler):
            outer_delivered = True  # the outer alarm (e.g. pytest-timeout) was due first: it has now fired
            old_handler(signum, frame)
        raise _Timeout

    signal.signal(signal.SIGALRM, handler)
    try:
        try:
            signal.setitimer(signal.ITIMER_REAL, max(min(ours, old_deadline) - time.monotonic(), 1e-4))
            return func()
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except _Timeout:
        raise _fail("timeout", message) from None
    finally:
        signal.signal(signal.SIGALRM, old_handler)
        if old_deadline < math.inf and not outer_delivered:  # re-arm an outer alarm still to come, never twice
            signal.setitimer(signal.ITIMER_REAL, max(old_deadline - time.monotonic(), 1e-4))


def _run_in_thread(func, timeout, message):
    result: dict = {}

    def target():
        try:
            result["value"] = func()
        except BaseException as err:  # noqa: BLE001 - re-raised in the calling thread
            result["error"] = err

    worker = threading.Thread(target=target, name="attention-course-check", daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        raise _fail("timeout", message)
    if "error" in result:
        raise result["error"]
    return result["value"]


def _run_check(body: Callable[[], str], timeout: float | None) -> None:
    """Run a check body; print its success line, or re-raise its CheckFailed with a short traceback."""
    __tracebackhide__ = True  # pytest: hide this frame
    try:
        line = _run_with_timeout(body, timeout)
    except CheckFailed as err:
        failure = CheckFailed(str(err))
    else:
        print(line)
        return
    raise failure from None


def _snapshot(value):
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, np.ndarray):
        return value.copy()
    return None


def _unchanged(before, after) -> bool:
    """Whether an argument still equals the copy taken before the call (NaN equals NaN)."""
    if isinstance(before, torch.Tensor):
        after = after.detach()
        if before.shape != after.shape:
            return False
        if before.is_floating_point():
            return bool(torch.allclose(before, after, rtol=0, atol=0, equal_nan=True))
        return bool(torch.equal(before, after))
    return before.shape == after.shape and np.array_equal(before, after, equal_nan=before.dtype.kind == "f")


def _has_shape(value) -> bool:
    """Arrays and tensors of any framework (torch, NumPy, TensorFlow): described by their shape, not their values."""
    return isinstance(value, (torch.Tensor, np.ndarray)) or (hasattr(value, "shape") and hasattr(value, "dtype"))


def _describe_call(label: str, args: dict) -> str:
    parts = []
    for name, value in args.items():
        if _has_shape(value):
            parts.append(f"{name} of shape {_shape(value.shape)}")
        elif isinstance(value, dict) and all(_has_shape(v) for v in value.values()):  # a dict of weights
            parts.append(f"{name}={{{', '.join(f'{k}: {_shape(v.shape)}' for k, v in value.items())}}}")
        else:
            parts.append(f"{name}={value!r}")
    return f"{label}({', '.join(parts)})"


_KERAS_WRAPPER = "Exception encountered when calling"


def _original_error(err: BaseException) -> BaseException:
    """The student's own exception. Keras (with its traceback filtering on) re-raises an error from a layer's
    ``call()`` as a new exception of the same type whose message starts with "Exception encountered when calling
    X.call()" and lists the arguments; the original is its ``__context__`` (or ``__cause__``)."""
    while str(err).startswith(_KERAS_WRAPPER):
        inner = err.__cause__ or err.__context__
        if inner is None:
            break
        err = inner
    return err


def _first_line(err: BaseException) -> str:
    """The first line of an exception's message, without TensorFlow's "{{function_node ...}}" prefix, cut to 300
    characters."""
    text = str(err).strip()
    if text.startswith("{{function_node") and "}}" in text:
        text = text[text.index("}}") + 2 :].strip()
    text = text.splitlines()[0] if text else ""
    text = text[: -len(" name:")] if text.endswith(" name:") else text  # TensorFlow's op errors, without a name
    return text if len(text) <= 300 else text[:297] + "..."


def _call(fn: Callable, args: dict, label: str, positional: int | None = None, call_text: str | None = None):
    """Call the student's ``fn`` with ``args`` (the first ``positional`` ones positionally, the rest as keywords).

    Turns exceptions into CheckFailed messages and checks that no array argument was modified.
    """
    call_text = call_text or _describe_call(label, args)
    items = list(args.items())
    n_pos = len(items) if positional is None else positional
    pos = [v for _, v in items[:n_pos]]
    kw = dict(items[n_pos:])
    before = {name: _snapshot(v) for name, v in items}
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            result = fn(*pos, **kw)
    except NotImplementedError as err:
        what = _first_line(_original_error(err)) or f"{label} is not implemented yet"
        raise _fail(
            "not-implemented",
            f"{what.rstrip('.')}: replace the `raise NotImplementedError(...)` line with your solution, "
            "run that cell, then run this check again.",
        ) from None
    except (Exception, SystemExit) as err:  # noqa: BLE001 - any student error becomes a message
        err = _original_error(err)
        text = _first_line(err)
        raise _fail(
            "raised-exception",
            f"Your code raised {type(err).__name__}{': ' + text if text else ''}\n  when called as {call_text}.",
        ) from None
    for name, value in items:
        if before[name] is not None and not _unchanged(before[name], value):
            raise _fail("mutates-input", detail=name, case=call_text)
    return result


def _as_array(value, what: str, case: str, kind: str = "float") -> np.ndarray:
    """A student's result as a NumPy array (float64, or bool for masks); CheckFailed for None/wrong types."""
    if value is None:
        raise _fail("returned-none", case=case) if what == "result" else _fail(
            "returned-none", f"Your function returned None as its {what}.", case=case)
    if isinstance(value, torch.Tensor):
        tensor = value.detach().cpu()
        if tensor.dtype == torch.bool:
            arr = tensor.numpy()
        elif tensor.is_complex():
            arr = None
        else:  # floats of any width and integers
            arr = tensor.to(torch.float64).numpy()
    elif isinstance(value, np.ndarray) or np.isscalar(value) and isinstance(value, (int, float, np.number, bool)):
        arr = np.asarray(value)
    elif hasattr(value, "numpy") and callable(value.numpy):  # TensorFlow / Keras tensors
        arr = np.asarray(value.numpy())
    elif isinstance(value, (list, tuple)):
        try:
            arr = np.asarray(value, dtype=np.float64 if kind == "float" else None)
        except (ValueError, TypeError):
            arr = None
    else:
        arr = None
    if arr is None or arr.dtype.kind not in "biuf":
        raise _fail(
            "wrong-type",
            f"Your {what} is a {_type_name(value)}; expected an array of numbers (a torch tensor or NumPy array).",
            case=case,
        )
    if kind == "bool":
        if arr.dtype != np.bool_:
            raise _fail(
                "wrong-type",
                f"Your {what} has dtype {_dtype_name(value)}; a mask must be boolean (True = may attend), e.g. "
                "build it from a comparison or pass dtype=torch.bool.",
                case=case,
            )
        return arr
    return arr.astype(np.float64)


def _type_name(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"torch tensor of dtype {value.dtype}"
    return type(value).__name__


def _dtype_name(value) -> str:
    return str(value.dtype) if hasattr(value, "dtype") else type(value).__name__


def _split_result(result, case: str, names=("output", "weights")):
    """``out`` or ``(out, weights)`` -> (out, weights or None)."""
    if isinstance(result, (tuple, list)):
        if len(result) == 2:
            return result[0], result[1]
        raise _fail(
            "wrong-type",
            f"Your function returned a {type(result).__name__} of {len(result)} items; return the {names[0]}, or "
            f"a pair ({names[0]}, {names[1]}).",
            case=case,
        )
    return result, None


def _close(a: np.ndarray, b: np.ndarray, atol: float, rtol: float) -> bool:
    return a.shape == b.shape and bool(np.allclose(a, b, rtol=rtol, atol=atol, equal_nan=True))


def _shape(shape) -> str:
    return str(tuple(None if s is None else int(s) for s in shape))


# ----------------------------------------------------------------------------------------------------------
# Candidate references: what each known mistake would produce (float64 NumPy)
# ----------------------------------------------------------------------------------------------------------


def _sdpa_variant(
    q, k, v, mask=None, *, scale=None, axis=-1, transposed=False, mask_mode="ok", rows="zero", normalize=True,
    values="v",
):
    """Scaled dot-product attention with one deliberate deviation; returns (out, weights), float64.

    mask_mode: ok | ignored | inverted | zero (masked scores = 0) | after (softmax, then zero masked weights)
    | plus-blocked (a huge positive number added to the blocked scores: uniform over the blocked keys).
    rows: what a fully masked row gets: zero | nan | uniform (over all keys).
    """
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = (k @ np.swapaxes(q, -1, -2) if transposed else q @ np.swapaxes(k, -1, -2)) * scale
    m = None if mask is None or mask_mode == "ignored" else np.broadcast_to(np.asarray(mask, bool), scores.shape)
    if m is not None and mask_mode == "inverted":
        m = ~m
    if m is None:
        weights = numpy_ref.softmax(scores, axis=axis) if normalize else np.exp(scores)
    elif mask_mode in ("ok", "inverted"):
        masked = np.where(m, scores, -np.inf)
        weights = numpy_ref.softmax(masked, axis=axis) if normalize else np.exp(masked)
        empty = ~m.any(axis=-1, keepdims=True)
        if rows == "nan":
            weights = np.where(empty, np.nan, weights)
        elif rows == "uniform":
            weights = np.where(empty, 1.0 / scores.shape[-1], weights)
    elif mask_mode == "zero":
        weights = numpy_ref.softmax(np.where(m, scores, 0.0), axis=axis)
    elif mask_mode == "after":
        weights = numpy_ref.softmax(scores, axis=axis) * m
    else:  # plus-blocked: in float32, s + 1e10 == 1e10, so the blocked keys share the weight evenly
        boosted = ~m
        count = boosted.sum(axis=-1, keepdims=True)
        weights = np.where(count > 0, boosted / np.maximum(count, 1), numpy_ref.softmax(scores, axis=axis))
    return weights @ (k if values == "k" else v), weights


_BLOCK_TRUE = "you block the keys where the mask is True; fill the scores where it is False (~mask) with -inf"
_CAUSAL_TRUE = ("your mask is True for the future keys (like nn.MultiheadAttention's attn_mask); it must be True "
                "where query i may attend key j, i.e. j <= i + (Tk - Tq)")


def _core_variants(dk, dv, tq, tk, ndim, has_mask, fully_masked, extra_scales=()):
    """(code, detail, kwargs for _sdpa_variant) for every known mistake in the attention core."""
    right = 1.0 / math.sqrt(dk)
    out = [("missing-scale", "", {"scale": 1.0})]
    scales = [
        (1.0 / dk, "they are divided by d_k instead of sqrt(d_k)"),
        (math.sqrt(dk), "they are multiplied by sqrt(d_k) instead of divided"),
        (1.0 / math.sqrt(tk), "they are divided by sqrt(Tk), the number of keys, instead of sqrt(d_k)"),
        (1.0 / math.sqrt(tq), "they are divided by sqrt(Tq), the number of queries, instead of sqrt(d_k)"),
        (1.0 / math.sqrt(dv), "they are divided by sqrt(d_v), the value size, instead of sqrt(d_k)"),
        (1.0 / tk, "they are divided by Tk, the number of keys, instead of sqrt(d_k)"),
        *extra_scales,
    ]
    seen = {right, 1.0}
    for scale, detail in scales:
        if not any(math.isclose(scale, s) for s in seen):
            seen.add(scale)
            out.append(("wrong-scale", detail, {"scale": scale}))
    for axis in range(-2, -ndim - 1, -1):
        detail = "over the queries (axis -2)" if axis == -2 else f"along axis {axis + ndim}, a batch axis"
        out.append(("softmax-wrong-axis", f"you normalised {detail}", {"axis": axis}))
    if tq == tk:
        out.append(("transposed-scores", "", {"transposed": True}))
    out.append(("values-from-keys", "", {"values": "k"}))
    out.append(("weights-not-normalized", "you take exp() without dividing by the sum", {"normalize": False}))
    if has_mask:
        out += [
            ("mask-ignored", "", {"mask_mode": "ignored"}),
            ("mask-inverted", _BLOCK_TRUE, {"mask_mode": "inverted"}),
            ("mask-inverted", _BLOCK_TRUE, {"mask_mode": "inverted", "rows": "nan"}),
            ("mask-inverted", _BLOCK_TRUE, {"mask_mode": "inverted", "rows": "uniform"}),
            ("mask-wrong-sign", "they are boosted, e.g. by + 1e10", {"mask_mode": "plus-blocked"}),
            ("mask-zero-before-softmax", "", {"mask_mode": "zero"}),
            ("weights-not-normalized", "you zero the blocked weights AFTER the softmax", {"mask_mode": "after"}),
        ]
        if fully_masked:
            out += [("nan-on-masked-row", "", {"rows": "nan"}), ("masked-row-not-zero", "", {"rows": "uniform"})]
    return out


def _diagnose(out_s, w_s, candidates, case: str, expected_out, expected_w, what="output", atol=1e-5, rtol=1e-4):
    """Raise CheckFailed naming the known mistake that explains (out_s, w_s); candidates are lazy."""
    weights_right = w_s is None or _close(w_s, expected_w, atol, rtol)
    for code, detail, thunk in candidates:
        try:
            with np.errstate(all="ignore"):
                c_out, c_w = thunk()
        except (ValueError, IndexError):  # this mistake cannot produce a result for this case's shapes
            continue
        if _close(out_s, c_out, atol, rtol) and (w_s is None or c_w is None or _close(w_s, c_w, atol, rtol)):
            raise _fail(code, detail=detail, case=case)
        if _close(out_s, expected_out, atol, rtol) and c_w is not None and w_s is not None and _close(
                w_s, c_w, atol, rtol):
            raise _fail(code, detail=detail, case=case + " (your output is right; your returned weights are not)")
    _generic_failure(out_s, expected_out, case, what, atol, rtol, w_s, expected_w, weights_right)


def _generic_failure(out_s, expected, case, what, atol, rtol, w_s=None, expected_w=None, weights_right=True):
    if out_s.shape != expected.shape:
        raise _fail("wrong-shape", f"Your {what} has shape {_shape(out_s.shape)}; expected {_shape(expected.shape)}.",
                    case=case)
    if w_s is not None and w_s.shape != expected_w.shape:
        raise _fail("wrong-shape", f"Your weights have shape {_shape(w_s.shape)}; expected "
                    f"{_shape(expected_w.shape)} (..., Tq, Tk).", case=case)
    if not np.all(np.isfinite(out_s)) and np.all(np.isfinite(expected)):
        raise _fail("nan-output", case=case)
    if _close(out_s, expected, atol, rtol) and not weights_right:
        diff = np.abs(w_s - expected_w)
        raise _fail("wrong-output", "Your output is right, but the attention weights you return differ from the "
                    f"reference (largest difference {np.nanmax(diff):.2g}).", case=case)
    diff = np.abs(out_s - expected)
    diff = np.where(np.isnan(diff), np.inf, diff)
    idx = tuple(int(i) for i in np.unravel_index(np.argmax(diff), diff.shape)) if diff.size else ()
    raise _fail(
        "wrong-output",
        f"Your {what} differs from the reference (largest difference {np.max(diff):.2g} at index {idx}) and matches "
        "none of the mistakes this checker knows. Compare your steps with the chapter, one intermediate result at "
        "a time.",
        case=case,
    )


# ----------------------------------------------------------------------------------------------------------
# Random cases
# ----------------------------------------------------------------------------------------------------------


def _mixed_mask(rng, shape):
    """Random boolean mask in which every row has at least one True and one False."""
    mask = rng.random(shape) < 0.5
    t = shape[-1]
    rows = mask.reshape(-1, t)
    for row in rows:
        i, j = rng.choice(t, size=2, replace=False)
        row[i], row[j] = True, False
    return rows.reshape(shape)


def _make_mask(kind, rng, batch, tq, tk):
    if kind is None:
        return None, "no mask"
    if kind == "random":
        m = _mixed_mask(rng, (tq, tk))
        return m, f"random mask of shape {_shape(m.shape)}"
    if kind == "random-batched":
        m = _mixed_mask(rng, (batch[0],) + (1,) * (len(batch) - 1) + (tq, tk))
        return m, f"random mask of shape {_shape(m.shape)}"
    if kind == "causal":
        m = numpy_ref.causal_mask(tq, tk)
        return m, f"causal mask of shape {_shape(m.shape)}"
    if kind in ("padding", "padding-empty"):
        lengths = rng.integers(1, tk + 1, size=batch[0])
        if kind == "padding-empty":
            lengths[-1] = 0
        m = numpy_ref.padding_mask(lengths, tk).reshape((batch[0],) + (1,) * (len(batch) - 1) + (1, tk))
        return m, f"padding mask of shape {_shape(m.shape)} for lengths {[int(n) for n in lengths]}"
    if kind == "random-empty":
        m = _mixed_mask(rng, (tq, tk))
        m[rng.integers(tq)] = False
        return m, f"random mask of shape {_shape(m.shape)} with a fully masked row"
    raise ValueError(kind)  # pragma: no cover


# (batch dims, Tq, Tk, Dk, Dv, mask kind); ordered so that the simplest cases come first.
_SDPA_CASES = [
    ((), 4, 4, 8, 8, None),
    ((2,), 5, 5, 6, 6, None),
    ((2,), 3, 6, 8, 8, None),
    ((2, 3), 6, 4, 4, 8, None),
    ((3,), 1, 7, 16, 5, None),
    ((2, 2), 5, 9, 6, 3, None),
    ((), 5, 5, 8, 8, "random"),
    ((2,), 4, 7, 8, 8, "random"),
    ((2, 3), 3, 5, 4, 6, "random-batched"),
    ((), 6, 6, 8, 8, "causal"),
    ((2,), 3, 7, 8, 4, "causal"),
    ((2, 2), 5, 5, 4, 4, "causal"),
    ((3, 2), 4, 6, 8, 8, "padding"),
    ((2, 1), 5, 5, 4, 4, "padding"),
    ((4,), 2, 8, 8, 8, "padding"),
    ((), 7, 3, 5, 5, "random"),
    ((3,), 6, 6, 8, 2, "random-batched"),
    ((2, 4), 1, 5, 4, 4, "causal"),
    ((), 4, 6, 8, 8, "random-empty"),
    ((2,), 5, 5, 6, 6, "random-empty"),
    ((3, 2), 4, 5, 8, 8, "padding-empty"),
    ((2, 2), 3, 3, 4, 4, "padding-empty"),
    ((3,), 2, 4, 8, 4, "padding-empty"),
    ((), 6, 4, 4, 6, "random-empty"),
]


def _sdpa_cases(fully_masked_rows: bool, seed: int = 0):
    rng = np.random.default_rng(seed)
    for batch, tq, tk, dk, dv, kind in _SDPA_CASES:
        if not fully_masked_rows and kind is not None and kind.endswith("empty"):
            continue
        q = rng.standard_normal(batch + (tq, dk))
        k = rng.standard_normal(batch + (tk, dk))
        v = rng.standard_normal(batch + (tk, dv))
        mask, mask_text = _make_mask(kind, rng, batch, tq, tk)
        desc = f"q {_shape(q.shape)}, k {_shape(k.shape)}, v {_shape(v.shape)}, {mask_text}"
        yield q, k, v, mask, desc


def _to_framework(x, framework: str):
    """A float64/bool NumPy case array as the student's function receives it: a NumPy copy (float64), or a float32
    torch tensor / TensorFlow tensor (masks stay boolean)."""
    if x is None:
        return None
    if framework == "numpy":
        return x.copy()
    if framework == "tf":
        return _to_tf(x)
    if x.dtype == np.bool_:
        return torch.from_numpy(x.copy())
    return torch.tensor(x, dtype=torch.float32)


# ----------------------------------------------------------------------------------------------------------
# Attention core (NumPy chapter 1, PyTorch, einsum)
# ----------------------------------------------------------------------------------------------------------


def _check_sdpa_body(fn, framework, fully_masked_rows, label, atol, rtol, name=None):
    """``label`` names the function in failure messages (the contract's name); ``name`` in the success line."""
    cases = list(_sdpa_cases(fully_masked_rows))
    for i, (q, k, v, mask, desc) in enumerate(cases, 1):
        case = f"case {i} of {len(cases)}: {desc}"
        args = {"q": _to_framework(q, framework), "k": _to_framework(k, framework), "v": _to_framework(v, framework),
                "mask": _to_framework(mask, framework)}
        result = _call(fn, args, label, positional=3)
        out_s, w_s = _split_result(result, case)
        out_s = _as_array(out_s, "output" if w_s is not None else "result", case)
        w_s = None if w_s is None else _as_array(w_s, "weights", case)
        ref_out, ref_w = numpy_ref.scaled_dot_product_attention(q, k, v, mask)
        if _close(out_s, ref_out, atol, rtol) and (w_s is None or _close(w_s, ref_w, atol, rtol)):
            continue
        tq, dk = q.shape[-2:]
        tk, dv = v.shape[-2:]
        variants = _core_variants(dk, dv, tq, tk, q.ndim, mask is not None, fully_masked_rows)
        candidates = [(c, d, lambda kw=kw: _sdpa_variant(q, k, v, mask, **kw)) for c, d, kw in variants]
        _diagnose(out_s, w_s, candidates, case, ref_out, ref_w, atol=atol, rtol=rtol)
    extras = "Tq != Tk, masks, batch dims" + (", fully masked rows" if fully_masked_rows else "")
    return f"✓ {name or label}: {len(cases)} random cases ({extras}) match the reference"


_FRAMEWORKS = ("torch", "tf", "numpy")


def _check_framework(framework: str) -> None:
    if framework not in _FRAMEWORKS:
        raise ValueError(f"framework must be one of {', '.join(map(repr, _FRAMEWORKS))}, got {framework!r}")


def check_scaled_dot_product_attention(fn, *, fully_masked_rows: bool = True, framework: str = "torch",
                                       timeout: float = DEFAULT_TIMEOUT):
    """Check ``fn(q, k, v, mask=None)`` against the reference.

    q (..., Tq, Dk), k (..., Tk, Dk), v (..., Tk, Dv) are float32 tensors of ``framework``: ``"torch"`` (default),
    ``"tf"`` (TensorFlow, imported only then) or ``"numpy"`` (float64 arrays, compared more tightly); ``mask`` is
    None or a boolean tensor broadcastable to (..., Tq, Tk), True = may attend. ``fn`` returns out (..., Tq, Dv) or
    (out, weights), as tensors or arrays of any of these frameworks. With ``fully_masked_rows`` (default) some
    query rows may attend no key: they must give zero weights and a zero output.
    """
    _check_framework(framework)
    label = "scaled_dot_product_attention"
    atol, rtol = (1e-8, 1e-6) if framework == "numpy" else (2e-5, 1e-4)
    _run_check(lambda: _check_sdpa_body(fn, framework, fully_masked_rows, label, atol, rtol, _name(fn, label)),
               timeout)


def check_numpy_attention(fn, *, fully_masked_rows: bool = False, timeout: float = DEFAULT_TIMEOUT):
    """Chapter 1: check ``fn(q, k, v, mask=None)`` on NumPy float64 arrays (same contract as
    :func:`check_scaled_dot_product_attention`). Fully masked rows are only tested if ``fully_masked_rows``."""
    label = "attention (NumPy)"
    _run_check(lambda: _check_sdpa_body(fn, "numpy", fully_masked_rows, label, 1e-8, 1e-6, _name(fn, label)), timeout)


def check_attention_one_query(fn, *, timeout: float = DEFAULT_TIMEOUT):
    """Chapter 1: check ``fn(q, k, v)`` for ONE query: q (Dk,), k (Tk, Dk), v (Tk, Dv) NumPy arrays ->
    output (Dv,) or (output, weights (Tk,))."""

    def body():
        rng = np.random.default_rng(1)
        shapes = [(4, 6, 6), (1, 3, 3), (5, 8, 3), (7, 4, 10), (3, 16, 16), (9, 2, 5)]
        for i, (tk, dk, dv) in enumerate(shapes, 1):
            q, k, v = rng.standard_normal(dk), rng.standard_normal((tk, dk)), rng.standard_normal((tk, dv))
            case = f"case {i} of {len(shapes)}: q {_shape(q.shape)}, k {_shape(k.shape)}, v {_shape(v.shape)}"
            result = _call(fn, {"q": q.copy(), "k": k.copy(), "v": v.copy()}, "attention_one_query")
            out_s, w_s = _split_result(result, case)
            out_s = _as_array(out_s, "output" if w_s is not None else "result", case)
            w_s = None if w_s is None else _as_array(w_s, "weights", case)
            ref_out, ref_w = (a[0] for a in numpy_ref.scaled_dot_product_attention(q[None], k, v))
            if _close(out_s, ref_out, 1e-8, 1e-6) and (w_s is None or _close(w_s, ref_w, 1e-8, 1e-6)):
                continue
            variants = [c for c in _core_variants(dk, dv, 1, tk, 2, False, False) if c[0] != "softmax-wrong-axis"]
            candidates = [
                (c, d, lambda kw=kw: tuple(a[0] for a in _sdpa_variant(q[None], k, v, None, **kw)))
                for c, d, kw in variants
            ]
            _diagnose(out_s, w_s, candidates, case, ref_out, ref_w, atol=1e-8, rtol=1e-6)
        return (f"✓ {_name(fn, 'attention for one query')}: {len(shapes)} random cases (one query; several Tk, "
                "d_k != d_v) match the reference")

    _run_check(body, timeout)


def check_softmax(fn, *, timeout: float = DEFAULT_TIMEOUT):
    """Chapter 1: check a NumPy ``fn(x)`` = softmax along the last axis: any shape, large values, -inf entries
    (every row keeps at least one finite entry); the input must not be modified."""

    def body():
        rng = np.random.default_rng(2)
        xs = [
            ("a vector of 5 values", rng.standard_normal(5) * 3),
            ("a (3, 4) matrix", rng.standard_normal((3, 4)) * 3),
            ("a (2, 3, 5) array", rng.standard_normal((2, 3, 5)) * 3),
            ("a (4, 4) matrix", rng.standard_normal((4, 4))),
            ("a vector of large values (about 1000)", 1000 + rng.standard_normal(6)),
            ("a (3, 5) matrix of large values (up to 800)", rng.standard_normal((3, 5)) * 300),
            ("a (2, 6) matrix of very negative values (about -1000)", -1000 + rng.standard_normal((2, 6))),
            ("a (4, 5) matrix with -inf entries", _with_neg_inf(rng, (4, 5))),
            ("a (2, 2, 6) array with -inf entries", _with_neg_inf(rng, (2, 2, 6))),
            ("a (5, 1) matrix (one entry per row)", rng.standard_normal((5, 1))),
        ]
        for i, (text, x) in enumerate(xs, 1):
            case = f"case {i} of {len(xs)}: {text}"
            out_s = _as_array(_call(fn, {"x": x.copy()}, "softmax"), "result", case)
            ref = numpy_ref.softmax(x)
            if _close(out_s, ref, 1e-8, 1e-6):
                continue
            candidates = [
                ("softmax-overflow", "", lambda x=x: (numpy_ref.softmax_unstable(x), None)),
                ("weights-not-normalized", "you take exp() without dividing by the sum",
                 lambda x=x: (np.exp(x), None)),
                ("weights-not-normalized", "you take exp() without dividing by the sum",
                 lambda x=x: (np.exp(x - x.max(axis=-1, keepdims=True)), None)),
                ("weights-not-normalized", "you divide by the sum of the inputs instead of the sum of exp()",
                 lambda x=x: (np.exp(x) / x.sum(axis=-1, keepdims=True), None)),
                ("softmax-wrong-axis", "you normalised over the whole array at once",
                 lambda x=x: (np.exp(x - x.max()) / np.exp(x - x.max()).sum(), None)),
            ]
            for axis in range(x.ndim - 1):
                candidates.append(("softmax-wrong-axis", f"you normalised along axis {axis}",
                                   lambda x=x, axis=axis: (numpy_ref.softmax(x, axis=axis), None)))
                candidates.append(("softmax-wrong-axis", f"you normalised along axis {axis} (no max subtraction)",
                                   lambda x=x, axis=axis: (numpy_ref.softmax_unstable(x, axis=axis), None)))
            _diagnose(out_s, None, candidates, case, ref, None, what="result", atol=1e-8, rtol=1e-6)
        return (f"✓ {_name(fn, 'softmax')}: {len(xs)} random cases (1-D to 3-D, large values, -inf entries) match "
                "the reference; the input is left unchanged")

    _run_check(body, timeout)


def _with_neg_inf(rng, shape):
    x = rng.standard_normal(shape) * 2
    blocked = _mixed_mask(rng, shape)
    return np.where(blocked, x, -np.inf)


# ----------------------------------------------------------------------------------------------------------
# Masks
# ----------------------------------------------------------------------------------------------------------


def check_causal_mask(fn, *, timeout: float = DEFAULT_TIMEOUT):
    """Check ``fn(t_q, t_k=None)`` -> boolean (Tq, Tk) mask (torch or NumPy), True = may attend, bottom-right
    aligned: query i may attend key j iff j <= i + (Tk - Tq). Called as fn(t) and fn(t_q, t_k) with Tq <= Tk."""

    def body():
        calls = [(4,), (5, 5), (1,), (6,), (3, 7), (1, 6), (2, 3), (4, 9)]
        for i, sizes in enumerate(calls, 1):
            t_q, t_k = sizes[0], sizes[-1]
            text = f"causal_mask({', '.join(map(str, sizes))})"
            case = f"case {i} of {len(calls)}: {text}"
            args = {"t_q": t_q} if len(sizes) == 1 else {"t_q": t_q, "t_k": t_k}
            mask = _as_array(_call(fn, args, "causal_mask", call_text=text), "result", case, kind="bool")
            ref = numpy_ref.causal_mask(t_q, t_k)
            if mask.shape == ref.shape and np.array_equal(mask, ref):
                continue
            ones = np.ones((t_q, t_k), dtype=bool)
            candidates = [
                ("mask-inverted", _CAUSAL_TRUE, lambda: (~ref, None)),
                ("mask-inverted", _CAUSAL_TRUE, lambda: (np.triu(ones), None)),
                ("mask-inverted", _CAUSAL_TRUE, lambda: (np.triu(ones, 1), None)),
                ("causal-top-left-aligned", "", lambda: (np.tril(ones), None)),
                ("causal-excludes-diagonal", "", lambda: (np.tril(ones, t_k - t_q - 1), None)),
                ("causal-excludes-diagonal", "", lambda: (np.tril(ones, -1), None)),
            ]
            _diagnose(mask.astype(float), None, [(c, d, lambda f=f: (f()[0].astype(float), None)) for c, d, f in
                                                 candidates], case, ref.astype(float), None, what="mask")
        return (f"✓ {_name(fn, 'causal_mask')}: {len(calls)} sizes (Tq == Tk and Tq < Tk, bottom-right aligned) "
                "match the reference")

    _run_check(body, timeout)


def check_padding_mask(fn, *, framework: str = "torch", timeout: float = DEFAULT_TIMEOUT):
    """Check ``fn(lengths, t)`` -> boolean mask broadcastable to (B, 1, 1, T): key j of sequence b may be attended
    iff j < lengths[b]. ``lengths`` is a LongTensor (or a NumPy int array with ``framework="numpy"``)."""

    def body():
        batches = [([3, 5, 1], 5), ([2, 2], 4), ([4], 6), ([6, 1, 3, 2], 6), ([0, 3], 3), ([7, 2, 5], 8)]
        for i, (lengths, t) in enumerate(batches, 1):
            text = f"padding_mask({lengths}, {t})"
            case = f"case {i} of {len(batches)}: {text}"
            arg = torch.tensor(lengths, dtype=torch.long) if framework == "torch" else np.array(lengths)
            mask = _as_array(_call(fn, {"lengths": arg, "t": t}, "padding_mask", call_text=text), "result", case,
                             kind="bool")
            ref = numpy_ref.padding_mask(lengths, t)  # (B, 1, 1, T)
            try:
                ok_shape = mask.ndim <= 4 and np.broadcast_shapes(mask.shape, ref.shape) == ref.shape
            except ValueError:
                ok_shape = False
            if not ok_shape:
                hint = (" A (B, T) mask would be lined up with the (Tq, Tk) axes of the scores: add the two "
                        "singleton axes, e.g. mask[:, None, None, :]." if mask.shape == (len(lengths), t) else "")
                raise _fail("wrong-shape", f"Your mask has shape {_shape(mask.shape)}, which does not broadcast to "
                            f"(B, 1, 1, T) = {_shape(ref.shape)}.{hint}", case=case)
            full = np.broadcast_to(mask, ref.shape).astype(float)
            if np.array_equal(full, ref):
                continue
            pos = np.arange(t)[None, None, None, :]
            n = np.array(lengths)[:, None, None, None]
            candidates = [
                ("mask-inverted", "your mask is True at the padding positions; it must be True for the real "
                 "tokens (j < lengths[b])", lambda: ((~ref).astype(float), None)),
                ("off-by-one", "", lambda: ((pos <= n).astype(float), None)),
                ("off-by-one", "", lambda: ((pos < n - 1).astype(float), None)),
            ]
            _diagnose(full, None, candidates, case, ref.astype(float), None, what="mask")
        return (f"✓ {_name(fn, 'padding_mask')}: {len(batches)} batches of lengths match the reference (shape "
                "(B, 1, 1, T), True = may attend)")

    _run_check(body, timeout)


# ----------------------------------------------------------------------------------------------------------
# Heads
# ----------------------------------------------------------------------------------------------------------

_HEAD_SHAPES = [(2, 5, 12, 3), (1, 4, 8, 2), (3, 6, 16, 4), (2, 3, 6, 6), (2, 7, 12, 2)]


def check_split_heads(fn, *, timeout: float = DEFAULT_TIMEOUT):
    """Check ``fn(x, num_heads)``: (B, T, D) torch tensor -> (B, H, T, Dh)."""

    def body():
        rng = np.random.default_rng(3)
        for i, (b, t, d, h) in enumerate(_HEAD_SHAPES, 1):
            x = rng.standard_normal((b, t, d))
            case = f"case {i} of {len(_HEAD_SHAPES)}: x of shape {_shape(x.shape)}, num_heads={h}"
            out = _as_array(_call(fn, {"x": _to_framework(x, "torch"), "num_heads": h}, "split_heads"), "result",
                            case)
            ref = numpy_ref.split_heads(x, h)
            if _close(out, ref, 1e-6, 1e-6):
                continue
            candidates = [
                ("heads-split-without-transpose", "", lambda x=x, h=h: (x.reshape(b, h, t, d // h), None)),
                ("heads-split-without-transpose", "", lambda x=x, h=h: (x.reshape(b, t, h, d // h), None)),
            ]
            _diagnose(out, None, candidates, case, ref, None, what="result", atol=1e-6, rtol=1e-6)
        return (f"✓ {_name(fn, 'split_heads')}: {len(_HEAD_SHAPES)} random cases ((B, T, D) -> (B, H, T, Dh)) match "
                "the reference")

    _run_check(body, timeout)


def check_merge_heads(fn, *, timeout: float = DEFAULT_TIMEOUT):
    """Check ``fn(x)``: (B, H, T, Dh) torch tensor -> (B, T, D) with D = H * Dh."""

    def body():
        rng = np.random.default_rng(4)
        for i, (b, t, d, h) in enumerate(_HEAD_SHAPES, 1):
            x = rng.standard_normal((b, h, t, d // h))
            case = f"case {i} of {len(_HEAD_SHAPES)}: x of shape {_shape(x.shape)}"
            out = _as_array(_call(fn, {"x": _to_framework(x, "torch")}, "merge_heads"), "result", case)
            ref = numpy_ref.merge_heads(x)
            if _close(out, ref, 1e-6, 1e-6):
                continue
            candidates = [
                ("merge-heads-wrong-order", "", lambda x=x: (x.reshape(b, t, d), None)),
                ("merge-heads-wrong-order", "", lambda x=x: (x.transpose(0, 2, 3, 1).reshape(b, t, d), None)),
            ]
            _diagnose(out, None, candidates, case, ref, None, what="result", atol=1e-6, rtol=1e-6)
        return (f"✓ {_name(fn, 'merge_heads')}: {len(_HEAD_SHAPES)} random cases ((B, H, T, Dh) -> (B, T, D)) match "
                "the reference")

    _run_check(body, timeout)


# ----------------------------------------------------------------------------------------------------------
# Multi-head attention (PyTorch module, einsum module or function, Keras layer)
# ----------------------------------------------------------------------------------------------------------


def _mha_variant(query, key, value, p, num_heads, mask, *, split="ok", merge="ok", out_proj=True, value_src="value",
                 w_v="w_v", transposed="", core=None):
    """numpy_ref.multi_head_attention with one deliberate deviation; returns (out, weights).

    ``transposed``: the projections (letters of "qkvo") whose weight is used transposed, i.e. a (d_in, d_out)
    matrix read as (d_out, d_in); only runs when those weights are square (else ValueError: not applicable).
    """
    d = p["w_q"].shape[1]
    h, dh = num_heads, d // num_heads

    def w(name):
        return p[name].T if name[-1] in transposed else p[name]

    def sp(x):
        b, t, _ = x.shape
        return numpy_ref.split_heads(x, h) if split == "ok" else x.reshape(b, h, t, dh)

    q = sp(query @ w("w_q") + p["b_q"])
    k = sp(key @ w("w_k") + p["b_k"])
    v = sp((key if value_src == "key" else value) @ w(w_v) + p["b" + w_v[1:]])
    heads, weights = _sdpa_variant(q, k, v, mask, **(core or {}))
    b, _, t, _ = heads.shape
    if merge == "ok":
        merged = numpy_ref.merge_heads(heads)
    elif merge == "reshape":
        merged = heads.reshape(b, t, d)
    else:
        merged = heads.transpose(0, 2, 3, 1).reshape(b, t, d)
    return (merged @ w("w_o") + p["b_o"] if out_proj else merged), weights


def _layout_subsets():
    """(letters, description) for every non-empty set of projections whose weight may be read transposed; the
    likeliest first: all four, then three, two, one."""
    out = []
    for size in (4, 3, 2, 1):
        for letters in itertools.combinations("qkvo", size):
            names = [f"w_{x}" for x in letters]
            text = names[0] if size == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
            out.append(("".join(letters), "all four weights (w_q, w_k, w_v and w_o)" if size == 4 else text))
    return out


_LAYOUT_SUBSETS = _layout_subsets()


def _mha_candidates(query, key, value, p, num_heads, mask, fully_masked, layout_code="weight-layout-transposed"):
    """The known multi-head mistakes. ``layout_code`` names a weight used transposed: "weight-not-transposed" when
    the checker loaded the weights into nn.Linear layers itself (the forward computes x @ linear.weight), else
    "weight-layout-transposed" (the student's loader or function reads the (d_in, d_out) matrices as (d_out, d_in))."""
    d = p["w_q"].shape[1]
    dh = d // num_heads
    tq, tk = query.shape[1], key.shape[1]
    structural = [(layout_code, detail, {"transposed": letters}) for letters, detail in _LAYOUT_SUBSETS]
    structural += [
        ("values-from-keys", " (the values are projected from the key input)", {"value_src": "key"}),
        ("values-from-keys", " (the values go through w_k instead of w_v)", {"w_v": "w_k"}),
        ("heads-split-without-transpose", "", {"split": "reshape"}),
        ("heads-split-without-transpose", "", {"split": "reshape", "merge": "reshape"}),
        ("merge-heads-wrong-order", "", {"merge": "reshape"}),
        ("merge-heads-wrong-order", "", {"merge": "permute"}),
        ("missing-output-projection", "", {"out_proj": False}),
    ]
    extra = [(1.0 / math.sqrt(d), "they are divided by sqrt(d_model) instead of sqrt(d_k) = sqrt(d_model / H)"),
             (1.0 / d, "they are divided by d_model instead of sqrt(d_k) = sqrt(d_model / H)")]
    core = _core_variants(dh, dh, tq, tk, 4, mask is not None, fully_masked, extra_scales=extra)
    out = [(c, det, lambda kw=kw: _mha_variant(query, key, value, p, num_heads, mask, **kw)) for c, det, kw in
           structural]
    out += [(c, det, lambda kw=kw: _mha_variant(query, key, value, p, num_heads, mask, core=kw)) for c, det, kw in
            core if c != "values-from-keys"]
    return out


def _mha_cases(d_model, seed=5):
    """(query, key, value, mask, description) with B = 2: self-attention, cross-attention, masks."""
    rng = np.random.default_rng(seed)
    b = 2

    def x(t):
        return rng.standard_normal((b, t, d_model))

    cases = []
    s = x(5)
    cases.append((s, s, s, None, "self-attention, x (2, 5, D), no mask"))
    cases.append((x(4), x(6), x(6), None, "cross-attention, query (2, 4, D), key and value (2, 6, D), no mask"))
    s = x(6)
    cases.append((s, s, s, numpy_ref.causal_mask(6), "self-attention, x (2, 6, D), causal mask (6, 6)"))
    lengths = [6, 3]
    cases.append((x(3), x(6), x(6), numpy_ref.padding_mask(lengths, 6),
                  f"cross-attention, query (2, 3, D), key and value (2, 6, D), padding mask (2, 1, 1, 6) for lengths "
                  f"{lengths}"))
    mask = _mixed_mask(rng, (b, 1, 5, 4))
    cases.append((x(5), x(4), x(4), mask, "cross-attention, query (2, 5, D), key and value (2, 4, D), random mask "
                  "(2, 1, 5, 4)"))
    s = x(4)
    mask = _mixed_mask(rng, (4, 4))
    mask[2] = False
    cases.append((s, s, s, mask, "self-attention, x (2, 4, D), mask (4, 4) whose row 2 is fully masked"))
    return cases


def _mha_cross_dim_cases(d_model, kdim, vdim, seed=6):
    """Cross-attention cases whose keys and values have their own feature sizes kdim, vdim != d_model: w_k is
    (kdim, D) and w_v (vdim, D), so code that only works for square weights fails here."""
    rng = np.random.default_rng(seed)

    def x(t, d):
        return rng.standard_normal((2, t, d))

    lengths = [5, 2]
    return [
        (x(4, d_model), x(6, kdim), x(6, vdim), None,
         "cross-attention, query (2, 4, D), key (2, 6, kdim), value (2, 6, vdim), no mask"),
        (x(3, d_model), x(5, kdim), x(5, vdim), numpy_ref.padding_mask(lengths, 5),
         f"cross-attention, query (2, 3, D), key (2, 5, kdim), value (2, 5, vdim), padding mask (2, 1, 1, 5) for "
         f"lengths {lengths}"),
        (x(5, d_model), x(4, kdim), x(4, vdim), _mixed_mask(rng, (2, 1, 5, 4)),
         "cross-attention, query (2, 5, D), key (2, 4, kdim), value (2, 4, vdim), random mask (2, 1, 5, 4)"),
    ]


def _mha_configs(cross_dims: bool):
    """(d_model, num_heads, kdim, vdim, params, cases): the square sizes first (a weight read transposed still
    runs there and is diagnosed), then, with ``cross_dims``, keys and values of other widths."""
    configs = []
    for d_model, num_heads in _MHA_CONFIGS:
        params = numpy_ref.init_mha_params(d_model, seed=d_model)
        configs.append((d_model, num_heads, None, None, params, _mha_cases(d_model)))
    if cross_dims:
        d_model, num_heads, kdim, vdim = _MHA_CROSS_DIM_CONFIG
        params = numpy_ref.init_mha_params(d_model, kdim, vdim, seed=kdim + vdim)
        configs.append((d_model, num_heads, kdim, vdim, params, _mha_cross_dim_cases(d_model, kdim, vdim)))
    return configs


@contextlib.contextmanager
def _cross_dim_note(d_model, kdim, vdim):
    """In a configuration with kdim, vdim != d_model (after the square ones passed), add to an exception's message
    what differs: code that assumes d_in == d_model raises here."""
    try:
        yield
    except CheckFailed as err:
        if kdim is None or err.code != "raised-exception":
            raise
        raise CheckFailed(f"{err}\n  Your code passed the cases with square weights. Here the keys have kdim={kdim} "
                          f"and the values vdim={vdim} features, not d_model={d_model}: w_k is ({kdim}, {d_model}) and "
                          f"w_v ({vdim}, {d_model}), each W (d_in, d_out). Does your code assume d_in == d_model "
                          "somewhere?") from None


def _mha_case_prefix(d_model, num_heads, kdim, vdim):
    dims = "" if kdim is None else f", kdim={kdim}, vdim={vdim}"
    return f"d_model={d_model}, num_heads={num_heads}{dims}"


def _mha_success(label, n, cross_dims):
    dims = ", also with kdim, vdim != d_model;" if cross_dims else ","
    return f"✓ {label}: {n} cases (2 sizes; self- and cross-attention{dims} Tq != Tk, masks) match the reference"


def _call_mha(module, query, key, value, mask, framework, label, training=None):
    conv = (lambda a: _to_framework(a, "torch")) if framework == "torch" else _to_tf
    args = {"query": conv(query), "key": conv(key), "value": conv(value)}
    if mask is not None:
        args["mask"] = conv(mask)
    if training is not None:
        args["training"] = training
    if framework == "torch":
        with torch.no_grad():
            return _call(module, args, f"{label}(...)", positional=3)
    return _call(module, args, f"{label}(...)", positional=3)


def _to_tf(a):
    import tensorflow as tf

    return tf.constant(a if a.dtype == np.bool_ else a.astype(np.float32))


_MHA_MISSING = ("Name the projections self.w_q, self.w_k, self.w_v and self.w_o, each an nn.Linear(d_model, "
                "d_model).")


def _has_linears(module, names=("w_q", "w_k", "w_v")) -> bool:
    """Whether the checker loads the weights itself: the module has nn.Linear attributes w_q, w_k, w_v."""
    return all(isinstance(getattr(module, name, None), torch.nn.Linear) for name in names)


def _load_torch_mha(module, params, label, names=("w_q", "w_k", "w_v", "w_o"), advice=_MHA_MISSING):
    """Copy ``params`` (x @ W + b convention) into the module's nn.Linear layers ``names`` (w_o may be missing:
    diagnosed from the output), or through its ``load_numpy_params``; returns the params actually in effect
    (zero biases for layers built without one)."""
    from torch import nn

    linears = {name: getattr(module, name, None) for name in names}
    effective = dict(params)
    if _has_linears(module):
        for name, lin in linears.items():
            if not isinstance(lin, nn.Linear):
                continue  # a module without w_o: diagnosed from its output
            w = params[name].T
            if tuple(lin.weight.shape) != w.shape:
                raise _fail("wrong-shape", f"{label}.{name}.weight has shape {_shape(lin.weight.shape)}; expected "
                            f"{_shape(w.shape)} (nn.Linear({w.shape[1]}, {w.shape[0]})).")
            with torch.no_grad():
                lin.weight.copy_(torch.tensor(w, dtype=lin.weight.dtype))
                if lin.bias is not None:
                    lin.bias.copy_(torch.tensor(params["b" + name[1:]], dtype=lin.bias.dtype))
                else:
                    effective["b" + name[1:]] = np.zeros_like(params["b" + name[1:]])
        return effective
    if callable(getattr(module, "load_numpy_params", None)):
        _call(module.load_numpy_params, {"params": params}, f"{label}.load_numpy_params")
        return effective
    missing = [name for name, lin in linears.items() if not isinstance(lin, nn.Linear)]
    raise _fail("missing-attribute", f"Your module has no nn.Linear attribute(s) {', '.join(missing)} (and no "
                f"load_numpy_params method), so the checker cannot load known weights. {advice}")


def _construct(cls, label, d_model, num_heads, **kwargs):
    return _construct_with(cls, label, {"d_model": d_model, "num_heads": num_heads}, **kwargs)


def _construct_with(cls, label, sizes: dict, **kwargs):
    """``cls(*sizes.values(), **kwargs)``; failures become CheckFailed naming the call."""
    args = {**sizes, **kwargs}
    text = f"{label}({', '.join(map(str, sizes.values()))}{''.join(f', {k}={v!r}' for k, v in kwargs.items())})"
    return _call(cls, args, label, positional=len(sizes), call_text=text)


def _torch_module(cls, label, sizes, dropout, **kwargs):
    """Build the student's torch module (with ``dropout=`` unless None, and ``kwargs``) in eval mode."""
    kwargs = kwargs if dropout is None else {"dropout": dropout, **kwargs}
    module = _construct_with(cls, label, sizes, **kwargs)
    if not isinstance(module, torch.nn.Module):
        raise _fail("wrong-type", f"{label}(...) built a {type(module).__name__}; expected a torch.nn.Module.")
    return module.eval()


def _parameters(obj) -> dict:
    """The parameters of ``obj``'s signature by name (empty when it has no readable signature)."""
    try:
        return dict(inspect.signature(obj).parameters)
    except (TypeError, ValueError):
        return {}


def _accepts_cross_dims(cls) -> bool:
    """Whether ``cls(d_model, num_heads, kdim=..., vdim=...)`` is part of the class's signature."""
    params = _parameters(cls)
    return "kdim" in params and "vdim" in params


_MHA_CONFIGS = [(12, 3), (8, 2)]
_MHA_CROSS_DIM_CONFIG = (12, 3, 8, 5)  # d_model, num_heads, kdim, vdim


def _check_mha_body(make, load, run, label, test_dropout, atol=2e-5, rtol=1e-4, cross_dims=False,
                    layout_code=lambda module: "weight-layout-transposed"):
    """Shared body for module checks. make(d_model, num_heads, dropout, **dims) -> module (dims: kdim, vdim when
    ``cross_dims``); load(module, params) -> params in effect; run(module, query, key, value, mask,
    training=None) -> result; layout_code(module) -> the code for a weight used transposed."""
    n = 0
    for d_model, num_heads, kdim, vdim, params, cases in _mha_configs(cross_dims):
        with _cross_dim_note(d_model, kdim, vdim):
            dims = {} if kdim is None else {"kdim": kdim, "vdim": vdim}
            module = make(d_model, num_heads, None, **dims)
            effective = load(module, params)
            prefix = _mha_case_prefix(d_model, num_heads, kdim, vdim)
            for i, (query, key, value, mask, desc) in enumerate(cases, 1):
                n += 1
                case = f"{prefix}, case {i} of {len(cases)}: {desc}"
                out_s, w_s = _split_result(run(module, query, key, value, mask), case)
                out_s = _as_array(out_s, "output" if w_s is not None else "result", case)
                w_s = None if w_s is None else _as_array(w_s, "weights", case)
                ref_out, ref_w = numpy_ref.multi_head_attention(query, key, value, effective, num_heads, mask)
                if _close(out_s, ref_out, atol, rtol) and (w_s is None or _close(w_s, ref_w, atol, rtol)):
                    continue
                candidates = _mha_candidates(query, key, value, effective, num_heads, mask, True,
                                             layout_code(module))
                _diagnose(out_s, w_s, candidates, case, ref_out, ref_w, atol=atol, rtol=rtol)
    text = _mha_success(label, n, cross_dims)
    if not test_dropout:
        return text
    d_model, num_heads = _MHA_CONFIGS[0]
    params = numpy_ref.init_mha_params(d_model, seed=d_model)
    module = make(d_model, num_heads, 0.5)
    effective = load(module, params)
    query, key, value, mask, desc = _mha_cases(d_model)[1]
    ref_out, _ = numpy_ref.multi_head_attention(query, key, value, effective, num_heads, mask)
    outs = [_as_array(_split_result(run(module, query, key, value, mask, training=False), desc)[0], "result", desc)
            for _ in range(2)]
    _require_eval_outputs(outs, ref_out, atol, rtol, case=f"d_model={d_model}, num_heads={num_heads}: {desc}")
    return text + "; dropout is off in eval mode"


def _require_eval_outputs(outs, ref_out, atol, rtol, case):
    """Two eval-mode outputs of a module built with dropout=0.5 must both equal the dropout-free reference."""
    if _close(outs[0], ref_out, atol, rtol) and _close(outs[1], ref_out, atol, rtol):
        return
    detail = ("two calls on the same input gave different outputs" if not _close(outs[0], outs[1], atol, rtol)
              else "its output in evaluation mode differs from the same weights' output without dropout")
    raise _fail("dropout-in-eval", detail=detail, case=case)


def check_multi_head_attention(cls, *, test_dropout: bool = True, timeout: float = DEFAULT_TIMEOUT):
    """Check a PyTorch multi-head attention class.

    ``cls(d_model, num_heads)`` (and ``cls(d_model, num_heads, dropout=0.5)`` if ``test_dropout``) must build an
    ``nn.Module`` with ``nn.Linear`` attributes ``w_q``, ``w_k``, ``w_v``, ``w_o`` (or a ``load_numpy_params``
    method); known weights are loaded into them. ``module(query, key, value, mask=mask)`` with query (B, Tq, D),
    key/value (B, Tk, D) and a boolean mask broadcastable to (B, H, Tq, Tk) must return out (B, Tq, D) or
    (out, weights (B, H, Tq, Tk)); compared with :func:`numpy_ref.multi_head_attention`. With dropout=0.5 and
    ``.eval()`` the module must be deterministic and match the reference. A class whose signature has ``kdim``
    and ``vdim`` is also built as ``cls(d_model, num_heads, kdim=kdim, vdim=vdim)`` and run on keys (B, Tk, kdim)
    and values (B, Tk, vdim) of other widths than d_model (w_k then maps kdim -> D, w_v vdim -> D).
    """
    label = _name(cls, "MultiHeadAttention")

    def make(d_model, num_heads, dropout, **dims):
        return _torch_module(cls, label, {"d_model": d_model, "num_heads": num_heads}, dropout, **dims)

    def run(module, query, key, value, mask, training=None):
        return _call_mha(module, query, key, value, mask, "torch", label)

    def layout_code(module):
        return "weight-not-transposed" if _has_linears(module) else "weight-layout-transposed"

    _run_check(lambda: _check_mha_body(make, lambda m, p: _load_torch_mha(m, p, label), run, label, test_dropout,
                                       cross_dims=_accepts_cross_dims(cls), layout_code=layout_code), timeout)


def _check_mha_function_body(fn, label, atol=2e-5, rtol=1e-4):
    n = 0
    for d_model, num_heads, kdim, vdim, params, cases in _mha_configs(cross_dims=True):
        tparams = {name: torch.tensor(value, dtype=torch.float32) for name, value in params.items()}
        prefix = _mha_case_prefix(d_model, num_heads, kdim, vdim)
        for i, (query, key, value, mask, desc) in enumerate(cases, 1):
            n += 1
            case = f"{prefix}, case {i} of {len(cases)}: {desc}"
            args = {"query": _to_framework(query, "torch"), "key": _to_framework(key, "torch"),
                    "value": _to_framework(value, "torch"), "params": tparams, "num_heads": num_heads,
                    "mask": _to_framework(mask, "torch")}
            with torch.no_grad(), _cross_dim_note(d_model, kdim, vdim):
                result = _call(fn, args, label, positional=5)
            out_s, w_s = _split_result(result, case)
            out_s = _as_array(out_s, "output" if w_s is not None else "result", case)
            w_s = None if w_s is None else _as_array(w_s, "weights", case)
            ref_out, ref_w = numpy_ref.multi_head_attention(query, key, value, params, num_heads, mask)
            if _close(out_s, ref_out, atol, rtol) and (w_s is None or _close(w_s, ref_w, atol, rtol)):
                continue
            _diagnose(out_s, w_s, _mha_candidates(query, key, value, params, num_heads, mask, True), case, ref_out,
                      ref_w, atol=atol, rtol=rtol)
    return _mha_success(label, n, cross_dims=True)


def check_einsum_attention(fn_or_cls, *, timeout: float = DEFAULT_TIMEOUT):
    """Check einsum attention, whichever form the exercise uses:

    * a class -> as :func:`check_multi_head_attention` (weights loaded through ``load_numpy_params`` when the
      projections are not ``nn.Linear`` layers; kdim, vdim != d_model tried when the class accepts them);
    * a function with a ``params`` argument -> ``fn(query, key, value, params, num_heads, mask=None)`` with
      params a dict of float32 tensors (keys w_q, b_q, ..., ``x @ W + b`` convention: w_q (D, D), w_k (kdim, D),
      w_v (vdim, D), w_o (D, D)), compared with :func:`numpy_ref.multi_head_attention`, on square weights and on
      cross-attention with keys (B, Tk, kdim) and values (B, Tk, vdim) of other widths than d_model;
    * any other function -> ``fn(q, k, v, mask=None)`` as :func:`check_scaled_dot_product_attention`.
    """
    if inspect.isclass(fn_or_cls):
        check_multi_head_attention(fn_or_cls, timeout=timeout)
        return
    label = _name(fn_or_cls, "einsum attention")
    if "params" in _parameters(fn_or_cls):
        _run_check(lambda: _check_mha_function_body(fn_or_cls, label), timeout)
    else:
        _run_check(lambda: _check_sdpa_body(fn_or_cls, "torch", True, label, 2e-5, 1e-4), timeout)


class _KerasErrorsUnfiltered:
    """While active, Keras does not rewrite errors raised in a layer's ``call()`` (its traceback filtering turns
    them into a multi-line "Exception encountered when calling ..." dump); the previous setting is restored."""

    def __enter__(self):
        import keras

        self.keras, self.was_enabled = keras, keras.config.is_traceback_filtering_enabled()
        keras.config.disable_traceback_filtering()
        return self

    def __exit__(self, *exc):
        if self.was_enabled:
            self.keras.config.enable_traceback_filtering()


def check_keras_attention(cls, *, test_dropout: bool = True, timeout: float = 60.0):
    """Check a Keras multi-head attention layer class (TensorFlow is imported only here).

    ``cls(d_model, num_heads)`` (and ``dropout=0.5``) must build a Keras layer with ``load_numpy_params(params)``
    (called after the layer is built by a first call); ``layer(query, key, value, mask=mask, training=False)``
    uses our argument order and mask convention (True = may attend) and returns out (B, Tq, D) or
    (out, weights). The default time limit is longer because the first TensorFlow call is slow. While it runs,
    Keras' traceback filtering is off, so an error in the layer's ``call()`` is reported with its own message.
    """
    label = _name(cls, "KerasMultiHeadAttention")

    def make(d_model, num_heads, dropout):
        kwargs = {} if dropout is None else {"dropout": dropout}
        return _construct(cls, label, d_model, num_heads, **kwargs)

    def load(layer, params):
        if not callable(getattr(layer, "load_numpy_params", None)):
            raise _fail("missing-attribute", f"Your layer has no load_numpy_params(params) method, so the checker "
                        "cannot load known weights into it.")
        d_model = params["w_q"].shape[1]
        x = np.zeros((1, 2, d_model))
        _call_mha(layer, x, x, x, None, "tf", label, training=False)  # build the weights
        _call(layer.load_numpy_params, {"params": params}, f"{label}.load_numpy_params")
        return params

    def run(layer, query, key, value, mask, training=False):
        return _call_mha(layer, query, key, value, mask, "tf", label, training=False)

    def body():
        with _KerasErrorsUnfiltered():  # imports Keras (slow: TensorFlow) inside the time limit
            return _check_mha_body(make, load, run, label, test_dropout, atol=5e-5, rtol=1e-4)

    _run_check(body, timeout)


# ----------------------------------------------------------------------------------------------------------
# Single-head attention module (chapter 2)
# ----------------------------------------------------------------------------------------------------------

# (d_in, d_out): square first, so that x @ linear.weight still runs and is diagnosed; then d_in != d_out, which
# tells sqrt(d_in) from sqrt(d_out) and catches code that only works for square projections.
_SINGLE_HEAD_CONFIGS = [(8, 8), (6, 4), (5, 8)]
_SINGLE_HEAD_MISSING = "Name the projections self.w_q, self.w_k and self.w_v, each an nn.Linear(d_in, d_out)."


def _single_head_params(d_in, d_out, seed):
    """w_q, w_k, w_v (d_in, d_out) and biases b_* (d_out,) in the x @ W + b convention, float64."""
    rng = np.random.default_rng(seed)
    params = {}
    for name in "qkv":
        params[f"w_{name}"] = rng.normal(0.0, d_in**-0.5, size=(d_in, d_out))
        params[f"b_{name}"] = rng.normal(0.0, 0.1, size=(d_out,))
    return params


def _single_head_cases(d_in, seed=7):
    """(query, key, value, mask, description) with B = 2; key and value are None for self-attention (the module
    is then called as module(x) or module(x, mask=mask)); masks broadcast to (B, Tq, Tk)."""
    rng = np.random.default_rng(seed)

    def x(t):
        return rng.standard_normal((2, t, d_in))

    lengths = [6, 3]
    mask = _mixed_mask(rng, (4, 4))
    mask[2] = False
    return [
        (x(5), None, None, None, "self-attention module(x), x (2, 5, d_in), no mask"),
        (x(4), x(6), x(6), None, "cross-attention, query (2, 4, d_in), key and value (2, 6, d_in), no mask"),
        (x(6), None, None, numpy_ref.causal_mask(6), "self-attention module(x, mask=mask), x (2, 6, d_in), causal mask "
         "(6, 6)"),
        (x(3), x(6), x(6), numpy_ref.padding_mask(lengths, 6)[:, 0], "cross-attention, query (2, 3, d_in), key and "
         f"value (2, 6, d_in), padding mask (2, 1, 6) for lengths {lengths}"),
        (x(5), x(4), x(4), _mixed_mask(rng, (2, 5, 4)), "cross-attention, query (2, 5, d_in), key and value "
         "(2, 4, d_in), random mask (2, 5, 4)"),
        (x(4), None, None, mask, "self-attention module(x, mask=mask), x (2, 4, d_in), mask (4, 4) whose row 2 is "
         "fully masked"),
    ]


def _single_head_reference(query, key, value, p, mask):
    """numpy_ref.scaled_dot_product_attention of the projections -> (out (B, Tq, d_out), weights (B, Tq, Tk))."""
    q, k, v = (x @ p[f"w_{n}"] + p[f"b_{n}"] for x, n in ((query, "q"), (key, "k"), (value, "v")))
    return numpy_ref.scaled_dot_product_attention(q, k, v, mask)


def _single_head_variant(query, key, value, p, mask, *, value_src="value", w_v="w_v", transposed=False, core=None):
    """Single-head attention with one deliberate deviation; returns (out, weights), float64."""

    def project(x, name):
        w = p[name].T if transposed else p[name]  # x @ linear.weight: only runs when d_in == d_out
        return x @ w + p["b" + name[1:]]

    q, k = project(query, "w_q"), project(key, "w_k")
    v = project(key if value_src == "key" else value, w_v)
    return _sdpa_variant(q, k, v, mask, **(core or {}))


def _single_head_candidates(query, key, value, p, mask, layout_code):
    """The known single-head mistakes; ``layout_code`` as for :func:`_mha_candidates`."""
    d_in, d_out = p["w_q"].shape
    structural = [
        (layout_code, "w_q, w_k and w_v", {"transposed": True}),
        ("values-from-keys", " (the values are projected from the key input)", {"value_src": "key"}),
        ("values-from-keys", " (the values go through w_k instead of w_v)", {"w_v": "w_k"}),
    ]
    extra = [(1.0 / math.sqrt(d_in), "they are divided by sqrt(d_in), the input size, instead of sqrt(d_k) = "
              "sqrt(d_out)"),
             (1.0 / d_in, "they are divided by d_in, the input size, instead of sqrt(d_k) = sqrt(d_out)")]
    core = _core_variants(d_out, d_out, query.shape[1], key.shape[1], 3, mask is not None, True, extra_scales=extra)
    out = [(c, det, lambda kw=kw: _single_head_variant(query, key, value, p, mask, **kw)) for c, det, kw in structural]
    out += [(c, det, lambda kw=kw: _single_head_variant(query, key, value, p, mask, core=kw)) for c, det, kw in core]
    return out


def _call_single_head(module, query, key, value, mask, label):
    """module(query[, key, value][, mask=mask]) under no_grad; key and value are left out for self-attention."""
    args = {"query": _to_framework(query, "torch")}
    if key is not None:
        args.update(key=_to_framework(key, "torch"), value=_to_framework(value, "torch"))
    if mask is not None:
        args["mask"] = _to_framework(mask, "torch")
    with torch.no_grad():
        return _call(module, args, f"{label}(...)", positional=1 if key is None else 3)


def _check_single_head_body(cls, label, test_dropout, atol=2e-5, rtol=1e-4):
    n = 0

    def load(module, params):
        return _load_torch_mha(module, params, label, names=("w_q", "w_k", "w_v"), advice=_SINGLE_HEAD_MISSING)

    for d_in, d_out in _SINGLE_HEAD_CONFIGS:
        module = _torch_module(cls, label, {"d_in": d_in, "d_out": d_out}, None)
        effective = load(module, _single_head_params(d_in, d_out, seed=d_in + d_out))
        cases = _single_head_cases(d_in)
        for i, (query, key, value, mask, desc) in enumerate(cases, 1):
            n += 1
            case = f"d_in={d_in}, d_out={d_out}, case {i} of {len(cases)}: {desc}"
            out_s, w_s = _split_result(_call_single_head(module, query, key, value, mask, label), case)
            out_s = _as_array(out_s, "output" if w_s is not None else "result", case)
            w_s = None if w_s is None else _as_array(w_s, "weights", case)
            key, value = (query, query) if key is None else (key, value)
            ref_out, ref_w = _single_head_reference(query, key, value, effective, mask)
            if _close(out_s, ref_out, atol, rtol) and (w_s is None or _close(w_s, ref_w, atol, rtol)):
                continue
            layout_code = "weight-not-transposed" if _has_linears(module) else "weight-layout-transposed"
            _diagnose(out_s, w_s, _single_head_candidates(query, key, value, effective, mask, layout_code), case,
                      ref_out, ref_w, atol=atol, rtol=rtol)
    text = (f"✓ {label}: {n} cases ({len(_SINGLE_HEAD_CONFIGS)} sizes, d_in != d_out too; self- and cross-attention, "
            "Tq != Tk, masks) match the reference")
    if not test_dropout:
        return text
    d_in, d_out = _SINGLE_HEAD_CONFIGS[1]
    module = _torch_module(cls, label, {"d_in": d_in, "d_out": d_out}, 0.5)
    effective = load(module, _single_head_params(d_in, d_out, seed=d_in + d_out))
    query, key, value, mask, desc = _single_head_cases(d_in)[1]
    ref_out, _ = _single_head_reference(query, key, value, effective, mask)
    outs = [_as_array(_split_result(_call_single_head(module, query, key, value, mask, label), desc)[0], "result", desc)
            for _ in range(2)]
    _require_eval_outputs(outs, ref_out, atol, rtol, case=f"d_in={d_in}, d_out={d_out}: {desc}")
    return text + "; dropout is off in eval mode"


def check_single_head_attention(cls, *, test_dropout: bool = True, timeout: float = DEFAULT_TIMEOUT):
    """Check a PyTorch single-head attention class (chapter 2's ``SingleHeadAttention``).

    ``cls(d_in, d_out)`` (and ``cls(d_in, d_out, dropout=0.5)`` if ``test_dropout``) must build an ``nn.Module``
    with ``nn.Linear`` attributes ``w_q``, ``w_k``, ``w_v`` (d_in -> d_out, with or without bias) or a
    ``load_numpy_params(params)`` method (keys w_q, b_q, w_k, b_k, w_v, b_v; ``x @ W + b`` convention, W of shape
    (d_in, d_out)); known weights are loaded into them. Sizes with d_in == d_out and d_in != d_out are tried.
    ``module(x)`` / ``module(x, mask=mask)`` is self-attention (key and value left out);
    ``module(query, key, value, mask=mask)`` with query (B, Tq, d_in), key/value (B, Tk, d_in) is
    cross-attention; the boolean mask broadcasts to (B, Tq, Tk), True = may attend, and a fully masked query row
    must give a zero output. The module returns out (B, Tq, d_out) or (out, weights (B, Tq, Tk)); compared with
    :func:`numpy_ref.scaled_dot_product_attention` of the projections. With dropout=0.5 and ``.eval()`` it must
    be deterministic and match the reference.
    """
    label = _name(cls, "SingleHeadAttention")
    _run_check(lambda: _check_single_head_body(cls, label, test_dropout), timeout)


# ----------------------------------------------------------------------------------------------------------
# Numeric answers
# ----------------------------------------------------------------------------------------------------------


def check_value(name: str, value, expected, *, rtol: float = 1e-6, atol: float = 0.0, hint: str = "",
                timeout: float = DEFAULT_TIMEOUT):
    """Check a numeric answer (a number or an array) without revealing the expected value in the message.

    Example: ``check_value("number of parameters", n_params, 4 * 512 * 512 + 4 * 512)``.
    """

    def body():
        case = f"{name}"
        if value is None:
            raise _fail("returned-none", f"{name} is None: assign your answer to it.")
        try:
            got = np.asarray(value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else value)
        except Exception:  # noqa: BLE001 - any unconvertible object
            got = np.asarray(None)
        if got.dtype.kind not in "biuf":
            raise _fail("wrong-type", f"{name} is a {type(value).__name__}; expected a number.", case=case)
        want = np.asarray(expected, dtype=np.float64)
        if got.shape != want.shape:
            raise _fail("wrong-shape", f"{name} has shape {_shape(got.shape)}; expected {_shape(want.shape)}.")
        if not np.allclose(got.astype(np.float64), want, rtol=rtol, atol=atol):
            raise _fail("wrong-value", f"{name} = {_fmt(got)} is not the expected value.{' ' + hint if hint else ''}")
        return f"✓ {name}: correct"

    _run_check(body, timeout)


def _fmt(a: np.ndarray) -> str:
    if a.ndim == 0:
        return f"{a.item():g}" if a.dtype.kind == "f" else f"{a.item()}"
    return np.array2string(a, precision=6)


def _check_count_body(fn, label, names, configs, expected, known):
    """Shared body of the parameter-count checks: ``fn(a, b, bias=...)`` for each ``(a, b, bias)`` of ``configs``
    (``names`` are the two size arguments); ``known(a, b, bias)`` maps wrong answers to (code, message)."""
    for i, (a, b, bias) in enumerate(configs, 1):
        text = f"{label}({a}, {b}, bias={bias})"
        case = f"case {i} of {len(configs)}: {names[0]}={a}, {names[1]}={b}, bias={bias}"
        got = _call(fn, {names[0]: a, names[1]: b, "bias": bias}, label, positional=2, call_text=text)
        if got is None:
            raise _fail("returned-none", case=case)
        if isinstance(got, bool) or not isinstance(got, (int, float, np.integer, np.floating)):
            raise _fail("wrong-type", f"Your function returned a {type(got).__name__}; expected a number.", case=case)
        if got == expected(a, b, bias):
            continue
        code, message = known(a, b, bias).get(got, ("wrong-value", f"{got} is not the number of parameters."))
        raise _fail(code, message, case=case)
    return f"✓ {_name(fn, label)}: {len(configs)} configurations (with and without bias) are right"


def check_parameter_count(fn, *, timeout: float = DEFAULT_TIMEOUT):
    """Check ``fn(d_model, num_heads, bias=True)`` -> the number of trainable parameters of multi-head attention
    (four d_model x d_model projections, plus four bias vectors of d_model if ``bias``)."""

    def known(d, h, bias):
        return {
            3 * d * d + (3 * d if bias else 0): ("missing-output-projection",
                                                 "You counted only w_q, w_k and w_v: the output projection w_o "
                                                 "(d_model x d_model, plus its bias) has parameters too."),
            4 * d * d + (0 if bias else 4 * d): ("wrong-value", "Biases: with bias=True each of the four "
                                                 "projections has a bias vector of d_model numbers; with "
                                                 "bias=False there are none."),
            h * 4 * d * d + (4 * d if bias else 0): ("wrong-value", "The heads do not each get their own "
                                                     "d_model x d_model matrices: the H heads share one "
                                                     "d_model x d_model projection, split into H slices."),
        }

    configs = [(512, 8, True), (64, 4, False), (768, 12, True), (10, 5, False), (96, 3, True)]
    _run_check(lambda: _check_count_body(fn, "parameter count", ("d_model", "num_heads"), configs,
                                         lambda d, h, bias: 4 * d * d + (4 * d if bias else 0), known), timeout)


def check_single_head_parameter_count(fn, *, timeout: float = DEFAULT_TIMEOUT):
    """Check ``fn(d_in, d_out, bias=False)`` -> the number of trainable parameters of a single attention head
    (chapter 2's ``SingleHeadAttention``): three d_in -> d_out projections w_q, w_k, w_v (d_in x d_out weights),
    plus three bias vectors of d_out if ``bias``; no output projection."""

    def known(d_in, d_out, bias):
        b = 3 * d_out if bias else 0
        return {
            4 * d_in * d_out + (4 * d_out if bias else 0): ("wrong-value", "A single head has no output projection: "
                                                            "count only w_q, w_k and w_v."),
            3 * d_in * d_in + (3 * d_in if bias else 0): ("wrong-value", "Each projection maps d_in features to d_out "
                                                          "features: its weight has d_in x d_out entries."),
            3 * d_out * d_out + b: ("wrong-value", "Each projection maps d_in features to d_out features: its weight "
                                    "has d_in x d_out entries."),
            3 * d_in * d_out + (0 if bias else 3 * d_out): ("wrong-value", "Biases: with bias=True each of the three "
                                                            "projections has a bias vector of d_out numbers; with "
                                                            "bias=False there are none."),
            3 * d_in * d_out + (3 * d_in if bias else 0): ("wrong-value", "Each bias has d_out numbers (one per output "
                                                           "feature), not d_in."),
        }

    configs = [(512, 64, False), (3, 4, True), (768, 64, True), (10, 6, False), (32, 32, True)]
    _run_check(lambda: _check_count_body(fn, "single-head parameter count", ("d_in", "d_out"), configs,
                                         lambda d_in, d_out, bias: 3 * d_in * d_out + (3 * d_out if bias else 0),
                                         known), timeout)


# ----------------------------------------------------------------------------------------------------------
# KV cache, multi-query and grouped-query attention (chapter 8)
# ----------------------------------------------------------------------------------------------------------

# The factors of a KV cache's size, in the order of kv_cache_bytes' arguments (the 2 of keys AND values first):
# (name, what leaving it out means). The hints explain one factor each; they never spell out the whole formula.
_CACHE_FACTORS = (
    ("the factor 2", "the cache holds the keys AND the values"),
    ("num_layers", "every attention layer caches its own keys and values"),
    ("num_kv_heads", "each layer caches num_kv_heads key/value heads"),
    ("head_dim", "each key/value head caches head_dim numbers per token"),
    ("seq_len", "without it you have the size of ONE token's keys and values, and the cache holds seq_len tokens"),
    ("batch_size", "every sequence of the batch has its own cache"),
    ("bytes_per_element", "you counted numbers, not bytes: a float16 number takes 2 bytes, a float32 number 4"),
)

# (num_layers, num_kv_heads, head_dim, seq_len, batch_size, bytes_per_element); None = left out (default 1 / 2).
_CACHE_CASES = [
    (4, 8, 32, 100, 3, 4),
    (32, 32, 128, 4096, None, None),  # Llama 2 7B (MHA), float16, defaults
    (32, 8, 128, 4096, 16, 2),  # GQA, 16 sequences
    (80, 8, 128, 2048, 4, 2),  # Llama 2 70B
    (2, 1, 64, 7, 1, 1),  # MQA, one byte per number
    (12, 12, 64, 1024, 8, None),
    (6, 2, 16, 50, None, 8),
]

_CACHE_UNITS = [(2**10, "KiB"), (2**20, "MiB"), (2**30, "GiB"), (10**3, "kB"), (10**6, "MB"), (10**9, "GB")]


def _number(value):
    """A student's numeric answer as a Python number, or None if it is not one (bool, str, array of several...)."""
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_complex():
        value = value.item()
    elif isinstance(value, np.ndarray) and value.shape == () and value.dtype.kind in "iuf":
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        return None
    return value.item() if isinstance(value, (np.integer, np.floating)) else value


def _cache_known_mistakes(cases):
    """(code, message, expected answers) for each known mistake: one or two factors left out, a unit other than
    bytes. ``cases`` are the full argument tuples (defaults filled in)."""
    out = []
    for size in (1, 2):
        for subset in itertools.combinations(range(len(_CACHE_FACTORS)), size):
            values = []
            for args in cases:
                factors = (2,) + tuple(args)
                values.append(math.prod(factors) // math.prod(factors[i] for i in subset))
            if subset == (0,):
                code, message = "cache-keys-only", None
            else:
                code = "cache-missing-factor"
                parts = [f"{name} ({why})" for name, why in (_CACHE_FACTORS[i] for i in subset)]
                message = _HINTS[code].format(detail=parts[0] if size == 1 else f"two factors: {' and '.join(parts)}")
            out.append((code, message, values))
    right = [math.prod((2,) + tuple(args)) for args in cases]
    for divisor, unit in _CACHE_UNITS:
        out.append(("wrong-value", f"Your answer is the size in {unit} (bytes / {divisor:,}); return the number of "
                    "bytes, unrounded.", [r / divisor for r in right]))
    out.append(("wrong-value", "Your answer is 8 times too large: bits instead of bytes? bytes_per_element is "
                "already in bytes.", [8 * r for r in right]))
    return out


def check_kv_cache_bytes(fn, *, timeout: float = DEFAULT_TIMEOUT):
    """Check ``fn(num_layers, num_kv_heads, head_dim, seq_len, batch_size=1, bytes_per_element=2)`` -> the number of
    bytes of a KV cache: keys and values of every layer, for ``batch_size`` sequences of ``seq_len`` tokens
    (:func:`attention_course.kv_cache.cache_bytes_per_token` times ``seq_len * batch_size``). Called with and
    without the two optional arguments; an ``int`` (or a float or 0-d tensor of the same value) is expected.
    Diagnoses a factor left out (``[cache-keys-only]`` for the 2 of keys and values, ``[cache-missing-factor]``),
    and answers in KiB/MiB/GiB or bits."""
    label = "kv_cache_bytes"

    def body():
        full = [tuple(a[:4]) + (1 if a[4] is None else a[4], 2 if a[5] is None else a[5]) for a in _CACHE_CASES]
        answers = []
        for i, args in enumerate(_CACHE_CASES, 1):
            call = {"num_layers": args[0], "num_kv_heads": args[1], "head_dim": args[2], "seq_len": args[3]}
            if args[4] is not None:
                call["batch_size"] = args[4]
            if args[5] is not None:
                call["bytes_per_element"] = args[5]
            text = f"{label}({', '.join(map(str, args[:4]))}" + "".join(
                f", {k}={v}" for k, v in call.items() if k in ("batch_size", "bytes_per_element")) + ")"
            case = f"case {i} of {len(_CACHE_CASES)}: {text}"
            got = _call(fn, call, label, positional=4, call_text=text)
            if got is None:
                raise _fail("returned-none", case=case)
            number = _number(got)
            if number is None:
                raise _fail("wrong-type", f"Your function returned a {_type_name(got)}; expected a number of bytes "
                            "(an int).", case=case)
            answers.append((number, case))
        expected = [math.prod((2,) + args) for args in full]
        wrong = [i for i, ((got, _), want) in enumerate(zip(answers, expected)) if got != want]
        if not wrong:
            return (f"✓ {_name(fn, label)}: {len(_CACHE_CASES)} model sizes (MHA, GQA and MQA; with and without "
                    "batch_size and bytes_per_element) are right")
        case = answers[wrong[0]][1]
        got = [a for a, _ in answers]
        for code, message, values in _cache_known_mistakes(full):
            if all(math.isclose(g, v, rel_tol=1e-6) for g, v in zip(got, values)):
                raise _fail(code, message, case=case)
        raise _fail("wrong-value", f"{got[wrong[0]]:,} is not the number of bytes of this cache, and it matches none "
                    "of the mistakes this checker knows. Which numbers does the cache hold, and how many bytes does "
                    "each take?", case=case)

    _run_check(body, timeout)


def _head_sources(h_kv: int, n_rep: int, tiled: bool) -> list[int]:
    """The input key/value head that each of the H_kv * n_rep output heads copies."""
    return [h % h_kv if tiled else h // n_rep for h in range(h_kv * n_rep)]


# (B, H_kv, T, Dh, n_rep); a tile and a repeat differ only when H_kv > 1 and n_rep > 1: those come first.
_REPEAT_KV_CASES = [(2, 2, 3, 4, 3), (1, 3, 5, 2, 2), (2, 1, 4, 8, 4), (3, 2, 1, 4, 2), (2, 3, 6, 4, 1),
                    (1, 2, 7, 16, 4)]


def check_repeat_kv(fn, *, timeout: float = DEFAULT_TIMEOUT):
    """Check ``fn(x, n_rep)``: x a float32 torch tensor (B, H_kv, T, Dh) -> (B, H_kv * n_rep, T, Dh) in which output
    head h is input head ``h // n_rep`` (each key/value head repeated n_rep times in a row, as
    :func:`attention_course.kv_cache.repeat_kv` and ``x.repeat_interleave(n_rep, dim=1)``); x must not be modified.
    Diagnoses ``[kv-heads-tiled]`` (``x.repeat(1, n_rep, 1, 1)``: head h is input head h % H_kv)."""
    label = "repeat_kv"

    def body():
        rng = np.random.default_rng(8)
        for i, (b, h_kv, t, dh, n_rep) in enumerate(_REPEAT_KV_CASES, 1):
            x = rng.standard_normal((b, h_kv, t, dh))
            case = f"case {i} of {len(_REPEAT_KV_CASES)}: x of shape {_shape(x.shape)}, n_rep={n_rep}"
            out = _as_array(_call(fn, {"x": _to_framework(x, "torch"), "n_rep": n_rep}, label), "result", case)
            ref = np.repeat(x, n_rep, axis=1)
            if _close(out, ref, 1e-6, 1e-6):
                continue
            if out.shape != ref.shape:
                hint = ""
                if out.shape == (b, h_kv, n_rep, t, dh):
                    hint = " You have the repeated heads on an axis of their own: merge (H_kv, n_rep) into one axis."
                elif out.ndim == 4 and out.shape[1] == h_kv and out.size == ref.size:
                    hint = " You repeated along another axis: the heads are axis 1."
                raise _fail("wrong-shape", f"Your result has shape {_shape(out.shape)}; expected (B, H_kv * n_rep, "
                            f"T, Dh) = {_shape(ref.shape)}.{hint}", case=case)
            tiled = _head_sources(h_kv, n_rep, tiled=True)
            detail = (f"for H_kv={h_kv} and n_rep={n_rep} your output heads copy the input heads {tiled}, in "
                      f"groups they would be {_head_sources(h_kv, n_rep, tiled=False)}")
            candidates = [("kv-heads-tiled", detail, lambda x=x, n_rep=n_rep: (np.tile(x, (1, n_rep, 1, 1)), None))]
            _diagnose(out, None, candidates, case, ref, None, what="result", atol=1e-6, rtol=1e-6)
        return (f"✓ {_name(fn, label)}: {len(_REPEAT_KV_CASES)} random cases (H_kv from 1 to 3, n_rep from 1 to 4; "
                "(B, H_kv, T, Dh) -> (B, H_kv * n_rep, T, Dh)) match the reference")

    _run_check(body, timeout)


# (B, H, H_kv, Tq, Tk, Dk, Dv, mask kind): ordinary multi-head attention (H_kv = H) first, then multi-query
# (H_kv = 1, where even code that forgets to repeat the heads runs, by broadcasting), then grouped-query.
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
            mask = _mixed_mask(rng, (b, h, tq, tk))
            mask_text = f"random mask of shape {_shape(mask.shape)}"
        else:
            mask, mask_text = _make_mask(kind, rng, (b, h), tq, tk)
        heads = "MHA" if h_kv == h else "MQA" if h_kv == 1 else "GQA"
        desc = (f"{heads}, H={h}, H_kv={h_kv}: q {_shape(q.shape)}, k {_shape(k.shape)}, v {_shape(v.shape)}, "
                f"{mask_text}")
        yield q, k, v, mask, desc


@contextlib.contextmanager
def _grouped_heads_note(h, h_kv):
    """When code that ran for H_kv = H (and H_kv = 1) raises with 1 < H_kv < H, say what differs."""
    try:
        yield
    except CheckFailed as err:
        if err.code != "raised-exception" or h_kv in (1, h):
            raise
        raise CheckFailed(f"{err}\n  Here q has H={h} heads and k, v have H_kv={h_kv}: query head h uses key/value "
                          f"head h // (H / H_kv), so each key/value head must be repeated H / H_kv = {h // h_kv} "
                          "times (in a row) before the matrix products.") from None


def check_grouped_query_attention(fn, *, timeout: float = DEFAULT_TIMEOUT):
    """Check grouped-query attention ``fn(q, k, v, mask=None)`` (multi-query attention when H_kv = 1).

    q (B, H, Tq, Dk), k (B, H_kv, Tk, Dk), v (B, H_kv, Tk, Dv) are float32 torch tensors with H_kv dividing H;
    ``mask`` is None or a boolean tensor broadcastable to (B, H, Tq, Tk), True = may attend. Query head h attends
    with key/value head ``h // (H / H_kv)``. ``fn`` returns out (B, H, Tq, Dv) or (out, weights (B, H, Tq, Tk)),
    compared with :func:`numpy_ref.scaled_dot_product_attention` of q and the repeated keys and values. Cases:
    H_kv = H, H_kv = 1 and in between; decoding (Tq = 1), chunks with a bottom-right causal mask (Tq < Tk),
    padding masks (B, 1, 1, Tk), per-head masks, fully masked rows (which must give zeros). Diagnoses
    ``[kv-heads-tiled]`` and the attention mistakes of :func:`check_scaled_dot_product_attention`.
    """
    label = "grouped_query_attention"
    atol, rtol = 2e-5, 1e-4

    def body():
        cases = list(_gqa_cases())
        for i, (q, k, v, mask, desc) in enumerate(cases, 1):
            case = f"case {i} of {len(cases)}: {desc}"
            h, h_kv = q.shape[1], k.shape[1]
            n_rep = h // h_kv
            args = {"q": _to_framework(q, "torch"), "k": _to_framework(k, "torch"), "v": _to_framework(v, "torch"),
                    "mask": _to_framework(mask, "torch")}
            with _grouped_heads_note(h, h_kv):
                result = _call(fn, args, label, positional=3)
            out_s, w_s = _split_result(result, case)
            out_s = _as_array(out_s, "output" if w_s is not None else "result", case)
            w_s = None if w_s is None else _as_array(w_s, "weights", case)
            k_rep, v_rep = np.repeat(k, n_rep, axis=1), np.repeat(v, n_rep, axis=1)  # (B, H, Tk, D)
            ref_out, ref_w = numpy_ref.scaled_dot_product_attention(q, k_rep, v_rep, mask)
            if _close(out_s, ref_out, atol, rtol) and (w_s is None or _close(w_s, ref_w, atol, rtol)):
                continue
            tq, dk = q.shape[-2:]
            tk, dv = v.shape[-2:]
            candidates = []
            if 1 < h_kv < h:  # a tile and a repeat only differ here
                k_tile, v_tile = np.tile(k, (1, n_rep, 1, 1)), np.tile(v, (1, n_rep, 1, 1))
                detail = (f"for H={h} and H_kv={h_kv} your query heads use the key/value heads "
                          f"{_head_sources(h_kv, n_rep, tiled=True)}, in groups they would be "
                          f"{_head_sources(h_kv, n_rep, tiled=False)}")
                candidates.append(("kv-heads-tiled", detail, lambda: _sdpa_variant(q, k_tile, v_tile, mask)))
            candidates += [(c, d, lambda kw=kw: _sdpa_variant(q, k_rep, v_rep, mask, **kw))
                           for c, d, kw in _core_variants(dk, dv, tq, tk, 4, mask is not None, True)]
            _diagnose(out_s, w_s, candidates, case, ref_out, ref_w, atol=atol, rtol=rtol)
        return (f"✓ {_name(fn, label)}: {len(cases)} random cases (MHA, GQA and MQA head counts; decoding with "
                "Tq = 1, Tq != Tk, causal and padding masks, fully masked rows) match the reference")

    _run_check(body, timeout)
