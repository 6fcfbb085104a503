"""The field guide's checks (chapter 7) and the additive float masks (chapter 4): each named mistake is reported
for a deliberately wrong implementation; correct ones pass; additive_mask agrees with PyTorch's own masking."""

import itertools
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attention_course import bug_zoo, causal_mask, checks, padding_mask, scaled_dot_product_attention
from attention_course.float_masks import additive_mask


def failure(check, impl) -> str:
    with pytest.raises(checks.CheckFailed) as info:
        check(impl)
    return str(info.value)


# --- layers created once ------------------------------------------------------------------------------------------


def test_a_correct_module_passes(capsys):
    checks.check_layers_created_once(bug_zoo.ZooMultiHeadAttention)
    assert capsys.readouterr().out.startswith("✓ ZooMultiHeadAttention: deterministic in .eval() mode")


def test_linear_in_forward_is_named():
    message = failure(checks.check_layers_created_once, bug_zoo.MHALinearInForward)
    assert message.startswith("[layer-created-in-forward] Your module is not a fixed function: two calls")


def test_a_module_deterministic_but_not_in_its_state_dict_is_named():
    """Weights drawn in forward() from a fixed seed: two calls agree, but nothing is saved or trained."""

    class SeededLinearInForward(bug_zoo.ZooMultiHeadAttention):
        instances = itertools.count()  # a different draw per instance (id() repeats once an instance is freed)

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.seed = next(self.instances)  # a plain attribute: not in the state dict

        def forward(self, query, key, value, mask=None):
            gen = torch.Generator().manual_seed(self.seed)
            weight = torch.randn(query.size(-1), query.size(-1), generator=gen)
            return super().forward(query, key, value, mask) @ weight

    message = failure(checks.check_layers_created_once, SeededLinearInForward)
    assert message.startswith("[layer-created-in-forward] Your module is not a fixed function: a copy loaded")


def test_linear_in_forward_really_redraws_and_is_not_a_parameter():
    module = bug_zoo.MHALinearInForward(8, 2).eval()
    x = torch.randn(1, 3, 8)
    with torch.no_grad():
        assert not torch.allclose(module(x, x, x), module(x, x, x))
    reference = bug_zoo.ZooMultiHeadAttention(8, 2)
    assert set(module.state_dict()) == set(reference.state_dict())  # the forward() layer is in neither


# --- additive float masks -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("impl", [
    additive_mask,
    lambda mask: (1.0 - mask.float()) * -1e10,  # the classic additive mask: -0.0 where allowed counts as 0
    lambda mask: torch.zeros(mask.shape).masked_fill(~mask, -1e9),
], ids=["library", "one-minus-times-minus-1e10", "masked-fill-minus-1e9"])
def test_correct_additive_masks_pass(impl, capsys):
    checks.check_additive_mask(impl)
    assert "3 boolean masks become additive float masks" in capsys.readouterr().out


@pytest.mark.parametrize("impl, code", [
    (bug_zoo.additive_mask_cast, "float-mask-not-additive"),
    (lambda mask: (1.0 - mask.float()) * 1e10, "mask-wrong-sign"),
    (lambda mask: mask.float() * -1e10, "mask-inverted"),
    (lambda mask: mask, "wrong-type"),
    (lambda mask: (1.0 - mask.float()) * -1.0, "wrong-output"),
    (lambda mask: torch.zeros(2, 2), "wrong-shape"),
], ids=["cast", "plus", "inverted", "bool", "too-small", "shape"])
def test_each_float_mask_mistake_is_named(impl, code):
    assert failure(checks.check_additive_mask, impl).startswith(f"[{code}] ")


def test_additive_mask_matches_boolean_masking_in_sdpa_and_ours():
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 3, 4, 8), torch.randn(2, 3, 6, 8), torch.randn(2, 3, 6, 5)  # Tq != Tk, d_v != d_k
    mask = causal_mask(4, 6) & padding_mask([6, 5], 6)  # (B, 1, Tq, Tk)
    expected, _ = scaled_dot_product_attention(q, k, v, mask)
    float_mask = additive_mask(mask)
    assert float_mask.dtype == torch.float32 and float_mask.shape == mask.shape
    assert torch.allclose(F.scaled_dot_product_attention(q, k, v, attn_mask=float_mask), expected, atol=1e-5)
    scores = q @ k.transpose(-2, -1) / math.sqrt(8) + float_mask
    assert torch.allclose(torch.softmax(scores, -1) @ v, expected, atol=1e-5)


def test_additive_mask_matches_nn_multihead_attention_float_mask():
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(8, 2, batch_first=True).eval()
    x = torch.randn(2, 5, 8)
    with torch.no_grad():
        with_bool, _ = mha(x, x, x, attn_mask=~causal_mask(5))  # nn.MultiheadAttention: True = NOT allowed
        with_float, _ = mha(x, x, x, attn_mask=additive_mask(causal_mask(5)))
    assert torch.allclose(with_bool, with_float, atol=1e-6)


def test_a_cast_mask_hides_nothing():
    q, k, v = torch.randn(3, 1, 1, 4, 8).unbind(0)
    unmasked = F.scaled_dot_product_attention(q, k, v)
    cast = F.scaled_dot_product_attention(q, k, v, attn_mask=bug_zoo.additive_mask_cast(causal_mask(4)))
    assert not torch.allclose(unmasked, cast, atol=1e-5)  # it changes the scores...
    weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(8) + causal_mask(4).float(), -1)
    assert (weights[..., 0, 1:] > 0).all()  # ...but the first query still sees the future


@pytest.mark.parametrize("mask, dtype, error, match", [
    ([[True]], torch.float32, TypeError, "mask must be a torch.Tensor, got list"),
    (torch.ones(2, 2), torch.float32, TypeError, "mask must be a boolean tensor"),
    (torch.ones(2, 2, dtype=torch.bool), torch.int64, ValueError, "dtype must be a floating-point torch.dtype"),
])
def test_additive_mask_refuses_bad_input(mask, dtype, error, match):
    with pytest.raises(error, match=match):
        additive_mask(mask, dtype)


# --- the causal buffer --------------------------------------------------------------------------------------------


def test_buffer_slice_is_right_for_equal_lengths_and_top_left_when_decoding():
    assert torch.equal(bug_zoo.causal_mask_buffer_sliced(5), causal_mask(5))
    assert bug_zoo.causal_mask_buffer_sliced(1, 6).tolist() == [[True, False, False, False, False, False]]
    assert failure(checks.check_causal_mask, bug_zoo.causal_mask_buffer_sliced).startswith(
        "[causal-top-left-aligned] ")
