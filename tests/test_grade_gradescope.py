"""Gradescope's autograder bundle: built by one command, its run_autograder run on a solution and on an exercise
notebook in a temporary folder laid out as Gradescope lays out /autograder (source, submission, results), with the
bundled package; results.json checked against the documented fields. The solution carries a probe: were the
reference notebooks, the points file or the hidden cases' seed readable by the student's code, its softmax would
raise and it would not get full marks."""

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import jsonschema
import nbformat
import pytest
from nbformat.v4 import new_code_cell

from attention_course.course import sandbox
from test_grade_class import DATA, GRADESCOPE_SCHEMA, NAME, POINTS, ROOT

PROBE = """import glob
import os

LEAKS = []
for pattern in ("{root}/source/solutions/*", "{root}/source/points.toml", "{root}/**/*.ipynb",
                "/autograder/source/solutions/*"):
    for path in glob.glob(pattern, recursive=True):
        try:
            with open(path, "rb") as f:
                LEAKS.append((path, f.read(1)))
        except OSError:
            pass
LEAKS += [key for key in os.environ if key.startswith("ATTENTION_GRADE")]"""


def _probing_solution(root: Path) -> nbformat.NotebookNode:
    nb = nbformat.read(DATA / "solutions" / NAME, as_version=4)
    at = next(i for i, c in enumerate(nb.cells) if c.source.startswith("import numpy"))
    nb.cells.insert(at + 1, new_code_cell(PROBE.format(root=root)))
    cell = next(c for c in nb.cells if c.source.startswith("def softmax"))
    cell.source = cell.source.replace('    ### BEGIN SOLUTION\n', '    ### BEGIN SOLUTION\n'
                                      '    if LEAKS:\n        raise RuntimeError(f"read {LEAKS}")\n')
    return nb


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return {**env, **extra}


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    assert sandbox.bwrap_works(), "the grader needs bubblewrap here (apt-get install bubblewrap), as CI installs it"
    tmp = tmp_path_factory.mktemp("gradescope")
    (tmp / "points.toml").write_text(POINTS, encoding="utf-8")
    cmd = [sys.executable, "-P", "-m", "attention_course.grade", "bundle", "--out", str(tmp / "bundle"),
           "--solutions", str(DATA / "solutions"), "--points", str(tmp / "points.toml")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp, check=False,
                          env=_env(PYTHONPATH=str(ROOT / "src")))
    assert done.returncode == 0, done.stderr[-2000:]
    return tmp / "bundle"


