"""Checks of weights ported between frameworks (chapter 6): a trained
``torch.nn.MultiheadAttention`` into Keras'
``keras.layers.MultiHeadAttention``.

The student's function gets the PyTorch layer's arrays (NumPy, never a module:
the grader sends arguments over a pipe as arrays) and returns the Keras layer's
weights; the check loads them into a real Keras layer and compares its output
with the PyTorch layer's on cross-attention inputs (Tq != Tk, keys != values)
for several head counts. A wrong result is diagnosed by comparing the returned
arrays with what each known porting mistake gives: a weight not transposed from
PyTorch's (out, in) layout, heads interleaved, the packed query/key/value
chunks in the wrong order.
"""

from __future__ import annotations

import itertools

import numpy as np
import torch

from .runner import (
    as_array,
    call,
    close,
    display_name,
    fail,
    run_check,
    shape_text,
)

#: (d_model, num_heads, Tq, Tk): several head counts, head sizes that differ
#: from the head counts.
_CONFIGS = [(12, 2, 3, 5), (12, 3, 4, 6), (16, 4, 5, 2), (18, 6, 2, 7)]
#: The names of the entries of
#: ``keras.layers.MultiHeadAttention.get_weights()``, in its order.
KERAS_MHA_WEIGHTS = (
    "query kernel",
    "query bias",
    "key kernel",
    "key bias",
    "value kernel",
    "value bias",
    "output kernel",
    "output bias",
)
_ROLES = ("query", "key", "value")


def _keras_shapes(d_model, num_heads):
    dh = d_model // num_heads
    return [(d_model, num_heads, dh), (num_heads, dh)] * 3 + [
        (num_heads, dh, d_model),
        (d_model,),
    ]


def _convert(
    w_in,
    b_in,
    w_out,
    b_out,
    num_heads,
    order=(0, 1, 2),
    transpose_in=True,
    transpose_out=True,
    interleave_in=False,
    interleave_out=False,
):
    """The Keras weights made from nn.MultiheadAttention's arrays, right (the
    defaults) or with known mistakes:
    ``order`` the packed chunks taken as (query, key, value), ``transpose_*``
    False reads PyTorch's (out, in) weights as (in, out), ``interleave_*``
    gives feature f to head f % H instead of f // Dh."""
    d = w_out.shape[0]
    h, dh = num_heads, d // num_heads
    w_chunks, b_chunks = np.split(w_in, 3, axis=0), np.split(b_in, 3)
    weights = []
    for i in order:
        w = w_chunks[i].T if transpose_in else w_chunks[i]  # (d_in, H * Dh)
        if interleave_in:
            weights += [
                w.reshape(d, dh, h).transpose(0, 2, 1),
                b_chunks[i].reshape(dh, h).T,
            ]
        else:
            weights += [w.reshape(d, h, dh), b_chunks[i].reshape(h, dh)]
    w = w_out.T if transpose_out else w_out  # (H * Dh, d_model)
    weights.append(
        w.reshape(dh, h, d).transpose(1, 0, 2)
        if interleave_out
        else w.reshape(h, dh, d)
    )
    weights.append(b_out)
    return weights


def _mistakes():
    """(code, detail, keyword arguments of :func:`_convert`) for every known
    porting mistake."""
    out = [
        (
            "weight-layout-transposed",
            "the query, key and value kernels (the chunks of in_proj_weight)",
            {"transpose_in": False},
        ),
        (
            "weight-layout-transposed",
            "the output kernel (out_proj.weight)",
            {"transpose_out": False},
        ),
        (
            "weight-layout-transposed",
            "every kernel (in_proj_weight's chunks and out_proj.weight)",
            {"transpose_in": False, "transpose_out": False},
        ),
        (
            "kernel-heads-interleaved",
            "query, key, value and output kernels",
            {"interleave_in": True, "interleave_out": True},
        ),
        (
            "kernel-heads-interleaved",
            "query, key and value kernels and biases",
            {"interleave_in": True},
        ),
        (
            "kernel-heads-interleaved",
            "output kernel",
            {"interleave_out": True},
        ),
    ]
    for order in itertools.permutations(range(3)):
        if order != (0, 1, 2):
            taken = ", ".join(
                f"the {_ROLES[i]}'s rows as the {role}"
                for role, i in zip(_ROLES, order, strict=True)
                if i != _ROLES.index(role)
            )
            out.append(
                (
                    "qkv-chunks-swapped",
                    f"packed chunks are taken in the wrong order: {taken}",
                    {"order": order},
                )
            )
    return out


