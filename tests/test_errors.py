"""Bad inputs fail at the API with the right exception type and a message naming the values."""

import re

import numpy as np
import pytest
import torch
from torch import nn

from attention_course import (
    EinsumMultiHeadAttention,
    MultiHeadAttention,
    SingleHeadAttention,
    causal_mask,
    combine_masks,
    merge_heads,
    multi_head_attention_loop,
    numpy_ref,
    padding_mask,
    scaled_dot_product_attention,
    sdpa_fast,
    split_heads,
)

MODULES = [MultiHeadAttention, EinsumMultiHeadAttention]
ATTENTION_FUNCTIONS = [scaled_dot_product_attention, sdpa_fast]


def raises(exception, message):
    """pytest.raises matching `message` literally (it is full of brackets)."""
    return pytest.raises(exception, match=re.escape(message))


@pytest.mark.parametrize("module_class", MODULES)
def test_d_model_not_divisible_by_num_heads(module_class):
    with raises(ValueError, "d_model=10 is not divisible by num_heads=3"):
        module_class(10, 3)
    with raises(ValueError, "num_heads must be >= 1, got num_heads=0"):
        module_class(8, 0)


def test_dropout_out_of_range():
    with raises(ValueError, "dropout must be in [0, 1), got dropout=1.5"):
        MultiHeadAttention(8, 2, dropout=1.5)
    with raises(ValueError, "dropout must be in [0, 1), got dropout=-0.1"):
        SingleHeadAttention(4, 4, dropout=-0.1)


@pytest.mark.parametrize("attend", ATTENTION_FUNCTIONS)
class TestFunctionalInputs:
    def test_query_and_key_feature_sizes_differ(self, attend):
        with raises(ValueError, "query feature size 8 != key feature size 6"):
            attend(torch.randn(2, 4, 8), torch.randn(2, 5, 6), torch.randn(2, 5, 6))

    def test_key_and_value_lengths_differ(self, attend):
        with raises(ValueError, "key length 5 != value length 4"):
            attend(torch.randn(2, 4, 8), torch.randn(2, 5, 8), torch.randn(2, 4, 8))

    def test_too_few_dimensions(self, attend):
        with raises(ValueError, "query must have at least 2 dimensions (..., T, features), got shape (8,)"):
            attend(torch.randn(8), torch.randn(5, 8), torch.randn(5, 8))

    def test_dtypes_differ(self, attend):
        with raises(TypeError, "query, key and value must share a dtype, got torch.float32, torch.float64"):
            attend(torch.randn(4, 8), torch.randn(5, 8, dtype=torch.float64), torch.randn(5, 8))

    def test_batch_dims_do_not_broadcast(self, attend):
        with raises(ValueError, "batch dimensions of query, key and value [(2,), (3,), (3,)] do not broadcast"):
            attend(torch.randn(2, 4, 8), torch.randn(3, 5, 8), torch.randn(3, 5, 8))

    def test_mask_does_not_broadcast(self, attend):
        q, k, v = torch.randn(2, 4, 3, 8), torch.randn(2, 4, 5, 8), torch.randn(2, 4, 5, 8)
        with raises(ValueError, "mask of shape (2, 5) does not broadcast to attention scores (2, 4, 3, 5)"):
            attend(q, k, v, torch.ones(2, 5, dtype=torch.bool))
        with raises(ValueError, "mask of shape (1, 2, 4, 3, 5) does not broadcast to attention scores (2, 4, 3, 5)"):
            attend(q, k, v, torch.ones(1, 2, 4, 3, 5, dtype=torch.bool))

    def test_mask_not_boolean(self, attend):
        q = torch.randn(2, 3, 8)
        with raises(TypeError, "mask must be boolean (True = may attend), got torch.float32"):
            attend(q, q, q, torch.ones(3, 3))
        with raises(TypeError, "mask must be boolean (True = may attend), got ndarray"):
            attend(q, q, q, np.ones((3, 3), dtype=bool))

    def test_dropout_probability(self, attend):
        q = torch.randn(2, 3, 8)
        with raises(ValueError, "dropout_p must be in [0, 1), got dropout_p=2.0"):
            attend(q, q, q, dropout_p=2.0)
        with raises(ValueError, "dropout_p must be in [0, 1), got dropout_p=1.0"):  # would drop every weight
            attend(q, q, q, dropout_p=1.0)
        with raises(TypeError, "dropout_p must be a float, got str"):
            attend(q, q, q, dropout_p="0.1")


