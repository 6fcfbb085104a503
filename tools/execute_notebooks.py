"""Re-execute notebooks in place so their stored outputs match what the code produces today.

Usage: python tools/execute_notebooks.py NOTEBOOK.ipynb [...]
(`make outputs NB="book/01_soft_lookup.ipynb"` wraps it; with no NB it runs every notebook.)

Kernels start with TF_CPP_MIN_LOG_LEVEL=3 and TF_ENABLE_ONEDNN_OPTS=0 so TensorFlow writes no C++ log lines
and gives the same float results as the nbval run. Cells tagged `raises-exception` may fail; any other
failure stops with the notebook left unchanged.
"""

import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
os.environ.setdefault("PYTHONHASHSEED", "0")
os.environ.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")

import nbformat
from nbclient import NotebookClient

CELL_TIMEOUT_S = 300


def execute(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb, timeout=CELL_TIMEOUT_S, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
    )
    client.execute()
    for cell in nb.cells:  # execution metadata holds timestamps: keep diffs to real changes
        cell.get("metadata", {}).pop("execution", None)
    nbformat.write(nb, path)
    print(f"executed {path}")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    for arg in sys.argv[1:]:
        execute(Path(arg))
