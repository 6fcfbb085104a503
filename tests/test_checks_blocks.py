"""Chapter 11's checks: the right wiring passes, every named mistake is reported with its code; the questions."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attention_course import checks
from attention_course.block import FeedForward
from attention_course.checks.blocks import sublayer_variant
from attention_course.checks.runner import CheckFailed
from attention_course.multi_head import MultiHeadAttention

# ----------------------------------------------------------------------------------------------------------
# The exercises' skeletons, with a forward that wires the pieces as told
# ----------------------------------------------------------------------------------------------------------


class EncoderSkeleton(nn.Module):
    """The exercise's __init__; ``wiring`` names the forward: right, or one known mistake."""

    wiring = "pre"
    where = (True, True)  # the mistake in (attention, feed-forward)

    def __init__(self, d_model, num_heads, d_ff, dropout=0.0):
        super().__init__()
        self.attn = MultiHeadAttention(d_model, num_heads, dropout=dropout)
        self.ff = FeedForward(d_model, d_ff, dropout=dropout)
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)
        self.p = dropout

    def forward(self, x, mask=None):
        right = self.right
        kinds = [self.wiring if w else right for w in self.where]
        x = sublayer_variant(kinds[0], x, lambda h: self.dropout(self.attn(h, mask=mask)), self.norm1)
        return sublayer_variant(kinds[1], x, lambda h: self.dropout(self.ff(h)), self.norm2)


def encoder(right, wiring=None, where=(True, True), **overrides):
    """A block class whose forward is right ("pre" or "post") or has ``wiring`` in the sub-layers ``where``."""
    return type("Block", (EncoderSkeleton,), {"right": right, "wiring": wiring or right, "where": where,
                                              **overrides})


class PreLN(EncoderSkeleton):
    right = wiring = "pre"


class PostLN(EncoderSkeleton):
    right = wiring = "post"


def run(check, cls, capsys=None):
    check(cls)
    return capsys.readouterr().out if capsys else None


def code_of(check, cls):
    with pytest.raises(CheckFailed) as err:
        check(cls)
    return err.value.code, str(err.value)


def test_right_blocks_pass(capsys):
    checks.check_pre_ln_block(PreLN)
    checks.check_post_ln_block(PostLN)
    out = capsys.readouterr().out
    assert "✓ PreLN: 3 random cases" in out and "x + drop(branch(norm(x)))" in out
    assert "✓ PostLN: 3 random cases" in out and "dropout is off in eval mode" in out


def test_the_two_orders_are_not_interchangeable():
    assert code_of(checks.check_pre_ln_block, PostLN)[0] == "norm-wrong-place"
    assert code_of(checks.check_post_ln_block, PreLN)[0] == "norm-wrong-place"


@pytest.mark.parametrize("where", [(True, True), (True, False), (False, True)])
@pytest.mark.parametrize(
    ("right", "wiring", "code"),
    [
        ("pre", "pre-no-residual", "residual-missing"),
        ("pre", "pre-twice", "residual-twice"),
        ("pre", "stream-norm", "norm-on-residual-stream"),
        ("pre", "branch-norm", "norm-wrong-place"),
        ("post", "post-no-residual", "residual-missing"),
        ("post", "post-twice", "residual-twice"),
        ("post", "branch-norm", "norm-wrong-place"),
    ],
)
def test_wiring_mistakes_are_named(right, wiring, code, where):
    check = checks.check_pre_ln_block if right == "pre" else checks.check_post_ln_block
    got, message = code_of(check, encoder(right, wiring, where))
    assert got == code
    place = {(True, True): "both sub-layers", (True, False): "attention sub-layer",
             (False, True): "feed-forward sub-layer"}[where]
    assert place in message


def test_norm_on_the_stream_as_students_write_it():
    class StreamNorm(PreLN):
        def forward(self, x, mask=None):
            x = self.norm1(x)
            x = x + self.dropout(self.attn(x, mask=mask))
            x = self.norm2(x)
            return x + self.dropout(self.ff(x))

    assert code_of(checks.check_pre_ln_block, StreamNorm)[0] == "norm-on-residual-stream"


def test_mask_not_passed_on():
    class NoMask(PreLN):
        def forward(self, x, mask=None):
            return super().forward(x, None)

    code, message = code_of(checks.check_pre_ln_block, NoMask)
    assert code == "mask-ignored" and "self.attn(h, mask=mask)" in message


