"""Chapter 15: every FlexAttention mod equals the course's explicit mask or bias, on shapes drawn at test time."""

import shutil

import numpy as np
import pytest
import torch

from attention_course import flex, masks, modern, positions
from attention_course.checks.tiles import tiles_needed
from attention_course.functional import scaled_dot_product_attention

RNG_SEED = 1515
TOL = {torch.float64: 1e-10, torch.float32: 2e-5}


def _draw(n_cases: int, seed: int = RNG_SEED):
    """(B, H, Tq, Tk, Dk, Dv) drawn from a seeded generator: 1 to 4 heads, Tq < Tk, Tq == Tk and Tq > Tk."""
    rng = np.random.default_rng(seed)
    for n in range(n_cases):
        t_k = int(rng.integers(9, 41))
        t_q = [int(rng.integers(3, t_k)), t_k, int(rng.integers(t_k + 1, t_k + 9))][n % 3]
        yield (int(rng.integers(1, 4)), int(rng.integers(1, 5)), t_q, t_k, int(rng.integers(3, 9)),
               int(rng.integers(2, 7)), rng)


def _qkv(b, h, t_q, t_k, d_k, d_v, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(b, h, t, d, generator=g, dtype=dtype) for t, d in ((t_q, d_k), (t_k, d_k), (t_k, d_v)))


def _explicit_mask_cases(rng, b, t_q, t_k):
    """(mask_mod, the explicit mask it must equal, mod reads b) for one drawn shape."""
    window = int(rng.integers(1, t_k + 1))
    lengths = torch.as_tensor(rng.integers(0, t_k + 1, size=b))
    prefix = int(rng.integers(0, t_k + 1))
    prefixes = torch.as_tensor(rng.integers(0, t_k + 1, size=b))
    doc_ids = torch.as_tensor(np.sort(rng.integers(0, 4, size=(b, t_k)), axis=-1))
    cases = [(flex.causal(t_q, t_k), masks.causal_mask(t_q, t_k), False),
             (flex.sliding_window(window, t_q, t_k), masks.sliding_window_mask(t_q, t_k, window), False),
             (flex.padding(lengths, t_k), masks.padding_mask(lengths, t_k), True),
             (flex.prefix_lm(prefix, t_q, t_k), masks.prefix_lm_mask(t_q, t_k, prefix), False),
             (flex.prefix_lm(prefixes, t_q, t_k), masks.prefix_lm_mask(t_q, t_k, prefixes), True)]
    if t_q <= t_k:
        for causal in (True, False):
            cases += [(flex.document(doc_ids, t_q, is_causal=causal), masks.document_mask(doc_ids, t_q, causal), True),
                      (flex.document(doc_ids[0], t_q, is_causal=causal),
                       masks.document_mask(doc_ids[0], t_q, causal), False)]
    return cases


@pytest.mark.parametrize("case", list(_draw(6)), ids=lambda c: "B{}H{}Tq{}Tk{}".format(*c[:4]))
def test_mask_mods_equal_the_explicit_masks(case):
    b, h, t_q, t_k, _, _, rng = case
    for mod, explicit, _ in _explicit_mask_cases(rng, b, t_q, t_k):
        assert torch.equal(flex.dense_mask(mod, b, h, t_q, t_k), explicit.expand(b, h, t_q, t_k)), mod.__name__


@pytest.mark.cover_first_case
@pytest.mark.parametrize("case", list(_draw(3, seed=RNG_SEED + 1)), ids=lambda c: "B{}H{}Tq{}Tk{}".format(*c[:4]))
def test_flex_attention_with_block_masks_equals_the_explicit_mask(case):
    b, h, t_q, t_k, d_k, d_v, rng = case
    block = int(rng.integers(2, 9))  # small tiles: skipped, partial and full ones in every mask
    for n, (mod, explicit, per_example) in enumerate(_explicit_mask_cases(rng, b, t_q, t_k)):
        bm = flex.block_mask(mod, t_q, t_k, block_size=block, batch=b if per_example else None)
        dtype = (torch.float64, torch.float32)[(n + h) % 2]  # each mod in both dtypes over the drawn cases
        q, k, v = _qkv(b, h, t_q, t_k, d_k, d_v, dtype)
        ours = flex.attention(q, k, v, block_mask=bm)
        ref, _ = scaled_dot_product_attention(q, k, v, explicit)
        assert ours.dtype == dtype and ours.shape == (b, h, t_q, d_v)
        assert (ours - ref).abs().max() < TOL[dtype], mod.__name__


