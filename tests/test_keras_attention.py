"""KerasMultiHeadAttention vs keras.layers.MultiHeadAttention and vs the float64 NumPy reference."""

import os

os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
os.environ["TF_ENABLE_ONEDNN_OPTS"] = "0"

import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras import ops

from attention_course import numpy_ref
from attention_course.keras_attention import KerasMultiHeadAttention

B, D = 2, 8


@pytest.fixture(autouse=True)
def _seed():
    keras.utils.set_random_seed(0)


def _np(x):
    return np.asarray(x)  # (ops.convert_to_numpy on a Keras Variable warns under NumPy 2)


def _inputs(t_q, t_k, kdim=D, vdim=D, seed=0, dtype="float32"):
    rng = np.random.default_rng(seed)
    return tuple(rng.normal(size=(B, t, d)).astype(dtype) for t, d in ((t_q, D), (t_k, kdim), (t_k, vdim)))


def _keras_layer(num_heads, kdim=D, vdim=D, use_bias=True, t_q=4, t_k=5, **kwargs):
    """A built keras.layers.MultiHeadAttention with random kernels AND biases (Keras initialises biases to 0)."""
    layer = keras.layers.MultiHeadAttention(num_heads, key_dim=D // num_heads, use_bias=use_bias, **kwargs)
    layer.build((B, t_q, D), (B, t_k, vdim), (B, t_k, kdim))
    rng = np.random.default_rng(1)
    for w in layer.weights:
        w.assign(rng.normal(0.0, 0.5, size=w.shape).astype(w.dtype))
    return layer


def _masks(t_q, t_k):
    """Named boolean masks (B, Tq, Tk) (Keras' layout) without fully masked rows."""
    causal = np.broadcast_to(numpy_ref.causal_mask(t_q, t_k), (B, t_q, t_k))
    padding = np.broadcast_to(numpy_ref.padding_mask([t_k, 2], t_k)[:, 0], (B, t_q, t_k))
    return {"none": None, "causal": causal, "padding": padding, "both": causal & padding}


CASES = [  # (t_q, t_k, kdim, vdim)
    (4, 4, D, D),  # self-attention shapes
    (3, 5, D, D),  # cross-attention Tq != Tk
    (3, 5, 6, 5),  # key/value feature sizes != d_model
]


@pytest.mark.parametrize("mask_name", ["none", "causal", "padding", "both"])
@pytest.mark.parametrize("t_q,t_k,kdim,vdim", CASES)
@pytest.mark.parametrize("num_heads", [1, 2, 4])
@pytest.mark.parametrize("use_bias", [True, False])
def test_matches_keras_multi_head_attention(num_heads, t_q, t_k, kdim, vdim, mask_name, use_bias):
    theirs = _keras_layer(num_heads, kdim, vdim, use_bias, t_q, t_k)
    ours = KerasMultiHeadAttention.from_keras(theirs)
    q, k, v = _inputs(t_q, t_k, kdim, vdim)
    mask = _masks(t_q, t_k)[mask_name]
    expected = theirs(q, v, key=k, attention_mask=mask)  # Keras' order: (query, value, key)
    expected_2, scores = theirs(q, v, key=k, attention_mask=mask, return_attention_scores=True)
    out, weights = ours(q, k, v, mask=mask, return_weights=True)  # our order: (query, key, value)
    assert out.shape == (B, t_q, D) and weights.shape == (B, num_heads, t_q, t_k)
    assert np.abs(_np(out) - _np(expected)).max() < 1e-5
    assert np.abs(_np(out) - _np(expected_2)).max() < 1e-5
    assert np.abs(_np(weights) - _np(scores)).max() < 1e-5


def test_masks_in_our_layouts_match_keras_3d_mask():
    """(Tq, Tk), (B, 1, 1, Tk) and (B, 1, Tq, Tk) masks mean the same as Keras' (B, Tq, Tk)."""
    theirs = _keras_layer(2, t_q=3, t_k=5)
    ours = KerasMultiHeadAttention.from_keras(theirs)
    q, k, v = _inputs(3, 5)
    causal, padding = numpy_ref.causal_mask(3, 5), numpy_ref.padding_mask([5, 2], 5)
    for ours_mask in (causal, padding, causal & padding):
        keras_mask = np.broadcast_to(ours_mask, (B, 1, 3, 5))[:, 0]
        expected = theirs(q, v, key=k, attention_mask=keras_mask)
        assert np.abs(_np(ours(q, k, v, mask=ours_mask)) - _np(expected)).max() < 1e-5


def test_self_attention_defaults_and_keras_causal_flag():
    theirs = _keras_layer(2, t_q=4, t_k=4)
    ours = KerasMultiHeadAttention.from_keras(theirs)
    x, _, _ = _inputs(4, 4)
    assert np.abs(_np(ours(x)) - _np(theirs(x, x))).max() < 1e-5
    causal = numpy_ref.causal_mask(4)
    assert np.abs(_np(ours(x, mask=causal)) - _np(theirs(x, x, use_causal_mask=True))).max() < 1e-5
    # value defaults to key
    assert np.abs(_np(ours(x, x)) - _np(ours(x, x, x))).max() == 0.0


def test_keras_use_causal_mask_is_top_left_aligned():
    """Keras' use_causal_mask lets query i see keys j <= i even when Tq < Tk; ours is bottom-right aligned."""
    theirs = _keras_layer(2, t_q=2, t_k=4)
    q, k, v = _inputs(2, 4)
    _, scores = theirs(q, v, key=k, use_causal_mask=True, return_attention_scores=True)
    assert np.array_equal(_np(scores)[0, 0] > 0, np.tril(np.ones((2, 4), bool)))
    assert np.array_equal(numpy_ref.causal_mask(2, 4), np.tril(np.ones((2, 4), bool), k=2))


def test_float64_matches_numpy_reference():
    params = numpy_ref.init_mha_params(D, kdim=6, vdim=5, seed=3)
    ours = KerasMultiHeadAttention(D, 2, kdim=6, vdim=5, dtype="float64")
    ours.load_numpy_params(params)
    q, k, v = _inputs(3, 5, 6, 5, dtype="float64")
    mask = numpy_ref.causal_mask(3, 5) & numpy_ref.padding_mask([5, 2], 5)  # (B, 1, 3, 5)
    mask[1, 0, 0] = False  # a fully masked query row
    expected, expected_weights = numpy_ref.multi_head_attention(q, k, v, params, 2, mask)
    out, weights = ours(q, k, v, mask=mask, return_weights=True)
    assert out.dtype == "float64"
    assert np.abs(_np(out) - expected).max() < 1e-10
    assert np.abs(_np(weights) - expected_weights).max() < 1e-10


@pytest.mark.parametrize("use_bias", [True, False])
def test_numpy_params_round_trip(use_bias):
    theirs = _keras_layer(4, kdim=6, vdim=5, use_bias=use_bias)
    ours = KerasMultiHeadAttention.from_keras(theirs)
    params = ours.numpy_params()
    assert {name: p.shape for name, p in params.items()} == {
        "w_q": (D, D), "b_q": (D,), "w_k": (6, D), "b_k": (D,), "w_v": (5, D), "b_v": (D,), "w_o": (D, D), "b_o": (D,)
    }
    assert all(p.dtype == np.float64 for p in params.values())
    assert any(params["b_o"]) == use_bias
    q, k, v = _inputs(4, 5, 6, 5)
    expected, _ = numpy_ref.multi_head_attention(q, k, v, params, 4)
    assert np.abs(_np(theirs(q, v, key=k)) - expected).max() < 1e-5
    copy = KerasMultiHeadAttention(D, 4, use_bias=use_bias, kdim=6, vdim=5)
    copy.load_numpy_params(params)
    assert all(np.array_equal(copy.numpy_params()[name], p) for name, p in params.items())


def test_fully_masked_row_gives_zero_weights_and_bias_output():
    ours = KerasMultiHeadAttention(D, 2)
    ours.load_numpy_params(numpy_ref.init_mha_params(D))
    x, _, _ = _inputs(3, 3)
    mask = np.ones((B, 3, 3), bool)
    mask[0, 1] = False  # query 1 of sequence 0 may attend nothing
    out, weights = ours(x, mask=mask, return_weights=True)
    assert np.all(np.isfinite(_np(out))) and np.all(np.isfinite(_np(weights)))
    assert np.all(_np(weights)[0, :, 1] == 0.0)
    assert np.allclose(_np(out)[0, 1], _np(ours.w_o.bias))  # zero heads -> output projection of 0 = b_o
    no_bias = KerasMultiHeadAttention(D, 2, use_bias=False)
    assert np.all(_np(no_bias(x, mask=mask))[0, 1] == 0.0)


def test_fully_masked_row_has_finite_gradients():
    ours = KerasMultiHeadAttention(D, 2)
    x = tf.constant(_inputs(3, 3)[0])
    mask = np.zeros((3, 3), bool)  # every row fully masked
    with tf.GradientTape() as tape:
        loss = ops.sum(ours(x, mask=mask) ** 2)
    grads = tape.gradient(loss, ours.trainable_weights)
    assert all(np.all(np.isfinite(_np(g))) for g in grads if g is not None)


def test_keras_fully_masked_row_behaviour():
    """Keras 3.15: fused path -> uniform weights (output != b_o); explicit path -> zero weights; ops.softmax -> NaN."""
    theirs = _keras_layer(2, t_q=3, t_k=3)
    x, _, _ = _inputs(3, 3)
    mask = np.ones((B, 3, 3), bool)
    mask[0, 1] = False
    b_o = _np(theirs.output_dense.bias)
    fused = _np(theirs(x, x, attention_mask=mask))
    explicit, scores = theirs(x, x, attention_mask=mask, return_attention_scores=True)
    assert not np.allclose(fused[0, 1], b_o)  # uniform weights over all keys: mean of the values, projected
    assert np.all(_np(scores)[0, :, 1] == 0.0) and np.allclose(_np(explicit)[0, 1], b_o)
    assert np.all(np.isnan(_np(ops.softmax(np.full((3,), -np.inf, "float32")))))
    ours = KerasMultiHeadAttention.from_keras(theirs)
    assert np.abs(_np(ours(x, mask=mask)) - _np(explicit)).max() < 1e-5


def test_dropout_only_when_training():
    x, _, _ = _inputs(4, 4)
    ours = KerasMultiHeadAttention(D, 2, dropout=0.5)
    reference = KerasMultiHeadAttention(D, 2)
    reference.load_numpy_params(ours.numpy_params())
    expected, expected_weights = reference(x, return_weights=True)
    for training in (None, False):
        assert np.abs(_np(ours(x, training=training)) - _np(expected)).max() < 1e-6
    out, weights = ours(x, training=True, return_weights=True)
    assert np.abs(_np(out) - _np(expected)).max() > 1e-3
    # the returned weights are those applied: zeros where dropped, survivors scaled by 1 / (1 - p)
    dropped = _np(weights) == 0.0
    assert dropped.any() and not dropped.all()
    assert np.allclose(_np(weights)[~dropped], 2.0 * _np(expected_weights)[~dropped], atol=1e-6)
    heads = ops.matmul(weights, ours._split_heads(ours.w_v(x)))  # recompute the output from those weights
    assert np.abs(_np(ours.w_o(ours._merge_heads(heads))) - _np(out)).max() < 1e-5


def test_dropout_matches_keras_in_inference_and_is_copied():
    theirs = _keras_layer(2, t_q=4, t_k=4, dropout=0.25)
    ours = KerasMultiHeadAttention.from_keras(theirs)
    assert ours.dropout == 0.25
    x, _, _ = _inputs(4, 4)
    assert np.abs(_np(ours(x)) - _np(theirs(x, x))).max() < 1e-5


@pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning")  # inside Keras' saving code
def test_functional_model_and_serialization(tmp_path):
    query = keras.Input((None, D))
    key = keras.Input((None, 6))
    mask = keras.Input((None, None), dtype="bool")
    layer = KerasMultiHeadAttention(D, 2, kdim=6, vdim=6)
    model = keras.Model([query, key, mask], layer(query, key, mask=mask))
    q, k, _ = _inputs(3, 5, 6, 6)
    m = np.broadcast_to(numpy_ref.causal_mask(3, 5), (B, 3, 5))
    assert np.abs(_np(model([q, k, m])) - _np(layer(q, k, mask=m))).max() < 1e-6
    path = str(tmp_path / "model.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert np.abs(_np(loaded([q, k, m])) - _np(model([q, k, m]))).max() < 1e-6
    assert KerasMultiHeadAttention.from_config(layer.get_config()).get_config()["kdim"] == 6


def test_attention_mask_is_not_passed_downstream_as_keras_mask():
    ours = KerasMultiHeadAttention(D, 2)
    x, _, _ = _inputs(3, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # Keras warns when a layer "destroys" a mask it does not support
        out = ours(x, mask=numpy_ref.causal_mask(3))
    assert getattr(out, "_keras_mask", None) is None


def test_keras_fills_mask_from_an_upstream_padding_mask():
    """Keras passes Embedding(mask_zero=True)'s (B, T) mask as ``mask`` in self-attention: it does not fit."""
    embedded = keras.layers.Embedding(10, D, mask_zero=True)(np.array([[1, 2, 0], [3, 0, 0]]))
    ours = KerasMultiHeadAttention(D, 2)
    with pytest.raises(ValueError, match=r"mask of shape \(2, 3\) does not broadcast"):
        ours(embedded)
    padding = numpy_ref.padding_mask([2, 1], 3)  # (B, 1, 1, T): the explicit way
    assert ours(embedded, mask=padding).shape == (B, 3, D)


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        (dict(d_model=10, num_heads=3), ValueError, r"d_model=10 is not divisible by num_heads=3"),
        (dict(d_model=8, num_heads=0), ValueError, r"num_heads must be >= 1, got num_heads=0"),
        (dict(d_model=8, num_heads=2.0), TypeError, r"num_heads must be an int, got float 2.0"),
        (dict(d_model=8, num_heads=2, dropout=1.0), ValueError, r"dropout must be in \[0, 1\), got dropout=1.0"),
    ],
)
def test_constructor_errors(kwargs, error, match):
    with pytest.raises(error, match=match):
        KerasMultiHeadAttention(**kwargs)


def test_call_errors():
    ours = KerasMultiHeadAttention(D, 2, kdim=6)
    q, k, v = _inputs(3, 5, 6, D)
    with pytest.raises(TypeError, match=r"mask must be boolean \(True = may attend\), got float32"):
        ours(q, k, v, mask=np.ones((3, 5), "float32"))
    message = r"mask of shape \(2, 5\) does not broadcast to attention scores \(2, 2, 3, 5\)"  # (B, H, Tq, Tk)
    with pytest.raises(ValueError, match=message):
        ours(q, k, v, mask=np.ones((2, 5), bool))
    with pytest.raises(ValueError, match=r"mask of shape \(1, 1, 1, 3, 5\) does not broadcast"):
        ours(q, k, v, mask=np.ones((1, 1, 1, 3, 5), bool))
    with pytest.raises(ValueError, match=r"query must be 3-D \(B, T, D\), got shape \(3, 8\)"):
        ours(q[0], k, v)
    with pytest.raises(ValueError, match=r"query feature size 6 != d_model=8"):
        ours(k, k, v)
    with pytest.raises(ValueError, match=r"key feature size 8 != kdim=6"):
        ours(q, v, v)
    with pytest.raises(ValueError, match=r"key length Tk=5 != value length 4"):
        ours(q, k, v[:, :4])
    with pytest.raises(ValueError, match=r"batch sizes differ: query 1, key 2, value 2"):
        ours(q[:1], k, v)


def test_from_keras_errors():
    with pytest.raises(TypeError, match=r"expected a keras.layers.MultiHeadAttention, got Dense"):
        KerasMultiHeadAttention.from_keras(keras.layers.Dense(4))
    with pytest.raises(ValueError, match=r"no weights yet"):
        KerasMultiHeadAttention.from_keras(keras.layers.MultiHeadAttention(2, 4))
    wide = keras.layers.MultiHeadAttention(2, key_dim=8)
    wide.build((B, 3, D), (B, 3, D))
    with pytest.raises(ValueError, match=r"key_dim \* num_heads = 8 \* 2 != query feature size 8"):
        KerasMultiHeadAttention.from_keras(wide)
    other_value_dim = keras.layers.MultiHeadAttention(2, key_dim=4, value_dim=3)
    other_value_dim.build((B, 3, D), (B, 3, D))
    with pytest.raises(ValueError, match=r"value_dim=3 != key_dim=4"):
        KerasMultiHeadAttention.from_keras(other_value_dim)
    projected = keras.layers.MultiHeadAttention(2, key_dim=4, output_shape=5)
    projected.build((B, 3, D), (B, 3, D))
    with pytest.raises(ValueError, match=r"output kernel \(2, 4, 5\) does not map back to d_model=8"):
        KerasMultiHeadAttention.from_keras(projected)


@pytest.mark.parametrize("kwargs", [dict(use_gate=True), dict(sliding_window=2), dict(attention_axes=(1, 2))])
def test_from_keras_rejects_variants(kwargs):
    layer = keras.layers.MultiHeadAttention(2, key_dim=4, **kwargs)
    layer.build((B, 3, D), (B, 3, D))
    with pytest.raises(ValueError, match=r"only the default layer is supported"):
        KerasMultiHeadAttention.from_keras(layer)


def test_load_numpy_params_errors():
    params = numpy_ref.init_mha_params(D, kdim=6)
    with pytest.raises(ValueError, match=r"params is missing 'b_o'"):
        KerasMultiHeadAttention(D, 2, kdim=6).load_numpy_params({k: v for k, v in params.items() if k != "b_o"})
    with pytest.raises(ValueError, match=r"params\['w_k'\] has shape \(6, 8\), expected \(8, 8\)"):
        KerasMultiHeadAttention(D, 2).load_numpy_params(params)
    with pytest.raises(ValueError, match=r"the module has bias=False, but params\['b_q'\] is not zero"):
        KerasMultiHeadAttention(D, 2, use_bias=False, kdim=6).load_numpy_params(params)