def test_dropout_in_eval():
    class AlwaysDropout(PreLN):
        def forward(self, x, mask=None):
            x = x + F.dropout(self.attn(self.norm1(x), mask=mask), self.p)  # training=True by default
            return x + F.dropout(self.ff(self.norm2(x)), self.p)

    code, message = code_of(checks.check_pre_ln_block, AlwaysDropout)
    assert code == "dropout-in-eval" and "dropout=0.5" in message
    checks.check_pre_ln_block(AlwaysDropout, test_dropout=False)


def test_unrelated_error_and_missing_layers():
    class Scaled(PreLN):
        def forward(self, x, mask=None):
            return 1.5 * super().forward(x, mask)

    assert code_of(checks.check_pre_ln_block, Scaled)[0] == "wrong-output"

    class Renamed(PreLN):
        def __init__(self, d_model, num_heads, d_ff, dropout=0.0):
            super().__init__(d_model, num_heads, d_ff, dropout)
            self.mlp = self.ff
            del self.ff

    code, message = code_of(checks.check_pre_ln_block, Renamed)
    assert code == "missing-attribute" and "missing: ['ff']" in message

    class Resized(PreLN):
        def __init__(self, d_model, num_heads, d_ff, dropout=0.0):
            super().__init__(d_model, num_heads, 2 * d_ff, dropout)

    assert code_of(checks.check_pre_ln_block, Resized)[0] == "missing-attribute"

    assert code_of(checks.check_pre_ln_block, lambda *args, **kwargs: "not a module")[0] == "wrong-type"

    class NotWritten(PreLN):
        def forward(self, x, mask=None):
            raise NotImplementedError("Exercise 2: a pre-LN block")

    assert code_of(checks.check_pre_ln_block, NotWritten)[0] == "not-implemented"


# ----------------------------------------------------------------------------------------------------------
# Feed-forward network
# ----------------------------------------------------------------------------------------------------------


class FFN(nn.Module):
    def __init__(self, d_model, d_ff, dropout=0.0):
        super().__init__()
        self.linear1, self.linear2 = nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(dropout)
        self.p = dropout

    def forward(self, x):
        return self.linear2(self.dropout(torch.relu(self.linear1(x))))


def test_feed_forward(capsys):
    checks.check_feed_forward(FFN)
    assert "✓ FFN: 3 random cases" in capsys.readouterr().out

    class NoActivation(FFN):
        def forward(self, x):
            return self.linear2(self.dropout(self.linear1(x)))

    class ActivationOnOutput(FFN):
        def forward(self, x):
            return torch.relu(self.linear2(self.linear1(x)))

    class ReluAfterBoth(FFN):
        def forward(self, x):
            return torch.relu(super().forward(x))

    class AlwaysDropout(FFN):
        def forward(self, x):
            return self.linear2(F.dropout(torch.relu(self.linear1(x)), self.p))

    assert code_of(checks.check_feed_forward, NoActivation)[0] == "ffn-activation-missing"
    assert code_of(checks.check_feed_forward, ActivationOnOutput)[0] == "wrong-output"
    code, message = code_of(checks.check_feed_forward, ReluAfterBoth)
    assert code == "ffn-activation-missing" and "after linear2" in message
    assert code_of(checks.check_feed_forward, AlwaysDropout)[0] == "dropout-in-eval"


# ----------------------------------------------------------------------------------------------------------
# Decoder block
# ----------------------------------------------------------------------------------------------------------


class Decoder(nn.Module):
    causal, kv, use_mask, norm_memory = True, "memory", True, False

    def __init__(self, d_model, num_heads, d_ff, dropout=0.0):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, num_heads, dropout=dropout)
        self.cross_attn = MultiHeadAttention(d_model, num_heads, dropout=dropout)
        self.ff = FeedForward(d_model, d_ff, dropout=dropout)
        self.norm1, self.norm2, self.norm3 = (nn.LayerNorm(d_model) for _ in range(3))
        self.dropout = nn.Dropout(dropout)

    def forward(self, x, memory, memory_mask=None):
        x = x + self.dropout(self.self_attn(self.norm1(x), is_causal=self.causal))
        h = self.norm2(x)
        source = {"memory": self.norm2(memory) if self.norm_memory else memory, "normed": h, "stream": x}[self.kv]
        mask = memory_mask if self.use_mask and self.kv == "memory" else None
        x = x + self.dropout(self.cross_attn(h, source, mask=mask))
        return x + self.dropout(self.ff(self.norm3(x)))


