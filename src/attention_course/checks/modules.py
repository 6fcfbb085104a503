"""Checks of attention modules: single-head (chapter 2), multi-head in PyTorch
(chapter 3), einsum (chapter 5) and Keras (chapter 6), and the parameter count
of multi-head attention.

Known weights are loaded into the student's module (its ``nn.Linear`` layers,
or its ``load_numpy_params``), the module runs on self- and cross-attention
cases with masks, and its output is compared with the float64 reference; a
module built with dropout=0.5 must be deterministic after ``.eval()``, and one
built with dropout=0.25 must, in ``.train()`` mode, drop attention weights at
that rate (:func:`_training_probe`: measured on the weights and output it
returns, whatever its random numbers).
"""

from __future__ import annotations

import contextlib
import inspect

import numpy as np
import torch

from .. import numpy_ref
from . import hidden
from .cases import (
    hidden_batch_cases,
    mha_cases,
    mha_cross_dim_cases,
    single_head_cases,
    single_head_params,
    to_framework,
    to_tf,
)
from .core import sdpa_check_body
from .diagnosis import diagnose, mha_candidates, single_head_candidates
from .questions import choice_question, number_question
from .runner import (
    DEFAULT_TIMEOUT,
    CheckFailed,
    as_array,
    call,
    close,
    display_name,
    fail,
    is_class,
    is_instance,
    run_check,
    shape_text,
    split_result,
)

# -----------------------------------------------------------------------------
# Multi-head attention (PyTorch module, einsum module or function, Keras layer)
# -----------------------------------------------------------------------------


def _mha_configs(cross_dims: bool):
    """(d_model, num_heads, kdim, vdim, params, cases): the square sizes first
    (a weight read transposed still runs there and is diagnosed), then, with
    ``cross_dims``, keys and values of other widths."""
    configs = []
    for d_model, num_heads in _MHA_CONFIGS:
        params = numpy_ref.init_mha_params(d_model, seed=d_model)
        configs.append(
            (d_model, num_heads, None, None, params, mha_cases(d_model))
        )
    for d_model, num_heads, b, t_q, t_k in hidden.mha_sizes():
        params = numpy_ref.init_mha_params(d_model, seed=d_model + 1)
        configs.append(
            (
                d_model,
                num_heads,
                None,
                None,
                params,
                hidden_batch_cases(d_model, b, t_q, t_k, seed=t_q),
            )
        )
    if cross_dims:
        d_model, num_heads, kdim, vdim = _MHA_CROSS_DIM_CONFIG
        params = numpy_ref.init_mha_params(
            d_model, kdim, vdim, seed=kdim + vdim
        )
        configs.append(
            (
                d_model,
                num_heads,
                kdim,
                vdim,
                params,
                mha_cross_dim_cases(d_model, kdim, vdim),
            )
        )
    return configs


@contextlib.contextmanager
def _cross_dim_note(d_model, kdim, vdim):
    """In a configuration with kdim, vdim != d_model (after the square ones
    passed), add to an exception's message what differs: code that assumes d_in
    == d_model raises here."""
    try:
        yield
    except CheckFailed as err:
        if kdim is None or err.code != "raised-exception":
            raise
        raise CheckFailed(
            f"{err}\n  Your code passed the cases with square weights. Here "
            f"the keys have kdim={kdim} "
            f"and the values vdim={vdim} features, not d_model={d_model}: "
            f"w_k is ({kdim}, {d_model}) and "
            f"w_v ({vdim}, {d_model}), each W (d_in, d_out). Does your code "
            "assume d_in == d_model "
            "somewhere?"
        ) from None


def _mha_case_prefix(d_model, num_heads, kdim, vdim):
    dims = "" if kdim is None else f", kdim={kdim}, vdim={vdim}"
    return f"d_model={d_model}, num_heads={num_heads}{dims}"


def _mha_success(label, n, cross_dims):
    dims = ", also with kdim, vdim != d_model;" if cross_dims else ","
    sizes = len(_MHA_CONFIGS) + len(hidden.mha_sizes())
    return (
        f"✓ {label}: {n} cases ({sizes} sizes; self- and "
        f"cross-attention{dims} Tq != Tk, masks) match the reference"
    )


def _call_mha(
    module, query, key, value, mask, framework, label, training=None
):
    conv = (
        (lambda a: to_framework(a, "torch")) if framework == "torch" else to_tf
    )
    args = {"query": conv(query), "key": conv(key), "value": conv(value)}
    if mask is not None:
        args["mask"] = conv(mask)
    if training is not None:
        args["training"] = training
    if framework == "torch":
        with torch.no_grad():
            return call(module, args, f"{label}(...)", positional=3)
    return call(module, args, f"{label}(...)", positional=3)


_MHA_MISSING = (
    "Name the projections self.w_q, self.w_k, self.w_v and self.w_o, each "
    "an nn.Linear(d_model, "
    "d_model)."
)


