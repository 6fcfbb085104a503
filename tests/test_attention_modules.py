"""One contract for every attention module of the course: shapes, masks, defaults, dropout, errors, and equality with
PyTorch's SDPA on the module's own projections (float64, d_in != d_out, Tq != Tk, several head counts).

The modules' own tests (test_single_head.py, test_multi_head.py, test_einsum.py, test_kv_cache.py, ...) keep what
only that module has (torch and NumPy weight layouts, the loop over heads, the cache, GQA)."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F

from attention_course import EinsumMultiHeadAttention, MultiHeadAttention, SingleHeadAttention, causal_mask
from attention_course.fused import FusedSelfAttention
from attention_course.heads import merge_heads, split_heads
from attention_course.kv_cache import CausalSelfAttention

D = 8


@dataclass
class Spec:
    """How to build and call one module: ``make(num_heads, **options)``; ``cross``: takes key and value inputs;
    ``mask``: takes a boolean mask; ``causal``: "flag" (is_causal=), "always" (causal by construction) or None."""

    make: Callable
    cross: bool = True
    mask: bool = True
    causal: str | None = "flag"
    heads: tuple[int, ...] = (1, 2, 4)


SPECS = {
    "single_head": Spec(lambda h, **kw: SingleHeadAttention(D, 6, **kw), causal=None, heads=(1,)),
    "multi_head": Spec(lambda h, **kw: MultiHeadAttention(D, h, **kw)),
    "multi_head_sdpa": Spec(lambda h, **kw: MultiHeadAttention(D, h, backend="sdpa", **kw)),
    "einsum": Spec(lambda h, **kw: EinsumMultiHeadAttention(D, h, **kw)),
    "fused": Spec(lambda h, **kw: FusedSelfAttention(D, h, **kw), cross=False),
    "cached_causal": Spec(lambda h, **kw: CausalSelfAttention(D, h, **kw), cross=False, mask=False, causal="always"),
    "cached_causal_separate": Spec(lambda h, **kw: CausalSelfAttention(D, h, fused_qkv=False, backend="eager", **kw),
                                   cross=False, mask=False, causal="always"),
}
CAUSAL = {"flag": (False, True), "always": (True,), None: (False,)}  # the variants each module has
CASES = [(name, h, causal) for name, spec in SPECS.items() for h in spec.heads for causal in CAUSAL[spec.causal]]


def build(name, num_heads=2, **options):
    torch.manual_seed(0)
    return SPECS[name].make(num_heads, **options).double().eval()


def call(name, module, query, key=None, mask=None, causal=False):
    """The module's output for query (B, Tq, D) [and key = value (B, Tk, D)], a mask and causality."""
    spec = SPECS[name]
    kwargs = {"mask": mask} if mask is not None else {}
    if causal and spec.causal == "flag":
        kwargs["is_causal"] = True
    if key is None or not spec.cross:
        return module(query, **kwargs)
    return module(query, key, key, **kwargs)


def reference(module, query, key, mask):
    """PyTorch's SDPA on the module's own projections (y = x @ W + b), float64; mask (…, Tq, Tk) True = may attend."""
    if isinstance(module, SingleHeadAttention):
        w = {n: getattr(module, f"w_{n}") for n in "qkv"}
        q, k, v = (x @ w[n].weight.T + w[n].bias for n, x in zip("qkv", (query, key, key), strict=True))
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    p = {name: torch.as_tensor(value) for name, value in module.numpy_params().items()}
    h = module.num_heads
    q, k, v = (split_heads(x @ p[f"w_{n}"] + p[f"b_{n}"], h) for n, x in zip("qkv", (query, key, key), strict=True))
    heads = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (B, H, Tq, Dh)
    return merge_heads(heads) @ p["w_o"] + p["b_o"]


