"""Chapter 14's checks: right solutions pass (public and hidden cases); each planted mistake gets its code."""

import math

import pytest
import torch

from attention_course import checks, modern
from attention_course.checks import hidden
from attention_course.checks.questions import QUESTIONS
from attention_course.masks import causal_mask, sliding_window_mask
from attention_course.positions import apply_rope


def softcap_attention(q, k, v, cap):
    t = q.size(-2)
    return modern.attend(q, k, v, causal_mask(t), scale=q.size(-1) ** -0.5, softcap=cap)


def qk_norm_rope(x, positions, weight, eps, pairing="halves"):
    normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight
    return apply_rope(normed, positions, pairing=pairing)


def sink_attention(q, k, v, sinks, window, shift=0):
    t = q.size(-2)
    return modern.attend(q, k, v, sliding_window_mask(t, t, window + shift), scale=q.size(-1) ** -0.5, sinks=sinks)


def absorbed_scores(q_nope, c, w_uk):
    return (q_nope @ w_uk) @ c[:, None].transpose(-2, -1)


def _code(check, fn):
    with pytest.raises(checks.CheckFailed) as info:
        check(fn)
    return info.value.code


@pytest.mark.parametrize("check, fn", [
    (checks.check_softcap_attention, softcap_attention),
    (checks.check_qk_norm_rope, qk_norm_rope),
    (checks.check_sink_attention, sink_attention),
    (checks.check_absorbed_scores, absorbed_scores),
])
@pytest.mark.parametrize("seed", [None, 0, 7])
def test_right_solutions_pass(check, fn, seed, capsys):
    if seed is not None:
        hidden.enable(seed)
    try:
        check(fn)
    finally:
        hidden.disable()
    assert capsys.readouterr().out.startswith(f"✓ {fn.__name__}: ")


def test_output_only_is_accepted(capsys):
    checks.check_sink_attention(lambda q, k, v, sinks, window: sink_attention(q, k, v, sinks, window)[0])
    assert capsys.readouterr().out.startswith("✓ ")


@pytest.mark.parametrize("shift", [1, -1])
def test_window_off_by_one(shift):
    code = _code(checks.check_sink_attention, lambda q, k, v, s, w: sink_attention(q, k, v, s, w, shift=shift)
                 if w + shift >= 1 else sink_attention(q, k, v, s, w))
    assert code == "window-off-by-one"


def test_interleaved_pairing_is_named():
    assert _code(checks.check_qk_norm_rope, lambda x, p, w, e: qk_norm_rope(x, p, w, e, "interleaved")) == \
        "rope-wrong-pairing"


def test_no_cap_and_no_norm_are_wrong_output():
    def no_cap(q, k, v, cap):
        return softcap_attention(q, k, v, 1e9)

    assert _code(checks.check_softcap_attention, no_cap) == "wrong-output"
    assert _code(checks.check_qk_norm_rope, lambda x, p, w, e: apply_rope(x, p, pairing="halves")) == "wrong-output"


def test_unscaled_absorbed_scores_are_wrong():
    assert _code(checks.check_absorbed_scores, lambda q, c, w: 2 * absorbed_scores(q, c, w)) == "wrong-output"


def test_hidden_sink_case_catches_code_that_only_works_on_few_heads():
    def few_heads_only(q, k, v, sinks, window):
        if q.size(1) > 4:
            return sink_attention(q, k, v, torch.zeros_like(sinks) - 1e4, window)
        return sink_attention(q, k, v, sinks, window)

    checks.check_sink_attention(few_heads_only)  # the public cases have 1 to 4 heads
    sizes = [hidden.sink_sizes() for seed in range(20) if not hidden.enable(seed)]
    hidden.disable()
    assert all(1 < w < t and h >= 3 for ((h, t, w),) in sizes)
    caught = 0
    for seed in range(20):
        with hidden.drawn_from(seed):
            if hidden.sink_sizes()[0][0] > 4:
                assert _code(checks.check_sink_attention, few_heads_only) == "sink-ignored"
                caught += 1
    assert caught


def test_gemma3_cache_question_matches_the_library():
    per_layer_token = 2 * 8 * 256 * 2
    assert QUESTIONS["14.gemma3-cache"].answer() == per_layer_token * (8 * 32768 + 40 * 1024) / 2**20 == 2368
    assert math.isclose(2368 / 12288, 0.193, rel_tol=1e-2)
