"""Exercise notebooks are generated from the solution notebooks: they must be up to date, and the generator
must turn solution regions into stubs, tag check cells and refuse notebooks that break the conventions."""

import shutil
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from attention_course.course import exercises

ROOT = Path(__file__).resolve().parents[1]


def test_exercise_notebooks_are_up_to_date(capsys):
    solutions = sorted((ROOT / "solutions").glob("*.ipynb"))
    assert solutions, "no solution notebooks"
    for solution in solutions:
        problems = exercises.check(solution)
        assert not problems, "\n".join(problems + [f"run: python -m attention_course.exercises {solution}"])
    assert exercises.main(["--check", "--root", str(ROOT)]) == 0
    assert capsys.readouterr().out.count("ok ") == len(solutions)


def test_check_fails_for_an_out_of_date_copy(tmp_path, capsys):
    shutil.copytree(ROOT / "solutions", tmp_path / "solutions")
    shutil.copytree(ROOT / "exercises", tmp_path / "exercises")
    name = "01_soft_lookup_exercises.ipynb"
    assert exercises.main(["--check", "--root", str(tmp_path), name]) == 0
    solution = tmp_path / "solutions" / name
    nb = nbformat.read(solution, as_version=4)
    index = next(i for i, c in enumerate(nb.cells) if "def attend" in c.source)
    nb.cells[index].source = nb.cells[index].source.replace("Attention for one query", "Attention for ONE query")
    nbformat.write(nb, solution)
    capsys.readouterr()
    assert exercises.main(["--check", "--root", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert f"OUT OF DATE {tmp_path / 'exercises' / name}: cell {index}: source differs" in err
    assert "regenerate with: python -m attention_course.exercises" in err
    # a stale tag is found too, and a missing exercise notebook
    exercise = tmp_path / "exercises" / name
    stale = nbformat.read(exercise, as_version=4)
    stale.cells[index + 1].metadata["tags"] = ["check"]
    assert any("tags" in d for d in exercises.differences(stale, nbformat.read(exercise, as_version=4)))
    stale.cells[0].cell_type = "raw"
    stale.cells.append(new_code_cell("extra"))
    diffs = exercises.differences(nbformat.read(exercise, as_version=4), stale)
    assert diffs[:2] == [f"{len(stale.cells)} cells stored, {len(stale.cells) - 1} expected",
                         "cell 0: raw cell stored, markdown expected"]
    exercise.unlink()
    assert exercises.check(solution) == [f"{exercise} does not exist"]


def _nb(*cells):
    nb = new_notebook(cells=list(cells), metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                                  "language": "python"}})
    return nbformat.from_dict(nb)


def _check_cell(n, source="check()"):
    cell = new_code_cell(source)
    cell.metadata["tags"] = ["check", f"exercise-{n}"]
    return cell


TITLE = new_markdown_cell("# Exercises: Tiny\n\nIntro.")


def _tiny():
    return _nb(
        TITLE,
        new_markdown_cell("## Exercise 1 (warm-up): Double it\n\nWrite `double`."),
        new_code_cell('def double(x):\n    """Twice x."""\n    ### BEGIN SOLUTION\n    y = 2 * x\n    return y\n'
                      "    ### END SOLUTION"),
        _check_cell(1, "try:\n    double(1)\nexcept NotImplementedError as err:\n"
                       "    raise AssertionError(f'[not-implemented] {err}') from None\nprint('ok')"),
    )


def test_stub_keeps_signature_and_indentation():
    ex = exercises.Exercise(2, "core", 'A "quoted" title')
    source = (
        "def f(x):\n    ### BEGIN SOLUTION\n    return x\n    ### END SOLUTION\n\n"
        "class C:\n    def g(self):\n        ### BEGIN SOLUTION\n        pass\n        ### END SOLUTION\n"
        "### BEGIN SOLUTION\nanswer = 3\n### END SOLUTION\nprint(answer)\n"
    )
    assert exercises.stub_source(source, ex, "nb") == (
        'def f(x):\n    raise NotImplementedError("Exercise 2: A \\"quoted\\" title")\n\n'
        'class C:\n    def g(self):\n        raise NotImplementedError("Exercise 2: A \\"quoted\\" title")\n'
        'raise NotImplementedError("Exercise 2: A \\"quoted\\" title")\nprint(answer)'
    )


