"""Chapter 17: linear attention, the gated delta rule and Gated DeltaNet.

The three forms of the rule (recurrent, chunked, parallel) equal each other in float64 on shapes drawn from a
seeded generator: T not a multiple of the chunk, T = 1, several head counts, grouped heads (H_k < H). The course's
layers equal transformers' Qwen3-Next layers (random weights, offline) in float32, the dtype in which transformers
computes the recurrence whatever the module's: relative error below 1e-5 (measured about 1e-7; a wrong gate,
norm or layout is off by more than 1e-2). The step-by-step decoder equals the full sequence.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from attention_course import linear_attention as la
from attention_course.interop.hf_models import relative_error
from attention_course.linear_attention.cache import HYBRIDS, bytes_table, hybrid_bytes, state_bytes

os.environ.setdefault("HF_HUB_OFFLINE", "1")

F64 = dict(dtype=torch.float64)
CASES = 6


def draw_inputs(rng: np.random.Generator, *, t: int | None = None, gated: bool = True):
    """q, k (B, H_k, T, Dk) unit-normalised, v (B, H, T, Dv), beta, log_decay (B, H, T): float64, sizes drawn."""
    b, h_k = int(rng.integers(1, 3)), int(rng.choice([1, 2, 3]))
    h = h_k * int(rng.choice([1, 2]))
    t = int(rng.choice([1, 5, 13, 37, 70])) if t is None else t
    dk, dv = int(rng.choice([3, 4, 8])), int(rng.choice([2, 5, 8]))

    def normal(*shape):
        return torch.from_numpy(rng.standard_normal(shape))

    q, k = la.normalize_qk(normal(b, h_k, t, dk), normal(b, h_k, t, dk))
    beta = torch.from_numpy(rng.uniform(0, 1, (b, h, t)))
    log_decay = -torch.from_numpy(rng.uniform(0, 1.5, (b, h, t))) if gated else None
    return q, k, normal(b, h, t, dv), beta, log_decay


def test_three_forms_equal_in_float64():
    rng = np.random.default_rng(17)
    seen = set()
    for case in range(CASES):
        q, k, v, beta, log_decay = draw_inputs(rng, t=1 if case == 0 else None, gated=case % 3 != 1)
        chunk = int(rng.choice([4, 16, 64]))
        out_r, state_r = la.gated_delta_recurrent(q, k, v, beta, log_decay)
        out_c, state_c = la.gated_delta_chunked(q, k, v, beta, log_decay, chunk_size=chunk)
        out_p, state_p = la.gated_delta_parallel(q, k, v, beta, log_decay)
        for out, state in ((out_c, state_c), (out_p, state_p)):
            assert (out - out_r).abs().max() < 1e-12 and (state - state_r).abs().max() < 1e-12, (case, chunk)
        seen.add((v.size(2) % chunk != 0, k.size(1) < v.size(1), v.size(2) == 1))
    for drawn in range(3):  # T not a multiple of the chunk, grouped heads and T = 1 were all drawn
        assert any(s[drawn] for s in seen)


def test_state_carries_between_calls():
    """Two halves, the state of the first passed to the second, equal the whole sequence in every form."""
    rng = np.random.default_rng(5)
    q, k, v, beta, log_decay = draw_inputs(rng, t=29)
    whole, final = la.gated_delta_recurrent(q, k, v, beta, log_decay)
    cut = 11
    first, state = la.gated_delta_chunked(q[:, :, :cut], k[:, :, :cut], v[:, :, :cut], beta[..., :cut],
                                          log_decay[..., :cut], chunk_size=4)
    second, state = la.gated_delta_parallel(q[:, :, cut:], k[:, :, cut:], v[:, :, cut:], beta[..., cut:],
                                            log_decay[..., cut:], state)
    assert (torch.cat([first, second], 2) - whole).abs().max() < 1e-12
    assert (state - final).abs().max() < 1e-12


def test_linear_attention_two_forms_equal():
    rng = np.random.default_rng(8)
    for gated in (False, True):
        q, k, v, _, log_decay = draw_inputs(rng, t=23, gated=gated)
        q, k = la.elu_feature_map(q), la.elu_feature_map(k)
        recurrent, _ = la.linear_attention_recurrent(q, k, v, log_decay)
        assert (la.linear_attention_parallel(q, k, v, log_decay) - recurrent).abs().max() < 1e-12


def test_linear_attention_is_delta_rule_without_erasing():
    """beta = 1 and keys orthogonal to everything stored before: the delta rule writes exactly what linear attention
    writes (nothing to erase)."""
    t, d = 5, 8
    keys = torch.eye(d, **F64)[:t][None, None]  # (1, 1, T, Dk) orthonormal keys
    v = torch.randn(1, 1, t, 3, **F64)
    linear, _ = la.linear_attention_recurrent(keys, keys, v)
    delta, _ = la.gated_delta_recurrent(keys, keys, v, torch.ones(1, 1, t, **F64))
    assert (linear - delta).abs().max() < 1e-12


def test_delta_step_is_a_least_squares_step():
    """S <- S + beta k (v - k S)^T is gradient descent on |k S - v|^2 / 2 with learning rate beta."""
    state = torch.randn(1, 1, 4, 3, **F64, requires_grad=True)
    k, v = torch.randn(1, 1, 4, **F64), torch.randn(1, 1, 3, **F64)
    beta, zero = torch.full((1, 1), 0.3, **F64), torch.zeros(1, 1, **F64)
    loss = 0.5 * (la.read(state, k) - v).pow(2).sum()
    (grad,) = torch.autograd.grad(loss, state)
    assert (la.delta_step(state.detach(), k, v, beta, zero) - (state.detach() - 0.3 * grad)).abs().max() < 1e-12
    unit = k / k.norm()  # beta = 1 and a unit key: the state then returns v exactly for that key
    written = la.delta_step(state.detach(), unit, v, torch.ones(1, 1, **F64), zero)
    assert (la.read(written, unit) - v).abs().max() < 1e-12


def test_gradients_of_chunked_equal_recurrent():
    rng = np.random.default_rng(11)
    inputs = [x.requires_grad_() for x in draw_inputs(rng, t=19)]
    grads = []
    for form in (la.gated_delta_recurrent, lambda *a: la.gated_delta_chunked(*a, chunk_size=4)):
        out, state = form(*inputs)
        weights = torch.linspace(-1, 1, out.numel(), **F64).view_as(out)
        g = torch.autograd.grad((out * weights).sum() + state.pow(2).sum(), inputs)
        grads.append(g)
    for a, b in zip(*grads, strict=True):
        assert (a - b).abs().max() < 1e-10


def test_chunked_runs_each_group_through_the_given_step():
    """`step` (the benchmark passes torch.compile(chunks_step), checked there against the recurrence) gets every
    group of `group` chunks, chunk-major, and the state between them; a ragged last group is shorter."""
    q, k, v, beta, log_decay = draw_inputs(np.random.default_rng(5), t=19)
    groups = []

    def step(state, *group):
        groups.append(tuple(group[0].shape[:2]))  # (chunks, B)
        return la.chunks_step(state, *group)

    out, state = la.gated_delta_chunked(q, k, v, beta, log_decay, chunk_size=4, group=2, step=step)
    ref, ref_state = la.gated_delta_recurrent(q, k, v, beta, log_decay)
    assert (out - ref).abs().max() < 1e-12 and (state - ref_state).abs().max() < 1e-12
    assert groups == [(2, q.size(0)), (2, q.size(0)), (1, q.size(0))]  # 5 chunks of 4 tokens (19 padded to 20)


def test_grouped_heads_share_queries_and_keys():
    rng = np.random.default_rng(2)
    q, k, v, beta, log_decay = draw_inputs(rng, t=9)
    groups = v.size(1) // k.size(1)
    repeated = (q.repeat_interleave(groups, 1), k.repeat_interleave(groups, 1))
    out, _ = la.gated_delta_chunked(q, k, v, beta, log_decay, chunk_size=4)
    assert (out - la.gated_delta_recurrent(*repeated, v, beta, log_decay)[0]).abs().max() < 1e-12


def test_decay_matrix():
    log_decay = torch.log(torch.tensor([[[0.5, 0.5, 0.25]]], **F64))
    expected = torch.tensor([[1, 0, 0], [0.5, 1, 0], [0.125, 0.25, 1]], **F64)
    assert (la.decay_matrix(log_decay)[0, 0] - expected).abs().max() < 1e-15


def test_bad_rule_inputs():
    q = torch.randn(1, 2, 5, 4)
    v, beta = torch.randn(1, 2, 5, 3), torch.rand(1, 2, 5)
    with pytest.raises(TypeError, match="q must be a floating"):
        la.gated_delta_recurrent(q.long(), q, v, beta)
    with pytest.raises(ValueError, match="q and k must have one shape"):
        la.gated_delta_recurrent(q, q[..., :3], v, beta)
    with pytest.raises(ValueError, match="multiple of query/key heads"):
        la.gated_delta_chunked(q, q, torch.randn(1, 3, 5, 3), torch.rand(1, 3, 5))
    with pytest.raises(ValueError, match="log_decay must be <= 0"):
        la.gated_delta_parallel(q, q, v, beta, torch.rand(1, 2, 5) + 0.1)
    with pytest.raises(ValueError, match="beta must be"):
        la.gated_delta_chunked(q, q, v, beta[..., :4])
    with pytest.raises(ValueError, match="state must be"):
        la.gated_delta_recurrent(q, q, v, beta, None, torch.zeros(1, 2, 3, 3))
    with pytest.raises(ValueError, match="chunk_size must be >= 1"):
        la.gated_delta_chunked(q, q, v, beta, chunk_size=0)
    with pytest.raises(ValueError, match="empty"):
        la.gated_delta_recurrent(q[:, :, :0], q[:, :, :0], v[:, :, :0], beta[..., :0])
    with pytest.raises(ValueError, match="v must be"):
        la.linear_attention_parallel(q, q, v[:, :, :4])
    with pytest.raises(TypeError, match="share a dtype"):
        la.linear_attention_recurrent(q, q, v.double())


# ---------------------------------------------------------------- the layers against transformers

transformers = pytest.importorskip("transformers")
from attention_course.interop.hf_models import (  # noqa: E402
    build_hf_attention,
    build_hf_gated_deltanet,
    build_hf_kimi_delta,
    hf_deltanet_forward,
    hf_forward,
)


def draw_deltanet_config(rng: np.random.Generator) -> dict:
    k_heads = int(rng.choice([1, 2, 3]))
    return dict(hidden_size=int(rng.choice([12, 16, 24])), linear_num_key_heads=k_heads,
                linear_num_value_heads=k_heads * int(rng.choice([1, 2])),
                linear_key_head_dim=int(rng.choice([4, 8])), linear_value_head_dim=int(rng.choice([3, 6, 8])),
                linear_conv_kernel_dim=int(rng.choice([2, 4])))


def test_gated_deltanet_equals_transformers():
    rng = np.random.default_rng(170)
    for case in range(CASES):
        config = draw_deltanet_config(rng)
        hf = build_hf_gated_deltanet(seed=case, **config)
        ours = la.GatedDeltaNet.from_hf(hf)
        b, t = int(rng.integers(1, 3)), int(rng.choice([1, 7, 64, 100]))
        x = torch.from_numpy(rng.standard_normal((b, t, config["hidden_size"]))).float()
        with torch.no_grad():
            err = relative_error(ours(x), hf_deltanet_forward(hf, x))
        assert err < 1e-5, (config, t, err)


def test_each_part_of_the_layer_is_needed():
    """Spoil one part of a converted layer and the equality breaks by far more than the tolerance."""
    hf = build_hf_gated_deltanet(hidden_size=16, linear_num_key_heads=2, linear_num_value_heads=4,
                                 linear_key_head_dim=4, linear_value_head_dim=3)
    x = torch.randn(1, 12, 16, generator=torch.Generator().manual_seed(0))
    ref = hf_deltanet_forward(hf, x)
    spoils = {"A_log": lambda w: w + 1.0, "dt_bias": torch.zeros_like, "conv_weight": lambda w: w.flip(-1),
              "norm.weight": torch.ones_like, "b_proj.weight": lambda w: -w}
    for name, spoil in spoils.items():
        ours = la.GatedDeltaNet.from_hf(hf)
        with torch.no_grad():
            assert relative_error(ours(x), ref) < 1e-5
            weight = ours.get_parameter(name)
            weight.copy_(spoil(weight))
            assert relative_error(ours(x), ref) > 1e-2, name


def test_step_equals_full_sequence():
    torch.manual_seed(0)
    layer = la.GatedDeltaNet(12, 2, 4, 4, 3, conv_kernel=3, chunk_size=4).double()
    x = torch.randn(2, 11, 12, **F64)
    with torch.no_grad():
        full, final = layer(x, return_state=True)
        state, outs = None, []
        for t in range(x.size(1)):
            y, state = layer.step(x[:, t], state)
            outs.append(y)
        assert (torch.stack(outs, 1) - full).abs().max() < 1e-12
        for part in ("recurrent", "conv"):
            assert (getattr(state, part) - getattr(final, part)).abs().max() < 1e-12
        prompt, state = layer(x[:, :6], return_state=True)  # prefill a prompt, then decode from its state
        assert (prompt - full[:, :6]).abs().max() < 1e-12
        for t in range(6, 11):
            y, state = layer.step(x[:, t], state)
            assert (y - full[:, t]).abs().max() < 1e-12
    assert state.nbytes() == 2 * layer.state_elements() * 8  # batch of 2, float64: fixed, whatever T


def test_state_is_per_sequence():
    """A fresh call starts from zeros: sequence 2 of a batch never sees sequence 1's memory."""
    torch.manual_seed(1)
    layer = la.GatedDeltaNet(8, 1, 2, 4, 4).double()
    x = torch.randn(2, 7, 8, **F64)
    with torch.no_grad():
        assert (layer(x)[1:] - layer(x[1:])).abs().max() < 1e-12


