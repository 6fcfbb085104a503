"""Transformer blocks vs torch's nn.TransformerEncoderLayer / nn.TransformerDecoderLayer, feed-forward variants.

torch's key_padding_mask and boolean attn_mask mean True = ignore; ours mean True = may attend: torch gets ``~mask``.
The torch layers run with gradients enabled, which keeps them off their inference fast path (which returns
zeros at padded positions instead of the computed values).
"""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attention_course.block import (
    DecoderBlock,
    EncoderBlock,
    FeedForward,
    RMSNorm,
    SwiGLU,
    block_stack,
    depth_statistics,
    layer_gradient_norms,
    residual,
    residual_stream_norms,
)
from attention_course.masks import causal_mask, padding_mask

ATOL = 1e-5
# (B, T, D, H, d_ff): d_ff != D, several head counts
SHAPES = [(2, 5, 8, 2, 12), (3, 7, 12, 3, 20), (1, 4, 16, 4, 32)]


def randomise(layer: nn.Module, seed: int) -> nn.Module:
    """Random values in every parameter (torch starts with zero biases and unit norms: those would hide bugs)."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in layer.named_parameters():
            is_norm_scale = name.startswith("norm") and name.endswith("weight")
            p.copy_(torch.randn_like(p) * 0.3 + (1.0 if is_norm_scale else 0.0))
    return layer


def lengths_for(b: int, t: int) -> list[int]:
    """Padding lengths in [1, t]: every query keeps at least one key (torch gives NaN for none)."""
    return [t - i % t for i in range(b)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("masks", ["none", "padding", "causal", "both"])
def test_encoder_matches_torch(shape, norm_first, activation, masks):
    b, t, d, h, d_ff = shape
    torch.manual_seed(0)
    theirs = nn.TransformerEncoderLayer(d, h, d_ff, dropout=0.3, activation=activation, batch_first=True,
                                        norm_first=norm_first)
    randomise(theirs, seed=t).eval()
    ours = EncoderBlock.from_torch(theirs).eval()
    x = torch.randn(b, t, d)
    lengths = lengths_for(b, t)
    pad = padding_mask(lengths, t) if masks in ("padding", "both") else None  # (B, 1, 1, T)
    causal = masks in ("causal", "both")
    kpm = None if pad is None else ~pad[:, 0, 0]  # (B, T), True = ignore
    src_mask = ~causal_mask(t) if causal else None
    expected = theirs(x, src_mask=src_mask, src_key_padding_mask=kpm, is_causal=causal)
    got = ours(x, mask=pad, is_causal=causal)
    assert got.shape == (b, t, d)
    torch.testing.assert_close(got, expected, atol=ATOL, rtol=1e-4)


@pytest.mark.parametrize("shape", [(2, 5, 7, 8, 2, 12), (3, 4, 9, 12, 3, 20), (1, 6, 3, 16, 4, 8)])
@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("memory_padding", [False, True])
@pytest.mark.parametrize("causal", [True, False])
def test_decoder_matches_torch(shape, norm_first, activation, memory_padding, causal):
    """Both of torch's calls, causal (tgt_mask) and its default (not causal), against ours with is_causal."""
    b, t_q, t_k, d, h, d_ff = shape  # Tq != Tk: target and memory lengths differ
    torch.manual_seed(1)
    theirs = nn.TransformerDecoderLayer(d, h, d_ff, dropout=0.2, activation=activation, batch_first=True,
                                        norm_first=norm_first)
    randomise(theirs, seed=t_q + t_k).eval()
    ours = DecoderBlock.from_torch(theirs).eval()
    x, memory = torch.randn(b, t_q, d), torch.randn(b, t_k, d)
    pad = padding_mask(lengths_for(b, t_k), t_k) if memory_padding else None  # (B, 1, 1, Tk)
    kpm = None if pad is None else ~pad[:, 0, 0]
    if causal:
        expected = theirs(x, memory, tgt_mask=~causal_mask(t_q), tgt_is_causal=True, memory_key_padding_mask=kpm)
    else:
        expected = theirs(x, memory, memory_key_padding_mask=kpm)  # torch's default call
    got = ours(x, memory, memory_mask=pad, is_causal=causal)
    torch.testing.assert_close(got, expected, atol=ATOL, rtol=1e-4)


