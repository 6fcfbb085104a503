"""Chapter 13's figures: drawn from the library's schedule and layouts, readable (text >= 11 pt, <= 7 in wide)."""

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from attention_course.distributed import figures  # noqa: E402
from attention_course.distributed.ring_attention import causal_work_per_rank, kv_source  # noqa: E402


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def _texts(fig):
    """The text a reader sees: the axes' texts and titles, the figure's title, tick labels of axes that are on."""
    shown = [fig._suptitle] if fig._suptitle else []
    for ax in fig.axes:
        shown += [*ax.texts, ax.title]
        if ax.axison:
            shown += [*ax.get_xticklabels(), *ax.get_yticklabels()]
    return [t for t in shown if t.get_text()]


@pytest.mark.parametrize("draw", [figures.tensor_parallel_sharding, figures.ring_schedule, figures.causal_layouts])
@pytest.mark.parametrize("world_size", [2, 4])
def test_figures_are_readable(draw, world_size):
    fig = draw(world_size)
    fig.canvas.draw()  # tick labels exist once drawn
    assert fig.get_figwidth() <= 7.0
    sizes = [t.get_fontsize() for t in _texts(fig)]
    assert sizes and min(sizes) >= 11


def test_ring_schedule_shows_the_source_the_ring_code_uses():
    p = 4
    fig = figures.ring_schedule(p)
    cells = [t.get_text() for t in fig.axes[0].texts]
    assert cells == [f"KV {kv_source(r, s, p)}" for s in range(p) for r in range(p)]
    assert cells[:p] == [f"KV {r}" for r in range(p)]  # step 0: its own block
    assert [kv_source(r, 1, p) for r in range(p)] == [3, 0, 1, 2]  # then the left neighbour's


def test_causal_layouts_count_the_work_of_the_ring():
    p = 4
    fig = figures.causal_layouts(p)
    titles = [ax.get_title() for ax in fig.axes]
    for title, layout in zip(titles, ("contiguous", "zigzag"), strict=True):
        work = [w.computed for w in causal_work_per_rank(2 * p, p, layout)]
        assert title == f"{layout}\nwork per rank: {work}"
    assert titles[1].endswith(str([2 * p + 1] * p))


def test_tensor_parallel_sharding_labels_f_and_g():
    drawn = [t.get_text() for t in _texts(figures.tensor_parallel_sharding(3))]
    assert {"f", "g", "all-reduce\n(sum)", "copy x\n(no message)"} <= set(drawn)
    assert [d for d in drawn if d.startswith("rank ")] == [f"rank {r}: columns\nof Wq, Wk, Wv" for r in range(3)]


def test_bad_world_size_is_refused():
    with pytest.raises(ValueError, match="world_size must be at most 8"):
        figures.ring_schedule(9)
    with pytest.raises(TypeError, match="world_size must be an int"):
        figures.causal_layouts(2.0)
