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
    with raises(ValueError, "dropout probability must be in [0, 1], got 1.5"):
        MultiHeadAttention(8, 2, dropout=1.5)
    with raises(ValueError, "dropout probability must be in [0, 1], got -0.1"):
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
        with raises(ValueError, "dropout probability must be in [0, 1], got 2.0"):
            attend(q, q, q, dropout_p=2.0)


@pytest.mark.parametrize("module_class", MODULES)
class TestModuleInputs:
    def test_wrong_rank(self, module_class):
        with raises(ValueError, "query must be 3-D (B, T, D), got shape (4, 8)"):
            module_class(8, 2)(torch.randn(4, 8))

    def test_wrong_feature_size(self, module_class):
        module = module_class(8, 2, kdim=6)
        with raises(ValueError, "query has 6 features, but the query projection expects 8"):
            module(torch.randn(2, 4, 6))
        with raises(ValueError, "key has 8 features, but the key projection expects 6"):
            module(torch.randn(2, 4, 8), torch.randn(2, 5, 8))

    def test_batch_sizes_differ(self, module_class):
        with raises(ValueError, "batch sizes differ: query 2, key 1, value 1"):
            module_class(8, 2)(torch.randn(2, 4, 8), torch.randn(1, 5, 8))

    def test_mask_does_not_broadcast_to_heads(self, module_class):
        with raises(ValueError, "mask of shape (3, 4, 4) does not broadcast to attention scores (3, 2, 4, 4)"):
            module_class(8, 2)(torch.randn(3, 4, 8), mask=torch.ones(3, 4, 4, dtype=torch.bool))

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
    with raises(ValueError, "mask of shape (3, 4, 4) does not broadcast to attention scores (2, 2, 4, 4)"):
        multi_head_attention_loop(x, x, x, params, 2, torch.ones(3, 4, 4, dtype=torch.bool))


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
