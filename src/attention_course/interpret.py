"""Looking inside a trained GPT (chapter 12): attention maps, head scores, head
ablation.

Everything goes through the :class:`~attention_course.gpt.GPT`'s public
interface: ``return_weights``, ``head_mask``, and its blocks and their
attention modules (for hooks); models run in eval mode (:func:`eval_mode`).

- :func:`attention_maps` captures every layer's attention weights with the
  GPT's ``return_weights``.
- :func:`previous_token_score`: how much a head attends from position t to t -
  1.
- :func:`prefix_matching_score`: how much a head attends from a token to the
  token that *followed* an earlier occurrence of it, the signature of an
  induction head (Olsson et al., 2022).
- :func:`copy_accuracy` and :func:`ablation_mask`: next-token accuracy on the
  copied part of a sequence, with chosen heads switched off through the GPT's
  ``head_mask``.
- :func:`path_ablated_forward`: switch earlier heads off for one input of a
  later layer only, its keys, queries or values (K-, Q- or V-composition,
  Elhage et al., 2021): which path the circuit runs through.
- :func:`ov_circuit` and :func:`copying_score`: what a head writes into the
  logits when it attends to a token, and how often that is the token itself (a
  head that copies).
- :func:`stream_write_ratio`: how large a layer's attention output is next to
  the residual stream it is added to.
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
    """Run the body with ``model`` in eval mode (no dropout), then restore the
    mode it had."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)


@torch.no_grad()
def attention_maps(model: GPT, ids: Tensor) -> Tensor:
    """Attention weights of every layer and head: ids (B, T) -> (L, B, H, T,
    T), in eval mode."""
    with eval_mode(model):
        _, weights = model(ids, return_weights=True)  # L tensors (B, H, T, T)
    return torch.stack(weights)


def _check_maps(weights: Tensor) -> None:
    if weights.dim() < 2 or weights.size(-1) != weights.size(-2):
        raise ValueError(
            "weights must be (..., T, T) self-attention maps, got shape "
            f"{tuple(weights.shape)}"
        )


def previous_token_score(weights: Tensor) -> Tensor:
    """Mean attention from each position t >= 1 to t - 1: weights (L, B, H, T,
    T) -> (L, H).

    1.0 for a head that always looks exactly one token back. Any leading (L, B,
    H) layout works as long as the batch is dimension -4: the mean runs over
    the batch and the query positions.
    """
    _check_maps(weights)
    check_rank(weights, "weights", 5, "(L, B, H, T, T)")
    # (L, B, H, T - 1): w[t, t - 1]
    to_previous = weights.diagonal(offset=-1, dim1=-2, dim2=-1)
    return to_previous.mean(dim=(1, 3))


def induction_targets(ids: Tensor) -> Tensor:
    """Where an induction head should look: ids (B, T) -> bool (B, T, T).

    ``targets[b, t, j]`` is True when key j (0 < j < t) follows an earlier
    occurrence of the query's token:
    ids[b, j - 1] == ids[b, t]. Key j holds the token that came next last time,
    the one to copy.
    """
    check_rank(ids, "ids", 2, "(B, T)")
    t = ids.size(1)
    # (B, T): ids[j - 1], -1 at j = 0
    previous = torch.cat([torch.full_like(ids[:, :1], -1), ids[:, :-1]], dim=1)
    # (B, Tq, Tk): ids[t] == ids[j - 1]
    same = ids[:, :, None] == previous[:, None, :]
    # j < t
    strictly_past = torch.ones(t, t, dtype=torch.bool, device=ids.device).tril(
        diagonal=-1
    )
    return same & strictly_past


def prefix_matching_score(
    weights: Tensor, ids: Tensor, query_mask: Tensor | None = None
) -> Tensor:
    """Mean attention on :func:`induction_targets`: weights (L, B, H, T, T),
    ids (B, T) -> (L, H).

    Per query, the attention summed over its target keys; averaged over the
    queries that have at least one target (others would only dilute the score)
    and, if given, ``query_mask`` (B, T) True.
    """
    _check_maps(weights)
    check_rank(weights, "weights", 5, "(L, B, H, T, T)")
    targets = induction_targets(ids)  # (B, T, T)
    if weights.shape[1] != ids.shape[0] or weights.shape[-1] != ids.shape[1]:
        raise ValueError(
            f"weights {tuple(weights.shape)} do not match ids "
            f"{tuple(ids.shape)} (B, T)"
        )
    on_target = (weights * targets[None, :, None]).sum(dim=-1)  # (L, B, H, T)
    queries = targets.any(dim=-1)  # (B, T) queries with something to find
    if query_mask is not None:
        queries = queries & query_mask
    if not queries.any():
        raise ValueError(
            "no query has an earlier occurrence of its token: the score is "
            "undefined"
        )
    # (L, B, T, H) -> (L, N, H) -> (L, H)
    return on_target.transpose(2, 3)[:, queries].mean(dim=1)


