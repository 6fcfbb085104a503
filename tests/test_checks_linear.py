"""Chapter 17's checks: right answers in several styles pass with one line (public and hidden cases); each planted
mistake (CORRECT / PLANTED, run by tests/test_checks_planted.py) gets its own code."""

import pytest
import torch

from attention_course import checks
from attention_course import linear_attention as la
from attention_course.checks import hidden


def _normalize_qk(q, k):  # the test's own, written as a student would (the notebook forbids the library's)
    def unit(x):
        return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + 1e-6)

    return unit(q) * q.size(-1) ** -0.5, unit(k)


def _delta_step(state, k, v, beta):
    error = v - (k[..., None, :] @ state)[..., 0, :]
    return state + beta[..., None, None] * k[..., :, None] * error[..., None, :]


def _read(state, q):
    return (q[..., None, :] @ state)[..., 0, :]


def _gated(q, k, v, beta, log_decay, state=None):
    state = torch.zeros(*q.shape[:2], q.size(-1), v.size(-1)) if state is None else state
    outs = []
    for t in range(q.size(2)):
        state = _delta_step(state * log_decay[:, :, t, None, None].exp(), k[:, :, t], v[:, :, t], beta[:, :, t])
        outs.append(_read(state, q[:, :, t]))
    return torch.stack(outs, 2), state


# ---------------------------------------------------------------- right answers


def linear_recurrent_loop(q, k, v):
    state = torch.zeros(*q.shape[:2], q.size(-1), v.size(-1))
    outs = []
    for t in range(q.size(2)):
        state = state + torch.einsum("bhk,bhv->bhkv", k[:, :, t], v[:, :, t])
        outs.append(torch.einsum("bhk,bhkv->bhv", q[:, :, t], state))
    return torch.stack(outs, 2)


def linear_recurrent_prefix_sums(q, k, v):  # every S_t at once: the recurrence's states, as prefix sums
    states = torch.cumsum(k[..., :, None] * v[..., None, :], dim=2)  # (B, H, T, Dk, Dv)
    return (q[..., None, :] @ states)[..., 0, :]


def linear_recurrent_per_sequence(q, k, v):  # one sequence and head at a time, NumPy-free Python loops
    out = torch.zeros(*q.shape[:3], v.size(-1))
    for b in range(q.size(0)):
        for h in range(q.size(1)):
            state = torch.zeros(q.size(-1), v.size(-1))
            for t in range(q.size(2)):
                state = state + torch.outer(k[b, h, t], v[b, h, t])
                out[b, h, t] = q[b, h, t] @ state
    return out


def delta_update_einsum(state, k, v, beta):
    error = v - torch.einsum("bhk,bhkv->bhv", k, state)
    return state + beta[..., None, None] * torch.einsum("bhk,bhv->bhkv", k, error)


def delta_update_erase_then_write(state, k, v, beta):  # (I - beta k k^T) S + beta k v^T
    kk = k[..., :, None] * k[..., None, :]
    return state - beta[..., None, None] * (kk @ state) + beta[..., None, None] * k[..., :, None] * v[..., None, :]


def gated_delta_rule(q, k, v, beta, log_decay):
    q, k = _normalize_qk(q, k)
    return _gated(q, k, v, beta, log_decay)[0]


def gated_delta_rule_einsum(q, k, v, beta, log_decay):
    q = q / (q.pow(2).sum(-1, keepdim=True) + 1e-6).sqrt() / q.size(-1) ** 0.5
    k = k / (k.pow(2).sum(-1, keepdim=True) + 1e-6).sqrt()
    state = torch.zeros(*q.shape[:2], q.size(-1), v.size(-1))
    outs = []
    for t in range(q.size(2)):
        state = state * log_decay[:, :, t, None, None].exp()
        error = v[:, :, t] - torch.einsum("bhk,bhkv->bhv", k[:, :, t], state)
        state = state + torch.einsum("bh,bhk,bhv->bhkv", beta[:, :, t], k[:, :, t], error)
        outs.append(torch.einsum("bhk,bhkv->bhv", q[:, :, t], state))
    return torch.stack(outs, 2)


def delta_chunk(state, q, k, v, beta):
    length = q.size(2)
    a = (beta[..., None] * (k @ k.transpose(-2, -1))).tril(-1)
    u = torch.linalg.solve_triangular(torch.eye(length) + a, beta[..., None] * (v - k @ state), upper=False,
                                      unitriangular=True)
    return q @ state + (q @ k.transpose(-2, -1)).tril() @ u, state + k.transpose(-2, -1) @ u


def delta_chunk_by_steps(state, q, k, v, beta):
    outs = []
    for t in range(q.size(2)):
        state = _delta_step(state, k[:, :, t], v[:, :, t], beta[:, :, t])
        outs.append(_read(state, q[:, :, t]))
    return torch.stack(outs, 2), state


# ---------------------------------------------------------------- planted mistakes


