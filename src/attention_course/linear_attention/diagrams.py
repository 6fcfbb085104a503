"""Chapter 17's figures, drawn with matplotlib: the recurrence, and the blocks
of the chunked form."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

from ..diagrams import COLOURS

FONT = 11


def _box(
    ax,
    x: float,
    y: float,
    text: str,
    colour: str,
    width: float = 1.5,
    height: float = 0.8,
) -> None:
    ax.add_patch(
        FancyBboxPatch(
            (x - width / 2, y - height / 2),
            width,
            height,
            boxstyle="round,pad=0.05",
            facecolor=colour,
            edgecolor="black",
            linewidth=1.0,
        )
    )
    ax.text(x, y, text, ha="center", va="center", fontsize=FONT)


def _arrow(ax, start, end) -> None:
    ax.add_patch(
        FancyArrowPatch(
            start,
            end,
            arrowstyle="-|>",
            mutation_scale=12,
            linewidth=1.0,
            color="black",
        )
    )


def recurrence(steps: int = 4) -> Figure:
    """Linear attention as an RNN: a fixed-size state S_t updated by each
    token, read by each query."""
    fig, ax = plt.subplots(figsize=(10, 4.2))
    ax.set(xlim=(0, 2.4 * steps + 2.0), ylim=(-0.7, 5.4), aspect="equal")
    ax.axis("off")
    _box(ax, 1.0, 2.7, "S₀ = 0", COLOURS["weights"], width=1.3)
    for t in range(1, steps + 1):
        x = 1.0 + 2.4 * t
        _box(ax, x, 2.7, f"S{'₀₁₂₃₄₅₆₇₈₉'[t]}", COLOURS["weights"], width=1.3)
        _arrow(ax, (x - 1.75, 2.7), (x - 0.7, 2.7))
        _box(
            ax,
            x - 1.2,
            0.8,
            f"k, v\nof token {t}",
            COLOURS["key"],
            width=1.9,
            height=0.9,
        )
        _arrow(ax, (x - 1.2, 1.3), (x - 1.2, 2.6))
        _box(
            ax,
            x,
            4.6,
            f"o{'₀₁₂₃₄₅₆₇₈₉'[t]} = q S{'₀₁₂₃₄₅₆₇₈₉'[t]}",
            COLOURS["output"],
            width=1.9,
        )
        _arrow(ax, (x, 3.15), (x, 4.15))
    ax.text(
        1.0 + 1.2 * steps,
        -0.45,
        "S ← S + k vᵀ     one (Dk, Dv) state per head, whatever T",
        ha="center",
        fontsize=FONT,
        style="italic",
    )
    ax.set_title("Linear attention as a recurrence", fontsize=FONT + 1)
    fig.tight_layout()
    return fig


def chunk_blocks(length: int = 16, chunk: int = 4) -> Figure:
    """The (T, T) matrix the chunked form computes: diagonal blocks in matrix
    products, the rest through the state."""
    i, j = np.arange(length)[:, None], np.arange(length)[None, :]
    same_chunk = i // chunk == j // chunk
    # 0 future, 1 earlier chunks, 2 this chunk
    kind = np.where(j > i, 0, np.where(same_chunk, 2, 1))
    fig, ax = plt.subplots(figsize=(6.2, 5.6))
    ax.imshow(
        kind,
        cmap=ListedColormap(["white", COLOURS["weights"], COLOURS["query"]]),
        vmin=0,
        vmax=2,
    )
    for edge in range(0, length + 1, chunk):
        ax.axhline(edge - 0.5, color="black", linewidth=1.2)
        ax.axvline(edge - 0.5, color="black", linewidth=1.2)
    ax.set_xlabel("key position s", fontsize=FONT)
    ax.set_ylabel("query position t", fontsize=FONT)
    ax.set_title(
        f"Chunked form, T = {length}, chunk = {chunk}", fontsize=FONT + 1
    )
    handles = [
        plt.Rectangle(
            (0, 0), 1, 1, facecolor=COLOURS["query"], edgecolor="black"
        ),
        plt.Rectangle(
            (0, 0), 1, 1, facecolor=COLOURS["weights"], edgecolor="black"
        ),
    ]
    ax.legend(
        handles,
        [
            "within the chunk: (L, L) matrix products",
            "earlier chunks: read from the state",
        ],
        loc="upper right",
        fontsize=FONT - 1,
        framealpha=1.0,
    )
    ax.tick_params(labelsize=FONT)
    fig.tight_layout()
    return fig
