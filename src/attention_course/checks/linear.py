"""Checks of chapter 17: the recurrent form of linear attention, the delta
update, the gated delta rule, one chunk.

Every reference is float64 NumPy written for the checker, independent of
:mod:`attention_course.linear_attention`; each ``*_variant`` builder is the
reference with one deliberate deviation, the mistake whose code it is listed
under. Shapes: q, k (B, H, T, Dk), v (B, H, T, Dv), beta and log_decay (B, H,
T), states (B, H, Dk, Dv).

Beyond the values: the notebook forbids the library's rules
(``[rule-from-library]``, seen by what the code calls), and exercise 1 asks for
the recurrence token by token, which is seen in the shapes the code forms: no
(T, T) matrix, and a (Dk, Dv) state (``[not-token-by-token]``). The delta
update's keys are not unit vectors, so that a rule that normalises them or
divides by |k|^2 differs from the right one.
"""

from __future__ import annotations

import numpy as np

from ..linear_attention.cache import HYBRIDS
from . import hidden, observe
from .cases import to_framework
from .diagnosis import diagnose
from .questions import number_question
from .runner import (
    DEFAULT_TIMEOUT,
    as_array,
    call,
    close,
    display_name,
    fail,
    run_check,
    shape_text,
    split_result,
)

# float32 inputs against a float64 reference, over recurrences of up to 48
# steps
ATOL, RTOL = 1e-4, 1e-4


def _call_rule(
    fn,
    args: dict,
    label: str,
    case: str,
    steps: observe.StepShapes | None = None,
):
    """The student's function called with ``args``, watched for the library's
    own rules (the notebook forbids them) and, with ``steps``, for the shapes
    it forms."""
    with observe.LibraryCalls("linear_attention") as library:
        if steps is not None and observe.observable(fn):
            with steps, observe.LeavesTorch() as leaves:
                result = call(fn, args, label, positional=len(args))
            if leaves.left:
                raise fail("left-torch", detail=leaves.left, case=case)
        else:
            result = call(fn, args, label, positional=len(args))
    if library.called:
        raise fail("rule-from-library", detail=library.called[0], case=case)
    return result


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.sqrt((x**2).sum(-1, keepdims=True) + 1e-6)


def _outer(k: np.ndarray, v: np.ndarray) -> np.ndarray:
    return k[..., :, None] * v[..., None, :]


def _read(state: np.ndarray, q: np.ndarray) -> np.ndarray:
    return (q[..., None, :] @ state)[..., 0, :]


# -----------------------------------------------------------------------------
# Exercise 1: linear attention, recurrent form
# -----------------------------------------------------------------------------


def linear_variant(q, k, v, *, carry="no", read_first=False):
    """Causal linear attention token by token. ``carry``: no (a fresh state per
    sequence) | sequential (sequence b starts from sequence b - 1's final
    state) | shared (one state written by the whole batch at each step)."""
    b, h, t, dk = q.shape
    out = np.zeros((b, h, t, v.shape[-1]))
    state = np.zeros((b, h, dk, v.shape[-1]))
    for i in range(b):
        if carry == "sequential" and i:
            state[i] = state[i - 1]
        for s in range(t):
            if read_first:
                out[i, :, s] = _read(state[i], q[i, :, s])
            state[i] = state[i] + _outer(k[i, :, s], v[i, :, s])
            if not read_first:
                out[i, :, s] = _read(state[i], q[i, :, s])
    # every sequence reads one state that sums all sequences' writes up to step
    # s
    if carry == "shared":
        # (1, H, T, Dk, Dv)
        shared = np.cumsum(np.einsum("bhtk,bhtv->htkv", k, v)[None], axis=2)
        out = (q[..., None, :] @ shared)[..., 0, :]
    return out


_LINEAR_CASES = [
    (2, 1, 5, 3, 4),
    (3, 2, 7, 4, 2),
    (2, 3, 6, 8, 5),
    (4, 2, 9, 5, 5),
]


