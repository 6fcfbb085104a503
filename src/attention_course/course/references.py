"""An exercise that asks for an implementation is not solved by calling the reference implementation.

The grader reads the submission's own cells (the file it was given, not anything the sandbox reports): it finds
the last definition of the function or class under test before its check cell, follows the functions and
classes of the notebook that it uses, and rejects it with the code ``calls-reference`` when that code uses

* anything imported from ``attention_course`` except ``attention_course.checks`` (its reference
  implementations), or the names of its modules (``numpy_ref``, ``functional``, ...);
* ``F.scaled_dot_product_attention``, ``nn.MultiheadAttention`` or ``keras.layers.MultiHeadAttention`` (any
  spelling that ends in those names);
* ways around a reading of the code: ``__import__``, ``importlib``, ``eval``, ``exec``, ``compile``,
  ``getattr`` with a computed name, or the call stack (``inspect``, ``sys._getframe``, ``traceback``).

A static check of the source finds the plain calls and the usual disguises; a determined student can still
hide a call (the sandbox keeps the solutions away, not the library): the instructor guide says so.
"""

from __future__ import annotations

import ast

REFERENCES = {"scaled_dot_product_attention", "MultiheadAttention", "MultiHeadAttention", "numpy_ref",
              "attention_course"}
STACK = {"inspect", "traceback", "_getframe", "currentframe", "getouterframes", "f_back", "f_locals", "f_globals"}
HIDING = {"importlib", "__import__", "eval", "exec", "compile"}  # the last four only as plain names
LIBRARY = "attention_course"
ALLOWED_LIBRARY = ("attention_course.checks",)


def parse_cells(nb) -> list[ast.Module | None]:
    """Each cell's syntax tree, parsed once (None: not code, or not Python); the functions below read the trees
    of the cells before a check cell."""
    trees = []
    for cell in nb.cells:
        tree = None
        if cell.cell_type == "code":
            lines = [line for line in cell.source.splitlines() if not line.lstrip().startswith(("%", "!"))]
            try:
                tree = ast.parse("\n".join(lines))
            except SyntaxError:
                pass
        trees.append(tree)
    return trees


def _before(cells: list, check_index: int) -> list[ast.Module]:
    return [tree for tree in cells[:check_index] if tree is not None]


def _library_aliases(trees) -> set[str]:
    """Names bound by imports from the library (except its checks)."""
    aliases = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.split(".")[0] == LIBRARY and not a.name.startswith(ALLOWED_LIBRARY):
                        aliases.add((a.asname or a.name).split(".")[0])
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == LIBRARY:
                for a in node.names:
                    full = f"{node.module}.{a.name}"
                    if not full.startswith(ALLOWED_LIBRARY) and a.name != "checks":
                        aliases.add(a.asname or a.name)
    return aliases


def _definitions(trees) -> dict[str, ast.AST]:
    """The last top-level definition of each function and class name."""
    found = {}
    for tree in trees:
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                found[node.name] = node
            elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                found[node.targets[0].id] = node.value
    return found


def definitions(cells: list, check_index: int) -> dict[str, ast.AST]:
    """The notebook's last top-level definition of each name before cell ``check_index`` (``cells``: see
    :func:`parse_cells`)."""
    return _definitions(_before(cells, check_index))


def _used_names(node) -> list[tuple[str, ast.AST]]:
    names = []
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            names.append((sub.id, sub))
        elif isinstance(sub, ast.Attribute):
            names.append((sub.attr, sub))
        elif isinstance(sub, (ast.Import, ast.ImportFrom)):
            module = sub.module if isinstance(sub, ast.ImportFrom) else sub.names[0].name
            names.append((str(module).split(".")[0], sub))
            names += [(a.name.split(".")[-1], sub) for a in sub.names]
        elif (isinstance(sub, ast.Call) and isinstance(sub.func, ast.Name) and sub.func.id == "getattr"
              and len(sub.args) >= 2 and not isinstance(sub.args[1], ast.Constant)):
            names.append(("getattr", sub))
    return names


def flagged(cells: list, check_index: int, expr: str, name: str | None = None) -> dict[str, tuple[str, str]]:
    """``{token: (definition, why)}`` for each forbidden token used by the object ``expr`` checked at cell
    ``check_index`` (its definition and the notebook's functions and classes it uses; ``cells``: see
    :func:`parse_cells`)."""
    trees = _before(cells, check_index)
    definitions = _definitions(trees)
    aliases = _library_aliases(trees)
    start = expr if expr in definitions else name
    found: dict[str, tuple[str, str]] = {}
    seen, todo = set(), [start] if start in definitions else []
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        for used, node in _used_names(definitions[current]):
            plain = isinstance(node, ast.Name)
            if used in STACK:
                why = f"looks at the call stack ({used})"
            elif used == "importlib" or used in HIDING and plain or used == "getattr" and isinstance(node, ast.Call):
                why = f"hides what it calls ({used})"
            elif used in REFERENCES or used in aliases and plain:
                why = f"calls the reference implementation ({used})"
            else:
                why = None
            if why:
                found.setdefault(used, (current, why))
            if used in definitions and used not in seen:
                todo.append(used)
    return found


def forbidden_use(cells: list, check_index: int, expr: str, checker: str = "", name: str | None = None,
                  allowed=frozenset()) -> str | None:
    """Why the object ``expr`` checked at cell ``check_index`` is not the student's own implementation, or None.

    ``allowed``: the tokens the reference solution of this exercise uses itself (an exercise that builds on the
    library may call it; see :func:`flagged`). Question checks (``check_choice``, ``check_number``) are not
    implementations and are never rejected."""
    if checker in ("check_choice", "check_number"):
        return None
    for token, (definition, why) in flagged(cells, check_index, expr, name).items():
        if token not in allowed:
            return (f"[calls-reference] {definition} {why}: the exercise asks for your own implementation; "
                    "write it with the operations the exercise names.")
    return None
