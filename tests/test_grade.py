"""The grader: full marks for the solutions, zero for the untouched exercises, the right code for a planted bug,
canonical check cells (a deleted or edited check cell gains nothing), and clear errors for files that are not
notebooks. Kernel starts are slow, so one module-level run grades them all (four kernels)."""

import csv
import io
import json
import shutil
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from attention_course.course import canonical, cli, grade
from attention_course.course import results as formats
from attention_course.mistakes import CODES

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


def _tampered():
    """The planted bug (no scaling in exercise 5), its check cell edited to `pass`, exercise 4's check deleted."""
    nb = nbformat.read(ROOT / "solutions" / NAME, as_version=4)
    cell = next(c for c in nb.cells if c.source.startswith("def attention("))
    assert " / np.sqrt(q.shape[-1])" in cell.source
    cell.source = cell.source.replace(" / np.sqrt(q.shape[-1])", "")  # the planted bug: no scaling
    check_5 = next(c for c in nb.cells if "exercise-5" in c.metadata.get("tags", []))
    check_5.source = "pass"
    nb.cells = [c for c in nb.cells if "exercise-4" not in c.metadata.get("tags", [])]
    return nb


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("grade")
    # graded against solutions/ (the default reference), matched by name after a prefix
    shutil.copy(ROOT / "solutions" / NAME, tmp / f"solution_{NAME}")
    shutil.copy(ROOT / "exercises" / NAME, tmp / f"exercise_{NAME}")
    nbformat.write(_tampered(), tmp / f"planted_{NAME}")
    results = grade.grade([tmp / f"{n}_{NAME}" for n in ("solution", "exercise", "planted")], timeout=120)
    # graded with their own check cells
    (tmp / "corrupt.ipynb").write_text("{ this is not JSON", encoding="utf-8")
    (tmp / "not_a_notebook.ipynb").write_text('{"cells": 3}', encoding="utf-8")
    nbformat.write(new_notebook(cells=[new_code_cell("x = 1")]), tmp / "no_checks.ipynb")
    (tmp / "binary.ipynb").write_bytes(b"\xff\xfe\x00garbage")
    nbformat.write(_misbehaving_notebook(), tmp / "misbehaving.ipynb")
    paths = [tmp / f"{n}.ipynb" for n in ("corrupt", "missing", "not_a_notebook", "no_checks", "binary")]
    results += grade.grade(paths, reference=None)
    # its loop runs until the cell limit: 1 s of CPU time (the other cells take milliseconds)
    results += grade.grade([tmp / "misbehaving.ipynb"], timeout=1, reference=None)
    return {Path(r.notebook).stem.replace(f"_{Path(NAME).stem}", ""): r for r in results}


def test_solution_gets_full_marks(graded):
    r = graded["solution"]
    assert (r.passed, r.total, r.error, r.reference) == (5, 5, None, str(ROOT / "solutions" / NAME))
    assert [e.exercise for e in r.exercises] == [1, 2, 3, 4, 5]
    assert r.exercises[0].title == "Shift every score" and r.exercises[0].level == "warm-up"


def test_untouched_exercises_get_zero(graded):
    r = graded["exercise"]
    assert (r.passed, r.total) == (0, 5)
    assert {e.code for e in r.exercises} == {"not-implemented"}
    assert r.exercises[4].message.startswith("[not-implemented] Exercise 5: Vectorised attention that survives")


def test_planted_bug_is_diagnosed_through_an_edited_and_a_deleted_check_cell(graded):
    """Its own check cells would give 4/4 (exercise 5's edited to `pass`, exercise 4's gone): the canonical ones
    find the bug, and the deleted check counts as a failure, not as one exercise fewer."""
    r = graded["planted"]
    assert (r.passed, r.total) == (3, 5)
    failed = [e for e in r.exercises if not e.passed]
    assert [(e.exercise, e.code) for e in failed] == [(4, "check-missing"), (5, "missing-scale")]
    assert failed[0].title == "Read the heatmap: which scaling?" and failed[0].message.startswith(
        "the check cell of exercise 4 (tags 'check' and 'exercise-4') is missing")


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


