"""show_source renders the real, current source of the package."""

import inspect

import pytest

from attention_course import numpy_ref
from attention_course.display import show_source, source_markdown


def test_source_markdown_is_the_real_source_in_one_python_block():
    text = source_markdown(numpy_ref.softmax, numpy_ref.causal_mask)
    assert text.startswith("```python\n") and text.endswith("\n```")
    assert inspect.getsource(numpy_ref.softmax).strip() in text
    assert inspect.getsource(numpy_ref.causal_mask).strip() in text


def test_show_source_returns_displayable_markdown():
    shown = show_source(numpy_ref.softmax)
    assert shown._repr_markdown_() == source_markdown(numpy_ref.softmax)


def test_show_source_needs_something_to_show():
    with pytest.raises(ValueError, match="at least one"):
        show_source()