def _has_linears(module, names=("w_q", "w_k", "w_v")) -> bool:
    """Whether the checker loads the weights itself: the module has nn.Linear
    attributes w_q, w_k, w_v."""
    return all(
        is_instance(getattr(module, name, None), torch.nn.Linear)
        for name in names
    )


def _load_torch_mha(
    module,
    params,
    label,
    names=("w_q", "w_k", "w_v", "w_o"),
    advice=_MHA_MISSING,
):
    """Copy ``params`` (x @ W + b convention) into the module's nn.Linear
    layers ``names`` (w_o may be missing:
    diagnosed from the output), or through its ``load_numpy_params``; returns
    the params actually in effect (zero biases for layers built without
    one)."""
    from torch import nn

    linears = {name: getattr(module, name, None) for name in names}
    effective = dict(params)
    if _has_linears(module):
        for name, lin in linears.items():
            if not is_instance(lin, nn.Linear):
                continue  # a module without w_o: diagnosed from its output
            w = params[name].T
            if tuple(lin.weight.shape) != w.shape:
                raise fail(
                    "wrong-shape",
                    f"{label}.{name}.weight has shape "
                    f"{shape_text(lin.weight.shape)}; expected "
                    f"{shape_text(w.shape)} (nn.Linear({w.shape[1]}, "
                    f"{w.shape[0]})).",
                )
            with torch.no_grad():
                lin.weight.copy_(torch.tensor(w, dtype=lin.weight.dtype))
                if lin.bias is not None:
                    lin.bias.copy_(
                        torch.tensor(
                            params["b" + name[1:]], dtype=lin.bias.dtype
                        )
                    )
                else:
                    effective["b" + name[1:]] = np.zeros_like(
                        params["b" + name[1:]]
                    )
        return effective
    if callable(getattr(module, "load_numpy_params", None)):
        call(
            module.load_numpy_params,
            {"params": params},
            f"{label}.load_numpy_params",
        )
        return effective
    missing = [
        name
        for name, lin in linears.items()
        if not is_instance(lin, nn.Linear)
    ]
    raise fail(
        "missing-attribute",
        f"Your module has no nn.Linear attribute(s) {', '.join(missing)} "
        "(and no "
        "load_numpy_params method), so the checker cannot load known "
        f"weights. {advice}",
    )


def _construct(cls, label, d_model, num_heads, **kwargs):
    return _construct_with(
        cls, label, {"d_model": d_model, "num_heads": num_heads}, **kwargs
    )


def _construct_with(cls, label, sizes: dict, **kwargs):
    """``cls(*sizes.values(), **kwargs)``; failures become CheckFailed naming
    the call."""
    args = {**sizes, **kwargs}
    text = (
        f"{label}({', '.join(map(str, sizes.values()))}"
        f"{''.join(f', {k}={v!r}' for k, v in kwargs.items())})"
    )
    return call(cls, args, label, positional=len(sizes), call_text=text)


def _torch_module(cls, label, sizes, dropout, **kwargs):
    """Build the student's torch module (with ``dropout=`` unless None, and
    ``kwargs``) in eval mode."""
    kwargs = kwargs if dropout is None else {"dropout": dropout, **kwargs}
    module = _construct_with(cls, label, sizes, **kwargs)
    if not is_instance(module, torch.nn.Module):
        raise fail(
            "wrong-type",
            f"{label}(...) built a {type(module).__name__}; expected a "
            "torch.nn.Module.",
        )
    return module.eval()


def _parameters(obj) -> dict:
    """The parameters of ``obj``'s signature by name (empty when it has no
    readable signature)."""
    try:
        return dict(inspect.signature(obj).parameters)
    except (TypeError, ValueError):
        return {}


def _accepts_cross_dims(cls) -> bool:
    """Whether ``cls(d_model, num_heads, kdim=..., vdim=...)`` is part of the
    class's signature."""
    params = _parameters(cls)
    return "kdim" in params and "vdim" in params


_MHA_CONFIGS = [(12, 3), (8, 2)]
_MHA_CROSS_DIM_CONFIG = (12, 3, 8, 5)  # d_model, num_heads, kdim, vdim


