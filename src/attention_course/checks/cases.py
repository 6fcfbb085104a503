"""Input cases shared by the checks: seeded random tensors, masks of every
kind, and their conversion to the framework the student's code takes. Every
case comes with a description that failure messages quote."""

from __future__ import annotations

import numpy as np

from .. import numpy_ref
from . import hidden
from .runner import shape_text


def mixed_mask(rng, shape):
    """Random boolean mask in which every row has at least one True and one
    False."""
    mask = rng.random(shape) < 0.5
    t = shape[-1]
    rows = mask.reshape(-1, t)
    for row in rows:
        i, j = rng.choice(t, size=2, replace=False)
        row[i], row[j] = True, False
    return rows.reshape(shape)


def make_mask(kind, rng, batch, tq, tk):
    if kind is None:
        return None, "no mask"
    if kind == "random":
        m = mixed_mask(rng, (tq, tk))
        return m, f"random mask of shape {shape_text(m.shape)}"
    if kind == "random-batched":
        m = mixed_mask(rng, (batch[0],) + (1,) * (len(batch) - 1) + (tq, tk))
        return m, f"random mask of shape {shape_text(m.shape)}"
    if kind == "causal":
        m = numpy_ref.causal_mask(tq, tk)
        return m, f"causal mask of shape {shape_text(m.shape)}"
    if kind in ("padding", "padding-empty"):
        lengths = rng.integers(1, tk + 1, size=batch[0])
        if kind == "padding-empty":
            lengths[-1] = 0
        m = numpy_ref.padding_mask(lengths, tk).reshape(
            (batch[0],) + (1,) * (len(batch) - 1) + (1, tk)
        )
        return (
            m,
            f"padding mask of shape {shape_text(m.shape)} for lengths "
            f"{[int(n) for n in lengths]}",
        )
    if kind == "random-empty":
        m = mixed_mask(rng, (tq, tk))
        m[rng.integers(tq)] = False
        return (
            m,
            f"random mask of shape {shape_text(m.shape)} with a fully "
            "masked row",
        )
    raise ValueError(kind)  # pragma: no cover


# (batch dims, Tq, Tk, Dk, Dv, mask kind); ordered so that the simplest cases
# come first.
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


def sdpa_cases(fully_masked_rows: bool, seed: int = 0):
    rng = np.random.default_rng(seed)
    for batch, tq, tk, dk, dv, kind in _SDPA_CASES + hidden.sdpa_shapes(
        fully_masked_rows
    ):
        if (
            not fully_masked_rows
            and kind is not None
            and kind.endswith("empty")
        ):
            continue
        q = rng.standard_normal(batch + (tq, dk))
        k = rng.standard_normal(batch + (tk, dk))
        v = rng.standard_normal(batch + (tk, dv))
        mask, mask_text = make_mask(kind, rng, batch, tq, tk)
        desc = (
            f"q {shape_text(q.shape)}, k {shape_text(k.shape)}, v "
            f"{shape_text(v.shape)}, {mask_text}"
        )
        yield q, k, v, mask, desc


def to_framework(x, framework: str, dtype: str | None = None):
    """A float64/bool NumPy case array as the student's function receives it: a
    NumPy copy (float64), or a float32 torch tensor / TensorFlow tensor (masks
    stay boolean); ``dtype`` ("float32", "float64"): another float dtype (see
    :func:`.hidden.other_dtype`)."""
    if x is None:
        return None
    if framework == "numpy":
        return (
            x.astype(dtype or np.float64) if x.dtype != np.bool_ else x.copy()
        )
    if framework == "tf":
        return to_tf(x)
    import torch  # here, not above: a NumPy chapter's check never imports it

    if x.dtype == np.bool_:
        return torch.from_numpy(x.copy())
    return torch.tensor(x, dtype=getattr(torch, dtype or "float32"))


def to_tf(a):
    import tensorflow as tf

    return tf.constant(a if a.dtype == np.bool_ else a.astype(np.float32))


def with_neg_inf(rng, shape):
    x = rng.standard_normal(shape) * 2
    blocked = mixed_mask(rng, shape)
    return np.where(blocked, x, -np.inf)


def mha_cases(d_model, seed=5):
    """(query, key, value, mask, description) with B = 2: self-attention,
    cross-attention, masks."""
    rng = np.random.default_rng(seed)
    b = 2

    def x(t):
        return rng.standard_normal((b, t, d_model))

    cases = []
    s = x(5)
    cases.append((s, s, s, None, "self-attention, x (2, 5, D), no mask"))
    cases.append(
        (
            x(4),
            x(6),
            x(6),
            None,
            "cross-attention, query (2, 4, D), key and value (2, 6, D), no "
            "mask",
        )
    )
    s = x(6)
    cases.append(
        (
            s,
            s,
            s,
            numpy_ref.causal_mask(6),
            "self-attention, x (2, 6, D), causal mask (6, 6)",
        )
    )
    lengths = [6, 3]
    cases.append(
        (
            x(3),
            x(6),
            x(6),
            numpy_ref.padding_mask(lengths, 6),
            "cross-attention, query (2, 3, D), key and value (2, 6, D), "
            "padding mask (2, 1, 1, 6) for lengths "
            f"{lengths}",
        )
    )
    mask = mixed_mask(rng, (b, 1, 5, 4))
    cases.append(
        (
            x(5),
            x(4),
            x(4),
            mask,
            "cross-attention, query (2, 5, D), key and value (2, 4, D), "
            "random mask "
            "(2, 1, 5, 4)",
        )
    )
    s = x(4)
    mask = mixed_mask(rng, (4, 4))
    mask[2] = False
    cases.append(
        (
            s,
            s,
            s,
            mask,
            "self-attention, x (2, 4, D), mask (4, 4) whose row 2 is fully "
            "masked",
        )
    )
    return cases