@pytest.mark.parametrize("module_class", MODULES)
class TestModuleInputs:
    def test_wrong_feature_size(self, module_class):
        module = module_class(8, 2, kdim=6)
        with raises(ValueError, "query has 6 features, but the query projection expects 8"):
            module(torch.randn(2, 4, 6))
        with raises(ValueError, "key has 8 features, but the key projection expects 6"):
            module(torch.randn(2, 4, 8), torch.randn(2, 5, 8))

    def test_batch_sizes_differ(self, module_class):
        with raises(ValueError, "batch sizes differ: query 2, key 1, value 1"):
            module_class(8, 2)(torch.randn(2, 4, 8), torch.randn(1, 5, 8))

    def test_three_d_mask_whose_batch_is_not_b(self, module_class):
        with raises(ValueError, "a 3-D mask is read as (B, Tq, Tk), one mask per example, but mask has shape "
                    "(2, 4, 4) and B=3; for one mask per head pass (B, H, Tq, Tk) or (1, H, Tq, Tk) (here H=2)"):
            module_class(8, 2)(torch.randn(3, 4, 8), mask=torch.ones(2, 4, 4, dtype=torch.bool))
        with raises(ValueError, "mask of shape (3, 3, 4, 4) does not broadcast to attention scores (3, 2, 4, 4)"):
            module_class(8, 2)(torch.randn(3, 4, 8), mask=torch.ones(3, 3, 4, 4, dtype=torch.bool))

    def test_numpy_params_of_the_wrong_size(self, module_class):
        module = module_class(8, 2, kdim=6)
        with raises(ValueError, "params['w_k'] has shape (8, 8), expected (6, 8)"):
            module.load_numpy_params(numpy_ref.init_mha_params(8))
        params = numpy_ref.init_mha_params(8, kdim=6)
        del params["b_o"]
        with raises(ValueError, "params is missing 'b_o'"):
            module.load_numpy_params(params)

    def test_nonzero_biases_into_a_module_without_bias(self, module_class):
        with raises(ValueError, "the module has bias=False, but params['b_q'] is not zero"):
            module_class(8, 2, bias=False).load_numpy_params(numpy_ref.init_mha_params(8))


def test_single_head_input_errors():
    module = SingleHeadAttention(6, 4)
    with raises(ValueError, "value has 5 features, but the value projection expects 6"):
        module(torch.randn(2, 3, 6), torch.randn(2, 3, 6), torch.randn(2, 3, 5))
    with raises(ValueError, "mask of shape (2, 1, 1, 3) does not broadcast to attention scores (2, 3, 3)"):
        module(torch.randn(2, 3, 6), mask=padding_mask([1, 2], 3))


def test_from_torch_rejects_unsupported_options():
    with raises(ValueError, "add_bias_kv=True or add_zero_attn=True is not supported"):
        MultiHeadAttention.from_torch(nn.MultiheadAttention(8, 2, add_bias_kv=True))
    with raises(ValueError, "add_bias_kv=True or add_zero_attn=True is not supported"):
        MultiHeadAttention.from_torch(nn.MultiheadAttention(8, 2, add_zero_attn=True))