def test_gated_deltanet_refuses():
    with pytest.raises(TypeError, match="Qwen3NextGatedDeltaNet"):
        la.GatedDeltaNet.from_hf(torch.nn.Linear(2, 2))
    hf = build_hf_gated_deltanet(hidden_size=8, linear_num_key_heads=1, linear_num_value_heads=1,
                                 linear_key_head_dim=4, linear_value_head_dim=4, hidden_act="gelu")
    with pytest.raises(ValueError, match="silu"):
        la.GatedDeltaNet.from_hf(hf)
    with pytest.raises(ValueError, match="multiple of num_k_heads"):
        la.GatedDeltaNet(8, 2, 3, 4, 4)
    layer = la.GatedDeltaNet(8, 1, 2, 4, 4)
    with pytest.raises(ValueError, match="d_model=8"):
        layer(torch.randn(1, 3, 6))
    with pytest.raises(ValueError, match="T = 0"):
        layer(torch.randn(1, 0, 8))
    with pytest.raises(ValueError, match="x_t must be 2-D"):
        layer.step(torch.randn(1, 3, 8))
    with pytest.raises(TypeError, match="DeltaNetState"):
        layer(torch.randn(1, 3, 8), state=torch.zeros(3))
    with pytest.raises(ValueError, match="state.recurrent"):
        layer(torch.randn(2, 3, 8), state=la.DeltaNetState(layer.init_state(2).conv, torch.zeros(1, 2, 4, 4)))


