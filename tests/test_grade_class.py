"""The grader for a real class: a folder of submissions graded in one command (points file, partial credit,
feedback, gradebook, resumable), Gradescope's results.json checked against its documented fields, bad input refused
before anything is graded. One class run grades two small notebooks (tests/data/grader: chapter 1's shape, five
exercises) at once; two more files fail before their sandbox starts."""

import csv
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import nbformat
import pytest

from attention_course.course import classroom, exports, sandbox
from attention_course.course.results import ExerciseResult, NotebookResult

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "grader"
NAME = "01_soft_lookup_exercises.ipynb"
POINTS = "[notebooks.01_soft_lookup_exercises]\n1 = { points = 4, hidden_share = 0.25 }\n"
SAVED_CLAIM = "All 5 exercises passed: 12/12 points\n"  # what alice's notebook saved, and the grader never printed
HIDDEN_INPUT = "2000"  # the hidden softmax case that the planted softmax fails: [[0, 1], [2000, 2001]]

# Gradescope's results.json, as its autograder specification documents the fields
# (https://gradescope-autograders.readthedocs.io/en/latest/specs/, "Output format"); nothing else is allowed.
VISIBILITY = {"enum": ["hidden", "after_due_date", "after_published", "visible"]}
FORMAT = {"enum": ["text", "html", "simple_format", "md", "ansi"]}
GRADESCOPE_SCHEMA = {
    "type": "object", "additionalProperties": False, "required": ["score", "tests"],
    "properties": {
        "score": {"type": "number"}, "execution_time": {"type": "number"}, "output": {"type": "string"},
        "output_format": FORMAT, "test_output_format": FORMAT, "test_name_format": FORMAT, "visibility": VISIBILITY,
        "stdout_visibility": VISIBILITY, "extra_data": {"type": "object"}, "leaderboard": {"type": "array"},
        "tests": {"type": "array", "items": {
            "type": "object", "additionalProperties": False, "required": ["name", "score", "max_score", "visibility"],
            "properties": {
                "score": {"type": "number"}, "max_score": {"type": "number"},
                "status": {"enum": ["passed", "failed"]}, "name": {"type": "string"}, "name_format": FORMAT,
                "number": {"type": "string"}, "output": {"type": "string"}, "output_format": FORMAT,
                "tags": {"type": "array", "items": {"type": "string"}}, "visibility": VISIBILITY,
                "extra_data": {"type": "object"}}}}}}


def _planted(path: Path) -> None:
    """The solution with a softmax that subtracts the maximum of the whole array: it passes the public cases and
    fails a hidden one (rows whose maxima are far apart)."""
    nb = nbformat.read(DATA / "solutions" / NAME, as_version=4)
    cell = next(c for c in nb.cells if c.source.startswith("def softmax"))
    cell.source = cell.source.replace("x.max(axis=-1, keepdims=True)", "x.max()")
    # a last cell whose saved output says what the grading run does not print (the review shows the run's)
    nb.cells.append(nbformat.v4.new_code_cell("print('graded run:', 6 * 7)", outputs=[
        nbformat.v4.new_output("stream", name="stdout", text=SAVED_CLAIM)]))
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)


def _class_folder(tmp: Path) -> Path:
    folder = tmp / "submissions"
    _planted(folder / "alice" / NAME)  # a folder per student
    (folder / "bob").mkdir()
    shutil.copy(DATA / "exercises" / NAME, folder / "bob" / NAME)  # as handed out
    (folder / f"carol_1234_5678_{NAME}").write_text("{ not JSON", encoding="utf-8")  # Canvas's flat layout
    (folder / "dave").mkdir()
    shutil.copy(ROOT / "exercises" / "02_single_head_exercises.ipynb", folder / "dave" / NAME)  # another chapter
    (folder / "eve").mkdir()
    (folder / "eve" / NAME).symlink_to(DATA / "solutions" / NAME)  # a link to the solution: refused, not graded
    (folder / "frank").mkdir()
    os.mkfifo(folder / "frank" / NAME)  # a FIFO: refused, never waited on
    return folder