def check_linear_recurrent(fn, *, timeout: float = DEFAULT_TIMEOUT):
    """Check ``fn(q, k, v)`` -> out (B, H, T, Dv): causal linear attention
    computed token by token with a (Dk, Dv) state per sequence and head, S_t =
    S_{t-1} + k_t v_t^T and o_t = q_t S_t; q, k (B, H, T, Dk), v (B, H, T, Dv)
    float32 tensors, with a loop over the tokens (no (T, T) matrix formed, a
    (Dk, Dv) state: ``[not-token-by-token]``) and without the library's rules
    (``[rule-from-library]``). Diagnoses ``[state-carried-over]`` and
    ``[read-before-write]``."""
    label = "linear_attention_recurrent"

    def body():
        rng = np.random.default_rng(170)
        for i, (b, h, t, dk, dv) in enumerate(_LINEAR_CASES, 1):
            q, k = rng.standard_normal((2, b, h, t, dk))
            v = rng.standard_normal((b, h, t, dv))
            case = (
                f"case {i} of {len(_LINEAR_CASES)}: q, k "
                f"{shape_text(q.shape)}, v {shape_text(v.shape)}"
            )
            args = {
                "q": to_framework(q, "torch"),
                "k": to_framework(k, "torch"),
                "v": to_framework(v, "torch"),
            }
            steps = observe.StepShapes(t, (dk, dv))
            out = as_array(
                _call_rule(fn, args, label, case, steps), "output", case
            )
            ref = linear_variant(q, k, v)
            if close(out, ref, ATOL, RTOL):
                if observe.observable(fn) and (
                    steps.square or not steps.state
                ):
                    raise fail(
                        "not-token-by-token",
                        detail="a (T, T) matrix"
                        if steps.square
                        else "no (Dk, Dv) state",
                        case=case,
                    )
                continue
            candidates = [
                (
                    "state-carried-over",
                    "sequence b starts from the state sequence b - 1 ended "
                    "with",
                    lambda q=q, k=k, v=v: (
                        linear_variant(q, k, v, carry="sequential"),
                        None,
                    ),
                ),
                (
                    "state-carried-over",
                    "one state, written by every sequence of the batch at "
                    "each step",
                    lambda q=q, k=k, v=v: (
                        linear_variant(q, k, v, carry="shared"),
                        None,
                    ),
                ),
                (
                    "read-before-write",
                    "",
                    lambda q=q, k=k, v=v: (
                        linear_variant(q, k, v, read_first=True),
                        None,
                    ),
                ),
            ]
            diagnose(
                out, None, candidates, case, ref, None, atol=ATOL, rtol=RTOL
            )
        return (
            f"✓ {display_name(fn, label)}: {len(_LINEAR_CASES)} random "
            "batches (1 to 3 heads, Dk != Dv) match "
            "causal linear attention, one fresh state per sequence"
        )

    observe.warm_up()
    run_check(body, timeout)


# -----------------------------------------------------------------------------
# Exercise 2: the delta update
# -----------------------------------------------------------------------------


def delta_variant(
    state, k, v, beta, *, write="delta", beta_on="error", key="raw"
):
    """One delta-rule write. ``write``: delta (the error v - k S) | linear (v:
    nothing erased); ``beta_on``: error | none (left out) | key (k replaced by
    beta k in the read and the write); ``key``: raw | normalized (k made a unit
    vector first) | by-norm (the write divided by |k|^2)."""
    beta = beta[..., None]
    if key == "normalized":
        k = _unit(k)
    if beta_on == "key":
        k = beta * k
    scale = 1.0 if beta_on in ("none", "key") else beta
    if key == "by-norm":
        scale = scale / (k**2).sum(-1, keepdims=True)
    written = v - _read(state, k) if write == "delta" else v
    return state + _outer(k, scale * written)


_DELTA_CASES = [(1, 1, 4, 3), (2, 3, 5, 5), (3, 2, 8, 4), (2, 4, 6, 7)]


