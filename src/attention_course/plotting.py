"""Attention heatmaps: one matrix, or a grid of heads, with token labels and an optional mask overlay."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np


def _as_numpy(a):
    """Accept NumPy arrays, torch tensors and TF tensors without importing either framework."""
    if hasattr(a, "detach"):
        a = a.detach().cpu()
    return np.asarray(a, dtype=np.float64)


def _check_matrix(weights: np.ndarray, query_labels, key_labels) -> None:
    if weights.ndim != 2:
        raise ValueError(f"weights must be 2-D (Tq, Tk), got shape {weights.shape}")
    t_q, t_k = weights.shape
    if query_labels is not None and len(query_labels) != t_q:
        raise ValueError(f"{len(query_labels)} query labels for Tq={t_q} rows")
    if key_labels is not None and len(key_labels) != t_k:
        raise ValueError(f"{len(key_labels)} key labels for Tk={t_k} columns")


def plot_attention(weights, query_labels=None, key_labels=None, mask=None, ax=None, title=None,
                   annotate=None, colorbar=True, vmax=None):
    """Heatmap of one attention matrix.

    Args:
        weights: (Tq, Tk) attention weights (NumPy, torch or TF).
        query_labels: Tq labels for the rows (the tokens asking); key_labels: Tk labels for the columns.
        mask: optional boolean (Tq, Tk), True = may attend; masked cells are hatched in grey.
        ax: matplotlib Axes to draw on (a new figure if None).
        annotate: write each weight in its cell (default: when the matrix is at most 10 x 10).
        colorbar: draw a colorbar; vmax: top of the colour scale (default: the largest weight).

    Returns:
        The Axes.
    """
    weights = _as_numpy(weights)
    _check_matrix(weights, query_labels, key_labels)
    t_q, t_k = weights.shape
    if ax is None:
        _, ax = plt.subplots(figsize=(0.55 * t_k + 2.2, 0.5 * t_q + 1.4))
    top = np.nanmax(weights) if np.isfinite(weights).any() else 1.0  # NaN weights (a bug being shown) stay blank
    image = ax.imshow(weights, cmap="viridis", vmin=0.0, vmax=vmax or max(top, 1e-12))
    if mask is not None:
        blocked = ~np.asarray(_as_numpy(mask), dtype=bool)
        if blocked.shape != weights.shape:
            raise ValueError(f"mask shape {blocked.shape} != weights shape {weights.shape}")
        overlay = np.zeros((t_q, t_k, 4))
        overlay[blocked] = (0.85, 0.85, 0.85, 1.0)
        ax.imshow(overlay)
    if annotate is None:
        annotate = t_q <= 10 and t_k <= 10
    if annotate:
        for i in range(t_q):
            for j in range(t_k):
                if np.isfinite(weights[i, j]) and (mask is None or not blocked[i, j]):
                    colour = "black" if weights[i, j] > 0.6 * image.get_clim()[1] else "white"
                    ax.text(j, i, f"{weights[i, j]:.2f}", ha="center", va="center", fontsize=8, color=colour)
    ax.set_xticks(range(t_k), key_labels if key_labels is not None else range(t_k), rotation=45, ha="right")
    ax.set_yticks(range(t_q), query_labels if query_labels is not None else range(t_q))
    ax.set_xlabel("key (attended to)")
    ax.set_ylabel("query (attending)")
    if title:
        ax.set_title(title)
    if colorbar:
        ax.figure.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    return ax


def plot_heads(weights, query_labels=None, key_labels=None, mask=None, ncols=4, title=None):
    """A grid of heatmaps, one per head, sharing one colour scale.

    Args:
        weights: (H, Tq, Tk) per-head attention weights of one sequence.
        mask: optional boolean (Tq, Tk), True = may attend, drawn on every head.
        ncols: heads per row.

    Returns:
        The Figure.
    """
    weights = _as_numpy(weights)
    if weights.ndim != 3:
        raise ValueError(f"weights must be 3-D (H, Tq, Tk), got shape {weights.shape}")
    num_heads = weights.shape[0]
    ncols = min(ncols, num_heads)
    nrows = -(-num_heads // ncols)
    t_q, t_k = weights.shape[1:]
    fig, axes = plt.subplots(nrows, ncols, figsize=(ncols * (0.45 * t_k + 1.2), nrows * (0.45 * t_q + 1.2)),
                             squeeze=False, constrained_layout=True)
    vmax = max(weights.max(), 1e-12)
    for h, ax in enumerate(axes.flat):
        if h >= num_heads:
            ax.axis("off")
            continue
        plot_attention(weights[h], query_labels, key_labels, mask=mask, ax=ax, title=f"head {h}",
                       annotate=False, colorbar=False, vmax=vmax)
    fig.colorbar(axes.flat[0].images[0], ax=axes, shrink=0.8)
    if title:
        fig.suptitle(title)
    return fig