def test_gated_attention_equals_transformers():
    rng = np.random.default_rng(171)
    for case in range(4):
        heads = int(rng.choice([2, 4]))
        config = dict(hidden_size=16, num_attention_heads=heads, num_key_value_heads=heads // int(rng.choice([1, 2])),
                      head_dim=int(rng.choice([8, 16])), attention_bias=bool(case % 2),
                      rope_parameters=dict(rope_type="default", rope_theta=100.0,
                                           partial_rotary_factor=float(rng.choice([0.25, 0.5, 1.0]))))
        for dtype, tolerance in ((torch.float32, 1e-5), (torch.float64, 1e-6)):
            hf = build_hf_attention("qwen3_next", dtype=dtype, seed=case, **config)
            ours = la.Qwen3NextAttention.from_hf(hf)
            x = torch.from_numpy(rng.standard_normal((2, 9, 16))).to(dtype)
            with torch.no_grad():
                err = relative_error(ours(x), hf_forward(hf, x))
            assert err < tolerance, (config, dtype, err)
        with torch.no_grad():
            ours.gate_proj.weight.zero_()  # a gate of 1/2 everywhere instead of the learned one
            assert relative_error(ours(x), hf_forward(hf, x)) > 1e-2


def test_gated_attention_refuses_other_modules():
    hf = build_hf_attention("qwen3", hidden_size=16, num_attention_heads=2, num_key_value_heads=2)
    with pytest.raises(TypeError, match="Qwen3NextAttention"):
        la.Qwen3NextAttention.from_hf(hf)


