"""``python -m attention_course.grade``: grade submitted exercise notebooks.

See :mod:`attention_course.course.cli`.
"""

import sys

from .course.cli import main

if (
    __name__ == "__main__"
):  # pragma: no cover - the command line; main() is tested
    sys.exit(main())
