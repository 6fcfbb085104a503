"""One set of weights, five implementations: NumPy (float64), PyTorch (step by step, fused SDPA, einsum), Keras."""

import os

os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
os.environ["TF_ENABLE_ONEDNN_OPTS"] = "0"

import keras
import numpy as np
import pytest
import torch

from attention_course import (
    EinsumMultiHeadAttention,
    MultiHeadAttention,
    multi_head_attention_loop,
    numpy_ref,
)
from attention_course.keras_attention import KerasMultiHeadAttention

B, T_Q, T_K, D, KDIM, VDIM = 2, 3, 5, 8, 6, 5
ATOL = 1e-5  # float32 implementations vs the float64 reference
PARAMS = numpy_ref.init_mha_params(D, kdim=KDIM, vdim=VDIM, seed=7)  # the one set of weights, kdim, vdim != D


@pytest.fixture(autouse=True)
def _seed():
    keras.utils.set_random_seed(0)  # seeds Python, NumPy and the backend
    torch.manual_seed(0)


def _data(seed=0):
    """float64 query (B, Tq, D), key (B, Tk, kdim), value (B, Tk, vdim) and a (B, 1, Tq, Tk) mask."""
    rng = np.random.default_rng(seed)
    query, key, value = (rng.normal(size=(B, t, d)) for t, d in ((T_Q, D), (T_K, KDIM), (T_K, VDIM)))
    mask = numpy_ref.causal_mask(T_Q, T_K) & numpy_ref.padding_mask([T_K, 2], T_K)  # (B, 1, Tq, Tk)
    return query, key, value, mask


def _torch(*arrays):
    return [torch.tensor(x, dtype=torch.float32) for x in arrays]


def _run_torch_module(module, query, key, value, mask):
    """Load PARAMS, run in eval mode; (out, weights) as float32 arrays (weights None on the fused path)."""
    module.load_numpy_params(PARAMS)
    want_weights = getattr(module, "backend", "eager") == "eager"  # asking for weights would bypass the fused kernel
    with torch.no_grad():
        result = module.eval()(*_torch(query, key, value), mask=torch.from_numpy(mask), return_weights=want_weights)
    return (result[0].numpy(), result[1].numpy()) if want_weights else (result.numpy(), None)


def _run_loop(num_heads, query, key, value, mask):
    out, weights = multi_head_attention_loop(*_torch(query, key, value), PARAMS, num_heads, torch.from_numpy(mask))
    return out.numpy(), weights.numpy()


def _run_keras(num_heads, query, key, value, mask):
    layer = KerasMultiHeadAttention(D, num_heads, kdim=KDIM, vdim=VDIM)
    layer.load_numpy_params(PARAMS)
    out, weights = layer(*(x.astype("float32") for x in (query, key, value)), mask=mask, return_weights=True)
    return np.asarray(out), np.asarray(weights)


IMPLEMENTATIONS = {  # name -> run(num_heads, query, key, value, mask) -> (out, weights or None)
    "torch": lambda h, *data: _run_torch_module(MultiHeadAttention(D, h, kdim=KDIM, vdim=VDIM), *data),
    "torch_sdpa": lambda h, *data: _run_torch_module(
        MultiHeadAttention(D, h, kdim=KDIM, vdim=VDIM, backend="sdpa"), *data
    ),
    "torch_einsum": lambda h, *data: _run_torch_module(EinsumMultiHeadAttention(D, h, kdim=KDIM, vdim=VDIM), *data),
    "torch_loop": _run_loop,
    "keras": _run_keras,
}


