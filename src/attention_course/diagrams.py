"""Schematic figures of the course, drawn with matplotlib: one function per
figure, each returning the Figure.

The book includes them as SVG files in ``book/figures/``, written by ``python
tools/make_diagrams.py`` (deterministic
output: the same SVG bytes on every run); ``tests/test_diagrams.py`` checks the
    committed files are up to date.

- :func:`qkv_data_flow` -- scaled dot-product attention: inputs, projections,
  scores, mask, softmax, output;
- :func:`multi_head_split_merge` -- the shapes of multi-head attention, (B, T,
  D) -> (B, H, T, Dh) -> (B, T, D);
- :func:`mask_conventions` -- one causal mask in the three conventions a reader
  meets (course/SDPA boolean, ``nn.MultiheadAttention`` boolean, additive
  float).

Readable on a laptop: each figure is WIDTH_IN wide with every text at least
TEXT_PT, so shown in the book's 688 px column a label is TEXT_PT * 96 / 72 *
min(1, 688 / (WIDTH_IN * 96)) >= 12 px tall (a browser shows an SVG at 96 px
per inch; attention_course.plotting's rule; tests/test_browser.py measures it
on the page).
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

# One colour per role, used in every figure: a reader learns them once.
COLOURS = {
    "input": "#d9d9d9",
    "query": "#9ecae1",
    "key": "#a1d99b",
    "value": "#fdae6b",
    "op": "#ffffff",
    "weights": "#bcbddc",
    "output": "#fc9272",
}
HEAD_COLOURS = [
    "#9ecae1",
    "#a1d99b",
    "#fdae6b",
    "#bcbddc",
    "#fc9272",
    "#c7e9c0",
]
# every figure's width: 691 CSS px (96 px per inch), shown at 688 px in the
# column
WIDTH_IN = 7.2
# the smallest text: 10.5 * 96 / 72 * 688 / 691 = 13.9 px in the column
TEXT_PT = 10.5
TITLE_PT = 12


def _box(
    ax: Axes,
    x: float,
    y: float,
    text: str,
    colour: str,
    width: float = 1.6,
    height: float = 0.7,
) -> None:
    """A rounded box centred on (x, y) with a (possibly multi-line) label."""
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
    ax.text(x, y, text, ha="center", va="center", fontsize=TEXT_PT)


def _arrow(
    ax: Axes,
    start: tuple[float, float],
    end: tuple[float, float],
    label: str = "",
) -> None:
    """An arrow from ``start`` to ``end``, with an optional label at its
    middle."""
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
    if label:
        mid_x, mid_y = (start[0] + end[0]) / 2, (start[1] + end[1]) / 2
        ax.text(
            mid_x + 0.08,
            mid_y,
            label,
            ha="left",
            va="center",
            fontsize=TEXT_PT,
            style="italic",
        )


def _canvas(
    width: float, height: float, x_max: float, y_max: float
) -> tuple[Figure, Axes]:
    """A figure with one axes in data units (0..x_max, 0..y_max), no ticks or
    frame."""
    fig, ax = plt.subplots(figsize=(width, height))
    ax.set(xlim=(0, x_max), ylim=(0, y_max), aspect="equal")
    ax.axis("off")
    return fig, ax


def qkv_data_flow() -> Figure:
    """Scaled dot-product attention as a data flow: x -> Q, K, V -> scores ->
    mask -> softmax -> weights @ V."""
    fig, ax = _canvas(WIDTH_IN, 4.3, 13.0, 7.6)
    _box(
        ax,
        1.35,
        6.5,
        "queries\nx_q  (Tq, D)",
        COLOURS["input"],
        width=2.4,
        height=0.9,
    )
    _box(
        ax,
        1.35,
        4.2,
        "keys, values\nx_kv  (Tk, D)",
        COLOURS["input"],
        width=2.4,
        height=0.9,
    )
    # Projections: three learned linear maps (chapter 2).
    _box(
        ax,
        4.6,
        6.5,
        "Q = x_q W_q\n(Tq, d_k)",
        COLOURS["query"],
        width=2.4,
        height=0.9,
    )
    _box(
        ax,
        4.6,
        4.2,
        "K = x_kv W_k\n(Tk, d_k)",
        COLOURS["key"],
        width=2.4,
        height=0.9,
    )
    _box(
        ax,
        4.6,
        1.4,
        "V = x_kv W_v\n(Tk, d_v)",
        COLOURS["value"],
        width=2.4,
        height=0.9,
    )
    _arrow(ax, (2.6, 6.5), (3.35, 6.5))
    _arrow(ax, (2.6, 4.2), (3.35, 4.2))
    _arrow(ax, (1.35, 3.7), (3.35, 1.55))
    # Scores, mask, softmax (chapters 1 and 4).
    _box(
        ax,
        7.9,
        6.3,
        "scores\nQ Kᵀ / √d_k\n(Tq, Tk)",
        COLOURS["op"],
        width=2.4,
        height=1.3,
    )
    _arrow(ax, (5.85, 6.5), (6.65, 6.5))
    _arrow(ax, (5.85, 4.3), (6.65, 5.8))
    _box(
        ax,
        11.3,
        6.3,
        "mask: hidden\nscores → −∞",
        COLOURS["op"],
        width=2.6,
        height=0.9,
    )
    _arrow(ax, (9.15, 6.3), (9.95, 6.3))
    _box(
        ax,
        11.3,
        4.6,
        "softmax over\nkeys (last axis)",
        COLOURS["op"],
        width=2.6,
        height=0.9,
    )
    _arrow(ax, (11.3, 5.8), (11.3, 5.1))
    _box(
        ax,
        11.3,
        2.8,
        "weights (Tq, Tk)\nrows sum to 1",
        COLOURS["weights"],
        width=2.6,
        height=0.9,
    )
    _arrow(ax, (11.3, 4.1), (11.3, 3.3))
    # Weighted average of the values.
    _box(
        ax,
        8.4,
        1.4,
        "output = weights @ V\n(Tq, d_v)",
        COLOURS["output"],
        width=3.4,
        height=0.9,
    )
    _arrow(ax, (11.3, 2.3), (10.15, 1.55))
    _arrow(ax, (5.85, 1.4), (6.65, 1.4))
    ax.set_title("Scaled dot-product attention: data flow", fontsize=TITLE_PT)
    fig.tight_layout()
    return fig


def _blocks(
    ax: Axes,
    x: float,
    y: float,
    widths: list[float],
    height: float,
    colours: list[str],
    labels: list[str],
) -> None:
    """A row of adjacent coloured rectangles (one per head) starting at (x,
    y)."""
    for width, colour, label in zip(widths, colours, labels, strict=True):
        ax.add_patch(
            plt.Rectangle(
                (x, y),
                width,
                height,
                facecolor=colour,
                edgecolor="black",
                linewidth=0.8,
            )
        )
        ax.text(
            x + width / 2,
            y + height / 2,
            label,
            ha="center",
            va="center",
            fontsize=TEXT_PT,
        )
        x += width


def multi_head_split_merge(num_heads: int = 4) -> Figure:
    """The shapes of multi-head attention: split (B, T, D) into H heads of
    width Dh = D / H, attend per head, merge.

    Each head's slice of the features has its own colour, so the figure shows
    which features go where.
    """
    if not isinstance(num_heads, int) or isinstance(num_heads, bool):
        raise TypeError(
            f"num_heads must be an int, got {type(num_heads).__name__}"
        )
    if not 1 <= num_heads <= len(HEAD_COLOURS):
        raise ValueError(
            f"num_heads must be between 1 and {len(HEAD_COLOURS)}, got "
            f"{num_heads}"
        )
    colours = HEAD_COLOURS[:num_heads]
    head_labels = [f"h{h}" for h in range(num_heads)]
    fig, ax = _canvas(WIDTH_IN, 5.2, 14.0, 10.1)
    # a (B, T, D) row is 4.4 units wide, cut into H slices
    head_width = 4.4 / num_heads
    # (B, T, D): one row of D features per position, the heads' slices side by
    # side.
    ax.text(0.2, 9.55, "x W_q:  (B, T, D)", fontsize=TEXT_PT, weight="bold")
    for t in range(3):
        _blocks(
            ax,
            0.2,
            8.6 - 0.6 * t,
            [head_width] * num_heads,
            0.55,
            colours,
            head_labels,
        )
        ax.text(4.75, 8.87 - 0.6 * t, f"t={t}", fontsize=TEXT_PT, va="center")
    _arrow(ax, (2.4, 7.3), (2.4, 6.4), "view (B, T, H, Dh),\ntranspose(1, 2)")
    # (B, H, T, Dh): each head holds every position, with its own Dh features.
    ax.text(
        0.2,
        5.75,
        "split_heads:  (B, H, T, Dh)",
        fontsize=TEXT_PT,
        weight="bold",
    )
    for h, colour in enumerate(colours):
        for t in range(3):
            _blocks(
                ax,
                0.2 + h * (head_width + 0.12),
                4.8 - 0.6 * t,
                [head_width - 0.09],
                0.55,
                [colour],
                [f"t={t}"],
            )
    _arrow(ax, (2.4, 3.5), (2.4, 2.4), "attention per head")
    _box(
        ax,
        2.6,
        1.35,
        "H heads in parallel:\nweights (B, H, Tq, Tk)\nout (B, H, Tq, Dh)",
        COLOURS["weights"],
        width=4.6,
        height=1.7,
    )
    # Merge: back to (B, T, D), then W_o mixes the heads.
    _arrow(ax, (5.0, 1.35), (8.0, 4.7))
    ax.text(
        7.0,
        2.6,
        "transpose(1, 2),\nreshape",
        ha="left",
        va="center",
        fontsize=TEXT_PT,
        style="italic",
    )
    ax.text(
        8.3, 5.75, "merge_heads:  (B, T, D)", fontsize=TEXT_PT, weight="bold"
    )
    for t in range(3):
        _blocks(
            ax,
            8.3,
            4.8 - 0.6 * t,
            [head_width] * num_heads,
            0.55,
            colours,
            head_labels,
        )
    _arrow(ax, (10.5, 3.5), (10.5, 2.4))
    _box(
        ax,
        10.9,
        1.35,
        "@ W_o: mixes the heads\n(B, T, D)",
        COLOURS["output"],
        width=4.6,
        height=1.2,
    )
    ax.set_title(
        f"Multi-head attention: split and merge (H = {num_heads}, Dh = D / H)",
        fontsize=TITLE_PT,
    )
    fig.tight_layout()
    return fig


def _mask_panel(
    ax: Axes,
    values: np.ndarray,
    title: str,
    cell_text: list[list[str]],
    blocked: np.ndarray,
) -> None:
    """A (T, T) mask drawn as a grid: grey = hidden from the query, white = may
    attend; each cell labelled."""
    t = values.shape[0]
    ax.imshow(np.where(blocked, 0.75, 1.0), cmap="gray", vmin=0.0, vmax=1.0)
    for i in range(t):
        for j in range(t):
            ax.text(
                j,
                i,
                cell_text[i][j],
                ha="center",
                va="center",
                fontsize=TEXT_PT,
            )
    ax.set_xticks(range(t), [str(j) for j in range(t)])
    ax.set_yticks(range(t), [str(i) for i in range(t)])
    ax.set_xlabel("key j", fontsize=TEXT_PT)
    ax.set_ylabel("query i", fontsize=TEXT_PT)
    ax.set_title(title, fontsize=TEXT_PT)
    ax.tick_params(length=0, labelsize=TEXT_PT)


def mask_conventions(size: int = 4) -> Figure:
    """One causal mask of ``size`` positions in three conventions; grey cells
    are hidden in all three."""
    if not isinstance(size, int) or isinstance(size, bool):
        raise TypeError(f"size must be an int, got {type(size).__name__}")
    if not 2 <= size <= 8:
        raise ValueError(f"size must be between 2 and 8, got {size}")
    # course / SDPA: True = may attend
    may_attend = np.tril(np.ones((size, size), dtype=bool))
    blocked = ~may_attend  # nn.MultiheadAttention: True = NOT allowed
    # float mask: added to the scores
    additive = np.where(may_attend, 0.0, -np.inf)
    fig, axes = plt.subplots(
        1, 3, figsize=(WIDTH_IN, 3.4), layout="constrained"
    )
    _mask_panel(
        axes[0],
        may_attend,
        "course & SDPA\nbool, True =\nmay attend",
        [["True" if a else "False" for a in row] for row in may_attend],
        blocked,
    )
    _mask_panel(
        axes[1],
        blocked,
        "nn.MultiheadAttention\nbool, True =\nNOT allowed",
        [["True" if b else "False" for b in row] for row in blocked],
        blocked,
    )
    _mask_panel(
        axes[2],
        additive,
        "float mask\n(SDPA, nn.MHA):\nadded to the scores",
        [["0" if a == 0 else "−inf" for a in row] for row in additive],
        blocked,
    )
    fig.suptitle(
        "One causal mask, three conventions (grey = hidden)", fontsize=TITLE_PT
    )
    return fig


#: file stem in book/figures/ -> the function that draws it (read by
#: tools/make_diagrams.py and the tests)
FIGURES = {
    "qkv_data_flow": qkv_data_flow,
    "multi_head_split_merge": multi_head_split_merge,
    "mask_conventions": mask_conventions,
}


def induction_circuit() -> Figure:
    """Chapter 12's circuit on "... A B ... A": a layer-1 previous-token head
    writes "the token before me was A" into position j (token B); the layer-2
    induction head at the later A matches that in j's KEY (K-composition),
    attends to j and its OV circuit copies B into the logits. Drawn directly in
    the chapter (no SVG file)."""
    fig, ax = _canvas(7.0, 4.4, 10.0, 6.3)

    def box(x, y, text, colour, width, height=0.8):
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
        ax.text(x, y, text, ha="center", va="center", fontsize=11)

    def arrow(start, end, colour="black", style="-|>"):
        ax.add_patch(
            FancyArrowPatch(
                start,
                end,
                arrowstyle=style,
                mutation_scale=14,
                linewidth=1.4,
                color=colour,
                shrinkA=0,
                shrinkB=0,
            )
        )

    columns = {"j - 1": 1.2, "j": 3.7, "t": 8.3}
    for (label, x), token in zip(
        columns.items(), ("A", "B", "A"), strict=True
    ):
        box(
            x,
            0.55,
            f"{token}   (position {label})",
            COLOURS["input"],
            2.1,
            0.7,
        )
        # its residual stream
        ax.plot(
            [x, x],
            [0.95, 5.5],
            color="grey",
            linewidth=1.0,
            linestyle=":",
            zorder=0,
        )
    ax.text(6.0, 0.55, "...", ha="center", va="center", fontsize=11)
    # Layer 1: the previous-token head at j reads position j - 1.
    box(
        3.7,
        2.0,
        'layer 1: previous-token\nhead writes "before\nme: A" into j',
        COLOURS["weights"],
        2.5,
        1.15,
    )
    arrow((1.2, 1.4), (2.4, 2.0))
    # Layer 2: the induction head at t matches its query against j's key, then
    # copies j's value.
    box(3.7, 3.85, 'key at j:\n"before me: A"', COLOURS["key"], 2.3, 0.85)
    box(8.3, 3.85, 'query at t:\n"I am A"', COLOURS["query"], 2.1, 0.85)
    arrow((3.7, 2.6), (3.7, 3.4))
    arrow((7.2, 3.85), (4.9, 3.85), colour="tab:green", style="<|-|>")
    ax.text(
        6.05,
        4.15,
        "match",
        ha="center",
        va="bottom",
        fontsize=11,
        color="tab:green",
    )
    box(3.7, 5.45, "value at j: B", COLOURS["value"], 2.3, 0.7)
    box(8.3, 5.45, "logit of B ↑", COLOURS["output"], 2.1, 0.7)
    arrow((4.9, 5.45), (7.2, 5.45))
    ax.text(6.05, 5.7, "OV copies", ha="center", va="bottom", fontsize=11)
    ax.text(
        0.05,
        4.65,
        "layer 2:\ninduction\nhead at t",
        ha="left",
        va="center",
        fontsize=11,
        style="italic",
    )
    ax.text(
        9.95,
        2.0,
        "K-composition:\nlayer 1 feeds\nlayer 2's KEYS",
        ha="right",
        va="center",
        fontsize=11,
        style="italic",
    )
    ax.set_title('The induction circuit on "... A B ... A" → B', fontsize=12)
    fig.tight_layout()
    return fig


def mla_cache(
    num_heads: int = 128,
    kv_lora_rank: int = 512,
    qk_rope_head_dim: int = 64,
    qk_nope_head_dim: int = 128,
    v_head_dim: int = 128,
) -> Figure:
    """Chapter 14's multi-head latent attention: what a token caches (the
    latent c and one rotated key k_rope, shared by every head), and the two
    ways to attend over it: expanded into per-head keys and values, or with
    W_uk absorbed into the query and W_uv applied after the weights. Sizes
    default to DeepSeek-V3's; the labels count the multiply-adds per (query,
    key) pair and head of each form. Drawn directly in the chapter (no SVG)."""
    for name, value in (
        ("num_heads", num_heads),
        ("kv_lora_rank", kv_lora_rank),
        ("qk_rope_head_dim", qk_rope_head_dim),
        ("qk_nope_head_dim", qk_nope_head_dim),
        ("v_head_dim", v_head_dim),
    ):
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(
                f"{name} must be an int, got {type(value).__name__}"
            )
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    c, r, n, v = kv_lora_rank, qk_rope_head_dim, qk_nope_head_dim, v_head_dim
    fig, ax = _canvas(7.0, 5.0, 10.0, 7.1)
    font = 11

    def box(x, y, text, colour, width, height):
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
        ax.text(x, y, text, ha="center", va="center", fontsize=font)

    def arrow(start, end):
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

    box(1.0, 6.2, "token\nx_t", COLOURS["input"], 1.3, 0.9)
    box(
        6.0,
        6.2,
        f"cached per token and layer:\nc ({c}) + k_rope ({r}) = {c + r} "
        "numbers,\nshared by all "
        f"{num_heads} heads",
        COLOURS["weights"],
        6.0,
        1.2,
    )
    arrow((1.7, 6.2), (2.9, 6.2))
    ax.text(
        2.3,
        6.45,
        "W_dkv",
        ha="center",
        va="bottom",
        fontsize=font,
        style="italic",
    )
    for x, title in (
        (2.45, "expanded (prefill)"),
        (7.55, "absorbed (decode)"),
    ):
        arrow((x + (1.0 if x < 5 else -1.0), 5.55), (x, 4.85))
        ax.text(
            x,
            4.55,
            title,
            ha="center",
            va="center",
            fontsize=font,
            weight="bold",
        )
    box(
        2.45,
        3.2,
        f"per head h:\nk = [W_uk c, k_rope] ({n + r})\nv = W_uv c ({v})",
        COLOURS["key"],
        4.7,
        1.5,
    )
    box(
        7.55,
        3.2,
        f"per head h:\nq' = [W_ukᵀ q_nope, q_rope]\n({c + r}) · [c, k_rope]",
        COLOURS["query"],
        4.7,
        1.5,
    )
    box(
        2.45,
        1.0,
        f"scores {n + r} + output {v}\n= {n + r + v} mult-adds per\npair "
        "and head",
        COLOURS["op"],
        4.7,
        1.4,
    )
    box(
        7.55,
        1.0,
        f"scores {c + r} + output {c}\n= {2 * c + r} mult-adds per\npair "
        "and head (W_uv after)",
        COLOURS["op"],
        4.7,
        1.4,
    )
    arrow((2.45, 2.4), (2.45, 1.75))
    arrow((7.55, 2.4), (7.55, 1.75))
    ax.set_title(
        "Multi-head latent attention: one latent cached, two ways to read it",
        fontsize=12,
    )
    fig.tight_layout()
    return fig