def test_a_long_stub_line_is_split_to_fit_the_code_column():
    title = "Vectorised attention that survives a fully masked row"
    source = "def f(x):\n    ### BEGIN SOLUTION\n    return x\n    ### END SOLUTION\n"
    stub = exercises.stub_source(source, exercises.Exercise(5, "core", title), "nb")
    assert stub == f'def f(x):\n    raise NotImplementedError(\n        "Exercise 5: {title}"\n    )'
    assert max(len(line) for line in stub.splitlines()) <= exercises.CODE_LINE_LENGTH
    short = exercises.stub_source(source, exercises.Exercise(5, "core", "Short"), "nb")
    assert short == 'def f(x):\n    raise NotImplementedError("Exercise 5: Short")'


@pytest.mark.parametrize(
    "source, error",
    [
        ("### BEGIN SOLUTION\n### BEGIN SOLUTION\n### END SOLUTION", "inside another solution region"),
        ("x = 1\n### END SOLUTION", "line 2: ### END SOLUTION without ### BEGIN SOLUTION"),
        ("### BEGIN SOLUTION\nx = 1", "line 1: ### BEGIN SOLUTION without ### END SOLUTION"),
    ],
)
def test_unbalanced_regions_are_refused(source, error):
    with pytest.raises(exercises.ExerciseError, match=error):
        exercises.stub_source(source, exercises.Exercise(1, "core", "t"), "nb")


def test_exercise_version_of_a_tiny_notebook():
    solution = _tiny()
    only = new_markdown_cell("Solution notes")
    only.metadata["tags"] = ["solution-only"]
    solution.cells.insert(1, only)
    solution.cells[-1].outputs = [new_output("stream", name="stdout", text="ok\n")]
    solution.cells[-1].execution_count = 3
    assert exercises.exercises_in(solution) == [exercises.Exercise(1, "warm-up", "Double it")]
    nb = exercises.make_exercise_notebook(solution)
    heading = "## Exercise 1 (warm-up): Double it\n\nWrite `double`."
    assert [c.source for c in nb.cells][:2] == [TITLE.source, heading]
    stub = 'def double(x):\n    """Twice x."""\n    raise NotImplementedError("Exercise 1: Double it")'
    assert nb.cells[2].source == stub
    assert nb.cells[3].metadata["tags"] == ["check", "exercise-1", "raises-exception"]
    assert nb.cells[3].outputs == [] and nb.cells[3].execution_count is None
    assert "BEGIN SOLUTION" in solution.cells[3].source  # the solution notebook is left alone


def _tagged(cell, *tags):
    cell.metadata["tags"] = list(tags)
    return cell


def test_solutions_titled_solutions_give_exercises_titled_exercises():
    """The book shows each title once: "Solutions: Tiny" (solution page), "Exercises: Tiny" (exercise page)."""
    solution = _tiny()
    solution.cells[0] = new_markdown_cell("# Solutions: Tiny\n\nIntro: these exercises go with chapter 1.")
    nb = exercises.make_exercise_notebook(solution)
    assert nb.cells[0].source == "# Exercises: Tiny\n\nIntro: these exercises go with chapter 1."
    assert solution.cells[0].source.startswith("# Solutions: Tiny")  # the source is left alone
    # an older solution notebook titled "Exercises: ..." still generates (its title unchanged)
    assert exercises.make_exercise_notebook(_tiny()).cells[0].source == TITLE.source
    assert exercises.exercise_title("# Tiny") == "# Tiny"


