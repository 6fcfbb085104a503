"""The heatmap helpers draw what they are given: values, labels, mask overlay, one panel per head."""

import base64
import io

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
import pytest
import torch

from attention_course import plotting
from attention_course.numpy_ref import causal_mask, softmax
from attention_course.plotting import plot_attention, plot_heads


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def random_weights(*shape, seed=0):
    return softmax(np.random.default_rng(seed).normal(size=shape))


def test_plot_attention_draws_weights_labels_and_colorbar():
    w = random_weights(3, 4)
    ax = plot_attention(w, ["a", "b", "c"], ["w", "x", "y", "z"], title="t")
    np.testing.assert_array_equal(ax.images[0].get_array(), w)
    assert [t.get_text() for t in ax.get_xticklabels()] == ["w", "x", "y", "z"]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["a", "b", "c"]
    assert ax.get_title() == "t"
    assert len(ax.figure.axes) == 2  # heatmap + colorbar
    assert len(ax.texts) == 12  # every cell annotated for a small matrix


def test_plot_attention_accepts_torch_tensors_with_grad():
    w = torch.softmax(torch.randn(2, 2, requires_grad=True), dim=-1)
    ax = plot_attention(w, colorbar=False)
    np.testing.assert_allclose(ax.images[0].get_array(), w.detach().numpy())


def test_mask_overlay_greys_exactly_the_masked_cells_and_skips_their_labels():
    mask = causal_mask(4)
    ax = plot_attention(random_weights(4, 4), mask=mask)
    overlay = ax.images[1].get_array()
    np.testing.assert_array_equal(overlay[..., 3] > 0, ~mask)
    assert len(ax.texts) == mask.sum()


def test_nan_weights_keep_a_sensible_colour_scale_and_are_not_annotated():
    w = np.array([[0.25, 0.75], [np.nan, np.nan]])
    ax = plot_attention(w)
    assert ax.images[0].get_clim() == (0.0, 0.75)
    assert [t.get_text() for t in ax.texts] == ["0.25", "0.75"]


def test_large_matrix_is_not_annotated_by_default():
    ax = plot_attention(random_weights(12, 12))
    assert len(ax.texts) == 0


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"weights": np.ones((2, 2, 2))}, r"weights must be 2-D \(Tq, Tk\), got shape \(2, 2, 2\)"),
        ({"weights": np.ones((2, 3)), "query_labels": ["a"]}, r"1 query labels for Tq=2 rows"),
        ({"weights": np.ones((2, 3)), "key_labels": ["a"]}, r"1 key labels for Tk=3 columns"),
        ({"weights": np.ones((2, 3)), "mask": np.ones((3, 3), bool)}, r"mask shape \(3, 3\) != weights shape \(2, 3\)"),
    ],
)
def test_plot_attention_rejects_bad_input_clearly(kwargs, message):
    with pytest.raises(ValueError, match=message):
        plot_attention(**kwargs)


def test_plot_heads_one_panel_per_head_on_a_shared_scale():
    w = random_weights(6, 3, 3)
    fig = plot_heads(w, list("abc"), list("xyz"), mask=causal_mask(3), ncols=4, title="heads")
    heatmaps = [ax for ax in fig.axes if ax.images and ax.get_title().startswith("head")]
    assert [ax.get_title() for ax in heatmaps] == [f"head {h}" for h in range(6)]
    for h, ax in enumerate(heatmaps):
        np.testing.assert_array_equal(ax.images[0].get_array(), w[h])
        assert ax.images[0].get_clim() == (0.0, w.max())
    hidden = [ax for ax in fig.axes if not ax.axison]
    assert not hidden  # 3 panels fit a 7-inch row: a 2 x 3 grid for 6 heads
    assert fig._suptitle.get_text() == "heads"


def test_plot_heads_rejects_a_single_matrix():
    with pytest.raises(ValueError, match=r"weights must be 3-D \(H, Tq, Tk\)"):
        plot_heads(np.ones((3, 3)))


@pytest.mark.parametrize("draw", [
    lambda: plot_attention(random_weights(3, 4), ["big & alive", "has engine", "none of these"], list("wxyz")).figure,
    lambda: plot_attention(random_weights(6, 6), mask=causal_mask(6), title="causal").figure,
    lambda: plot_attention(random_weights(32, 32)).figure,
    lambda: plot_heads(random_weights(2, 6, 6), list("abcdef"), list("abcdef"), title="two heads"),
    lambda: plot_heads(random_weights(8, 12, 12), title="eight heads"),
])
def test_helpers_draw_labels_readable_in_the_books_column(draw):
    """The helpers' figures meet the course's rule: the smallest text, shown in the 688 px column, >= 12 px."""
    fig = draw()
    assert fig.get_size_inches()[0] <= 7.0 + 1e-9
    assert plotting.figure_label_px(fig) >= plotting.MIN_LABEL_PX


def test_the_rule_fails_a_wide_figure_with_small_labels():
    """What chapter 4's plots were: 8 pt annotations in a 12-inch figure show under 8 px."""
    fig, ax = plt.subplots(figsize=(12, 3.4))
    ax.plot([0, 1], [0, 1])
    ax.text(0.5, 0.5, "0.25", fontsize=8)
    assert plotting.smallest_text_pt(fig) == 8
    assert plotting.figure_label_px(fig) < 8 < plotting.MIN_LABEL_PX


def test_smallest_text_counts_only_text_that_is_drawn():
    fig, ax = plt.subplots()
    ax.set_title("shown", fontsize=14)
    ax.text(0, 0, "hidden", fontsize=3, visible=False)
    ax.text(0, 0, "   ", fontsize=4)  # blank
    ax.set_xticks([]), ax.set_yticks([])
    assert plotting.smallest_text_pt(fig) == 14
    assert plotting.smallest_text_pt(plt.figure()) is None


def test_notebook_png_records_its_smallest_text():
    from PIL import Image

    fig, ax = plt.subplots(figsize=(4, 3))
    ax.set_title("t", fontsize=13)
    ax.text(0.5, 0.5, "small", fontsize=9.5)
    png = Image.open(io.BytesIO(base64.b64decode(plotting._png_with_smallest_text(fig))))
    assert png.text[plotting.SMALLEST_TEXT_KEY] == "9.5"
    assert round(png.info["dpi"][0]) == plotting.FIGURE_DPI
    assert plotting._png_with_smallest_text(plt.figure()) is None


def test_importing_the_module_applies_the_course_style():
    matplotlib.rcdefaults()
    plotting.use_course_style()
    for key in ("font.size", "xtick.labelsize", "ytick.labelsize", "legend.fontsize", "axes.labelsize"):
        assert matplotlib.rcParams[key] >= 11, key
