"""Checks of chapter 11: the feed-forward network, pre-LN and post-LN blocks,
the decoder block, RMSNorm and SwiGLU from their equations, GPT-2's
initialisation; its questions.

RMSNorm and SwiGLU are compared with the library's on inputs where each known
mistake shows (a mean far from 0, a position of tiny features for eps;
different weights in SwiGLU's gate and up). The initialisation is judged by the
standard deviation measured on every tensor the student returns, which tells
1/sqrt(2L) from 1/sqrt(L) at any depth.

The student completes the ``forward`` of a module whose ``__init__`` the
exercise gives (attribute names as in :mod:`attention_course.block`). The
checker builds it, loads random weights from the matching reference block
(LayerNorm scales and biases random too, so a norm in the wrong place shows),
runs it in eval mode on cases with and without padding, Tq != Tk for
cross-attention, and compares with the reference. A wrong output is diagnosed
by recomputing the block with each known wiring mistake
(:func:`sublayer_variant`) in one or both sub-layers.

Dropout is probed in both modes: built with dropout=0.5 the module must be
deterministic after ``.eval()``; built with dropout=0.25 and in ``.train()``
mode, each sub-layer's output (the feed-forward network: its hidden features)
must be dropped at that rate (:func:`_branch_probe`). The probe loads weights
only (so it also runs on the grader's stand-in for a module in the sandbox):
each sub-layer in turn outputs a known constant (its output projection zero,
its bias the constant), so what reached the residual stream is read back from
the block's output alone.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from .. import block
from ..gpt import GPT, GPTConfig
from ..masks import padding_mask
from . import hidden
from .diagnosis import diagnose
from .modules import _TRAIN_P, _keeping_rng, _require_eval_outputs
from .questions import choice_question, number_question
from .runner import (
    DEFAULT_TIMEOUT,
    as_array,
    call,
    close,
    display_name,
    fail,
    is_instance,
    run_check,
    shape_text,
)

ATOL, RTOL = 1e-4, 1e-4
# (d_model, num_heads, d_ff, B, T, Tk of the memory, padding): unpadded first,
# so wiring is checked before masks
_CONFIGS = [
    (8, 2, 16, 2, 5, 7, False),
    (12, 3, 20, 3, 4, 6, True),
    (16, 4, 8, 1, 6, 3, True),
]


# -----------------------------------------------------------------------------
# Building, loading and running the student's module
# -----------------------------------------------------------------------------


def _randomised(module: torch.nn.Module, seed: int) -> torch.nn.Module:
    """The module with seeded random parameters (norm scales around 1), in eval
    mode."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            scale = name.rsplit(".", 1)[0].split(".")[-1].startswith(
                "norm"
            ) and name.endswith("weight")
            p.copy_(
                0.4 * torch.randn(p.shape, generator=generator)
                + (1.0 if scale else 0.0)
            )
    return module.eval()


def _build(
    cls, label: str, args: tuple, dropout: float | None
) -> torch.nn.Module:
    """The student's module ``cls(*args[, dropout=...])`` in eval mode."""
    kwargs = {} if dropout is None else {"dropout": dropout}
    call_text = (
        f"{label}({', '.join(map(str, args))}"
        f"{', dropout=' + str(dropout) if kwargs else ''})"
    )
    names = (
        ("d_model", "num_heads", "d_ff")
        if len(args) == 3
        else ("d_model", "d_ff")
    )
    module = call(
        cls,
        dict(zip(names, args, strict=True)) | kwargs,
        label,
        positional=len(args),
        call_text=call_text,
    )
    if not is_instance(module, torch.nn.Module):
        raise fail(
            "wrong-type",
            f"{label}(...) built a {type(module).__name__}; expected a "
            "torch.nn.Module.",
        )
    return module.eval()


def _load(
    module: torch.nn.Module, reference: torch.nn.Module, label: str
) -> None:
    """Copy the reference's weights into the student's module (same attribute
    names)."""
    try:
        # strict=False: missing or extra layers come back in `result` to be
        # named below; a layer of the right name but another shape still raises
        result = module.load_state_dict(reference.state_dict(), strict=False)
    except RuntimeError as err:
        first = (
            str(err).strip().splitlines()[1].strip()
            if "\n" in str(err).strip()
            else str(err)
        )
        raise fail(
            "missing-attribute",
            f"{label}'s layers do not have the sizes the exercise's "
            "__init__ gives them: "
            f"{first}. Write only forward().",
        ) from None
    if result.missing_keys or result.unexpected_keys:
        missing = sorted({k.split(".")[0] for k in result.unexpected_keys})
        extra = sorted({k.split(".")[0] for k in result.missing_keys})
        raise fail(
            "missing-attribute",
            f"{label} must keep the layers the exercise's __init__ creates; "
            f"missing: {missing or 'none'}, not expected: "
            f"{extra or 'none'}. Write only forward().",
        )


def _run(module, args: dict, label: str, case: str, positional: int):
    with torch.no_grad():
        return as_array(
            call(module, args, label, positional=positional), "result", case
        )


# -----------------------------------------------------------------------------
# The known wiring mistakes, recomputed with the reference's layers
# -----------------------------------------------------------------------------


def sublayer_variant(kind: str, x, branch, norm):
    """One residual sub-layer, wired right ("pre", "post") or with one known
    mistake."""
    if kind == "pre":
        return x + branch(norm(x))
    if kind == "post":
        return norm(x + branch(x))
    if kind == "pre-no-residual":
        return branch(norm(x))
    if kind == "post-no-residual":
        return norm(branch(x))
    if kind == "pre-twice":
        return 2 * x + branch(norm(x))
    if kind == "post-twice":
        return norm(2 * x + branch(x))
    if kind == "stream-norm":  # x = norm(x); x = x + branch(x)
        h = norm(x)
        return h + branch(h)
    if kind == "branch-norm":  # the norm on the branch's output
        return x + norm(branch(x))
    raise ValueError(kind)