def _layout(bundle: Path, root: Path, notebook: nbformat.NotebookNode | None) -> subprocess.Popen:
    """Lay out ``root`` as Gradescope lays out /autograder and start run_autograder there."""
    shutil.copytree(bundle, root / "source", ignore=shutil.ignore_patterns("autograder.zip"))
    shutil.copy(bundle / "run_autograder", root / "run_autograder")
    (root / "submission").mkdir()
    (root / "results").mkdir()
    if notebook is not None:
        nbformat.write(notebook, root / "submission" / NAME)
    return subprocess.Popen([str(root / "run_autograder")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=root, env=_env(AUTOGRADER_ROOT=str(root), AUTOGRADER_PYTHON=sys.executable))


@pytest.fixture(scope="module")
def autograded(bundle, tmp_path_factory):
    """results.json of three submissions, run at once: the probing solution, the exercise notebook, nothing."""
    roots = {name: tmp_path_factory.mktemp(name) / "autograder" for name in ("solution", "exercise", "empty")}
    notebooks = {"solution": _probing_solution(roots["solution"]),
                 "exercise": nbformat.read(DATA / "exercises" / NAME, as_version=4), "empty": None}
    runs = {name: _layout(bundle, roots[name], notebooks[name]) for name in roots}
    found = {}
    for name, run in runs.items():
        _, err = run.communicate(timeout=900)
        assert run.returncode == 0, err[-3000:]
        data = json.loads((roots[name] / "results" / "results.json").read_text(encoding="utf-8"))
        jsonschema.validate(data, GRADESCOPE_SCHEMA)
        found[name] = (roots[name], data)
    return found


def test_bundle_holds_what_gradescope_needs(bundle):
    with zipfile.ZipFile(bundle / "autograder.zip") as z:
        names = set(z.namelist())
        modes = {i.filename: (i.external_attr >> 16) & 0o777 for i in z.infolist()}
    assert {"setup.sh", "run_autograder", f"solutions/{NAME}", "points.toml", "course/requirements.txt",
            "course/src/attention_course/course/cli.py"} <= names  # at the zip's root, as Gradescope wants
    assert modes["run_autograder"] == 0o755 and modes["setup.sh"] == 0o755
    assert not any("__pycache__" in n for n in names)
    assert modes["check_image.sh"] == 0o755
    for script in ("setup.sh", "run_autograder", "check_image.sh"):
        assert subprocess.run(["bash", "-n", str(bundle / script)], check=False).returncode == 0
    setup = (bundle / "setup.sh").read_text(encoding="utf-8")
    assert "bubblewrap" in setup and 'chmod -R go-rwx "$SOURCE/solutions"' in setup
    assert "--isolation bwrap" in (bundle / "run_autograder").read_text(encoding="utf-8")


def test_run_autograder_grades_a_solution_and_reads_nothing_it_must_not(autograded):
    root, data = autograded["solution"]
    assert data["score"] == 12.0, data  # the points file: exercise 1 worth 4
    assert all(t["score"] == t["max_score"] for t in data["tests"]), data["tests"]
    assert [t["visibility"] for t in data["tests"]] == ["visible", "after_published"] * 5  # all have hidden cases
    assert "Isolation: bwrap: namespaces" in data["output"]
    probe = {}
    exec(PROBE.format(root=root), probe)  # the probe can fail: outside the sandbox it reads them
    assert {f"{root}/source/solutions/{NAME}", f"{root}/source/points.toml"} <= {p for p, _ in probe["LEAKS"]}


def test_the_image_is_checked_when_it_is_built_and_fails_loudly(bundle, tmp_path):
    """setup.sh runs check_image.sh: Python >= 3.11 and pip >= 23 before the installs, then a reference notebook
    graded as a submission under the bundle's isolation (here: this machine's Python and bubblewrap)."""
    setup = (bundle / "setup.sh").read_text(encoding="utf-8")
    assert setup.index("check_image.sh\" python") < setup.index("pip install") < setup.index("check_image.sh\" sandbox")

    def check(step, python=sys.executable, **env):
        return subprocess.run(["bash", str(bundle / "check_image.sh"), step], capture_output=True, text=True,
                              timeout=600, check=False, env=_env(AUTOGRADER_SOURCE=str(bundle),
                                                                 AUTOGRADER_PYTHON=python, **env))

    assert check("python").returncode == 0
    old = tmp_path / "python3.10"
    old.write_text("#!/bin/sh\n[ \"$1\" = -V ] && echo 'Python 3.10.12'\nexit 1\n", encoding="utf-8")
    old.chmod(0o755)
    refused = check("python", str(old))
    assert refused.returncode == 1 and "AUTOGRADER SETUP FAILED: the grader needs Python >= 3.11; this image has " \
        "Python 3.10.12" in refused.stderr
    done = check("sandbox")
    assert done.returncode == 0 and "5/5 exercises" in done.stdout, done.stderr[-2000:]
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "bwrap").write_text("#!/bin/sh\nexit 1\n", encoding="utf-8")  # a bwrap that cannot run
    (tmp_path / "bin" / "bwrap").chmod(0o755)
    broken = check("sandbox", PATH=f"{tmp_path / 'bin'}:{os.environ['PATH']}")  # the build fails, saying why
    assert broken.returncode == 1 and "AUTOGRADER SETUP FAILED" in broken.stderr and "--isolation=rlimit" in \
        broken.stderr


def test_run_autograder_logs_the_seed_for_the_instructor(autograded):
    data = autograded["exercise"][1]
    assert isinstance(data["extra_data"]["seed"], int) and str(data["extra_data"]["seed"]) not in data["output"]


def test_run_autograder_gives_an_exercise_notebook_nothing(autograded):
    data = autograded["exercise"][1]
    assert data["score"] == 0 and len(data["tests"]) == 10
    assert all("not-implemented" in t["output"] or "Not counted" in t["output"] for t in data["tests"])


def test_run_autograder_without_a_notebook_still_writes_results(autograded):
    data = autograded["empty"][1]
    assert data["score"] == 0 and data["tests"] == [] and "No .ipynb file" in data["output"]


def test_bundle_built_in_process_holds_the_same_files(bundle, tmp_path, capsys):
    """The bundle command's own function (run here, not in a child process) writes the same files, and refuses a
    reference notebook that does not exist, naming it."""
    from attention_course.course import gradescope

    (tmp_path / "points.toml").write_text(POINTS, encoding="utf-8")
    assert gradescope.main_bundle(["--out", str(tmp_path / "b"), "--solutions", str(DATA / "solutions"),
                                   "--points", str(tmp_path / "points.toml")]) == 0
    assert "autograder.zip" in capsys.readouterr().out

    def files(folder):
        return sorted(str(p.relative_to(folder)) for p in folder.rglob("*")
                      if p.is_file() and "__pycache__" not in p.parts)

    assert files(tmp_path / "b") == files(bundle)
    with pytest.raises(SystemExit):
        gradescope.main_bundle(["--out", str(tmp_path / "c"), "--solutions", str(DATA / "solutions"),
                                "--notebooks", "99_nothing_exercises"])
    assert "99_nothing_exercises" in capsys.readouterr().err
