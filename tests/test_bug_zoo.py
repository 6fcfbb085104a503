"""Every bug in the zoo is diagnosed with exactly its code; the zoo is readable (docstring code, # BUG marker)."""

import inspect

import pytest

from attention_course import bug_zoo, checks

ALL = (bug_zoo.ZOO + bug_zoo.SINGLE_HEAD_ZOO + bug_zoo.WEIGHT_LAYOUT_ZOO + bug_zoo.KV_CACHE_ZOO + bug_zoo.SEED_ZOO
       + bug_zoo.MODERN_ZOO)


@pytest.mark.parametrize("bug", ALL, ids=lambda b: b.impl.__name__)
def test_each_bug_gets_its_diagnosis(bug):
    check = getattr(checks, bug.check)
    with pytest.raises(AssertionError) as info:
        check(bug.impl)
    assert str(info.value).startswith(f"[{bug.code}] "), str(info.value)


@pytest.mark.parametrize("bug", ALL, ids=lambda b: b.impl.__name__)
def test_each_bug_is_documented_and_marked(bug):
    assert inspect.getdoc(bug.impl).startswith(f"[{bug.code}] ")
    assert "# BUG:" in inspect.getsource(bug.impl)
    assert bug.code in checks.CODES


def test_bugs_maps_codes_to_zoo_entries():
    """BUGS covers ZOO only: chapter 7 lists BUGS one by one, with a symptom for each code."""
    assert set(bug_zoo.BUGS) == {b.code for b in bug_zoo.ZOO}
    kept_apart = (bug_zoo.SINGLE_HEAD_ZOO + bug_zoo.WEIGHT_LAYOUT_ZOO + bug_zoo.KV_CACHE_ZOO + bug_zoo.SEED_ZOO
                  + bug_zoo.MODERN_ZOO)
    assert not set(bug_zoo.BUGS.values()) & {b.impl for b in kept_apart}
    assert not {b.impl for b in bug_zoo.ZOO} & {b.impl for b in kept_apart}
    for code, impl in bug_zoo.BUGS.items():
        assert any(b.code == code and b.impl is impl for b in bug_zoo.ZOO)


def test_the_zoo_base_classes_are_correct(capsys):
    checks.check_multi_head_attention(bug_zoo.ZooMultiHeadAttention)
    checks.check_single_head_attention(bug_zoo.ZooSingleHeadAttention)
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("✓ ZooMultiHeadAttention: ") and out[1].startswith("✓ ZooSingleHeadAttention: ")


def test_wrong_axis_bug_also_masks():
    """Its mask branch is never reached by the check (diagnosed on the first, unmasked case): run it here."""
    import torch

    q = torch.ones(2, 3, 4)
    mask = torch.tensor([[True, False, True]] * 3)
    _, weights = bug_zoo.sdpa_softmax_wrong_axis(q, q, q, mask)
    assert torch.allclose(weights[..., 0].sum(-1), torch.ones(2))  # normalised over the queries, per key
    assert torch.isnan(weights[..., 1]).all()  # a fully masked key column: softmax over -inf only


def test_single_head_wrong_axis_bug_also_masks():
    import torch

    module = bug_zoo.SHASoftmaxWrongAxis(4, 4)
    x = torch.ones(1, 3, 4)
    _, weights = module(x, mask=torch.tensor([[True, False, True]] * 3))
    assert torch.isnan(weights[..., 1]).all()  # a fully masked key column: softmax over -inf only, per key


def test_weight_layout_bugs_fail_with_keys_and_values_of_other_widths():
    """They run with kdim == vdim == d_model (wrong numbers, diagnosed above), and fail otherwise."""
    import torch

    from attention_course import numpy_ref

    params = numpy_ref.init_mha_params(8, kdim=6, vdim=4)
    query, key, value = torch.randn(2, 3, 8), torch.randn(2, 5, 6), torch.randn(2, 5, 4)
    tparams = {name: torch.tensor(a, dtype=torch.float32) for name, a in params.items()}
    with pytest.raises(RuntimeError):
        bug_zoo.mha_params_with_f_linear(query, key, value, tparams, 2)
    with pytest.raises(ValueError, match=r"params\['w_k'\] has shape \(8, 6\), expected \(6, 8\)"):
        bug_zoo.EinsumMHALoadsTransposed(8, 2, kdim=6, vdim=4).load_numpy_params(params)



def test_tiled_kv_heads_are_right_when_a_tile_is_a_repeat():
    """The tiled bugs only show with 1 < H_kv < H: with one key/value head (MQA), or one per query head (n_rep = 1),
    a tile and a repeat are the same."""
    import torch

    from attention_course import kv_cache, scaled_dot_product_attention

    for h_kv, n_rep in ((1, 3), (3, 1)):
        x = torch.randn(2, h_kv, 3, 4)
        assert torch.equal(bug_zoo.repeat_kv_tiled(x, n_rep), kv_cache.repeat_kv(x, n_rep))
    q, k, v = torch.randn(2, 4, 5, 8), torch.randn(2, 1, 5, 8), torch.randn(2, 1, 5, 8)
    out, _ = bug_zoo.gqa_tiled_heads(q, k, v)
    expected, _ = scaled_dot_product_attention(q, kv_cache.repeat_kv(k, 4), kv_cache.repeat_kv(v, 4))
    assert torch.allclose(out, expected)
