"""Write the course's schematic figures (attention_course.diagrams) as SVG files into book/figures/.

Usage: python tools/make_diagrams.py          # (re)write every figure
       python tools/make_diagrams.py --check  # exit 1 if a committed SVG differs from what the code draws

The SVGs are deterministic: a fixed hash salt for the ids matplotlib writes, no date in the metadata, text kept as
text (small files, searchable), so re-running gives the same bytes and a diff shows only real changes.
"""

from __future__ import annotations

import io
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from attention_course import diagrams  # noqa: E402

FIGURES_DIR = Path(__file__).resolve().parent.parent / "book" / "figures"
SVG_STYLE = {"svg.hashsalt": "course", "svg.fonttype": "none"}


def render(name: str) -> bytes:
    """The SVG bytes of figure ``name`` (a key of ``diagrams.FIGURES``)."""
    with plt.rc_context():
        matplotlib.rcdefaults()  # the same bytes whatever style the process set (attention_course.plotting's)
        matplotlib.rcParams.update(SVG_STYLE)
        fig = diagrams.FIGURES[name]()
        buffer = io.BytesIO()
        fig.savefig(buffer, format="svg", metadata={"Date": None})
        plt.close(fig)
    return buffer.getvalue()


def main(argv: list[str]) -> int:
    check = "--check" in argv
    stale = []
    for name in diagrams.FIGURES:
        path = FIGURES_DIR / f"{name}.svg"
        svg = render(name)
        if check:
            if not path.is_file() or path.read_bytes() != svg:
                stale.append(path.name)
        else:
            FIGURES_DIR.mkdir(parents=True, exist_ok=True)
            path.write_bytes(svg)
            print(f"wrote {path.relative_to(FIGURES_DIR.parent.parent)}")
    if stale:
        print(f"out of date: {', '.join(stale)} (run: python tools/make_diagrams.py)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
