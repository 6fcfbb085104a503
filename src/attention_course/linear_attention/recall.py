"""Why linear attention forgets badly, measured: store N key-value pairs, then
ask for each value by its key.

Keys are random unit vectors in Dk dimensions, values random vectors; a memory
answers a key with a vector, and the answer counts as recalled when it is
closer (by dot product) to the right value than to every other stored value.
Three memories:

* ``"softmax"``: attention over all N keys (a KV cache, N rows), sharp scores
  (scale 20 on unit keys);
* ``"linear"``: the sum of k v^T (a (Dk, Dv) state): every read is blurred by
  all N - 1 other pairs;
* ``"delta"``: the delta rule with beta (the same state size): each write
  erases what the state said about its key, so the recent pairs stay legible
  and the old ones fade.

A second experiment overwrites: the same keys are written again with new
values; the right answer is the newest.

Then the same question on a trained model (:func:`trained_recall`): chapter
12's training loop (:func:`~attention_course.training.train`) on its
associative-recall task
(:func:`~attention_course.tasks.associative_recall_batch`), one layer whose
memory is softmax attention, linear attention or the delta rule
(:class:`RecallModel`), with more pairs than the state has key dimensions.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..masks import causal_mask
from ..modern.attention import attend
from ..tasks import associative_recall_batch
from ..training import tagging_loss, train
from .rules import (
    elu_feature_map,
    gated_delta_chunked,
    gated_delta_recurrent,
    l2_normalize,
    linear_attention_parallel,
    linear_attention_recurrent,
    normalize_qk,
    read,
)

MEMORIES = ("softmax", "linear", "delta")


def _recalled(answers: Tensor, values: Tensor, targets: Tensor) -> Tensor:
    """(trials, 1, N) bool: answer i is nearer (dot product) to value
    targets[i] than to every other value."""
    return (answers @ values.transpose(-2, -1)).argmax(-1) == targets


def memory_answers(
    keys: Tensor,
    values: Tensor,
    queries: Tensor,
    memory: str,
    beta: float = 1.0,
) -> Tensor:
    """What ``memory`` answers to each query after the (key, value) pairs were
    written in order.

    keys (trials, 1, N, Dk), values (trials, 1, N, Dv), queries (trials, 1, M,
    Dk) -> (trials, 1, M, Dv).
    """
    if memory == "softmax":
        allowed = torch.ones(queries.size(-2), keys.size(-2), dtype=torch.bool)
        return attend(queries, keys, values, allowed, scale=20.0)[0]
    if memory == "linear":
        state = linear_attention_recurrent(keys, keys, values)[1]
    elif memory == "delta":
        state = gated_delta_recurrent(
            keys,
            keys,
            values,
            torch.full(keys.shape[:3], beta, dtype=keys.dtype),
        )[1]
    else:
        raise ValueError(
            "memory must be 'softmax', 'linear' or 'delta', got "
            f"memory={memory!r}"
        )
    return read_all(state, queries)


def read_all(state: Tensor, queries: Tensor) -> Tensor:
    """state (trials, 1, Dk, Dv), queries (trials, 1, M, Dk) -> (trials, 1, M,
    Dv): every query reads the state."""
    return torch.stack(
        [read(state, queries[:, :, i]) for i in range(queries.size(-2))], dim=2
    )


def recall(
    num_pairs: int,
    key_dim: int = 16,
    value_dim: int = 16,
    trials: int = 64,
    seed: int = 0,
    beta: float = 1.0,
    recent: int = 8,
) -> dict[str, tuple[float, float]]:
    """{memory: (recall of all pairs, recall of the last ``recent`` pairs
    written)} over seeded random trials."""
    generator = torch.Generator().manual_seed(seed)
    keys = l2_normalize(
        torch.randn(
            trials,
            1,
            num_pairs,
            key_dim,
            generator=generator,
            dtype=torch.float64,
        )
    )
    values = torch.randn(
        trials,
        1,
        num_pairs,
        value_dim,
        generator=generator,
        dtype=torch.float64,
    )
    targets = torch.arange(num_pairs)
    result = {}
    for memory in ("softmax", "linear", "delta"):
        hit = _recalled(
            memory_answers(keys, values, keys, memory, beta), values, targets
        ).double()
        result[memory] = (hit.mean().item(), hit[..., -recent:].mean().item())
    return result


def overwrite(
    num_keys: int = 8,
    key_dim: int = 16,
    writes: int = 4,
    trials: int = 64,
    seed: int = 0,
) -> dict[str, float]:
    """Each of ``num_keys`` keys written ``writes`` times with a new value:
    {memory: recall of the newest values}."""
    generator = torch.Generator().manual_seed(seed)
    distinct = l2_normalize(
        torch.randn(
            trials,
            1,
            num_keys,
            key_dim,
            generator=generator,
            dtype=torch.float64,
        )
    )
    # (trials, 1, writes * N, Dk): all keys, then all again, ...
    keys = distinct.repeat(1, 1, writes, 1)
    values = torch.randn(
        trials,
        1,
        writes * num_keys,
        key_dim,
        generator=generator,
        dtype=torch.float64,
    )
    # the last round's values
    newest = torch.arange((writes - 1) * num_keys, writes * num_keys)
    return {
        memory: _recalled(
            memory_answers(keys, values, distinct, memory), values, newest
        )
        .double()
        .mean()
        .item()
        for memory in ("softmax", "linear", "delta")
    }


# ---------------------------------------------------------------- the same,
# trained


class RecallModel(nn.Module):
    """One layer, one head: embeddings of the key and value ids, q, k, v
    projections, a memory, a readout.

    ``memory``: "softmax" (causal attention over every earlier position, a KV
    cache), "linear" (elu + 1 features, a (key_dim, value_dim) state) or
    "delta" (unit q and k, beta = sigmoid of a projection, the same state; the
    chunked form, as training runs it). Input (B, T) key and value ids ->
    logits (B, T, num_values).
    """

    def __init__(
        self,
        memory: str,
        num_keys: int = 64,
        num_values: int = 16,
        dim: int = 32,
        key_dim: int = 8,
        value_dim: int = 16,
    ):
        super().__init__()
        if memory not in MEMORIES:
            raise ValueError(
                f"memory must be one of {MEMORIES}, got memory={memory!r}"
            )
        self.memory, self.sizes = memory, [key_dim, key_dim, value_dim]
        self.key_embedding = nn.Embedding(num_keys, dim)
        # + the blank of a question
        self.value_embedding = nn.Embedding(num_values + 1, dim)
        self.qkv = nn.Linear(dim, 2 * key_dim + value_dim)
        # the delta rule's writing strength (unused by the others)
        self.beta = nn.Linear(dim, 1)
        self.readout = nn.Linear(value_dim, num_values)

    def forward(self, key_ids: Tensor, value_ids: Tensor) -> Tensor:
        # (B, T, D)
        x = self.key_embedding(key_ids) + self.value_embedding(value_ids)
        # (B, 1, T, .): one head
        q, k, v = (y.unsqueeze(1) for y in self.qkv(x).split(self.sizes, -1))
        if self.memory == "softmax":
            out = attend(
                q,
                k,
                v,
                causal_mask(x.size(1), device=x.device),
                scale=q.size(-1) ** -0.5,
            )[0]
        elif self.memory == "linear":
            out = linear_attention_parallel(
                elu_feature_map(q), elu_feature_map(k), v
            )
        else:
            # (B, 1, T)
            beta = torch.sigmoid(self.beta(x)).squeeze(-1).unsqueeze(1)
            out = gated_delta_chunked(
                *normalize_qk(q, k), v, beta, chunk_size=16
            )[0]
        return self.readout(out.squeeze(1))  # (B, T, num_values)


def recall_accuracy(model: RecallModel, batch: tuple[Tensor, ...]) -> float:
    """Fraction of the batch's questions whose most likely value is the one
    stored with the key."""
    key_ids, value_ids, targets, asked = batch
    with torch.no_grad():
        guess = model(key_ids, value_ids).argmax(-1)
    return (guess == targets)[asked].float().mean().item()


def trained_recall(
    memory: str,
    num_pairs: int = 16,
    key_dim: int = 8,
    steps: int = 300,
    batch_size: int = 64,
    seed: int = 0,
) -> tuple[RecallModel, float]:
    """Train a :class:`RecallModel` with chapter 12's loop (AdamW, lr 1e-2,
    loss on the questions only) -> (model, recall accuracy on 512 held-out
    sequences)."""
    torch.manual_seed(seed)  # the initial weights
    model = RecallModel(memory, key_dim=key_dim)

    def loss_fn(m: nn.Module, batch: tuple[Tensor, ...]) -> Tensor:
        key_ids, value_ids, targets, asked = batch
        return tagging_loss(m(key_ids, value_ids), targets, asked)

    threads = torch.get_num_threads()
    # tensors of a few thousand numbers: a second thread only waits at every
    # operation
    torch.set_num_threads(1)
    try:
        train(
            model,
            lambda g: associative_recall_batch(batch_size, num_pairs, g),
            loss_fn,
            steps,
            lr=1e-2,
            seed=seed,
        )
    finally:
        torch.set_num_threads(threads)
    held_out = associative_recall_batch(
        512, num_pairs, torch.Generator().manual_seed(seed + 1)
    )
    return model, recall_accuracy(model, held_out)
