"""Names a package exports but imports only when first used (PEP 562), so that
importing it stays cheap.

The course's package and its checks re-export layers and checkers whose modules
import torch (and some TensorFlow or transformers); the grader's processes
import the package for its notebook handling alone, several times per graded
notebook, and would otherwise pay about 1.5 s of CPU each time.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping


def lazy_exports(
    package: str, table: Mapping[str, str]
) -> tuple[Callable, Callable]:
    """The ``__getattr__`` and ``__dir__`` of ``package``, whose names in
    ``table`` (name -> submodule) are imported from that submodule when first
    used, then kept in the package like an ordinary import."""

    def __getattr__(name: str):
        if name not in table:
            raise AttributeError(
                f"module {package!r} has no attribute {name!r}"
            )
        value = getattr(
            importlib.import_module(f".{table[name]}", package), name
        )
        # once: the next lookup finds it
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(table))

    return __getattr__, __dir__
