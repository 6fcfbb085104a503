"""attention_course.params: one home, one error style for y = x @ W + b parameters in every framework."""

import re

import numpy as np
import pytest
import torch
from torch import nn

from attention_course import (
    EinsumMultiHeadAttention,
    MultiHeadAttention,
    numpy_ref,
    params,
)
from attention_course.fused import FusedSelfAttention
from attention_course.kv_cache import CausalSelfAttention

D = 8


def keras_module(d_model, num_heads, bias=True):
    from attention_course.keras_attention import KerasMultiHeadAttention

    return KerasMultiHeadAttention(d_model, num_heads, use_bias=bias)


# Every module that loads a y = x @ W + b dict, built as (d_model, num_heads, bias) -> module
LOADERS = {
    "multi_head": lambda d, h, bias=True: MultiHeadAttention(d, h, bias=bias),
    "einsum": lambda d, h, bias=True: EinsumMultiHeadAttention(d, h, bias=bias),
    "fused": lambda d, h, bias=True: FusedSelfAttention(d, h, bias=bias),
    "kv_cache_fused": lambda d, h, bias=True: CausalSelfAttention(d, h, bias=bias),
    "kv_cache_separate": lambda d, h, bias=True: CausalSelfAttention(d, h, fused_qkv=False, bias=bias),
    "keras": keras_module,
}


def raises(exception, message):
    return pytest.raises(exception, match=re.escape(message))


def test_expected_shapes_with_different_input_widths():
    shapes = params.expected_shapes(8, kdim=6, vdim=4)
    assert tuple(shapes) == numpy_ref.MHA_PARAM_NAMES
    assert shapes["w_q"] == (8, 8) and shapes["w_k"] == (6, 8) and shapes["w_v"] == (4, 8)
    assert shapes["w_o"] == (8, 8) and all(shapes[f"b_{n}"] == (8,) for n in "qkvo")
    assert params.expected_shapes(8) == {n: s for n, s in params.expected_shapes(8, 8, 8).items()}


def test_check_params_accepts_arrays_and_tensors():
    p = numpy_ref.init_mha_params(D, kdim=6, vdim=4)
    params.check_params(p, D, 6, 4)
    params.check_params({n: torch.from_numpy(a) for n, a in p.items()}, D, 6, 4)


def test_check_params_errors():
    p = numpy_ref.init_mha_params(D)
    with raises(TypeError, "params must be a dict of arrays, got list"):
        params.check_params(list(p.values()), D)
    with raises(TypeError, "params['w_q'] must be a NumPy array or tensor of numbers, got list"):
        params.check_params(p | {"w_q": p["w_q"].tolist()}, D)
    with raises(TypeError, "params['b_k'] must be a NumPy array or tensor of numbers, got torch.bool"):
        params.check_params(p | {"b_k": torch.ones(D, dtype=torch.bool)}, D)
    with raises(ValueError, "params is missing 'w_v'"):
        params.check_params({n: a for n, a in p.items() if n != "w_v"}, D)
    with raises(ValueError, "params['w_q'] has shape (8, 8), expected (4, 4)"):
        params.check_params(p, 4)
    with raises(ValueError, "the module has bias=False, but params['b_q'] is not zero"):
        params.check_params(p, D, bias=False)
    params.check_params({n: (a * 0 if n.startswith("b_") else a) for n, a in p.items()}, D, bias=False)


def test_sizes_of():
    assert params.sizes_of(numpy_ref.init_mha_params(8, kdim=6, vdim=4)) == (8, 6, 4)
    with raises(TypeError, "params must be a dict of arrays, got tuple"):
        params.sizes_of(())
    with raises(ValueError, "params is missing 'w_k'"):
        params.sizes_of({"w_q": np.zeros((8, 8))})
    with raises(ValueError, "params['w_q'] must be a 2-D (d_in, d_out) array"):
        params.sizes_of({"w_q": np.zeros(8), "w_k": np.zeros((8, 8)), "w_v": np.zeros((8, 8))})


@pytest.mark.parametrize("name", LOADERS)
def test_every_module_raises_the_same_errors(name):
    make = LOADERS[name]
    p = numpy_ref.init_mha_params(D)
    with raises(ValueError, "params is missing 'b_o'"):
        make(D, 2).load_numpy_params({n: a for n, a in p.items() if n != "b_o"})
    with raises(ValueError, "params['w_k'] has shape (6, 8), expected (8, 8)"):
        make(D, 2).load_numpy_params(numpy_ref.init_mha_params(D, kdim=6))
    with raises(ValueError, "the module has bias=False, but params['b_q'] is not zero"):
        make(D, 2, bias=False).load_numpy_params(p)
    with raises(TypeError, "params must be a dict of arrays, got list"):
        make(D, 2).load_numpy_params(list(p.values()))


