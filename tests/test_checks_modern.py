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


def olmo2_qk_norm(x, positions, weight, n_heads, eps, per_head=False, pairing="halves"):
    b, t, width = x.shape
    if per_head:
        x = x.view(b, t, n_heads, -1)
        weight = weight.view(n_heads, -1)
    normed = (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight).reshape(b, t, width)
    return apply_rope(normed.view(b, t, n_heads, -1).transpose(1, 2), positions, pairing=pairing)


def absorbed_output(weights, c, w_uv, w_o):
    h, v_dim, _ = w_uv.shape
    w_o_heads = w_o.view(w_o.size(0), h, v_dim).transpose(0, 1)  # (H, D, V)
    folded = w_uv.transpose(-2, -1) @ w_o_heads.transpose(-2, -1)  # (H, C, D)
    return ((weights @ c[:, None]) @ folded).sum(1)


def _code(check, fn):
    with pytest.raises(checks.CheckFailed) as info:
        check(fn)
    return info.value.code


@pytest.mark.parametrize("check, fn", [
    (checks.check_softcap_attention, softcap_attention),
    (checks.check_qk_norm_rope, qk_norm_rope),
    (checks.check_sink_attention, sink_attention),
    (checks.check_absorbed_scores, absorbed_scores),
    (checks.check_olmo2_qk_norm, olmo2_qk_norm),
    (checks.check_absorbed_output, absorbed_output),
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


def test_hidden_cases_of_the_new_checks_have_more_heads():
    def few_heads_only(check_fn, heads_of):
        def fn(*args):
            out = check_fn(*args)
            return out + 1 if heads_of(*args) > 4 else out
        return fn

    olmo = few_heads_only(olmo2_qk_norm, lambda x, p, w, h, e: h)
    absorbed = few_heads_only(absorbed_output, lambda a, c, u, o: u.size(0))
    checks.check_olmo2_qk_norm(olmo)  # the public cases have 1 to 4 heads
    checks.check_absorbed_output(absorbed)
    caught = 0
    for seed in range(20):
        with hidden.drawn_from(seed):
            if hidden.sink_sizes()[0][0] > 4:
                assert _code(checks.check_olmo2_qk_norm, olmo) == "wrong-output"
                assert _code(checks.check_absorbed_output, absorbed) == "wrong-output"
                caught += 1
    assert caught


def test_sink_logit_and_softcap_gradient_answers():
    z = QUESTIONS["14.sink-logit"].answer()
    scores = torch.tensor([1.0, 2.0, 0.5, z], dtype=torch.float64)
    assert math.isclose(scores.softmax(0)[:3].sum().item(), 0.6, rel_tol=1e-9)
    s = torch.tensor(150.0, dtype=torch.float64, requires_grad=True)
    (50 * torch.tanh(s / 50)).backward()
    assert math.isclose(QUESTIONS["14.softcap-gradient"].answer(), s.grad.item(), rel_tol=1e-9)


def test_gemma3_cache_question_matches_the_library():
    per_layer_token = 2 * 8 * 256 * 2
    assert QUESTIONS["14.gemma3-cache"].answer() == per_layer_token * (8 * 32768 + 40 * 1024) / 2**20 == 2368
    assert math.isclose(2368 / 12288, 0.193, rel_tol=1e-2)


# ----------------------------------------------------------------------------------------------------------
# The registry's tables (tests/test_checks_planted.py)
# ----------------------------------------------------------------------------------------------------------


def softcap_by_einsum(q, k, v, cap):
    """Another style: einsum scores, the cap and the mask through torch.where, the output only."""
    t = q.size(-2)
    scores = torch.einsum("...qd,...kd->...qk", q, k) / math.sqrt(q.size(-1))
    allowed = torch.arange(t)[None, :] <= torch.arange(t)[:, None]
    scores = torch.where(allowed, cap * torch.tanh(scores / cap), torch.tensor(-math.inf))
    return torch.einsum("...qk,...kd->...qd", scores.softmax(-1), v)


def softcap_after_mask(q, k, v, cap):
    t = q.size(-2)
    scores = (q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))).masked_fill(~causal_mask(t), -math.inf)
    weights = (cap * torch.tanh(scores / cap)).softmax(-1)  # THE BUG: tanh(-inf) = -1, the mask undone
    return weights @ v, weights