def _check_mha_body(
    make,
    load,
    run,
    label,
    test_dropout,
    atol=2e-5,
    rtol=1e-4,
    cross_dims=False,
    layout_code=lambda module: "weight-layout-transposed",
):
    """Shared body for module checks. make(d_model, num_heads, dropout, **dims)
    -> module (dims: kdim, vdim when ``cross_dims``); load(module, params) ->
    params in effect; run(module, query, key, value, mask, training=None) ->
    result; layout_code(module) -> the code for a weight used transposed."""
    n = 0
    for d_model, num_heads, kdim, vdim, params, cases in _mha_configs(
        cross_dims
    ):
        with _cross_dim_note(d_model, kdim, vdim):
            dims = {} if kdim is None else {"kdim": kdim, "vdim": vdim}
            module = make(d_model, num_heads, None, **dims)
            effective = load(module, params)
            prefix = _mha_case_prefix(d_model, num_heads, kdim, vdim)
            for i, (query, key, value, mask, desc) in enumerate(cases, 1):
                n += 1
                case = f"{prefix}, case {i} of {len(cases)}: {desc}"
                out_s, w_s = split_result(
                    run(module, query, key, value, mask), case
                )
                out_s = as_array(
                    out_s, "output" if w_s is not None else "result", case
                )
                w_s = None if w_s is None else as_array(w_s, "weights", case)
                ref_out, ref_w = numpy_ref.multi_head_attention(
                    query, key, value, effective, num_heads, mask
                )
                if close(out_s, ref_out, atol, rtol) and (
                    w_s is None or close(w_s, ref_w, atol, rtol)
                ):
                    continue
                candidates = mha_candidates(
                    query,
                    key,
                    value,
                    effective,
                    num_heads,
                    mask,
                    True,
                    layout_code(module),
                )
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
    text = _mha_success(label, n, cross_dims)
    if not test_dropout:
        return text
    d_model, num_heads = _MHA_CONFIGS[0]
    params = numpy_ref.init_mha_params(d_model, seed=d_model)
    module = make(d_model, num_heads, 0.5)
    effective = load(module, params)
    query, key, value, mask, desc = mha_cases(d_model)[1]
    ref_out, _ = numpy_ref.multi_head_attention(
        query, key, value, effective, num_heads, mask
    )
    outs = [
        as_array(
            split_result(
                run(module, query, key, value, mask, training=False), desc
            )[0],
            "result",
            desc,
        )
        for _ in range(2)
    ]
    _require_eval_outputs(
        outs,
        ref_out,
        atol,
        rtol,
        case=f"d_model={d_model}, num_heads={num_heads}: {desc}",
    )
    module = make(d_model, num_heads, _TRAIN_P)
    eye = np.eye(d_model)
    effective = load(
        module, dict(params, w_v=eye, b_v=0 * eye[0], w_o=eye, b_o=0 * eye[0])
    )
    d_h = d_model // num_heads
    x = numpy_ref.merge_heads(
        _orthogonal_values(np.random.default_rng(3), (16, num_heads, d_h, d_h))
    )
    _, ref_w = numpy_ref.multi_head_attention(x, x, x, effective, num_heads)
    case = (
        f"d_model={d_model}, num_heads={num_heads}, dropout={_TRAIN_P}, "
        "training mode: self-attention, "
        f"x {shape_text(x.shape)}"
    )

    def run_train():
        out_s, w_s = split_result(
            run(module, x, x, x, None, training=True), case
        )
        return as_array(
            out_s, "output", case
        ), None if w_s is None else as_array(w_s, "weights", case)

    # out = merge(W @ V) with V = split(x), orthogonal per head: V^-1 = V^T / 4
    def weights_from_output(out):
        # (B, H, T, Dh)
        heads, v = (numpy_ref.split_heads(a, num_heads) for a in (out, x))
        return heads @ np.swapaxes(v, -1, -2) / 4

    _training_probe(run_train, ref_w, weights_from_output, case)
    return (
        text + "; dropout is off in eval mode and drops attention weights "
        "at rate p in training mode"
    )


# not 0.5: a module that drops with probability 1 - p instead of p must show it
_TRAIN_P = 0.25


def _orthogonal_values(rng, shape) -> np.ndarray:
    """(..., n, n) random orthogonal matrices, times 2: values from which
    attention weights can be read back."""
    q, r = np.linalg.qr(rng.standard_normal(shape))
    return 2 * q * np.sign(np.diagonal(r, axis1=-2, axis2=-1))[..., None, :]