def test_exercise_only_cells_are_shown_to_students_and_hidden_from_the_solution_page():
    solution = _tiny()
    how_to = _tagged(new_markdown_cell("**How to work.** Until you write the code, the check fails."),
                     "exercise-only", "remove-cell")
    setup = _tagged(new_code_cell("x = 1"), "exercise-only", "remove-cell", "hide-input")
    notes = _tagged(new_markdown_cell("Why this solution works."), "solution-only")
    solution.cells[1:1] = [how_to, setup, notes]
    nb = exercises.make_exercise_notebook(solution)
    assert [c.source for c in nb.cells[:3]] == [TITLE.source, how_to.source, "x = 1"]
    assert "tags" not in nb.cells[1].metadata and nb.cells[2].metadata["tags"] == ["hide-input"]
    assert "Why this solution works." not in [c.source for c in nb.cells]
    assert how_to.metadata["tags"] == ["exercise-only", "remove-cell"]  # the source is left alone
    assert exercises.differences(nb, exercises.make_exercise_notebook(solution)) == []


def _broken(kind):
    nb = _tiny()
    if kind == "title":
        nb.cells[0].source = "# Tiny"
    elif kind == "numbering":
        nb.cells[1].source = "## Exercise 2 (warm-up): Double it"
    elif kind == "level":
        nb.cells[1].source = "## Exercise 1 (easy): Double it"
    elif kind == "heading":
        nb.cells[1].source = "## Exercise 1: Double it"
    elif kind == "no-heading":
        del nb.cells[1]
    elif kind == "check-tag":
        nb.cells[3].metadata["tags"] = ["check"]
    elif kind == "no-check":
        del nb.cells[3]
    elif kind == "two-checks":
        nb.cells.append(_check_cell(1))
    elif kind == "region-in-check":
        nb.cells[3].source = "### BEGIN SOLUTION\n### END SOLUTION"
    elif kind == "region-after-check":
        nb.cells.append(new_code_cell("### BEGIN SOLUTION\nx = 1\n### END SOLUTION"))
    elif kind == "no-region":
        nb.cells[2].source = "def double(x):\n    return 2 * x"
    elif kind == "region-first":
        nb.cells.insert(1, new_code_cell("### BEGIN SOLUTION\nx = 1\n### END SOLUTION"))
    elif kind == "check-first":
        nb.cells.insert(1, _check_cell(1))
    elif kind == "no-exercises":
        nb.cells = nb.cells[:1]
    elif kind == "exercise-only-shown":
        nb.cells.insert(1, _tagged(new_markdown_cell("How to work."), "exercise-only"))
    elif kind == "exercise-and-solution-only":
        nb.cells.insert(1, _tagged(new_markdown_cell("?"), "exercise-only", "remove-cell", "solution-only"))
    elif kind == "exercise-only-check":
        nb.cells[3].metadata["tags"] += ["exercise-only", "remove-cell"]
    return nb


@pytest.mark.parametrize(
    "kind, error",
    [
        ("title", "first cell must be a markdown cell starting with '# Solutions: <title>'"),
        ("exercise-only-shown", "tagged 'exercise-only' must also be tagged 'remove-cell'"),
        ("exercise-and-solution-only", "cannot be tagged both 'exercise-only' and 'solution-only'"),
        ("exercise-only-check", "a check cell or a solution region cannot be 'exercise-only'"),
        ("numbering", "exercise 2 should be number 1"),
        ("level", "level 'easy' is not one of warm-up, core, challenge"),
        ("heading", r"exercise heading must read '## Exercise N \(warm-up\|core\|challenge\): title'"),
        ("no-heading", "solution region before the first exercise heading"),
        ("check-tag", "must also be tagged 'exercise-1'"),
        ("no-check", "exercise 1 needs exactly one check cell .* found 0"),
        ("two-checks", "found 2"),
        ("region-in-check", "a check cell must not contain a solution region"),
        ("region-after-check", "solution region after the check cell of exercise 1"),
        ("no-region", "exercise 1 has no ### BEGIN SOLUTION"),
        ("region-first", "solution region before the first exercise heading"),
        ("check-first", "check cell before the first exercise heading"),
        ("no-exercises", "no '## Exercise N"),
    ],
)
def test_broken_solution_notebooks_are_refused(kind, error):
    with pytest.raises(exercises.ExerciseError, match=error):
        exercises.make_exercise_notebook(_broken(kind), "tiny.ipynb")