@pytest.mark.parametrize("name", LOADERS)
@pytest.mark.parametrize("bias", [True, False])
def test_every_module_round_trips_a_dict(name, bias):
    p = numpy_ref.init_mha_params(D, seed=3)
    if not bias:
        p = {n: (a * 0 if n.startswith("b_") else a) for n, a in p.items()}
    module = LOADERS[name](D, 2, bias=bias)
    if name != "keras":
        module = module.double()
    module.load_numpy_params(p)
    back = module.numpy_params()
    assert list(back) == list(numpy_ref.MHA_PARAM_NAMES)
    for n in numpy_ref.MHA_PARAM_NAMES:
        assert back[n].dtype == np.float64
        np.testing.assert_allclose(back[n], p[n], rtol=0, atol=1e-6 if name == "keras" else 0)


def test_load_linear_computes_x_at_w_plus_b():
    rng = np.random.default_rng(0)
    w, b, x = rng.normal(size=(6, 4)), rng.normal(size=4), rng.normal(size=(3, 6))  # d_in 6 != d_out 4
    linear = nn.Linear(6, 4).double()
    params.load_linear(linear, torch.from_numpy(w), torch.from_numpy(b))
    with torch.no_grad():
        np.testing.assert_allclose(linear(torch.from_numpy(x)).numpy(), x @ w + b, rtol=0, atol=1e-12)


def test_as_tensors_follows_dtype_and_device():
    like = torch.zeros(1, dtype=torch.float32)
    tensors = params.as_tensors(numpy_ref.init_mha_params(D), like=like)
    assert all(t.dtype == torch.float32 and t.device == like.device for t in tensors.values())


def test_fused_qkv_params_split_the_stacked_columns():
    qkv, w_o = nn.Linear(D, 3 * D).double(), nn.Linear(D, D).double()
    p = numpy_ref.init_mha_params(D, seed=1)
    tensors = params.as_tensors(p, like=qkv.weight)
    params.load_fused_qkv(qkv, tensors)
    params.load_linear(w_o, tensors["w_o"], tensors["b_o"])
    x = np.random.default_rng(1).normal(size=(2, 5, D))
    with torch.no_grad():
        q, k, v = qkv(torch.from_numpy(x)).numpy().reshape(2, 5, 3, D).transpose(2, 0, 1, 3)
    np.testing.assert_allclose(q, x @ p["w_q"] + p["b_q"], atol=1e-12)
    np.testing.assert_allclose(k, x @ p["w_k"] + p["b_k"], atol=1e-12)
    np.testing.assert_allclose(v, x @ p["w_v"] + p["b_v"], atol=1e-12)
    back = params.fused_qkv_params(qkv, w_o)
    assert all(np.array_equal(back[n], p[n]) for n in numpy_ref.MHA_PARAM_NAMES)


@pytest.mark.parametrize("kdim, vdim", [(None, None), (6, 4)])  # packed in_proj_weight, then separate weights
@pytest.mark.parametrize("bias", [True, False])
def test_torch_mha_round_trip(kdim, vdim, bias):
    torch.manual_seed(0)
    theirs = nn.MultiheadAttention(D, 2, bias=bias, kdim=kdim, vdim=vdim, batch_first=True).eval()
    ours = MultiHeadAttention(D, 2, bias=bias, kdim=kdim, vdim=vdim)
    params.load_torch_mha(ours.projections(), theirs)
    for linear, (weight, b) in zip(ours.projections().values(), params.torch_mha_projections(theirs), strict=True):
        assert torch.equal(linear.weight, weight) and (b is None or torch.equal(linear.bias, b))
    fresh = nn.MultiheadAttention(D, 2, bias=bias, kdim=kdim, vdim=vdim, batch_first=True)
    params.store_torch_mha(ours.projections(), fresh)
    q, k, v = torch.randn(2, 3, D), torch.randn(2, 5, kdim or D), torch.randn(2, 5, vdim or D)
    torch.testing.assert_close(fresh(q, k, v)[0], theirs(q, k, v)[0], rtol=0, atol=0)


def test_torch_mha_errors():
    with raises(TypeError, "expected a torch.nn.MultiheadAttention, got Linear"):
        params.load_torch_mha({}, nn.Linear(2, 2))
    with raises(ValueError, "add_bias_kv=True or add_zero_attn=True is not supported"):
        params.load_torch_mha({}, nn.MultiheadAttention(D, 2, add_zero_attn=True))


def test_keras_mha_params_rejects_other_layers():
    with raises(TypeError, "expected a keras.layers.MultiHeadAttention, got Linear"):
        params.keras_mha_params(nn.Linear(2, 2))