@pytest.mark.parametrize("name", IMPLEMENTATIONS)
@pytest.mark.parametrize("num_heads", [1, 2, 4])
def test_same_weights_same_outputs(name, num_heads):
    query, key, value, mask = _data()
    mask[1, 0, 0] = False  # query 0 of sequence 1 may attend nothing
    expected_out, expected_weights = numpy_ref.multi_head_attention(query, key, value, PARAMS, num_heads, mask)
    assert np.array_equal(expected_out[1, 0], PARAMS["b_o"])  # the fully masked row: zero heads, output = b_o
    out, weights = IMPLEMENTATIONS[name](num_heads, query, key, value, mask)
    assert out.shape == (B, T_Q, D) and np.all(np.isfinite(out))
    assert np.abs(out - expected_out).max() < ATOL
    if weights is not None:  # the fused path never forms the weights
        assert weights.shape == (B, num_heads, T_Q, T_K)
        assert np.abs(weights - expected_weights).max() < ATOL


@pytest.mark.parametrize(
    "module",
    [
        MultiHeadAttention(D, 2, kdim=KDIM, vdim=VDIM),
        EinsumMultiHeadAttention(D, 2, kdim=KDIM, vdim=VDIM),
        KerasMultiHeadAttention(D, 2, kdim=KDIM, vdim=VDIM),
    ],
    ids=type,
)
def test_numpy_params_round_trip(module):
    module.load_numpy_params(PARAMS)
    exported = module.numpy_params()
    assert exported.keys() == PARAMS.keys()
    for name, p in PARAMS.items():
        assert exported[name].dtype == np.float64 and exported[name].shape == p.shape
        assert np.abs(exported[name] - p).max() < 1e-6  # float32 storage


def test_keras_layer_to_torch_module():
    """keras.layers.MultiHeadAttention -> from_keras -> numpy_params -> our torch module: same function."""
    theirs = keras.layers.MultiHeadAttention(2, key_dim=D // 2)
    theirs.build((B, T_Q, D), (B, T_K, VDIM), (B, T_K, KDIM))
    rng = np.random.default_rng(3)
    for w in theirs.weights:  # random biases too: Keras initialises them to zero
        w.assign(rng.normal(0.0, 0.5, size=w.shape).astype("float32"))
    query, key, value, mask = _data(seed=1)
    keras_mask = np.broadcast_to(mask, (B, 1, T_Q, T_K))[:, 0]  # Keras' (B, Tq, Tk); no fully masked row here
    q, k, v = (x.astype("float32") for x in (query, key, value))
    expected = np.asarray(theirs(q, v, key=k, attention_mask=keras_mask))  # Keras' order: (query, value, key)
    torch_module = MultiHeadAttention(D, 2, kdim=KDIM, vdim=VDIM)
    torch_module.load_numpy_params(KerasMultiHeadAttention.from_keras(theirs).numpy_params())
    with torch.no_grad():
        out = torch_module(*_torch(query, key, value), mask=torch.from_numpy(mask))
    assert np.abs(out.numpy() - expected).max() < ATOL


def test_torch_nn_multihead_attention_to_keras_layer():
    """nn.MultiheadAttention -> from_torch -> numpy_params -> KerasMultiHeadAttention: same function.

    nn.MultiheadAttention's attn_mask means True = NOT allowed, so it gets ~mask (and NaN on fully masked rows,
    which this test avoids).
    """
    theirs = torch.nn.MultiheadAttention(D, 2, kdim=KDIM, vdim=VDIM, batch_first=True).eval()
    with torch.no_grad():
        for p in theirs.parameters():
            p.normal_(0.0, 0.5)
    query, key, value, mask = _data(seed=2)
    with torch.no_grad():
        expected, _ = theirs(*_torch(query, key, value), attn_mask=torch.from_numpy(~numpy_ref.causal_mask(T_Q, T_K)))
    ours = KerasMultiHeadAttention(D, 2, kdim=KDIM, vdim=VDIM)
    ours.load_numpy_params(MultiHeadAttention.from_torch(theirs).numpy_params())
    out = ours(*(x.astype("float32") for x in (query, key, value)), mask=numpy_ref.causal_mask(T_Q, T_K))
    assert np.abs(np.asarray(out) - expected.numpy()).max() < ATOL
