"""Show the real source of the package in a notebook, so a page can never drift
from the tested code."""

from __future__ import annotations

import inspect
import textwrap

from IPython.display import Markdown


def source_markdown(*objects) -> str:
    """The source of each function or class in ``objects`` as one fenced Python
    block (MyST/Markdown)."""
    if not objects:
        raise ValueError(
            "show_source needs at least one function, class or module"
        )
    sources = [
        textwrap.dedent(inspect.getsource(_unwrapped(obj))).rstrip()
        for obj in objects
    ]
    return "```python\n" + "\n\n\n".join(sources) + "\n```"


def _unwrapped(obj):
    """A Triton kernel (``@triton.jit``: a JITFunction, or an
    InterpretedFunction without a GPU) wraps the Python function it was written
    as, in ``.fn``; anything else is itself."""
    return (
        obj.fn
        if type(obj).__name__ in ("JITFunction", "InterpretedFunction")
        else obj
    )


def show_source(*objects) -> Markdown:
    """Display the source of functions/classes from ``attention_course`` as a
    highlighted code block.

    Example: ``show_source(softmax, scaled_dot_product_attention)`` in a
        chapter cell.
    """
    return Markdown(source_markdown(*objects))