_WHERE = {
    (True, True): "in both sub-layers",
    (True, False): "in the attention sub-layer",
    (False, True): "in the feed-forward sub-layer",
}
_PRE_MISTAKES = [
    ("residual-missing", "pre-no-residual", ""),
    ("residual-twice", "pre-twice", ""),
    ("norm-on-residual-stream", "stream-norm", ""),
    (
        "norm-wrong-place",
        "post",
        "you normalise AFTER adding the branch (the post-LN order)",
    ),
    (
        "norm-wrong-place",
        "branch-norm",
        "you normalise the branch's output instead of its input",
    ),
]
_POST_MISTAKES = [
    ("residual-missing", "post-no-residual", ""),
    ("residual-twice", "post-twice", ""),
    (
        "norm-wrong-place",
        "pre",
        "you normalise the branch's input (the pre-LN order) instead of the "
        "sum",
    ),
    (
        "norm-wrong-place",
        "branch-norm",
        "you normalise the branch's output before adding it, not the sum",
    ),
]


def _encoder_candidates(ref, x, mask, norm_first: bool):
    """(code, detail, thunk) for every known mistake of an encoder block, in
    one or both sub-layers."""
    right = "pre" if norm_first else "post"

    def run(attn_kind, ff_kind, use_mask=True):
        def thunk():
            with torch.no_grad():
                h = sublayer_variant(
                    attn_kind,
                    x,
                    lambda y: ref.attn(y, mask=mask if use_mask else None),
                    ref.norm1,
                )
                return sublayer_variant(
                    ff_kind, h, ref.ff, ref.norm2
                ).numpy(), None

        return thunk

    out = []
    for code, kind, what in _PRE_MISTAKES if norm_first else _POST_MISTAKES:
        for (in_attn, in_ff), where in _WHERE.items():
            detail = f"{what + ', ' if what else ''}{where}"
            out.append(
                (
                    code,
                    detail,
                    run(kind if in_attn else right, kind if in_ff else right),
                )
            )
    if mask is not None:
        out.append(("mask-ignored", "", run(right, right, use_mask=False)))
    return out


def _decoder_candidates(ref, x, memory, memory_mask):
    """(code, detail, thunk) for the known mistakes of a pre-LN decoder
    block."""

    def run(causal=True, kv="memory", use_mask=True, norm_memory=False):
        def thunk():
            with torch.no_grad():
                h = x + ref.self_attn(ref.norm1(x), is_causal=causal)
                q = ref.norm2(h)
                source = {
                    "memory": ref.norm2(memory) if norm_memory else memory,
                    "normed": q,
                    "stream": h,
                }[kv]
                mask = memory_mask if use_mask and kv == "memory" else None
                h = h + ref.cross_attn(q, source, mask=mask)
                return (h + ref.ff(ref.norm3(h))).numpy(), None

        return thunk

    out = [
        ("decoder-not-causal", "", run(causal=False)),
        (
            "cross-attention-keys-from-decoder",
            "the normalised decoder stream",
            run(kv="normed"),
        ),
        (
            "cross-attention-keys-from-decoder",
            "the decoder stream x",
            run(kv="stream"),
        ),
        (
            "norm-wrong-place",
            (
                "you normalise the encoder's memory: only the decoder "
                "stream's branch input is "
                "normalised (the encoder has done its own normalisation)"
            ),
            run(norm_memory=True),
        ),
    ]
    if memory_mask is not None:
        out.append(("mask-ignored", "", run(use_mask=False)))
    return out


_MASK_IGNORED = {
    "encoder": "Your block ignores the padding mask: pass it on to the "
    "self-attention, self.attn(h, mask=mask).",
    "decoder": "Your block ignores the memory's padding mask: pass it to the "
    "cross-attention, "
    "self.cross_attn(h, memory, mask=memory_mask).",
}


def _diagnose(out, candidates, case, expected, kind):
    """diagnose(), with the block's own message for an ignored mask."""
    try:
        diagnose(
            out,
            None,
            candidates,
            case,
            expected,
            None,
            what="block output",
            atol=ATOL,
            rtol=RTOL,
        )
    except AssertionError as err:
        if getattr(err, "code", "") == "mask-ignored":
            raise fail(
                "mask-ignored", _MASK_IGNORED[kind], case=case
            ) from None
        raise


# -----------------------------------------------------------------------------
# Dropout in training mode, read back from the output
# -----------------------------------------------------------------------------

# what the probed sub-layer outputs everywhere: far from the stream's N(0, 1)
# features
_PROBE_VALUE = 10.0
# (B, T): 1024 features of d_model=16 per probe, so the drop rate is measured
# within 0.1
_PROBE_SHAPE = (4, 16)


def _constant_branches(
    ref: torch.nn.Module, on: str, value: float
) -> torch.nn.Module:
    """``ref`` with every attention's output projection and the feed-forward's
    second layer zeroed, so each sub-layer outputs its bias: ``value`` for the
    sub-layer ``on``, 0 for the others; LayerNorms 1 and 0."""
    with torch.no_grad():
        for name, layer in ref.named_children():
            last = getattr(layer, "w_o", None) or getattr(
                layer, "linear2", None
            )
            if last is not None:
                last.weight.zero_()
                last.bias.fill_(value if name == on else 0.0)
            elif isinstance(layer, torch.nn.LayerNorm):
                layer.weight.fill_(1.0)
                layer.bias.zero_()
    return ref