def softcap_clamped(q, k, v, cap):
    """A hard clamp instead of the smooth tanh."""
    t = q.size(-2)
    scores = (q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))).clamp(-cap, cap)
    weights = scores.masked_fill(~causal_mask(t), -math.inf).softmax(-1)
    return weights @ v, weights


def qk_norm_functional(x, positions, weight, eps):
    """Another style: F.rms_norm, then the halves rotation with rotate_half."""
    normed = torch.nn.functional.rms_norm(x, (x.size(-1),), weight, eps)
    dh = x.size(-1)
    theta = 10000.0 ** (-torch.arange(0, dh, 2, dtype=torch.float64) / dh)
    angles = torch.cat([positions.double()[:, None] * theta] * 2, dim=-1)  # (T, Dh): each angle twice
    rotated_half = torch.cat([-normed[..., dh // 2:], normed[..., : dh // 2]], dim=-1)
    return normed * angles.cos().float() + rotated_half * angles.sin().float()


def sink_by_logsumexp(q, k, v, sinks, window):
    """Another style: the sink folded into the normaliser with logaddexp; the output only."""
    t = q.size(-2)
    i, j = torch.arange(t)[:, None], torch.arange(t)[None, :]
    scores = (q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))).masked_fill((i - j < 0) | (i - j >= window), -math.inf)
    normaliser = torch.logaddexp(scores.logsumexp(-1, keepdim=True), sinks[:, None, None])
    return torch.exp(scores - normaliser) @ v


def absorbed_by_einsum(q_nope, c, w_uk):
    """Another style: two einsums, the query moved into the latent space first."""
    q_latent = torch.einsum("bhtn,hnc->bhtc", q_nope, w_uk)
    return torch.einsum("bhtc,bsc->bhts", q_latent, c)


def scores_from_formed_keys(q_nope, c, w_uk):
    keys = c[:, None] @ w_uk.transpose(-2, -1)  # THE BUG: (B, H, T, N) keys formed
    return q_nope @ keys.transpose(-2, -1)


def scores_from_keys_per_head(q_nope, c, w_uk):
    heads = [q_nope[:, h] @ (c @ w_uk[h].T).transpose(-2, -1) for h in range(w_uk.size(0))]  # each head's keys
    return torch.stack(heads, dim=1)


def sinks_with_value_einsum(q, k, v, sinks, window):
    out, weights = sink_attention(q, k, v, sinks, window)
    sink_share = 1 - weights.sum(-1, keepdim=True)
    return out + sink_share * v[..., :1, :], weights  # THE BUG: the sink's weight given to the first value


def olmo2_by_rms_norm(x, positions, weight, n_heads, eps):
    """Another style: F.rms_norm over the whole width, the heads split with unflatten, rotate_half by hand."""
    normed = torch.nn.functional.rms_norm(x, (x.size(-1),), weight, eps)
    heads = normed.unflatten(-1, (n_heads, -1)).permute(0, 2, 1, 3)  # (B, H, T, Dh)
    dh = heads.size(-1)
    theta = 10000.0 ** (-torch.arange(0, dh, 2, dtype=torch.float64) / dh)
    angles = torch.cat([positions.double()[:, None] * theta] * 2, dim=-1)  # (T, Dh)
    rotated_half = torch.cat([-heads[..., dh // 2:], heads[..., : dh // 2]], dim=-1)
    return heads * angles.cos().float() + rotated_half * angles.sin().float()


def olmo2_rope_first(x, positions, weight, n_heads, eps):
    b, t, width = x.shape
    rotated = apply_rope(x.view(b, t, n_heads, -1).transpose(1, 2), positions, pairing="halves")
    flat = rotated.transpose(1, 2).reshape(b, t, width)  # THE BUG: the norm after the rotation
    normed = flat * torch.rsqrt(flat.pow(2).mean(-1, keepdim=True) + eps) * weight
    return normed.view(b, t, n_heads, -1).transpose(1, 2)


def absorbed_output_by_einsum(weights, c, w_uv, w_o):
    """Another style: einsums, the latent output first, the folded (H, C, D) weight second."""
    folded = torch.einsum("hvc,dhv->hcd", w_uv, w_o.unflatten(1, (w_uv.size(0), -1)))
    latent = torch.einsum("bhts,bsc->bhtc", weights, c)  # (B, H, T, C)
    return torch.einsum("bhtc,hcd->btd", latent, folded)


def scores_keys_per_token(q_nope, c, w_uk):  # [keys-formed]: one token's keys at a time
    rows = []
    for s in range(c.size(1)):
        key = c[:, None, s, None] @ w_uk.transpose(-2, -1)  # (B, H, 1, N): the keys of token s, all heads
        rows.append((q_nope @ key.transpose(-2, -1))[..., 0])
    return torch.stack(rows, -1)


def scores_in_numpy(q_nope, c, w_uk):  # [left-torch]: the keys formed in NumPy, out of the watcher's sight
    keys = c.numpy()[:, None] @ w_uk.numpy().swapaxes(-1, -2)
    return torch.from_numpy(q_nope.numpy() @ keys.swapaxes(-1, -2))


def output_values_per_token(weights, c, w_uv, w_o):  # [values-formed]: token s's values, one token at a time
    out = 0
    for s in range(c.size(1)):
        value = c[:, None, s, None] @ w_uv.transpose(-2, -1)  # (B, H, 1, V): token s's values
        share = weights[..., s, None] * value  # (B, H, T, V): what every query takes from token s
        out = out + share.transpose(1, 2).flatten(2) @ w_o.T  # its part of the output (B, T, D)
    return out


def output_in_numpy(weights, c, w_uv, w_o):  # [left-torch]
    values = c.numpy()[:, None] @ w_uv.numpy().swapaxes(-1, -2)
    heads = weights.numpy() @ values
    b, h, t, v = heads.shape
    return torch.from_numpy(heads.transpose(0, 2, 1, 3).reshape(b, t, h * v) @ w_o.numpy().T)


def output_from_values(weights, c, w_uv, w_o):
    values = c[:, None] @ w_uv.transpose(-2, -1)  # THE BUG: (B, H, T, V) values formed
    heads = weights @ values
    return heads.transpose(1, 2).flatten(2) @ w_o.T


def output_latent_then_uv(weights, c, w_uv, w_o):
    """The chapter's forward_absorbed: the latent output, then W_uv per head (the heads' outputs formed)."""
    heads = (weights @ c[:, None]) @ w_uv.transpose(-2, -1)  # (B, H, T, V)
    return heads.transpose(1, 2).flatten(2) @ w_o.T


def output_heads_feature_major(weights, c, w_uv, w_o):
    h, v_dim, _ = w_uv.shape
    w_o_heads = w_o.view(w_o.size(0), v_dim, h).permute(2, 0, 1)  # THE BUG: columns read as (V, H)
    folded = w_uv.transpose(-2, -1) @ w_o_heads.transpose(-2, -1)
    return ((weights @ c[:, None]) @ folded).sum(1)


CORRECT = [
    (checks.check_softcap_attention, softcap_attention),
    (checks.check_softcap_attention, softcap_by_einsum),
    (checks.check_qk_norm_rope, qk_norm_rope),
    (checks.check_qk_norm_rope, qk_norm_functional),
    (checks.check_sink_attention, sink_attention),
    (checks.check_sink_attention, sink_by_logsumexp),
    (checks.check_absorbed_scores, absorbed_scores),
    (checks.check_absorbed_scores, absorbed_by_einsum),
    (checks.check_olmo2_qk_norm, olmo2_qk_norm),
    (checks.check_olmo2_qk_norm, olmo2_by_rms_norm),
    (checks.check_absorbed_output, absorbed_output),
    (checks.check_absorbed_output, absorbed_output_by_einsum),
]
PLANTED = [
    (checks.check_softcap_attention, softcap_after_mask, "cap-after-mask"),
    (checks.check_softcap_attention, lambda q, k, v, cap: softcap_attention(q, k, v, 1e9), "wrong-output"),
    (checks.check_softcap_attention, softcap_clamped, "wrong-output"),
    (checks.check_qk_norm_rope, lambda x, p, w, e: qk_norm_rope(x, p, w, e, "interleaved"), "rope-wrong-pairing"),
    (checks.check_qk_norm_rope, lambda x, p, w, e: apply_rope(x, p, pairing="halves"), "wrong-output"),
    (checks.check_qk_norm_rope, lambda x, p, w, e: qk_norm_rope(x, p, torch.ones_like(w), e), "wrong-output"),
    (checks.check_sink_attention, sinks_with_value_einsum, "sink-given-value"),
    (checks.check_sink_attention, lambda q, k, v, s, w: sink_attention(q, k, v, s, w, shift=1),
     "window-off-by-one"),
    (checks.check_sink_attention, lambda q, k, v, s, w: sink_attention(q, k, v, s - 1e4, w), "sink-ignored"),
    (checks.check_absorbed_scores, scores_from_formed_keys, "keys-formed"),
    (checks.check_absorbed_scores, scores_from_keys_per_head, "keys-formed"),
    (checks.check_absorbed_scores, lambda q, c, w: 2 * absorbed_scores(q, c, w), "wrong-output"),
    (checks.check_olmo2_qk_norm, lambda x, p, w, h, e: olmo2_qk_norm(x, p, w, h, e, per_head=True),
     "norm-per-head"),
    (checks.check_olmo2_qk_norm, olmo2_rope_first, "norm-after-rope"),
    (checks.check_olmo2_qk_norm, lambda x, p, w, h, e: olmo2_qk_norm(x, p, w, h, e, pairing="interleaved"),
     "rope-wrong-pairing"),
    (checks.check_olmo2_qk_norm, lambda x, p, w, h, e: olmo2_qk_norm(x, p, torch.ones_like(w), h, e),
     "wrong-output"),
    (checks.check_absorbed_output, output_from_values, "values-formed"),
    (checks.check_absorbed_output, output_latent_then_uv, "values-formed"),
    (checks.check_absorbed_output, output_heads_feature_major, "heads-split-wrong"),
    (checks.check_absorbed_output, lambda a, c, u, o: 2 * absorbed_output(a, c, u, o), "wrong-output"),
    (checks.check_absorbed_scores, scores_keys_per_token, "keys-formed"),
    (checks.check_absorbed_scores, scores_in_numpy, "left-torch"),
    (checks.check_absorbed_output, output_values_per_token, "values-formed"),
    (checks.check_absorbed_output, output_in_numpy, "left-torch"),
]


def test_formed_keys_are_seen_in_any_layout():
    """The keys are recognised by their numbers, whatever the layout: einsum's own order of contraction included."""
    from attention_course.checks import observe

    q, c, w = torch.randn(2, 3, 5, 4), torch.randn(2, 5, 6), torch.randn(3, 4, 6)
    keys = c[:, None] @ w.transpose(-2, -1)
    for fn, formed in ((absorbed_scores, False), (absorbed_by_einsum, False), (scores_from_formed_keys, True),
                       (lambda q, c, w: q @ torch.einsum("btc,hnc->hnbt", c, w).permute(2, 0, 3, 1).mT, True)):
        with observe.FormedTensors(keys) as watch:
            fn(q, c, w)
        assert watch.formed is formed, fn


def test_olmo2_reference_equals_transformers_olmo2_attention(monkeypatch):
    """The checker's reference is what transformers' Olmo2Attention rotates: q_norm over all heads, then RoPE."""
    import numpy as np
    from transformers import Olmo2Config
    from transformers.models.olmo2 import modeling_olmo2

    from attention_course.checks.modern import olmo2_qk_variant

    torch.manual_seed(0)
    config = Olmo2Config(hidden_size=40, num_attention_heads=3, num_key_value_heads=3, head_dim=8)
    config._attn_implementation = "eager"
    layer = modeling_olmo2.Olmo2Attention(config, layer_idx=0).double()
    with torch.no_grad():
        layer.q_norm.weight.uniform_(0.5, 2.0)
    x, positions = torch.randn(2, 5, 40, dtype=torch.float64), torch.arange(3, 8)
    rotated = {}
    real_rope = modeling_olmo2.apply_rotary_pos_emb

    def keep_queries(q, k, cos, sin, *args, **kwargs):
        rotated["q"] = real_rope(q, k, cos, sin, *args, **kwargs)[0]
        return real_rope(q, k, cos, sin, *args, **kwargs)

    monkeypatch.setattr(modeling_olmo2, "apply_rotary_pos_emb", keep_queries)
    cos, sin = modeling_olmo2.Olmo2RotaryEmbedding(config)(x, positions[None].expand(2, -1))
    layer(x, (cos.double(), sin.double()), None)
    ref = olmo2_qk_variant(layer.q_proj(x).detach().numpy(), positions.numpy(),
                           layer.q_norm.weight.detach().numpy(), 3, config.rms_norm_eps)
    assert np.abs(rotated["q"].detach().numpy() - ref).max() < 1e-5  # Olmo2RMSNorm computes in float32
    per_head = olmo2_qk_variant(layer.q_proj(x).detach().numpy(), positions.numpy(),
                                layer.q_norm.weight.detach().numpy(), 3, config.rms_norm_eps, norm="per-head")
    assert np.abs(rotated["q"].detach().numpy() - per_head).max() > 1e-2