def decoder(**attrs):
    return type("Decoder", (Decoder,), attrs)


def test_decoder_block(capsys):
    checks.check_decoder_block(Decoder)
    assert "✓ Decoder: 3 random cases (Tq != Tk" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("attrs", "code", "words"),
    [
        ({"causal": False}, "decoder-not-causal", "is_causal=True"),
        ({"kv": "normed"}, "cross-attention-keys-from-decoder", "the normalised decoder stream"),
        ({"kv": "stream"}, "cross-attention-keys-from-decoder", "the decoder stream x"),
        ({"norm_memory": True}, "norm-wrong-place", "encoder's memory"),
        ({"use_mask": False}, "mask-ignored", "memory_mask"),
    ],
)
def test_decoder_mistakes_are_named(attrs, code, words):
    got, message = code_of(checks.check_decoder_block, decoder(**attrs))
    assert got == code and words in message


def test_decoder_dropout_in_eval():
    class AlwaysDropout(Decoder):
        def forward(self, x, memory, memory_mask=None):
            return F.dropout(super().forward(x, memory, memory_mask), 0.5) if self.dropout.p else super().forward(
                x, memory, memory_mask)

    assert code_of(checks.check_decoder_block, AlwaysDropout)[0] == "dropout-in-eval"


# ----------------------------------------------------------------------------------------------------------
# Questions
# ----------------------------------------------------------------------------------------------------------


def test_questions(capsys):
    checks.check_choice("11.depth-scaling", "b")
    checks.check_number("11.block-params", 3_152_384)
    assert capsys.readouterr().out.count("✓ 11.") == 2
    for wrong in "ACD":
        with pytest.raises(CheckFailed, match=r"^\[wrong-answer\]"):
            checks.check_choice("11.depth-scaling", wrong)
    for wrong in (3_150_336, 3_152_384 - 4608, 3_145_728, 3_152_384 - 262_656):
        with pytest.raises(CheckFailed, match=r"^\[wrong-answer\] .*: (you|those|the attention)"):
            checks.check_number("11.block-params", wrong)
    with pytest.raises(CheckFailed, match="Count each linear layer"):
        checks.check_number("11.block-params", 1234)


def test_large_whole_numbers_are_shown_in_full(capsys):
    checks.check_number("11.block-params", 3_152_384.0)
    assert "3152384 is right" in capsys.readouterr().out
    with pytest.raises(CheckFailed, match=r"^\[wrong-answer\] 3145728 is not"):
        checks.check_number("11.block-params", 3_145_728)


def test_depth_scaling_answer_is_what_the_library_measures():
    """11.depth-scaling's answer B, measured with the exercise's stacks: from 6 to 24 blocks, post-LN's top
    feed-forward gradient stays (within 25 %), pre-LN's about halves (1 / sqrt(4))."""
    from attention_course.block import depth_statistics

    ratio = {nf: depth_statistics(nf, depth=24)["ffn_gradient"][-1] / depth_statistics(nf, depth=6)["ffn_gradient"][-1]
             for nf in (False, True)}
    assert 0.8 < ratio[False] < 1.25
    assert 0.35 < ratio[True] < 0.65


def test_unknown_sublayer_variant():
    with pytest.raises(ValueError, match="nope"):
        sublayer_variant("nope", torch.zeros(1), nn.Identity(), nn.Identity())


# ----------------------------------------------------------------------------------------------------------
# Dropout in training mode, and the registry's tables (tests/test_checks_planted.py)
# ----------------------------------------------------------------------------------------------------------


class PreLNFunctional(PreLN):
    """Another style: F.dropout with the module's p and mode, the sub-layers named."""

    def forward(self, x, mask=None):
        attended = self.attn(self.norm1(x), mask=mask)
        x = x + F.dropout(attended, p=self.dropout.p, training=self.training)
        fed = self.ff(self.norm2(x))
        return x + F.dropout(fed, p=self.dropout.p, training=self.training)


class PreLNNoDropout(PreLN):
    def forward(self, x, mask=None):
        x = x + self.attn(self.norm1(x), mask=mask)
        return x + self.ff(self.norm2(x))