def test_table(graded):
    text = formats.format_table([graded[n] for n in ("solution", "planted", "misbehaving", "corrupt")])
    lines = text.splitlines()
    assert lines[0].endswith(f"solution_{NAME}: 5/5 exercises, 9/9 points")  # warm-up 1, core 2, challenge 3
    assert lines[1].startswith("  isolation: bwrap: namespaces")  # every report names the isolation used
    assert lines[2] == "  Exercise 1   Shift every score                                    1/1  pass"
    assert f"planted_{NAME}: 3/5 exercises, 4/9 points\n" in text
    assert "  Exercise 5   Vectorised attention that survives an empty row      0/3  FAIL  [missing-scale]" in lines
    assert "  Exercise 4   Read the heatmap: which scaling?                     0/2  FAIL  [check-missing]" in lines
    # under each failure, the hint: the catalogue's description of the code, else the check's message
    failed = "  Exercise 5   Vectorised attention that survives an empty row      0/3  FAIL  [missing-scale]"
    assert lines[lines.index(failed) + 1] == f"{'':15}hint: {CODES['missing-scale']}"
    assert f"{'':15}hint: the check cell of exercise 4 (tags 'check' and 'exercise-4') is missing" in text
    assert f"{'':15}hint: boom" in lines and not any("hint: [" in line for line in lines)
    assert all("hint:" not in after for before, after in zip(lines, lines[1:], strict=False) if before.endswith("pass"))
    assert "misbehaving.ipynb: 1/4 exercises, 1/9 points  (its own check cells: no reference notebook)" in text
    assert lines[-1].startswith("ERROR ") and lines[-1].endswith("corrupt.ipynb: not a valid notebook (NotJSONError: "
                                                                 "Notebook does not appear to be JSON: '{ this is not "
                                                                 "JSON')")


def test_json_and_csv_parse(graded):
    results = [graded[n] for n in ("solution", "planted", "missing")]
    data = json.loads(formats.format_json(results))
    assert [(n["passed"], n["total"], n["error"]) for n in data["notebooks"]] == [(5, 5, None), (3, 5, None),
                                                                                  (0, 0, "no such file")]
    assert data["notebooks"][1]["reference"] == str(ROOT / "solutions" / NAME)
    assert data["notebooks"][1]["isolation"].startswith("bwrap: ")
    assert data["notebooks"][2]["reference"] is None
    assert data["notebooks"][1]["exercises"][4]["code"] == "missing-scale"
    rows = list(csv.DictReader(io.StringIO(formats.format_csv(results))))
    assert len(rows) == 13  # 5 exercises and a total per graded notebook, one error row
    assert rows[10]["exercise"] == "5" and rows[10]["passed"] == "0" and rows[10]["code"] == "missing-scale"
    assert rows[9]["exercise"] == "4" and rows[9]["code"] == "check-missing"
    totals = [(r["notebook"].rsplit("/", 1)[-1], r["passed"], r["message"]) for r in rows if r["exercise"] == "total"]
    assert totals == [(f"solution_{NAME}", "5", "5/5"), (f"planted_{NAME}", "3", "3/5")]
    assert rows[-1]["code"] == "error" and rows[-1]["message"] == "no such file"
    assert all(r["isolation"].startswith("bwrap: ") for r in rows)


def test_command_line(tmp_path, capsys):
    bad = tmp_path / "bad.ipynb"
    bad.write_text("nope", encoding="utf-8")
    assert cli.main([str(bad), str(tmp_path / "gone.ipynb"), "--json"]) == 1  # an ERROR: exit status 1
    data = json.loads(capsys.readouterr().out)
    assert [n["error"].split(" (")[0] for n in data["notebooks"]] == ["not a valid notebook", "no such file"]
    assert cli.main([str(bad), "--csv", "--timeout", "5"]) == 1
    assert capsys.readouterr().out.splitlines()[0] == ("notebook,exercise,title,level,passed,points,max_points,code,"
                                                       "message,isolation")
    assert cli.main([str(tmp_path / "gone.ipynb")]) == 1
    assert capsys.readouterr().out == f"ERROR {tmp_path / 'gone.ipynb'}: no such file\n"
    with pytest.raises(SystemExit):  # never silently weaker: without bubblewrap, only an explicit --isolation=rlimit
        cli.main([str(bad), "--isolation", "none"])
    for usage_error in (["--json", "--csv", str(bad)], ["--solutions", str(tmp_path / "nowhere"), str(bad)],
                        ["--reference", str(tmp_path / "nowhere"), str(bad)],
                        ["--solutions", str(tmp_path), "--no-reference", str(bad)]):
        with pytest.raises(SystemExit) as info:
            cli.main(usage_error)
        assert info.value.code == 2
    assert cli.main([str(bad), "--no-reference", "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["notebooks"][0]["reference"] is None


def _submission(*cells):
    return new_notebook(cells=[new_markdown_cell("# Exercises: Tiny"), *cells],
                        metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}})