def _training_probe(run_train, ref_w, weights_from_output, case):
    """Dropout in training mode, measured on one call of a module built with
    dropout=_TRAIN_P: it must act, at rate p, on the attention weights. The
    probe loads an identity value projection (and output projection) and feeds
    values that are orthogonal per head, so the weights the module applied can
    be read back from its output (``weights_from_output``), whether or not it
    returns them, and whatever its random numbers: each must be either dropped
    (0) or kept and scaled by 1 / (1 - p), about a fraction p of them dropped.
    ``run_train()`` -> the student's (output, weights or None)."""
    out_s, w_s = run_train()
    applied = weights_from_output(out_s)
    p, scale = _TRAIN_P, 1 / (1 - _TRAIN_P)
    if w_s is not None and not close(w_s, applied, 1e-4, 1e-3):
        raise fail(
            "dropout-wrong-tensor",
            detail="its output is not the one the weights it returns give (it "
            "attends with other weights than it returns, or drops something "
            "else as well)",
            case=case,
        )
    if close(applied, ref_w, 1e-4, 1e-3):
        raise fail(
            "dropout-off-in-training",
            detail=f"built with dropout={p} and in .train() mode, it computes "
            "what it computes in .eval() mode",
            case=case,
        )
    allowed = ref_w > 1e-3
    dropped = (np.abs(applied) < 1e-5) & allowed
    kept = allowed & ~dropped
    ratios = applied[kept] / ref_w[kept]
    factor = float(np.median(ratios)) if ratios.size else 0.0
    if not dropped.any() or not np.allclose(ratios, factor, rtol=1e-2):
        raise fail(
            "dropout-wrong-tensor",
            detail="the weights its output is made of are not the "
            "attention weights "
            "with some of them zeroed (each either 0 or the same multiple "
            "of the weight without dropout): "
            "dropout acts before the softmax, or on the values, the output "
            "or another tensor",
            case=case,
        )
    if not np.isclose(factor, scale, rtol=1e-2):
        raise fail(
            "dropout-wrong-rate",
            detail=f"the weights it keeps are multiplied by {factor:.3g}, "
            "where "
            f"dropout={p} keeps them scaled by 1 / (1 - p) = {scale:.3g}",
            case=case,
        )
    rate = float(dropped.sum() / allowed.sum())
    # about six standard deviations of the rate over the probe's weights
    if abs(rate - p) > 0.1:
        raise fail(
            "dropout-wrong-rate",
            detail=f"it drops {rate:.0%} of the attention weights, where "
            f"dropout={p} "
            f"drops about {p:.0%}",
            case=case,
        )


def _keeping_rng(body):
    """``body`` run so that the modules it builds and the dropout it draws
    leave the notebook's torch random stream as it was: a cell after a check
    gives the same numbers whether the check ran or not."""

    def run():
        with torch.random.fork_rng(devices=[]):
            return body()

    return run


def _require_eval_outputs(outs, ref_out, atol, rtol, case):
    """Two eval-mode outputs of a module built with dropout=0.5 must both equal
    the dropout-free reference."""
    if close(outs[0], ref_out, atol, rtol) and close(
        outs[1], ref_out, atol, rtol
    ):
        return
    detail = (
        "two calls on the same input gave different outputs"
        if not close(outs[0], outs[1], atol, rtol)
        else "its output in evaluation mode differs from the same "
        "weights' output without dropout"
    )
    raise fail("dropout-in-eval", detail=detail, case=case)


def check_multi_head_attention(
    cls, *, test_dropout: bool = True, timeout: float = DEFAULT_TIMEOUT
):
    """Check a PyTorch multi-head attention class.

    ``cls(d_model, num_heads)`` (and ``cls(d_model, num_heads, dropout=0.5)``
    if ``test_dropout``) must build an ``nn.Module`` with ``nn.Linear``
    attributes ``w_q``, ``w_k``, ``w_v``, ``w_o`` (or a ``load_numpy_params``
    method); known weights are loaded into them. ``module(query, key, value,
    mask=mask)`` with query (B, Tq, D), key/value (B, Tk, D) and a boolean mask
    broadcastable to (B, H, Tq, Tk) must return out (B, Tq, D) or (out, weights
    (B, H, Tq, Tk)); compared with :func:`numpy_ref.multi_head_attention`. With
    dropout=0.5 and ``.eval()`` the module must be deterministic and match the
    reference. A class whose signature has ``kdim`` and ``vdim`` is also built
    as ``cls(d_model, num_heads, kdim=kdim, vdim=vdim)`` and run on keys (B,
    Tk, kdim) and values (B, Tk, vdim) of other widths than d_model (w_k then
    maps kdim -> D, w_v vdim -> D).
    """
    label = display_name(cls, "MultiHeadAttention")

    def make(d_model, num_heads, dropout, **dims):
        return _torch_module(
            cls,
            label,
            {"d_model": d_model, "num_heads": num_heads},
            dropout,
            **dims,
        )

    def run(module, query, key, value, mask, training=None):
        if training is not None:
            module.train(training)
        return _call_mha(module, query, key, value, mask, "torch", label)

    def layout_code(module):
        return (
            "weight-not-transposed"
            if _has_linears(module)
            else "weight-layout-transposed"
        )

    run_check(
        _keeping_rng(
            lambda: _check_mha_body(
                make,
                lambda m, p: _load_torch_mha(m, p, label),
                run,
                label,
                test_dropout,
                cross_dims=_accepts_cross_dims(cls),
                layout_code=layout_code,
            )
        ),
        timeout,
    )


