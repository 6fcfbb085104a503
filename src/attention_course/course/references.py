"""An exercise that asks for an implementation is not solved by calling the
reference implementation.

The grader reads the submission's own cells (the file it was given, not
anything the sandbox reports) as IPython runs them: each cell is turned into
Python by IPython's own input transformer (``%`` and ``!`` lines, cell magics),
and the code of ``%time``, ``%%capture`` and the other magics that run Python
in the notebook is read as code. It finds what the name under test is bound to
last before its check cell, at the notebook's top level and in any block there
(a ``def`` or ``class``, an assignment, an import), follows the names that code
uses the same way, and rejects it with the code ``calls-reference`` when that
code uses

* anything imported from ``attention_course`` except
  ``attention_course.checks`` (its reference implementations), or the names of
  its modules (``numpy_ref``, ``functional``, ...);
* ``F.scaled_dot_product_attention``, ``nn.MultiheadAttention`` or
  ``keras.layers.MultiHeadAttention`` (any spelling that ends in those names);
* ways around a reading of the code: ``__import__``, ``importlib``, ``eval``,
  ``exec``, ``compile``, ``getattr`` with a computed name, the call stack
  (``inspect``, ``sys._getframe``, ``traceback``), or a module that is not
  installed (a file the notebook may have written).

Anywhere before the check cell, code that binds names where a reading cannot
follow (``exec``, ``eval``, ``globals()``, ``sys.modules``, ``__main__``,
``builtins``), changes how IPython runs the cells (``get_ipython()`` beyond
running a magic) or runs a magic that executes other code (``%run``,
``%store``, ...) is rejected too, unless the reference solution's notebook does
the same. A cell that is not valid even after IPython's transformer is skipped:
IPython runs none of it.

A static reading finds the plain calls and the usual disguises; a determined
student can still hide a call (the sandbox keeps the solutions away, not the
library): the instructor guide says so.
"""

from __future__ import annotations

import ast
import functools
import importlib.metadata
import sys

REFERENCES = {
    "scaled_dot_product_attention",
    "MultiheadAttention",
    "MultiHeadAttention",
    "numpy_ref",
    "attention_course",
}
STACK = {
    "inspect",
    "traceback",
    "_getframe",
    "currentframe",
    "getouterframes",
    "f_back",
    "f_locals",
    "f_globals",
}
# the last four only as plain names
HIDING = {"importlib", "__import__", "eval", "exec", "compile"}
# anywhere before the check: names that rebind what the reading follows, out of
# its sight
REBINDING = {
    "importlib",
    "__import__",
    "eval",
    "exec",
    "compile",
    "globals",
    "__main__",
    "builtins",
    "__builtins__",
}
LIBRARY = "attention_course"
ALLOWED_LIBRARY = ("attention_course.checks",)
# their line or cell is Python, run in the notebook
PYTHON_MAGICS = {"time", "timeit", "capture", "prun"}
QUIET_MAGICS = {"pip", "matplotlib"}  # they bind no name of the notebook
MAGIC_CALLS = {"run_line_magic", "run_cell_magic"}
# `!cmd`: a shell command binds no Python name
SHELL_CALLS = {"system", "getoutput"}


def parse_cells(nb) -> list[ast.Module | None]:
    """Each cell's syntax tree as IPython runs it, parsed once (None: not code,
    or not valid: IPython runs none of it); the functions below read the trees
    of the cells before a check cell."""
    from IPython.core.inputtransformer2 import TransformerManager

    transform = TransformerManager().transform_cell
    return [
        _parse(cell.source, transform) if cell.cell_type == "code" else None
        for cell in nb.cells
    ]


def _parse(source: str, transform) -> ast.Module | None:
    try:
        tree = ast.parse(transform(source))
    except (SyntaxError, ValueError):
        return None
    return _InlineMagics(transform).visit(tree)


def _magic(node) -> tuple[str, str, list] | None:
    """``(call, magic name, arguments)`` of
    ``get_ipython().run_line_magic(...)`` and the like, else None."""
    if not (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Call)
        and isinstance(node.func.value.func, ast.Name)
        and node.func.value.func.id == "get_ipython"
    ):
        return None
    name = (
        node.args[0].value
        if node.args and isinstance(node.args[0], ast.Constant)
        else ""
    )
    return node.func.attr, str(name).split(" ")[0], node.args


class _InlineMagics(ast.NodeTransformer):
    """Puts the code of ``%time stmt`` and ``%%capture`` cells in place of the
    magic's call, as it runs."""

    def __init__(self, transform):
        self.transform = transform

    def visit_Expr(self, node):
        magic = _magic(node.value)
        if (
            magic is None
            or magic[0] not in MAGIC_CALLS
            or magic[1] not in PYTHON_MAGICS
        ):
            return node
        code = (
            magic[2][-1]
            if magic[2] and isinstance(magic[2][-1], ast.Constant)
            else None
        )
        tree = (
            _parse(str(code.value), self.transform)
            if code is not None
            else None
        )
        return tree.body if tree is not None else node


