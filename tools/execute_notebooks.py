"""Re-execute notebooks in place so their stored outputs match what the code produces today.

Usage: python tools/execute_notebooks.py NOTEBOOK.ipynb [...]
(`make outputs NB="book/01_soft_lookup.ipynb"` wraps it; with no NB it runs every notebook.)

Each notebook runs with :func:`attention_course.course.kernel.execute_notebook`, in the kernel environment
every notebook of the course gets (no TensorFlow C++ log lines, the same float results as the nbval run).
Cells tagged `raises-exception` may fail; any other failure stops with the notebook left unchanged.
"""

import sys
from pathlib import Path

import nbformat

from attention_course.course.kernel import execute_notebook


def execute(path: Path) -> None:
    nb = execute_notebook(nbformat.read(path, as_version=4), path.parent)
    nbformat.write(nb, path)
    print(f"executed {path}")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    for arg in sys.argv[1:]:
        execute(Path(arg))