def test_loop_over_heads_errors():
    params = numpy_ref.init_mha_params(8)
    x = torch.randn(2, 4, 8, dtype=torch.float64)
    with raises(ValueError, "d_model=8 is not divisible by num_heads=3"):
        multi_head_attention_loop(x, x, x, params, 3)
    with raises(ValueError, "a 3-D mask is read as (B, Tq, Tk), one mask per example, but mask has shape (3, 4, 4) "
                "and B=2"):
        multi_head_attention_loop(x, x, x, params, 2, torch.ones(3, 4, 4, dtype=torch.bool))
    with raises(ValueError, "mask of shape (1, 3, 4, 4) does not broadcast to attention scores (2, 2, 4, 4)"):
        multi_head_attention_loop(x, x, x, params, 2, torch.ones(1, 3, 4, 4, dtype=torch.bool))


def test_head_split_errors():
    with raises(ValueError, "x must be 3-D (B, T, D), got shape (2, 2, 4, 2)"):
        split_heads(torch.randn(2, 2, 4, 2), 2)
    with raises(ValueError, "d_model=10 is not divisible by num_heads=4"):
        split_heads(torch.randn(2, 3, 10), 4)
    with raises(ValueError, "x must be 4-D (B, H, T, Dh), got shape (2, 3, 8)"):
        merge_heads(torch.randn(2, 3, 8))


def test_padding_mask_errors():
    with raises(ValueError, "lengths must lie in [0, t=5], got [3, 7]"):
        padding_mask([3, 7], 5)
    with raises(ValueError, "lengths must lie in [0, t=5], got [-1, 2]"):
        padding_mask([-1, 2], 5)
    with raises(TypeError, "lengths must be integers, got torch.float32"):
        padding_mask([2.0, 3.0], 5)
    with raises(ValueError, "lengths must be 1-D (B,), got shape (2, 1)"):
        padding_mask([[2], [3]], 5)


def test_combine_masks_errors():
    with raises(TypeError, "mask must be boolean (True = may attend), got torch.int64"):
        combine_masks(causal_mask(3), torch.ones(3, 3, dtype=torch.long))
    with raises(ValueError, "masks of shapes [(3, 3), (2, 1, 1, 4)] do not broadcast together"):
        combine_masks(causal_mask(3), padding_mask([1, 4], 4))


# ---- issue 17, item 6: one rule for 3-D masks, clear errors for wrong types, Dk = 0 and n_rep = 0 raise

from attention_course import online_softmax  # noqa: E402
from attention_course.blockwise import blockwise_attention, naive_attention  # noqa: E402
from attention_course.fused import FusedSelfAttention  # noqa: E402
from attention_course.kv_cache import CausalSelfAttention, repeat_kv  # noqa: E402

ALL_MODULES = {
    "multi_head": lambda **kw: MultiHeadAttention(8, 2, **kw),
    "einsum": lambda **kw: EinsumMultiHeadAttention(8, 2, **kw),
    "fused": lambda **kw: FusedSelfAttention(8, 2, **kw),
    "causal": lambda **kw: CausalSelfAttention(8, 2, **kw),
    "single_head": lambda **kw: SingleHeadAttention(8, 4, **kw),
}


