"""The catalogue's machinery: :class:`Mistake`, :func:`mistake` (add one), the
lookups. The entries live in the chapter sections beside this module."""

from __future__ import annotations

import re
from dataclasses import dataclass
from types import MappingProxyType
from typing import NamedTuple


class Example(NamedTuple):
    """A bug_zoo implementation that commits a mistake: its ``impl`` name in
    :mod:`attention_course.bug_zoo` and the ``check`` (a function name of
    :mod:`attention_course.checks`) that diagnoses it."""

    impl: str
    check: str


@dataclass(frozen=True)
class Mistake:
    code: str
    description: str
    hint: str = ""
    # a chapter's number, a capstone's key ("capstone1"), None: any
    chapter: int | str | None = None
    topic: str = "runner"
    examples: tuple[Example, ...] = ()


#: code -> Mistake, in the order of the sections below.
MISTAKES: dict[str, Mistake] = {}
_DESCRIPTIONS: dict[str, str] = {}
#: code -> one-line description of every code a check can report (a read-only,
#: always up-to-date view).
CODES = MappingProxyType(_DESCRIPTIONS)
_EXAMPLES: dict[str, tuple[str, str]] = {}  # bug_zoo name -> (code, check)
_CODE = re.compile(r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$")
# a diagnosis code at the start of a message
_MESSAGE_CODE = re.compile(r"^\[([A-Za-z0-9_-]+)\]\s*")


def split_code(message: str) -> tuple[str | None, str]:
    """``("missing-scale", "the rest")`` for ``"[missing-scale] the rest"``;
    ``(None, message)`` without a code. The one reader of a message's code (the
    checks, the grader's verdicts and hints)."""
    match = _MESSAGE_CODE.match(message)
    return (
        (match.group(1), message[match.end() :]) if match else (None, message)
    )


def mistake(
    code: str,
    description: str,
    hint: str = "",
    *,
    chapter: int | str | None = None,
    topic: str = "runner",
    examples: tuple[tuple[str, str], ...] = (),
) -> Mistake:
    """Add a mistake to the catalogue; ``examples`` are (bug_zoo name, check
    name) pairs."""
    if not isinstance(code, str) or not _CODE.match(code):
        raise ValueError(
            "code must be lower-case words joined by '-', e.g. "
            f"'missing-scale', got {code!r}"
        )
    if code in MISTAKES:
        raise ValueError(f"code {code!r} is already in the catalogue")
    if not description or "\n" in description:
        raise ValueError(f"description of {code!r} must be one non-empty line")
    entry = Mistake(
        code,
        description,
        hint,
        chapter,
        topic,
        tuple(Example(*e) for e in examples),
    )
    for example in entry.examples:
        if example.impl in _EXAMPLES:
            raise ValueError(
                f"bug_zoo.{example.impl} is already an example of "
                f"[{_EXAMPLES[example.impl][0]}]"
            )
    MISTAKES[code] = entry
    _DESCRIPTIONS[code] = description
    _EXAMPLES.update({e.impl: (code, e.check) for e in entry.examples})
    return entry


def hint(code: str, detail: str = "") -> str:
    """The default message of ``code`` with ``{detail}`` filled in."""
    entry = MISTAKES[code]
    if not entry.hint:
        raise ValueError(
            f"[{code}] has no default hint: the check must write its message"
        )
    return entry.hint.format(detail=detail)


def example(impl_name: str) -> tuple[str, str]:
    """(code, check name) of the bug_zoo implementation ``impl_name``."""
    try:
        return _EXAMPLES[impl_name]
    except KeyError:
        raise ValueError(
            f"bug_zoo.{impl_name} is the example of no mistake in the "
            "catalogue"
        ) from None


def in_chapter(chapter: int | str) -> list[Mistake]:
    """The mistakes a chapter (a number) or a capstone (its key,
    ``"capstone1"``) teaches, in catalogue order."""
    return [m for m in MISTAKES.values() if m.chapter == chapter]


_SDPA = "check_scaled_dot_product_attention"
_MHA = "check_multi_head_attention"
_SHA = "check_single_head_attention"