class PreLNTrainingFalse(PreLN):
    def forward(self, x, mask=None):
        x = x + F.dropout(self.attn(self.norm1(x), mask=mask), self.dropout.p, training=False)
        return x + F.dropout(self.ff(self.norm2(x)), self.dropout.p, training=False)


class PreLNDropsStream(PreLN):
    def forward(self, x, mask=None):
        x = self.dropout(x + self.attn(self.norm1(x), mask=mask))
        return self.dropout(x + self.ff(self.norm2(x)))


class PreLNKeepProbability(PreLN):
    def forward(self, x, mask=None):
        keep = 1 - self.dropout.p
        x = x + F.dropout(self.attn(self.norm1(x), mask=mask), keep, self.training)
        return x + F.dropout(self.ff(self.norm2(x)), keep, self.training)


class PreLNDropsBranchInput(PreLN):
    def forward(self, x, mask=None):
        x = x + self.attn(self.dropout(self.norm1(x)), mask=mask)
        return x + self.ff(self.dropout(self.norm2(x)))


class PostLNFunctional(PostLN):
    """Another style: the residual sums named, dropout as a function."""

    def forward(self, x, mask=None):
        branch = F.dropout(self.attn(x, mask=mask), self.dropout.p, self.training)
        x = self.norm1(x + branch)
        branch = F.dropout(self.ff(x), self.dropout.p, self.training)
        return self.norm2(x + branch)


class PostLNNoFeedForwardDropout(PostLN):
    def forward(self, x, mask=None):
        x = self.norm1(x + self.dropout(self.attn(x, mask=mask)))
        return self.norm2(x + self.ff(x))


class PostLNDropsAfterNorm(PostLN):
    def forward(self, x, mask=None):
        x = self.dropout(self.norm1(x + self.attn(x, mask=mask)))
        return self.dropout(self.norm2(x + self.ff(x)))


class PostLNDropsTwice(PostLN):
    def forward(self, x, mask=None):
        x = self.norm1(x + self.dropout(self.dropout(self.attn(x, mask=mask))))
        return self.norm2(x + self.dropout(self.dropout(self.ff(x))))


class DecoderFunctional(Decoder):
    """Another style: one helper for the three residual sub-layers."""

    def forward(self, x, memory, memory_mask=None):
        def residual(stream, branch_out):
            return stream + F.dropout(branch_out, self.dropout.p, self.training)

        x = residual(x, self.self_attn(self.norm1(x), is_causal=True))
        x = residual(x, self.cross_attn(self.norm2(x), memory, mask=memory_mask))
        return residual(x, self.ff(self.norm3(x)))


class DecoderNoCrossDropout(Decoder):
    def forward(self, x, memory, memory_mask=None):
        x = x + self.dropout(self.self_attn(self.norm1(x), is_causal=True))
        x = x + self.cross_attn(self.norm2(x), memory, mask=memory_mask)
        return x + self.dropout(self.ff(self.norm3(x)))


class DecoderDropsStream(Decoder):
    def forward(self, x, memory, memory_mask=None):
        x = self.dropout(x + self.self_attn(self.norm1(x), is_causal=True))
        x = self.dropout(x + self.cross_attn(self.norm2(x), memory, mask=memory_mask))
        return self.dropout(x + self.ff(self.norm3(x)))


class DecoderTrainingFalse(Decoder):
    def forward(self, x, memory, memory_mask=None):
        drop = nn.functional.dropout
        x = x + drop(self.self_attn(self.norm1(x), is_causal=True), 0.1, False)
        x = x + drop(self.cross_attn(self.norm2(x), memory, mask=memory_mask), 0.1, False)
        return x + drop(self.ff(self.norm3(x)), 0.1, False)


class FFNFunctional(FFN):
    """Another style: the layers' weights through F.linear, dropout as a function."""

    def forward(self, x):
        hidden = F.relu(F.linear(x, self.linear1.weight, self.linear1.bias))
        hidden = F.dropout(hidden, p=self.dropout.p, training=self.training)
        return F.linear(hidden, self.linear2.weight, self.linear2.bias)


class FFNNoDropout(FFN):
    def forward(self, x):
        return self.linear2(torch.relu(self.linear1(x)))


class FFNDropsInput(FFN):
    def forward(self, x):
        return self.linear2(torch.relu(self.linear1(self.dropout(x))))