def linear_state_shared(q, k, v):  # one state for the whole batch: [state-carried-over]
    state = torch.zeros(q.size(1), q.size(-1), v.size(-1))
    outs = []
    for t in range(q.size(2)):
        state = state + torch.einsum("bhk,bhv->hkv", k[:, :, t], v[:, :, t])
        outs.append(torch.einsum("bhk,hkv->bhv", q[:, :, t], state))
    return torch.stack(outs, 2)


def linear_never_reset(q, k, v):  # sequences one after the other, the state never reset: [state-carried-over]
    state, rows = torch.zeros(q.size(1), q.size(-1), v.size(-1)), []
    for b in range(q.size(0)):
        outs = []
        for t in range(q.size(2)):
            state = state + k[b, :, t, :, None] * v[b, :, t, None, :]
            outs.append((q[b, :, t, None, :] @ state)[:, 0])
        rows.append(torch.stack(outs, 1))
    return torch.stack(rows)


def linear_read_first(q, k, v):  # [read-before-write]
    state = torch.zeros(*q.shape[:2], q.size(-1), v.size(-1))
    outs = []
    for t in range(q.size(2)):
        outs.append(torch.einsum("bhk,bhkv->bhv", q[:, :, t], state))
        state = state + torch.einsum("bhk,bhv->bhkv", k[:, :, t], v[:, :, t])
    return torch.stack(outs, 2)


def delta_no_beta(state, k, v, beta):  # [beta-missing]
    return state + torch.einsum("bhk,bhv->bhkv", k, v - torch.einsum("bhk,bhkv->bhv", k, state))


def delta_beta_on_key(state, k, v, beta):  # [beta-on-key]
    k = beta[..., None] * k
    return state + torch.einsum("bhk,bhv->bhkv", k, v - torch.einsum("bhk,bhkv->bhv", k, state))


def delta_linear_write(state, k, v, beta):  # [no-erase]
    return state + beta[..., None, None] * torch.einsum("bhk,bhv->bhkv", k, v)


def gated_decay_after(q, k, v, beta, log_decay):  # [decay-after-write]
    q, k = _normalize_qk(q, k)
    state = torch.zeros(*q.shape[:2], q.size(-1), v.size(-1))
    outs = []
    for t in range(q.size(2)):
        state = _delta_step(state, k[:, :, t], v[:, :, t], beta[:, :, t])
        state = state * log_decay[:, :, t, None, None].exp()
        outs.append(_read(state, q[:, :, t]))
    return torch.stack(outs, 2)


def gated_raw_keys(q, k, v, beta, log_decay):  # [keys-not-normalized]
    return _gated(q * q.size(-1) ** -0.5, k, v, beta, log_decay)[0]


def gated_raw_keys_only(q, k, v, beta, log_decay):  # [keys-not-normalized]
    return _gated(_normalize_qk(q, k)[0], k, v, beta, log_decay)[0]


def gated_carried(q, k, v, beta, log_decay):  # [state-carried-over]
    q, k = _normalize_qk(q, k)
    state, outs = None, []
    for b in range(q.size(0)):
        out, state = _gated(q[b:b + 1], k[b:b + 1], v[b:b + 1], beta[b:b + 1], log_decay[b:b + 1], state)
        outs.append(out)
    return torch.cat(outs)


# issue 42: what passed before -- the parallel form for the recurrence, the library's rules the notebook forbids,
# delta updates that equal the right one on unit keys only


def linear_parallel(q, k, v):  # [not-token-by-token]: the (T, T) scores
    t = q.size(2)
    return ((q @ k.transpose(-2, -1)) * torch.ones(t, t).tril()) @ v


def linear_parallel_per_query(q, k, v):  # [not-token-by-token]: a loop, but over the whole past, no state
    outs = [(q[:, :, t, None] @ k[:, :, :t + 1].transpose(-2, -1) @ v[:, :, :t + 1])[:, :, 0]
            for t in range(q.size(2))]
    return torch.stack(outs, 2)


def linear_parallel_numpy(q, k, v):  # [left-torch]: the parallel form in NumPy, out of the watcher's sight
    import numpy as np

    qn, kn, vn = q.numpy(), k.numpy(), v.numpy()
    t = qn.shape[2]
    return torch.from_numpy((qn @ kn.swapaxes(-1, -2) * np.tril(np.ones((t, t), dtype=qn.dtype))) @ vn)


def delta_key_normalized(state, k, v, beta):  # [delta-key-normalized]
    return _delta_step(state, torch.nn.functional.normalize(k, dim=-1), v, beta)


def delta_divided_by_norm(state, k, v, beta):  # [delta-divided-by-norm]
    return _delta_step(state, k, v, beta / k.pow(2).sum(-1))


def gated_library(q, k, v, beta, log_decay):  # [rule-from-library]
    q, k = la.normalize_qk(q, k)
    return la.gated_delta_recurrent(q, k, v, beta, log_decay)[0]


def chunk_strict_outputs(state, q, k, v, beta):  # [chunk-mask-diagonal]
    length = q.size(2)
    a = (beta[..., None] * (k @ k.transpose(-2, -1))).tril(-1)
    u = torch.linalg.solve_triangular(torch.eye(length) + a, beta[..., None] * (v - k @ state), upper=False)
    out = q @ state + ((q @ k.transpose(-2, -1)).tril(-1)) @ u
    return out, state + k.transpose(-2, -1) @ u


