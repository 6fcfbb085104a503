"""The book renders the outputs committed in each notebook (`_config.yml`: `execute_notebooks: "off"`); nbval, in
`make test`, proves they are what a fresh run prints. That proof covers a cell only if the cell was executed (nbval
compares nothing for a cell stored without an execution count), and the pages are a real run only if the cells were
run once, top to bottom, in a fresh kernel: execution counts 1, 2, 3, ... in cell order. A cell tagged
`raises-exception` is no exception to this: it stores its count and its error output, and the next cell goes on."""

import json
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
from student_toc import toc_docnames  # noqa: E402

NOTEBOOK_DIRS = ("book", "exercises", "solutions")  # the folders `make test` runs nbval over
CONFIGS = ("_config.yml", "_config_student.yml")
TOCS = ("_toc.yml", "_toc_student.yml")


def notebooks():
    return sorted(p for d in NOTEBOOK_DIRS for p in (ROOT / d).glob("*.ipynb"))


def execution_problems(nb):
    """What says that a notebook's stored outputs are not one top-to-bottom run: a list of messages, empty if none."""
    problems = []
    code = [(i, cell) for i, cell in enumerate(nb["cells"]) if cell["cell_type"] == "code"]
    for expected, (index, cell) in enumerate(code, start=1):
        count = cell.get("execution_count")
        if count is None:
            what = "an empty code cell: delete it" if not "".join(cell["source"]).strip() else "never executed"
            problems.append(f"cell {index}: {what}")
        elif count != expected:
            problems.append(f"cell {index}: execution count {count}, expected {expected} (cells run out of order, "
                            "re-run or added by hand)")
    return problems


@pytest.mark.parametrize("path", notebooks(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_stored_outputs_are_one_run_from_top_to_bottom(path):
    problems = execution_problems(json.loads(path.read_text(encoding="utf-8")))
    assert not problems, (f"{path.relative_to(ROOT)} was not executed top to bottom; re-execute it with "
                          f"`make outputs NB={path.relative_to(ROOT)}`:\n  " + "\n  ".join(problems))


def _code(*counts, source="x = 1"):
    return {"cells": [{"cell_type": "markdown", "source": "# Title"}]
            + [{"cell_type": "code", "source": source, "execution_count": c, "outputs": []} for c in counts]}


@pytest.mark.parametrize(("nb", "expected"), [
    (_code(1, 2, 3), []),
    (_code(1, None, 3), ["cell 2: never executed"]),
    (_code(None, source="  \n"), ["cell 1: an empty code cell: delete it"]),
    (_code(2, 3), ["cell 1: execution count 2, expected 1 (cells run out of order, re-run or added by hand)",
                   "cell 2: execution count 3, expected 2 (cells run out of order, re-run or added by hand)"]),
    (_code(1, 3, 2), ["cell 2: execution count 3, expected 2 (cells run out of order, re-run or added by hand)",
                      "cell 3: execution count 2, expected 3 (cells run out of order, re-run or added by hand)"]),
])
def test_execution_problems_finds_cells_not_run_in_order(nb, expected):
    assert execution_problems(nb) == expected


@pytest.mark.parametrize("config", CONFIGS)
def test_the_book_builds_execute_nothing(config):
    """Both editions render the stored outputs: a build that executed would run every notebook a second time."""
    execute = yaml.safe_load((ROOT / config).read_text(encoding="utf-8"))["execute"]
    assert execute["execute_notebooks"] == "off"


@pytest.mark.parametrize("toc", TOCS)
def test_every_notebook_the_book_renders_is_checked_by_nbval(toc):
    """A notebook page outside the folders nbval runs over would publish outputs that nothing checks."""
    pages = (ROOT / f"{name}.ipynb" for name in toc_docnames(ROOT / toc))
    rendered = {page for page in pages if page.exists()}
    assert rendered, f"{toc} lists no notebook"
    assert rendered <= set(notebooks()), f"notebooks outside {NOTEBOOK_DIRS}: {sorted(rendered - set(notebooks()))}"

