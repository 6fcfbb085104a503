"""Looking inside a trained GPT (chapter 12): attention maps, head scores, head ablation.

Everything goes through the :class:`~attention_course.gpt.GPT`'s public interface: ``return_weights``,
``head_mask``, and its blocks and their attention modules (for hooks); models run in eval mode (:func:`eval_mode`).

- :func:`attention_maps` captures every layer's attention weights with the GPT's ``return_weights``.
- :func:`previous_token_score`: how much a head attends from position t to t - 1.
- :func:`prefix_matching_score`: how much a head attends from a token to the token that *followed* an earlier
  occurrence of it, the signature of an induction head (Olsson et al., 2022).
- :func:`copy_accuracy` and :func:`ablation_mask`: next-token accuracy on the copied part of a sequence, with
  chosen heads switched off through the GPT's ``head_mask``.
- :func:`stream_write_ratio`: how large a layer's attention output is next to the residual stream it is added to.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor

from .gpt import GPT
from .validation import check_rank


@contextmanager
def eval_mode(model: GPT) -> Iterator[GPT]:
    """Run the body with ``model`` in eval mode (no dropout), then restore the mode it had."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)


@torch.no_grad()
def attention_maps(model: GPT, ids: Tensor) -> Tensor:
    """Attention weights of every layer and head: ids (B, T) -> (L, B, H, T, T), in eval mode."""
    with eval_mode(model):
        _, weights = model(ids, return_weights=True)  # L tensors (B, H, T, T)
    return torch.stack(weights)


def _check_maps(weights: Tensor) -> None:
    if weights.dim() < 2 or weights.size(-1) != weights.size(-2):
        raise ValueError(f"weights must be (..., T, T) self-attention maps, got shape {tuple(weights.shape)}")


def previous_token_score(weights: Tensor) -> Tensor:
    """Mean attention from each position t >= 1 to t - 1: weights (L, B, H, T, T) -> (L, H).

    1.0 for a head that always looks exactly one token back. Any leading (L, B, H) layout works as long as the
    batch is dimension -4: the mean runs over the batch and the query positions.
    """
    _check_maps(weights)
    check_rank(weights, "weights", 5, "(L, B, H, T, T)")
    to_previous = weights.diagonal(offset=-1, dim1=-2, dim2=-1)  # (L, B, H, T - 1): w[t, t - 1]
    return to_previous.mean(dim=(1, 3))


def induction_targets(ids: Tensor) -> Tensor:
    """Where an induction head should look: ids (B, T) -> bool (B, T, T).

    ``targets[b, t, j]`` is True when key j (0 < j < t) follows an earlier occurrence of the query's token:
    ids[b, j - 1] == ids[b, t]. Key j holds the token that came next last time, the one to copy.
    """
    check_rank(ids, "ids", 2, "(B, T)")
    t = ids.size(1)
    previous = torch.cat([torch.full_like(ids[:, :1], -1), ids[:, :-1]], dim=1)  # (B, T): ids[j - 1], -1 at j = 0
    same = ids[:, :, None] == previous[:, None, :]  # (B, Tq, Tk): ids[t] == ids[j - 1]
    strictly_past = torch.ones(t, t, dtype=torch.bool, device=ids.device).tril(diagonal=-1)  # j < t
    return same & strictly_past


def prefix_matching_score(weights: Tensor, ids: Tensor, query_mask: Tensor | None = None) -> Tensor:
    """Mean attention on :func:`induction_targets`: weights (L, B, H, T, T), ids (B, T) -> (L, H).

    Per query, the attention summed over its target keys; averaged over the queries that have at least one
    target (others would only dilute the score) and, if given, ``query_mask`` (B, T) True.
    """
    _check_maps(weights)
    check_rank(weights, "weights", 5, "(L, B, H, T, T)")
    targets = induction_targets(ids)  # (B, T, T)
    if weights.shape[1] != ids.shape[0] or weights.shape[-1] != ids.shape[1]:
        raise ValueError(f"weights {tuple(weights.shape)} do not match ids {tuple(ids.shape)} (B, T)")
    on_target = (weights * targets[None, :, None]).sum(dim=-1)  # (L, B, H, T)
    queries = targets.any(dim=-1)  # (B, T) queries with something to find
    if query_mask is not None:
        queries = queries & query_mask
    if not queries.any():
        raise ValueError("no query has an earlier occurrence of its token: the score is undefined")
    return on_target.transpose(2, 3)[:, queries].mean(dim=1)  # (L, B, T, H) -> (L, N, H) -> (L, H)


def ablation_mask(num_layers: int, num_heads: int, *heads: tuple[int, int]) -> Tensor:
    """A (L, H) head mask of ones with zeros at the given (layer, head) pairs, for the GPT's ``head_mask``."""
    mask = torch.ones(num_layers, num_heads)
    for layer, head in heads:
        if not (0 <= layer < num_layers and 0 <= head < num_heads):
            raise ValueError(f"head (layer={layer}, head={head}) is outside ({num_layers}, {num_heads})")
        mask[layer, head] = 0.0
    return mask


@torch.no_grad()
def copy_accuracy(model: GPT, ids: Tensor, copy_target: Tensor, head_mask: Tensor | None = None) -> float:
    """Fraction of the positions in ``copy_target`` (B, T) whose next token the model predicts (argmax)."""
    check_rank(ids, "ids", 2, "(B, T)")
    if copy_target.shape != ids.shape:
        raise ValueError(f"copy_target {tuple(copy_target.shape)} must have the shape of ids {tuple(ids.shape)}")
    with eval_mode(model):
        predicted = model(ids[:, :-1], head_mask=head_mask).argmax(dim=-1)  # (B, T - 1): guess for ids[t + 1]
    correct = predicted == ids[:, 1:]
    return correct[copy_target[:, :-1]].float().mean().item()


def head_ablation_table(model: GPT, ids: Tensor, copy_target: Tensor) -> Tensor:
    """Copy accuracy with each single head ablated: (L, H); compare with :func:`copy_accuracy` of the whole
    model to see which heads the copying depends on."""
    layers, heads = model.num_layers, model.num_heads
    table = torch.empty(layers, heads)
    for layer in range(layers):
        for head in range(heads):
            mask = ablation_mask(layers, heads, (layer, head))
            table[layer, head] = copy_accuracy(model, ids, copy_target, head_mask=mask)
    return table


@torch.no_grad()
def stream_write_ratio(model: GPT, ids: Tensor, layer: int = 0) -> float:
    """Mean over positions of |attention output of ``layer``| / |residual stream entering that layer|, in eval mode.

    ids (B, T) -> a float. For layer 0 the stream is the token plus position embedding: a ratio far above 1 means
    that what layer 0 writes swamps which token sits where. Read with forward hooks on the GPT's
    ``blocks[layer]`` (its input) and ``blocks[layer].attn`` (the attention's output).
    """
    check_rank(ids, "ids", 2, "(B, T)")
    if not 0 <= layer < model.num_layers:
        raise ValueError(f"layer must lie in [0, {model.num_layers}), got layer={layer}")
    block = model.blocks[layer]
    seen = {}
    hooks = [block.register_forward_pre_hook(lambda module, args: seen.update(stream=args[0])),
             block.attn.register_forward_hook(lambda module, args, out: seen.update(written=out))]
    try:
        with eval_mode(model):
            model(ids)
    finally:
        for hook in hooks:
            hook.remove()
    ratio = seen["written"].norm(dim=-1) / seen["stream"].norm(dim=-1)  # (B, T)
    return ratio.mean().item()