class FFNDropsOutput(FFN):
    def forward(self, x):
        return self.dropout(self.linear2(torch.relu(self.linear1(x))))


class FFNHalfRate(FFN):
    def forward(self, x):
        return self.linear2(F.dropout(torch.relu(self.linear1(x)), 0.5, self.training))


class FFNNoActivation(FFN):
    def forward(self, x):
        return self.linear2(self.dropout(self.linear1(x)))


class FFNReluAfterBoth(FFN):
    def forward(self, x):
        return torch.relu(super().forward(x))


class FFNAlwaysDropout(FFN):
    def forward(self, x):
        return self.linear2(F.dropout(torch.relu(self.linear1(x)), self.p))


class PreLNAlwaysDropout(PreLN):
    def forward(self, x, mask=None):
        x = x + F.dropout(self.attn(self.norm1(x), mask=mask), self.p)
        return x + F.dropout(self.ff(self.norm2(x)), self.p)


# ----------------------------------------------------------------------------------------------------------
# RMSNorm, SwiGLU and GPT-2's initialisation
# ----------------------------------------------------------------------------------------------------------


class RMS(nn.Module):
    """The exercise's RMSNorm, right."""

    def __init__(self, d_model, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class RMSNormOf(RMS):
    """Right, another style: the root mean square through torch.linalg.vector_norm."""

    def forward(self, x):
        rms = torch.sqrt(torch.linalg.vector_norm(x, dim=-1, keepdim=True) ** 2 / x.shape[-1] + self.eps)
        return self.weight * (x / rms)


class RMSCentred(RMS):
    def forward(self, x):
        x = x - x.mean(-1, keepdim=True)
        return super().forward(x)


class RMSEpsOutside(RMS):
    def forward(self, x):
        return x / (x.pow(2).mean(-1, keepdim=True).sqrt() + self.eps) * self.weight


class RMSNoEps(RMS):
    def forward(self, x):
        return x / x.pow(2).mean(-1, keepdim=True).sqrt() * self.weight


class RMSNorm2(RMS):
    def forward(self, x):
        return x / torch.sqrt(x.pow(2).sum(-1, keepdim=True) + self.eps) * self.weight


class RMSNoWeight(RMS):
    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


class RMSWrongAxis(RMS):
    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(1, keepdim=True) + self.eps) * self.weight


class Swi(nn.Module):
    """The exercise's SwiGLU, right."""

    def __init__(self, d_model, d_ff):
        super().__init__()
        self.gate = nn.Linear(d_model, d_ff, bias=False)
        self.up = nn.Linear(d_model, d_ff, bias=False)
        self.down = nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


class SwiSigmoidTimes(Swi):
    """Right, another style: SiLU written out as z * sigmoid(z)."""

    def forward(self, x):
        z = self.gate(x)
        return self.down(z * torch.sigmoid(z) * self.up(x))


class SwiSwapped(Swi):
    def forward(self, x):
        return self.down(self.gate(x) * F.silu(self.up(x)))


class SwiSigmoid(Swi):
    def forward(self, x):
        return self.down(torch.sigmoid(self.gate(x)) * self.up(x))


class SwiGelu(Swi):
    def forward(self, x):
        return self.down(F.gelu(self.gate(x)) * self.up(x))


class SwiSum(Swi):
    def forward(self, x):
        return self.down(F.silu(self.gate(x)) + self.up(x))


class SwiNoUp(Swi):
    def forward(self, x):
        return self.down(F.silu(self.gate(x)))


def make_init(residual_std=lambda L: 0.02 / (2 * L) ** 0.5, scaled=("w_o.weight", "linear2.weight"),
              norm_scale=1.0, bias=0.0):
    """A GPT-2 initialisation, right by default; each argument plants one mistake."""

    def gpt2_init(shapes, num_layers, seed=0):
        generator = torch.Generator().manual_seed(seed)
        out = {}
        for name, shape in shapes.items():
            if name.endswith(".bias"):
                out[name] = torch.full(shape, bias)
            elif name.split(".")[-2].startswith("norm"):
                out[name] = torch.full(shape, norm_scale)
            else:
                std = residual_std(num_layers) if name.endswith(scaled) else 0.02
                out[name] = std * torch.randn(shape, generator=generator)
        return out

    return gpt2_init