def ablation_mask(
    num_layers: int, num_heads: int, *heads: tuple[int, int]
) -> Tensor:
    """A (L, H) head mask of ones with zeros at the given (layer, head) pairs,
    for the GPT's ``head_mask``."""
    mask = torch.ones(num_layers, num_heads)
    for layer, head in heads:
        if not (0 <= layer < num_layers and 0 <= head < num_heads):
            raise ValueError(
                f"head (layer={layer}, head={head}) is outside "
                f"({num_layers}, {num_heads})"
            )
        mask[layer, head] = 0.0
    return mask


@torch.no_grad()
def copy_accuracy(
    model: GPT,
    ids: Tensor,
    copy_target: Tensor,
    head_mask: Tensor | None = None,
) -> float:
    """Fraction of the positions in ``copy_target`` (B, T) whose next token the
    model predicts (argmax)."""
    check_rank(ids, "ids", 2, "(B, T)")
    if copy_target.shape != ids.shape:
        raise ValueError(
            f"copy_target {tuple(copy_target.shape)} must have the shape of "
            f"ids {tuple(ids.shape)}"
        )
    with eval_mode(model):
        # (B, T - 1, V): logits[:, t] guesses ids[:, t + 1]
        logits = model(ids[:, :-1], head_mask=head_mask)
    return next_token_accuracy(logits, ids, copy_target)


def next_token_accuracy(
    logits: Tensor, ids: Tensor, copy_target: Tensor
) -> float:
    """Fraction of the positions in ``copy_target`` (B, T) whose next token is
    the argmax of ``logits``.

    logits (B, T - 1, V) or (B, T, V) (the last position, which predicts
    nothing here, is dropped): logits[:, t] is the guess for ids[:, t + 1].
    """
    check_rank(logits, "logits", 3, "(B, T, V)")
    if copy_target.shape != ids.shape or logits.shape[:2] not in (
        ids.shape,
        (ids.size(0), ids.size(1) - 1),
    ):
        raise ValueError(
            f"logits {tuple(logits.shape)} and copy_target "
            f"{tuple(copy_target.shape)} must match "
            f"ids {tuple(ids.shape)} (B, T)"
        )
    predicted = logits[:, : ids.size(1) - 1].argmax(dim=-1)  # (B, T - 1)
    correct = predicted == ids[:, 1:]
    return correct[copy_target[:, :-1]].float().mean().item()


def head_ablation_table(
    model: GPT, ids: Tensor, copy_target: Tensor
) -> Tensor:
    """Copy accuracy with each single head ablated: (L, H); compare with
    :func:`copy_accuracy` of the whole model to see which heads the copying
    depends on."""
    layers, heads = model.num_layers, model.num_heads
    table = torch.empty(layers, heads)
    for layer in range(layers):
        for head in range(heads):
            mask = ablation_mask(layers, heads, (layer, head))
            table[layer, head] = copy_accuracy(
                model, ids, copy_target, head_mask=mask
            )
    return table


PATHS = ("q", "k", "v")


@torch.no_grad()
def path_ablated_forward(
    model: GPT,
    ids: Tensor,
    heads: list[tuple[int, int]],
    path: str = "k",
    layer: int = 1,
) -> tuple[Tensor, Tensor]:
    """Logits (B, T, V) and attention maps (L, B, H, T, T) with ``heads``
    (earlier layers' (layer, head) pairs) switched off for ONE input of
    ``layer`` only: its keys (``path="k"``), queries ("q") or values ("v").

    The projection of that path reads the residual stream that the model would
    have with those heads off (the stream entering ``layer`` under
    :func:`ablation_mask`); the other two projections, and the heads' direct
    path to the logits, read the whole stream. In a 2-layer model with
    ``path="k"``, this removes what layer 1 writes into the keys that layer 2
    matches and nothing else (K-composition). In eval mode.
    """
    check_rank(ids, "ids", 2, "(B, T)")
    if path not in PATHS:
        raise ValueError(f"path must be one of {PATHS}, got path={path!r}")
    if not 0 < layer < model.num_layers:
        raise ValueError(
            f"layer must lie in [1, {model.num_layers}) (it reads earlier "
            f"heads), got layer={layer}"
        )
    if not heads or any(earlier >= layer for earlier, _ in heads):
        raise ValueError(
            "heads must be a non-empty list of heads of layers before "
            f"layer={layer}, got {heads}"
        )
    mask = ablation_mask(model.num_layers, model.num_heads, *heads)
    block = model.blocks[layer]
    with eval_mode(model):
        # (B, T, D): the input this path now reads
        ablated = block.norm1(_stream_into(model, ids, layer, mask))
        projection = getattr(block.attn, f"w_{path}")
        hook = projection.register_forward_pre_hook(
            lambda module, args: (ablated,)
        )
        try:
            logits, weights = model(ids, return_weights=True)
        finally:
            hook.remove()
    return logits, torch.stack(weights)