def _before(cells: list, check_index: int) -> list[ast.Module]:
    return [tree for tree in cells[:check_index] if tree is not None]


def _library_aliases(trees) -> set[str]:
    """Names bound by imports from the library (except its checks)."""
    aliases = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.split(".")[
                        0
                    ] == LIBRARY and not a.name.startswith(ALLOWED_LIBRARY):
                        aliases.add((a.asname or a.name).split(".")[0])
            elif (
                isinstance(node, ast.ImportFrom)
                and (node.module or "").split(".")[0] == LIBRARY
            ):
                for a in node.names:
                    full = f"{node.module}.{a.name}"
                    if (
                        not full.startswith(ALLOWED_LIBRARY)
                        and a.name != "checks"
                    ):
                        aliases.add(a.asname or a.name)
    return aliases


def _bindings(trees) -> dict[str, list[ast.AST]]:
    """``{name: the code its last binding ran}``, at the notebook's top level
    in source order, blocks included (``if``, ``for``, ``with``, ``try``): a
    ``def`` or ``class``, the value assigned, the import; ``name.attr = value``
    adds the value to ``name``'s code."""
    found: dict[str, list[ast.AST]] = {}

    def bind(target, code, add=False):
        for sub in ast.walk(target):
            if isinstance(sub, ast.Name):
                found[sub.id] = (
                    [*found.get(sub.id, []), code] if add else [code]
                )
            elif isinstance(sub, ast.Attribute) and isinstance(
                sub.value, ast.Name
            ):
                found.setdefault(sub.value.id, []).append(code)
                return

    def visit(statements):
        for node in statements:
            if isinstance(
                node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
            ):
                found[node.name] = [node]
                continue
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for a in node.names:
                    found[(a.asname or a.name).split(".")[0]] = [node]
                continue
            for sub in ast.walk(node):
                if isinstance(sub, ast.NamedExpr):
                    bind(sub.target, sub.value)
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    bind(target, node.value)
            elif (
                isinstance(node, (ast.AnnAssign, ast.AugAssign))
                and node.value is not None
            ):
                bind(
                    node.target,
                    node.value,
                    add=isinstance(node, ast.AugAssign),
                )
            elif isinstance(node, (ast.For, ast.AsyncFor)):
                bind(node.target, node.iter)
            elif isinstance(node, (ast.With, ast.AsyncWith)):
                for item in node.items:
                    if item.optional_vars is not None:
                        bind(item.optional_vars, item.context_expr)
            for block in ("body", "orelse", "finalbody"):
                visit(getattr(node, block, []))
            for handler in getattr(node, "handlers", []):
                visit(handler.body)
            for case in getattr(node, "cases", []):
                visit(case.body)

    for tree in trees:
        visit(tree.body)
    return found


def definitions(cells: list, check_index: int) -> dict[str, ast.AST]:
    """What each name is bound to last before cell ``check_index`` (``cells``:
    see :func:`parse_cells`)."""
    return {
        name: code[0]
        for name, code in _bindings(_before(cells, check_index)).items()
    }


@functools.cache
def _installed(module: str) -> bool:
    """Whether ``module`` is the standard library's or an installed
    distribution's (not a file next to the notebook, which the submission may
    have written)."""
    return (
        module in sys.stdlib_module_names
        or module in sys.builtin_module_names
        or module in importlib.metadata.packages_distributions()
    )


def _shell_uses(tree) -> dict[str, str]:
    """``{"get_ipython": why}`` when ``tree`` reaches IPython's shell other
    than to run a magic or a shell command (what IPython's transformer writes
    for ``%`` and ``!`` lines): a hook on its input transformers, its exception
    handler, its namespace, or the shell object kept under another name."""
    allowed = {
        id(node.func.value.func)
        for node in ast.walk(tree)
        if (magic := _magic(node)) is not None
        and magic[0] in MAGIC_CALLS | SHELL_CALLS
    }
    for node in ast.walk(tree):
        uses = (
            isinstance(node, ast.Name)
            and node.id == "get_ipython"
            and id(node) not in allowed
        ) or (isinstance(node, ast.Attribute) and node.attr == "get_ipython")
        if uses:
            return {
                "get_ipython": "changes how the notebook runs (get_ipython() "
                "beyond running a magic)"
            }
    return {}


