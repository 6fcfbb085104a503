"""The grader through a real term (issue 46): a class folder with mixed, broken and stray files, a points file for one
chapter of several, grader failures that must never become grades, and a grader started without ``-P`` from a
folder holding a student's modules. One class run (two chapters' references: the fixture's chapter 1 and a copy of
it under another chapter's name) serves most tests; the rest call the functions they test."""

import argparse
import csv
import datetime
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from attention_course import _safe_path
from attention_course.course import classroom, cli, exports, gradescope
from attention_course.course.points import Points
from attention_course.course.results import ExerciseResult, NotebookResult

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "grader"
NAME = "01_soft_lookup_exercises.ipynb"
OTHER = "07_copy_exercises.ipynb"  # chapter 1's notebook under another chapter's name: a second reference
POINTS = "[notebooks.01_soft_lookup_exercises]\n1 = 4\n"  # names one chapter only, as the instructor guide's example


def _references(tmp: Path) -> Path:
    refs = tmp / "solutions"
    refs.mkdir(exist_ok=True)
    shutil.copy(DATA / "solutions" / NAME, refs / NAME)
    shutil.copy(DATA / "solutions" / NAME, refs / OTHER)
    return refs


def test_a_points_file_naming_one_chapter_is_valid_for_each_other_chapters_notebook(tmp_path):
    """The child process that grades one submission validates the course's points file against that submission's
    reference alone: another chapter named in the file is not an error there (it was one, and every notebook of
    every other chapter was an ERROR worth 0)."""
    refs = _references(tmp_path)
    (tmp_path / "points.toml").write_text(POINTS, encoding="utf-8")
    parser = argparse.ArgumentParser()
    for reference in (refs, refs / NAME, refs / OTHER):
        points = cli.load_points(parser, argparse.Namespace(points=str(tmp_path / "points.toml"), reference=reference))
        assert points.of(NAME, 1, "warm-up")[0] == 4 and points.of(OTHER, 1, "warm-up")[0] == 1
    (tmp_path / "typo.toml").write_text("[notebooks.01_soft_lookup]\n1 = 4\n", encoding="utf-8")
    with pytest.raises(SystemExit):  # against the whole folder a name that matches nothing is still refused
        cli.load_points(parser, argparse.Namespace(points=str(tmp_path / "typo.toml"), reference=refs))


def _submissions(tmp: Path, students=("alice", "bob")) -> Path:
    folder = tmp / "submissions"
    for student in students:
        (folder / student).mkdir(parents=True, exist_ok=True)
        shutil.copy(DATA / "exercises" / NAME, folder / student / NAME)
    return folder


def _fake_grader(monkeypatch, failing: set[str]) -> list[str]:
    """Replace the per-notebook child process by a stand-in: a grader failure for the students in ``failing``,
    else a graded result of one passed exercise. Returns the list of the students it graded."""
    graded = []

    def fake(path, args):
        student = Path(path).parent.name
        graded.append(student)
        if student in failing:
            return NotebookResult(path, error="the grader's process for this notebook failed (exit 1): MemoryError",
                                  grader_failed=True)
        return NotebookResult(path, [ExerciseResult(1, "Softmax", "warm-up", True)], reference=str(args.reference))

    monkeypatch.setattr(classroom, "_grade_in_child", fake)
    return graded


def test_a_grader_failure_is_never_a_grade_and_one_student_can_be_regraded(tmp_path, monkeypatch, capsys):
    folder, out = _submissions(tmp_path), tmp_path / "out"
    argv = [str(folder), "--out", str(out), "--solutions", str(DATA / "solutions")]
    graded = _fake_grader(monkeypatch, failing={"bob"})
    assert classroom.main(argv) == 1  # an ERROR is counted in the exit status
    assert "ERROR bob" in capsys.readouterr().out and "MemoryError" in (out / "summary.txt").read_text()
    assert (out / "results" / "alice" / f"{Path(NAME).stem}.json").is_file()
    review = nbformat.read(out / "review" / "alice" / NAME, as_version=4)  # kept for a manual review, annotated
    assert review.cells[0].source.startswith("Grader: 1/1 points, 1 of 1 exercises passed")
    check = next(i for i, c in enumerate(review.cells) if "exercise-1" in c.metadata.get("tags", []))
    assert review.cells[check + 1].source == "Grader, exercise 1: 1/1 points, passed"
    assert not (out / "results" / "bob").exists()  # not saved: the next run grades it again
    graded = _fake_grader(monkeypatch, failing=set())
    assert classroom.main(argv) == 0 and graded == ["bob"]
    graded[:] = []
    assert classroom.main([*argv, "--regrade", "alice"]) == 0 and graded == ["alice"]
    graded[:] = []
    assert classroom.main([*argv, "--regrade"]) == 0 and sorted(graded) == ["alice", "bob"]
    with pytest.raises(SystemExit):
        classroom.main([*argv, "--regrade", "carol"])
    assert "--regrade carol: no such student" in capsys.readouterr().err


