"""Hidden cases (issue 17, item 4): code that is wrong only outside the public cases passes the public checks
and is caught, with the mistake named, once the grader switches the hidden cases on; right code passes them for
every seed."""

import numpy as np
import pytest
import torch

from attention_course import block, checks, numpy_ref
from attention_course.checks import hidden
from attention_course.multi_head import MultiHeadAttention
from attention_course.single_head import SingleHeadAttention
from attention_impls import stream

SEEDS = [0, 1, 12345]


@pytest.fixture
def grading():
    def enable(seed):
        hidden.enable(seed)

    yield enable
    hidden.disable()


def _code(check, fn, **kw):
    try:
        check(fn, **kw)
    except checks.CheckFailed as err:
        return err.code
    return None


def global_max_softmax(x):
    e = np.exp(x - x.max())
    return e / e.sum(axis=-1, keepdims=True)


def softmax_small_only(x):
    return numpy_ref.softmax(x) if x.size <= 60 else np.full_like(x, 1.0 / x.shape[-1])


def sdpa_zeros_when_long(q, k, v, mask=None):
    out, _ = numpy_ref.scaled_dot_product_attention(q, k, v, mask)
    return out if q.shape[-2] <= 9 else np.zeros_like(out)


def sdpa_first_mask_row(q, k, v, mask=None):
    """Uses example 0's mask for every example when the batch has 5 or more."""
    if mask is not None and q.ndim == 3 and q.shape[0] >= 5 and mask.ndim == 3 and mask.shape[0] == q.shape[0]:
        mask = np.broadcast_to(mask[:1], mask.shape)
    return numpy_ref.scaled_dot_product_attention(q, k, v, mask)[0]


def causal_top_left_when_taller(t_q, t_k=None):
    t_k = t_q if t_k is None else t_k
    if t_q > t_k:
        return torch.ones(t_q, t_k, dtype=torch.bool).tril()
    return torch.from_numpy(numpy_ref.causal_mask(t_q, t_k))


def padding_first_five(lengths, t):
    lengths = lengths.clone()
    if len(lengths) >= 5:
        lengths[4:] = lengths[0]
    return (torch.arange(t)[None, :] < lengths[:, None])[:, None, None, :]


WRONG = [
    (checks.check_softmax, global_max_softmax, {}, "softmax-global-max"),
    (checks.check_softmax, softmax_small_only, {}, "wrong-output"),
    (checks.check_numpy_attention, sdpa_zeros_when_long, {}, "wrong-output"),
    (checks.check_numpy_attention, sdpa_first_mask_row, {}, "wrong-output"),
    (checks.check_causal_mask, causal_top_left_when_taller, {}, "causal-top-left-aligned"),
    (checks.check_padding_mask, padding_first_five, {}, "wrong-output"),
]


@pytest.mark.parametrize("check, fn, kw, code", WRONG, ids=[w[1].__name__ for w in WRONG])
def test_public_cases_miss_it_hidden_cases_name_it(grading, check, fn, kw, code):
    assert _code(check, fn, **kw) is None  # the public cases alone let it pass: why hidden cases are needed
    for seed in SEEDS:
        grading(seed)
        assert _code(check, fn, **kw) == code, seed


def test_global_max_softmax_is_nan_on_the_issue_example():
    with np.errstate(all="ignore"):
        assert np.isnan(global_max_softmax(np.array([[0.0, 1.0], [2000.0, 2001.0]]))).any()


