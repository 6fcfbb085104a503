"""Why linear attention forgets badly, measured: store N key-value pairs, then ask for each value by its key.

Keys are random unit vectors in Dk dimensions, values random vectors; a memory answers a key with a vector, and
the answer counts as recalled when it is closer (by dot product) to the right value than to every other stored
value. Three memories:

* ``"softmax"``: attention over all N keys (a KV cache, N rows), sharp scores (scale 20 on unit keys);
* ``"linear"``: the sum of k v^T (a (Dk, Dv) state): every read is blurred by all N - 1 other pairs;
* ``"delta"``: the delta rule with beta (the same state size): each write erases what the state said about its key,
  so the recent pairs stay legible and the old ones fade.

A second experiment overwrites: the same keys are written again with new values; the right answer is the newest.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..modern.attention import attend
from .rules import gated_delta_recurrent, l2_normalize, linear_attention_recurrent, read


def _recalled(answers: Tensor, values: Tensor, targets: Tensor) -> Tensor:
    """(trials, 1, N) bool: answer i is nearer (dot product) to value targets[i] than to every other value."""
    return (answers @ values.transpose(-2, -1)).argmax(-1) == targets


def memory_answers(keys: Tensor, values: Tensor, queries: Tensor, memory: str, beta: float = 1.0) -> Tensor:
    """What ``memory`` answers to each query after the (key, value) pairs were written in order.

    keys (trials, 1, N, Dk), values (trials, 1, N, Dv), queries (trials, 1, M, Dk) -> (trials, 1, M, Dv).
    """
    if memory == "softmax":
        allowed = torch.ones(queries.size(-2), keys.size(-2), dtype=torch.bool)
        return attend(queries, keys, values, allowed, scale=20.0)[0]
    if memory == "linear":
        state = linear_attention_recurrent(keys, keys, values)[1]
    elif memory == "delta":
        state = gated_delta_recurrent(keys, keys, values, torch.full(keys.shape[:3], beta, dtype=keys.dtype))[1]
    else:
        raise ValueError(f"memory must be 'softmax', 'linear' or 'delta', got memory={memory!r}")
    return read_all(state, queries)


def read_all(state: Tensor, queries: Tensor) -> Tensor:
    """state (trials, 1, Dk, Dv), queries (trials, 1, M, Dk) -> (trials, 1, M, Dv): every query reads the state."""
    return torch.stack([read(state, queries[:, :, i]) for i in range(queries.size(-2))], dim=2)


def recall(num_pairs: int, key_dim: int = 16, value_dim: int = 16, trials: int = 64, seed: int = 0,
           beta: float = 1.0, recent: int = 8) -> dict[str, tuple[float, float]]:
    """{memory: (recall of all pairs, recall of the last ``recent`` pairs written)} over seeded random trials."""
    generator = torch.Generator().manual_seed(seed)
    keys = l2_normalize(torch.randn(trials, 1, num_pairs, key_dim, generator=generator, dtype=torch.float64))
    values = torch.randn(trials, 1, num_pairs, value_dim, generator=generator, dtype=torch.float64)
    targets = torch.arange(num_pairs)
    result = {}
    for memory in ("softmax", "linear", "delta"):
        hit = _recalled(memory_answers(keys, values, keys, memory, beta), values, targets).double()
        result[memory] = (hit.mean().item(), hit[..., -recent:].mean().item())
    return result


def overwrite(num_keys: int = 8, key_dim: int = 16, writes: int = 4, trials: int = 64,
              seed: int = 0) -> dict[str, float]:
    """Each of ``num_keys`` keys written ``writes`` times with a new value: {memory: recall of the newest values}."""
    generator = torch.Generator().manual_seed(seed)
    distinct = l2_normalize(torch.randn(trials, 1, num_keys, key_dim, generator=generator, dtype=torch.float64))
    keys = distinct.repeat(1, 1, writes, 1)  # (trials, 1, writes * N, Dk): all keys, then all again, ...
    values = torch.randn(trials, 1, writes * num_keys, key_dim, generator=generator, dtype=torch.float64)
    newest = torch.arange((writes - 1) * num_keys, writes * num_keys)  # the last round's values
    return {memory: _recalled(memory_answers(keys, values, distinct, memory), values, newest).double().mean().item()
            for memory in ("softmax", "linear", "delta")}