def _rebinding(trees) -> dict[str, str]:
    """``{token: why}`` for code anywhere in ``trees`` that binds names out of
    a reading's sight."""
    found = {}
    for tree in trees:
        for token, why in _shell_uses(tree).items():
            found.setdefault(token, why)
        for node in ast.walk(tree):
            magic = _magic(node) if isinstance(node, ast.Call) else None
            if magic is not None:
                call, name, _ = magic
                if (
                    call in MAGIC_CALLS
                    and name not in QUIET_MAGICS | PYTHON_MAGICS
                ):
                    found.setdefault(
                        f"%{name}",
                        f"runs code the grader cannot read (%{name})",
                    )
                elif call not in MAGIC_CALLS | SHELL_CALLS:
                    found.setdefault(
                        "get_ipython",
                        "changes how the notebook runs "
                        f"(get_ipython().{call})",
                    )
            elif isinstance(node, ast.Name) and node.id in REBINDING:
                found.setdefault(
                    node.id,
                    f"binds names out of the grader's sight ({node.id})",
                )
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                for a in node.names:
                    module = (
                        node.module
                        if isinstance(node, ast.ImportFrom)
                        else a.name
                    )
                    top = str(module).split(".")[0]
                    if top in REBINDING:
                        found.setdefault(
                            top,
                            f"binds names out of the grader's sight ({top})",
                        )
            elif (
                isinstance(node, ast.Attribute)
                and node.attr == "modules"
                and isinstance(node.value, ast.Name)
                and node.value.id == "sys"
            ):
                found.setdefault(
                    "sys.modules",
                    "binds names out of the grader's sight (sys.modules)",
                )
            elif (
                isinstance(node, ast.Attribute)
                and node.attr in MAGIC_CALLS | SHELL_CALLS
                and not isinstance(node.value, ast.Call)
            ):
                found.setdefault(
                    "get_ipython",
                    f"changes how the notebook runs ({node.attr})",
                )
    return found


def _used_names(node) -> list[tuple[str, ast.AST]]:
    names = []
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            names.append((sub.id, sub))
        elif isinstance(sub, ast.Attribute):
            names.append((sub.attr, sub))
        elif isinstance(sub, (ast.Import, ast.ImportFrom)):
            names.append((_module(sub), sub))
            names += [(a.name.split(".")[-1], sub) for a in sub.names]
        elif (
            isinstance(sub, ast.Call)
            and isinstance(sub.func, ast.Name)
            and sub.func.id == "getattr"
            and len(sub.args) >= 2
            and not isinstance(sub.args[1], ast.Constant)
        ):
            names.append(("getattr", sub))
    return names


def flagged(
    cells: list, check_index: int, expr: str, name: str | None = None
) -> dict[str, tuple[str, str]]:
    """``{token: (where, why)}`` for each forbidden token used by the object
    ``expr`` checked at cell ``check_index`` (the code its name is bound to and
    the notebook's code it uses, then anything before the check that binds
    names out of sight; ``cells``: see :func:`parse_cells`)."""
    trees = _before(cells, check_index)
    bindings = _bindings(trees)
    aliases = _library_aliases(trees)
    start = expr if expr in bindings else name
    found: dict[str, tuple[str, str]] = {}
    seen, todo = set(), [start] if start in bindings else []
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        for code in bindings[current]:
            for used, node in _used_names(code):
                why = _why(used, node, aliases)
                if why:
                    found.setdefault(used, (current, why))
                if used in bindings and used not in seen:
                    todo.append(used)
    for token, why in _rebinding(trees).items():
        found.setdefault(token, ("the notebook", why))
    return found


def _why(used: str, node, aliases: set[str]) -> str | None:
    plain = isinstance(node, ast.Name)
    if used in STACK:
        return f"looks at the call stack ({used})"
    if (
        used == "importlib"
        or used in HIDING
        and plain
        or used == "getattr"
        and isinstance(node, ast.Call)
    ):
        return f"hides what it calls ({used})"
    if used in REFERENCES or used in aliases and plain:
        return f"calls the reference implementation ({used})"
    if (
        isinstance(node, (ast.Import, ast.ImportFrom))
        and used == _module(node)
        and not _installed(used)
    ):
        return (
            f"imports a module that is not installed ({used}: a file "
            "the notebook may have written)"
        )
    return None


def _module(node) -> str:
    return str(
        node.module if isinstance(node, ast.ImportFrom) else node.names[0].name
    ).split(".")[0]


def forbidden_use(
    cells: list,
    check_index: int,
    expr: str,
    checker: str = "",
    name: str | None = None,
    allowed=frozenset(),
) -> str | None:
    """Why the object ``expr`` checked at cell ``check_index`` is not the
    student's own implementation, or None.

    ``allowed``: the tokens the reference solution of this exercise uses itself
    (an exercise that builds on the library may call it; see :func:`flagged`).
    Question checks (``check_choice``, ``check_number``) are not
    implementations and are never rejected."""
    if checker in ("check_choice", "check_number"):
        return None
    for token, (definition, why) in flagged(
        cells, check_index, expr, name
    ).items():
        if token not in allowed:
            return (
                f"[calls-reference] {definition} {why}: the exercise asks "
                "for your own implementation; "
                "write it with the operations the exercise names."
            )
    return None