def _read_back(
    y: np.ndarray, base: np.ndarray, normed: bool
) -> np.ndarray | None:
    """What was added to the stream ``base`` (B, T, D) before the output ``y``:
    y - base, or (post-LN, ``normed``) through the LayerNorm: per position, the
    features split at the widest gap of y into those nothing was added to and
    those that got the same v, and base = sigma y + mu - v [added] is solved
    for sigma, mu and v. None when it does not hold (the stream itself was
    changed, or what was added differs from feature to feature)."""
    if not normed:
        return y - base
    rows, bases = (
        y.reshape(-1, y.shape[-1]).astype(np.float64),
        base.reshape(-1, base.shape[-1]),
    )
    added = np.empty_like(rows)
    for i, (row, b) in enumerate(zip(rows, bases, strict=True)):
        ordered = np.sort(row)
        kept = (row > ordered[np.argmax(np.diff(ordered))]).astype(np.float64)
        design = np.stack([row, np.ones_like(row), -kept], axis=-1)
        (sigma, mu, v), *_ = np.linalg.lstsq(design, b, rcond=None)
        if np.abs(design @ (sigma, mu, v) - b).max() > 1e-2:
            return None
        added[i] = v * kept
    return added.reshape(y.shape)


def _branch_probe(
    ratios,
    where: str,
    case: str,
    unreadable: str = "the residual stream itself changed: some "
    "of its features were zeroed or rescaled",
    normed: bool = False,
) -> None:
    """``ratios`` (what reached the stream over what the sub-layer computed;
    None: not readable) must be, feature by feature, 0 (dropped) or 1 / (1 - p)
    (kept), about a fraction p of them dropped. Through a LayerNorm
    (``normed``) a constant added to every feature is invisible: a branch never
    dropped reads as 0 everywhere."""
    p, scale = _TRAIN_P, 1 / (1 - _TRAIN_P)
    if ratios is None:
        raise fail(
            "dropout-not-on-branch",
            detail=f"probing {where}, {unreadable}",
            case=case,
        )
    dropped = np.abs(ratios) < 1e-3
    if (not dropped.any() and np.allclose(ratios, 1.0, rtol=1e-3)) or (
        normed and dropped.all()
    ):
        raise fail("branch-dropout-off", detail=where, case=case)
    factor = float(np.median(ratios[~dropped])) if (~dropped).any() else 0.0
    if dropped.all() or not np.allclose(ratios[~dropped], factor, rtol=1e-2):
        raise fail(
            "dropout-not-on-branch",
            detail=f"probing {where}, what reached the stream is not that "
            "output "
            "with some features zeroed (each either 0 or the same multiple "
            "of the output without dropout)",
            case=case,
        )
    if not np.isclose(factor, scale, rtol=1e-2):
        raise fail(
            "dropout-wrong-rate",
            detail=f"the features of {where} it keeps are multiplied by "
            f"{factor:.3g}, "
            f"where dropout={p} keeps them scaled by 1 / (1 - p) = "
            f"{scale:.3g}",
            case=case,
        )
    rate = float(dropped.mean())
    # about seven standard deviations of the rate over 1024 features
    if abs(rate - p) > 0.1:
        raise fail(
            "dropout-wrong-rate",
            detail=f"it drops {rate:.0%} of the features of {where}, where "
            f"dropout={p} drops about {p:.0%}",
            case=case,
        )


_DROPOUT_TEXT = (
    "; dropout is off in eval mode and drops each sub-layer's output at "
    "rate p in training mode"
)
_SUBLAYERS = {
    "attn": "the attention sub-layer's output",
    "self_attn": "the self-attention sub-layer's output",
    "cross_attn": "the cross-attention sub-layer's output",
    "ff": "the feed-forward sub-layer's output",
}


def _training_probes(cls, label, make_ref, sublayers, normed, memory=False):
    """Each sub-layer in turn outputs _PROBE_VALUE in a module built with
    dropout=_TRAIN_P, in .train() mode."""
    d_model, num_heads, d_ff = 16, 2, 24
    generator = torch.Generator().manual_seed(60)
    x = torch.randn(*_PROBE_SHAPE, d_model, generator=generator)
    args = (
        {
            "x": x,
            "memory": torch.randn(
                _PROBE_SHAPE[0], 6, d_model, generator=generator
            ),
        }
        if memory
        else {"x": x}
    )
    case = (
        f"d_model={d_model}, num_heads={num_heads}, d_ff={d_ff}, "
        f"dropout={_TRAIN_P}, training mode; x of shape "
        f"{shape_text(x.shape)}; every sub-layer's output projection is "
        "zero and its bias constant"
    )
    for name in sublayers:
        module = _build(cls, label, (d_model, num_heads, d_ff), _TRAIN_P)
        _load(
            module,
            _constant_branches(
                make_ref(d_model, num_heads, d_ff), name, _PROBE_VALUE
            ),
            label,
        )
        module.train()
        out = _run(module, args, label, case, positional=len(args))
        base = (
            x.numpy()
            if not normed or name == sublayers[0]
            else F.layer_norm(x, (d_model,)).numpy()
        )
        added = _read_back(out, base, normed)
        _branch_probe(
            None if added is None else added / _PROBE_VALUE,
            _SUBLAYERS[name],
            case,
            normed=normed,
        )


def _ffn_training_probe(cls, label):
    """The hidden features in .train() mode, read back through linear2 (d_ff <
    d_model: a left inverse exists), over relu(linear1(x)) (all positive:
    linear1's bias is large)."""
    d_model, d_ff = 16, 8
    generator = torch.Generator().manual_seed(61)
    ref = block.FeedForward(d_model, d_ff)
    with torch.no_grad():
        ref.linear1.weight.copy_(
            0.1 * torch.randn(d_ff, d_model, generator=generator)
        )
        ref.linear1.bias.fill_(3.0)
        ref.linear2.weight.copy_(
            torch.randn(d_model, d_ff, generator=generator)
        )
        ref.linear2.bias.copy_(torch.randn(d_model, generator=generator))
        # 1024 hidden features
        x = torch.randn(8, 16, d_model, generator=generator)
        hidden = torch.relu(ref.linear1(x)).double().numpy()
    case = (
        f"d_model={d_model}, d_ff={d_ff}, dropout={_TRAIN_P}, training "
        f"mode; x of shape {shape_text(x.shape)}"
    )
    module = _build(cls, label, (d_model, d_ff), _TRAIN_P)
    _load(module, ref, label)
    module.train()
    out = _run(module, {"x": x}, label, case, positional=1).astype(np.float64)
    w2, b2 = (
        ref.linear2.weight.detach().double().numpy(),
        ref.linear2.bias.detach().double().numpy(),
    )
    rows = (out - b2).reshape(-1, d_model)
    # (d_ff, B T): what linear2 was given
    applied, *_ = np.linalg.lstsq(w2, rows.T, rcond=None)
    readable = np.abs(w2 @ applied - rows.T).max() < 1e-3
    ratios = (applied.T.reshape(hidden.shape) / hidden) if readable else None
    _branch_probe(
        ratios,
        "the hidden features (after the activation)",
        case,
        unreadable="the output is not linear2 of any hidden features: "
        "something after linear2 was dropped",
    )