def test_the_childs_real_error_is_shown_and_counted_in_the_exit_status(tmp_path, capsys):
    args = argparse.Namespace(timeout=0, notebook_timeout=10, memory_mb=1000, isolation="bwrap", reference=None,
                              seed=1)  # a child that refuses its own command line
    result = cli._grade_in_child(str(DATA / "exercises" / NAME), args)
    assert result.grader_failed and "(exit 2)" in result.error and "must be positive" in result.error
    (tmp_path / "folder.ipynb").mkdir()
    (tmp_path / "empty.ipynb").write_text('{"cells": []}', encoding="utf-8")
    assert cli.main([str(tmp_path / "folder.ipynb"), str(tmp_path / "empty.ipynb"), "--no-reference"]) == 1
    out = capsys.readouterr().out
    assert "folder.ipynb: not a regular file (a folder" in out and "empty.ipynb: not a notebook saved by Jupyter" in out


def test_a_notebook_that_could_not_be_graded_is_a_failed_test_worth_its_points():
    failed = NotebookResult("02_x.ipynb", error="the grader's process for this notebook failed (exit 1)",
                            grader_failed=True)
    data = exports.gradescope_results([failed], possible={"02_x.ipynb": 12.0})
    assert [(t["status"], t["score"], t["max_score"]) for t in data["tests"]] == [("failed", 0.0, 12.0)]
    assert gradescope._possible(DATA / "solutions" / NAME, Points()) == 9.0  # 1 + 1 + 2 + 2 + 3 by level
    unknown = exports.gradescope_results([failed])
    assert unknown["tests"][0]["status"] == "failed"


def test_stray_files_are_listed_and_the_rest_of_the_class_is_graded(tmp_path, monkeypatch, capsys):
    """One unmatched file used to stop the whole class; .html, .zip, .py submissions vanished without a word."""
    folder, out = _submissions(tmp_path, ("alice", "bob", "Bob")), tmp_path / "out"
    shutil.copy(DATA / "exercises" / NAME, folder / "alice" / NAME.replace(".ipynb", " (1).ipynb"))  # a 2nd download
    (folder / "carol").mkdir()
    (folder / "carol" / "01_soft_lookup_exercises.html").write_text("<html>", encoding="utf-8")
    (folder / "dave").mkdir()
    (folder / "dave" / NAME).mkdir()  # a folder named like the notebook
    shutil.copy(DATA / "exercises" / NAME, folder / "dave" / "homework.ipynb")  # renamed: no reference matches
    (folder / f"erin_123_456_{NAME.replace('.ipynb', '.zip')}").write_bytes(b"PK")  # Canvas's name, a zip
    (folder / "notes.txt").write_text("", encoding="utf-8")
    graded = _fake_grader(monkeypatch, failing=set())
    assert classroom.main([str(folder), "--out", str(out), "--solutions", str(DATA / "solutions")]) == 1
    assert sorted(graded) == ["Bob", "alice"]  # bob and Bob are one student: the latest copy is graded
    summary = (out / "summary.txt").read_text(encoding="utf-8")
    not_graded = [line for line in summary.splitlines() if line.startswith("NOT GRADED")]
    assert len(not_graded) == 7, summary
    for path, reason in ((f"alice/{NAME}", "an older copy of alice's"), ("carol/01_soft_lookup_exercises.html",
                         "not a notebook (.html)"), (f"dave/{NAME}", "a folder named like a notebook"),
                         ("dave/homework.ipynb", "no reference notebook is named like it"),
                         ("erin_123_456_01_soft_lookup_exercises.zip", "not a notebook (.zip)"),
                         ("notes.txt", "not a submission"), (f"bob/{NAME}", "an older copy of bob's")):
        assert any(f"{folder / path}: {reason}" in line for line in not_graded), (path, not_graded)
    assert "not graded: " in capsys.readouterr().err  # said at the start too
    rows = {row.split(",")[0] for row in (out / "gradebook.csv").read_text(encoding="utf-8").splitlines()}
    assert rows == {"student", "Points Possible", "alice", "Bob", "carol", "dave", "erin"}  # a student whose file
    # was not graded keeps a row; an older copy adds none


