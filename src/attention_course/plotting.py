"""Attention heatmaps (one matrix, or a grid of heads, with token labels and an
optional mask overlay) and the course's figure style.

Readable figures: on a laptop (the book's text column is COLUMN_PX = 688 px
wide at 1280 px) every label of a figure is at least MIN_LABEL_PX = 12 px tall.
A label of s points in a figure w inches wide, drawn at FIGURE_DPI and shown in
the column, is s * FIGURE_DPI / 72 * min(1, COLUMN_PX / (w * FIGURE_DPI)) px:
with every text at least 11 pt (STYLE) a figure up to MAX_WIDTH_IN = 8.5 inches
wide meets the rule; the helpers below draw no wider than 7.

Importing this module applies STYLE (use_course_style), and in a notebook it
records, in each inline PNG, the size of the smallest text drawn (a PNG text
chunk, SMALLEST_TEXT_KEY): tests/test_browser.py reads it from every image of
the built book and multiplies by the scale the page shows it at.
"""

from __future__ import annotations

import base64
import io

import matplotlib as mpl
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.backends.backend_agg import RendererAgg
from matplotlib.figure import Figure

# the book's text column at a 1280 px window (pydata-sphinx-theme, measured in
# Chromium)
COLUMN_PX = 688
MIN_LABEL_PX = 12  # smallest label height a reader of the page gets, in CSS px
FIGURE_DPI = 100
MAX_WIDTH_IN = 8.5  # 11 pt * 100 / 72 * 688 / 850 = 12.4 px
#: rcParams of every course figure: labels, ticks, legends and titles at least
#: 11 pt.
STYLE = {
    "figure.dpi": FIGURE_DPI,
    "savefig.dpi": "figure",
    "figure.figsize": (6.4, 4.0),
    "font.size": 11,
    "axes.titlesize": 12,
    "axes.labelsize": 11,
    "xtick.labelsize": 11,
    "ytick.labelsize": 11,
    "legend.fontsize": 11,
    "legend.title_fontsize": 11,
    "figure.titlesize": 12,
    "figure.labelsize": 11,
}
ANNOTATION_PT = 11  # the numbers written in heatmap cells
# PNG tEXt chunk written by the notebook formatter
SMALLEST_TEXT_KEY = "Course smallest text (pt)"


def smallest_text_pt(fig: Figure) -> float | None:
    """The size, in points, of the smallest text the figure draws (titles,
    labels, tick labels, legends, annotations); None for a figure without text.
    Texts that are not drawn (hidden, empty, ticks outside the axes) do not
    count."""
    sizes = []

    class Recorder(RendererAgg):
        def draw_text(
            self, gc, x, y, s, prop, angle, ismath=False, mtext=None
        ):
            if s.strip():
                sizes.append(prop.get_size_in_points())

    width, height = fig.get_size_inches() * fig.dpi
    fig.draw(Recorder(int(width), int(height), fig.dpi))
    return min(sizes) if sizes else None


def label_px(
    text_pt: float,
    image_px: float,
    dpi: float = FIGURE_DPI,
    column_px: float = COLUMN_PX,
) -> float:
    """How tall a text of ``text_pt`` points is on the page, in CSS px, in an
    image ``image_px`` wide (at ``dpi``) shown in a column ``column_px`` wide
    (never enlarged)."""
    return text_pt * dpi / 72 * min(1.0, column_px / image_px)


def figure_label_px(fig: Figure) -> float | None:
    """label_px of the figure's smallest text, for the figure saved as the
    notebook does (bbox_inches="tight")."""
    smallest = smallest_text_pt(fig)
    if smallest is None:
        return None
    bbox = fig.get_tightbbox()
    # + the 0.1 in padding on each side
    return label_px(smallest, (bbox.width + 0.2) * fig.dpi, fig.dpi)


def _png_with_smallest_text(fig: Figure) -> str | None:
    """The inline backend's PNG (tight bounding box, base64), with the smallest
    text's size in a text chunk."""
    if not fig.axes and not fig.lines and not fig.images and not fig.texts:
        return None  # an empty figure shows nothing, as in matplotlib_inline
    smallest = smallest_text_pt(fig)
    buffer = io.BytesIO()
    fig.canvas.print_figure(
        buffer,
        format="png",
        bbox_inches="tight",
        metadata={
            SMALLEST_TEXT_KEY: "none" if smallest is None else f"{smallest:g}"
        },
    )
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def use_course_style() -> None:
    """Apply STYLE; in IPython, show figures as PNGs that record their smallest
    text (SMALLEST_TEXT_KEY)."""
    mpl.rcParams.update(STYLE)
    try:
        from IPython import get_ipython
    except (
        ImportError
    ):  # pragma: no cover - IPython is installed with the course
        return
    shell = get_ipython()
    if shell is None or not hasattr(shell, "display_formatter"):
        return
    if "inline" in mpl.get_backend():
        # The inline backend registers its own PNG formatter when first
        # imported: import it now, so ours stays.
        import matplotlib_inline.backend_inline  # noqa: F401
    shell.display_formatter.formatters["image/png"].for_type(
        Figure, _png_with_smallest_text
    )


use_course_style()


def _as_numpy(a):
    """Accept NumPy arrays, torch tensors and TF tensors without importing
    either framework."""
    if hasattr(a, "detach"):
        a = a.detach().cpu()
    return np.asarray(a, dtype=np.float64)