# -----------------------------------------------------------------------------
# The checks
# -----------------------------------------------------------------------------


def _case(config, seed):
    d_model, _, _, b, t, t_k, padded = config
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(b, t, d_model, generator=generator)
    memory = torch.randn(b, t_k, d_model, generator=generator)
    lengths = [t_k - i % t_k for i in range(b)]
    mask = padding_mask([t - i % t for i in range(b)], t) if padded else None
    memory_mask = padding_mask(lengths, t_k) if padded else None
    return x, memory, mask, memory_mask


def _describe(config, mask, memory=None, memory_mask=None):
    d_model, num_heads, d_ff, b, t, _, _ = config
    text = (
        f"d_model={d_model}, num_heads={num_heads}, d_ff={d_ff}; x of "
        f"shape {shape_text((b, t, d_model))}"
    )
    if memory is not None:
        text += f", memory of shape {shape_text(memory.shape)}"
        mask = memory_mask
    return text + (
        f", padding mask of shape {shape_text(mask.shape)}"
        if mask is not None
        else ", no mask"
    )


def _configs():
    """The public configurations, then the hidden ones (batches of 5 and more,
    each example with its padding)."""
    return _CONFIGS + [(*sizes, True) for sizes in hidden.block_sizes()]


def _check_encoder_body(cls, label, norm_first, test_dropout):
    configs = _configs()
    for i, config in enumerate(configs, 1):
        d_model, num_heads, d_ff = config[:3]
        ref = _randomised(
            block.EncoderBlock(
                d_model, num_heads, d_ff, norm_first=norm_first
            ),
            seed=i,
        )
        x, _, mask, _ = _case(config, seed=10 + i)
        case = f"case {i} of {len(configs)}: {_describe(config, mask)}"
        module = _build(cls, label, (d_model, num_heads, d_ff), None)
        _load(module, ref, label)
        out = _run(module, {"x": x, "mask": mask}, label, case, positional=1)
        with torch.no_grad():
            expected = ref(x, mask=mask).numpy()
        if not close(out, expected, ATOL, RTOL):
            _diagnose(
                out,
                _encoder_candidates(ref, x, mask, norm_first),
                case,
                expected,
                "encoder",
            )
        if test_dropout and i == len(_CONFIGS):
            noisy = _build(cls, label, (d_model, num_heads, d_ff), 0.5)
            _load(noisy, ref, label)
            outs = [
                _run(noisy, {"x": x, "mask": mask}, label, case, positional=1)
                for _ in range(2)
            ]
            _require_eval_outputs(outs, expected, ATOL, RTOL, case)
    if test_dropout:
        _training_probes(
            cls,
            label,
            lambda *sizes: block.EncoderBlock(*sizes, norm_first=norm_first),
            ["attn", "ff"],
            normed=not norm_first,
        )
    order = (
        "x + drop(branch(norm(x)))"
        if norm_first
        else "norm(x + drop(branch(x)))"
    )
    text = (
        f"✓ {display_name(cls, label)}: {len(configs)} random cases (head "
        "counts 2 to 4, d_ff != d_model, "
        f"with and without padding) match the reference {order}"
    )
    return text + (_DROPOUT_TEXT if test_dropout else "")


def check_pre_ln_block(
    cls, *, test_dropout: bool = True, timeout: float = DEFAULT_TIMEOUT
):
    """Check a pre-LN encoder block ``cls(d_model, num_heads, d_ff,
    dropout=0.0)`` with attributes ``attn``
    (:class:`~attention_course.multi_head.MultiHeadAttention`), ``ff``
    (:class:`~attention_course.block.FeedForward`), ``norm1``, ``norm2`` and
    ``dropout``, called as ``module(x, mask=None)`` on x (B, T, D) with a
    padding mask (B, 1, 1, T) or None: ``x + drop(attn(norm1(x)))`` then ``x +
    drop(ff(norm2(x)))``, as :class:`~attention_course.block.EncoderBlock` with
    ``norm_first=True``. Diagnoses ``[residual-missing]``,
    ``[residual-twice]``, ``[norm-on-residual-stream]``,
    ``[norm-wrong-place]``, ``[mask-ignored]`` and ``[dropout-in-eval]``."""
    run_check(
        _keeping_rng(
            lambda: _check_encoder_body(cls, "PreLNBlock", True, test_dropout)
        ),
        timeout,
    )


def check_post_ln_block(
    cls, *, test_dropout: bool = True, timeout: float = DEFAULT_TIMEOUT
):
    """As :func:`check_pre_ln_block`, for the post-LN order: ``norm1(x +
    drop(attn(x)))`` then ``norm2(x + drop(ff(x)))``
    (:class:`~attention_course.block.EncoderBlock`, ``norm_first=False``)."""
    run_check(
        _keeping_rng(
            lambda: _check_encoder_body(
                cls, "PostLNBlock", False, test_dropout
            )
        ),
        timeout,
    )


