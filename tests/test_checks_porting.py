"""The porting check of chapter 6 (nn.MultiheadAttention's weights into keras.layers.MultiHeadAttention): right
conversions pass, each known mistake gets its code, and broken functions get a clear message."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from attention_course import checks  # noqa: E402
from attention_course.checks import porting  # noqa: E402


def keras_weights_from_torch(in_proj_weight, in_proj_bias, out_proj_weight, out_proj_bias, num_heads):
    d_model = out_proj_weight.shape[0]
    head_dim = d_model // num_heads
    weights = []
    for w, b in zip(np.split(in_proj_weight, 3), np.split(in_proj_bias, 3), strict=True):
        weights += [w.T.reshape(d_model, num_heads, head_dim), b.reshape(num_heads, head_dim)]
    return weights + [out_proj_weight.T.reshape(num_heads, head_dim, d_model), out_proj_bias]


def as_torch_tensors(*args):
    """Right, returning torch tensors (float64) instead of NumPy arrays."""
    return [torch.from_numpy(np.array(a, dtype=np.float64)) for a in keras_weights_from_torch(*args)]


def heads_reversed(*args):
    """Right too: the heads in the opposite order, the same order in every kernel and bias."""
    w = keras_weights_from_torch(*args)
    order = np.arange(args[-1])[::-1]
    return [a[:, order] if i in (0, 2, 4) else a[order] if i < 7 else a for i, a in enumerate(w)]


def in_proj_not_transposed(w_in, b_in, w_out, b_out, h):
    w = keras_weights_from_torch(w_in, b_in, w_out, b_out, h)
    d = w_out.shape[0]
    for i, chunk in enumerate(np.split(w_in, 3)):
        w[2 * i] = chunk.reshape(d, h, d // h)  # BUG: PyTorch's (out, in) chunk read as (in, out)
    return w


def out_proj_not_transposed(w_in, b_in, w_out, b_out, h):
    w = keras_weights_from_torch(w_in, b_in, w_out, b_out, h)
    d = w_out.shape[0]
    w[6] = w_out.reshape(h, d // h, d)  # BUG: no .T
    return w


def nothing_transposed(w_in, b_in, w_out, b_out, h):
    w = in_proj_not_transposed(w_in, b_in, w_out, b_out, h)
    w[6] = out_proj_not_transposed(w_in, b_in, w_out, b_out, h)[6]
    return w


def interleaved(w_in, b_in, w_out, b_out, h):
    d = w_out.shape[0]
    dh = d // h
    w = []
    for chunk, bias in zip(np.split(w_in, 3), np.split(b_in, 3), strict=True):
        w += [chunk.T.reshape(d, dh, h).transpose(0, 2, 1), bias.reshape(dh, h).T]  # BUG: head f % H
    return w + [w_out.T.reshape(dh, h, d).transpose(1, 0, 2), b_out]


def interleaved_in_only(w_in, b_in, w_out, b_out, h):
    return interleaved(w_in, b_in, w_out, b_out, h)[:6] + keras_weights_from_torch(w_in, b_in, w_out, b_out, h)[6:]


def interleaved_out_only(w_in, b_in, w_out, b_out, h):
    return keras_weights_from_torch(w_in, b_in, w_out, b_out, h)[:6] + interleaved(w_in, b_in, w_out, b_out, h)[6:]


def key_value_swapped(*args):
    w = keras_weights_from_torch(*args)
    return w[:2] + w[4:6] + w[2:4] + w[6:]  # BUG: rows D:2D taken as the value, 2D:3D as the key


def query_key_swapped(*args):
    w = keras_weights_from_torch(*args)
    return w[2:4] + w[:2] + w[4:]


def kernels_then_biases(*args):
    w = keras_weights_from_torch(*args)
    return w[0::2] + w[1::2]


def flat_query_kernel(w_in, b_in, w_out, b_out, h):
    w = keras_weights_from_torch(w_in, b_in, w_out, b_out, h)
    w[0] = np.split(w_in, 3)[0].T  # (D, D): not reshaped to (D, H, Dh)
    return w


def two_mistakes(w_in, b_in, w_out, b_out, h):
    w = key_value_swapped(w_in, b_in, w_out, b_out, h)
    w[6] = out_proj_not_transposed(w_in, b_in, w_out, b_out, h)[6]
    return w


def output_bias_forgotten(*args):
    w = keras_weights_from_torch(*args)
    w[7] = np.zeros_like(w[7])
    return w


def mutates(w_in, b_in, w_out, b_out, h):
    w_in *= 1.0001
    return keras_weights_from_torch(w_in, b_in, w_out, b_out, h)


def not_implemented(*args):
    raise NotImplementedError("Exercise 5: From nn.MultiheadAttention to Keras")


def raises(*args):
    return np.split(args[0], 5)  # 36 rows do not split into 5


RIGHT = [keras_weights_from_torch, as_torch_tensors, heads_reversed, lambda *a: tuple(keras_weights_from_torch(*a))]
MISTAKES = [
    (in_proj_not_transposed, "weight-layout-transposed", "the query, key and value kernels"),
    (out_proj_not_transposed, "weight-layout-transposed", "the output kernel (out_proj.weight)"),
    (nothing_transposed, "weight-layout-transposed", "every kernel"),
    (interleaved, "kernel-heads-interleaved", "query, key, value and output kernels give head h"),
    (interleaved_in_only, "kernel-heads-interleaved", "query, key and value kernels and biases give"),
    (interleaved_out_only, "kernel-heads-interleaved", "Your output kernel give"),
    (key_value_swapped, "qkv-chunks-swapped", "the value's rows as the key, the key's rows as the value"),
    (query_key_swapped, "qkv-chunks-swapped", "the key's rows as the query, the query's rows as the key"),
    (kernels_then_biases, "wrong-shape", "right shapes but come in the wrong order"),
    (flat_query_kernel, "wrong-shape", "Entry 0 of your list, the query kernel, has shape (12, 12); expected "
                                       "(d_model, H, Dh) = (12, 2, 6)"),
    (two_mistakes, "wrong-output", "differ from a conversion that works: key kernel, key bias, value kernel, "
                                   "value bias, output kernel."),
    (output_bias_forgotten, "wrong-output", "differ from a conversion that works: output bias."),
    (mutates, "mutates-input", "in_proj_weight"),
]
# The tables tests/test_checks_planted.py counts (this file runs them itself, with their messages' details).
CORRECT = [(checks.check_keras_weights_from_torch, impl) for impl in RIGHT]
PLANTED = [(checks.check_keras_weights_from_torch, impl, code) for impl, code, _ in MISTAKES]


@pytest.mark.parametrize("impl", RIGHT)
def test_right_conversions_pass_with_one_line(impl, capsys):
    checks.check_keras_weights_from_torch(impl)
    out = capsys.readouterr().out
    assert out.startswith("✓ ") and out.count("\n") == 1, out
    assert "(2, 3, 4, 6 heads)" in out


def test_success_line_names_the_function(capsys):
    checks.check_keras_weights_from_torch(keras_weights_from_torch)
    checks.check_keras_weights_from_torch(lambda *a: keras_weights_from_torch(*a))
    first, second = capsys.readouterr().out.splitlines()
    assert first.startswith("✓ keras_weights_from_torch: 4 nn.MultiheadAttention layers")
    assert second.startswith("✓ keras_weights_from_torch: ")  # a lambda: the contract's name


@pytest.mark.parametrize("impl, code, detail", MISTAKES)
def test_each_mistake_gets_its_code(impl, code, detail):
    with pytest.raises(checks.CheckFailed) as info:
        checks.check_keras_weights_from_torch(impl)
    assert info.value.code == code, str(info.value)
    assert detail in str(info.value)


@pytest.mark.parametrize("impl, code, text", [
    (lambda *a: None, "returned-none", "did you forget the `return` statement?"),
    (not_implemented, "not-implemented", "Exercise 5: From nn.MultiheadAttention to Keras: replace the"),
    (raises, "raised-exception", "when called as keras_weights_from_torch(in_proj_weight of shape (36, 12), "
                                 "in_proj_bias of shape (36,), out_proj_weight of shape (12, 12), out_proj_bias of "
                                 "shape (12,), num_heads=2)"),
    (lambda *a: {"query": a[0]}, "wrong-type", "returned a dict; expected a list of 8 arrays"),
    (lambda *a: keras_weights_from_torch(*a)[:6], "wrong-type", "returned 6 arrays"),
    (lambda *a: keras_weights_from_torch(*a)[:7] + ["bias"], "wrong-type", "entry 7 (output bias) is a str"),
    (lambda *a: [w * np.nan for w in keras_weights_from_torch(*a)], "nan-output", "NaN or inf"),
])
def test_broken_functions_get_a_clear_message(impl, code, text):
    with pytest.raises(checks.CheckFailed) as info:
        checks.check_keras_weights_from_torch(impl)
    assert info.value.code == code, str(info.value)
    assert text in str(info.value)


def test_the_function_only_gets_arrays_and_numbers():
    """The grader sends the arguments over a pipe: nothing but NumPy arrays and plain numbers."""
    seen = []

    def spy(*args):
        seen.append(args)
        return keras_weights_from_torch(*args)

    checks.check_keras_weights_from_torch(spy)
    assert len(seen) == len(porting._CONFIGS)
    for args in seen:
        assert [type(a) for a in args] == [np.ndarray] * 4 + [int]
        assert all(a.dtype == np.float32 for a in args[:4])


def test_every_known_mistake_changes_the_weights():
    """No mistake of the list is a right conversion in disguise, for every configuration of the check."""
    for d, h, _, _ in porting._CONFIGS:
        rng = np.random.default_rng(0)
        inputs = [rng.standard_normal(s) for s in ((3 * d, d), (3 * d,), (d, d), (d,))]
        right = porting._convert(*inputs, h)
        assert [a.shape for a in right] == porting._keras_shapes(d, h)
        for code, _, kwargs in porting._mistakes():
            wrong = porting._convert(*inputs, h, **kwargs)
            assert not all(np.allclose(a, b) for a, b in zip(wrong, right, strict=True)), (code, kwargs)
