"""``python -m attention_course.exercises``: generate the exercise notebooks.

See :mod:`attention_course.course.exercises`.
"""

import sys

from .course.exercises import main

if (
    __name__ == "__main__"
):  # pragma: no cover - the command line; main() is tested
    sys.exit(main())