def _check_decoder_body(cls, label, test_dropout):
    configs = _configs()
    for i, config in enumerate(configs, 1):
        d_model, num_heads, d_ff = config[:3]
        ref = _randomised(
            block.DecoderBlock(d_model, num_heads, d_ff, norm_first=True),
            seed=20 + i,
        )
        x, memory, _, memory_mask = _case(config, seed=30 + i)
        case = (
            f"case {i} of {len(configs)}: "
            f"{_describe(config, None, memory, memory_mask)}"
        )
        module = _build(cls, label, (d_model, num_heads, d_ff), None)
        _load(module, ref, label)
        args = {"x": x, "memory": memory, "memory_mask": memory_mask}
        out = _run(module, args, label, case, positional=2)
        with torch.no_grad():
            expected = ref(
                x, memory, memory_mask=memory_mask, is_causal=True
            ).numpy()
        if not close(out, expected, ATOL, RTOL):
            _diagnose(
                out,
                _decoder_candidates(ref, x, memory, memory_mask),
                case,
                expected,
                "decoder",
            )
        if test_dropout and i == len(_CONFIGS):
            noisy = _build(cls, label, (d_model, num_heads, d_ff), 0.5)
            _load(noisy, ref, label)
            outs = [
                _run(noisy, args, label, case, positional=2) for _ in range(2)
            ]
            _require_eval_outputs(outs, expected, ATOL, RTOL, case)
    if test_dropout:
        _training_probes(
            cls,
            label,
            lambda *sizes: block.DecoderBlock(*sizes, norm_first=True),
            ["self_attn", "cross_attn", "ff"],
            normed=False,
            memory=True,
        )
    text = (
        f"✓ {display_name(cls, label)}: {len(configs)} random cases (Tq != "
        "Tk, head counts 2 to 4, with and "
        "without the memory's padding mask) match the reference: causal "
        "self-attention, cross-attention to the "
        "memory, feed-forward"
    )
    return text + (_DROPOUT_TEXT if test_dropout else "")


def check_decoder_block(
    cls, *, test_dropout: bool = True, timeout: float = DEFAULT_TIMEOUT
):
    """Check a pre-LN decoder block ``cls(d_model, num_heads, d_ff,
    dropout=0.0)`` with attributes ``self_attn``, ``cross_attn``, ``ff``,
    ``norm1``, ``norm2``, ``norm3`` and ``dropout``, called as ``module(x,
    memory, memory_mask=None)``: x (B, Tq, D) the decoder stream, memory (B,
    Tk, D) the encoder's output, memory_mask (B, 1, 1, Tk) or None; as
    :class:`~attention_course.block.DecoderBlock` with ``norm_first=True``.
    Diagnoses ``[decoder-not-causal]``,
    ``[cross-attention-keys-from-decoder]``, ``[norm-wrong-place]`` (memory
    normalised), ``[mask-ignored]`` and ``[dropout-in-eval]``."""
    run_check(
        _keeping_rng(
            lambda: _check_decoder_body(cls, "DecoderBlock", test_dropout)
        ),
        timeout,
    )


def _ffn_cases(cls, label, configs, make_ref, seed):
    """For each (d_model, d_ff, (B, T)) of configs: (i, d_model, d_ff, ref, x,
    case, out), ref = make_ref(d_model, d_ff) with random weights (seed + i), x
    (B, T, D) drawn from seed + 10 + i, and out the student's module
    ``cls(d_model, d_ff)``, loaded with ref's weights, run on x."""
    for i, (d_model, d_ff, (b, t)) in enumerate(configs, 1):
        ref = _randomised(make_ref(d_model, d_ff), seed=seed + i)
        x = torch.randn(
            b,
            t,
            d_model,
            generator=torch.Generator().manual_seed(seed + 10 + i),
        )
        case = (
            f"case {i} of {len(configs)}: d_model={d_model}, "
            f"d_ff={d_ff}; x of shape {shape_text(x.shape)}"
        )
        module = _build(cls, label, (d_model, d_ff), None)
        _load(module, ref, label)
        yield (
            i,
            d_model,
            d_ff,
            ref,
            x,
            case,
            _run(module, {"x": x}, label, case, positional=1),
        )


def _check_ffn_body(cls, label, test_dropout):
    configs = _part_configs(
        [(8, 32, (2, 5)), (12, 20, (3, 4)), (6, 6, (1, 7))]
    )
    for i, d_model, d_ff, ref, x, case, out in _ffn_cases(
        cls, label, configs, block.FeedForward, seed=40
    ):
        with torch.no_grad():
            expected = ref(x).numpy()
            linear = ref.linear2(ref.linear1(x)).numpy()
            on_output = F.relu(ref(x)).numpy()
        candidates = [
            (
                "ffn-activation-missing",
                "",
                lambda linear=linear: (linear, None),
            ),
            (
                "ffn-activation-missing",
                " (you apply it to the output, after linear2, instead)",
                lambda on_output=on_output: (on_output, None),
            ),
        ]
        if not close(out, expected, ATOL, RTOL):
            diagnose(
                out,
                None,
                candidates,
                case,
                expected,
                None,
                what="output",
                atol=ATOL,
                rtol=RTOL,
            )
        if test_dropout and i == 1:
            noisy = _build(cls, label, (d_model, d_ff), 0.5)
            _load(noisy, ref, label)
            outs = [
                _run(noisy, {"x": x}, label, case, positional=1)
                for _ in range(2)
            ]
            _require_eval_outputs(outs, expected, ATOL, RTOL, case)
    if test_dropout:
        _ffn_training_probe(cls, label)
    text = (
        f"✓ {display_name(cls, label)}: {len(configs)} random cases (d_ff > "
        "d_model and d_ff = d_model) match "
        "linear2(drop(relu(linear1(x))))"
    )
    return text + (
        "; dropout is off in eval mode and drops the hidden features at "
        "rate p in training mode"
        if test_dropout
        else ""
    )


