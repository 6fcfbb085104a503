"""Multi-head attention as a Keras 3 layer (TensorFlow backend), with the
course's conventions.

Shape notation: query (B, Tq, D), key (B, Tk, kdim), value (B, Tk, vdim);
per-head tensors (B, H, T, Dh); attention weights (B, H, Tq, Tk). D = d_model,
H = num_heads, Dh = D // H.

Two things differ from ``keras.layers.MultiHeadAttention``:

* argument order: ``call(query, key, value)`` here, ``call(query, value, key)``
  in Keras;
* shapes: Keras' layer is configured by ``key_dim`` (= Dh) and projects to H *
  key_dim, which need not equal D; this layer always uses Dh = D // H, like the
  PyTorch modules of the course.

The mask convention is the same as Keras' ``attention_mask``: boolean, True =
may attend (the opposite of ``torch.nn.MultiheadAttention``'s ``attn_mask``). A
fully masked query row gets all-zero weights here, so its output is the output
bias ``b_o``. Keras' own layer zeroes such a row only on its explicit path
(``return_attention_scores=True`` or dropout > 0); its fused path gives the row
uniform weights instead.
"""

from __future__ import annotations

import math

import keras
import numpy as np
from keras import ops

from .params import check_params, keras_mha_params
from .validation import check_dropout, check_heads

# finite "minus infinity": a fully masked row stays NaN-free through softmax
_LARGE_NEGATIVE = -1e9