def _check_mha_function_body(fn, label, atol=2e-5, rtol=1e-4):
    n = 0
    for d_model, num_heads, kdim, vdim, params, cases in _mha_configs(
        cross_dims=True
    ):
        tparams = {
            name: torch.tensor(value, dtype=torch.float32)
            for name, value in params.items()
        }
        prefix = _mha_case_prefix(d_model, num_heads, kdim, vdim)
        for i, (query, key, value, mask, desc) in enumerate(cases, 1):
            n += 1
            case = f"{prefix}, case {i} of {len(cases)}: {desc}"
            args = {
                "query": to_framework(query, "torch"),
                "key": to_framework(key, "torch"),
                "value": to_framework(value, "torch"),
                "params": tparams,
                "num_heads": num_heads,
                "mask": to_framework(mask, "torch"),
            }
            with torch.no_grad(), _cross_dim_note(d_model, kdim, vdim):
                result = call(fn, args, label, positional=5)
            out_s, w_s = split_result(result, case)
            out_s = as_array(
                out_s, "output" if w_s is not None else "result", case
            )
            w_s = None if w_s is None else as_array(w_s, "weights", case)
            ref_out, ref_w = numpy_ref.multi_head_attention(
                query, key, value, params, num_heads, mask
            )
            if close(out_s, ref_out, atol, rtol) and (
                w_s is None or close(w_s, ref_w, atol, rtol)
            ):
                continue
            diagnose(
                out_s,
                w_s,
                mha_candidates(
                    query, key, value, params, num_heads, mask, True
                ),
                case,
                ref_out,
                ref_w,
                atol=atol,
                rtol=rtol,
            )
    return _mha_success(label, n, cross_dims=True)


def check_einsum_attention(fn_or_cls, *, timeout: float = DEFAULT_TIMEOUT):
    """Check einsum attention, whichever form the exercise uses:

    * a class -> as :func:`check_multi_head_attention` (weights loaded through
      ``load_numpy_params`` when the projections are not ``nn.Linear`` layers;
      kdim, vdim != d_model tried when the class accepts them);
    * a function with a ``params`` argument -> ``fn(query, key, value, params,
      num_heads, mask=None)`` with params a dict of float32 tensors (keys w_q,
      b_q, ..., ``x @ W + b`` convention: w_q (D, D), w_k (kdim, D), w_v (vdim,
      D), w_o (D, D)), compared with :func:`numpy_ref.multi_head_attention`, on
      square weights and on cross-attention with keys (B, Tk, kdim) and values
      (B, Tk, vdim) of other widths than d_model;
    * any other function -> ``fn(q, k, v, mask=None)`` as
      :func:`check_scaled_dot_product_attention`.
    """
    if is_class(fn_or_cls):
        check_multi_head_attention(fn_or_cls, timeout=timeout)
        return
    label = display_name(fn_or_cls, "einsum attention")
    if "params" in _parameters(fn_or_cls):
        run_check(lambda: _check_mha_function_body(fn_or_cls, label), timeout)
    else:
        run_check(
            lambda: sdpa_check_body(
                fn_or_cls, "torch", True, label, 2e-5, 1e-4
            ),
            timeout,
        )


class _KerasErrorsUnfiltered:
    """While active, Keras does not rewrite errors raised in a layer's
    ``call()`` (its traceback filtering turns them into a multi-line "Exception
    encountered when calling ..." dump); the previous setting is restored."""

    def __enter__(self):
        import keras

        self.keras, self.was_enabled = (
            keras,
            keras.config.is_traceback_filtering_enabled(),
        )
        keras.config.disable_traceback_filtering()
        return self

    def __exit__(self, *exc):
        if self.was_enabled:
            self.keras.config.enable_traceback_filtering()


def check_keras_attention(
    cls, *, test_dropout: bool = True, timeout: float = 60.0
):
    """Check a Keras multi-head attention layer class (TensorFlow is imported
    only here).

    ``cls(d_model, num_heads)`` (and ``dropout=0.5``) must build a Keras layer
    with ``load_numpy_params(params)`` (called after the layer is built by a
    first call); ``layer(query, key, value, mask=mask, training=False)`` uses
    our argument order and mask convention (True = may attend) and returns out
    (B, Tq, D) or (out, weights). The default time limit is longer because the
    first TensorFlow call is slow. While it runs, Keras' traceback filtering is
    off, so an error in the layer's ``call()`` is reported with its own
    message.
    """
    label = display_name(cls, "KerasMultiHeadAttention")

    def make(d_model, num_heads, dropout):
        kwargs = {} if dropout is None else {"dropout": dropout}
        return _construct(cls, label, d_model, num_heads, **kwargs)

    def load(layer, params):
        if not callable(getattr(layer, "load_numpy_params", None)):
            raise fail(
                "missing-attribute",
                "Your layer has no load_numpy_params(params) method, so the "
                "checker "
                "cannot load known weights into it.",
            )
        d_model = params["w_q"].shape[1]
        x = np.zeros((1, 2, d_model))
        # build the weights
        _call_mha(layer, x, x, x, None, "tf", label, training=False)
        call(
            layer.load_numpy_params,
            {"params": params},
            f"{label}.load_numpy_params",
        )
        return params

    def run(layer, query, key, value, mask, training=False):
        return _call_mha(
            layer,
            query,
            key,
            value,
            mask,
            "tf",
            label,
            training=bool(training),
        )

    def body():
        # imports Keras (slow: TensorFlow) inside the time limit
        with _KerasErrorsUnfiltered():
            return _check_mha_body(
                make, load, run, label, test_dropout, atol=5e-5, rtol=1e-4
            )

    run_check(body, timeout)