@pytest.mark.cover_first_case
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("case", list(_draw(3, seed=RNG_SEED + 2)), ids=lambda c: "B{}H{}Tq{}Tk{}".format(*c[:4]))
def test_score_mods_equal_the_explicit_biases(case, dtype):
    b, h, t_q, t_k, d_k, d_v, rng = case
    q, k, v = _qkv(b, h, t_q, t_k, d_k, d_v, dtype)
    q = q * 4  # large scores, where the cap bends them
    mask = masks.causal_mask(t_q, t_k)
    bm = flex.block_mask(flex.causal(t_q, t_k), t_q, t_k, block_size=4)
    cap = float(rng.uniform(1.0, 5.0))
    table = torch.as_tensor(rng.standard_normal((h, 2 * int(rng.integers(1, 6)) + 1)), dtype=dtype)
    cases = [(flex.alibi(h, t_q, t_k), positions.attention_with_bias(
                 q, k, v, positions.alibi_bias(h, t_q, t_k, dtype=dtype), mask)[0]),
             (flex.softcap(cap), modern.attend(q, k, v, mask, scale=d_k ** -0.5, softcap=cap)[0]),
             (flex.relative_bias(table, t_q, t_k), positions.attention_with_bias(
                 q, k, v, positions.relative_bias(table, t_q, t_k), mask)[0])]
    for mod, ref in cases:
        assert (flex.attention(q, k, v, block_mask=bm, score_mod=mod) - ref).abs().max() < TOL[dtype], mod.__name__
        assert (flex.dense_attention(q, k, v, flex.causal(t_q, t_k), mod) - ref).abs().max() < TOL[dtype]


def test_alibi_is_one_relative_bias_table():
    h, reach = 5, 40
    slopes = positions.alibi_slopes(h, dtype=torch.float64)
    table = -slopes[:, None] * torch.arange(-reach, reach + 1).abs()
    assert torch.equal(positions.relative_bias(table, 7, 30), positions.alibi_bias(h, 7, 30, dtype=torch.float64))


@pytest.mark.parametrize("case", list(_draw(3, seed=RNG_SEED + 3)), ids=lambda c: "B{}H{}Tq{}Tk{}".format(*c[:4]))
def test_gradients_through_the_mods_equal_the_explicit_ones(case):
    b, h, t_q, t_k, d_k, d_v, rng = case
    window = int(rng.integers(1, t_k + 1))
    table = torch.as_tensor(rng.standard_normal((h, 7)))

    def grads(fn):
        inputs = [x.requires_grad_() for x in (*_qkv(b, h, t_q, t_k, d_k, d_v, torch.float64), table.clone())]
        fn(*inputs).pow(2).sum().backward()
        return [x.grad for x in inputs]

    ours = grads(lambda q, k, v, t: flex.dense_attention(
        q, k, v, flex.sliding_window(window, t_q, t_k), flex.relative_bias(t, t_q, t_k)))
    ref = grads(lambda q, k, v, t: positions.attention_with_bias(
        q, k, v, positions.relative_bias(t, t_q, t_k), masks.sliding_window_mask(t_q, t_k, window))[0])
    for g, r in zip(ours, ref, strict=True):
        assert torch.allclose(g, r, atol=1e-10, rtol=1e-9)


def test_flex_has_no_cpu_backward_and_says_what_to_do():
    q, k, v = _qkv(1, 2, 8, 8, 4, 4, torch.float64)
    with pytest.raises(NotImplementedError, match="dense_attention"):
        flex.attention(q.requires_grad_(), k, v)