def _check_matrix(weights: np.ndarray, query_labels, key_labels) -> None:
    if weights.ndim != 2:
        raise ValueError(
            f"weights must be 2-D (Tq, Tk), got shape {weights.shape}"
        )
    t_q, t_k = weights.shape
    if query_labels is not None and len(query_labels) != t_q:
        raise ValueError(f"{len(query_labels)} query labels for Tq={t_q} rows")
    if key_labels is not None and len(key_labels) != t_k:
        raise ValueError(f"{len(key_labels)} key labels for Tk={t_k} columns")


def plot_attention(
    weights,
    query_labels=None,
    key_labels=None,
    mask=None,
    ax=None,
    title=None,
    annotate=None,
    colorbar=True,
    vmax=None,
):
    """Heatmap of one attention matrix.

    Args:
        weights: (Tq, Tk) attention weights (NumPy, torch or TF).
        query_labels: Tq labels for the rows (the tokens asking); key_labels:
            Tk labels for the columns.
        mask: optional boolean (Tq, Tk), True = may attend; masked cells are
            hatched in grey.
        ax: matplotlib Axes to draw on (a new figure if None).
        annotate: write each weight in its cell (default: when the matrix is at
            most 10 x 10).
        colorbar: draw a colorbar; vmax: top of the colour scale (default: the
            largest weight).

    Returns:
        The Axes.
    """
    weights = _as_numpy(weights)
    _check_matrix(weights, query_labels, key_labels)
    t_q, t_k = weights.shape
    if ax is None:
        # inches per key; at most 7 inches wide
        cell = min(0.55, (7.0 - 2.2) / t_k)
        _, ax = plt.subplots(figsize=(cell * t_k + 2.2, cell * t_q + 1.4))
    # NaN weights (a bug being shown) stay blank
    top = np.nanmax(weights) if np.isfinite(weights).any() else 1.0
    image = ax.imshow(
        weights, cmap="viridis", vmin=0.0, vmax=vmax or max(top, 1e-12)
    )
    if mask is not None:
        blocked = ~np.asarray(_as_numpy(mask), dtype=bool)
        if blocked.shape != weights.shape:
            raise ValueError(
                f"mask shape {blocked.shape} != weights shape {weights.shape}"
            )
        overlay = np.zeros((t_q, t_k, 4))
        overlay[blocked] = (0.85, 0.85, 0.85, 1.0)
        ax.imshow(overlay)
    if annotate is None:
        annotate = t_q <= 10 and t_k <= 10
    if annotate:
        for i in range(t_q):
            for j in range(t_k):
                if np.isfinite(weights[i, j]) and (
                    mask is None or not blocked[i, j]
                ):
                    colour = (
                        "black"
                        if weights[i, j] > 0.6 * image.get_clim()[1]
                        else "white"
                    )
                    ax.text(
                        j,
                        i,
                        f"{weights[i, j]:.2f}",
                        ha="center",
                        va="center",
                        fontsize=ANNOTATION_PT,
                        color=colour,
                    )
    ax.set_xticks(
        range(t_k),
        key_labels if key_labels is not None else range(t_k),
        rotation=45,
        ha="right",
    )
    ax.set_yticks(
        range(t_q), query_labels if query_labels is not None else range(t_q)
    )
    ax.set_xlabel("key (attended to)")
    ax.set_ylabel("query (attending)")
    if title:
        ax.set_title(title)
    if colorbar:
        ax.figure.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    return ax


def plot_heads(
    weights, query_labels=None, key_labels=None, mask=None, ncols=4, title=None
):
    """A grid of heatmaps, one per head, sharing one colour scale.

    Args:
        weights: (H, Tq, Tk) per-head attention weights of one sequence.
        mask: optional boolean (Tq, Tk), True = may attend, drawn on every
            head.
        ncols: heads per row, at most (fewer where the panels would not fit 7
            inches).

    Returns:
        The Figure.
    """
    weights = _as_numpy(weights)
    if weights.ndim != 3:
        raise ValueError(
            f"weights must be 3-D (H, Tq, Tk), got shape {weights.shape}"
        )
    num_heads = weights.shape[0]
    t_q, t_k = weights.shape[1:]
    # panels of at least 0.3 inch per key in a 7-inch row
    fits = max(1, int(7.0 // (0.3 * t_k + 1.2)))
    ncols = min(ncols, num_heads, fits)
    nrows = -(-num_heads // ncols)
    # inches per key; the grid at most 7 inches wide
    cell = min(0.45, (7.0 / ncols - 1.2) / t_k)
    fig, axes = plt.subplots(
        nrows,
        ncols,
        figsize=(ncols * (cell * t_k + 1.2), nrows * (cell * t_q + 1.2)),
        squeeze=False,
        constrained_layout=True,
    )
    vmax = max(weights.max(), 1e-12)
    for h, ax in enumerate(axes.flat):
        if h >= num_heads:
            ax.axis("off")
            continue
        plot_attention(
            weights[h],
            query_labels,
            key_labels,
            mask=mask,
            ax=ax,
            title=f"head {h}",
            annotate=False,
            colorbar=False,
            vmax=vmax,
        )
    fig.colorbar(axes.flat[0].images[0], ax=axes, shrink=0.8)
    if title:
        fig.suptitle(title)
    return fig