# -----------------------------------------------------------------------------
# Single-head attention module (chapter 2)
# -----------------------------------------------------------------------------

# (d_in, d_out): square first, so that x @ linear.weight still runs and is
# diagnosed; then d_in != d_out, which tells sqrt(d_in) from sqrt(d_out) and
# catches code that only works for square projections.
_SINGLE_HEAD_CONFIGS = [(8, 8), (6, 4), (5, 8)]
_SINGLE_HEAD_MISSING = (
    "Name the projections self.w_q, self.w_k and self.w_v, each an "
    "nn.Linear(d_in, d_out)."
)


def _single_head_reference(query, key, value, p, mask):
    """numpy_ref.scaled_dot_product_attention of the projections -> (out (B,
    Tq, d_out), weights (B, Tq, Tk))."""
    q, k, v = (
        x @ p[f"w_{n}"] + p[f"b_{n}"]
        for x, n in ((query, "q"), (key, "k"), (value, "v"))
    )
    return numpy_ref.scaled_dot_product_attention(q, k, v, mask)


def _call_single_head(module, query, key, value, mask, label):
    """module(query[, key, value][, mask=mask]) under no_grad; key and value
    are left out for self-attention."""
    args = {"query": to_framework(query, "torch")}
    if key is not None:
        args.update(
            key=to_framework(key, "torch"), value=to_framework(value, "torch")
        )
    if mask is not None:
        args["mask"] = to_framework(mask, "torch")
    with torch.no_grad():
        return call(
            module, args, f"{label}(...)", positional=1 if key is None else 3
        )


def _check_single_head_body(cls, label, test_dropout, atol=2e-5, rtol=1e-4):
    n = 0

    def load(module, params):
        return _load_torch_mha(
            module,
            params,
            label,
            names=("w_q", "w_k", "w_v"),
            advice=_SINGLE_HEAD_MISSING,
        )

    configs = [
        (d_in, d_out, single_head_cases(d_in))
        for d_in, d_out in _SINGLE_HEAD_CONFIGS
    ]
    configs += [
        (
            d_in,
            d_out,
            hidden_batch_cases(
                d_in, b, t_q, t_k, seed=d_out, single_head=True
            ),
        )
        for d_in, d_out, b, t_q, t_k in hidden.single_head_sizes()
    ]
    for d_in, d_out, cases in configs:
        module = _torch_module(
            cls, label, {"d_in": d_in, "d_out": d_out}, None
        )
        effective = load(
            module, single_head_params(d_in, d_out, seed=d_in + d_out)
        )
        for i, (query, key, value, mask, desc) in enumerate(cases, 1):
            n += 1
            case = (
                f"d_in={d_in}, d_out={d_out}, case {i} of {len(cases)}: {desc}"
            )
            out_s, w_s = split_result(
                _call_single_head(module, query, key, value, mask, label), case
            )
            out_s = as_array(
                out_s, "output" if w_s is not None else "result", case
            )
            w_s = None if w_s is None else as_array(w_s, "weights", case)
            key, value = (query, query) if key is None else (key, value)
            ref_out, ref_w = _single_head_reference(
                query, key, value, effective, mask
            )
            if close(out_s, ref_out, atol, rtol) and (
                w_s is None or close(w_s, ref_w, atol, rtol)
            ):
                continue
            layout_code = (
                "weight-not-transposed"
                if _has_linears(module)
                else "weight-layout-transposed"
            )
            diagnose(
                out_s,
                w_s,
                single_head_candidates(
                    query, key, value, effective, mask, layout_code
                ),
                case,
                ref_out,
                ref_w,
                atol=atol,
                rtol=rtol,
            )
    text = (
        f"✓ {label}: {n} cases ({len(configs)} sizes, d_in != d_out too; "
        "self- and cross-attention, "
        "Tq != Tk, masks) match the reference"
    )
    if not test_dropout:
        return text
    d_in, d_out = _SINGLE_HEAD_CONFIGS[1]
    module = _torch_module(cls, label, {"d_in": d_in, "d_out": d_out}, 0.5)
    effective = load(
        module, single_head_params(d_in, d_out, seed=d_in + d_out)
    )
    query, key, value, mask, desc = single_head_cases(d_in)[1]
    ref_out, _ = _single_head_reference(query, key, value, effective, mask)
    outs = [
        as_array(
            split_result(
                _call_single_head(module, query, key, value, mask, label), desc
            )[0],
            "result",
            desc,
        )
        for _ in range(2)
    ]
    _require_eval_outputs(
        outs, ref_out, atol, rtol, case=f"d_in={d_in}, d_out={d_out}: {desc}"
    )
    d = _SINGLE_HEAD_CONFIGS[0][0]  # square, for an identity value projection
    module = _torch_module(
        cls, label, {"d_in": d, "d_out": d}, _TRAIN_P
    ).train()
    eye = np.eye(d)
    effective = load(
        module,
        dict(single_head_params(d, d, seed=2 * d), w_v=eye, b_v=0 * eye[0]),
    )
    x = _orthogonal_values(np.random.default_rng(3), (12, d, d))
    _, ref_w = _single_head_reference(x, x, x, effective, None)
    case = (
        f"d_in={d}, d_out={d}, dropout={_TRAIN_P}, training mode: "
        f"self-attention, x {shape_text(x.shape)}"
    )

    def run_train():
        out_s, w_s = split_result(
            _call_single_head(module, x, None, None, None, label), case
        )
        return as_array(
            out_s, "output", case
        ), None if w_s is None else as_array(w_s, "weights", case)

    _training_probe(
        run_train, ref_w, lambda out: out @ np.swapaxes(x, -1, -2) / 4, case
    )
    return (
        text + "; dropout is off in eval mode and drops attention weights "
        "at rate p in training mode"
    )


