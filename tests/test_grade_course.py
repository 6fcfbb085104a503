"""The grader on the course, as an instructor runs it before a deadline: every solution notebook gets full marks and
every exercise notebook as handed out gets none, in one parallel batch with the hidden cases on. The module exercises
(chapters 2, 3, 6, 7, 11 and the capstone) are judged by reference from the grader's process, so this also proves
that their checks work through the sandbox's wire.

The routine run (`make test`) grades one chapter of each kind (ROUTINE): module exercises judged by reference (2),
Keras layers and TensorFlow tensors across the wire (6) and capstone 1's cached RoPE module (capstone1); function
exercises with number and choice questions (chapter 1's solution and exercise notebooks, the same two files) are graded
in tests/test_grade.py's module run, so not twice. The checkers are also run on right and planted wrong answers
in-process by tests/test_checks_*.py. `COURSE_GRADE_ALL=1` (or `make grade-course`) grades every chapter: run it
after adding or changing an exercise notebook or a checker (all 30 notebooks took 166 s in `make test` on an idle
2-core machine; the routine run grades 6 of them)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from attention_course.course import sandbox

ROOT = Path(__file__).resolve().parents[1]
ROUTINE = ("02", "06", "capstone1")  # chapter 1: tests/test_grade.py
GRADE_ALL = os.environ.get("COURSE_GRADE_ALL") == "1"
SOLUTIONS = [path for path in sorted((ROOT / "solutions").glob("*.ipynb"))
             if GRADE_ALL or path.name.split("_")[0] in ROUTINE]


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    # the grader's default isolation; without bubblewrap it refuses (exit 2) unless given --isolation=rlimit
    assert sandbox.bwrap_works(), "the grader needs bubblewrap here (apt-get install bubblewrap), as CI installs it"
    tmp = tmp_path_factory.mktemp("course")
    for path in SOLUTIONS:
        shutil.copy(path, tmp / f"solved_{path.name}")
        shutil.copy(ROOT / "exercises" / path.name, tmp / f"handed_out_{path.name}")
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    # generous time limits: in CI this batch shares two cores with the other tests
    args = ["--jsonl", "-j", "2", "--seed", "2026", "--timeout", "300", "--notebook-timeout", "900",
            "--solutions", str(ROOT / "solutions"), *map(str, sorted(tmp.glob("*.ipynb")))]
    done = subprocess.run([sys.executable, "-m", "attention_course.grade", *args], capture_output=True, text=True,
                          timeout=1500, env=env, cwd=ROOT, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return {Path(r["notebook"]).name: r for r in map(json.loads, done.stdout.splitlines())}


@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.name.split("_")[0])
def test_every_solution_gets_full_marks(graded, path):
    result = graded[f"solved_{path.name}"]
    failed = [(e["exercise"], e["code"], e["message"]) for e in result["exercises"] if not e["passed"]]
    assert result["error"] is None and failed == [] and result["passed"] == result["total"] > 0


@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.name.split("_")[0])
def test_every_exercise_notebook_as_handed_out_gets_none(graded, path):
    result = graded[f"handed_out_{path.name}"]
    assert result["error"] is None and result["passed"] == 0 and result["total"] > 0
