"""MultiHeadAttention vs torch.nn.MultiheadAttention (weights copied both ways) and vs the float64 reference.

nn.MultiheadAttention's attn_mask and key_padding_mask use True = NOT allowed: it gets ``~mask`` throughout.
"""

import collections
import inspect
import sys

import numpy as np
import pytest
import torch
from torch import nn

from attention_course import MultiHeadAttention, causal_mask, numpy_ref, padding_mask

D_MODEL = 8
LENGTHS = [3, 7]  # key padding; every key length keeps key 0, so no query row is fully masked for nn.MHA


def make_pair(direction, num_heads, bias=True, kdim=None, vdim=None, batch_first=True, dropout=0.0):
    """(ours, theirs) with identical weights, built from_torch or to_torch."""
    torch.manual_seed(0)
    if direction == "from_torch":
        theirs = nn.MultiheadAttention(
            D_MODEL, num_heads, dropout=dropout, bias=bias, kdim=kdim, vdim=vdim, batch_first=batch_first
        )
        if bias:  # nn.MultiheadAttention starts with zero biases: randomise them so that they are tested
            nn.init.normal_(theirs.in_proj_bias)
            nn.init.normal_(theirs.out_proj.bias)
        ours = MultiHeadAttention.from_torch(theirs)
    else:
        ours = MultiHeadAttention(D_MODEL, num_heads, dropout=dropout, bias=bias, kdim=kdim, vdim=vdim)
        theirs = ours.to_torch(batch_first=batch_first)
    return ours.eval(), theirs.eval()


def torch_mha(theirs, query, key, value, causal, padding, average=False):
    """Run nn.MultiheadAttention on our batch-first inputs with our masks translated to its convention."""
    t_q, t_k = query.shape[1], key.shape[1]
    attn_mask = ~causal_mask(t_q, t_k) if causal else None  # True = NOT allowed
    key_padding_mask = ~padding_mask(LENGTHS, t_k)[:, 0, 0] if padding else None  # (B, Tk), True = padding
    if not theirs.batch_first:
        query, key, value = (x.transpose(0, 1) for x in (query, key, value))  # (T, B, D)
    out, weights = theirs(
        query, key, value, attn_mask=attn_mask, key_padding_mask=key_padding_mask, average_attn_weights=average
    )
    return (out if theirs.batch_first else out.transpose(0, 1)), weights


def our_mha(ours, query, key, value, causal, padding):
    mask = padding_mask(LENGTHS, key.shape[1]) if padding else None  # (B, 1, 1, Tk)
    return ours(query, key, value, mask=mask, is_causal=causal, return_weights=True)


def inputs(t_q=5, t_k=None, kdim=None, vdim=None, dtype=torch.float32):
    t_k = t_q if t_k is None else t_k
    g = torch.Generator().manual_seed(1)
    query = torch.randn(2, t_q, D_MODEL, generator=g, dtype=dtype)
    key = torch.randn(2, t_k, kdim or D_MODEL, generator=g, dtype=dtype)
    value = torch.randn(2, t_k, vdim or D_MODEL, generator=g, dtype=dtype)
    return query, key, value


MASKS = {"none": (False, False), "causal": (True, False), "padding": (False, True), "both": (True, True)}


@pytest.mark.parametrize("direction", ["from_torch", "to_torch"])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("masks", MASKS)
@pytest.mark.parametrize("num_heads", [1, 2, 4, 8])
def test_self_attention_matches_torch(direction, bias, batch_first, masks, num_heads):
    ours, theirs = make_pair(direction, num_heads, bias=bias, batch_first=batch_first)
    query, _, _ = inputs(t_q=7)
    causal, padding = MASKS[masks]
    with torch.no_grad():
        out, weights = our_mha(ours, query, query, query, causal, padding)
        expected_out, expected_weights = torch_mha(theirs, query, query, query, causal, padding)
    torch.testing.assert_close(out, expected_out, rtol=0, atol=1e-5)
    torch.testing.assert_close(weights, expected_weights, rtol=0, atol=1e-5)  # (B, H, Tq, Tk) both


@pytest.mark.parametrize("direction", ["from_torch", "to_torch"])
@pytest.mark.parametrize("kdim, vdim", [(None, None), (D_MODEL, D_MODEL), (6, 10), (12, 12)])
@pytest.mark.parametrize("masks", MASKS)
@pytest.mark.parametrize("batch_first", [True, False])
def test_cross_attention_matches_torch(direction, kdim, vdim, masks, batch_first):
    ours, theirs = make_pair(direction, 2, kdim=kdim, vdim=vdim, batch_first=batch_first)
    query, key, value = inputs(t_q=4, t_k=7, kdim=kdim, vdim=vdim)
    causal, padding = MASKS[masks]
    with torch.no_grad():
        out, weights = our_mha(ours, query, key, value, causal, padding)
        expected_out, expected_weights = torch_mha(theirs, query, key, value, causal, padding)
    assert out.shape == (2, 4, D_MODEL) and weights.shape == (2, 2, 4, 7)
    torch.testing.assert_close(out, expected_out, rtol=0, atol=1e-5)
    torch.testing.assert_close(weights, expected_weights, rtol=0, atol=1e-5)


