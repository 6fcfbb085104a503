"""Parameters of attention's ``y = x @ W + b`` projections: the one place that
checks, loads and converts them.

The course exchanges weights as the float64 dict of
:func:`attention_course.numpy_ref.init_mha_params`:
``w_q`` (D, D), ``w_k`` (kdim, D), ``w_v`` (vdim, D), ``w_o`` (D, D), each W of
shape (d_in, d_out), and biases ``b_*`` (D,). Frameworks store the same numbers
in other layouts:

* ``nn.Linear`` keeps W^T, (d_out, d_in); ``nn.MultiheadAttention`` packs q, k
  and v into one (3D, D) matrix when kdim == vdim == D;
* ``keras.layers.MultiHeadAttention`` keeps per-head kernels (d_in, H, Dh) and
  biases (H, Dh).

Every module of the package loads and exports through these functions, so a bad
dict fails with the same errors everywhere: ``TypeError`` for a wrong type,
``ValueError`` naming a missing or mis-shaped key.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from torch import Tensor, nn

from .numpy_ref import MHA_PARAM_NAMES


def expected_shapes(
    d_model: int, kdim: int | None = None, vdim: int | None = None
) -> dict[str, tuple[int, ...]]:
    """The shape of every entry of a ``y = x @ W + b`` dict, in
    :data:`MHA_PARAM_NAMES` order."""
    kdim = d_model if kdim is None else kdim
    vdim = d_model if vdim is None else vdim
    d_in = {"q": d_model, "k": kdim, "v": vdim, "o": d_model}
    return {
        name: (d_in[name[-1]], d_model) if name[0] == "w" else (d_model,)
        for name in MHA_PARAM_NAMES
    }


def check_params(
    params: Mapping,
    d_model: int,
    kdim: int | None = None,
    vdim: int | None = None,
    bias: bool = True,
) -> None:
    """Raise unless ``params`` is a complete ``y = x @ W + b`` dict for a
    module of these sizes.

    TypeError: params is not a mapping, or an entry is not an array or tensor
        of numbers.
    ValueError: a key is missing, an entry has the wrong shape, or bias=False
        but a bias is nonzero.
    """
    if not isinstance(params, Mapping):
        raise TypeError(
            f"params must be a dict of arrays, got {type(params).__name__}"
        )
    expected = expected_shapes(d_model, kdim, vdim)
    for name, shape in expected.items():
        if name not in params:
            raise ValueError(
                f"params is missing {name!r} (expected keys "
                f"{sorted(expected)})"
            )
        value = params[name]
        if not is_numeric_array(value):
            got = getattr(value, "dtype", type(value).__name__)
            raise TypeError(
                f"params[{name!r}] must be a NumPy array or tensor of "
                f"numbers, got {got}"
            )
        if tuple(value.shape) != shape:
            raise ValueError(
                f"params[{name!r}] has shape {tuple(value.shape)}, expected "
                f"{shape}"
            )
        if not bias and name.startswith("b_") and bool((value != 0).any()):
            raise ValueError(
                f"the module has bias=False, but params[{name!r}] is not zero"
            )


def sizes_of(params: Mapping) -> tuple[int, int, int]:
    """(d_model, kdim, vdim) read from the shapes of w_q (D, D), w_k (kdim, D)
    and w_v (vdim, D)."""
    if not isinstance(params, Mapping):
        raise TypeError(
            f"params must be a dict of arrays, got {type(params).__name__}"
        )
    for name in ("w_q", "w_k", "w_v"):
        if name not in params:
            raise ValueError(
                f"params is missing {name!r} (expected keys "
                f"{sorted(MHA_PARAM_NAMES)})"
            )
        if not is_numeric_array(params[name]) or params[name].ndim != 2:
            raise ValueError(
                f"params[{name!r}] must be a 2-D (d_in, d_out) array, got "
                f"{params[name]!r:.60}"
            )
    return (
        params["w_q"].shape[1],
        params["w_k"].shape[0],
        params["w_v"].shape[0],
    )


def is_numeric_array(x) -> bool:
    """True for a NumPy array or tensor of real numbers (not booleans, strings
    or objects)."""
    if isinstance(x, Tensor):
        return x.dtype != torch.bool and not x.dtype.is_complex
    return isinstance(x, np.ndarray) and x.dtype.kind in "iuf"


def as_tensors(params: Mapping, like: Tensor) -> dict[str, Tensor]:
    """The dict's arrays as tensors with the dtype and device of ``like`` (a
    module's weight, an input)."""
    return {name: torch.as_tensor(x).to(like) for name, x in params.items()}