@pytest.mark.parametrize("seed", range(4))
def test_block_mask_tiles_equal_chapter_9s_tiles_needed(seed):
    rng = np.random.default_rng([RNG_SEED, seed])
    t = int(rng.integers(20, 90))
    window, block = int(rng.integers(1, t + 1)), int(rng.integers(2, 17))
    bm = flex.block_mask(flex.sliding_window(window, t), t, block_size=block)
    states = flex.tile_states(bm)
    assert flex.tiles_computed(bm) == tiles_needed(t, window, block)
    assert torch.equal(states > 0, bm.to_dense().bool())  # partial + full = every computed tile
    dense = masks.sliding_window_mask(t, t, window)
    for a in range(states.size(-2)):
        for c in range(states.size(-1)):
            tile = dense[a * block:(a + 1) * block, c * block:(c + 1) * block]
            inside = (a + 1) * block <= t and (c + 1) * block <= t  # an edge tile counts as partial
            assert int(states[0, 0, a, c]) == (2 if tile.all() and inside else 1 if tile.any() else 0)


def test_per_example_block_masks_count_every_example():
    lengths = torch.tensor([3, 16, 0])
    bm = flex.block_mask(flex.padding(lengths, 16), 16, block_size=4, batch=3)
    assert flex.tile_states(bm).shape == (3, 1, 4, 4)
    assert flex.tiles_computed(bm) == 4 * (1 + 4 + 0)  # every query block sees key blocks that hold a kept key


def test_and_masks_is_combine_masks():
    mod = flex.and_masks(flex.causal(6, 9), flex.padding(torch.tensor([4, 9]), 9))
    explicit = masks.combine_masks(masks.causal_mask(6, 9), masks.padding_mask(torch.tensor([4, 9]), 9))
    assert torch.equal(flex.dense_mask(mod, 2, 1, 6, 9), explicit.expand(2, 1, 6, 9))


