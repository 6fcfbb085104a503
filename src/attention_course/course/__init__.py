"""The course's own tooling, apart from the attention library: notebook kernels, exercise generation, grading.

* :mod:`~attention_course.course.kernel`: the environment notebook kernels run in, and one function that
  executes a notebook (used by tools/execute_notebooks.py, the exercise generator, the grader, the benchmarks);
* :mod:`~attention_course.course.exercises`: exercise notebooks generated from the solution notebooks
  (``python -m attention_course.exercises``);
* :mod:`~attention_course.course.grade`: grading submitted exercise notebooks (``python -m attention_course.grade``).
* :mod:`~attention_course.course.sandbox` (a submission's code runs there), :mod:`~attention_course.course.wire`
  (arrays between the two), :mod:`~attention_course.course.judge` (the checks run in the grader's process on the
  submission's outputs), :mod:`~attention_course.course.references` (no calls to the reference implementations).

Needs the ``course`` extra (``pip install attention_course[course]``: nbformat, nbclient, ipykernel).
"""