def _grade_class(folder: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    cmd = [sys.executable, "-P", "-m", "attention_course.grade", "class", str(folder), "--out", str(out), "-j", "2",
           "--solutions", str(DATA / "solutions"), "--points", str(folder.parent / "points.toml"), "--timeout", "120",
           *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env, cwd=folder.parent, check=False)


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    assert sandbox.bwrap_works(), "the grader needs bubblewrap here (apt-get install bubblewrap), as CI installs it"
    tmp = tmp_path_factory.mktemp("class")
    (tmp / "points.toml").write_text(POINTS, encoding="utf-8")
    folder = _class_folder(tmp)
    first = _grade_class(folder, tmp / "out")
    again = _grade_class(folder, tmp / "out")
    results = {json.loads(line)["student"]: json.loads(line) for line in (tmp / "out" / "results.jsonl").open()}
    return {"tmp": tmp, "out": tmp / "out", "first": first, "again": again, "results": results}


def test_the_class_is_graded_with_progress_and_a_summary(graded):
    first = graded["first"]
    assert first.returncode == 1, first.stderr[-3000:]  # 1: some notebooks are ERRORs (carol's, dave's, ...)
    assert "6 submissions of 6 students; 0 already graded" in first.stderr
    progress = [line for line in first.stderr.splitlines() if line.startswith("[")]
    assert len(progress) == 6 and all("min left)" in line for line in progress)
    table = first.stdout.splitlines()
    assert table[0].split() == ["student", "01_soft_lookup", "total"]
    assert table[2].split() == ["alice", "11/12", "11/12"] and table[3].split() == ["bob", "0/12", "0/12"]
    assert table[4].split()[:2] == ["carol", "ERROR"] and table[5].split()[:2] == ["dave", "ERROR"]
    assert "isolation: bwrap: namespaces" in first.stdout  # the summary names the isolation
    assert (graded["out"] / "summary.txt").read_text(encoding="utf-8") == first.stdout


def test_public_cases_pass_and_a_hidden_one_fails_gets_exactly_the_points_files_share(graded):
    """Exercise 1 is worth 4 points with a hidden share of 0.25 in the points file: 3 points, named PART."""
    alice = graded["results"]["alice"]
    first = alice["exercises"][0]
    assert (first["passed"], first["public_passed"], first["code"]) == (False, True, "softmax-global-max")
    assert (first["points"], first["max_points"], first["hidden_share"]) == (3.0, 4.0, 0.25)
    assert [e["points"] for e in alice["exercises"]] == [3.0, 1.0, 2.0, 2.0, 3.0]  # warm-up 1, core 2, challenge 3
    assert (alice["score"], alice["max_score"]) == (11.0, 12.0)
    assert all(e["seconds"] is not None for e in alice["exercises"])
    bob = graded["results"]["bob"]
    assert (bob["score"], bob["max_score"]) == (0.0, 12.0) and not any(e["public_passed"] for e in bob["exercises"])


def test_bad_files_get_an_error_and_the_class_goes_on(graded):
    assert graded["results"]["carol"]["error"].startswith("not a valid notebook")
    assert "looks like another chapter's" in graded["results"]["dave"]["error"]
    assert graded["results"]["eve"]["error"].startswith("a symbolic link")
    assert graded["results"]["frank"]["error"].startswith("not a regular file")


def test_gradebook_has_a_row_per_student_and_a_column_per_notebook(graded):
    rows = list(csv.reader(io.StringIO((graded["out"] / "gradebook.csv").read_text(encoding="utf-8"))))
    assert rows == [["student", "id", "email", "01_soft_lookup_exercises", "total", "late", "submitted_at"],
                    ["Points Possible", "", "", "12", "12", "", ""], ["alice", "", "", "11", "11", "", ""],
                    ["bob", "", "", "0", "0", "", ""], ["carol", "1234", "", "0", "0", "", ""],  # Canvas's user id
                    ["dave", "", "", "0", "0", "", ""], ["eve", "", "", "0", "0", "", ""],
                    ["frank", "", "", "0", "0", "", ""]]


def test_feedback_names_points_codes_hints_and_times_never_the_hidden_input(graded):
    folder = graded["out"] / "feedback" / "alice"
    md = (folder / NAME.replace(".ipynb", ".md")).read_text(encoding="utf-8")
    page = (folder / NAME.replace(".ipynb", ".html")).read_text(encoding="utf-8")
    assert "**11 of 12 points**" in md and "| 3/4 | partly |" in md and r"\[softmax-global-max\]" in md
    assert "Graded in isolation: bwrap: namespaces" in md and "<td>partly</td>" in page
    stored = json.loads((graded["out"] / "results" / "alice" / NAME.replace(".ipynb", ".json")).read_text())
    assert HIDDEN_INPUT in stored["result"]["exercises"][0]["message"]  # the instructor's record has it
    assert HIDDEN_INPUT not in md and HIDDEN_INPUT not in page  # the student's feedback does not
    assert " s |" in md.splitlines()[8]  # the time the check took


def test_the_review_notebook_holds_the_grading_runs_outputs_not_the_saved_ones(graded):
    """Alice's review notebook (through the class run's child process): her last cell shows what it printed in the
    sandbox, not the claim she saved; her check cells, run by the grader, show no saved "✓ ... match the
    reference" (exercise 1 failed a hidden case) but the grader's verdict under them."""
    review = nbformat.read(graded["out"] / "review" / "alice" / NAME, as_version=4)
    nbformat.validate(review)
    shown = json.dumps([c.get("outputs", []) for c in review.cells])
    assert SAVED_CLAIM.strip() not in shown and "match the reference" not in shown
    assert review.cells[-1].outputs == [{"output_type": "stream", "name": "stdout", "text": "graded run: 42\n"}]
    check = next(i for i, c in enumerate(review.cells) if "exercise-1" in c.metadata.get("tags", []))
    assert review.cells[check].outputs == []
    assert review.cells[check + 1].source.startswith("Grader, exercise 1: 3/4 points, PART \\[softmax-global-max\\]")
    assert "the outputs the student saved are removed" in review.cells[0].source
    stored = (graded["out"] / "results" / "alice" / NAME.replace(".ipynb", ".json")).read_text(encoding="utf-8")
    assert "graded run" not in stored  # the outputs travel to the review, never into the stored results


def test_a_second_run_grades_nothing_again(graded):
    again = graded["again"]
    assert again.returncode == 1, again.stderr[-2000:]
    assert "6 already graded (kept; --regrade grades them again), 0 to grade" in again.stderr
    assert not [line for line in again.stderr.splitlines() if line.startswith("[")]
    assert again.stdout == graded["first"].stdout


def test_a_changed_submission_is_graded_again(tmp_path):
    store = classroom.Store(tmp_path / "out")
    sub = classroom.Submission("ada", tmp_path / NAME, DATA / "solutions" / NAME)
    sub.path.write_text("{}", encoding="utf-8")
    store.save(sub, classroom._sha256(sub.path), NotebookResult(str(sub.path), error="x"), 1)
    assert store.stored(sub, classroom._sha256(sub.path)).error == "x"
    sub.path.write_text("{ }", encoding="utf-8")
    assert store.stored(sub, classroom._sha256(sub.path)) is None


def test_gradescope_results_follow_the_documented_fields(graded):
    alice = NotebookResult.from_dict(graded["results"]["alice"])
    data = exports.gradescope_results([alice])
    jsonschema.validate(data, GRADESCOPE_SCHEMA)
    assert data["score"] == 11.0
    first = [t for t in data["tests"] if t["name"].startswith("Exercise 1:")]
    assert [(t["score"], t["max_score"], t["visibility"]) for t in first] == [(3.0, 3.0, "visible"),
                                                                              (0.0, 1.0, "after_published")]
    assert "softmax-global-max" in first[1]["output"] and HIDDEN_INPUT not in json.dumps(data)
    assert sum(t["max_score"] for t in data["tests"]) == 12.0 and "Isolation: bwrap" in data["output"]
    broken = NotebookResult.from_dict(graded["results"]["carol"])
    jsonschema.validate(exports.gradescope_results([broken, alice]), GRADESCOPE_SCHEMA)
    jsonschema.validate(exports.gradescope_results([], "No .ipynb file"), GRADESCOPE_SCHEMA)
    with pytest.raises(jsonschema.ValidationError):  # the schema can fail: a visibility Gradescope does not know
        jsonschema.validate({**data, "tests": [{**data["tests"][0], "visibility": "public"}]}, GRADESCOPE_SCHEMA)


def test_report_text_is_escaped_for_each_format():
    hostile = NotebookResult("x.ipynb", isolation="bwrap", exercises=[ExerciseResult(
        1, "<script>alert(1)</script> **bold** [link](http://x) | cell", "core", False, "ValueError",
        "\x1b[31mred\nforged line", False, False, 0.1, 0.0, 2.0)])
    page = exports.feedback_html(hostile)
    assert "<script>" not in page and "&lt;script&gt;" in page and "\x1b" not in page
    md = exports.feedback_markdown(hostile)
    assert "<script>" not in md and r"\*\*bold\*\*" in md and r"\[link\]" in md and r"\| cell" in md
    assert "\x1b" not in md and "forged line" in md and "\nforged line" not in md
    data = exports.gradescope_results([hostile])
    assert "\x1b" not in json.dumps(data, ensure_ascii=False) and "\n" not in data["tests"][0]["output"]


def _usage_error(capsys, *argv) -> str:
    with pytest.raises(SystemExit) as info:
        classroom.main([*map(str, argv), "--solutions", str(DATA / "solutions")])
    assert info.value.code == 2
    return capsys.readouterr().err


def test_bad_class_input_is_refused_before_anything_is_graded(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert "no submissions found" in _usage_error(capsys, tmp_path / "empty", "--out", tmp_path / "o")
    assert "no such folder" in _usage_error(capsys, tmp_path / "nowhere", "--out", tmp_path / "o")
    stray = tmp_path / "stray"
    (stray / "alice").mkdir(parents=True)
    (stray / "alice" / "homework.html").write_text("<html>", encoding="utf-8")
    err = _usage_error(capsys, stray, "--out", tmp_path / "o")  # nothing gradable: stopped, naming each file
    assert "no submissions found" in err and "homework.html: not a notebook (.html)" in err
    (tmp_path / "a_file").write_text("", encoding="utf-8")
    ok = tmp_path / "ok"
    (ok / "alice").mkdir(parents=True)
    shutil.copy(DATA / "exercises" / NAME, ok / "alice" / NAME)
    err = _usage_error(capsys, ok, "--out", tmp_path / "a_file" / "out")
    assert "cannot write there" in err
    (tmp_path / "bad_points.toml").write_text("[notebooks.01_soft_lookup_exercises]\n7 = 1\n", encoding="utf-8")
    err = _usage_error(capsys, ok, "--out", tmp_path / "o2", "--points", tmp_path / "bad_points.toml")
    assert "7: no such exercise" in err
    assert not (tmp_path / "o").exists() and not (tmp_path / "o2" / "results").exists()  # nothing was graded


def test_canvas_and_gradescope_layouts_are_read(tmp_path):
    folder = tmp_path / "download"
    (folder / "submission_77").mkdir(parents=True)
    shutil.copy(DATA / "exercises" / NAME, folder / "submission_77" / NAME)
    (folder / "submission_metadata.yml").write_text(
        "submission_77:\n  :submitters:\n  - :name: Ada Lovelace\n    :email: ada@example.org\n", encoding="utf-8")
    shutil.copy(DATA / "exercises" / NAME, folder / f"turing_LATE_12_34_{NAME.replace('.ipynb', '-1.ipynb')}")
    found, skipped = classroom.find_submissions(folder, DATA / "solutions")
    assert [(s.student, s.notebook) for s in found] == [("Ada Lovelace", "01_soft_lookup_exercises"),
                                                        ("turing", "01_soft_lookup_exercises")] and skipped == []
    two = tmp_path / "two"  # two notebooks of one student, each matched to its own reference
    (two / "alice").mkdir(parents=True)
    for name in ("01_soft_lookup_exercises.ipynb", "02_single_head_exercises.ipynb"):
        shutil.copy(ROOT / "exercises" / name, two / "alice" / name)
    found, _ = classroom.find_submissions(two, ROOT / "solutions")
    assert [(s.student, s.reference.name) for s in found] == [("alice", "01_soft_lookup_exercises.ipynb"),
                                                              ("alice", "02_single_head_exercises.ipynb")]
    assert classroom.safe_name("Ada Lovelace/../x") == "Ada_Lovelace_.._x"


def test_without_bubblewrap_a_class_and_a_gradescope_run_refuse_unless_asked(tmp_path):
    """Never silently weaker: the class command stops (exit 2) and Gradescope's run scores nothing and says why."""
    (tmp_path / "alice").mkdir()
    shutil.copy(DATA / "exercises" / NAME, tmp_path / "alice" / NAME)
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), PATH=str(tmp_path))  # no bwrap on PATH
    base = [sys.executable, "-P", "-m", "attention_course.grade"]
    refused = subprocess.run([*base, "class", str(tmp_path), "--out", str(tmp_path / "out"), "--solutions",
                              str(DATA / "solutions")], capture_output=True, text=True, timeout=300, env=env,
                             cwd=tmp_path, check=False)
    assert refused.returncode == 2 and "bubblewrap is not available" in refused.stderr
    assert not (tmp_path / "out").exists()
    results = tmp_path / "results" / "results.json"
    done = subprocess.run([*base, "gradescope", "--submission", str(tmp_path / "alice"), "--results", str(results),
                           "--solutions", str(DATA / "solutions")], capture_output=True, text=True, timeout=300,
                          env=env, cwd=tmp_path, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    data = json.loads(results.read_text(encoding="utf-8"))
    jsonschema.validate(data, GRADESCOPE_SCHEMA)
    assert data["score"] == 0 and data["tests"] == [] and "bubblewrap cannot run" in data["output"]