def draw_kimi_config(rng: np.random.Generator) -> dict:
    return dict(hidden_size=int(rng.choice([12, 16, 24])), linear_num_heads=int(rng.choice([1, 2, 3])),
                linear_head_dim=int(rng.choice([4, 8])), linear_conv_kernel_dim=int(rng.choice([2, 4])))


def test_kimi_delta_attention_equals_transformers():
    """Kimi Linear's layer (a decay per key channel) on configurations drawn at test time: float32, relative error
    below 2e-5 (transformers' chunked fallback against the course's recurrent form; measured up to about 3e-6)."""
    rng = np.random.default_rng(171)
    for case in range(CASES):
        config = draw_kimi_config(rng)
        hf = build_hf_kimi_delta(seed=case, **config)
        ours = la.KimiDeltaAttention.from_hf(hf)
        b, t = int(rng.integers(1, 3)), int(rng.choice([1, 7, 64, 100]))
        x = torch.from_numpy(rng.standard_normal((b, t, config["hidden_size"]))).float()
        with torch.no_grad():
            err = relative_error(ours(x), hf_deltanet_forward(hf, x))
        assert err < 2e-5, (config, t, err)


def test_kimi_decay_is_per_channel():
    """Permuting dt_bias within each head (the same decays, on other channels) breaks the equality by far."""
    hf = build_hf_kimi_delta(hidden_size=16, linear_num_heads=2, linear_head_dim=8)
    x = torch.randn(1, 20, 16, generator=torch.Generator().manual_seed(1))
    ours = la.KimiDeltaAttention.from_hf(hf)
    ref = hf_deltanet_forward(hf, x)
    with torch.no_grad():
        assert relative_error(ours(x), ref) < 2e-5
        ours.dt_bias.copy_(ours.dt_bias.view(2, 8).flip(-1).reshape(-1))
        assert relative_error(ours(x), ref) > 1e-2


