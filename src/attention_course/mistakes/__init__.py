"""The catalogue of attention mistakes: one entry per diagnosis code, in one
place.

Each :class:`Mistake` has the ``code`` a check reports (``[missing-scale]
...``), a one-line ``description``, the ``hint`` the check prints by default (a
template: ``{detail}`` is filled in by the check; empty when every check writes
its own message), the ``chapter`` that teaches it (None: any check may report
it), the ``topic`` (the :mod:`attention_course.checks` module that diagnoses
it) and ``examples``: the deliberately wrong implementations of
:mod:`attention_course.bug_zoo` that commit it, each with the check that
diagnoses it.

Readers of the catalogue: the checks (codes and hints: :func:`hint`),
:mod:`attention_course.bug_zoo` (each zoo entry's code and check), the tests
(every example is diagnosed with its code) and chapter 7.

Adding a mistake: call :func:`mistake` in your chapter's section
(``foundations``: chapters 1-6, ``beyond``: 7-13,
``today``: 14-18, ``capstones``; a new chapter adds its own module and imports
it below), with a code that is new, then make a checker report it and plant it
in a test.

What a check must prove (a check a student can pass without doing the exercise
is a broken promise):

* **training and evaluation mode**: anything with dropout is probed in both:
  deterministic after ``.eval()``, and in ``.train()`` dropping the right
  tensor at the module's rate (``[dropout-off-in-training]``,
  ``[dropout-wrong-rate]``, ``[dropout-wrong-tensor]``; blocks:
  ``[branch-dropout-off]``, ``[dropout-not-on-branch]``), read back from what
  the module computed;
* **measured, not reported**: a number about the student's own work (tiles
  computed, bytes stored) is counted by the check
  (:mod:`attention_course.checks.observe`), never taken from the student's
  return value;
* **the prompt's rules**: a rule the exercise states ("the float mask, not the
  boolean one", "without forming the keys") is enforced by observing the call,
  the dtype, the storage or the tensors created, or it is not stated;
* **independent of the installed kernel**: a guard the chapter teaches (a row
  that may attend nothing) is exercised even where this PyTorch version would
  hide its absence (inside the checks the fused kernel returns NaN there);
* **at the scale of the instability**: inputs large enough for the taught
  failure to show (scores of about 1000 for a softmax or a merge without its
  maximum, maxima that rise for a merge without its rescale, a block in which
  every key is masked for a merge without its -inf guard);
* **named**: each plausible wrong answer gets its own code from this catalogue,
  not ``[wrong-output]``, and hints name the symptom and the diagnosis and
  point at the chapter's section, without dictating the fix (find-the-bug
  exercises show them).
"""

import importlib

from attention_course.mistakes.catalogue import (
    CODES,
    MISTAKES,
    Example,
    Mistake,
    example,
    hint,
    in_chapter,
    mistake,
    split_code,
)

#: The sections, in catalogue order; importing one adds its entries.
SECTIONS = ("foundations", "beyond", "today", "sparse", "capstones")
for _section in SECTIONS:
    importlib.import_module(f"{__name__}.{_section}")

__all__ = [
    "CODES",
    "MISTAKES",
    "Example",
    "Mistake",
    "example",
    "hint",
    "in_chapter",
    "mistake",
    "split_code",
]