def check_feed_forward(
    cls, *, test_dropout: bool = True, timeout: float = DEFAULT_TIMEOUT
):
    """Check a position-wise feed-forward network ``cls(d_model, d_ff,
    dropout=0.0)`` with attributes ``linear1`` (D -> d_ff), ``linear2`` (d_ff
    -> D) and ``dropout``, called as ``module(x)`` on x (B, T, D):
    ``linear2(drop(relu(linear1(x))))``. Diagnoses ``[ffn-activation-missing]``
    and ``[dropout-in-eval]``."""
    run_check(
        _keeping_rng(
            lambda: _check_ffn_body(cls, "FeedForward", test_dropout)
        ),
        timeout,
    )


# -----------------------------------------------------------------------------
# RMSNorm and SwiGLU from their equations
# -----------------------------------------------------------------------------


def _part_configs(public):
    """The public (d_model, d_ff, (B, T)) of the parts' checks, then the hidden
    one (Topic.BLOCK's sizes)."""
    return public + [
        (d_model, d_ff, (b, t))
        for d_model, _, d_ff, b, t, _ in hidden.block_sizes()
    ]


def _rms_input(b, t, d_model, seed):
    """x (B, T, D) with a mean far from 0 (LayerNorm and RMSNorm differ) and
    one position of tiny features, whose mean square (1e-10) is far below eps =
    1e-6, so the place of eps decides its output."""
    generator = torch.Generator().manual_seed(seed)
    x = 2.0 + torch.randn(b, t, d_model, generator=generator)
    x[0, 0] = 1e-5 * torch.randn(d_model, generator=generator)
    return x


def _rms_candidates(x, weight, eps):
    """(code, detail, thunk) for the known mistakes of RMSNorm on x (B, T, D)
    with scale ``weight`` (D,)."""
    x64, w = x.double(), weight.double()

    def thunk(fn):
        return lambda: (fn().numpy(), None)

    mean_sq = x64.pow(2).mean(-1, keepdim=True)
    centred = x64 - x64.mean(-1, keepdim=True)
    return [
        (
            "rmsnorm-mean-subtracted",
            "",
            thunk(
                lambda: (
                    centred
                    / torch.sqrt(centred.pow(2).mean(-1, keepdim=True) + eps)
                    * w
                )
            ),
        ),
        (
            "rmsnorm-eps-misplaced",
            "x / (sqrt(mean(x^2)) + eps)",
            thunk(lambda: x64 / (mean_sq.sqrt() + eps) * w),
        ),
        (
            "rmsnorm-eps-misplaced",
            "no eps at all",
            thunk(lambda: x64 / mean_sq.sqrt() * w),
        ),
        (
            "rmsnorm-not-mean",
            "",
            thunk(
                lambda: (
                    x64
                    / torch.sqrt(x64.pow(2).sum(-1, keepdim=True) + eps)
                    * w
                )
            ),
        ),
        (
            "rmsnorm-scale-missing",
            "",
            thunk(lambda: x64 / torch.sqrt(mean_sq + eps)),
        ),
        (
            "norm-wrong-axis",
            "the positions (axis 1)",
            thunk(
                lambda: (
                    x64
                    / torch.sqrt(x64.pow(2).mean(1, keepdim=True) + eps)
                    * w
                )
            ),
        ),
        (
            "norm-wrong-axis",
            "the whole tensor",
            thunk(lambda: x64 / torch.sqrt(x64.pow(2).mean() + eps) * w),
        ),
    ]


def _check_rms_norm_body(cls, label):
    configs = _part_configs([(8, 0, (2, 5)), (12, 0, (3, 4)), (16, 0, (1, 6))])
    eps = 1e-6
    for i, (d_model, _, (b, t)) in enumerate(configs, 1):
        ref = block.RMSNorm(d_model, eps=eps)
        with torch.no_grad():
            ref.weight.copy_(
                1.0
                + 0.5
                * torch.randn(
                    d_model, generator=torch.Generator().manual_seed(70 + i)
                )
            )
        x = _rms_input(b, t, d_model, seed=80 + i)
        case = (
            f"case {i} of {len(configs)}: d_model={d_model}, eps={eps:g}; x "
            f"of shape {shape_text(x.shape)}, "
            "features around 2, and x[0, 0] tiny (about 1e-5)"
        )
        module = call(
            cls,
            {"d_model": d_model, "eps": eps},
            label,
            positional=1,
            call_text=f"{label}({d_model}, eps={eps:g})",
        )
        if not is_instance(module, torch.nn.Module):
            raise fail(
                "wrong-type",
                f"{label}(...) built a {type(module).__name__}; expected a "
                "torch.nn.Module.",
            )
        _load(module, ref, label)
        out = _run(module, {"x": x}, label, case, positional=1)
        with torch.no_grad():
            expected = ref(x.double()).numpy()
        if not close(out, expected, ATOL, RTOL):
            diagnose(
                out,
                None,
                _rms_candidates(x, ref.weight.detach(), eps),
                case,
                expected,
                None,
                what="output",
                atol=ATOL,
                rtol=RTOL,
            )
    return (
        f"✓ {display_name(cls, label)}: {len(configs)} random cases "
        "(features far from mean 0, a position of "
        "tiny features where eps matters) match x / sqrt(mean(x^2) + eps) * "
        "weight"
    )


def check_rms_norm(cls, *, timeout: float = DEFAULT_TIMEOUT):
    """Check an RMSNorm ``cls(d_model, eps=1e-6)`` with a parameter ``weight``
    (D,), called as ``module(x)`` on
    x (B, T, D): ``x / sqrt(mean(x^2 over D) + eps) * weight``, as
    :class:`~attention_course.block.RMSNorm`. Diagnoses
    ``[rmsnorm-mean-subtracted]``, ``[rmsnorm-eps-misplaced]``,
    ``[rmsnorm-not-mean]``, ``[rmsnorm-scale-missing]`` and
    ``[norm-wrong-axis]``."""
    run_check(
        _keeping_rng(lambda: _check_rms_norm_body(cls, label="RMSNorm")),
        timeout,
    )