def test_reference_notebooks_are_found_by_name(tmp_path):
    refs = tmp_path / "solutions"
    refs.mkdir()
    for name in ("04_masking_exercises.ipynb", "masking_exercises.ipynb", "other.ipynb"):
        (refs / name).write_text("{}", encoding="utf-8")
    find = canonical.find_reference
    assert find("sub/04_masking_exercises.ipynb", refs) == refs / "04_masking_exercises.ipynb"
    assert find("ada_lovelace_04_masking_exercises.ipynb", refs) == refs / "04_masking_exercises.ipynb"  # longest
    assert find("ada-masking_exercises.ipynb", refs) == refs / "masking_exercises.ipynb"
    assert find("ada04_masking_exercises.ipynb", refs) == refs / "masking_exercises.ipynb"  # "_" before "masking"
    assert find("adamasking_exercises.ipynb", refs) is None  # no separator
    assert find("anything.ipynb", refs / "other.ipynb") == refs / "other.ipynb"  # one file: every submission
    assert find(f"x_{NAME}", None) is None



def test_default_reference_is_the_courses_solutions_folder_wherever_the_grader_runs(tmp_path, monkeypatch):
    """The course's own solutions/ (beside the package's src/), never the current folder's: a student's clone
    graded from inside must not supply its own reference."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "solutions").mkdir()
    assert canonical.default_reference() == ROOT / "solutions"
    assert canonical.find_reference(f"x_{NAME}") == ROOT / "solutions" / NAME  # AUTO


def test_canonical_check_sources_replace_the_submissions(tmp_path):
    ref = _submission(new_markdown_cell("## Exercise 1 (warm-up): One"), _tag(new_code_cell("check(1)"), "check",
                                                                                         "exercise-1"),
                      new_markdown_cell("## Exercise 2 (core): Two"), _tag(new_code_cell("check(2)"), "check",
                                                                                "exercise-2"))
    sub = _submission(new_markdown_cell("## Exercise 1 (warm-up): Renamed"), _tag(new_code_cell("pass"), "check"),
                      new_code_cell("x = 1"), _tag(new_code_cell("pass"), "check", "exercise-1"),
                      _tag(new_code_cell("print('mine')"), "check", "exercise-9"))
    plan = canonical.plan(sub, canonical.Reference(Path("ref"), canonical.check_cells(ref), {}, {}))
    assert [(e.number, e.title, e.level, e.indices) for e in plan] == [(1, "One", "warm-up", [2, 4]),
                                                                       (2, "Two", "core", [])]
    assert [c.source for c in sub.cells[2:6]] == ["check(1)", "x = 1", "check(1)", "print('mine')"]
    # a reference that cannot be used stops grading that notebook with an ERROR
    nbformat.write(sub, tmp_path / "sub.ipynb")
    nbformat.write(_submission(), tmp_path / "empty_ref.ipynb")
    r = grade.grade_notebook(tmp_path / "sub.ipynb", reference=tmp_path / "empty_ref.ipynb")
    assert r.error == f"reference notebook {tmp_path / 'empty_ref.ipynb'}: no check cells"
    (tmp_path / "bad_ref.ipynb").write_text("nope", encoding="utf-8")
    assert grade.grade_notebook(tmp_path / "sub.ipynb", reference=tmp_path / "bad_ref.ipynb").error.startswith(
        f"reference notebook {tmp_path / 'bad_ref.ipynb'}: not a valid notebook")
    # every check cell deleted: no kernel is started, every exercise fails with check-missing
    nbformat.write(_submission(new_code_cell("x = 1")), tmp_path / "none_left.ipynb")
    nbformat.write(ref, tmp_path / "ref.ipynb")
    r = grade.grade_notebook(tmp_path / "none_left.ipynb", reference=tmp_path / "ref.ipynb")
    assert [(e.exercise, e.title, e.passed, e.code) for e in r.exercises] == [(1, "One", False, "check-missing"),
                                                                              (2, "Two", False, "check-missing")]


def test_kernel_warnings_are_not_shown(tmp_path, capfd):
    """ipykernel warns on stderr that it runs over TCP without encryption, once per kernel: not the grader's news."""
    path = tmp_path / "tiny.ipynb"
    nbformat.write(_submission(new_markdown_cell("## Exercise 1 (warm-up): One"),
                               _tag(new_code_cell("print('ok')"), "check", "exercise-1")), path)
    assert cli.main([str(path), "--no-reference"]) == 0
    out, err = capfd.readouterr()
    assert out.startswith(f"{path}: 1/1 exercises, 1/1 points")
    assert "WARNING" not in err and "without encryption" not in err, err