def _torch_mha(w_in, b_in, w_out, b_out, num_heads):
    """nn.MultiheadAttention (batch_first, float64) holding these weights."""
    d = w_out.shape[0]
    mha = (
        torch.nn.MultiheadAttention(d, num_heads, batch_first=True)
        .double()
        .eval()
    )
    with torch.no_grad():
        mha.in_proj_weight.copy_(torch.from_numpy(w_in))
        mha.in_proj_bias.copy_(torch.from_numpy(b_in))
        mha.out_proj.weight.copy_(torch.from_numpy(w_out))
        mha.out_proj.bias.copy_(torch.from_numpy(b_out))
    return mha


def _as_weight_list(result, d_model, num_heads, case):
    """The student's result as 8 float64 arrays of the right shapes, or
    CheckFailed saying what is wrong."""
    if result is None:
        raise fail("returned-none", case=case)
    if not isinstance(result, (list, tuple)):
        raise fail(
            "wrong-type",
            f"Your function returned a {type(result).__name__}; expected a "
            "list of 8 arrays in "
            "the order of keras' get_weights(): "
            f"{', '.join(KERAS_MHA_WEIGHTS)}.",
            case=case,
        )
    if len(result) != 8:
        raise fail(
            "wrong-type",
            f"Your function returned {len(result)} arrays; "
            "keras.layers.MultiHeadAttention has "
            f"8 weights, in this order: {', '.join(KERAS_MHA_WEIGHTS)}.",
            case=case,
        )
    arrays = [
        as_array(a, f"entry {i} ({name})", case)
        for i, (a, name) in enumerate(
            zip(result, KERAS_MHA_WEIGHTS, strict=True)
        )
    ]
    expected = _keras_shapes(d_model, num_heads)
    got = [a.shape for a in arrays]
    if got == expected:
        return arrays
    if sorted(got) == sorted(expected):
        raise fail(
            "wrong-shape",
            "Your arrays have the right shapes but come in the wrong order. "
            "keras.layers.MultiHeadAttention.get_weights() lists them as: "
            f"{', '.join(KERAS_MHA_WEIGHTS)}.",
            case=case,
        )
    i = next(
        i for i, (g, e) in enumerate(zip(got, expected, strict=True)) if g != e
    )
    dh = d_model // num_heads
    meaning = {
        3: "(d_model, H, Dh)",
        2: "(H, Dh)" if i < 6 else "(H, Dh, d_model)",
        1: "(d_model,)",
    }[len(expected[i])]
    raise fail(
        "wrong-shape",
        f"Entry {i} of your list, the {KERAS_MHA_WEIGHTS[i]}, has shape "
        f"{shape_text(got[i])}; "
        f"expected {meaning} = {shape_text(expected[i])} (d_model = "
        f"{d_model}, H = {num_heads}, "
        f"Dh = {dh}).",
        case=case,
    )


def _diagnose(arrays, inputs, num_heads, case, largest):
    """Name the porting mistake whose arrays the student's match, else say
    which entries are wrong."""
    for code, detail, kwargs in _mistakes():
        candidate = _convert(*inputs, num_heads, **kwargs)
        if all(
            close(a, c, 1e-6, 1e-5)
            for a, c in zip(arrays, candidate, strict=True)
        ):
            raise fail(code, detail=detail, case=case)
    right = _convert(*inputs, num_heads)
    wrong = [
        name
        for a, r, name in zip(arrays, right, KERAS_MHA_WEIGHTS, strict=True)
        if not close(a, r, 1e-6, 1e-5)
    ]
    raise fail(
        "wrong-output",
        "Loaded into keras.layers.MultiHeadAttention, your weights give an "
        "output that "
        "differs from nn.MultiheadAttention's (largest difference "
        f"{largest:.2g}) and match none of the "
        "mistakes this checker knows. These entries of your list differ "
        "from a conversion that works: "
        f"{', '.join(wrong)}. Check each one's layout (transpose? which "
        "rows? which head?) on its own.",
        case=case,
    )


