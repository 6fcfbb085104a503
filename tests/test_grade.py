"""The grader: full marks for the solutions, zero for the untouched exercises, the right code for a planted bug,
and clear errors for files that are not notebooks. Kernel starts are slow, so one module-level run grades them all."""

import csv
import io
import json
import shutil
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from attention_course import grade

ROOT = Path(__file__).resolve().parents[1]
NAME = "01_soft_lookup_exercises.ipynb"


def _tag(cell, *tags):
    cell.metadata["tags"] = list(tags)
    return cell


def _misbehaving_notebook():
    """Exercise 1 passes after a cell that hits the time limit; 2 fails with a plain error; the kernel dies
    before 3."""
    return new_notebook(cells=[
        new_markdown_cell("# Exercises: Misbehaving"),
        new_code_cell("while True:\n    pass"),
        new_markdown_cell("## Exercise 1 (warm-up): Survives"),
        _tag(new_code_cell("print('fine')"), "check", "exercise-1"),
        new_markdown_cell("## Exercise 2 (core): Plain error"),
        _tag(new_code_cell("raise ValueError('boom')"), "check", "exercise-2"),
        new_code_cell("import os\nos._exit(1)"),
        new_markdown_cell("## Exercise 3 (challenge): Never runs"),
        _tag(new_code_cell("print('unreachable')"), "check", "exercise-3"),
        _tag(new_code_cell("print('untagged check')"), "check"),  # numbered by the heading above it
    ], metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}})


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("grade")
    shutil.copy(ROOT / "solutions" / NAME, tmp / "solution.ipynb")
    shutil.copy(ROOT / "exercises" / NAME, tmp / "exercise.ipynb")
    nb = nbformat.read(ROOT / "solutions" / NAME, as_version=4)
    cell = next(c for c in nb.cells if c.source.startswith("def attention("))
    assert "/ np.sqrt(d_k)" in cell.source
    cell.source = cell.source.replace(" / np.sqrt(d_k)", "")  # the planted bug: no scaling
    nbformat.write(nb, tmp / "planted.ipynb")
    (tmp / "corrupt.ipynb").write_text("{ this is not JSON", encoding="utf-8")
    (tmp / "not_a_notebook.ipynb").write_text('{"cells": 3}', encoding="utf-8")
    nbformat.write(new_notebook(cells=[new_code_cell("x = 1")]), tmp / "no_checks.ipynb")
    (tmp / "binary.ipynb").write_bytes(b"\xff\xfe\x00garbage")
    paths = [tmp / n for n in ("solution.ipynb", "exercise.ipynb", "planted.ipynb", "corrupt.ipynb", "missing.ipynb",
                               "not_a_notebook.ipynb", "no_checks.ipynb", "binary.ipynb")]
    results = grade.grade(paths, timeout=120)
    nbformat.write(_misbehaving_notebook(), tmp / "misbehaving.ipynb")
    results += grade.grade([tmp / "misbehaving.ipynb"], timeout=3)
    return {Path(r.notebook).stem: r for r in results}


def test_solution_gets_full_marks(graded):
    r = graded["solution"]
    assert (r.passed, r.total, r.error) == (5, 5, None)
    assert [e.exercise for e in r.exercises] == [1, 2, 3, 4, 5]
    assert r.exercises[0].title == "A softmax that does not overflow" and r.exercises[0].level == "warm-up"


def test_untouched_exercises_get_zero(graded):
    r = graded["exercise"]
    assert (r.passed, r.total) == (0, 5)
    assert {e.code for e in r.exercises} == {"not-implemented"}
    assert r.exercises[2].message.startswith("[not-implemented] Exercise 3: Scaled dot-product attention")


def test_planted_bug_is_diagnosed(graded):
    r = graded["planted"]
    assert (r.passed, r.total) == (4, 5)
    failed = [e for e in r.exercises if not e.passed]
    assert [(e.exercise, e.code) for e in failed] == [(3, "missing-scale")]


def test_unreadable_files_are_reported(graded):
    assert graded["corrupt"].error.startswith("not a valid notebook (NotJSONError")
    assert graded["missing"].error == "no such file"
    assert graded["not_a_notebook"].error.startswith("not a valid notebook")
    assert graded["no_checks"].error == "no check cells (cells tagged 'check') found"
    assert graded["binary"].error.startswith(("cannot read the file", "not a valid notebook"))
    assert all(graded[n].total == 0 for n in ("corrupt", "missing", "no_checks"))


def test_timeouts_errors_and_dead_kernels(graded):
    r = graded["misbehaving"]
    outcome = [(e.exercise, e.passed, e.code) for e in r.exercises]
    assert outcome == [(1, True, None), (2, False, "ValueError"), (3, False, "not-run"), (3, False, "not-run")]
    assert r.exercises[1].message == "boom"


def test_timeout_interrupt_is_reported():
    cell = new_code_cell("")
    cell.execution_count = 1
    cell.outputs = [nbformat.v4.new_output("error", ename="KeyboardInterrupt", evalue="", traceback=[])]
    assert grade._outcome(cell) == (False, "timeout", "the cell was interrupted: it ran longer than the time limit")


def test_table(graded):
    text = grade.format_table([graded[n] for n in ("solution", "planted", "corrupt")])
    lines = text.splitlines()
    assert lines[0].endswith("solution.ipynb: 5/5")
    assert lines[1] == "  Exercise 1   A softmax that does not overflow            pass"
    assert "planted.ipynb: 4/5" in text
    assert "  Exercise 3   Scaled dot-product attention, vectorised    FAIL  [missing-scale]" in lines
    assert lines[-1].startswith("ERROR ") and lines[-1].endswith("corrupt.ipynb: not a valid notebook (NotJSONError: "
                                                                 "Notebook does not appear to be JSON: '{ this is not "
                                                                 "JSON')")


def test_json_and_csv_parse(graded):
    results = [graded[n] for n in ("solution", "planted", "missing")]
    data = json.loads(grade.format_json(results))
    assert [(n["passed"], n["total"], n["error"]) for n in data["notebooks"]] == [(5, 5, None), (4, 5, None),
                                                                                  (0, 0, "no such file")]
    assert data["notebooks"][1]["exercises"][2]["code"] == "missing-scale"
    rows = list(csv.DictReader(io.StringIO(grade.format_csv(results))))
    assert len(rows) == 11
    assert rows[7]["exercise"] == "3" and rows[7]["passed"] == "0" and rows[7]["code"] == "missing-scale"
    assert rows[-1]["code"] == "error" and rows[-1]["message"] == "no such file"


def test_command_line(tmp_path, capsys):
    bad = tmp_path / "bad.ipynb"
    bad.write_text("nope", encoding="utf-8")
    assert grade.main([str(bad), str(tmp_path / "gone.ipynb"), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [n["error"].split(" (")[0] for n in data["notebooks"]] == ["not a valid notebook", "no such file"]
    assert grade.main([str(bad), "--csv", "--timeout", "5"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "notebook,exercise,title,level,passed,code,message"
    assert grade.main([str(tmp_path / "gone.ipynb")]) == 0
    assert capsys.readouterr().out == f"ERROR {tmp_path / 'gone.ipynb'}: no such file\n"
    with pytest.raises(SystemExit) as info:
        grade.main(["--json", "--csv", str(bad)])
    assert info.value.code == 2