def inputs(t_q=5, t_k=7, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(3, t_q, D, generator=g, dtype=torch.float64), torch.randn(3, t_k, D, generator=g,
                                                                                 dtype=torch.float64)


@pytest.mark.parametrize(("name", "num_heads", "causal"), CASES)
def test_self_attention_equals_sdpa(name, num_heads, causal):
    module = build(name, num_heads)
    x, _ = inputs()
    mask = causal_mask(5) if causal else None
    with torch.no_grad():
        out = call(name, module, x, causal=causal)
        torch.testing.assert_close(out, reference(module, x, x, mask), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(("name", "num_heads", "causal"), [case for case in CASES if SPECS[case[0]].cross])
def test_cross_attention_with_a_mask_equals_sdpa(name, num_heads, causal):
    """Tq = 5 queries over Tk = 7 keys, a padding mask per example (no row fully masked), causal bottom-right."""
    module = build(name, num_heads)
    query, key = inputs()
    lengths = torch.tensor([7, 6, 7])
    mask = (torch.arange(7) < lengths[:, None])[:, None, :]  # (B, 1, Tk) -> one mask per example
    full = mask & causal_mask(5, 7) if causal else mask
    per_module = full if isinstance(module, SingleHeadAttention) else full[:, None]  # (B, [1,] Tq, Tk)
    with torch.no_grad():
        out = call(name, module, query, key, mask=mask.expand(3, 5, 7), causal=causal)
        torch.testing.assert_close(out, reference(module, query, key, per_module), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", SPECS)
def test_output_shape(name):
    module = build(name)
    query, key = inputs()
    with torch.no_grad():
        out = call(name, module, query, key)
    d_out = 6 if name == "single_head" else D
    assert out.shape == (3, 5, d_out)


@pytest.mark.parametrize("name", [n for n in SPECS if SPECS[n].cross])
def test_key_and_value_default_to_self_attention(name):
    module = build(name)
    query, key = inputs()
    with torch.no_grad():
        assert torch.equal(module(query), module(query, query, query))
        assert torch.equal(module(query, key), module(query, key, key))


@pytest.mark.parametrize("name", [n for n in SPECS if SPECS[n].mask])
def test_a_fully_masked_row_gives_a_defined_output(name):
    """A query that may attend no key gets zero weights: its output is finite (the output bias), never NaN."""
    module = build(name)
    x, _ = inputs(t_q=4, t_k=4)
    mask = torch.ones(4, 4, dtype=torch.bool)
    mask[2] = False
    with torch.no_grad():
        out = module(x, mask=mask)
    assert torch.isfinite(out).all()
    if isinstance(getattr(module, "w_o", None), torch.nn.Linear):  # zero weights: the output projection's bias
        torch.testing.assert_close(out[:, 2], module.w_o.bias.expand(3, D))


@pytest.mark.parametrize("name", SPECS)
def test_dropout_only_in_train_mode(name):
    module = build(name, dropout=0.5)
    plain = build(name)
    plain.load_state_dict(module.state_dict())
    x, _ = inputs(t_q=6, t_k=6)
    with torch.no_grad():
        torch.testing.assert_close(module(x), plain(x), rtol=0, atol=0)
        torch.manual_seed(0)
        assert not torch.allclose(module.train()(x), plain(x))


@pytest.mark.parametrize("name", SPECS)
def test_input_errors_name_the_argument(name):
    module = build(name).float()
    x = torch.randn(2, 3, D)
    with pytest.raises(TypeError, match=re.escape("query must be a torch.Tensor, got ndarray: convert it with "
                                                  "torch.from_numpy")):
        module(x.numpy())
    with pytest.raises(TypeError, match=re.escape("query must be a floating-point tensor, got torch.int64")):
        module(torch.ones(2, 3, D, dtype=torch.int64))
    with pytest.raises(TypeError, match=re.escape("query is torch.float64, but the module's weights are "
                                                  "torch.float32")):
        module(x.double())
    with pytest.raises(ValueError, match=re.escape("query must be 3-D (B, T, D), got shape (3, 8)")):
        module(x[0])
    with pytest.raises(ValueError, match="query has 5 features, but the query projection expects 8"):
        module(torch.randn(2, 3, 5))