def test_decoder_causality_must_be_stated():
    """Called as torch's layer is called by default, ours refuses rather than compute another function: the two
    calls' results differ by about 1 when one is causal and the other not."""
    theirs = randomise(nn.TransformerDecoderLayer(8, 2, 16, batch_first=True), seed=6).eval()
    ours = DecoderBlock.from_torch(theirs).eval()
    x, memory = torch.randn(2, 5, 8), torch.randn(2, 3, 8)
    with pytest.raises(TypeError, match="is_causal"):
        ours(x, memory)
    with pytest.raises(TypeError, match="is_causal must be a bool"):
        ours(x, memory, is_causal=None)
    causal, full = ours(x, memory, is_causal=True), ours(x, memory, is_causal=False)
    assert (causal - full).abs().max() > 0.1  # the two differ: a silent default would be a real bug
    torch.testing.assert_close(full, theirs(x, memory), atol=ATOL, rtol=1e-4)


@pytest.mark.parametrize(("cls", "layer", "match"), [
    (EncoderBlock, nn.TransformerDecoderLayer(8, 2, 16, batch_first=True),
     "copies an nn.TransformerEncoderLayer, got TransformerDecoderLayer; use DecoderBlock.from_torch"),
    (DecoderBlock, nn.TransformerEncoderLayer(8, 2, 16, batch_first=True),
     "copies an nn.TransformerDecoderLayer, got TransformerEncoderLayer; use EncoderBlock.from_torch"),
    (EncoderBlock, nn.MultiheadAttention(8, 2), "copies an nn.TransformerEncoderLayer, got MultiheadAttention$"),
])
def test_from_torch_refuses_other_layers(cls, layer, match):
    """A decoder layer has a cross-attention an EncoderBlock would silently drop: refused, as anything else."""
    with pytest.raises(TypeError, match=match):
        cls.from_torch(layer)


def test_decoder_target_padding_and_not_causal():
    """A target padding mask through ``mask``, and is_causal=False, as torch with tgt_key_padding_mask only."""
    torch.manual_seed(2)
    theirs = randomise(nn.TransformerDecoderLayer(8, 2, 16, batch_first=True), seed=3).eval()
    ours = DecoderBlock.from_torch(theirs).eval()
    x, memory = torch.randn(2, 5, 8), torch.randn(2, 3, 8)
    pad = padding_mask([5, 2], 5)
    expected = theirs(x, memory, tgt_key_padding_mask=~pad[:, 0, 0])
    torch.testing.assert_close(ours(x, memory, mask=pad, is_causal=False), expected, atol=ATOL, rtol=1e-4)


def test_decoder_is_causal_and_uses_memory():
    """Changing a later target position leaves earlier outputs alone; changing the memory changes all of them."""
    torch.manual_seed(3)
    block = DecoderBlock(8, 2, 16).eval()
    x, memory = torch.randn(1, 6, 8), torch.randn(1, 4, 8)
    out = block(x, memory, is_causal=True)
    x2 = x.clone()
    x2[:, 4:] += 1.0
    out2 = block(x2, memory, is_causal=True)
    torch.testing.assert_close(out2[:, :4], out[:, :4])
    assert not torch.allclose(out2[:, 4:], out[:, 4:])
    out3 = block(x, memory + 1.0, is_causal=True)
    assert not torch.allclose(out3, out, atol=1e-3)


def test_from_torch_without_bias_and_other_eps():
    theirs = randomise(nn.TransformerEncoderLayer(8, 4, 16, batch_first=True, bias=False, layer_norm_eps=1e-3,
                                                  norm_first=True), seed=4).eval()
    ours = EncoderBlock.from_torch(theirs).eval()
    assert ours.ff.linear1.bias is None and ours.norm1.bias is None and ours.norm1.eps == 1e-3
    x = torch.randn(2, 3, 8)
    torch.testing.assert_close(ours(x), theirs(x), atol=ATOL, rtol=1e-4)


