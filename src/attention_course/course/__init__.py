"""The course's own tooling, apart from the attention library: notebook
kernels, exercise generation, grading.

* :mod:`~attention_course.course.kernel`: the environment notebook kernels run
  in, and one function that executes a notebook (used by
  tools/execute_notebooks.py, the exercise generator, the grader, the
  benchmarks);
* :mod:`~attention_course.course.exercises`: exercise notebooks generated from
  the solution notebooks (``python -m attention_course.exercises``);
* grading submitted exercise notebooks (``python -m attention_course.grade``),
  on either side of one trust boundary. Trusted:
  :mod:`~attention_course.course.cli` (the command line),
  :mod:`~attention_course.course.grade` (one notebook: the sandbox loop),
  :mod:`~attention_course.course.canonical` (check cells and the reference
  notebook, read once), :mod:`~attention_course.course.judge` (the checks run
  in the grader's process on the submission's outputs),
  :mod:`~attention_course.course.references` (no calls to the reference
  implementations), :mod:`~attention_course.course.results` (results and their
  formats), :mod:`~attention_course.course.sandbox` (starts, limits and ends
  the sandbox). Untrusted: :mod:`~attention_course.course.worker` (the
  submission's code runs there). Between them:
  :mod:`~attention_course.course.wire`, the protocol (its words, signatures,
  arrays).

Needs the ``course`` extra (``pip install attention_course[course]``: nbformat,
nbclient, ipykernel).
"""

import sys

# nbformat imports jsonschema, which imports rfc3987_syntax when it is
# installed (Jupyter's event schemas bring it) and that module builds a grammar
# when imported: about 1 s of CPU in every grading, kernel and generator
# process, for jsonschema's "iri" string formats, which no notebook schema
# uses. Marked absent, jsonschema skips them.
sys.modules.setdefault("rfc3987_syntax", None)
