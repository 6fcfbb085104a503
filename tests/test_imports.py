"""No module of the package imports from a later chapter's module (issue 41: "no import climbs back up").

A module belongs to the chapters whose row in :data:`attention_course.chapters.CHAPTERS` names it; it grows through
them, so it may use whatever the course has taught by its last one: importing module ``m`` is allowed when ``m``'s
first chapter is not later than the importer's last. Cross-cutting modules (``interop``, ``checks``, ``course``,
``validation``, ...: no chapter row names them) belong to none and may be imported anywhere, but not as a detour: what
a chapter's module reaches through them is checked as if it imported it directly.
"""

from __future__ import annotations

import ast
from pathlib import Path

from attention_course.chapters import CHAPTERS

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "attention_course"
# named by chapter rows but used by every part of the course: the field guide plants the bugs of every chapter;
# the seeded toy tasks and training loop of chapter 12 also train chapter 11's stack and chapter 17's recall models
CROSS_CUTTING = {"bug_zoo", "tasks", "training"}


def chapter_span(module: str) -> tuple[int, int] | None:
    """(first, last) chapter whose row names ``module``'s top-level name; None for a cross-cutting module."""
    top = module.split(".")[0]
    numbers = [row.number for row in CHAPTERS if top in row.modules]
    return None if not numbers or top in CROSS_CUTTING else (min(numbers), max(numbers))


def imported_modules(module: str, source: str, is_package: bool = False) -> set[str]:
    """The ``attention_course`` modules (dotted, without the package prefix) that ``source`` imports, anywhere."""
    here = module.split(".") if is_package else module.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".", 1)[1] for a in node.names if a.name.startswith("attention_course.")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: climb level - 1 packages from this module's package
                base = here[: len(here) - node.level + 1]
            elif (node.module or "").startswith("attention_course"):
                base = []
            else:
                continue
            name = (node.module or "").removeprefix("attention_course").lstrip(".")
            parts = base + (name.split(".") if name else [])
            found |= {".".join(parts)} | {".".join(parts + [a.name]) for a in node.names if is_module(parts + [a.name])}
    return {m for m in found if m}


def is_module(parts: list[str]) -> bool:
    """Whether attention_course.<parts> is a module or a package (``from x import y`` may import either)."""
    path = PACKAGE.joinpath(*parts)
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def package_graph() -> dict[str, set[str]]:
    """module -> the modules it imports, for every module of the package."""
    graph = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        is_package = parts[-1] == "__init__"
        module = ".".join(parts[:-1] if is_package else parts)
        if module:
            graph[module] = imported_modules(module, path.read_text(encoding="utf-8"), is_package)
    return graph


def climbs(graph: dict[str, set[str]]) -> list[str]:
    """'importer -> module (chapter a -> chapter b)' for every import that reaches a later chapter's module."""
    found = []
    for importer, targets in sorted(graph.items()):
        span = chapter_span(importer)
        if span is None:
            continue
        seen, todo = set(), list(targets)
        while todo:  # through cross-cutting modules: what they import counts as imported here
            target = todo.pop()
            if target in seen:
                continue
            seen.add(target)
            target_span = chapter_span(target)
            if target_span is None:
                todo += graph.get(target, ())
            elif target_span[0] > span[1]:
                found.append(f"{importer} -> {target} (chapter {span[1]} -> chapter {target_span[0]})")
    return found


def test_no_module_imports_from_a_later_chapter():
    assert climbs(package_graph()) == []


def test_the_walk_sees_every_module_and_its_relative_imports():
    graph = package_graph()
    assert "interop.hf_models" in graph and "modern.attention" in graph
    assert "interop.hf" in graph["modern.attention"]
    assert "linear_attention.gated_attention" in graph["interop.hf_models"]


def test_a_planted_climb_is_found_directly_and_through_a_cross_cutting_module():
    graph = package_graph()
    planted = "from ..linear_attention.gated_attention import Qwen3NextAttention\n"
    graph["modern.planted"] = imported_modules("modern.planted", planted)
    assert climbs(graph) == ["modern.planted -> linear_attention.gated_attention (chapter 14 -> chapter 17)"]
    graph["modern.planted"] = imported_modules("modern.planted", "from ..interop import hf_models\n")
    assert sorted(climbs(graph)) == ["modern.planted -> linear_attention.gated_attention (chapter 14 -> chapter 17)",
                                     "modern.planted -> sparse.attention (chapter 14 -> chapter 19)",
                                     "modern.planted -> sparse.compressed (chapter 14 -> chapter 19)"]
    graph["modern.planted"] = imported_modules("modern.planted", "import attention_course.serving.scheduler\n")
    assert climbs(graph) == ["modern.planted -> serving.scheduler (chapter 14 -> chapter 18)"]


def test_an_import_of_an_earlier_chapter_is_allowed():
    graph = package_graph()
    planted = "from ..kv_cache import KVCache\nfrom .. import masks\n"
    graph["modern.planted"] = imported_modules("modern.planted", planted)
    assert graph["modern.planted"] == {"kv_cache", "masks"}
    assert climbs(graph) == []