def check_single_head_attention(
    cls, *, test_dropout: bool = True, timeout: float = DEFAULT_TIMEOUT
):
    """Check a PyTorch single-head attention class (chapter 2's
    ``SingleHeadAttention``).

    ``cls(d_in, d_out)`` (and ``cls(d_in, d_out, dropout=0.5)`` if
    ``test_dropout``) must build an ``nn.Module`` with ``nn.Linear`` attributes
    ``w_q``, ``w_k``, ``w_v`` (d_in -> d_out, with or without bias) or a
    ``load_numpy_params(params)`` method (keys w_q, b_q, w_k, b_k, w_v, b_v;
    ``x @ W + b`` convention, W of shape (d_in, d_out)); known weights are
    loaded into them. Sizes with d_in == d_out and d_in != d_out are tried.
    ``module(x)`` / ``module(x, mask=mask)`` is self-attention (key and value
    left out); ``module(query, key, value, mask=mask)`` with query (B, Tq,
    d_in), key/value (B, Tk, d_in) is cross-attention; the boolean mask
    broadcasts to (B, Tq, Tk), True = may attend, and a fully masked query row
    must give a zero output. The module returns out (B, Tq, d_out) or (out,
    weights (B, Tq, Tk)); compared with
    :func:`numpy_ref.scaled_dot_product_attention` of the projections. With
    dropout=0.5 and ``.eval()`` it must be deterministic and match the
    reference.
    """
    label = display_name(cls, "SingleHeadAttention")
    run_check(
        _keeping_rng(
            lambda: _check_single_head_body(cls, label, test_dropout)
        ),
        timeout,
    )


# -----------------------------------------------------------------------------
# Parameter counts
# -----------------------------------------------------------------------------


def _check_count_body(fn, label, names, configs, expected, known):
    """Shared body of the parameter-count checks: ``fn(a, b, bias=...)`` for
    each ``(a, b, bias)`` of ``configs`` (``names`` are the two size
    arguments); ``known(a, b, bias)`` maps wrong answers to (code, message)."""
    for i, (a, b, bias) in enumerate(configs, 1):
        text = f"{label}({a}, {b}, bias={bias})"
        case = (
            f"case {i} of {len(configs)}: {names[0]}={a}, "
            f"{names[1]}={b}, bias={bias}"
        )
        got = call(
            fn,
            {names[0]: a, names[1]: b, "bias": bias},
            label,
            positional=2,
            call_text=text,
        )
        if got is None:
            raise fail("returned-none", case=case)
        if isinstance(got, bool) or not isinstance(
            got, (int, float, np.integer, np.floating)
        ):
            raise fail(
                "wrong-type",
                f"Your function returned a {type(got).__name__}; expected a "
                "number.",
                case=case,
            )
        if got == expected(a, b, bias):
            continue
        code, message = known(a, b, bias).get(
            got, ("wrong-value", f"{got} is not the number of parameters.")
        )
        raise fail(code, message, case=case)
    return (
        f"✓ {display_name(fn, label)}: {len(configs)} configurations "
        "(with and without bias) are right"
    )