def chunk_inclusive_system(state, q, k, v, beta):  # [chunk-mask-diagonal]
    length = q.size(2)
    a = (beta[..., None] * (k @ k.transpose(-2, -1))).tril()
    u = torch.linalg.solve(torch.eye(length) + a, beta[..., None] * (v - k @ state))
    out = q @ state + ((q @ k.transpose(-2, -1)).tril()) @ u
    return out, state + k.transpose(-2, -1) @ u


def chunk_from_zero(state, q, k, v, beta):  # [chunk-start-state-ignored]
    return delta_chunk(torch.zeros_like(state), q, k, v, beta)


def chunk_library(state, q, k, v, beta):  # [rule-from-library]
    return la.chunk_step(state, q, k, v, beta, torch.zeros_like(beta[..., :1]).expand(beta.shape))


CORRECT = [
    (checks.check_linear_recurrent, linear_recurrent_loop),
    (checks.check_linear_recurrent, linear_recurrent_prefix_sums),
    (checks.check_linear_recurrent, linear_recurrent_per_sequence),
    (checks.check_delta_update, delta_update_einsum),
    (checks.check_delta_update, delta_update_erase_then_write),
    (checks.check_gated_delta_rule, gated_delta_rule),
    (checks.check_gated_delta_rule, gated_delta_rule_einsum),
    (checks.check_delta_chunk, delta_chunk),
    (checks.check_delta_chunk, delta_chunk_by_steps),
]

PLANTED = [
    (checks.check_linear_recurrent, linear_state_shared, "state-carried-over"),
    (checks.check_linear_recurrent, linear_never_reset, "state-carried-over"),
    (checks.check_linear_recurrent, linear_read_first, "read-before-write"),
    (checks.check_linear_recurrent, lambda q, k, v: linear_recurrent_loop(q, k, v) * 2, "wrong-output"),
    (checks.check_delta_update, delta_no_beta, "beta-missing"),
    (checks.check_delta_update, delta_beta_on_key, "beta-on-key"),
    (checks.check_delta_update, delta_linear_write, "no-erase"),
    (checks.check_gated_delta_rule, gated_decay_after, "decay-after-write"),
    (checks.check_gated_delta_rule, gated_raw_keys, "keys-not-normalized"),
    (checks.check_gated_delta_rule, gated_raw_keys_only, "keys-not-normalized"),
    (checks.check_gated_delta_rule, gated_carried, "state-carried-over"),
    (checks.check_delta_chunk, chunk_strict_outputs, "chunk-mask-diagonal"),
    (checks.check_delta_chunk, chunk_inclusive_system, "chunk-mask-diagonal"),
    (checks.check_delta_chunk, chunk_from_zero, "chunk-start-state-ignored"),
    (checks.check_delta_chunk, lambda *args: delta_chunk(*args)[0], "wrong-type"),
    (checks.check_linear_recurrent, linear_parallel, "not-token-by-token"),
    (checks.check_linear_recurrent, linear_parallel_per_query, "not-token-by-token"),
    (checks.check_linear_recurrent, linear_parallel_numpy, "left-torch"),
    (checks.check_linear_recurrent, la.linear_attention_parallel, "rule-from-library"),
    (checks.check_linear_recurrent, lambda q, k, v: la.linear_attention_recurrent(q, k, v)[0], "rule-from-library"),
    (checks.check_delta_update, lambda state, k, v, beta: la.delta_step(state, k, v, beta, torch.zeros_like(beta)),
     "rule-from-library"),
    (checks.check_gated_delta_rule, gated_library, "rule-from-library"),
    (checks.check_delta_chunk, chunk_library, "rule-from-library"),
    (checks.check_delta_update, delta_key_normalized, "delta-key-normalized"),
    (checks.check_delta_update, delta_divided_by_norm, "delta-divided-by-norm"),
]


@pytest.mark.parametrize("seed", [3, 11])
def test_hidden_cases_pass_right_answers_and_name_mistakes(seed, capsys):
    hidden.enable(seed)
    try:
        checks.check_gated_delta_rule(gated_delta_rule)
        assert "5 random batches" in capsys.readouterr().out  # 4 public cases and a hidden one
        with pytest.raises(checks.CheckFailed, match=r"^\[decay-after-write\]"):
            checks.check_gated_delta_rule(gated_decay_after)
    finally:
        hidden.disable()


def test_hidden_case_is_longer_and_wider():
    hidden.enable(0)
    try:
        ((b, h, t, dk, dv),) = hidden.linear_sizes()
    finally:
        hidden.disable()
    assert b >= 3 and h >= 3 and t >= 24 and dv != dk
    assert hidden.linear_sizes() == []


def test_messages_name_the_rule():
    with pytest.raises(checks.CheckFailed) as info:
        checks.check_delta_update(delta_no_beta)
    assert "beta k (v - k S)^T" in str(info.value)
    with pytest.raises(checks.CheckFailed) as info:
        checks.check_linear_recurrent(linear_read_first)
    assert "S_{t-1}" in str(info.value)