def _swiglu_candidates(ref, x):
    """(code, detail, thunk) for the known mistakes of SwiGLU, recomputed with
    the reference's layers."""

    def thunk(fn):
        def run():
            with torch.no_grad():
                return fn().numpy(), None

        return run

    gate, up, down = ref.gate, ref.up, ref.down
    return [
        (
            "swiglu-gate-swapped",
            "",
            thunk(lambda: down(gate(x) * F.silu(up(x)))),
        ),
        (
            "swiglu-wrong-activation",
            "a sigmoid (that is GLU)",
            thunk(lambda: down(torch.sigmoid(gate(x)) * up(x))),
        ),
        (
            "swiglu-wrong-activation",
            "a ReLU (ReGLU)",
            thunk(lambda: down(F.relu(gate(x)) * up(x))),
        ),
        (
            "swiglu-wrong-activation",
            "a GELU (GEGLU)",
            thunk(lambda: down(F.gelu(gate(x)) * up(x))),
        ),
        (
            "swiglu-wrong-activation",
            "nothing (a bilinear layer)",
            thunk(lambda: down(gate(x) * up(x))),
        ),
        (
            "swiglu-not-gated",
            "you ADD them",
            thunk(lambda: down(F.silu(gate(x)) + up(x))),
        ),
        (
            "swiglu-not-gated",
            "the up projection is left out",
            thunk(lambda: down(F.silu(gate(x)))),
        ),
        (
            "swiglu-not-gated",
            "the SiLU is applied after the product",
            thunk(lambda: down(F.silu(gate(x) * up(x)))),
        ),
    ]


def _check_swiglu_body(cls, label):
    configs = _part_configs(
        [(8, 24, (2, 5)), (12, 20, (3, 4)), (6, 6, (1, 7))]
    )
    for _, _, _, ref, x, case, out in _ffn_cases(
        cls, label, configs, block.SwiGLU, seed=90
    ):
        with torch.no_grad():
            expected = ref(x).numpy()
        if not close(out, expected, ATOL, RTOL):
            diagnose(
                out,
                None,
                _swiglu_candidates(ref, x),
                case,
                expected,
                None,
                what="output",
                atol=ATOL,
                rtol=RTOL,
            )
    return (
        f"✓ {display_name(cls, label)}: {len(configs)} random cases (d_ff > "
        "d_model and d_ff = d_model, "
        "different weights in gate and up) match down(silu(gate(x)) * up(x))"
    )


def check_swiglu(cls, *, timeout: float = DEFAULT_TIMEOUT):
    """Check a SwiGLU feed-forward network ``cls(d_model, d_ff)`` with
    bias-free layers ``gate`` and ``up`` (D -> d_ff) and ``down`` (d_ff -> D),
    called as ``module(x)`` on x (B, T, D): ``down(silu(gate(x)) * up(x))``, as
    :class:`~attention_course.block.SwiGLU`. Diagnoses
    ``[swiglu-gate-swapped]``, ``[swiglu-wrong-activation]`` and
    ``[swiglu-not-gated]``."""
    run_check(
        _keeping_rng(lambda: _check_swiglu_body(cls, label="SwiGLU")), timeout
    )


# -----------------------------------------------------------------------------
# GPT-2's initialisation: the layers that write into the residual stream,
# scaled by depth
# -----------------------------------------------------------------------------

_STD = 0.02
# their output is added to the stream
_RESIDUAL_LAYERS = ("w_o.weight", "linear2.weight")


def _gpt_shapes(num_layers: int, d_model: int) -> dict[str, tuple[int, ...]]:
    """Parameter names and shapes of a GPT (learned positions, tied head) with
    ``num_layers`` blocks."""
    model = GPT(
        GPTConfig(96, d_model, 4, num_layers, max_len=32, init="pytorch"),
        seed=0,
    )
    return {name: tuple(t.shape) for name, t in model.state_dict().items()}


def _expected_init(name: str, num_layers: int) -> tuple[str, float]:
    """("const", value) or ("normal", std) of one parameter under GPT-2's
    initialisation."""
    if name.endswith(".bias"):
        return "const", 0.0
    if name.split(".")[-2].startswith("norm"):
        return "const", 1.0
    if name.endswith(_RESIDUAL_LAYERS):
        return "normal", _STD / (2 * num_layers) ** 0.5
    return "normal", _STD


def _near(std: float, value: float, size: int) -> bool:
    """Whether a draw of ``size`` numbers with this std comes from standard
    deviation ``value`` (12 % and four standard errors of the estimate: a right
    draw never misses, a 1/sqrt(2) error never passes)."""
    return abs(std - value) <= 0.12 * value + 4 * value / np.sqrt(size)


def _init_findings(arrays: dict, num_layers: int, case: str) -> None:
    """Raise for the first parameter whose values do not follow GPT-2's
    initialisation, naming the mistake."""
    for name, arr in arrays.items():
        kind, value = _expected_init(name, num_layers)
        if kind == "const" and not np.allclose(arr, value, atol=1e-6):
            what = "bias" if name.endswith(".bias") else "LayerNorm scale"
            raise fail(
                "init-norm-or-bias",
                detail=f"{name} (a {what}) values other than {value:g}",
                case=case,
            )
    depth_mistakes = (
        (
            _STD / num_layers**0.5,
            f"0.02 / sqrt({num_layers}): N = {num_layers}, the number of "
            "blocks",
        ),
        (
            _STD / (2 * num_layers),
            f"0.02 / {2 * num_layers}: divided by N, not sqrt(N)",
        ),
    )
    for name, arr in arrays.items():
        kind, expected = _expected_init(name, num_layers)
        std, mean = float(arr.std()), float(arr.mean())
        if (
            kind == "const"
            or _near(std, expected, arr.size)
            and abs(mean) < 0.2 * expected
        ):
            continue
        where = f"{name} has standard deviation {std:.3g}"
        if name.endswith(_RESIDUAL_LAYERS):
            if _near(std, _STD, arr.size):
                raise fail(
                    "residual-init-wrong-layers",
                    detail=f"{name} writes into the stream but keeps 0.02",
                    case=case,
                )
            for value, text in depth_mistakes:
                if _near(std, value, arr.size):
                    raise fail(
                        "residual-init-depth",
                        detail=f"{where}, i.e. {text}",
                        case=case,
                    )
        elif any(
            _near(std, value, arr.size)
            for value in (_STD / (2 * num_layers) ** 0.5, depth_mistakes[0][0])
        ):
            raise fail(
                "residual-init-wrong-layers",
                detail=f"{where}, scaled as a residual layer, but its "
                "output is "
                "not added to the stream",
                case=case,
            )
        raise fail(
            "wrong-value",
            f"{where} and mean {mean:.3g}; GPT-2 draws it from a normal "
            "distribution with "
            f"mean 0 and standard deviation {expected:.3g}.",
            case=case,
        )


