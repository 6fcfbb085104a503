"""The transformer block: attention and a feed-forward network, each inside a
residual connection with a norm.

Two orders of the same pieces (``branch`` is attention or the feed-forward
network, ``drop`` is dropout):

* post-LN (Vaswani et al., 2017): ``x = norm(x + drop(branch(x)))``, the norm
  sits ON the residual stream;
* pre-LN (GPT-2 and most models since): ``x = x + drop(branch(norm(x)))``, the
  norm only feeds the branch, and the stream itself is never normalised (a
  model then needs one final norm).

:class:`EncoderBlock` and :class:`DecoderBlock` compute exactly what
``nn.TransformerEncoderLayer`` and ``nn.TransformerDecoderLayer`` compute
(``from_torch`` loads their weights), on the course's
:class:`~attention_course.multi_head.MultiHeadAttention`. Inputs are
batch-first (B, T, D); masks are boolean, True = may attend (torch's
``key_padding_mask`` and boolean ``attn_mask`` mean True = ignore: pass
``~mask``). :class:`RMSNorm` and :class:`SwiGLU` are the modern variants of the
norm and of the feed-forward network.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .multi_head import MultiHeadAttention
from .tasks import reversal_batch
from .training import tagging_loss, train
from .validation import check_dropout, check_heads, check_int

ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu}


def check_activation(activation: str) -> None:
    """Raise unless activation names one of :data:`ACTIVATIONS`."""
    if not isinstance(activation, str):
        raise TypeError(
            f"activation must be a string, got {type(activation).__name__}"
        )
    if activation not in ACTIVATIONS:
        raise ValueError(
            f"activation must be one of {sorted(ACTIVATIONS)}, got "
            f"activation={activation!r}"
        )


def check_block_sizes(
    d_model: int, num_heads: int, d_ff: int, dropout: float, activation: str
) -> None:
    """The argument checks shared by every block."""
    check_int(d_model, "d_model")
    check_int(num_heads, "num_heads")
    check_int(d_ff, "d_ff")
    check_heads(d_model, num_heads)
    check_dropout(dropout)
    check_activation(activation)


class FeedForward(nn.Module):
    """Position-wise feed-forward network: the same two-layer MLP applied to
    every position on its own.

    (B, T, D) -> (B, T, D) through a hidden width ``d_ff`` (usually 4 D):
    ``linear2(drop(act(linear1(x))))``, with dropout on the hidden activations
    as in ``nn.TransformerEncoderLayer``.
    """

    def __init__(
        self,
        d_model: int,
        d_ff: int,
        activation: str = "relu",
        dropout: float = 0.0,
        bias: bool = True,
    ):
        super().__init__()
        check_int(d_model, "d_model")
        check_int(d_ff, "d_ff")
        check_activation(activation)
        check_dropout(dropout)
        self.activation = activation
        self.linear1 = nn.Linear(d_model, d_ff, bias=bias)
        self.linear2 = nn.Linear(d_ff, d_model, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        """x (B, T, D) -> (B, T, D)."""
        hidden = ACTIVATIONS[self.activation](self.linear1(x))  # (B, T, d_ff)
        return self.linear2(self.dropout(hidden))


class SwiGLU(nn.Module):
    """Gated feed-forward network (Shazeer, 2020; used by LLaMA):
    ``down(silu(gate(x)) * up(x))``.

    One projection (``gate``) decides, per hidden feature, how much of the
    other (``up``) passes. Three matrices instead of two, so models shrink
    ``d_ff`` (e.g. 8/3 D instead of 4 D) to keep the parameter count.
    """

    def __init__(self, d_model: int, d_ff: int, bias: bool = False):
        super().__init__()
        check_int(d_model, "d_model")
        check_int(d_ff, "d_ff")
        self.gate = nn.Linear(d_model, d_ff, bias=bias)
        self.up = nn.Linear(d_model, d_ff, bias=bias)
        self.down = nn.Linear(d_ff, d_model, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        """x (B, T, D) -> (B, T, D)."""
        # (B, T, d_ff) gated, then back to D
        return self.down(F.silu(self.gate(x)) * self.up(x))


class RMSNorm(nn.Module):
    """Root-mean-square norm (Zhang and Sennrich, 2019): LayerNorm without
    subtracting the mean, without a bias.

    ``x / sqrt(mean(x^2) + eps) * weight`` over the last axis; cheaper than
    LayerNorm and as good in practice.
    """

    def __init__(self, d_model: int, eps: float = 1e-6):
        super().__init__()
        check_int(d_model, "d_model")
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))

    def forward(self, x: Tensor) -> Tensor:
        """x (..., D) -> (..., D), each vector rescaled to root-mean-square 1,
        then by ``weight``."""
        return (
            x
            * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps)
            * self.weight
        )


def residual(
    x: Tensor, branch, norm: nn.Module, dropout: nn.Module, norm_first: bool
) -> Tensor:
    """One residual sub-layer: pre-LN ``x + drop(branch(norm(x)))`` or post-LN
    ``norm(x + drop(branch(x)))``.

    ``branch`` maps (B, T, D) -> (B, T, D): attention with its masks bound, or
    the feed-forward network.
    """
    if norm_first:
        # the stream itself is never normalised
        return x + dropout(branch(norm(x)))
    # the norm sits on the stream, after every sub-layer
    return norm(x + dropout(branch(x)))


class EncoderBlock(nn.Module):
    """Self-attention and a feed-forward network, each in a residual sub-layer
    (:func:`residual`).

    The same function as ``nn.TransformerEncoderLayer(d_model, num_heads, d_ff,
    dropout, activation, batch_first=True, norm_first=norm_first)``; dropout
    acts on the attention weights, the hidden layer of the feed-forward network
    and each branch's output, in ``.train()`` mode only.
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        d_ff: int,
        dropout: float = 0.0,
        activation: str = "relu",
        norm_first: bool = False,
        layer_norm_eps: float = 1e-5,
        bias: bool = True,
    ):
        super().__init__()
        check_block_sizes(d_model, num_heads, d_ff, dropout, activation)
        self.norm_first = norm_first
        self.attn = MultiHeadAttention(
            d_model, num_heads, dropout=dropout, bias=bias
        )
        self.ff = FeedForward(d_model, d_ff, activation, dropout, bias)
        self.norm1 = nn.LayerNorm(d_model, eps=layer_norm_eps, bias=bias)
        self.norm2 = nn.LayerNorm(d_model, eps=layer_norm_eps, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(
        self, x: Tensor, mask: Tensor | None = None, is_causal: bool = False
    ) -> Tensor:
        """x (B, T, D) -> (B, T, D). ``mask`` broadcasts to (B, H, T, T), True
        = may attend, e.g. a :func:`~attention_course.masks.padding_mask` (B,
        1, 1, T); ``is_causal`` also hides future positions."""
        x = residual(
            x,
            lambda h: self.attn(h, mask=mask, is_causal=is_causal),
            self.norm1,
            self.dropout,
            self.norm_first,
        )
        return residual(x, self.ff, self.norm2, self.dropout, self.norm_first)

    @classmethod
    def from_torch(cls, layer: nn.TransformerEncoderLayer) -> EncoderBlock:
        """An EncoderBlock with the sizes, options and (copied) weights of an
        ``nn.TransformerEncoderLayer``.

        Ours is batch-first whatever ``layer.batch_first`` is. Any other layer
        (a decoder layer's cross-attention has no place here) raises TypeError.
        """
        _require_layer(
            layer,
            nn.TransformerEncoderLayer,
            "EncoderBlock",
            "DecoderBlock.from_torch",
        )
        block = cls(**_torch_layer_options(layer)).to(layer.linear1.weight)
        _copy_torch_layer(
            block,
            layer,
            {"attn": "self_attn", "norm1": "norm1", "norm2": "norm2"},
        )
        return block


class DecoderBlock(nn.Module):
    """Causal self-attention, cross-attention to an encoder's output (the
    memory), then a feed-forward network.

    The same function as ``nn.TransformerDecoderLayer(..., batch_first=True)``.
    Queries of the cross-attention come from the decoder, its keys and values
    from the memory. Every call says whether the self-attention is
    causal (``is_causal`` has no default): a decoder that predicts each target
    token from the ones before it needs ``is_causal=True``, while torch's layer
    is causal only when given a ``tgt_mask``; with a default, the same call of
    a copied layer and of ours could compute different functions.
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        d_ff: int,
        dropout: float = 0.0,
        activation: str = "relu",
        norm_first: bool = False,
        layer_norm_eps: float = 1e-5,
        bias: bool = True,
    ):
        super().__init__()
        check_block_sizes(d_model, num_heads, d_ff, dropout, activation)
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(
            d_model, num_heads, dropout=dropout, bias=bias
        )
        self.cross_attn = MultiHeadAttention(
            d_model, num_heads, dropout=dropout, bias=bias
        )
        self.ff = FeedForward(d_model, d_ff, activation, dropout, bias)
        self.norm1 = nn.LayerNorm(d_model, eps=layer_norm_eps, bias=bias)
        self.norm2 = nn.LayerNorm(d_model, eps=layer_norm_eps, bias=bias)
        self.norm3 = nn.LayerNorm(d_model, eps=layer_norm_eps, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(
        self,
        x: Tensor,
        memory: Tensor,
        mask: Tensor | None = None,
        memory_mask: Tensor | None = None,
        *,
        is_causal: bool,
    ) -> Tensor:
        """x (B, Tq, D) decoder stream, memory (B, Tk, D) encoder output -> (B,
        Tq, D).

        ``is_causal`` (required): True hides future target positions from the
        self-attention, as torch's layer with ``tgt_mask=causal,
        tgt_is_causal=True``; False is torch's default call. ``mask``
        (broadcasts to (B, H, Tq, Tq)) further restricts the self-attention,
        ``memory_mask`` (to (B, H, Tq, Tk), e.g. the encoder's padding mask)
        the cross-attention; True = may attend.
        """
        if not isinstance(is_causal, bool):
            raise TypeError(
                f"is_causal must be a bool, got {type(is_causal).__name__}"
            )
        x = residual(
            x,
            lambda h: self.self_attn(h, mask=mask, is_causal=is_causal),
            self.norm1,
            self.dropout,
            self.norm_first,
        )
        # queries from the decoder stream, keys and values from the memory
        # (never normalised here)
        x = residual(
            x,
            lambda h: self.cross_attn(h, memory, mask=memory_mask),
            self.norm2,
            self.dropout,
            self.norm_first,
        )
        return residual(x, self.ff, self.norm3, self.dropout, self.norm_first)

    @classmethod
    def from_torch(cls, layer: nn.TransformerDecoderLayer) -> DecoderBlock:
        """A DecoderBlock with the sizes, options and (copied) weights of an
        ``nn.TransformerDecoderLayer``.

        Call it with ``is_causal`` as torch's layer is called:
        ``is_causal=False`` for ``layer(x, memory)``, ``is_causal=True`` for
        ``layer(x, memory, tgt_mask=causal, tgt_is_causal=True)``.
        """
        _require_layer(
            layer,
            nn.TransformerDecoderLayer,
            "DecoderBlock",
            "EncoderBlock.from_torch",
        )
        block = cls(**_torch_layer_options(layer)).to(layer.linear1.weight)
        names = {
            "self_attn": "self_attn",
            "cross_attn": "multihead_attn",
            "norm1": "norm1",
            "norm2": "norm2",
            "norm3": "norm3",
        }
        _copy_torch_layer(block, layer, names)
        return block


def _require_layer(layer, expected: type, ours: str, other: str) -> None:
    """Raise TypeError unless ``layer`` is an ``expected`` torch layer (exactly
    what ``ours`` mirrors)."""
    if not isinstance(layer, expected):
        raise TypeError(
            f"{ours}.from_torch copies an nn.{expected.__name__}, got "
            f"{type(layer).__name__}"
            + (
                f"; use {other} for it"
                if isinstance(
                    layer,
                    (nn.TransformerEncoderLayer, nn.TransformerDecoderLayer),
                )
                else ""
            )
        )


def _torch_layer_options(
    layer: nn.TransformerEncoderLayer | nn.TransformerDecoderLayer,
) -> dict:
    """The constructor arguments of our block that match a torch transformer
    layer."""
    activation = _torch_activation_name(layer.activation)
    return {
        "d_model": layer.self_attn.embed_dim,
        "num_heads": layer.self_attn.num_heads,
        "d_ff": layer.linear1.out_features,
        "dropout": layer.dropout.p,
        "activation": activation,
        "norm_first": layer.norm_first,
        "layer_norm_eps": layer.norm1.eps,
        "bias": layer.linear1.bias is not None,
    }


def _torch_activation_name(activation) -> str:
    """ "relu" or "gelu" for the activations torch's layers accept as those (a
    function or a module)."""
    if activation is F.relu or isinstance(activation, nn.ReLU):
        return "relu"
    if (
        activation is F.gelu
        or isinstance(activation, nn.GELU)
        and activation.approximate == "none"
    ):
        return "gelu"
    raise ValueError(
        "only relu and (exact) gelu activations are supported, got "
        f"{activation!r}"
    )


@torch.no_grad()
def _copy_torch_layer(
    block: nn.Module, layer: nn.Module, names: dict[str, str]
) -> None:
    """Copy a torch layer's weights into ``block``; ``names`` maps our
    attention and norm names to torch's."""
    for ours, theirs in names.items():
        source = getattr(layer, theirs)
        if isinstance(source, nn.MultiheadAttention):
            setattr(block, ours, MultiHeadAttention.from_torch(source))
        else:
            getattr(block, ours).load_state_dict(source.state_dict())
    block.ff.linear1.load_state_dict(layer.linear1.state_dict())
    block.ff.linear2.load_state_dict(layer.linear2.state_dict())


# -----------------------------------------------------------------------------
# Why the order matters: gradients and the residual stream through a deep stack
# at initialisation
# -----------------------------------------------------------------------------


class BranchOnlyBlock(EncoderBlock):
    """An encoder block WITHOUT its residual connections, for chapter 11's
    training run: each sub-layer computes ``norm(drop(branch(x)))``, post-LN's
    norm after a branch that nothing is added to."""

    def forward(
        self, x: Tensor, mask: Tensor | None = None, is_causal: bool = False
    ) -> Tensor:
        """x (B, T, D) -> (B, T, D)."""
        # no x + ...
        x = self.norm1(
            self.dropout(self.attn(x, mask=mask, is_causal=is_causal))
        )
        return self.norm2(self.dropout(self.ff(x)))


def block_stack(
    depth: int,
    d_model: int,
    num_heads: int,
    d_ff: int,
    norm_first: bool,
    seed: int = 0,
    residual: bool = True,
) -> nn.Sequential:
    """``depth`` freshly initialised encoder blocks (no dropout); pre-LN stacks
    end with the final LayerNorm that pre-LN models need (their stream is never
    normalised inside the blocks). ``residual=False``: post-LN blocks without
    their residual connections (:class:`BranchOnlyBlock`).

    Every weight matrix is drawn Xavier-uniform, as ``nn.Transformer`` and the
    original paper initialise them.
    """
    check_int(depth, "depth")
    if not residual and norm_first:
        raise ValueError(
            "residual=False builds post-LN blocks without residuals: pass "
            "norm_first=False"
        )
    kind = EncoderBlock if residual else BranchOnlyBlock
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        blocks = [
            kind(d_model, num_heads, d_ff, norm_first=norm_first)
            for _ in range(depth)
        ]
        final = [nn.LayerNorm(d_model)] if norm_first else []
        stack = nn.Sequential(*blocks, *final)
        for p in stack.parameters():
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)
    return stack