def _stream_into(
    model: GPT, ids: Tensor, layer: int, head_mask: Tensor
) -> Tensor:
    """The residual stream (B, T, D) entering ``blocks[layer]`` when the model
    runs with ``head_mask``."""
    seen = {}
    hook = model.blocks[layer].register_forward_pre_hook(
        lambda module, args: seen.update(stream=args[0])
    )
    try:
        model(ids, head_mask=head_mask)
    finally:
        hook.remove()
    return seen["stream"]


@torch.no_grad()
def ov_circuit(model: GPT, layer: int, head: int) -> Tensor:
    """The logits (V, V) that one head adds when it attends to a key holding
    token a alone: row a, column b.

    Token a's embedding goes through the layer's input LayerNorm, the head's
    slice of the value and output projections (no biases: they do not depend on
    the token), the linear part of the final LayerNorm (centring, its scale;
    the division by the norm is a positive factor per row, which no argmax
    sees) and the output head: the OV circuit of Elhage et al. (2021), with the
    token embedding standing for the whole residual stream.
    """
    if not (0 <= layer < model.num_layers and 0 <= head < model.num_heads):
        raise ValueError(
            f"head (layer={layer}, head={head}) is outside "
            f"({model.num_layers}, {model.num_heads})"
        )
    attn = model.blocks[layer].attn
    if attn.num_kv_heads != attn.num_heads:
        raise ValueError(
            "ov_circuit needs one value head per head (num_kv_heads=None)"
        )
    rows = slice(head * attn.head_dim, (head + 1) * attn.head_dim)
    # (V, D): each token alone
    x = model.blocks[layer].norm1(model.tok_emb.weight)
    # (V, Dh): the head's value of each token
    values = x @ attn.w_v.weight[rows].T
    # (V, D): what the head adds to the stream
    written = values @ attn.w_o.weight[:, rows].T
    # final LayerNorm, linear part
    centred = (
        written - written.mean(dim=-1, keepdim=True)
    ) * model.norm.weight
    return centred @ model.head.weight.T  # (V, V)


def copying_score(ov: Tensor) -> float:
    """Fraction of the rows of a (V, V) circuit whose largest entry is on the
    diagonal: attending to token a raises a's own logit above every other
    token's. About 1 / V for a random matrix, 1 for a head that copies."""
    check_rank(ov, "ov", 2, "(V, V)")
    if ov.size(0) != ov.size(1):
        raise ValueError(
            f"ov must be square (V, V), got shape {tuple(ov.shape)}"
        )
    own = torch.arange(ov.size(0), device=ov.device)
    return (ov.argmax(dim=-1) == own).float().mean().item()


@torch.no_grad()
def stream_write_ratio(model: GPT, ids: Tensor, layer: int = 0) -> float:
    """Mean over positions of |attention output of ``layer``| / |residual
    stream entering that layer|, in eval mode.

    ids (B, T) -> a float. For layer 0 the stream is the token plus position
    embedding: a ratio far above 1 means that what layer 0 writes swamps which
    token sits where. Read with forward hooks on the GPT's ``blocks[layer]``
    (its input) and ``blocks[layer].attn`` (the attention's output).
    """
    check_rank(ids, "ids", 2, "(B, T)")
    if not 0 <= layer < model.num_layers:
        raise ValueError(
            f"layer must lie in [0, {model.num_layers}), got layer={layer}"
        )
    block = model.blocks[layer]
    seen = {}
    hooks = [
        block.register_forward_pre_hook(
            lambda module, args: seen.update(stream=args[0])
        ),
        block.attn.register_forward_hook(
            lambda module, args, out: seen.update(written=out)
        ),
    ]
    try:
        with eval_mode(model):
            model(ids)
    finally:
        for hook in hooks:
            hook.remove()
    # (B, T)
    ratio = seen["written"].norm(dim=-1) / seen["stream"].norm(dim=-1)
    return ratio.mean().item()