def check_delta_update(fn, *, timeout: float = DEFAULT_TIMEOUT):
    """Check ``fn(state, k, v, beta)`` -> the new state: one delta-rule write,
    S + beta k (v - k S)^T, for every sequence and head at once; state (B, H,
    Dk, Dv), k (B, H, Dk), v (B, H, Dv), beta (B, H) in (0, 1), float32
    tensors; the keys are not unit vectors. Diagnoses ``[beta-missing]``,
    ``[beta-on-key]``, ``[no-erase]``, ``[delta-key-normalized]`` and
    ``[delta-divided-by-norm]``."""
    label = "delta_update"

    def body():
        rng = np.random.default_rng(171)
        for i, (b, h, dk, dv) in enumerate(_DELTA_CASES, 1):
            state = rng.standard_normal((b, h, dk, dv))
            # keys of norm 0.5 to 1.5: on unit keys, normalising k or dividing
            # by |k|^2 changes nothing
            k = _unit(rng.standard_normal((b, h, dk))) * rng.uniform(
                0.5, 1.5, (b, h, 1)
            )
            v = rng.standard_normal((b, h, dv))
            beta = rng.uniform(0.1, 0.9, (b, h))
            case = (
                f"case {i} of {len(_DELTA_CASES)}: state "
                f"{shape_text(state.shape)}"
            )
            args = {
                "state": to_framework(state, "torch"),
                "k": to_framework(k, "torch"),
                "v": to_framework(v, "torch"),
                "beta": to_framework(beta, "torch"),
            }
            out = as_array(
                _call_rule(fn, args, label, case), "new state", case
            )
            ref = delta_variant(state, k, v, beta)
            if close(out, ref, ATOL, RTOL):
                continue
            variants = (
                ("beta-missing", {"beta_on": "none"}),
                ("beta-on-key", {"beta_on": "key"}),
                ("no-erase", {"write": "linear"}),
                ("delta-key-normalized", {"key": "normalized"}),
                ("delta-divided-by-norm", {"key": "by-norm"}),
            )
            candidates = [
                (
                    code,
                    "",
                    lambda s=state, k=k, v=v, b=beta, o=options: (
                        delta_variant(s, k, v, b, **o),
                        None,
                    ),
                )
                for code, options in variants
            ]
            diagnose(
                out,
                None,
                candidates,
                case,
                ref,
                None,
                what="new state",
                atol=ATOL,
                rtol=RTOL,
            )
        return (
            f"✓ {display_name(fn, label)}: {len(_DELTA_CASES)} random "
            "states (1 to 4 heads, Dk != Dv) match "
            "S + beta k (v - k S)^T"
        )

    run_check(body, timeout)


# -----------------------------------------------------------------------------
# Exercise 3: the gated delta rule over a batch of sequences
# -----------------------------------------------------------------------------


def gated_variant(
    q,
    k,
    v,
    beta,
    log_decay,
    *,
    decay="before",
    normalize="both",
    carry=False,
    beta_on="error",
):
    """Gated DeltaNet's core, token by token. ``decay``: before | after (the
    write); ``normalize``: both | none (q only scaled by 1 / sqrt(Dk)) |
    queries (keys left raw); ``carry``: the state not reset between
    sequences."""
    b, h, t, dk = q.shape
    q = (_unit(q) if normalize in ("both", "queries") else q) * dk**-0.5
    k = _unit(k) if normalize == "both" else k
    out = np.zeros((b, h, t, v.shape[-1]))
    state = np.zeros((h, dk, v.shape[-1]))
    for i in range(b):
        state = state if carry else np.zeros_like(state)
        for s in range(t):
            alpha = np.exp(log_decay[i, :, s])[:, None, None]
            if decay == "before":
                state = alpha * state
            state = delta_variant(
                state, k[i, :, s], v[i, :, s], beta[i, :, s], beta_on=beta_on
            )
            if decay == "after":
                state = alpha * state
            out[i, :, s] = _read(state, q[i, :, s])
    return out


_GATED_CASES = [
    (2, 1, 6, 4, 3),
    (2, 2, 9, 8, 5),
    (3, 3, 12, 6, 6),
    (2, 2, 16, 5, 8),
]