def init_from_gpt(shapes, num_layers, seed=0):
    """Right, another style: the library's GPT builds itself with init="gpt2", and its state dict is the answer."""
    from attention_course.gpt import GPT, GPTConfig

    d_model = shapes["tok_emb.weight"][1]
    model = GPT(GPTConfig(shapes["tok_emb.weight"][0], d_model, 4, num_layers,
                          max_len=shapes["pos_emb.table.weight"][0]), seed=seed)
    return {name: t.clone() for name, t in model.state_dict().items()}


def test_parts_pass(capsys):
    checks.check_rms_norm(RMS)
    checks.check_swiglu(Swi)
    checks.check_residual_init(make_init())
    out = capsys.readouterr().out
    assert "✓ RMS: 3 random cases" in out and "✓ Swi: 3 random cases" in out and "✓ gpt2_init: 2 GPTs" in out


def test_part_messages():
    code, message = code_of(checks.check_residual_init, make_init(residual_std=lambda L: 0.02 / L ** 0.5))
    assert code == "residual-init-depth" and "N = 4, the number of blocks" in message
    code, message = code_of(checks.check_residual_init, make_init(scaled=("w_o.weight",)))
    assert code == "residual-init-wrong-layers" and "linear2.weight writes into the stream" in message
    code, message = code_of(checks.check_swiglu, SwiGelu)
    assert "a GELU (GEGLU)" in message
    code, message = code_of(checks.check_rms_norm, RMSEpsOutside)
    assert "x / (sqrt(mean(x^2)) + eps)" in message and "x[0, 0] tiny" in message


def test_init_returns_checked():
    assert code_of(checks.check_residual_init, lambda shapes, num_layers, seed=0: [1, 2])[0] == "wrong-type"
    assert code_of(checks.check_residual_init, lambda shapes, num_layers, seed=0: {})[0] == "wrong-type"

    def transposed(shapes, num_layers, seed=0):
        return {name: torch.zeros(tuple(reversed(shape))) for name, shape in shapes.items()}

    assert code_of(checks.check_residual_init, transposed)[0] == "wrong-shape"


pre, post = checks.check_pre_ln_block, checks.check_post_ln_block
CORRECT = [(pre, PreLN), (pre, PreLNFunctional), (post, PostLN), (post, PostLNFunctional),
           (checks.check_decoder_block, Decoder), (checks.check_decoder_block, DecoderFunctional),
           (checks.check_feed_forward, FFN), (checks.check_feed_forward, FFNFunctional),
           (checks.check_rms_norm, RMS), (checks.check_rms_norm, RMSNormOf), (checks.check_swiglu, Swi),
           (checks.check_swiglu, SwiSigmoidTimes), (checks.check_residual_init, make_init()),
           (checks.check_residual_init, init_from_gpt)]
