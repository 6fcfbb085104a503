"""The environment of every notebook kernel the course starts, and one function
to execute a notebook.

Kernels must print the same outputs on every machine: TensorFlow writes no C++
log lines to stderr (``TF_CPP_MIN_LOG_LEVEL=3``) and does not let oneDNN
reorder float sums (``TF_ENABLE_ONEDNN_OPTS=0``, which changes results in the
last digits); hashing is seeded (``PYTHONHASHSEED=0``); plots are drawn inline.
The Makefile exports the same variables for the kernels of nbval and the book
build (tests/test_course_kernel.py keeps the two lists equal).
"""

from __future__ import annotations

import os
from pathlib import Path

KERNEL_ENV = {
    "TF_CPP_MIN_LOG_LEVEL": "3",
    "TF_ENABLE_ONEDNN_OPTS": "0",
    "PYTHONHASHSEED": "0",
    "MPLBACKEND": "module://matplotlib_inline.backend_inline",
}
CELL_TIMEOUT_S = 300
# no "running over TCP without encryption" warning
KERNEL_ARGS = ["--IPKernelApp.log_level=ERROR"]


def use_kernel_environment() -> None:
    """Set the kernel variables in this process (kernels inherit them); values
    already set are kept."""
    for key, value in KERNEL_ENV.items():
        os.environ.setdefault(key, value)


def execute_notebook(
    nb,
    cwd: str | Path,
    timeout: int = CELL_TIMEOUT_S,
    allow_errors: bool = False,
    interrupt_on_timeout: bool = False,
):
    """Run ``nb`` top to bottom in a fresh python3 kernel started in ``cwd``;
    return it with its outputs.

    ``timeout`` limits each cell, in seconds: a cell that runs longer raises,
    or with ``interrupt_on_timeout`` is interrupted and the run goes on. With
    ``allow_errors`` a failing cell does not stop the run (the grader's mode);
    otherwise nbclient raises ``CellExecutionError`` for a failing cell not
    tagged ``raises-exception``. A kernel that dies raises ``DeadKernelError``.
    The timestamps nbclient stores in the cells' metadata are removed, so diffs
    show only real changes.
    """
    # the `course` extra: needed only to run notebooks
    from nbclient import NotebookClient

    use_kernel_environment()
    client = NotebookClient(
        nb,
        timeout=timeout,
        kernel_name="python3",
        allow_errors=allow_errors,
        interrupt_on_timeout=interrupt_on_timeout,
        extra_arguments=KERNEL_ARGS,
        resources={"metadata": {"path": str(cwd)}},
    )
    try:
        client.execute()
    finally:
        for cell in nb.cells:
            cell.get("metadata", {}).pop("execution", None)
    return nb