def check_gated_delta_rule(fn, *, timeout: float = DEFAULT_TIMEOUT):
    """Check ``fn(q, k, v, beta, log_decay)`` -> out (B, H, T, Dv): Gated
    DeltaNet's core over a batch of sequences. q, k (B, H, T, Dk) raw (the
    function L2-normalises both, eps 1e-6, and scales q by 1 / sqrt(Dk)), v (B,
    H, T, Dv), beta (B, H, T) in (0, 1), log_decay (B, H, T) <= 0; per sequence
    a fresh state, then per token S <- exp(log_decay) S, S <- S + beta k (v - k
    S)^T, o = q S. Diagnoses ``[decay-after-write]``,
    ``[keys-not-normalized]``, ``[state-carried-over]`` and
    ``[beta-on-key]``."""
    label = "gated_delta_rule"

    def body():
        rng = np.random.default_rng(172)
        sizes = _GATED_CASES + hidden.linear_sizes()
        for i, (b, h, t, dk, dv) in enumerate(sizes, 1):
            q, k = 0.6 * rng.standard_normal((2, b, h, t, dk))
            v = rng.standard_normal((b, h, t, dv))
            beta, log_decay = (
                rng.uniform(0.2, 0.9, (b, h, t)),
                -rng.uniform(0.05, 1.0, (b, h, t)),
            )
            case = (
                f"case {i} of {len(sizes)}: q, k {shape_text(q.shape)}, "
                f"v {shape_text(v.shape)}"
            )
            args = {
                name: to_framework(x, "torch")
                for name, x in (
                    ("q", q),
                    ("k", k),
                    ("v", v),
                    ("beta", beta),
                    ("log_decay", log_decay),
                )
            }
            out = as_array(_call_rule(fn, args, label, case), "output", case)
            ref = gated_variant(q, k, v, beta, log_decay)
            if close(out, ref, ATOL, RTOL):
                continue
            candidates = [
                (
                    code,
                    detail,
                    lambda o=options, q=q, k=k, v=v, b=beta, g=log_decay: (
                        gated_variant(q, k, v, b, g, **o),
                        None,
                    ),
                )
                for code, detail, options in (
                    ("decay-after-write", "", {"decay": "after"}),
                    (
                        "keys-not-normalized",
                        "neither queries nor keys L2-normalised",
                        {"normalize": "none"},
                    ),
                    (
                        "keys-not-normalized",
                        "the keys left as they are",
                        {"normalize": "queries"},
                    ),
                    (
                        "state-carried-over",
                        "sequence b starts from sequence b - 1's final state",
                        {"carry": True},
                    ),
                    ("beta-on-key", "", {"beta_on": "key"}),
                )
            ]
            diagnose(
                out, None, candidates, case, ref, None, atol=ATOL, rtol=RTOL
            )
        return (
            f"✓ {display_name(fn, label)}: {len(sizes)} random batches (1 "
            "to 3 heads, up to 16 tokens, Dk != Dv) "
            "match Gated DeltaNet's rule: normalise, decay, write the "
            "error, read"
        )

    run_check(body, timeout)


# -----------------------------------------------------------------------------
# Exercise 4: one chunk of the chunked form
# -----------------------------------------------------------------------------


def chunk_variant(state, q, k, v, beta, *, diagonal="ok", start="used"):
    """One chunk of the (ungated) delta rule in the UT form -> (out, new
    state). ``diagonal``: ok | output-strict (outputs do not read their own
    write) | system-inclusive (the diagonal kept in the triangular system);
    ``start``: used | ignored (the chunk computed from an empty state, then
        added to nothing)."""
    length = q.shape[-2]
    s0 = state if start == "used" else np.zeros_like(state)
    kk = beta[..., None] * (k @ np.swapaxes(k, -1, -2))
    lower = np.tril(
        np.ones((length, length)), -1 if diagonal != "system-inclusive" else 0
    )
    system = np.eye(length) + kk * lower
    u = np.linalg.solve(system, beta[..., None] * (v - k @ s0))
    out_mask = np.tril(
        np.ones((length, length)), -1 if diagonal == "output-strict" else 0
    )
    out = q @ s0 + ((q @ np.swapaxes(k, -1, -2)) * out_mask) @ u
    return out, s0 + np.swapaxes(k, -1, -2) @ u


_CHUNK_CASES = [
    (1, 1, 4, 3, 3),
    (2, 2, 6, 4, 5),
    (1, 3, 8, 8, 4),
    (2, 1, 5, 6, 2),
]