@pytest.mark.parametrize("module_class", MODULES)
@pytest.mark.parametrize("num_heads", [2, 4])
def test_three_d_mask_is_per_example_even_when_b_equals_h(module_class, num_heads):
    """B == H: a (B, Tq, Tk) mask must mask example b (all heads), never head b; nn.MultiheadAttention agrees
    when given the same mask repeated per head in its own (B * H, Tq, Tk) layout (and True = NOT allowed)."""
    torch.manual_seed(0)
    b, t_q, t_k = num_heads, 3, 5
    module = module_class(8, num_heads, kdim=6, vdim=4).double().eval()
    query = torch.randn(b, t_q, 8).double()  # (B, Tq, D)
    key, value = torch.randn(b, t_k, 6).double(), torch.randn(b, t_k, 4).double()  # (B, Tk, kdim), (B, Tk, vdim)
    mask = torch.rand(b, t_q, t_k) > 0.4
    mask[..., 0] = True  # every row attends something
    ours = module(query, key, value, mask=mask)
    torch.testing.assert_close(ours, module(query, key, value, mask=mask[:, None]), rtol=0, atol=0)
    theirs = MultiHeadAttention.from_torch(nn.MultiheadAttention(8, num_heads, kdim=6, vdim=4, batch_first=True))
    theirs.load_numpy_params(module.numpy_params())
    reference = theirs.double().eval().to_torch()
    expected, _ = reference(query, key, value, attn_mask=~mask.repeat_interleave(num_heads, dim=0))
    torch.testing.assert_close(ours, expected, rtol=0, atol=1e-12)
    per_head = module(query, key, value, mask=mask[None].transpose(0, 1).expand(b, num_heads, t_q, t_k))
    torch.testing.assert_close(ours, per_head, rtol=0, atol=0)