STUDENT_MODULE = "import pathlib\npathlib.Path(__file__).with_suffix('.imported').write_text('')\n"


GRADE_COMMAND = Path(sys.executable).parent / "attention-course-grade"  # pyproject.toml's [project.scripts]


@pytest.mark.parametrize("start", [[sys.executable, "-m", "attention_course.grade"],
                                   [sys.executable, "-P", "-m", "attention_course.grade"], [str(GRADE_COMMAND)]],
                         ids=["without-P", "with-P", "installed-command"])
def test_the_grader_imports_nothing_from_the_current_folder_however_it_is_started(tmp_path, start):
    """A student's nbformat.py or ctypes.py in the folder the grader is started from never runs in the grader's
    process (it did, without -P: python -m puts the current folder first on the import path). (Only -P protects
    from an attention_course.py there: python finds the module to run before any of the package's code runs.)"""
    for name in ("nbformat", "ctypes", "numpy", "IPython"):
        (tmp_path / f"{name}.py").write_text(STUDENT_MODULE, encoding="utf-8")
    (tmp_path / "tiny.ipynb").write_text('{"cells": []}', encoding="utf-8")
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    assert Path(start[0]).exists(), f"{start[0]} is missing: reinstall the package (pip install -e .)"
    done = subprocess.run([*start, "tiny.ipynb", "--no-reference"],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env, check=False)
    assert sorted(p.name for p in tmp_path.glob("*.imported")) == [], done.stderr[-2000:]
    assert done.returncode == 1 and done.stdout.startswith("ERROR tiny.ipynb: not a notebook saved by Jupyter"), done
    assert _safe_path.main_module(["python", "-X", "utf8", "-P", "-m", "attention_course.grade"]) == \
        "attention_course.grade"
    assert _safe_path.main_module(["python", "-c", "import x", "-m", "y"]) is None


def test_an_honest_student_is_told_what_to_do(tmp_path):
    """A solved notebook with what honest students do: a failing import of their own (its NameError now names the
    import), a check cell retyped without its tags (graded by its text: it gave 0), a stray error in a cell that is
    no check (listed), and a heading of an older version of the course (said so, naming the exercise)."""
    from attention_course.course import grade, sandbox

    nb = nbformat.read(DATA / "solutions" / NAME, as_version=4)
    nb.cells[13].source = "import not_a_module_of_this_course\n" + nb.cells[13].source  # no causal_mask
    nb.cells[8].metadata["tags"] = []  # exercise 2's check, retyped: its text is the reference's
    nb.cells[9].source = nb.cells[9].source.replace("Scaled dot-product attention, vectorised", "Old title")
    nb.cells.insert(15, nbformat.v4.new_code_cell("1 / 0"))
    nbformat.write(nb, tmp_path / NAME)
    result = grade.grade_notebook(tmp_path / NAME, reference=DATA / "solutions",
                                  limits=sandbox.Limits(cell_s=30, notebook_s=300))
    second, fourth = result.exercises[1], result.exercises[3]
    assert (fourth.passed, fourth.code) == (False, "NameError")
    assert "cell 14 raised ModuleNotFoundError before it: No module named 'not_a_module_of_this_course'" in \
        fourth.message
    assert "cell 14 raised ModuleNotFoundError" in exports.student_hint(fourth)  # what the feedback says
    assert second.passed  # recognised by its text
    assert [e[:2] for e in result.cell_errors] == [[14, "ModuleNotFoundError"], [16, "ZeroDivisionError"]]
    assert result.notes == [f"this notebook is from an older version of the course ({NAME}: exercise 3 is 'Old "
                            "title' here and 'Scaled dot-product attention, vectorised' in the current version): "
                            "download the current exercise notebook and move your answers into it"]
    review = exports.review_notebook(nbformat.read(tmp_path / NAME, as_version=4), result, {2: [8]})
    sources = [c.source for c in review.cells]
    assert sources[sources.index("1 / 0") + 1] == "Grader: this cell raised ZeroDivisionError: division by zero"
    assert sources[sources.index(nb.cells[8].source) + 1].startswith("Grader, exercise 2: 1/1 points, passed")
    feedback = exports.feedback_markdown(result)
    assert "older version of the course" in feedback and "cell 16: ZeroDivisionError: division by zero" in feedback