def test_per_channel_rule_reduces_to_per_head():
    """The same decay on every key channel is the per-head rule: recurrent per-channel == chunked per-head
    (float64); the chunked form refuses a per-channel decay."""
    rng = np.random.default_rng(4)
    q, k, v, beta, log_decay = draw_inputs(rng, t=37)
    channels = log_decay[..., None].expand(*log_decay.shape, k.size(-1))  # (B, H, T, Dk)
    out_c, state_c = la.gated_delta_recurrent(q, k, v, beta, channels)
    out_h, state_h = la.gated_delta_chunked(q, k, v, beta, log_decay, chunk_size=16)
    assert (out_c - out_h).abs().max() < 1e-12 and (state_c - state_h).abs().max() < 1e-12
    with pytest.raises(ValueError, match="recurrent form only"):
        la.gated_delta_chunked(q, k, v, beta, channels)
    with pytest.raises(ValueError, match="log_decay must be"):
        la.gated_delta_recurrent(q, k, v, beta, channels[..., :1])


def test_kimi_step_equals_full_sequence():
    """float64: decoding token by token from the fixed state equals the whole sequence."""
    hf = build_hf_kimi_delta(hidden_size=12, linear_num_heads=3, linear_head_dim=4, linear_conv_kernel_dim=3)
    ours = la.KimiDeltaAttention.from_hf(hf).double()
    x = torch.randn(2, 9, 12, generator=torch.Generator().manual_seed(2), **F64)
    with torch.no_grad():
        whole, final = ours(x, return_state=True)
        state, steps = None, []
        for t in range(9):
            y, state = ours.step(x[:, t], state)
            steps.append(y)
    assert (torch.stack(steps, 1) - whole).abs().max() < 1e-12
    assert (state.recurrent - final.recurrent).abs().max() < 1e-12