def test_packed_and_separate_torch_layouts_are_both_read():
    packed = nn.MultiheadAttention(D_MODEL, 2)
    separate = nn.MultiheadAttention(D_MODEL, 2, kdim=6, vdim=10)
    assert packed.in_proj_weight is not None and separate.in_proj_weight is None
    ours = MultiHeadAttention.from_torch(packed)
    w_q, w_k, w_v = packed.in_proj_weight.chunk(3)
    assert torch.equal(ours.w_q.weight, w_q) and torch.equal(ours.w_k.weight, w_k)
    assert torch.equal(ours.w_v.weight, w_v) and torch.equal(ours.w_o.weight, packed.out_proj.weight)
    ours = MultiHeadAttention.from_torch(separate)
    assert torch.equal(ours.w_k.weight, separate.k_proj_weight) and ours.kdim == 6 and ours.vdim == 10


def test_head_averaged_torch_weights_are_our_mean_over_heads():
    ours, theirs = make_pair("to_torch", 4)
    query, _, _ = inputs()
    with torch.no_grad():
        _, weights = ours(query, return_weights=True)
        _, averaged = torch_mha(theirs, query, query, query, causal=False, padding=False, average=True)
    torch.testing.assert_close(weights.mean(dim=1), averaged, rtol=0, atol=1e-6)


def test_from_torch_keeps_dtype_and_dropout():
    theirs = nn.MultiheadAttention(D_MODEL, 2, dropout=0.25, dtype=torch.float64)
    ours = MultiHeadAttention.from_torch(theirs)
    assert ours.w_q.weight.dtype == torch.float64 and ours.dropout == 0.25
    assert ours.to_torch().dropout == 0.25


@pytest.mark.parametrize("num_heads", [1, 2, 4, 8])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("masks", MASKS)
def test_matches_numpy_reference_in_float64(assert_matches_reference, num_heads, bias, masks):
    params = numpy_ref.init_mha_params(D_MODEL, seed=num_heads)
    if not bias:
        params |= {f"b_{name}": np.zeros(D_MODEL) for name in "qkvo"}
    query = np.random.default_rng(0).normal(size=(2, 7, D_MODEL))
    causal, padding = MASKS[masks]
    mask = numpy_ref.padding_mask(np.array(LENGTHS), 7) if padding else None
    module = MultiHeadAttention(D_MODEL, num_heads, bias=bias)
    assert_matches_reference(module, params, num_heads, query, mask=mask, is_causal=causal)


@pytest.mark.parametrize("kdim, vdim", [(None, None), (6, 10)])
def test_cross_attention_matches_numpy_reference(assert_matches_reference, kdim, vdim):
    params = numpy_ref.init_mha_params(D_MODEL, kdim, vdim)
    rng = np.random.default_rng(0)
    query, key, value = (rng.normal(size=(2, t, d)) for t, d in ((3, D_MODEL), (6, kdim or 8), (6, vdim or 8)))
    mask = rng.random((2, 1, 3, 6)) < 0.5  # includes fully masked rows
    module = MultiHeadAttention(D_MODEL, 2, kdim=kdim, vdim=vdim)
    assert_matches_reference(module, params, 2, query, key, value, mask=mask)
    assert_matches_reference(module, params, 2, query, key, value, mask=mask, is_causal=True)


def test_numpy_params_round_trip():
    params = numpy_ref.init_mha_params(D_MODEL, kdim=6, vdim=10)
    module = MultiHeadAttention(D_MODEL, 2, kdim=6, vdim=10).double()
    module.load_numpy_params(params)
    exported = module.numpy_params()
    assert exported.keys() == params.keys()
    for name in params:
        np.testing.assert_array_equal(exported[name], params[name])
    assert torch.equal(module.w_k.weight, torch.from_numpy(params["w_k"]).T)  # (d_out, d_in) = W.T


def test_numpy_params_of_a_module_without_bias_has_zero_biases():
    exported = MultiHeadAttention(D_MODEL, 2, bias=False).numpy_params()
    assert all(not exported[f"b_{name}"].any() for name in "qkvo")


@pytest.mark.parametrize("is_causal", [False, True])
def test_sdpa_path_matches_reference(is_causal):
    params = numpy_ref.init_mha_params(D_MODEL)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 5, D_MODEL))
    mask = rng.random((2, 1, 5, 5)) < 0.5  # includes fully masked rows
    module = MultiHeadAttention(D_MODEL, 2, backend="sdpa").double().eval()
    module.load_numpy_params(params)
    ref_mask = mask & numpy_ref.causal_mask(5) if is_causal else mask
    expected, _ = numpy_ref.multi_head_attention(x, x, x, params, 2, ref_mask)
    with torch.no_grad():
        out = module(torch.from_numpy(x), mask=torch.from_numpy(mask), is_causal=is_causal)
        unmasked = module(torch.from_numpy(x), is_causal=is_causal)
    np.testing.assert_allclose(out.numpy(), expected, rtol=0, atol=1e-10)
    causal = numpy_ref.causal_mask(5) if is_causal else None
    expected_unmasked, _ = numpy_ref.multi_head_attention(x, x, x, params, 2, causal)
    np.testing.assert_allclose(unmasked.numpy(), expected_unmasked, rtol=0, atol=1e-10)


