"""The chapter index: one row per chapter, naming its notebook, the library
modules it teaches and the checks topics that grade its exercises; its mistakes
are the catalogue's section ``chapter=N`` (:mod:`attention_course.mistakes`).
The capstones are a table of their own, keyed ``capstone1``, ``capstone2``, ...
(their notebooks ``capstoneK_name_exercises``, their mistakes
``chapter="capstoneK"``), never numbered like chapters: a new chapter takes the
next number and renames no capstone.

A new chapter adds its module, its checks topic, one section of mistakes and
one row here. The tests hold every other list to this one: each notebook's
first-line "Library:" modules, CONTRIBUTING's chapter -> module map, the
mistakes' chapters and topics, and the checks' lazy table
(``tests/test_chapters.py``).

``python -m attention_course.chapters 14`` prints chapter 14's modules, checks
and mistake codes; ``python -m attention_course.chapters capstone1`` a
capstone's chapters, checks and codes.
"""

from __future__ import annotations

import sys
from typing import NamedTuple


class Chapter(NamedTuple):
    """One chapter: ``notebook`` is the file name without folder and suffix
    (``None``: exercises only), ``modules`` the modules of ``attention_course``
    it teaches, ``checks`` the topic modules of ``attention_course.checks``."""

    number: int
    notebook: str | None
    modules: tuple[str, ...]
    checks: tuple[str, ...]


class Capstone(NamedTuple):
    """One capstone: ``key`` (``capstoneK``), ``notebook`` its exercises' file
    name without folder and suffix, ``chapters`` the chapters it puts together,
    ``checks`` its topic modules of ``attention_course.checks``."""

    key: str
    notebook: str
    chapters: tuple[int, ...]
    checks: tuple[str, ...]


CHAPTERS = (
    Chapter(1, "01_soft_lookup", ("numpy_ref",), ("core", "masks")),
    Chapter(
        2, "02_single_head", ("functional", "single_head"), ("core", "modules")
    ),
    Chapter(
        3,
        "03_multi_head",
        ("heads", "multi_head", "params"),
        ("heads", "modules"),
    ),
    Chapter(
        4,
        "04_masking",
        ("float_masks", "functional", "masks"),
        ("core", "masks"),
    ),
    Chapter(
        5, "05_einsum", ("einsum_attention", "params"), ("heads", "modules")
    ),
    Chapter(
        6,
        "06_tensorflow",
        ("keras_attention", "params"),
        ("core", "masks", "modules", "porting"),
    ),
    Chapter(
        7, "07_bug_field_guide", ("bug_zoo", "mistakes"), ("field_guide",)
    ),
    Chapter(8, "08_kv_cache", ("gpt", "kv_cache"), ("kv_cache",)),
    Chapter(
        9,
        "09_efficient_attention",
        ("blockwise", "fused", "online_softmax", "tiles"),
        ("core", "tiles"),
    ),
    Chapter(
        10,
        "10_positions",
        ("gpt", "kv_cache", "multi_head", "positions"),
        ("positions",),
    ),
    Chapter(11, "11_transformer_block", ("block", "gpt"), ("blocks",)),
    Chapter(
        12,
        "12_attention_learns",
        ("diagrams", "interpret", "pretrained", "tasks", "training"),
        ("interpret",),
    ),
    Chapter(
        13, "13_distributed_attention", ("distributed",), ("distributed",)
    ),
    Chapter(
        14,
        "14_modern_attention",
        ("decoder", "masks", "modern", "positions"),
        ("modern",),
    ),
    Chapter(
        15,
        "15_flex_attention",
        ("flex", "masks", "positions", "tiles"),
        ("flex",),
    ),
    Chapter(
        16,
        "16_triton_kernel",
        ("flash_reference", "flash_triton"),
        ("kernels",),
    ),
    Chapter(17, "17_linear_attention", ("linear_attention",), ("linear",)),
    Chapter(18, "18_serving", ("kv_cache", "serving"), ("serving",)),
    Chapter(19, "19_sparse_attention", ("sparse",), ("sparse",)),
)
CAPSTONES = (
    Capstone(
        "capstone1",
        "capstone1_tiny_gpt_exercises",
        (10, 11, 12, 13),
        ("capstone",),
    ),
    Capstone(
        "capstone2",
        "capstone2_real_model_exercises",
        (14, 15, 16, 17, 18),
        ("blocks", "capstone_model"),
    ),
)
# used by every chapter's exercises: running student code, questions
SHARED_CHECKS = ("runner", "questions")


def chapter(number: int) -> Chapter:
    """The row of chapter ``number``; ValueError naming the chapters there
    are."""
    for row in CHAPTERS:
        if row.number == number:
            return row
    raise ValueError(
        f"no chapter {number!r}: the chapters are 1 to {CHAPTERS[-1].number}"
    )


def capstone(key: str) -> Capstone:
    """The row of capstone ``key`` (``"capstone1"``); ValueError naming the
    capstones there are."""
    for row in CAPSTONES:
        if row.key == key:
            return row
    raise ValueError(
        f"no capstone {key!r}: the capstones are "
        f"{', '.join(r.key for r in CAPSTONES)}"
    )


def checks_of(key: int | str) -> tuple[str, ...]:
    """The checks topics of chapter ``key`` (a number) or capstone ``key``
    (``"capstone1"``)."""
    return (
        chapter(key).checks if isinstance(key, int) else capstone(key).checks
    )


def describe(number: int | str) -> str:
    """Chapter ``number``'s (or capstone ``number``'s) modules, checks topics
    and mistake codes, one line each."""
    from . import mistakes

    if isinstance(number, str):
        return _describe_capstone(
            capstone(number), [m.code for m in mistakes.in_chapter(number)]
        )
    row = chapter(number)
    codes = [m.code for m in mistakes.in_chapter(number)]
    return "\n".join(
        [
            f"chapter {row.number}: {row.notebook or 'exercises only'}",
            "modules: "
            + (
                ", ".join(f"attention_course.{m}" for m in row.modules)
                or "none new"
            ),
            "checks: "
            + ", ".join(f"attention_course.checks.{c}" for c in row.checks),
            "mistakes: " + (", ".join(codes) or "none"),
        ]
    )


def _describe_capstone(row: Capstone, codes: list[str]) -> str:
    return "\n".join(
        [
            f"{row.key}: {row.notebook}",
            "chapters: " + ", ".join(map(str, row.chapters)),
            "checks: "
            + ", ".join(f"attention_course.checks.{c}" for c in row.checks),
            "mistakes: " + (", ".join(codes) or "none"),
        ]
    )


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or not (
        args[0].isdigit() or args[0].startswith("capstone")
    ):
        print(
            "usage: python -m attention_course.chapters N|capstoneK",
            file=sys.stderr,
        )
        return 2
    try:
        print(describe(int(args[0]) if args[0].isdigit() else args[0]))
    except ValueError as err:
        print(err, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