def _torch_sdpa(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    return weights @ v, weights


def _padding(lengths, t):
    return (torch.arange(t)[None, :] < lengths[:, None])[:, None, None, :]


RIGHT = [
    (checks.check_softmax, numpy_ref.softmax, {}),
    (checks.check_attention_one_query,
     lambda q, k, v: tuple(a[0] for a in numpy_ref.scaled_dot_product_attention(q[None], k, v)), {}),
    (checks.check_streaming_attention, stream, {}),  # one key per step (the check counts the reads)
    (checks.check_numpy_attention, lambda q, k, v, mask=None: numpy_ref.scaled_dot_product_attention(q, k, v, mask),
     {"fully_masked_rows": True}),
    (checks.check_scaled_dot_product_attention, _torch_sdpa, {}),
    (checks.check_causal_mask, lambda t_q, t_k=None: numpy_ref.causal_mask(t_q, t_k), {}),
    (checks.check_padding_mask, _padding, {}),
]


@pytest.mark.parametrize("seed", SEEDS)
def test_right_code_passes_the_hidden_cases(grading, seed, capsys):
    grading(seed)
    for check, fn, kw in RIGHT:
        check(fn, **kw)
    assert capsys.readouterr().out.count("✓") == len(RIGHT)


def test_the_seed_is_checked():
    with pytest.raises(ValueError, match="seed"):
        hidden.enable(-1)
    with pytest.raises(ValueError, match="seed"):
        hidden.enable(1.5)
    assert not hidden.active()


def softmax_keeps_the_input_dtype(x):
    out = np.empty_like(x)
    out[...] = numpy_ref.softmax(x)
    return out


def test_an_integer_input_is_among_the_hidden_cases(grading):
    assert _code(checks.check_softmax, softmax_keeps_the_input_dtype) is None
    grading(0)
    assert _code(checks.check_softmax, softmax_keeps_the_input_dtype) == "wrong-output"


def test_the_grader_switches_them_on_only_while_it_grades():
    with hidden.drawn_from(5):
        assert hidden.active()
        with hidden.drawn_from(6):
            assert hidden.active()
        assert hidden.active()
    assert not hidden.active()


def sdpa_float_keys(q, k, v, mask=None):
    """Turns the keys into float32 (as code that converts one input with .float() does): fine while every input is
    float32, a dtype error once the grader sends float64 tensors."""
    return _torch_sdpa(q, k.float(), v, mask)


def test_the_hidden_cases_send_the_other_dtype(grading):
    assert _code(checks.check_scaled_dot_product_attention, sdpa_float_keys) is None
    grading(0)
    assert _code(checks.check_scaled_dot_product_attention, sdpa_float_keys) == "raised-exception"
    seen = set()

    def numpy_attention(q, k, v, mask=None):
        seen.add(q.dtype)
        return numpy_ref.scaled_dot_product_attention(q, k, v, mask)[0]

    checks.check_numpy_attention(numpy_attention)
    assert seen == {np.dtype(np.float64), np.dtype(np.float32)}


class FirstMaskWhenLarge(MultiHeadAttention):
    """Uses example 0's mask for the whole batch once it has 5 examples or more."""

    def forward(self, query, key, value, mask=None):
        if mask is not None and mask.dim() == 4 and mask.shape[0] >= 5:
            mask = mask[:1]
        return super().forward(query, key, value, mask)


class PreLNBlock(block.EncoderBlock):
    def __init__(self, d_model, num_heads, d_ff, dropout=0.0):
        super().__init__(d_model, num_heads, d_ff, dropout, norm_first=True)


class FeedForward(block.FeedForward):
    def __init__(self, d_model, d_ff, dropout=0.0):
        super().__init__(d_model, d_ff, "relu", dropout)


def test_module_checks_add_a_hidden_size(grading, capsys):
    """The module checks add a size of their own (more heads, a batch of 5 or more with a padding mask per
    example): a module that is wrong only there passes the public cases and fails the hidden ones; right modules
    pass them."""
    assert _code(checks.check_multi_head_attention, FirstMaskWhenLarge) is None
    public = capsys.readouterr().out
    grading(SEEDS[1])
    assert _code(checks.check_multi_head_attention, FirstMaskWhenLarge) is not None
    checks.check_multi_head_attention(MultiHeadAttention)
    checks.check_single_head_attention(SingleHeadAttention)
    checks.check_pre_ln_block(PreLNBlock)
    checks.check_feed_forward(FeedForward)
    graded = capsys.readouterr().out
    assert "(2 sizes;" in public and "(3 sizes;" in graded and graded.count("✓") == 4


def test_topics_are_named_and_keep_their_draws():
    """The topics' numbers are part of what the grader draws: renumbering one would change every hidden case."""
    values = [t.value for t in hidden.Topic]
    assert values == list(range(1, len(values) + 1))  # 12 to 15: chapters 15 to 18, in the order they landed
    with hidden.drawn_from(0):
        assert hidden.window_sizes() == [(23, 5, 6)]
        assert hidden.mha_sizes() == [(20, 5, 6, 11, 9)]