def _check_body(fn, name, keras):
    """``name``: the student's function's name, for the success line."""
    for n, (d, h, t_q, t_k) in enumerate(_CONFIGS, 1):
        rng = np.random.default_rng(100 + n)
        # nn.MultiheadAttention's arrays
        w_in = rng.normal(0.0, d**-0.5, size=(3 * d, d)).astype(np.float32)
        b_in = rng.normal(0.0, 0.5, size=(3 * d,)).astype(np.float32)
        w_out = rng.normal(0.0, d**-0.5, size=(d, d)).astype(np.float32)
        b_out = rng.normal(0.0, 0.5, size=(d,)).astype(np.float32)
        inputs = (w_in, b_in, w_out, b_out)
        case = f"config {n} of {len(_CONFIGS)}: d_model={d}, num_heads={h}"
        args = {
            "in_proj_weight": w_in.copy(),
            "in_proj_bias": b_in.copy(),
            "out_proj_weight": w_out.copy(),
            "out_proj_bias": b_out.copy(),
            "num_heads": h,
        }
        arrays = _as_weight_list(
            call(fn, args, "keras_weights_from_torch"), d, h, case
        )

        layer = keras.layers.MultiHeadAttention(num_heads=h, key_dim=d // h)
        layer.build((2, t_q, d), (2, t_k, d))
        layer.set_weights([a.astype(np.float32) for a in arrays])
        # keys and values differ
        q, k, v = (rng.standard_normal((2, t, d)) for t in (t_q, t_k, t_k))
        ours = np.asarray(
            layer(
                q.astype(np.float32),
                v.astype(np.float32),
                key=k.astype(np.float32),
            ),
            np.float64,
        )
        with torch.no_grad():
            theirs = _torch_mha(*(a.astype(np.float64) for a in inputs), h)(
                *(torch.from_numpy(a) for a in (q, k, v)), need_weights=False
            )[0].numpy()
        if not np.all(np.isfinite(ours)):
            raise fail(
                "nan-output",
                "Loaded into keras.layers.MultiHeadAttention, your weights "
                "give NaN or inf.",
                case=case,
            )
        if not close(ours, theirs, 2e-5, 1e-4):
            _diagnose(
                arrays,
                [a.astype(np.float64) for a in inputs],
                h,
                case + f", Tq={t_q}, Tk={t_k}",
                float(np.max(np.abs(ours - theirs))),
            )
    heads = ", ".join(str(h) for _, h, _, _ in _CONFIGS)
    return (
        f"✓ {name}: {len(_CONFIGS)} nn.MultiheadAttention layers ({heads} "
        "heads) ported; Keras' "
        "MultiHeadAttention gives their outputs (cross-attention, Tq != Tk)"
    )


def check_keras_weights_from_torch(fn, *, timeout: float = 30.0):
    """Chapter 6: check ``fn(in_proj_weight, in_proj_bias, out_proj_weight,
    out_proj_bias, num_heads)`` -> the list of 8 arrays that
    ``keras.layers.MultiHeadAttention(num_heads, key_dim=d_model //
    num_heads)`` takes in ``set_weights`` (the order of its ``get_weights()``:
    query kernel (d_model, H, Dh), query bias (H, Dh), the same for key and
    value, output kernel (H, Dh, d_model), output bias (d_model,)) for the
    layer to compute what a ``torch.nn.MultiheadAttention`` with these weights
    computes. The arguments are NumPy float32 arrays: ``in_proj_weight`` (3
    d_model, d_model) packs the query, key and value projections in PyTorch's
    (out, in) layout, ``out_proj_weight`` is (d_model, d_model), also (out,
    in).

    Diagnoses ``[weight-layout-transposed]``, ``[kernel-heads-interleaved]``,
    ``[qkv-chunks-swapped]``, a list of the wrong length, order or shapes, and
    ``[wrong-output]`` naming the entries that differ.
    """
    # imported before the time limit starts: loading TensorFlow is slow, and
    # not the student's time
    import keras

    name = display_name(fn, "keras_weights_from_torch")
    run_check(lambda: _check_body(fn, name, keras), timeout)