@pytest.mark.parametrize("call, error, match", [
    (lambda: flex.sliding_window(0, 8), ValueError, "window"),
    (lambda: flex.sliding_window(2.0, 8), TypeError, "window"),
    (lambda: flex.causal(8, 0), ValueError, "t_k"),
    (lambda: flex.padding(torch.tensor([3.0]), 8), TypeError, "lengths"),
    (lambda: flex.padding(torch.tensor([9]), 8), ValueError, "lengths"),
    (lambda: flex.prefix_lm(-1, 8), ValueError, "prefix_lengths"),
    (lambda: flex.prefix_lm(torch.tensor([9]), 8), ValueError, "lengths"),
    (lambda: flex.document(torch.zeros(8), 4), TypeError, "doc_ids"),
    (lambda: flex.document(torch.zeros(2, 2, 8, dtype=torch.long)), ValueError, "doc_ids"),
    (lambda: flex.document(torch.zeros(8, dtype=torch.long), 9), ValueError, "t_q=9"),
    (lambda: masks.document_mask(torch.zeros(8, dtype=torch.long), 9), ValueError, "t_q=9"),
    (lambda: masks.prefix_lm_mask(4, 8, -2), ValueError, "prefix_lengths"),
    (lambda: flex.softcap(0.0), ValueError, "cap"),
    (lambda: flex.softcap("30"), TypeError, "cap"),
    (lambda: flex.alibi(0, 8), ValueError, "num_heads"),
    (lambda: flex.relative_bias(torch.zeros(2, 4), 8), ValueError, "2M \\+ 1"),
    (lambda: flex.relative_bias(torch.zeros(2, 5, dtype=torch.long), 8), TypeError, "table"),
    (lambda: flex.and_masks(), TypeError, "mask_mod"),
    (lambda: flex.block_mask(None, 8), TypeError, "mask_mod"),
    (lambda: flex.block_mask(flex.causal(8), 8, block_size=0), ValueError, "block_size"),
    (lambda: flex.block_mask(flex.causal(8), 8, batch=0), ValueError, "batch"),
    (lambda: flex.tile_states(torch.ones(2, 2)), TypeError, "BlockMask"),
    (lambda: flex.dense_mask(lambda b, h, q, kv: (q - kv).float(), 1, 1, 4, 4), TypeError, "boolean"),
    (lambda: flex.attention(*_qkv(1, 2, 8, 8, 4, 4, torch.float32)[:2], torch.ones(1, 2, 8, 4).double()), TypeError,
     "dtype"),
    (lambda: flex.attention(torch.ones(2, 8, 4), torch.ones(2, 8, 4), torch.ones(2, 8, 4)), ValueError, "4-D"),
    (lambda: flex.attention(torch.ones(1, 1, 8, 4), torch.ones(1, 3, 8, 4), torch.ones(1, 3, 8, 4)), ValueError,
     "share \\(B, H\\)"),
    (lambda: flex.attention(*_qkv(1, 2, 8, 8, 4, 4, torch.float32), block_mask=masks.causal_mask(8)), TypeError,
     "BlockMask"),
    (lambda: flex.attention(*_qkv(1, 2, 8, 8, 4, 4, torch.float32), block_mask=flex.block_mask(flex.causal(6), 6)),
     ValueError, "built for"),
    (lambda: flex.attention(*_qkv(1, 2, 8, 8, 4, 4, torch.float64), compiled=True), TypeError, "float64"),
])
def test_bad_input_gets_a_clear_error(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_missing_compiler_is_named(monkeypatch):
    from torch._inductor import config

    monkeypatch.setenv("CXX", "no-such-compiler")
    with config.patch({"cpp.cxx": (None, "no-such-g++")}), pytest.raises(RuntimeError, match="apt-get install g"):
        flex.check_compiler()
    assert shutil.which(flex.check_compiler())  # restored: the compiler this machine and CI have


def test_a_python_if_on_the_indices_is_refused():
    def branching(b, h, q_idx, kv_idx):
        if q_idx >= kv_idx:  # data-dependent control flow: the mod must use tensor operations
            return torch.tensor(True)
        return torch.tensor(False)

    with pytest.raises(RuntimeError, match="data-dependent control flow"):
        flex.block_mask(branching, 8)


def test_platforms_without_the_compiled_kernel_are_named(monkeypatch):
    q, k, v = _qkv(1, 2, 8, 8, 4, 4, torch.float32)
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")
    assert "AVX2" in flex.compiled_unsupported_reason()
    with pytest.raises(RuntimeError, match="compiled=False"):
        flex.attention(q, k, v, compiled=True)
    monkeypatch.setattr(flex.sys, "platform", "darwin")
    assert "macOS" in flex.compiled_unsupported_reason()


@pytest.fixture(scope="module")
def compiled_run():
    """One compilation for the module: window 24 over T=96, tiles of 32, float32."""
    if flex.compiled_unsupported_reason():
        pytest.skip(flex.compiled_unsupported_reason())
    t, window = 96, 24
    q, k, v = _qkv(1, 3, t, t, 16, 16, torch.float32, seed=3)
    bm = flex.block_mask(flex.sliding_window(window, t), t, block_size=32)
    before = flex.graphs_compiled()
    out = flex.attention(q, k, v, block_mask=bm, score_mod=flex.softcap(4.0), compiled=True)
    return q, k, v, bm, out, flex.graphs_compiled() - before, masks.sliding_window_mask(t, t, window)


def test_compiled_equals_eager_and_explicit(compiled_run):
    q, k, v, bm, out, compiled, mask = compiled_run
    ref = modern.attend(q.double(), k.double(), v.double(), mask, scale=0.25, softcap=4.0)[0]
    assert compiled >= 1
    assert (out.double() - ref).abs().max() < 1e-5
    assert (flex.attention(q, k, v, block_mask=bm, score_mod=flex.softcap(4.0)) - out).abs().max() < 1e-5


def test_same_shapes_and_values_reuse_the_kernel(compiled_run):
    q, k, v, bm, out, _, _ = compiled_run
    before = flex.graphs_compiled()
    again = flex.attention(q * 2, k, v, block_mask=bm, score_mod=flex.softcap(4.0), compiled=True)
    assert flex.graphs_compiled() == before and again.shape == out.shape