PLANTED = [
    (pre, encoder("pre", "pre-no-residual"), "residual-missing"),
    (pre, encoder("pre", "pre-twice", (False, True)), "residual-twice"),
    (pre, encoder("pre", "stream-norm"), "norm-on-residual-stream"),
    (pre, encoder("pre", "branch-norm", (True, False)), "norm-wrong-place"),
    (pre, PostLN, "norm-wrong-place"),
    (pre, PreLNAlwaysDropout, "dropout-in-eval"),
    (pre, PreLNNoDropout, "branch-dropout-off"),
    (pre, PreLNTrainingFalse, "branch-dropout-off"),
    (pre, PreLNDropsBranchInput, "branch-dropout-off"),
    (pre, PreLNDropsStream, "dropout-not-on-branch"),
    (pre, PreLNKeepProbability, "dropout-wrong-rate"),
    (post, encoder("post", "post-no-residual"), "residual-missing"),
    (post, encoder("post", "post-twice", (True, False)), "residual-twice"),
    (post, PreLN, "norm-wrong-place"),
    (post, PostLNNoFeedForwardDropout, "branch-dropout-off"),
    (post, PostLNDropsAfterNorm, "dropout-not-on-branch"),
    (post, PostLNDropsTwice, "dropout-wrong-rate"),
    (checks.check_decoder_block, decoder(causal=False), "decoder-not-causal"),
    (checks.check_decoder_block, decoder(kv="normed"), "cross-attention-keys-from-decoder"),
    (checks.check_decoder_block, decoder(norm_memory=True), "norm-wrong-place"),
    (checks.check_decoder_block, decoder(use_mask=False), "mask-ignored"),
    (checks.check_decoder_block, DecoderNoCrossDropout, "branch-dropout-off"),
    (checks.check_decoder_block, DecoderTrainingFalse, "branch-dropout-off"),
    (checks.check_decoder_block, DecoderDropsStream, "dropout-not-on-branch"),
    (checks.check_feed_forward, FFNNoActivation, "ffn-activation-missing"),
    (checks.check_feed_forward, FFNReluAfterBoth, "ffn-activation-missing"),
    (checks.check_feed_forward, FFNAlwaysDropout, "dropout-in-eval"),
    (checks.check_feed_forward, FFNNoDropout, "branch-dropout-off"),
    (checks.check_feed_forward, FFNDropsInput, "dropout-not-on-branch"),
    (checks.check_feed_forward, FFNDropsOutput, "dropout-not-on-branch"),
    (checks.check_feed_forward, FFNHalfRate, "dropout-wrong-rate"),
    (checks.check_rms_norm, RMSCentred, "rmsnorm-mean-subtracted"),
    (checks.check_rms_norm, RMSEpsOutside, "rmsnorm-eps-misplaced"),
    (checks.check_rms_norm, RMSNoEps, "rmsnorm-eps-misplaced"),
    (checks.check_rms_norm, RMSNorm2, "rmsnorm-not-mean"),
    (checks.check_rms_norm, RMSNoWeight, "rmsnorm-scale-missing"),
    (checks.check_rms_norm, RMSWrongAxis, "norm-wrong-axis"),
    (checks.check_swiglu, SwiSwapped, "swiglu-gate-swapped"),
    (checks.check_swiglu, SwiSigmoid, "swiglu-wrong-activation"),
    (checks.check_swiglu, SwiGelu, "swiglu-wrong-activation"),
    (checks.check_swiglu, SwiSum, "swiglu-not-gated"),
    (checks.check_swiglu, SwiNoUp, "swiglu-not-gated"),
    (checks.check_residual_init, make_init(residual_std=lambda L: 0.02 / L ** 0.5), "residual-init-depth"),
    (checks.check_residual_init, make_init(residual_std=lambda L: 0.02 / (2 * L)), "residual-init-depth"),
    (checks.check_residual_init, make_init(residual_std=lambda L: 0.02), "residual-init-wrong-layers"),
    (checks.check_residual_init, make_init(scaled=("weight",)), "residual-init-wrong-layers"),
    (checks.check_residual_init, make_init(norm_scale=0.0), "init-norm-or-bias"),
    (checks.check_residual_init, make_init(bias=0.02), "init-norm-or-bias"),
]


def test_training_probe_names_the_sub_layer():
    code, message = code_of(checks.check_decoder_block, DecoderNoCrossDropout)
    assert code == "branch-dropout-off" and "the cross-attention sub-layer's output" in message
    code, message = code_of(checks.check_post_ln_block, PostLNNoFeedForwardDropout)
    assert code == "branch-dropout-off" and "the feed-forward sub-layer's output" in message
    code, message = code_of(checks.check_feed_forward, FFNHalfRate)
    assert "multiplied by 2," in message and "1 / (1 - p) = 1.33" in message


def test_checks_leave_the_notebooks_random_stream_as_it_was():
    torch.manual_seed(0)
    checks.check_pre_ln_block(PreLN)
    after = torch.rand(3)
    torch.manual_seed(0)
    assert torch.equal(after, torch.rand(3))


@pytest.mark.parametrize("seed", [0, 7])
def test_parts_under_hidden_cases(seed, capsys):
    """The grader's hidden case (Topic.BLOCK's sizes, another depth for the initialisation): right answers pass,
    and a mistake is named as on the public cases."""
    from attention_course.checks import hidden

    with hidden.drawn_from(seed):
        checks.check_rms_norm(RMS)
        checks.check_swiglu(Swi)
        checks.check_residual_init(make_init())
        assert "4 random cases" in capsys.readouterr().out
        assert code_of(checks.check_rms_norm, RMSCentred)[0] == "rmsnorm-mean-subtracted"
        assert code_of(checks.check_residual_init, make_init(residual_std=lambda L: 0.02 / L ** 0.5))[0] == \
            "residual-init-depth"