def _check_init_body(fn, label):
    cases = [(4, 64), (12, 48)] + [
        (t - 3, 32) for _, _, _, _, t, _ in hidden.block_sizes()
    ]
    for i, (num_layers, d_model) in enumerate(cases, 1):
        shapes = _gpt_shapes(num_layers, d_model)
        case = (
            f"case {i} of {len(cases)}: a GPT with L = {num_layers} blocks, "
            f"D = {d_model} "
            f"({len(shapes)} parameters)"
        )
        result = call(
            fn,
            {"shapes": shapes, "num_layers": num_layers, "seed": i},
            label,
            positional=2,
        )
        if not isinstance(result, dict):
            raise fail(
                "wrong-type",
                f"Your {label} returned a {type(result).__name__}; expected "
                "a dict from each "
                "parameter's name to a tensor of its shape.",
                case=case,
            )
        missing, extra = (
            sorted(set(shapes) - set(result)),
            sorted(set(result) - set(shapes)),
        )
        if missing or extra:
            raise fail(
                "wrong-type",
                "Your dict must have one entry per name of `shapes`; "
                "missing: "
                f"{missing[:3] or 'none'}, not expected: "
                f"{extra[:3] or 'none'}.",
                case=case,
            )
        arrays = {}
        for name, shape in shapes.items():
            arrays[name] = as_array(result[name], f"value of {name!r}", case)
            if arrays[name].shape != shape:
                raise fail(
                    "wrong-shape",
                    f"Your tensor for {name} has shape "
                    f"{shape_text(arrays[name].shape)}; "
                    f"expected {shape_text(shape)}.",
                    case=case,
                )
        _init_findings(arrays, num_layers, case)
    return (
        f"✓ {display_name(fn, label)}: {len(cases)} GPTs (L = 4 and 12 "
        "blocks): biases 0, LayerNorm scales 1, "
        "matrices and embeddings std 0.02, the layers that write into the "
        "stream (w_o, linear2) std "
        "0.02 / sqrt(2 L)"
    )


def check_residual_init(fn, *, timeout: float = DEFAULT_TIMEOUT):
    """Check ``fn(shapes, num_layers, seed=0)``: given a GPT's parameter names
    and shapes and its number of blocks L, it returns one fresh tensor per
    name, drawn as GPT-2 does (:class:`~attention_course.gpt.GPT` with
    ``init="gpt2"``). Standard deviations are measured on the returned tensors
    (at least 1,000 numbers each). Diagnoses ``[residual-init-depth]``,
    ``[residual-init-wrong-layers]`` and ``[init-norm-or-bias]``."""
    run_check(
        _keeping_rng(lambda: _check_init_body(fn, label="gpt2_init")), timeout
    )


# -----------------------------------------------------------------------------
# Questions
# -----------------------------------------------------------------------------


choice_question(
    "11.depth-scaling",
    answer="B",
    why="post-LN's top block reaches the loss through one LayerNorm "
    "whatever the depth, so its gradient does not "
    "depend on L; in pre-LN the final norm divides by the stream's size, "
    "which grows like sqrt(L): from 6 to "
    "24 blocks its gradient about halves (Xiong et al., Theorem 1).",
    wrong={
        "A": "pre-LN's top gradient is divided by the size of the stream "
        "at the top, and the stream grows with "
        "the number of blocks that add to it.",
        "C": "post-LN's top block is followed by nothing but its own "
        "LayerNorm and the loss, whatever the depth "
        "below it: its gradient has no reason to change.",
        "D": "the other way round: which of the two has a stream whose "
        "size depends on the depth?",
    },
)


def _block_parameters() -> int:
    return sum(
        p.numel() for p in block.EncoderBlock(512, 8, 2048).parameters()
    )


def _known_block_counts() -> dict:
    d, d_ff = 512, 2048
    right = _block_parameters()
    return {
        right - 4 * d: (
            "wrong-answer",
            "you left out the two LayerNorms, each with a scale and a bias "
            "of D numbers.",
        ),
        right - 4 * d - d_ff - d: (
            "wrong-answer",
            (
                "you left out the biases (4 in the attention, 2 in the "
                "feed-forward network)."
            ),
        ),
        4 * d * d + 2 * d * d_ff: (
            "wrong-answer",
            (
                "those are the weight matrices only: add the biases of the "
                "six "
                "linear layers and the two LayerNorms' scales and biases."
            ),
        ),
        right - (d * d + d): (
            "wrong-answer",
            (
                "the attention has FOUR projections: queries, keys, values "
                "and "
                "the output."
            ),
        ),
    }


number_question(
    "11.block-params",
    answer=_block_parameters,
    why="attention 4 (D^2 + D), feed-forward D d_ff + d_ff + d_ff D + "
    "D, two LayerNorms 2 (2 D): with D = 512 and "
    "d_ff = 2048 that is 1,050,624 + 2,099,712 + 2,048.",
    known=_known_block_counts,
    hint="Count each linear layer's weight matrix AND bias, in the "
    "attention (how many projections?) and in the "
    "feed-forward network, then the LayerNorms.",
)