@torch.no_grad()
def load_linear(
    linear: nn.Linear, weight: Tensor, bias: Tensor | None
) -> None:
    """Copy a ``y = x @ W + b`` weight (d_in, d_out) and bias (d_out,) into
    ``linear``, which keeps W^T."""
    linear.weight.copy_(weight.T)  # (d_in, d_out) -> (d_out, d_in)
    if linear.bias is not None:
        linear.bias.copy_(bias)


@torch.no_grad()
def load_linears(linears: Mapping[str, nn.Linear], params: Mapping) -> None:
    """Copy ``params["w_<name>"]`` and ``params["b_<name>"]`` into each named
    Linear (check_params first)."""
    tensors = as_tensors(params, like=next(iter(linears.values())).weight)
    for name, linear in linears.items():
        load_linear(linear, tensors[f"w_{name}"], tensors[f"b_{name}"])


@torch.no_grad()
def linear_params(linears: Mapping[str, nn.Linear]) -> dict[str, np.ndarray]:
    """Float64 ``y = x @ W + b`` dict of named Linears (q, k, v, o -> w_q, b_q,
    ...); zero biases if none."""
    params = {}
    for name, linear in linears.items():
        # (d_in, d_out)
        params[f"w_{name}"] = linear.weight.detach().T.double().cpu().numpy()
        bias = (
            linear.bias.detach()
            if linear.bias is not None
            else linear.weight.new_zeros(linear.out_features)
        )
        params[f"b_{name}"] = bias.double().cpu().numpy()
    return params


@torch.no_grad()
def load_fused_qkv(qkv: nn.Linear, tensors: Mapping[str, Tensor]) -> None:
    """Load w_q, w_k, w_v (d_in, D) side by side into one Linear: ``x @ [W_q |
    W_k | W_v] = [q | k | v]``."""
    # (d_in, 3D)
    weight = torch.cat([tensors["w_q"], tensors["w_k"], tensors["w_v"]], dim=1)
    load_linear(
        qkv,
        weight,
        torch.cat([tensors["b_q"], tensors["b_k"], tensors["b_v"]]),
    )


@torch.no_grad()
def fused_qkv_params(qkv: nn.Linear, w_o: nn.Linear) -> dict[str, np.ndarray]:
    """Float64 ``y = x @ W + b`` dict of a fused (d_in -> 3D) query/key/value
    Linear and an output Linear."""
    d_model = w_o.out_features
    # w_qkv (d_in, 3D), b_qkv (3D,)
    stacked = linear_params({"qkv": qkv, "o": w_o})
    params = {"w_o": stacked["w_o"], "b_o": stacked["b_o"]}
    for i, name in enumerate("qkv"):
        columns = slice(i * d_model, (i + 1) * d_model)
        params[f"w_{name}"] = stacked["w_qkv"][:, columns].copy()
        params[f"b_{name}"] = stacked["b_qkv"][columns].copy()
    return {name: params[name] for name in MHA_PARAM_NAMES}


def check_plain_torch_mha(m: nn.MultiheadAttention) -> None:
    """Raise for what our modules cannot copy: a non-MultiheadAttention, or its
    add_bias_kv / add_zero_attn."""
    if not isinstance(m, nn.MultiheadAttention):
        raise TypeError(
            f"expected a torch.nn.MultiheadAttention, got {type(m).__name__}"
        )
    if m.bias_k is not None or m.add_zero_attn:
        raise ValueError(
            "nn.MultiheadAttention with add_bias_kv=True or "
            "add_zero_attn=True is not supported"
        )


