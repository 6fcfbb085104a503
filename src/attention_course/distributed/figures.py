"""The figures of chapter 13, drawn from the library's own layouts and
schedules (one function per figure).

* :func:`tensor_parallel_sharding` -- which slices of W_q, W_k, W_v and W_o
  each rank keeps, and where the two communication operators f and g sit;
* :func:`ring_schedule` -- step x rank: whose key/value block each rank holds
  at each step of the ring (:func:`~.ring_attention.kv_source`, the formula the
  ring code runs);
* :func:`causal_layouts` -- the causal tiles of the contiguous and zig-zag
  layouts (which rank owns which chunk, which tiles are computed, how many per
  rank), from :func:`~.ring_attention.sequence_layout`.

Text is at least 11 pt and figures at most 7 inches wide, so that a page shows
them at the size of its text.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, Rectangle

from ..validation import check_world_size
from .ring_attention import kv_source, sequence_layout

FONT = 11  # points: the smallest text in these figures
RANK_COLOURS = [
    "#9ecae1",
    "#fdae6b",
    "#a1d99b",
    "#bcbddc",
    "#fc9272",
    "#c7e9c0",
    "#fdd0a2",
    "#dadaeb",
]


def _check_ranks(world_size: int) -> None:
    check_world_size(world_size)
    if world_size > len(RANK_COLOURS):
        raise ValueError(
            f"world_size must be at most {len(RANK_COLOURS)} for a readable "
            f"figure, got {world_size}"
        )


def _cell(ax, x, y, w, h, colour, text="", size=FONT, **kw) -> None:
    ax.add_patch(
        Rectangle(
            (x, y), w, h, facecolor=colour, edgecolor="black", linewidth=0.8
        )
    )
    if text:
        ax.text(
            x + w / 2,
            y + h / 2,
            text,
            ha="center",
            va="center",
            fontsize=size,
            **kw,
        )


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


def tensor_parallel_sharding(world_size: int = 2) -> Figure:
    """Each rank's shard: columns of W_q, W_k, W_v (its heads), rows of W_o; f
    before, g (all-reduce) after."""
    _check_ranks(world_size)
    fig, ax = plt.subplots(figsize=(7.0, 1.2 + 1.3 * world_size))
    height = 1.3 * world_size + 0.9
    ax.set(xlim=(0, 14), ylim=(0, height))
    ax.axis("off")
    mid = height / 2
    _cell(ax, 0.1, mid - 0.5, 1.3, 1.0, "#d9d9d9", "x\n(B,T,D)")
    _cell(ax, 11.3, mid - 0.5, 2.6, 1.0, "#fc9272", "sum + b_o\n(B,T,D)")
    for x, name, what in (
        (1.9, "f", "copy x\n(no message)"),
        (10.75, "g", "all-reduce\n(sum)"),
    ):
        ax.axvline(x, color="grey", ls=":", lw=1)
        ax.text(
            x,
            height - 0.3,
            name,
            ha="center",
            fontsize=FONT + 2,
            weight="bold",
        )
        ax.text(x, 0.05, what, ha="center", va="bottom", fontsize=FONT)
    for r in range(world_size):
        y = height - 1.3 * (r + 1) - 0.1
        colour = RANK_COLOURS[r]
        _arrow(ax, (1.45, mid), (2.35, y + 0.5))
        _cell(
            ax, 2.4, y, 2.9, 1.0, colour, f"rank {r}: columns\nof Wq, Wk, Wv"
        )
        _arrow(ax, (5.3, y + 0.5), (5.7, y + 0.5))
        _cell(ax, 5.7, y, 1.8, 1.0, colour, "H/P heads\n(B,T,D/P)")
        _arrow(ax, (7.5, y + 0.5), (7.9, y + 0.5))
        _cell(ax, 7.9, y, 2.3, 1.0, colour, "rows of W_o\n(B,T,D)")
        _arrow(ax, (10.2, y + 0.5), (11.25, mid))
    ax.set_title(
        f"Tensor parallelism of the heads, P = {world_size}", fontsize=FONT + 1
    )
    fig.tight_layout()
    return fig


def ring_schedule(world_size: int = 4) -> Figure:
    """A (step, rank) grid: the key/value block each rank attends to at each
    step; arrows: the pass to rank + 1."""
    _check_ranks(world_size)
    fig, ax = plt.subplots(
        figsize=(min(7.0, 1.6 + 1.3 * world_size), 1.0 + 0.75 * world_size)
    )
    for step in range(world_size):
        for rank in range(world_size):
            src = kv_source(rank, step, world_size)
            _cell(
                ax,
                rank,
                world_size - 1 - step,
                0.9,
                0.6,
                RANK_COLOURS[src],
                f"KV {src}",
            )
            # this block goes to rank + 1 for the next step
            if step < world_size - 1 and rank < world_size - 1:
                _arrow(
                    ax,
                    (rank + 0.75, world_size - 1 - step + 0.1),
                    (rank + 1.15, world_size - 2 - step + 0.5),
                )
    ax.set(xlim=(-0.1, world_size), ylim=(-0.2, world_size - 0.3))
    ax.set_xticks(
        [r + 0.45 for r in range(world_size)],
        [f"rank {r}" for r in range(world_size)],
        fontsize=FONT,
    )
    ax.set_yticks(
        [world_size - 1 - s + 0.3 for s in range(world_size)],
        [f"step {s}" for s in range(world_size)],
        fontsize=FONT,
    )
    ax.tick_params(length=0)
    for side in ("top", "right", "bottom", "left"):
        ax.spines[side].set_visible(False)
    ax.set_title(
        "Ring attention: whose keys and values each rank holds",
        fontsize=FONT + 1,
    )
    fig.tight_layout()
    return fig


def _tile_panel(ax, seq_len: int, world_size: int, layout: str) -> list[int]:
    """The causal tiles of one layout, drawn to scale (one unit per position);
    returns each rank's computed score entries."""
    chunks = sequence_layout(seq_len, world_size, layout)
    tiles = sorted(
        (start, stop, r)
        for r, rank in enumerate(chunks)
        for start, stop in rank
    )
    work = [0] * world_size
    for q0, q1, rank in tiles:
        for k0, k1, _ in tiles:
            # some key at or before some query: the tile is computed whole
            computed = k0 < q1
            work[rank] += (q1 - q0) * (k1 - k0) if computed else 0
            ax.add_patch(
                Rectangle(
                    (k0, seq_len - q1),
                    k1 - k0,
                    q1 - q0,
                    linewidth=0.8,
                    edgecolor="black",
                    facecolor=RANK_COLOURS[rank] if computed else "white",
                )
            )
        ax.text(
            -0.2,
            seq_len - (q0 + q1) / 2,
            f"r{rank}",
            ha="right",
            va="center",
            fontsize=FONT,
        )
    # the causal diagonal
    ax.plot([0, seq_len], [seq_len, 0], color="black", lw=1, ls=":")
    ax.set(
        xlim=(-1.2, seq_len + 0.1), ylim=(-0.1, seq_len + 0.1), aspect="equal"
    )
    ax.axis("off")
    ax.set_title(f"{layout}\nwork per rank: {work}", fontsize=FONT)
    return work


def causal_layouts(world_size: int = 4) -> Figure:
    """Causal tiles of T = 2P positions (rows: queries, labelled with the rank
    that holds them; columns: keys), coloured by the rank that computes them,
    white where every key lies after every query (skipped); work in score
    entries (units of (T / 2P)^2)."""
    _check_ranks(world_size)
    fig, axes = plt.subplots(
        1, 2, figsize=(7.0, 3.9), gridspec_kw={"width_ratios": [1, 1]}
    )
    seq_len = 2 * world_size
    _tile_panel(axes[0], seq_len, world_size, "contiguous")
    _tile_panel(axes[1], seq_len, world_size, "zigzag")
    fig.suptitle(
        f"Causal ring attention, P = {world_size}: which tiles each rank "
        "computes",
        fontsize=FONT + 1,
    )
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    return fig