def test_the_gradebook_imports_as_it_is(tmp_path, monkeypatch):
    """Canvas's user id and late marker, Gradescope's student ids, e-mails and submission time are kept (they were
    dropped); a group submission is one row per member; the points file's late penalty applies to a late notebook;
    exercises.csv has a row per person, a column per exercise and each exercise's statistics."""
    folder, out = tmp_path / "download", tmp_path / "out"
    (folder / "submission_9").mkdir(parents=True)
    shutil.copy(DATA / "exercises" / NAME, folder / "submission_9" / NAME)
    (folder / "submission_metadata.yml").write_text(
        "submission_9:\n  :created_at: 2026-11-20 10:00:00 +0000\n  :submitters:\n"
        "  - :name: Ada Lovelace\n    :sid: '1815'\n    :email: ada@example.org\n"
        "  - :name: Alan Turing\n    :sid: '1912'\n    :email: alan@example.org\n", encoding="utf-8")
    shutil.copy(DATA / "exercises" / NAME, folder / f"hopper_LATE_4242_77_{NAME}")
    (tmp_path / "points.toml").write_text("late_penalty = 0.5\nhidden_visibility = 'visible'\n", encoding="utf-8")
    graded = _fake_grader(monkeypatch, failing=set())
    assert classroom.main([str(folder), "--out", str(out), "--solutions", str(DATA / "solutions"), "--points",
                           str(tmp_path / "points.toml")]) == 0
    assert len(graded) == 2  # one submission of the group, graded once
    rows = (out / "gradebook.csv").read_text(encoding="utf-8").splitlines()
    assert rows[2:] == ["Ada Lovelace,1815,ada@example.org,1,1,,01_soft_lookup_exercises: 2026-11-20 10:00:00 +0000",
                        "Alan Turing,1912,alan@example.org,1,1,,01_soft_lookup_exercises: 2026-11-20 10:00:00 +0000",
                        "hopper,4242,,0.5,0.5,01_soft_lookup_exercises,"]
    notebook = Path(NAME).stem
    assert (out / "canvas.csv").read_text(encoding="utf-8").splitlines() == [
        f"Student,ID,SIS User ID,SIS Login ID,Section,{notebook}", "Points Possible,,,,,1",
        "Ada Lovelace,1815,,,,1", "Alan Turing,1912,,,,1", "hopper,4242,,,,0.5"]
    assert (out / "moodle.csv").read_text(encoding="utf-8").splitlines() == [
        f"Full name,ID number,Email address,{notebook}", "Ada Lovelace,1815,ada@example.org,1",
        "Alan Turing,1912,alan@example.org,1", "hopper,4242,,0.5"]
    assert (out / f"gradescope_{notebook}.csv").read_text(encoding="utf-8").splitlines() == [
        "Name,SID,Email,Total Score", "Ada Lovelace,1815,ada@example.org,1", "Alan Turing,1912,alan@example.org,1",
        "hopper,4242,,0.5"]
    stats = (out / "exercises.csv").read_text(encoding="utf-8").splitlines()
    assert stats[0] == "student,id,01_soft_lookup_exercises:1"
    assert stats[-2:] == ["mean points,,1", "passed (share),,1.00"]
    result = NotebookResult(NAME, [ExerciseResult(1, "x", "core", False, "c", None, True, True, None, 1.0, 2.0, 0.5)])
    visibility = Points.from_dict({"hidden_visibility": "visible"}).hidden_visibility
    assert [t["visibility"] for t in exports.gradescope_results([result], None, None, visibility)["tests"]] == \
        ["visible", "visible"]
    with pytest.raises(ValueError, match="hidden_visibility: expected one of"):
        Points.from_dict({"hidden_visibility": "never"})