def hidden_batch_cases(d_in, b, t_q, t_k, seed, single_head=False):
    """Hidden (query, key, value, mask, description) cases of a module with
    ``b`` >= 5 examples (see :mod:`.hidden`): cross-attention with Tq != Tk and
    a padding mask of its own per example, then causal self-attention.
    ``single_head``: the padding mask is (B, 1, Tk), for scores (B, Tq, Tk),
    not (B, 1, 1, Tk)."""
    rng = np.random.default_rng(seed)
    lengths = [int(n) for n in rng.integers(1, t_k + 1, size=b)]
    padding = numpy_ref.padding_mask(lengths, t_k)  # (B, 1, 1, Tk)
    padding = padding[:, 0] if single_head else padding
    x = rng.standard_normal((b, t_q, d_in))
    memory = rng.standard_normal((b, t_k, d_in))
    return [
        (
            rng.standard_normal((b, t_q, d_in)),
            memory,
            memory,
            padding,
            f"cross-attention, query {shape_text((b, t_q, d_in))}, key and "
            f"value {shape_text(memory.shape)}, padding "
            f"mask {shape_text(padding.shape)} for lengths {lengths}",
        ),
        (
            x,
            x,
            x,
            numpy_ref.causal_mask(t_q),
            f"self-attention, x {shape_text(x.shape)}, causal mask "
            f"{shape_text((t_q, t_q))}",
        ),
    ]


def mha_cross_dim_cases(d_model, kdim, vdim, seed=6):
    """Cross-attention cases whose keys and values have their own feature sizes
    kdim, vdim != d_model: w_k is (kdim, D) and w_v (vdim, D), so code that
    only works for square weights fails here."""
    rng = np.random.default_rng(seed)

    def x(t, d):
        return rng.standard_normal((2, t, d))

    lengths = [5, 2]
    return [
        (
            x(4, d_model),
            x(6, kdim),
            x(6, vdim),
            None,
            "cross-attention, query (2, 4, D), key (2, 6, kdim), value (2, "
            "6, vdim), no mask",
        ),
        (
            x(3, d_model),
            x(5, kdim),
            x(5, vdim),
            numpy_ref.padding_mask(lengths, 5),
            "cross-attention, query (2, 3, D), key (2, 5, kdim), value (2, "
            "5, vdim), padding mask (2, 1, 1, 5) for "
            f"lengths {lengths}",
        ),
        (
            x(5, d_model),
            x(4, kdim),
            x(4, vdim),
            mixed_mask(rng, (2, 1, 5, 4)),
            "cross-attention, query (2, 5, D), key (2, 4, kdim), value (2, "
            "4, vdim), random mask (2, 1, 5, 4)",
        ),
    ]


def single_head_params(d_in, d_out, seed):
    """w_q, w_k, w_v (d_in, d_out) and biases b_* (d_out,) in the x @ W + b
    convention, float64."""
    rng = np.random.default_rng(seed)
    params = {}
    for name in "qkv":
        params[f"w_{name}"] = rng.normal(0.0, d_in**-0.5, size=(d_in, d_out))
        params[f"b_{name}"] = rng.normal(0.0, 0.1, size=(d_out,))
    return params


def single_head_cases(d_in, seed=7):
    """(query, key, value, mask, description) with B = 2; key and value are
    None for self-attention (the module is then called as module(x) or
    module(x, mask=mask)); masks broadcast to (B, Tq, Tk)."""
    rng = np.random.default_rng(seed)

    def x(t):
        return rng.standard_normal((2, t, d_in))

    lengths = [6, 3]
    mask = mixed_mask(rng, (4, 4))
    mask[2] = False
    return [
        (
            x(5),
            None,
            None,
            None,
            "self-attention module(x), x (2, 5, d_in), no mask",
        ),
        (
            x(4),
            x(6),
            x(6),
            None,
            "cross-attention, query (2, 4, d_in), key and value (2, 6, "
            "d_in), no mask",
        ),
        (
            x(6),
            None,
            None,
            numpy_ref.causal_mask(6),
            "self-attention module(x, mask=mask), x (2, 6, d_in), causal mask "
            "(6, 6)",
        ),
        (
            x(3),
            x(6),
            x(6),
            numpy_ref.padding_mask(lengths, 6)[:, 0],
            "cross-attention, query (2, 3, d_in), key and "
            "value (2, 6, d_in), padding mask (2, 1, 6) for lengths "
            f"{lengths}",
        ),
        (
            x(5),
            x(4),
            x(4),
            mixed_mask(rng, (2, 5, 4)),
            "cross-attention, query (2, 5, d_in), key and value "
            "(2, 4, d_in), random mask (2, 5, 4)",
        ),
        (
            x(4),
            None,
            None,
            mask,
            "self-attention module(x, mask=mask), x (2, 4, d_in), mask (4, "
            "4) whose row 2 is "
            "fully masked",
        ),
    ]