@pytest.mark.parametrize("activation", [nn.ReLU(), nn.GELU()])
def test_from_torch_activation_modules(activation):
    theirs = randomise(nn.TransformerDecoderLayer(8, 2, 16, activation=activation, batch_first=True), 5).eval()
    ours = DecoderBlock.from_torch(theirs).eval()
    x, memory = torch.randn(2, 3, 8), torch.randn(2, 4, 8)
    torch.testing.assert_close(ours(x, memory, is_causal=False), theirs(x, memory), atol=ATOL, rtol=1e-4)


@pytest.mark.parametrize("activation", [nn.SiLU(), nn.GELU(approximate="tanh")])
def test_from_torch_rejects_other_activations(activation):
    layer = nn.TransformerEncoderLayer(8, 2, 16, activation=activation, batch_first=True)
    with pytest.raises(ValueError, match="only relu and"):
        EncoderBlock.from_torch(layer)


def test_dropout_only_in_training():
    torch.manual_seed(5)
    block = EncoderBlock(8, 2, 16, dropout=0.5)
    x = torch.randn(2, 5, 8)
    block.train()
    assert not torch.allclose(block(x), block(x))
    block.eval()
    torch.testing.assert_close(block(x), block(x), atol=0, rtol=0)
    no_dropout = EncoderBlock(8, 2, 16)
    no_dropout.load_state_dict(block.state_dict())
    torch.testing.assert_close(block(x), no_dropout.eval()(x))


def test_pre_and_post_ln_orders():
    """residual(): pre-LN never normalises the stream, post-LN normalises it after every sub-layer."""
    torch.manual_seed(6)
    x = torch.randn(2, 3, 8) * 5 + 2
    norm, branch = nn.LayerNorm(8), nn.Linear(8, 8)
    pre = residual(x, branch, norm, nn.Identity(), norm_first=True)
    post = residual(x, branch, norm, nn.Identity(), norm_first=False)
    torch.testing.assert_close(pre, x + branch(norm(x)))
    torch.testing.assert_close(post, norm(x + branch(x)))
    torch.testing.assert_close(post.mean(-1), torch.zeros(2, 3), atol=1e-5, rtol=0)


@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_feed_forward_is_position_wise(activation):
    torch.manual_seed(7)
    ff = FeedForward(6, 10, activation).eval()
    x = torch.randn(2, 4, 6)
    act = F.relu if activation == "relu" else F.gelu
    expected = act(x @ ff.linear1.weight.T + ff.linear1.bias) @ ff.linear2.weight.T + ff.linear2.bias
    torch.testing.assert_close(ff(x), expected)
    torch.testing.assert_close(ff(x[:, 2:3]), ff(x)[:, 2:3])  # each position on its own


def test_swiglu_against_formula():
    torch.manual_seed(8)
    swiglu = SwiGLU(6, 10)
    x = torch.randn(2, 3, 6, dtype=torch.float64)
    swiglu = swiglu.double()
    g, u, d = swiglu.gate.weight, swiglu.up.weight, swiglu.down.weight
    expected = ((x @ g.T) * torch.sigmoid(x @ g.T) * (x @ u.T)) @ d.T
    torch.testing.assert_close(swiglu(x), expected)
    assert sum(p.numel() for p in swiglu.parameters()) == 3 * 6 * 10