def residual_stream_norms(stack: nn.Sequential, x: Tensor) -> list[float]:
    """The mean norm of the residual stream's vectors, (B, T, D) -> one number,
    after each block of ``stack``."""
    norms = []
    with torch.no_grad():
        for block in stack:
            if not isinstance(block, EncoderBlock):
                break  # the final norm is not part of the stream
            x = block(x)
            norms.append(x.norm(dim=-1).mean().item())
    return norms


def layer_gradient_norms(
    stack: nn.Sequential,
    x: Tensor,
    target: Tensor,
    parameter: str | None = None,
) -> list[float]:
    """The gradient norm of each block's parameters for a mean-squared-error
    loss of the stack's output.

    x (B, T, D) input, target (B, T, D); one number per :class:`EncoderBlock`,
    input side first. ``parameter`` (e.g. ``"ff.linear2.weight"``, the matrix
    Xiong et al. follow) restricts each number to that parameter.
    """
    stack.zero_grad()
    F.mse_loss(stack(x), target).backward()
    return _gradient_norms(stack, parameter)


def _gradient_norms(
    stack: nn.Sequential, parameter: str | None
) -> list[float]:
    """The norm of each block's gradients after a backward pass, of
    ``parameter`` only if given."""
    norms = []
    for block in stack:
        if isinstance(block, EncoderBlock):
            params = (
                [block.get_parameter(parameter)]
                if parameter
                else list(block.parameters())
            )
            norms.append(
                sum(p.grad.pow(2).sum() for p in params).sqrt().item()
            )
    return norms


