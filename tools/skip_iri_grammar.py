"""A pytest plugin that marks ``rfc3987_syntax`` absent, as the package's ``attention_course.course`` does for the
course's own processes (its ``__init__`` says why), so that pytest's controller and each worker skip building that
module's grammar when nbval imports nbformat: 1.5 s of CPU per process. Named with ``-p`` (the Makefile's XDIST), it
loads before installed plugins such as nbval. It is not the course package itself: imported before pytest-cov starts,
the package's module-level lines would go unmeasured."""

import sys

sys.modules.setdefault("rfc3987_syntax", None)