def test_three_d_mask_rule_in_the_loop_and_the_fused_module():
    torch.manual_seed(1)
    params = numpy_ref.init_mha_params(8)
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    mask = torch.rand(2, 5, 5) > 0.5
    mask[..., 0] = True
    out, _ = multi_head_attention_loop(x, x, x, params, 2, mask)
    expected, _ = numpy_ref.multi_head_attention(x.numpy(), x.numpy(), x.numpy(), params, 2, mask[:, None].numpy())
    np.testing.assert_allclose(out.numpy(), expected, rtol=0, atol=1e-12)
    fused = FusedSelfAttention(8, 2).double()
    fused.load_numpy_params(params)
    with torch.no_grad():
        np.testing.assert_allclose(fused(x, mask=mask).numpy(), expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", ["multi_head", "einsum", "fused", "causal"])
def test_num_heads_must_be_an_int(name):
    make = {"multi_head": MultiHeadAttention, "einsum": EinsumMultiHeadAttention, "fused": FusedSelfAttention,
            "causal": CausalSelfAttention}[name]
    with raises(TypeError, "num_heads must be an int, got float 2.0"):
        make(8, 2.0)
    with raises(TypeError, "num_heads must be an int, got bool True"):
        make(8, True)
    with raises(TypeError, "d_model must be an int, got str '8'"):
        make("8", 2)
    with raises(ValueError, "d_model must be >= 1, got d_model=0"):  # Dh = 0 would give 0/0 scores
        make(0, 2)


def test_other_integer_arguments():
    with raises(TypeError, "num_heads must be an int, got float 2.0"):
        split_heads(torch.randn(2, 3, 8), 2.0)
    with raises(TypeError, "num_kv_heads must be an int, got float 2.0"):
        CausalSelfAttention(8, 2, num_kv_heads=2.0)
    with raises(TypeError, "d_out must be an int, got float 4.0"):
        SingleHeadAttention(8, 4.0)
    with raises(TypeError, "dropout must be a float, got NoneType"):
        MultiHeadAttention(8, 2, dropout=None)


def test_functional_input_types():
    q = torch.randn(2, 3, 8)
    with raises(TypeError, "key must be a torch.Tensor, got ndarray: convert it with torch.from_numpy"):
        scaled_dot_product_attention(q, q.numpy(), q)
    with raises(TypeError, "query must be a floating-point tensor, got torch.int32"):
        sdpa_fast(q.int(), q, q)
    with raises(TypeError, "value must be a torch.Tensor, got list"):
        blockwise_attention(q, q, q.tolist())


@pytest.mark.parametrize("attend", [scaled_dot_product_attention, sdpa_fast, blockwise_attention, naive_attention])
def test_zero_head_dim_and_mask_device(attend):
    q = torch.randn(2, 3, 0)
    with raises(ValueError, "query and key have feature size Dk = 0"):
        attend(q, q, torch.randn(2, 3, 4))
    q = torch.randn(2, 3, 8)
    on_meta = torch.ones(3, 3, dtype=torch.bool, device="meta")
    with raises(ValueError, "mask is on meta, but query is on cpu: move it with mask.to(query.device)"):
        attend(q, q, q, mask=on_meta)
    with raises(TypeError, "mask must be boolean (True = may attend), got torch.uint8"):
        attend(q, q, q, mask=torch.ones(3, 3, dtype=torch.uint8))


def test_query_key_value_on_different_devices():
    q = torch.randn(2, 3, 8)
    with raises(ValueError, "query, key and value must be on one device, got cpu, meta, cpu"):
        scaled_dot_product_attention(q, q.to("meta"), q)


def test_mask_on_another_device_given_to_a_module():
    with raises(ValueError, "mask is on meta, but query is on cpu"):
        MultiHeadAttention(8, 2)(torch.randn(2, 3, 8), mask=torch.ones(2, 3, 3, dtype=torch.bool, device="meta"))


def test_repeat_kv_errors():
    kv = torch.randn(2, 2, 5, 4)
    with raises(ValueError, "x must be 4-D (B, H_kv, T, Dh), got shape (2, 5, 4)"):
        repeat_kv(kv[0], 2)
    with raises(ValueError, "n_rep must be >= 1, got n_rep=0"):
        repeat_kv(kv, 0)
    with raises(TypeError, "n_rep must be an int, got float 2.0"):
        repeat_kv(kv, 2.0)
    with raises(TypeError, "x must be a torch.Tensor, got ndarray"):
        repeat_kv(kv.numpy(), 2)


def test_online_softmax_errors():
    with raises(TypeError, "x must be a floating-point tensor, got torch.int64"):
        online_softmax.online_softmax(torch.arange(6).reshape(2, 3))
    with raises(TypeError, "x must be a torch.Tensor, got ndarray"):
        online_softmax.online_softmax(np.zeros((2, 3)))
    with raises(ValueError, "block_size must be >= 1, got block_size=0"):
        online_softmax.online_softmax(torch.zeros(2, 3), block_size=0)
    with raises(TypeError, "x must be a floating-point tensor, got torch.int64"):
        online_softmax.online_softmax_trace(torch.arange(6), 2)
    with raises(TypeError, "block_size must be an int, got float 2.0"):
        online_softmax.online_softmax_trace(torch.zeros(6), 2.0)


@pytest.mark.parametrize("name", ALL_MODULES)
def test_every_module_has_biases_by_default(name):
    module = ALL_MODULES[name]()
    linears = [m for m in module.modules() if isinstance(m, nn.Linear)]
    biases = [p for n, p in module.named_parameters() if n.split(".")[-1].startswith("b")]
    assert all(linear.bias is not None for linear in linears) and biases


def test_keras_layer_has_the_same_defaults_and_errors():
    from attention_course.keras_attention import KerasMultiHeadAttention

    layer = KerasMultiHeadAttention(8, 2)
    assert layer.use_bias and layer.dropout == 0.0  # Keras' own name for bias: use_bias
    with raises(ValueError, "dropout must be in [0, 1), got dropout=1.0"):
        KerasMultiHeadAttention(8, 2, dropout=1.0)
    with raises(TypeError, "num_heads must be an int, got float 2.0"):
        KerasMultiHeadAttention(8, 2.0)


@pytest.mark.parametrize("shapes", [[(2, 1, 3), (4, 1)], [(), (5,)], [(3, 1), (1, 4), (2, 1, 1)], [(2, 3), (3, 3)],
                                    [(0, 1), (1, 5)], [(2, 0), (1,)]])
def test_broadcast_shape_agrees_with_numpy(shapes):
    from attention_course.validation import broadcast_shape

    try:
        expected = np.broadcast_shapes(*shapes)
    except ValueError:
        expected = None
    assert broadcast_shape(*shapes) == expected