@pytest.mark.parametrize("backend", ["eager", "sdpa"])
def test_gradcheck_through_module_with_a_fully_masked_row(backend):
    torch.manual_seed(0)
    module = MultiHeadAttention(4, 2, kdim=3, backend=backend).double()
    query = torch.randn(2, 3, 4, dtype=torch.float64, requires_grad=True)
    key = torch.randn(2, 5, 3, dtype=torch.float64, requires_grad=True)
    value = torch.randn(2, 5, 4, dtype=torch.float64, requires_grad=True)
    mask = torch.rand(2, 1, 3, 5, generator=torch.Generator().manual_seed(0)) < 0.6
    mask[0, 0, 1] = False  # query 1 of sequence 0 may attend nothing
    assert torch.autograd.gradcheck(lambda q, k, v: module(q, k, v, mask=mask), (query, key, value))


class TestDropout:
    """Dropout acts on the attention weights in train() mode only."""

    def pair(self, **kwargs):
        torch.manual_seed(0)
        with_dropout = MultiHeadAttention(D_MODEL, 2, dropout=0.5, **kwargs)
        without = MultiHeadAttention(D_MODEL, 2, **kwargs)
        without.load_state_dict(with_dropout.state_dict())
        return with_dropout, without.eval()

    @pytest.mark.parametrize("backend", ["eager", "sdpa"])
    def test_eval_is_identity(self, backend):
        with_dropout, without = self.pair(backend=backend)
        query, _, _ = inputs()
        with torch.no_grad():
            torch.testing.assert_close(with_dropout.eval()(query), without(query), rtol=0, atol=0)

    @pytest.mark.parametrize("backend", ["eager", "sdpa"])
    def test_train_drops_and_is_reproducible_with_a_seed(self, backend):
        with_dropout, without = self.pair(backend=backend)
        query, _, _ = inputs()
        with torch.no_grad():
            torch.manual_seed(3)
            first = with_dropout.train()(query)
            torch.manual_seed(3)
            second = with_dropout(query)
            assert torch.equal(first, second)
            assert not torch.allclose(first, without(query))

    def test_train_weights_are_dropped_or_rescaled(self):
        with_dropout, without = self.pair()
        query, _, _ = inputs()
        with torch.no_grad():
            torch.manual_seed(0)
            _, dropped = with_dropout.train()(query, return_weights=True)
            _, weights = without(query, return_weights=True)
        assert (dropped == 0).any()
        kept = dropped != 0
        torch.testing.assert_close(dropped[kept] * 0.5, weights[kept])


def counted_validation(monkeypatch) -> collections.Counter:
    """Count every call into validation.py's functions, wherever they were imported (private ones included)."""
    from attention_course import validation

    counts = collections.Counter()
    originals = {f: name for name, f in vars(validation).items()
                 if inspect.isfunction(f) and f.__module__ == validation.__name__}

    def counting(name, f):
        def counted(*args, **kwargs):
            counts[name] += 1
            return f(*args, **kwargs)
        return counted

    wrapped = {f: counting(name, f) for f, name in originals.items()}
    for module in [m for key, m in sys.modules.items() if key.startswith("attention_course")]:
        for attr, value in list(vars(module).items()):
            if inspect.isfunction(value) and value in wrapped:
                monkeypatch.setattr(module, attr, wrapped[value])
    return counts


@pytest.mark.parametrize("backend", ["eager", "sdpa"])
def test_forward_validates_at_the_edge_and_trusts_inside(monkeypatch, backend):
    """One forward with a padding mask and is_causal: at most 12 validation calls (48 before), the mask's dtype
    checked once; a wrong mask still gets the same messages."""
    module = MultiHeadAttention(16, 4, backend=backend).eval()
    x, mask = torch.randn(2, 5, 16), padding_mask([3, 5], 5)
    counts = counted_validation(monkeypatch)
    module(x, mask=mask, is_causal=True)
    assert sum(counts.values()) <= 12 and counts["check_boolean"] == 1, counts
    counts.clear()
    module(x, mask=mask, is_causal=True, return_weights=True)
    assert sum(counts.values()) <= 12, counts
    with pytest.raises(TypeError, match="mask must be boolean"):
        module(x, mask=mask.float())
    with pytest.raises(ValueError, match="does not broadcast to attention scores \\(2, 4, 5, 5\\)"):
        module(x, mask=torch.ones(2, 1, 5, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="query must be 3-D \\(B, T, D\\)"):
        module(x[0])
