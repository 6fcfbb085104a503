"""Triton's compiled library loaded before TensorFlow can be: one process may
then use both.

Triton (chapter 16; ``torch.compile`` imports it too) and TensorFlow (chapter
6) each ship their own copy of LLVM. Loaded in the order TensorFlow then
Triton, the second copy registers LLVM's command-line options again and LLVM
aborts the whole interpreter ("Option 'bitcode-mdindex-threshold' registered
more than once"); in the order Triton then TensorFlow both work. A notebook,
the test run or the grader's worker imports this package before it imports
TensorFlow, so the package loads Triton's library (not its Python modules,
which read ``TRITON_INTERPRET`` when they are imported:
:mod:`attention_course.flash_triton` decides that) when Triton is installed.
Where it is not (macOS, Windows) there is nothing to load.
"""

from __future__ import annotations

import ctypes
import importlib.util
from pathlib import Path


def load_triton_library() -> bool:
    """Load ``triton/_C/libtriton.so`` into the process if Triton is installed;
    True if it is loaded now."""
    spec = importlib.util.find_spec("triton")
    if spec is None or not spec.submodule_search_locations:
        return False
    library = Path(spec.submodule_search_locations[0]) / "_C" / "libtriton.so"
    if (
        not library.is_file()
    ):  # pragma: no cover - every Linux wheel of Triton has it
        return False
    # loaded once per process: Triton's own import later finds it already there
    ctypes.CDLL(str(library))
    return True


load_triton_library()  # on import: the package imports this module first
