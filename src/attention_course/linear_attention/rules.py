"""Linear attention and the (gated) delta rule: one update, computed three
ways.

Per head, queries and keys are (B, H, T, Dk), values (B, H, T, Dv). The layer's
memory is a state
S (B, H, Dk, Dv): a key k predicts the value ``k @ S``, a query q reads ``q @
S``. Two more inputs per token:

* ``beta`` (B, H, T) in [0, 1], the writing strength of the delta rule (a
  learning rate);
* ``log_decay`` (B, H, T) <= 0, the log of the gate alpha = exp(log_decay) that
  scales the state before each write (Gated DeltaNet, Mamba-2); None means
  alpha = 1 (no forgetting). Kimi Linear's gate is a vector per token, one
  alpha per key channel: log_decay (B, H, T, Dk) scales each row of the state
  (the recurrent form).

The update is defined once, per token, in :func:`delta_step` (and
:func:`linear_step` for plain linear attention). The forms that compute it:

* recurrent (:func:`gated_delta_recurrent`): token by token, a (Dk, Dv) state,
  O(T) time, O(1) memory in T;
* chunked (:func:`gated_delta_chunked`): chunk by chunk, the WY/UT
  representation of the chunk's updates as matrix products
  (:func:`chunk_parts`, all chunks at once), the state carried between chunks
  (:func:`chunk_write`), the outputs read from it (:func:`chunk_read`, all
  chunks at once): what training uses;
* parallel (:func:`gated_delta_parallel`): :func:`chunk_step` on one chunk as
  long as the sequence, a masked (T, T) matrix as softmax attention, no loop at
  all.

Query and key heads may be fewer than value heads (grouped heads, as
Qwen3-Next's 16 key heads for 32 value heads): each query/key head serves ``H
// H_k`` consecutive value heads
(:func:`~attention_course.kv_cache.repeat_kv`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from ..kv_cache import repeat_kv
from ..masks import causal_mask
from ..validation import check_floating, check_int, check_rank

# ---------------------------------------------------------------- input checks


def check_rule_inputs(q, k, v, beta=None, log_decay=None, state=None) -> None:
    """Raise unless q, k (B, H_k, T, Dk), v (B, H, T, Dv), beta (B, H, T),
    log_decay (B, H, T) or (B, H, T, Dk) (a decay per key channel), state (B,
    H, Dk, Dv).

    H must be a multiple of H_k (grouped heads); log_decay must be <= 0 (alpha
    = exp(log_decay) <= 1).
    """
    for name, x in (("q", q), ("k", k), ("v", v)):
        check_floating(x, name)
        check_rank(x, name, 4, "(B, H, T, D)")
    if q.shape != k.shape:
        raise ValueError(
            "q and k must have one shape (B, H_k, T, Dk), got "
            f"{tuple(q.shape)} and {tuple(k.shape)}"
        )
    b, h_k, t, dk = k.shape
    if v.size(0) != b or v.size(2) != t:
        raise ValueError(
            f"v must be (B={b}, H, T={t}, Dv), got {tuple(v.shape)}"
        )
    if t == 0:
        raise ValueError("the sequence is empty (T = 0)")
    h = v.size(1)
    if h % h_k:
        raise ValueError(
            f"value heads H={h} must be a multiple of query/key heads "
            f"H_k={h_k}"
        )
    if not q.dtype == k.dtype == v.dtype:
        raise TypeError(
            f"q, k and v must share a dtype, got {q.dtype}, {k.dtype}, "
            f"{v.dtype}"
        )
    for name, x, shapes in (
        ("beta", beta, [(b, h, t)]),
        ("log_decay", log_decay, [(b, h, t), (b, h, t, dk)]),
    ):
        if x is not None:
            check_floating(x, name)
            if tuple(x.shape) not in shapes:
                allowed = " or ".join(map(str, shapes))
                raise ValueError(
                    f"{name} must be {allowed} (B, H, T[, Dk]), got "
                    f"{tuple(x.shape)}"
                )
    if log_decay is not None and bool((log_decay > 0).any()):
        raise ValueError(
            "log_decay must be <= 0: the gate alpha = exp(log_decay) may "
            "shrink the state, not grow it"
        )
    if state is not None:
        check_floating(state, "state")
        if tuple(state.shape) != (b, h, dk, v.size(3)):
            raise ValueError(
                f"state must be (B, H, Dk, Dv) = {(b, h, dk, v.size(3))}, "
                f"got {tuple(state.shape)}"
            )


def _grouped(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    """Repeat query/key heads so that each value head has its own: (B, H_k, T,
    Dk) -> (B, H, T, Dk)."""
    groups = v.size(1) // k.size(1)
    return repeat_kv(q, groups), repeat_kv(k, groups)


def _defaults(v: Tensor, beta, log_decay) -> tuple[Tensor, Tensor]:
    """beta = 1 and log_decay = 0 (no gate) where they are not given."""
    ones = v.new_ones(v.shape[:3])  # (B, H, T)
    return (ones if beta is None else beta), (
        torch.zeros_like(ones) if log_decay is None else log_decay
    )


def _zero_state(k: Tensor, v: Tensor) -> Tensor:
    # (B, H, Dk, Dv)
    return v.new_zeros(v.size(0), v.size(1), k.size(-1), v.size(-1))


# ---------------------------------------------------------------- queries and
# keys


def elu_feature_map(x: Tensor) -> Tensor:
    """phi(x) = elu(x) + 1 > 0: Katharopoulos et al.'s feature map, so that
    phi(q) . phi(k) is a positive score."""
    return F.elu(x) + 1


def l2_normalize(x: Tensor, eps: float = 1e-6) -> Tensor:
    """x / sqrt(|x|^2 + eps) over the last axis (as flash-linear-attention and
    transformers compute it).

    Unit keys keep the delta rule stable: with |k| = 1 and beta in [0, 1], one
    step never enlarges the state.
    """
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + eps)


def normalize_qk(
    q: Tensor, k: Tensor, eps: float = 1e-6
) -> tuple[Tensor, Tensor]:
    """Unit queries and keys, the queries then scaled by 1 / sqrt(Dk) (Gated
    DeltaNet's inputs)."""
    return l2_normalize(q, eps) * q.size(-1) ** -0.5, l2_normalize(k, eps)


# ---------------------------------------------------------------- the update,
# per token


def check_per_head(log_decay) -> None:
    """The chunked and parallel forms take one gate per head and token; a gate
    per channel runs token by token."""
    if log_decay is not None and log_decay.dim() == 4:
        raise ValueError(
            "a decay per key channel, log_decay (B, H, T, Dk), runs in the "
            "recurrent form only "
            "(gated_delta_recurrent, linear_attention_recurrent)"
        )


def decay_state(state: Tensor, log_decay: Tensor) -> Tensor:
    """alpha S: log_decay (B, H) scales the whole state of a head, (B, H, Dk)
    each of its rows (key channels)."""
    alpha = log_decay.exp()
    return state * (
        alpha[..., None, None]
        if alpha.dim() == state.dim() - 2
        else alpha[..., None]
    )


def read(state: Tensor, q: Tensor) -> Tensor:
    """state (B, H, Dk, Dv), q (B, H, Dk) -> q @ S (B, H, Dv): what the memory
    returns for the query."""
    return (q.unsqueeze(-2) @ state).squeeze(-2)


def linear_step(
    state: Tensor, k: Tensor, v: Tensor, log_decay: Tensor
) -> Tensor:
    """Linear attention's update: S <- alpha S + k v^T (it adds, it never
    erases)."""
    return decay_state(state, log_decay) + k.unsqueeze(-1) * v.unsqueeze(-2)


def delta_step(
    state: Tensor, k: Tensor, v: Tensor, beta: Tensor, log_decay: Tensor
) -> Tensor:
    """The gated delta rule, one token: S <- alpha S, then S <- S + beta k (v -
    k @ S)^T.

    state (B, H, Dk, Dv); k (B, H, Dk); v (B, H, Dv); beta (B, H); log_decay
    (B, H), or (B, H, Dk) for a gate per key channel (Kimi Linear). First the
    gate forgets (alpha = exp(log_decay)); then the state's prediction for k is
    moved a fraction beta towards v: one step of online least squares on the
    loss |k @ S - v|^2 / 2, learning rate beta. With alpha = 1 it is DeltaNet's
    rule.
    """
    state = decay_state(state, log_decay)
    # (B, H, Dv): what the memory gets wrong about this key
    error = v - read(state, k)
    return state + k.unsqueeze(-1) * (beta.unsqueeze(-1) * error).unsqueeze(-2)


# ---------------------------------------------------------------- plain linear
# attention: two forms


def decay_matrix(log_decay: Tensor) -> Tensor:
    """(B, H, T) log gates -> (B, H, T, T): entry [t, s] = alpha_{s+1} ...
    alpha_t for s <= t, 0 above.

    What a value written at step s still weighs at step t: the products of the
    gates in between (1 on the diagonal). Computed from cumulative sums of
    logs, masked with the course's causal mask before the exp.
    """
    gamma = log_decay.cumsum(-1)  # (B, H, T): log(alpha_1 ... alpha_t)
    # (B, H, T, T): log of the product from s+1 to t
    gaps = gamma[..., :, None] - gamma[..., None, :]
    allowed = causal_mask(log_decay.size(-1), device=log_decay.device)
    # exp(-inf) = 0 above the diagonal, never overflows
    return gaps.masked_fill_(~allowed, float("-inf")).exp_()


def linear_attention_parallel(
    q: Tensor, k: Tensor, v: Tensor, log_decay: Tensor | None = None
) -> Tensor:
    """Causal linear attention as one masked matrix: ((Q K^T) * D) V, D the
    decay matrix (the causal mask if no gate).

    q, k (B, H_k, T, Dk), v (B, H, T, Dv) -> (B, H, T, Dv). No softmax: the
    scores are used as they are.
    """
    check_rule_inputs(q, k, v, log_decay=log_decay)
    check_per_head(log_decay)
    q, k = _grouped(q, k, v)
    _, log_decay = _defaults(v, None, log_decay)
    # (B, H, T, T) @ (B, H, T, Dv)
    return ((q @ k.transpose(-2, -1)) * decay_matrix(log_decay)) @ v


def linear_attention_recurrent(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    log_decay: Tensor | None = None,
    state: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Causal linear attention token by token -> (out (B, H, T, Dv), final
    state (B, H, Dk, Dv))."""
    check_rule_inputs(q, k, v, log_decay=log_decay, state=state)
    q, k = _grouped(q, k, v)
    _, log_decay = _defaults(v, None, log_decay)
    state = _zero_state(k, v) if state is None else state
    outs = []
    for t in range(v.size(2)):
        state = linear_step(state, k[:, :, t], v[:, :, t], log_decay[:, :, t])
        outs.append(read(state, q[:, :, t]))
    return torch.stack(outs, dim=2), state


# ---------------------------------------------------------------- the gated
# delta rule: three forms


def gated_delta_recurrent(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor,
    log_decay: Tensor | None = None,
    state: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """The gated delta rule token by token (the definition) -> (out (B, H, T,
    Dv), final state (B, H, Dk, Dv)).

    Each output reads the state after its own token's write: o_t = q_t @ S_t.
    """
    check_rule_inputs(q, k, v, beta, log_decay, state)
    q, k = _grouped(q, k, v)
    beta, log_decay = _defaults(v, beta, log_decay)
    state = _zero_state(k, v) if state is None else state
    outs = []
    for t in range(v.size(2)):
        state = delta_step(
            state, k[:, :, t], v[:, :, t], beta[:, :, t], log_decay[:, :, t]
        )
        outs.append(read(state, q[:, :, t]))
    return torch.stack(outs, dim=2), state


def chunk_parts(
    q: Tensor, k: Tensor, v: Tensor, beta: Tensor, log_decay: Tensor
) -> tuple[Tensor, ...]:
    """Everything about a chunk of L tokens that does not depend on the state
    before it (any leading axes).

    Unrolling :func:`delta_step` over the chunk, the state at step t is the
    decayed start state plus the keys times what each step actually wrote, u_s
    = beta_s (v_s - k_s @ S_{s-1}'):

        S_t = g_t S_0 + sum_{s <= t} (g_t / g_s) k_s u_s^T,   g_t = alpha_1 ...
        alpha_t.

    The writes depend on each other only through earlier ones, a unit
    lower-triangular system (I + A) U = beta (V - g K S_0) with A[t, s] =
    beta_t (g_t / g_s) k_t . k_s for s < t (strictly below the
    diagonal: a write does not see itself). Solving it once per chunk is the UT
    / WY representation of the product of the chunk's L rank-one updates: U = W
    - K' S_0 with W = (I + A)^-1 beta V and K' = (I + A)^-1 beta g K. The
    outputs mask (q_t . k_s) (g_t / g_s) with s <= t (the diagonal included: a
    query reads its own token's write).

    Returns (W, K', masked scores (.., L, L), g (.., L, 1), the keys decayed to
    the chunk's end (g_L / g_s) k_s).
    """
    # (.., L, L): g_t / g_s for s <= t, 0 above the diagonal
    decay = decay_matrix(log_decay)
    g = log_decay.cumsum(-1).exp()[..., None]  # (.., L, 1): g_t
    beta_k = beta[..., None] * k
    # A with its diagonal and upper part left in: the solve reads only the
    # strictly lower part (unitriangular)
    a = (beta_k @ k.transpose(-2, -1)) * decay  # (.., L, L)
    # one solve for [beta V | beta g K]
    writes, keys = torch.linalg.solve_triangular(
        # reads I + A
        a,
        torch.cat([beta[..., None] * v, g * beta_k], -1),
        upper=False,
        unitriangular=True,
    ).split([v.size(-1), k.size(-1)], dim=-1)
    scores = (q @ k.transpose(-2, -1)) * decay  # (.., L, L)
    return writes, keys, scores, g, k * decay[..., -1, :, None]


def _add_product(
    x: Tensor, a: Tensor, b: Tensor, alpha: float = 1.0
) -> Tensor:
    """x + alpha a @ b over any leading axes, as one kernel (torch.baddbmm on
    the axes flattened)."""
    flat = [t.reshape(-1, *t.shape[-2:]) for t in (x, a, b)]
    return torch.baddbmm(*flat, alpha=alpha).view(x.shape)


def chunk_write(
    state: Tensor, parts: tuple[Tensor, ...]
) -> tuple[Tensor, Tensor]:
    """From the state before a chunk (.., Dk, Dv): what its tokens write, U
    (.., L, Dv), and the state after it."""
    writes, keys, _, g, keys_to_end = parts
    # (.., L, Dv): U = W - K' S_0
    u = _add_product(writes, keys, state, alpha=-1)
    # (.., Dk, Dv)
    return u, _add_product(
        g[..., -1:, :] * state, keys_to_end.transpose(-2, -1), u
    )


def chunk_read(
    state: Tensor, q: Tensor, u: Tensor, parts: tuple[Tensor, ...]
) -> Tensor:
    """A chunk's outputs (.., L, Dv): the decayed start state read by q, plus
    the masked scores times the writes."""
    _, _, scores, g, _ = parts
    return _add_product((g * q) @ state, scores, u)


def chunk_step(
    state: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor,
    log_decay: Tensor,
) -> tuple[Tensor, Tensor]:
    """The L tokens of one chunk at once, from the state before it -> (out (B,
    H, L, Dv), state after it)."""
    parts = chunk_parts(q, k, v, beta, log_decay)
    u, after = chunk_write(state, parts)
    return chunk_read(state, q, u, parts), after


def chunks_step(
    state: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor,
    log_decay: Tensor,
) -> tuple[Tensor, Tensor]:
    """Consecutive chunks (chunks, B, H, L, ...) from the state before the
    first -> (out (chunks, B, H, L, Dv), state after the last).

    Only the state depends on the chunks before: the parts of every chunk
    (:func:`chunk_parts`) are computed at once, then one short loop carries the
    state (:func:`chunk_write`: two small products per chunk), then every
    chunk's outputs at once (:func:`chunk_read`).
    """
    parts = chunk_parts(q, k, v, beta, log_decay)
    starts, writes = [], []
    for i in range(q.size(0)):  # the one sequential part
        starts.append(state)
        u, state = chunk_write(state, [p[i] for p in parts])
        writes.append(u)
    return chunk_read(
        torch.stack(starts), q, torch.stack(writes), parts
    ), state


def gated_delta_chunked(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor,
    log_decay: Tensor | None = None,
    state: Tensor | None = None,
    chunk_size: int = 64,
    group: int = 8,
    step: Callable[..., tuple[Tensor, Tensor]] = chunks_step,
) -> tuple[Tensor, Tensor]:
    """The gated delta rule chunk by chunk, the state carried between chunks.
    Equal to :func:`gated_delta_recurrent`.

    The sequence is cut into chunks of ``chunk_size`` tokens, copied once
    chunk-major, (chunks, B, H, L, ...), and taken ``group`` chunks at a time
    by ``step`` (:func:`chunks_step`): every product then runs on contiguous
    blocks, and a group's (L, L) matrices stay in the CPU's cache. A ragged end
    is padded with tokens that change nothing (k = v = 0, beta = 0, alpha = 1).
    Work grows linearly in T for a fixed L.

    ``step=torch.compile(chunks_step)`` fuses each group's elementwise work
    into fewer passes over memory (chapter 15's compiler): it compiles for the
    first group's shape, which every full group shares (a shorter last group
    compiles once more).
    """
    check_rule_inputs(q, k, v, beta, log_decay, state)
    check_per_head(log_decay)
    check_int(chunk_size, "chunk_size")
    check_int(group, "group")
    q, k = _grouped(q, k, v)
    beta, log_decay = _defaults(v, beta, log_decay)
    state = _zero_state(k, v) if state is None else state
    length = v.size(2)
    pad = -length % chunk_size
    if pad:
        q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
        beta, log_decay = (F.pad(x, (0, pad)) for x in (beta, log_decay))
    # (chunks, B, H, L, ...)
    inputs = [
        x.unflatten(2, (-1, chunk_size)).movedim(2, 0).contiguous()
        for x in (q, k, v, beta, log_decay)
    ]
    outs = []
    for first in range(0, inputs[0].size(0), group):
        out, state = step(state, *(x[first : first + group] for x in inputs))
        # (B, H, chunks, L, Dv): cat then writes the output's own layout at
        # once
        outs.append(out.movedim(0, 2))
    return torch.cat(outs, dim=2).flatten(2, 3)[:, :, :length], state


def gated_delta_parallel(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor,
    log_decay: Tensor | None = None,
    state: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """The gated delta rule with no loop: one chunk as long as the sequence (a
    (T, T) system, like softmax's)."""
    check_rule_inputs(q, k, v, beta, log_decay, state)
    check_per_head(log_decay)
    q, k = _grouped(q, k, v)
    beta, log_decay = _defaults(v, beta, log_decay)
    return chunk_step(
        _zero_state(k, v) if state is None else state, q, k, v, beta, log_decay
    )