def test_kimi_refuses():
    with pytest.raises(TypeError, match="KimiLinearDeltaAttention"):
        la.KimiDeltaAttention.from_hf(build_hf_gated_deltanet(hidden_size=8, linear_num_key_heads=1,
                                                              linear_num_value_heads=1, linear_key_head_dim=4,
                                                              linear_value_head_dim=4))
    with pytest.raises(ValueError, match="silu"):
        la.KimiDeltaAttention.from_hf(build_hf_kimi_delta(hidden_size=8, linear_num_heads=1, linear_head_dim=4,
                                                          hidden_act="gelu"))


# ---------------------------------------------------------------- bytes


def test_state_bytes_of_published_hybrids():
    qwen = HYBRIDS[0]
    assert state_bytes(qwen) == 36 * (32 * 128 * 128 + 8192 * 3) * 4  # float32 states
    # 12 attention layers, 2 KV heads of 256, keys and values, bfloat16: 24 KiB per token
    assert hybrid_bytes(qwen, 1000) - state_bytes(qwen) == 1000 * 12 * 2 * 2 * 256 * 2
    rows = {row["model"]: row for row in bytes_table()}
    assert rows["Mamba-2-2.7B"][4096] == rows["Mamba-2-2.7B"][1048576]  # no attention: constant
    assert rows["Llama-3-8B"][1048576] > 4 * rows["Qwen3-Next-80B-A3B"][1048576]  # 128 GiB against 24 GiB
    with pytest.raises(TypeError, match="context"):
        hybrid_bytes(qwen, 1.5)


def test_published_rows_match_transformers_modules():
    """The MiniMax-Text-01 and Mamba-2-2.7B rows hold what transformers' own layers keep per token of state when
    built (on the meta device: no memory) from the published sizes: lightning attention 64 heads of (128, 128), no
    convolution; Mamba-2 80 heads of (state 128, head 64) and a convolution over 2 * 2560 + 2 * 128 channels."""
    from transformers import Mamba2Config, MiniMaxConfig
    from transformers.models.mamba2.modeling_mamba2 import Mamba2Mixer
    from transformers.models.minimax.modeling_minimax import MiniMaxLightningAttention

    rows = {row.name: row for row in HYBRIDS}
    seven_to_one = (["linear_attention"] * 7 + ["full_attention"]) * 10
    minimax_config = MiniMaxConfig(hidden_size=6144, num_attention_heads=64, num_key_value_heads=8, head_dim=128,
                                   num_hidden_layers=80, layer_types=seven_to_one)
    mamba_config = Mamba2Config(hidden_size=2560, num_hidden_layers=64, num_heads=80, head_dim=64, state_size=128,
                                n_groups=1, expand=2, conv_kernel=4)
    with torch.device("meta"):
        lightning, mixer = MiniMaxLightningAttention(minimax_config, 0), Mamba2Mixer(mamba_config, 0)
    minimax, mamba = rows["MiniMax-Text-01"], rows["Mamba-2-2.7B"]
    assert minimax.linear_layers == minimax_config.layer_types.count("linear_attention") == 70
    assert minimax.attention.num_layers == 10 and minimax.attention.num_kv_heads == 8
    assert (minimax.heads, minimax.k_dim, minimax.v_dim) == (lightning.num_attention_heads, lightning.head_dim,
                                                             lightning.head_dim)
    assert minimax.conv_channels == 0
    assert (mamba.linear_layers, mamba.heads) == (mamba_config.num_hidden_layers, mixer.num_heads)
    assert (mamba.k_dim, mamba.v_dim) == (mixer.ssm_state_size, mixer.head_dim)
    assert (mamba.conv_channels, mamba.conv_kernel) == (mixer.conv_dim, mixer.conv_kernel_size)
    assert mamba.attention is None