def torch_mha_projections(
    m: nn.MultiheadAttention,
) -> list[tuple[Tensor, Tensor | None]]:
    """(weight (d_out, d_in), bias) of the q, k, v and output projections of an
    ``nn.MultiheadAttention``.

    The tensors are views of m's parameters: reading them reads m, copying into
    them writes into m.
    """
    # kdim == vdim == embed_dim: q, k, v stacked in one (3D, D) matrix
    if m.in_proj_weight is not None:
        in_weights = m.in_proj_weight.chunk(3)
    else:
        in_weights = (m.q_proj_weight, m.k_proj_weight, m.v_proj_weight)
    in_biases = (
        (None, None, None)
        if m.in_proj_bias is None
        else m.in_proj_bias.chunk(3)
    )
    return [
        *zip(in_weights, in_biases, strict=True),
        (m.out_proj.weight, m.out_proj.bias),
    ]


@torch.no_grad()
def load_torch_mha(
    linears: Mapping[str, nn.Linear], m: nn.MultiheadAttention
) -> None:
    """Copy the q, k, v and output projections of ``m`` into ``linears`` (named
    q, k, v, o, in that order)."""
    check_plain_torch_mha(m)
    for linear, (weight, bias) in zip(
        linears.values(), torch_mha_projections(m), strict=True
    ):
        # both layouts are nn.Linear's (d_out, d_in)
        linear.weight.copy_(weight)
        if bias is not None:
            linear.bias.copy_(bias)


@torch.no_grad()
def store_torch_mha(
    linears: Mapping[str, nn.Linear], m: nn.MultiheadAttention
) -> None:
    """Copy ``linears`` (q, k, v, o) into the projections of ``m``: the inverse
    of :func:`load_torch_mha`."""
    check_plain_torch_mha(m)
    for linear, (weight, bias) in zip(
        linears.values(), torch_mha_projections(m), strict=True
    ):
        # weight is a view of m's parameter: this writes into m
        weight.copy_(linear.weight)
        if bias is not None:
            bias.copy_(linear.bias)


def keras_mha_params(layer) -> dict[str, np.ndarray]:
    """numpy_ref dict from the per-head kernels of a built
    ``keras.layers.MultiHeadAttention``."""
    # TensorFlow is an optional dependency: imported only for Keras layers
    import keras

    if not isinstance(layer, keras.layers.MultiHeadAttention):
        raise TypeError(
            "expected a keras.layers.MultiHeadAttention, got "
            f"{type(layer).__name__}"
        )
    if not layer.built:
        raise ValueError(
            "the Keras layer has no weights yet: call it once or "
            "layer.build(query_shape, value_shape)"
        )
    d_model, num_heads, key_dim = layer.query_dense.kernel.shape  # (D, H, Dh)
    if key_dim * num_heads != d_model:
        raise ValueError(
            f"key_dim * num_heads = {key_dim} * {num_heads} != query "
            f"feature size {d_model}"
        )
    if layer.value_dim != key_dim:
        raise ValueError(f"value_dim={layer.value_dim} != key_dim={key_dim}")
    output_shape = tuple(layer.output_dense.kernel.shape)
    if output_shape != (num_heads, key_dim, d_model):
        raise ValueError(
            f"output kernel {output_shape} does not map back to "
            f"d_model={d_model} (output_shape set?)"
        )
    default = layer.attention_axes in (None, (1,), (-2,)) and not getattr(
        layer, "_use_gate", False
    )
    if not default or getattr(layer, "_sliding_window", None):
        raise ValueError(
            "only the default layer is supported: attention over axis 1, no "
            "gate, no sliding window"
        )
    params = {}
    denses = (
        layer.query_dense,
        layer.key_dense,
        layer.value_dense,
        layer.output_dense,
    )
    for ours, theirs in zip("qkvo", denses, strict=True):
        # (d_in, H, Dh); output (H, Dh, D)
        kernel = np.asarray(theirs.kernel, np.float64)
        # (d_in, H * Dh = D); output (H * Dh = D, D)
        params[f"w_{ours}"] = kernel.reshape(-1, d_model)
        bias = (
            np.asarray(theirs.bias, np.float64)
            if layer.use_bias
            else np.zeros(d_model)
        )
        params[f"b_{ours}"] = bias.reshape(d_model)  # (H, Dh) or (D,) -> (D,)
    return {name: params[name] for name in MHA_PARAM_NAMES}