def test_a_gradescope_submission_after_the_points_files_due_time_is_late(tmp_path, monkeypatch):
    """Gradescope's export has no late flag of its own, only each submission's time (it was kept and never
    compared): the points file's ``due`` (a date-time with its offset) makes a later submission late, and the
    late penalty applies; one before it, or a time that cannot be read, is not late."""
    folder, out = tmp_path / "download", tmp_path / "out"
    metadata = []
    for key, name, when in [("submission_1", "Early", "2026-11-20 09:59:59 -0800"),
                            ("submission_2", "Late", "2026-11-20 10:00:01.5 -0800"),
                            ("submission_3", "Unreadable", "yesterday")]:
        (folder / key).mkdir(parents=True)
        shutil.copy(DATA / "exercises" / NAME, folder / key / NAME)
        metadata.append(f"{key}:\n  :created_at: {when}\n  :submitters:\n  - :name: {name}\n    :sid: '{key[-1]}'\n")
    (folder / "submission_metadata.yml").write_text("".join(metadata), encoding="utf-8")
    (tmp_path / "points.toml").write_text("late_penalty = 0.5\ndue = 2026-11-20T18:00:00Z\n", encoding="utf-8")
    _fake_grader(monkeypatch, failing=set())
    assert classroom.main([str(folder), "--out", str(out), "--solutions", str(DATA / "solutions"), "--points",
                           str(tmp_path / "points.toml")]) == 0
    rows = {row[0]: row for row in csv.reader((out / "gradebook.csv").open(encoding="utf-8"))}
    assert [rows[name][3:6] for name in ("Early", "Late", "Unreadable")] == \
        [["1", "1", ""], ["0.5", "0.5", Path(NAME).stem], ["1", "1", ""]]
    with pytest.raises(ValueError, match="due: expected a date-time with its offset"):
        Points.from_dict({"due": datetime.datetime(2026, 11, 20, 18)})  # a naive time: which zone?


def test_canvas_columns_carry_the_assignment_id_its_import_matches(tmp_path, monkeypatch, capsys):
    """Canvas's gradebook import matches a column titled ``Assignment Name (ID)`` to that assignment (its own
    export's titles); a bare name creates a new assignment. The id comes from the points file's
    ``[canvas_assignments]`` or ``--canvas-id NOTEBOOK=ID`` (which wins); a malformed one or an unknown notebook
    stops the run before anything is graded."""
    folder, out, refs = _submissions(tmp_path), tmp_path / "out", _references(tmp_path)
    shutil.copy(DATA / "exercises" / NAME, folder / "bob" / OTHER)
    (tmp_path / "points.toml").write_text("[canvas_assignments]\n01_soft_lookup_exercises = 111\n"
                                          "07_copy_exercises = '222'\n", encoding="utf-8")
    _fake_grader(monkeypatch, failing=set())
    argv = [str(folder), "--out", str(out), "--solutions", str(refs), "--points", str(tmp_path / "points.toml")]
    assert classroom.main([*argv, "--canvas-id", "07_copy_exercises.ipynb=98765"]) == 0
    lines = (out / "canvas.csv").read_text(encoding="utf-8").splitlines()
    assert lines[0] == ("Student,ID,SIS User ID,SIS Login ID,Section,01_soft_lookup_exercises (111),"
                        "07_copy_exercises (98765)")
    assert lines[1:] == ["Points Possible,,,,,1,1", "alice,,,,,1,", "bob,,,,,1,1"]
    for bad, message in [("07_copy_exercises=12a", "expected Canvas's assignment id"),
                         ("08_none=5", "no reference notebook '08_none'"), ("07_copy_exercises", "got ''")]:
        with pytest.raises(SystemExit) as info:
            classroom.main([*argv, "--canvas-id", bad])
        assert info.value.code == 2 and message in capsys.readouterr().err
    for table, message in [("01_soft_lookup_exercises = 0", "a positive whole number"),
                           ("01_soft_lookup_exercises = true", "got True"),
                           ("09_missing = 3", "[canvas_assignments] 09_missing: no reference notebook")]:
        (tmp_path / "points.toml").write_text(f"[canvas_assignments]\n{table}\n", encoding="utf-8")
        with pytest.raises(SystemExit):
            classroom.main(argv)
        assert message in capsys.readouterr().err