# ---------------------------------------------------------------- the recall experiment and the figures


def test_recall_experiment():
    from attention_course.linear_attention.recall import memory_answers, overwrite, recall

    few, many = recall(8), recall(64)
    assert min(few["softmax"][0], many["softmax"][0]) > 0.9  # a KV cache of N rows keeps every pair
    assert many["linear"][0] < 0.4 and many["linear"][1] < 0.4  # a sum blurs the recent pairs as much as the old
    assert many["delta"][1] > 0.6 > many["delta"][0]  # the delta rule keeps the recent pairs, erases the old
    newest = overwrite()
    assert newest["delta"] > 0.6 > max(newest["linear"], newest["softmax"])
    with pytest.raises(ValueError, match="memory must be"):
        memory_answers(torch.zeros(1, 1, 2, 3), torch.zeros(1, 1, 2, 3), torch.zeros(1, 1, 2, 3), "kv")


def test_associative_recall_batch():
    """Every question's target is the value stored with its key earlier in the sequence (checked pair by pair)."""
    from attention_course.tasks import associative_recall_batch

    generator = torch.Generator().manual_seed(3)
    key_ids, value_ids, targets, asked = associative_recall_batch(5, 6, generator, num_keys=10, num_values=4)
    assert key_ids.shape == value_ids.shape == targets.shape == asked.shape == (5, 12)
    for b in range(5):
        stored = {int(key_ids[b, i]): int(value_ids[b, i]) for i in range(6)}
        assert len(stored) == 6  # distinct keys
        assert sorted(int(k) for k in key_ids[b, 6:]) == sorted(stored)  # every key asked once
        for i in range(6, 12):
            assert bool(asked[b, i]) and int(value_ids[b, i]) == 4  # a question: the blank value id
            assert int(targets[b, i]) == stored[int(key_ids[b, i])]
    assert not asked[:, :6].any()
    with pytest.raises(ValueError, match="num_pairs must be <= num_keys"):
        associative_recall_batch(2, 11, generator, num_keys=10)
    with pytest.raises(TypeError, match="generator must be"):
        associative_recall_batch(2, 3, 0)


def test_trained_recall_delta_beats_linear():
    """Chapter 12's loop on associative recall, 16 pairs, keys of 8 dimensions: the delta rule recalls far more."""
    from attention_course.linear_attention.recall import RecallModel, trained_recall

    linear, delta = trained_recall("linear")[1], trained_recall("delta")[1]
    assert linear < 0.4 and delta > 0.6 and delta > 2 * linear
    with pytest.raises(ValueError, match="memory must be one of"):
        RecallModel("kv")


def test_diagrams_draw():
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    from attention_course.linear_attention import diagrams

    for figure in (diagrams.recurrence(), diagrams.chunk_blocks(12, 5)):
        assert figure.axes
        plt.close(figure)


def test_costs():
    from attention_course.linear_attention import costs

    assert costs.softmax_decode_flops(1000, 64) == 256_000
    assert costs.delta_decode_flops(64, 64) == 32_768
    assert costs.sequential_steps(100, 64) == 2
    one_chunk = costs.chunked_flops(64, 64, 8, 8)
    assert costs.chunked_flops(100, 64, 8, 8) == one_chunk + costs.chunked_flops(36, 36, 8, 8)
    assert costs.chunked_flops(4096, 64, 8, 8) == 64 * one_chunk  # linear in T for a fixed chunk
    with pytest.raises(ValueError, match="chunk must be >= 1"):
        costs.chunked_flops(10, 0, 8, 8)


def test_recurrence_figure_shows_plain_linear_attention():
    """The figure opens the section on plain linear attention: its update, no gate or beta introduced later."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from attention_course.linear_attention import diagrams

    figure = diagrams.recurrence()
    drawn = [t.get_text() for t in figure.findobj(matplotlib.text.Text)]
    assert any(text.startswith("S ← S + k vᵀ") for text in drawn)
    assert not any("β" in text or "α" in text for text in drawn)
    assert figure.axes[0].get_title() == "Linear attention as a recurrence"
    plt.close(figure)