def check_delta_chunk(fn, *, timeout: float = DEFAULT_TIMEOUT):
    """Check ``fn(state, q, k, v, beta)`` -> (out (B, H, L, Dv), new state (B,
    H, Dk, Dv)): the L tokens of one chunk of the delta rule (no gate) from the
    state before it; q, k unit vectors (B, H, L, Dk), v (B, H, L, Dv), beta (B,
    H, L), state (B, H, Dk, Dv), float32 tensors. Equal to L delta-rule steps,
    each output read after its own token's write. Diagnoses
    ``[chunk-mask-diagonal]`` and ``[chunk-start-state-ignored]``."""
    label = "delta_chunk"

    def body():
        rng = np.random.default_rng(173)
        for i, (b, h, length, dk, dv) in enumerate(_CHUNK_CASES, 1):
            state = rng.standard_normal((b, h, dk, dv))
            q, k = _unit(rng.standard_normal((2, b, h, length, dk)))
            v, beta = (
                rng.standard_normal((b, h, length, dv)),
                rng.uniform(0.2, 0.9, (b, h, length)),
            )
            case = (
                f"case {i} of {len(_CHUNK_CASES)}: a chunk of "
                f"L={length}, state {shape_text(state.shape)}"
            )
            args = {
                name: to_framework(x, "torch")
                for name, x in (
                    ("state", state),
                    ("q", q),
                    ("k", k),
                    ("v", v),
                    ("beta", beta),
                )
            }
            out, new_state = split_result(
                _call_rule(fn, args, label, case),
                case,
                names=("output", "state"),
            )
            if new_state is None:
                raise fail(
                    "wrong-type",
                    "Return a pair (out, new_state): the next chunk starts "
                    "from new_state.",
                    case=case,
                )
            out, new_state = (
                as_array(out, "output", case),
                as_array(new_state, "state", case),
            )
            ref_out, ref_state = chunk_variant(state, q, k, v, beta)
            if close(out, ref_out, ATOL, RTOL) and close(
                new_state, ref_state, ATOL, RTOL
            ):
                continue
            candidates = [
                (
                    "chunk-mask-diagonal",
                    "the outputs do not read their own token's write (s < t)",
                    lambda s=state, q=q, k=k, v=v, b=beta: chunk_variant(
                        s, q, k, v, b, diagonal="output-strict"
                    ),
                ),
                (
                    "chunk-mask-diagonal",
                    "the triangular system keeps its diagonal (s <= t)",
                    lambda s=state, q=q, k=k, v=v, b=beta: chunk_variant(
                        s, q, k, v, b, diagonal="system-inclusive"
                    ),
                ),
                (
                    "chunk-start-state-ignored",
                    "your outputs and state leave S0 out",
                    lambda s=state, q=q, k=k, v=v, b=beta: chunk_variant(
                        s, q, k, v, b, start="ignored"
                    ),
                ),
            ]
            diagnose(
                out,
                new_state,
                candidates,
                case,
                ref_out,
                ref_state,
                atol=ATOL,
                rtol=RTOL,
                second="new state",
            )
        return (
            f"✓ {display_name(fn, label)}: {len(_CHUNK_CASES)} random "
            "chunks (L from 4 to 8, non-zero start "
            "states) match L delta-rule steps, outputs and final state"
        )

    run_check(body, timeout)


# -----------------------------------------------------------------------------
# Questions
# -----------------------------------------------------------------------------

# Qwen3-Next-80B-A3B: 36 Gated DeltaNet layers, 32 value heads, 16 query/key
# heads, 128 x 128
_QWEN = HYBRIDS[0]


def _memory_mib(heads: int) -> float:
    return _QWEN.linear_layers * heads * _QWEN.k_dim * _QWEN.v_dim * 4 / 2**20


number_question(
    "17.state-size",
    answer=lambda: _memory_mib(_QWEN.heads),
    rtol=1e-3,
    why="36 layers x 32 value heads x 128 x 128 numbers x 4 bytes = 72 "
    "MiB, at 1 token as at 1 million: the state "
    "does not grow with the context.",
    known={
        _memory_mib(
            16
        ): "that counts the 16 query/key heads; there is one state per "
        "VALUE head (32): grouped "
        "heads share queries and keys, not memories.",
        2
        * _memory_mib(
            _QWEN.heads
        ): "the state is one (Dk, Dv) matrix per head, not a key AND a "
        "value per "
        "token: there is no factor 2.",
        _memory_mib(_QWEN.heads)
        * 2**20: "that is in bytes: divide by 2**20 for MiB.",
    },
    hint="One (Dk, Dv) matrix per value head and layer, 4 bytes per "
    "float32 number; the context does not appear.",
)