def depth_statistics(
    norm_first: bool,
    depth: int = 12,
    d_model: int = 64,
    num_heads: int = 4,
    num_seeds: int = 4,
    batch: int = 2,
    seq_len: int = 16,
) -> dict[str, list[float]]:
    """Per-block measurements at initialisation, averaged over ``num_seeds``
    stacks (each with its own weights, input and target), input side first:
    ``"gradient"`` (all the block's parameters), ``"ffn_gradient"`` (the
    feed-forward network's second matrix only) and ``"stream"`` (the residual
    stream's size after the block)."""
    check_int(num_seeds, "num_seeds")
    names = ("gradient", "ffn_gradient", "stream")
    totals = {name: torch.zeros(depth, dtype=torch.float64) for name in names}
    for seed in range(num_seeds):
        stack = block_stack(
            depth, d_model, num_heads, 4 * d_model, norm_first, seed=seed
        )
        generator = torch.Generator().manual_seed(seed)
        # (B, T, D) each
        x, target = torch.randn(
            2, batch, seq_len, d_model, generator=generator
        )
        totals["gradient"] += torch.tensor(
            layer_gradient_norms(stack, x, target), dtype=torch.float64
        )
        # from the same backward pass
        ffn = _gradient_norms(stack, "ff.linear2.weight")
        totals["ffn_gradient"] += torch.tensor(ffn, dtype=torch.float64)
        totals["stream"] += torch.tensor(
            residual_stream_norms(stack, x), dtype=torch.float64
        )
    return {
        name: (total / num_seeds).tolist() for name, total in totals.items()
    }