def test_generate_executes_and_writes(tmp_path, capsys):
    (tmp_path / "solutions").mkdir()
    solution = tmp_path / "solutions" / "tiny.ipynb"
    nbformat.write(_tiny(), solution)
    assert exercises.main(["--root", str(tmp_path), "tiny"]) == 0
    target = tmp_path / "exercises" / "tiny.ipynb"
    assert capsys.readouterr().out == f"wrote {target}\n"
    nb = nbformat.read(target, as_version=4)
    out = nb.cells[3].outputs[0]
    assert (out.output_type, out.ename, out.evalue) == ("error", "AssertionError",
                                                        "[not-implemented] Exercise 1: Double it")
    assert all("execution" not in c.metadata for c in nb.cells)
    assert exercises.check(solution) == []
    # the exercise path resolves to its solution; --no-execute writes without outputs
    assert exercises.main(["--no-execute", str(target)]) == 0
    assert nbformat.read(target, as_version=4).cells[3].outputs == []


def test_generate_refuses_bad_executions(tmp_path, monkeypatch):
    from nbclient.exceptions import CellExecutionError

    (tmp_path / "solutions").mkdir()
    solution = tmp_path / "solutions" / "tiny.ipynb"
    nbformat.write(_tiny(), solution)

    def failing(nb, cwd, timeout=0):
        raise CellExecutionError("traceback", "NameError", "name 'x' is not defined")

    monkeypatch.setattr(exercises, "execute_notebook", failing)
    with pytest.raises(exercises.ExerciseError, match="a cell without the raises-exception tag failed"):
        exercises.generate(solution)

    def passing_check(nb, cwd, timeout=0):
        nb.cells[3].outputs = [new_output("stream", name="stdout", text="/work/main/x.py\n")]
        return nb

    monkeypatch.setattr(exercises, "execute_notebook", passing_check)
    with pytest.raises(exercises.ExerciseError, match=r"should fail with \[not-implemented\].*got no error"):
        exercises.generate(solution)

    def path_in_output(nb, cwd, timeout=0):
        nb.cells[3].outputs = [new_output("error", ename="AssertionError", evalue="[not-implemented] x",
                                          traceback=["File /work/main/src/attention_course/checks.py:3"])]
        return nb

    monkeypatch.setattr(exercises, "execute_notebook", path_in_output)
    with pytest.raises(exercises.ExerciseError, match=r"machine paths \(cell 3: /work/\)"):
        exercises.generate(solution)
    assert exercises.main(["--root", str(tmp_path)]) == 1


def test_unexpected_check_failure_is_reported():
    nb = _tiny()
    nb.cells[3].outputs = [new_output("error", ename="CheckFailed", evalue="[missing-scale] ...", traceback=[])]
    assert exercises.unexpected_check_results(nb) == [
        "cell 3: the check of exercise 1 should fail with [not-implemented] before the student's work, got "
        "CheckFailed: [missing-scale] ..."
    ]


def test_cli_errors(tmp_path, capsys):
    assert exercises.main(["--root", str(tmp_path)]) == 1
    assert "no solution notebooks" in capsys.readouterr().err
    (tmp_path / "solutions").mkdir()
    assert exercises.main(["--root", str(tmp_path), "missing"]) == 1
    assert "no such solution notebook" in capsys.readouterr().err
    nbformat.write(_broken("title"), tmp_path / "solutions" / "bad.ipynb")
    assert exercises.main(["--root", str(tmp_path), "--check"]) == 1
    assert "OUT OF DATE" in capsys.readouterr().err and "first cell must be" in exercises.check(
        tmp_path / "solutions" / "bad.ipynb")[0]
