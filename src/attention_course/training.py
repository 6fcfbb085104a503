"""A minimal, seeded training loop for the small models of chapter 12.

``train(model, batch_fn, loss_fn, steps)`` runs AdamW for a fixed number of
steps and returns a :class:`History` of the per-step losses (and any metric
evaluated every ``eval_every`` steps). With the same seed, model and data the
run is the same on one machine; across CPUs the last bits may differ, which is
why the chapter reports verdicts against thresholds rather than raw losses:
``loss_below`` prints one such verdict line when the run ends
(:func:`summary_line`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from .validation import check_int


@dataclass
class History:
    """What a run produced: ``losses[i]`` is the training loss of step i;
    ``metrics[name]`` holds ``(step, value)`` pairs measured every
    ``eval_every`` steps."""

    losses: list[float] = field(default_factory=list)
    metrics: dict[str, list[tuple[int, float]]] = field(default_factory=dict)

    def metric(self, name: str) -> tuple[list[int], list[float]]:
        """Steps and values of one metric, ready to plot."""
        pairs = self.metrics[name]
        return [s for s, _ in pairs], [v for _, v in pairs]


def tagging_loss(
    logits: Tensor, targets: Tensor, weights: Tensor | None = None
) -> Tensor:
    """Mean cross-entropy of logits (B, T, V) against targets (B, T);
    ``weights`` (B, T) bool or float selects the positions that count (None:
    all)."""
    # (B T,)
    per_token = nn.functional.cross_entropy(
        logits.flatten(0, 1), targets.flatten(), reduction="none"
    )
    if weights is None:
        return per_token.mean()
    weights = weights.flatten().to(per_token.dtype)
    return (per_token * weights).sum() / weights.sum().clamp(min=1.0)


def train(
    model: nn.Module,
    batch_fn: Callable[[torch.Generator], tuple[Tensor, ...]],
    loss_fn: Callable[[nn.Module, tuple[Tensor, ...]], Tensor],
    steps: int,
    *,
    lr: float = 3e-3,
    weight_decay: float = 0.01,
    seed: int = 0,
    eval_fn: Callable[[nn.Module], dict[str, float]] | None = None,
    eval_every: int = 50,
    warmup_steps: int = 0,
    progress: bool = False,
    loss_below: float | None = None,
) -> History:
    """Train ``model`` in place for ``steps`` AdamW steps; return its
    :class:`History`.

    Args:
        batch_fn: generator -> a batch (a tuple of tensors); the generator is
            seeded with ``seed``.
        loss_fn: (model, batch) -> scalar loss.
        eval_fn: model -> {name: value}, run in eval mode without gradients at
            step 0, every ``eval_every`` steps and after the last step.
        warmup_steps: the learning rate rises linearly from lr / warmup_steps
            at step 0 to lr at step warmup_steps - 1, then stays (0: lr from
            the first step).
        progress: show a tqdm progress bar (rendered as a widget in Jupyter; it
            writes to stderr, and stores elapsed times: for interactive use,
            not for a stored notebook).
        loss_below: if given, print one line when done: the steps run and
            whether the mean loss of the last ``min(10, steps)`` steps is below
            this threshold (a verdict, the same on every machine when the
            threshold has margin, where the loss itself differs in the last
            bits).
    """
    check_int(steps, "steps")
    check_int(eval_every, "eval_every")
    check_int(warmup_steps, "warmup_steps", minimum=0)
    if not lr > 0:
        raise ValueError(f"lr must be > 0, got lr={lr}")
    if loss_below is not None and not loss_below > 0:
        raise ValueError(
            f"loss_below must be > 0 or None, got loss_below={loss_below}"
        )
    torch.manual_seed(seed)  # dropout, if any
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=lr, weight_decay=weight_decay
    )
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / max(warmup_steps, 1))
    )
    history = History()
    bar = _progress_bar(steps) if progress else None
    for step in range(steps):
        if eval_fn is not None and step % eval_every == 0:
            _evaluate(model, eval_fn, step, history)
        model.train()
        loss = loss_fn(model, batch_fn(generator))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
        history.losses.append(loss.item())
        if bar is not None:
            bar.update(1)
            bar.set_postfix(loss=f"{loss.item():.3f}", refresh=False)
    if bar is not None:
        bar.close()
    if eval_fn is not None:
        _evaluate(model, eval_fn, steps, history)
    model.eval()
    if loss_below is not None:
        print(summary_line(history, loss_below))
    return history


def summary_line(history: History, loss_below: float) -> str:
    """One line for the page: steps run and whether the mean loss of the last
    (up to) 10 steps is below a threshold; a verdict, not the loss itself, so
    that the line is the same on every machine."""
    last = history.losses[-10:]
    final = sum(last) / len(last)
    return (
        f"trained {len(history.losses)} steps; mean loss of the last "
        f"{len(last)} < {loss_below:g}: "
        f"{final < loss_below}"
    )


def _evaluate(
    model: nn.Module, eval_fn: Callable, step: int, history: History
) -> None:
    model.eval()
    with torch.no_grad():
        for name, value in eval_fn(model).items():
            history.metrics.setdefault(name, []).append((step, float(value)))


def _progress_bar(steps: int):
    """A tqdm bar: Jupyter's widget where ipywidgets is installed, else the
    text bar (which Jupyter shows too)."""
    try:
        # tqdm.auto needs it for the widget, and warns without it
        import ipywidgets  # noqa: F401
        from tqdm.auto import tqdm
    except ImportError:
        from tqdm import tqdm

    return tqdm(total=steps, desc="training", unit="step")