# -----------------------------------------------------------------------------
# Why the order matters in training: a deep stack on a toy task, at a high
# learning rate
# -----------------------------------------------------------------------------


class StackTagger(nn.Module):
    """Tokens (B, T) -> scores (B, T, V): token and learned position
    embeddings, a :func:`block_stack` of ``depth`` encoder blocks (post-LN, or
    pre-LN with its final norm, or with ``residual=False`` post-LN blocks
    without residual connections; Xavier-initialised, no mask: every position
    sees the whole sequence), a linear head. Small enough to train on a CPU in
    seconds."""

    def __init__(
        self,
        vocab_size: int,
        length: int,
        depth: int,
        d_model: int,
        num_heads: int,
        norm_first: bool,
        seed: int = 0,
        residual: bool = True,
    ):
        super().__init__()
        check_int(vocab_size, "vocab_size")
        check_int(length, "length")
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.tok_emb = nn.Embedding(vocab_size, d_model)
            self.pos_emb = nn.Parameter(torch.randn(length, d_model))
            self.head = nn.Linear(d_model, vocab_size)
        self.blocks = block_stack(
            depth,
            d_model,
            num_heads,
            4 * d_model,
            norm_first,
            seed=seed,
            residual=residual,
        )

    def forward(self, ids: Tensor) -> Tensor:
        """ids (B, T) -> logits (B, T, V)."""
        x = self.tok_emb(ids) + self.pos_emb[: ids.size(1)]  # (B, T, D)
        return self.head(self.blocks(x))


def train_on_reversal(
    norm_first: bool,
    warmup_steps: int,
    depth: int = 6,
    d_model: int = 32,
    num_heads: int = 4,
    length: int = 8,
    steps: int = 150,
    lr: float = 1e-2,
    batch_size: int = 32,
    seed: int = 0,
    residual: bool = True,
) -> list[float]:
    """Train a :class:`StackTagger` to reverse ``length`` digits
    (:func:`~attention_course.tasks.reversal_batch`) with AdamW at ``lr``, its
    learning rate warmed up linearly over ``warmup_steps``; return the loss of
    every step (chance: ln 10 = 2.30). ``residual=False``: post-LN blocks
    without their residual connections."""
    model = StackTagger(
        10,
        length,
        depth,
        d_model,
        num_heads,
        norm_first,
        seed=seed,
        residual=residual,
    )
    history = train(
        model,
        lambda g: reversal_batch(batch_size, length, g),
        lambda m, batch: tagging_loss(m(batch[0]), batch[1]),
        steps,
        lr=lr,
        warmup_steps=warmup_steps,
        seed=seed,
    )
    return history.losses