@keras.saving.register_keras_serializable(package="attention_course")
class KerasMultiHeadAttention(keras.layers.Layer):
    """Multi-head attention ``softmax(Q K^T / sqrt(Dh)) V`` over H heads, then
    an output projection.

    The projections ``w_q``, ``w_k``, ``w_v``, ``w_o`` are plain
    ``keras.layers.Dense`` layers. We chose Dense over ``EinsumDense`` (what
    Keras' own layer uses) because a Dense kernel is exactly the course's ``y =
    x @ W + b`` matrix, W of shape (d_in, d_out): ``numpy_params()`` reads it
    as is, and splitting its D output columns into H groups of Dh *is*
    splitting the heads. Keras' per-head kernels (d_in, H, Dh) are the same
    numbers, reshaped (see :meth:`from_keras`).

    Args:
        d_model: D, the width of the queries and of the output.
        num_heads: H; must divide d_model.
        dropout: probability of dropping an attention weight, applied only when
            ``training=True``.
        use_bias: whether the four projections have biases.
        kdim, vdim: feature sizes of key and value inputs (default d_model).
        **kwargs: passed to ``keras.layers.Layer`` (e.g. ``name``,
            ``dtype="float64"``).

    All input sizes are known from the constructor, so the weights exist right
    after construction.
    """

    def __init__(
        self,
        d_model,
        num_heads,
        dropout=0.0,
        use_bias=True,
        kdim=None,
        vdim=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        check_heads(d_model, num_heads)
        check_dropout(dropout)
        self.d_model, self.num_heads, self.head_dim = (
            d_model,
            num_heads,
            d_model // num_heads,
        )
        self.dropout, self.use_bias = dropout, use_bias
        self.kdim = d_model if kdim is None else kdim
        self.vdim = d_model if vdim is None else vdim
        dense = dict(use_bias=use_bias, dtype=self.dtype_policy)
        self.w_q = keras.layers.Dense(d_model, name="w_q", **dense)  # D -> D
        # kdim -> D
        self.w_k = keras.layers.Dense(d_model, name="w_k", **dense)
        # vdim -> D
        self.w_v = keras.layers.Dense(d_model, name="w_v", **dense)
        self.w_o = keras.layers.Dense(d_model, name="w_o", **dense)  # D -> D
        self.attn_dropout = keras.layers.Dropout(
            dropout, dtype=self.dtype_policy
        )
        self.build()

    def build(self, input_shape=None):
        """Create the four projections' weights; input sizes come from the
        constructor, not ``input_shape``."""
        input_sizes = (self.d_model, self.kdim, self.vdim, self.d_model)
        for layer, d_in in zip(
            (self.w_q, self.w_k, self.w_v, self.w_o), input_sizes, strict=True
        ):
            layer.build((None, d_in))

    def compute_mask(self, query, previous_mask=None):
        """No Keras mask on the output: Keras would otherwise pass our
        attention ``mask`` downstream."""
        return None

    def call(
        self,
        query,
        key=None,
        value=None,
        mask=None,
        training=None,
        return_weights=False,
    ):
        """Attend from ``query`` to ``key``/``value``.

        Args:
            query: (B, Tq, D).
            key: (B, Tk, kdim); defaults to ``query`` (self-attention).
            value: (B, Tk, vdim); defaults to ``key``.
            mask: optional boolean, True = may attend. A 3-D mask is read as
                Keras' (B, Tq, Tk); any other rank must broadcast to (B, H, Tq,
                Tk), e.g. (Tq, Tk) or a padding mask (B, 1, 1, Tk).
            training: dropout on the attention weights only when True.
            return_weights: also return the attention weights that were
                applied, i.e. after dropout when training (as the PyTorch
                modules do; Keras' layer returns them before dropout).

        Returns:
            out (B, Tq, D), or (out, weights (B, H, Tq, Tk)) if
            ``return_weights``. A fully masked query row has all-zero weights
            and output ``b_o`` (zero without biases), never NaN.

        In self-attention Keras fills an unset ``mask`` with the Keras mask of
        ``query`` (e.g. from ``Embedding(mask_zero=True)``), a (B, T) padding
        mask that does not fit our layout: pass ``mask`` explicitly.
        """
        key = query if key is None else key
        value = key if value is None else value
        self._check_inputs(query, key, value)
        q = self._split_heads(self.w_q(query))  # (B, H, Tq, Dh)
        k = self._split_heads(self.w_k(key))  # (B, H, Tk, Dh)
        v = self._split_heads(self.w_v(value))  # (B, H, Tk, Dh)
        # (B, H, Tq, Tk)
        scores = ops.matmul(q, ops.swapaxes(k, -1, -2)) / math.sqrt(
            self.head_dim
        )
        # (B, H, Tq, Tk)
        weights = self.attn_dropout(
            self._masked_softmax(scores, mask), training=training
        )
        heads = ops.matmul(weights, v)  # (B, H, Tq, Dh)
        out = self.w_o(self._merge_heads(heads))  # (B, Tq, D)
        return (out, weights) if return_weights else out

    def _split_heads(self, x):
        """(B, T, D) -> (B, H, T, Dh)."""
        # (B, T, H, Dh)
        x = ops.reshape(x, ops.shape(x)[:2] + (self.num_heads, self.head_dim))
        return ops.transpose(x, (0, 2, 1, 3))

    def _merge_heads(self, x):
        """(B, H, T, Dh) -> (B, T, D)."""
        x = ops.transpose(x, (0, 2, 1, 3))  # (B, T, H, Dh)
        return ops.reshape(x, ops.shape(x)[:2] + (self.d_model,))

    def _masked_softmax(self, scores, mask):
        """Softmax of scores (B, H, Tq, Tk) over the keys; masked positions (so
        fully masked rows) get weight 0."""
        if mask is None:
            return ops.softmax(scores, axis=-1)
        mask = _prepare_mask(mask, tuple(scores.shape))
        weights = ops.softmax(
            ops.where(mask, scores, _LARGE_NEGATIVE), axis=-1
        )
        # a fully masked row would otherwise be uniform
        return ops.where(mask, weights, 0.0)

    def _check_inputs(self, query, key, value):
        sizes = {
            "query": ("d_model", self.d_model),
            "key": ("kdim", self.kdim),
            "value": ("vdim", self.vdim),
        }
        for (name, (size_name, size)), x in zip(
            sizes.items(), (query, key, value), strict=True
        ):
            if len(x.shape) != 3:
                raise ValueError(
                    f"{name} must be 3-D (B, T, D), got shape {tuple(x.shape)}"
                )
            if x.shape[-1] != size:
                raise ValueError(
                    f"{name} feature size {x.shape[-1]} != {size_name}={size}"
                )
        if not _same_size(key.shape[1], value.shape[1]):
            raise ValueError(
                f"key length Tk={key.shape[1]} != value length "
                f"{value.shape[1]}"
            )
        if not (
            _same_size(query.shape[0], key.shape[0])
            and _same_size(key.shape[0], value.shape[0])
        ):
            raise ValueError(
                f"batch sizes differ: query {query.shape[0]}, key "
                f"{key.shape[0]}, value {value.shape[0]}"
            )

    @classmethod
    def from_keras(cls, layer):
        """A ``KerasMultiHeadAttention`` with the weights of a built
        ``keras.layers.MultiHeadAttention``.

        Keras keeps per-head kernels: query/key/value (d_in, H, Dh) with biases
        (H, Dh), output (H, Dh, D) with bias (D,). Reshaping them to (d_in, H *
        Dh), (H * Dh,) and (H * Dh, D) gives our Dense matrices, because the
        columns of our (d_in, D) kernel are ordered head by head. Requires
        key_dim * num_heads == query feature size == output size, and value_dim
        == key_dim.
        """
        params = keras_mha_params(layer)
        d_model = params["w_q"].shape[0]
        kdim, vdim = params["w_k"].shape[0], params["w_v"].shape[0]
        ours = cls(
            d_model,
            layer.num_heads,
            layer.dropout,
            layer.use_bias,
            kdim,
            vdim,
            dtype=layer.dtype_policy,
        )
        ours.load_numpy_params(params)
        return ours

    def numpy_params(self):
        """The weights as the numpy_ref dict: w_* (d_in, D), b_* (D,) float64
        (zero biases if ``use_bias=False``)."""
        params = {}
        for name in "qkvo":
            dense = getattr(self, f"w_{name}")
            params[f"w_{name}"] = np.asarray(dense.kernel, dtype=np.float64)
            params[f"b_{name}"] = np.asarray(
                dense.bias if self.use_bias else np.zeros(self.d_model),
                dtype=np.float64,
            )
        return params

    def load_numpy_params(self, params):
        """Copy a numpy_ref dict (w_* (d_in, D), b_* (D,), ``y = x @ W + b``)
        into the Dense layers.

        A Dense kernel is already the (d_in, D) matrix W, so nothing is
        transposed or reshaped.
        """
        check_params(
            params, self.d_model, self.kdim, self.vdim, bias=self.use_bias
        )
        for name in "qkvo":
            dense = getattr(self, f"w_{name}")
            dense.kernel.assign(
                np.asarray(params[f"w_{name}"]).astype(dense.kernel.dtype)
            )
            if self.use_bias:
                dense.bias.assign(
                    np.asarray(params[f"b_{name}"]).astype(dense.bias.dtype)
                )

    def get_config(self):
        config = super().get_config()
        names = ("d_model", "num_heads", "dropout", "use_bias", "kdim", "vdim")
        config.update({name: getattr(self, name) for name in names})
        return config


def _same_size(a, b):
    """Equal sizes; an unknown size (None, while Keras traces a symbolic call)
    matches anything."""
    return a is None or b is None or a == b


def _prepare_mask(mask, scores_shape):
    """Check a boolean mask and shape it to broadcast against scores (B, H, Tq,
    Tk)."""
    mask = ops.convert_to_tensor(mask)
    dtype = keras.backend.standardize_dtype(mask.dtype)
    if dtype != "bool":
        raise TypeError(
            f"mask must be boolean (True = may attend), got {dtype}"
        )
    shape = tuple(mask.shape)
    # Keras' attention_mask layout (B, Tq, Tk): add the head axis
    if len(shape) == 3:
        mask = ops.expand_dims(mask, 1)
    padded = (1,) * (4 - len(mask.shape)) + tuple(mask.shape)
    if len(mask.shape) > 4 or not all(
        m == 1 or _same_size(m, s)
        for m, s in zip(padded, scores_shape, strict=True)
    ):
        raise ValueError(
            f"mask of shape {shape} does not broadcast to attention scores "
            f"{scores_shape}"
        )
    return mask