def check_parameter_count(fn, *, timeout: float = DEFAULT_TIMEOUT):
    """Check ``fn(d_model, num_heads, bias=True)`` -> the number of trainable
    parameters of multi-head attention (four d_model x d_model projections,
    plus four bias vectors of d_model if ``bias``)."""

    def known(d, h, bias):
        return {
            3 * d * d + (3 * d if bias else 0): (
                "missing-output-projection",
                "You counted only w_q, w_k and w_v: the output projection w_o "
                "(d_model x d_model, plus its bias) has parameters too.",
            ),
            4 * d * d + (0 if bias else 4 * d): (
                "wrong-value",
                "Biases: with bias=True each of the four "
                "projections has a bias vector of d_model numbers; with "
                "bias=False there are none.",
            ),
            h * 4 * d * d + (4 * d if bias else 0): (
                "wrong-value",
                "The heads do not each get their own "
                "d_model x d_model matrices: the H heads share one "
                "d_model x d_model projection, split into H slices.",
            ),
        }

    configs = [
        (512, 8, True),
        (64, 4, False),
        (768, 12, True),
        (10, 5, False),
        (96, 3, True),
    ]
    run_check(
        lambda: _check_count_body(
            fn,
            "parameter count",
            ("d_model", "num_heads"),
            configs,
            lambda d, h, bias: 4 * d * d + (4 * d if bias else 0),
            known,
        ),
        timeout,
    )


# -----------------------------------------------------------------------------
# Checked questions of chapters 2, 5 and 6 (see .questions)
# -----------------------------------------------------------------------------

choice_question(
    "2.square-weight",
    answer="C",
    why="nn.Linear(16, 16) stores W as (16, 16) and computes x @ W.T; x "
    "@ W has the same shape but uses the "
    "transposed matrix, so it silently computes something else.",
    wrong={
        "A": (
            "weight-not-transposed",
            "nn.Linear computes x @ weight.T + bias: x @ weight uses the "
            "transpose.",
        ),
        "B": "a shape error only appears when d_in != d_out; a square "
        "weight fits either way, which is why this bug "
        "hides.",
    },
)
choice_question(
    "2.dropout-sum",
    answer="B",
    why="dropout zeroes each weight with probability p and scales the "
    "survivors by 1 / (1 - p): a row's sum is 1 "
    "only on average over the random draws, and in evaluation mode dropout "
    "is off.",
    wrong={
        "A": (
            "dropout-in-eval",
            "rows sum to exactly 1 in evaluation mode, when dropout is off; "
            "in training mode "
            "some weights are zeroed.",
        ),
        "C": "the survivors are scaled by 1 / (1 - p) = 2 to make up for "
        "the dropped ones: the sum is 1 on average, "
        "not 1 - p.",
    },
)
choice_question(
    "5.summed-letter",
    answer="A",
    why="a letter that appears in the inputs but not after -> is summed "
    "over: 's', the key positions. Each query "
    "position t gets the weighted sum of the values over the keys.",
    wrong={
        "B": (
            "softmax-wrong-axis",
            "'t' (the queries) appears in the output, so it is kept; "
            "summing over the "
            "queries would mix the weights of different queries.",
        ),
        "C": "'k', the features, appears in the output: each feature of "
        "the values is kept.",
        "D": "'b' and 'h' appear on both sides: they are batch axes, "
        "matched, not summed.",
    },
)
choice_question(
    "6.keras-kernel",
    answer="B",
    why="keras.layers.MultiHeadAttention stores the query projection "
    "per head: kernel (d_model, H, key_dim) = "
    "(16, 4, 8), so that an einsum 'btd,dhk->bthk' gives per-head queries "
    "at once.",
    wrong={
        "A": "(16, 32) would be a Dense kernel with the heads merged; "
        "Keras keeps the head axis separate.",
        "C": (
            "weight-layout-transposed",
            "(32, 16) is nn.Linear's (d_out, d_in) layout; Keras kernels are "
            "(d_in, ...).",
        ),
        "D": "(4, 8, 16) is the layout of the OUTPUT projection's "
        "kernel, (H, key_dim, d_model).",
    },
)
choice_question(
    "6.keras-mask",
    answer="A",
    why="Keras' attention_mask means True (or 1) = may attend, like the "
    "course and F.scaled_dot_product_attention; "
    "nn.MultiheadAttention is the odd one out.",
    wrong={
        "B": (
            "mask-inverted",
            "True = blocked is nn.MultiheadAttention's convention "
            "(attn_mask, key_padding_mask), "
            "not Keras'.",
        ),
        "C": "Keras takes boolean or 0/1 masks and turns them into large "
        "negative scores itself; adding -inf is "
        "what PyTorch's float attn_mask expects.",
    },
)
number_question(
    "5.score-macs",
    answer=2 * 8 * 128 * 128 * 64,
    why="einsum does one multiply-add per combination of ALL its "
    "letters: b h t s k = 2 x 8 x 128 x 128 x 64; "
    "the summed letter k multiplies the count like the others.",
    known={
        2
        * 8
        * 128
        * 128: "that is the number of scores (the output's letters b h t "
        "s); each is a sum of 64 "
        "products over k.",
        2
        * 8
        * 128
        * 64: "that is the size of q (b h t k); every query meets every "
        "one of the 128 keys.",
    },
    hint="Multiply the sizes of every distinct letter of the spec, kept "
    "or summed.",
)