def test_rms_norm_matches_torch():
    torch.manual_seed(9)
    ours, theirs = RMSNorm(8, eps=1e-6), nn.RMSNorm(8, eps=1e-6)
    with torch.no_grad():
        ours.weight.normal_()
        theirs.weight.copy_(ours.weight)
    x = torch.randn(3, 4, 8) * 3 + 1
    torch.testing.assert_close(ours(x), theirs(x), atol=ATOL, rtol=1e-5)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"d_model": 10, "num_heads": 3}, ValueError, "d_model=10 is not divisible by num_heads=3"),
        ({"d_ff": 0}, ValueError, "d_ff must be >= 1"),
        ({"d_ff": 2.5}, TypeError, "d_ff must be an int"),
        ({"d_model": 0}, ValueError, "d_model must be >= 1"),
        ({"num_heads": 0}, ValueError, "num_heads must be >= 1"),
        ({"activation": "tanh"}, ValueError, "activation must be one of"),
        ({"activation": F.relu}, TypeError, "activation must be a string"),
        ({"dropout": 1.5}, ValueError, r"dropout must be in \[0, 1\)"),
    ],
)
@pytest.mark.parametrize("cls", [EncoderBlock, DecoderBlock])
def test_bad_sizes(cls, kwargs, error, match):
    args = {"d_model": 8, "num_heads": 2, "d_ff": 16} | kwargs
    with pytest.raises(error, match=match):
        cls(**args)


def test_bad_sizes_of_the_parts():
    with pytest.raises(ValueError, match="d_ff must be >= 1"):
        FeedForward(8, 0)
    with pytest.raises(ValueError, match="d_ff must be >= 1"):
        SwiGLU(8, 0)
    with pytest.raises(TypeError, match="d_model must be an int"):
        RMSNorm(True)
    with pytest.raises(ValueError, match="depth must be >= 1"):
        block_stack(0, 8, 2, 16, norm_first=True)


def test_depth_experiment_shows_the_difference():
    """The chapter's plot: pre-LN's stream grows with depth, post-LN's stays at sqrt(D); post-LN's gradients
    grow toward the output and are larger there than pre-LN's."""
    torch.manual_seed(0)
    x, target = torch.randn(2, 8, 32), torch.randn(2, 8, 32)
    post, pre = (block_stack(8, 32, 4, 64, norm_first=nf) for nf in (False, True))
    post_stream, pre_stream = residual_stream_norms(post, x), residual_stream_norms(pre, x)
    assert len(post_stream) == len(pre_stream) == 8
    assert max(abs(n - 32**0.5) for n in post_stream) < 0.1  # LayerNorm output: norm sqrt(D)
    assert pre_stream[-1] > 1.5 * pre_stream[0]
    post_grads, pre_grads = layer_gradient_norms(post, x, target), layer_gradient_norms(pre, x, target)
    assert len(post_grads) == 8
    assert post_grads[-1] > post_grads[0]
    assert post_grads[-1] > 2 * pre_grads[-1]


def test_depth_statistics_averages_over_stacks():
    post = depth_statistics(norm_first=False, depth=3, d_model=16, num_seeds=2, seq_len=4)
    pre = depth_statistics(norm_first=True, depth=3, d_model=16, num_seeds=2, seq_len=4)
    assert sorted(post) == ["ffn_gradient", "gradient", "stream"] and all(len(v) == 3 for v in post.values())
    assert all(f < g for f, g in zip(post["ffn_gradient"], post["gradient"], strict=True))  # one of the parameters
    assert max(abs(n - 4.0) for n in post["stream"]) < 0.05  # LayerNorm output: norm sqrt(16)
    assert pre["stream"][-1] > pre["stream"][0]
    stack = block_stack(3, 16, 4, 64, norm_first=False, seed=1)
    x, target = torch.randn(2, 2, 4, 16, generator=torch.Generator().manual_seed(1))
    single = layer_gradient_norms(stack, x, target)
    ffn_only = layer_gradient_norms(stack, x, target, parameter="ff.linear2.weight")
    assert ffn_only == pytest.approx([b.ff.linear2.weight.grad.norm().item() for b in stack], rel=1e-5)
    one_seed = depth_statistics(norm_first=False, depth=3, d_model=16, num_seeds=1, seq_len=4)
    assert one_seed["gradient"] != single  # seed 0 differs from seed 1: the seeds are used
    with pytest.raises(ValueError, match="num_seeds must be >= 1"):
        depth_statistics(norm_first=True, num_seeds=0)
