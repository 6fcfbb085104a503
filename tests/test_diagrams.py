"""The schematic figures: each function draws the figure it names, bad arguments are refused, and the SVGs committed
in book/figures/ are exactly what tools/make_diagrams.py writes today (deterministic output)."""

import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from attention_course import diagrams, plotting  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import make_diagrams  # noqa: E402


def texts(fig):
    """Every piece of text drawn on the figure: titles, labels, box texts."""
    return [t.get_text() for t in fig.findobj(matplotlib.text.Text) if t.get_text()]


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def test_qkv_data_flow_names_every_step_with_its_shape():
    fig = diagrams.qkv_data_flow()
    assert fig.axes[0].get_title() == "Scaled dot-product attention: data flow"
    drawn = "\n".join(texts(fig))
    for step in ("Q = x_q W_q\n(Tq, d_k)", "K = x_kv W_k\n(Tk, d_k)", "V = x_kv W_v\n(Tk, d_v)", "(Tq, Tk)",
                 "softmax over\nkeys (last axis)", "output = weights @ V\n(Tq, d_v)"):
        assert step in drawn, step


@pytest.mark.parametrize("num_heads", [1, 3, 4])
def test_multi_head_split_merge_shows_the_shapes_and_one_colour_per_head(num_heads):
    fig = diagrams.multi_head_split_merge(num_heads)
    ax = fig.axes[0]
    assert ax.get_title() == f"Multi-head attention: split and merge (H = {num_heads}, Dh = D / H)"
    drawn = texts(fig)
    for shape in ("x W_q:  (B, T, D)", "split_heads:  (B, H, T, Dh)", "merge_heads:  (B, T, D)"):
        assert shape in drawn
    assert drawn.count(f"h{num_heads - 1}") == 6 and f"h{num_heads}" not in drawn  # 3 rows before, 3 after
    colours = {tuple(p.get_facecolor()) for p in ax.patches if isinstance(p, plt.Rectangle)}
    assert len(colours) == num_heads


def test_mask_conventions_panels_agree_on_what_is_hidden():
    fig = diagrams.mask_conventions(4)
    titles = [ax.get_title() for ax in fig.axes]
    assert titles == ["course & SDPA\nbool, True =\nmay attend", "nn.MultiheadAttention\nbool, True =\nNOT allowed",
                      "float mask\n(SDPA, nn.MHA):\nadded to the scores"]
    assert fig.get_suptitle() == "One causal mask, three conventions (grey = hidden)"
    cells = [[t.get_text() for t in ax.texts] for ax in fig.axes]
    # Cell (0, 1) is in the future: False for the course, True for nn.MultiheadAttention, -inf as a float mask.
    assert (cells[0][1], cells[1][1], cells[2][1]) == ("False", "True", "−inf")
    assert (cells[0][0], cells[1][0], cells[2][0]) == ("True", "False", "0")
    assert cells[0].count("True") == 10 and cells[1].count("True") == 6  # 4 * 5 / 2 visible, 4 * 3 / 2 hidden


@pytest.mark.parametrize("name", list(diagrams.FIGURES))
def test_labels_are_readable_in_the_books_column(name):
    """Shown in the book's 688 px column, the smallest text of each figure is at least 12 px tall (a browser shows
    an SVG of WIDTH_IN inches at 96 CSS px per inch, its text in points at 96 / 72 px; tests/test_browser.py
    measures the same on the built page)."""
    fig = diagrams.FIGURES[name]()
    smallest = plotting.smallest_text_pt(fig)
    width_px = fig.get_size_inches()[0] * 96
    assert plotting.label_px(smallest, width_px, dpi=96) >= plotting.MIN_LABEL_PX, (name, smallest, width_px)


@pytest.mark.parametrize("call, error, match", [
    (lambda: diagrams.multi_head_split_merge(0), ValueError, "num_heads must be between 1 and 6, got 0"),
    (lambda: diagrams.multi_head_split_merge(2.0), TypeError, "num_heads must be an int, got float"),
    (lambda: diagrams.mask_conventions(9), ValueError, "size must be between 2 and 8, got 9"),
    (lambda: diagrams.mask_conventions("4"), TypeError, "size must be an int, got str"),
])
def test_bad_arguments_are_refused(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_rendering_is_deterministic():
    assert make_diagrams.render("mask_conventions") == make_diagrams.render("mask_conventions")


@pytest.mark.parametrize("name", list(diagrams.FIGURES))
def test_committed_svgs_are_up_to_date(name):
    path = make_diagrams.FIGURES_DIR / f"{name}.svg"
    assert path.is_file(), f"{path} missing: run python tools/make_diagrams.py"
    assert path.read_bytes() == make_diagrams.render(name), f"{path.name} is stale: run python tools/make_diagrams.py"
    assert b"<dc:date>" not in path.read_bytes()


def test_induction_circuit_names_both_heads_and_the_key_path():
    """Chapter 12's figure: the previous-token head feeds the KEY the induction head matches; labels >= 11 pt."""
    fig = diagrams.induction_circuit()
    drawn = "\n".join(texts(fig))
    for part in ("layer 1: previous-token", "key at j:\n\"before me: A\"", "query at t:\n\"I am A\"", "match",
                 "value at j: B", "OV copies", "logit of B ↑", "K-composition"):
        assert part in drawn, part
    shown = [*fig.axes[0].texts, fig.axes[0].title]  # the axis itself is off: its tick labels are not drawn
    assert min(t.get_fontsize() for t in shown) >= 11
    assert fig.get_size_inches()[0] <= 7


def test_mla_cache_counts_what_is_cached_and_the_work_of_each_form():
    """Chapter 14's MLA figure: DeepSeek-V3's 512 + 64 cached numbers, 320 against 1088 multiply-adds per pair."""
    drawn = "\n".join(texts(diagrams.mla_cache()))
    for part in ("c (512) + k_rope (64) = 576 numbers", "all 128 heads", "k = [W_uk c, k_rope] (192)",
                 "v = W_uv c (128)", "= 320 mult-adds", "= 1088 mult-adds", "expanded (prefill)",
                 "absorbed (decode)"):
        assert part in drawn, part
    small = "\n".join(texts(diagrams.mla_cache(num_heads=3, kv_lora_rank=10, qk_rope_head_dim=4,
                                               qk_nope_head_dim=6, v_head_dim=5)))
    assert "= 15 mult-adds" in small and "= 24 mult-adds" in small and "all 3 heads" in small
    fig = diagrams.mla_cache()
    shown = [*fig.axes[0].texts, fig.axes[0].title]
    assert min(t.get_fontsize() for t in shown) >= 11 and fig.get_size_inches()[0] <= 7
    with pytest.raises(ValueError, match="kv_lora_rank must be >= 1, got 0"):
        diagrams.mla_cache(kv_lora_rank=0)
    with pytest.raises(TypeError, match="num_heads must be an int, got float"):
        diagrams.mla_cache(num_heads=2.0)
