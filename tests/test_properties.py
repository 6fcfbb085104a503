"""Properties of attention over random sizes and masks (hypothesis)."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attention_course import EinsumMultiHeadAttention, MultiHeadAttention, scaled_dot_product_attention, sdpa_fast

SETTINGS = settings(max_examples=30, deadline=None, database=None)  # failures print their example


@st.composite
def attention_inputs(draw):
    """q (B, H, Tq, Dh), k (B, H, Tk, Dh), v (B, H, Tk, Dv) in float64 and a random (B, H, Tq, Tk) mask."""
    b, h = draw(st.integers(1, 3)), draw(st.integers(1, 4))
    t_q, t_k = draw(st.integers(1, 6)), draw(st.integers(1, 6))
    d_k, d_v = draw(st.integers(1, 5)), draw(st.integers(1, 5))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    q = torch.randn(b, h, t_q, d_k, generator=g, dtype=torch.float64)
    k = torch.randn(b, h, t_k, d_k, generator=g, dtype=torch.float64)
    v = torch.randn(b, h, t_k, d_v, generator=g, dtype=torch.float64)
    mask = torch.rand(b, h, t_q, t_k, generator=g) < draw(st.floats(0.0, 1.0))
    return q, k, v, mask


@st.composite
def module_and_sequence(draw, module_class):
    """A float64 eval-mode module with D = H * Dh and an input (B, T, D)."""
    h, d_h = draw(st.integers(1, 4)), draw(st.integers(1, 3))
    b, t = draw(st.integers(1, 3)), draw(st.integers(2, 6))
    torch.manual_seed(draw(st.integers(0, 2**31 - 1)))
    module = module_class(h * d_h, h).double().eval()
    return module, torch.randn(b, t, h * d_h, dtype=torch.float64)


@SETTINGS
@given(attention_inputs())
def test_weights_are_a_distribution_over_allowed_keys(inputs):
    q, k, v, mask = inputs
    out, weights = scaled_dot_product_attention(q, k, v, mask)
    any_allowed = mask.any(dim=-1)  # (B, H, Tq)
    assert torch.isfinite(out).all() and torch.isfinite(weights).all()
    assert torch.allclose(weights.sum(-1)[any_allowed], torch.tensor(1.0, dtype=torch.float64))
    assert (weights[~mask] == 0).all()  # masked keys get exactly zero weight
    assert (out[~any_allowed] == 0).all()  # a query that may attend nothing outputs zeros
    assert (weights >= 0).all()


@SETTINGS
@given(attention_inputs())
def test_sdpa_fast_agrees_with_scratch_on_random_masks(inputs):
    q, k, v, mask = inputs
    out = sdpa_fast(q, k, v, mask)
    expected, _ = scaled_dot_product_attention(q, k, v, mask)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-10)


@SETTINGS
@given(module_and_sequence(MultiHeadAttention), st.data())
def test_causal_output_ignores_later_tokens(module_and_x, data):
    module, x = module_and_x
    t = data.draw(st.integers(0, x.shape[1] - 2), label="t")
    changed = x.clone()
    changed[:, t + 1 :] = torch.randn_like(changed[:, t + 1 :])
    with torch.no_grad():
        before, after = module(x, is_causal=True), module(changed, is_causal=True)
    torch.testing.assert_close(after[:, : t + 1], before[:, : t + 1], rtol=0, atol=1e-12)
    assert not torch.allclose(after[:, t + 1 :], before[:, t + 1 :])


@SETTINGS
@given(st.sampled_from([MultiHeadAttention, EinsumMultiHeadAttention]).flatmap(module_and_sequence), st.randoms())
def test_self_attention_without_mask_is_permutation_equivariant(module_and_x, random):
    module, x = module_and_x
    perm = list(range(x.shape[1]))
    random.shuffle(perm)
    with torch.no_grad():
        torch.testing.assert_close(module(x[:, perm]), module(x)[:, perm], rtol=0, atol=1e-10)
