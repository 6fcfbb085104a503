"""The review notebook holds the grading run's outputs (issue 46): what each cell printed, displayed, drew and
raised in the sandbox, under bubblewrap and under the rlimit fallback, bounded on the way (the sandbox is
untrusted); the outputs the student saved never reach the instructor's review."""

import base64
import dataclasses
import json
import re
from pathlib import Path

import nbformat
import numpy as np
import pytest
from nbformat.v4 import new_code_cell, new_output

from attention_course.course import exports, grade, sandbox, wire
from attention_course.course.results import ExerciseResult, NotebookResult

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "grader"
NAME = "01_soft_lookup_exercises.ipynb"
LIMITS = sandbox.Limits(cell_s=30, notebook_s=300)
SAVED = "every check passed, 5/5\n"  # what the student saved under each cell: the grading run never prints it
CELLS = {  # a source per cell added after the imports, and what the review must show for it
    "prints": "import sys\nprint('mean', np.mean([1, 2, 3]))\nprint('careful', file=sys.stderr)\n6 * 7",
    "draws": "import matplotlib.pyplot as plt\nplt.plot([0, 1], [1, 0]);\nfrom IPython.display import display\n"
             "display('shown')",
    "raises": "[1, 2][5]",
    "floods": "print('x' * 100_000)",
    "descriptors": "import os\nos.write(sys.stdout.fileno(), b'to the descriptor')\nprint(sys.stdout.encoding)",
}


@pytest.fixture(scope="module", params=["bwrap", "rlimit"])
def reviewed(request, tmp_path_factory):
    """The solution with the cells of CELLS after its imports, exercise 4 broken, and SAVED as every code cell's
    saved output; graded, then its review notebook. Graded once per backend for the module: the tests only read
    the result and the review (each grading costs a sandbox and its checks)."""
    tmp_path = tmp_path_factory.mktemp(f"review_{request.param}")
    if request.param == "bwrap":
        assert sandbox.bwrap_works(), "these tests need bubblewrap (apt-get install bubblewrap), as CI installs it"
    nb = nbformat.read(DATA / "solutions" / NAME, as_version=4)
    mask = next(c for c in nb.cells if c.source.startswith("def causal_mask"))
    mask.source += "\n\ncausal_mask = lambda t_q, t_k=None: np.ones((t_q, t_k or t_q), dtype=bool)"
    at = next(i for i, c in enumerate(nb.cells) if "import numpy" in c.source) + 1
    nb.cells[at:at] = [new_code_cell(source) for source in CELLS.values()]
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = [new_output("stream", name="stdout", text=SAVED)]
    nbformat.write(nb, tmp_path / NAME)
    limits = dataclasses.replace(LIMITS, isolation=request.param)
    result = grade.grade_notebook(tmp_path / NAME, reference=DATA / "solutions", limits=limits, seed=1)
    checks = {number: [i for i, c in enumerate(nb.cells) if f"exercise-{number}" in c.metadata.get("tags", [])]
              for number in range(1, 6)}
    review = exports.review_notebook(nbformat.read(tmp_path / NAME, as_version=4), result, checks)
    by_source = {c.source: c for c in review.cells}
    return {"result": result, "review": review, "cells": {k: by_source[v] for k, v in CELLS.items()}}


def test_the_review_shows_what_each_cell_did_in_the_grading_run(reviewed):
    review, cells = reviewed["review"], reviewed["cells"]
    nbformat.validate(review)
    assert SAVED not in json.dumps([c.get("outputs", []) for c in review.cells])
    assert cells["prints"].outputs == [
        {"output_type": "stream", "name": "stdout", "text": "mean 2.0\n"},
        {"output_type": "stream", "name": "stderr", "text": "careful\n"},
        {"output_type": "execute_result", "data": {"text/plain": "42"}, "metadata": {}, "execution_count": None}]
    shown, figure = cells["draws"].outputs
    assert shown.data == {"text/plain": "'shown'"}
    assert base64.b64decode(figure.data["image/png"]).startswith(b"\x89PNG\r\n\x1a\n")  # the figure it left open
    (error,) = cells["raises"].outputs
    assert (error.output_type, error.ename, error.evalue) == ("error", "IndexError", "list index out of range")
    assert "[1, 2][5]" in re.sub(r"\x1b\[[0-9;]*m", "", "".join(error.traceback))  # its colours taken off
    assert cells["descriptors"].outputs == [{"output_type": "stream", "name": "stdout", "text": "utf-8\n"}]
    text, marker = cells["floods"].outputs
    assert text.text == "x" * wire.MAX_CELL_TEXT and marker.text == wire.TRUNCATED.format(limit=wire.MAX_CELL_TEXT)


def test_a_check_cell_shows_the_graders_verdict_not_its_saved_output(reviewed):
    review, result = reviewed["review"], reviewed["result"]
    assert [e.passed for e in result.exercises] == [True, True, True, False, True]
    check = next(i for i, c in enumerate(review.cells) if "exercise-4" in c.metadata.get("tags", []))
    assert review.cells[check].outputs == [] and review.cells[check].execution_count is None
    assert review.cells[check + 1].source.startswith(r"Grader, exercise 4: 0/2 points, FAIL \[")
    assert all(c.execution_count is None for c in review.cells if c.cell_type == "code")


def test_outputs_travel_from_the_graders_child_process_and_are_never_stored():
    result = NotebookResult("x.ipynb", outputs={"3": [{"output_type": "stream", "name": "stdout", "text": "hi\n"}]})
    assert NotebookResult.from_dict(json.loads(json.dumps(result.as_dict(outputs=True)))).outputs == result.outputs
    assert "outputs" not in result.as_dict()  # results/*.json, results.jsonl, --json: the grade, not the outputs


def _report(cells) -> dict:
    return {wire.OUTPUTS: np.frombuffer(json.dumps(cells).encode(), dtype=np.uint8)}


def test_what_the_sandbox_sends_as_outputs_is_bounded_and_checked():
    """Outputs come from the submission's process: only the output types and fields of a notebook, text/plain and
    base64 PNG only, each cell's text cut with a marker, images bounded, the notebook's total bounded."""
    png = base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(30)).decode()
    hostile = [
        {"output_type": "display_data", "data": {"text/html": "<script>alert(1)</script>", "text/plain": "p",
                                                 "image/png": png}, "metadata": {"x": 1}},
        {"output_type": "display_data", "data": {"image/png": "<not base64>"}},
        {"output_type": "stream", "name": "/dev/tty", "text": ["a", "b"]},
        {"output_type": "update_display_data", "data": {}}, "not a dict", None,
        {"output_type": "error", "ename": "E" * 500, "evalue": 3, "traceback": "not a list"},
        {"output_type": "stream", "name": "stdout", "text": "y" * (wire.MAX_CELL_TEXT + 10)},
        {"output_type": "stream", "name": "stdout", "text": "after the cut"}]
    cleaned = wire.clean_outputs(hostile)
    nbformat.validate(nbformat.v4.new_notebook(cells=[new_code_cell(outputs=[new_output(**o) for o in cleaned])]))
    assert cleaned[0]["data"] == {"text/plain": "p", "image/png": png} and cleaned[0]["metadata"] == {}
    assert cleaned[1]["data"] == {"text/plain": "\n[an image left out by the grader: over its size limit]"}
    assert cleaned[2] == {"output_type": "stream", "name": "stdout", "text": "ab"}
    assert cleaned[3] == {"output_type": "error", "ename": "E" * 200, "evalue": "", "traceback": []}
    counted = 1 + len(cleaned[1]["data"]["text/plain"]) + 2 + 200  # the texts before the flood
    assert len(cleaned[4]["text"]) + counted == wire.MAX_CELL_TEXT and cleaned[5]["text"].startswith("\n[... cut")
    assert len(cleaned) == 6 and wire.clean_outputs(cleaned) == cleaned  # cleaned again (the grader's side): same
    images = [{"output_type": "display_data", "data": {"image/png": png}}] * (wire.MAX_IMAGES + 2)
    assert sum("image/png" in o["data"] for o in wire.clean_outputs(images)) == wire.MAX_IMAGES
    big = base64.b64encode(bytes(wire.MAX_IMAGE_CHARS)).decode()
    assert "image/png" not in wire.clean_outputs([{"output_type": "display_data", "data": {"image/png": big}}])[0]
    flood = [{"key": str(i), "outputs": [{"output_type": "stream", "name": "stdout", "text": "z" * wire.MAX_CELL_TEXT}]}
             for i in range(wire.MAX_OUTPUT_CHARS // wire.MAX_CELL_TEXT + 50)]
    found = wire.outputs_of(_report(flood))
    assert sum(map(wire.output_chars, found.values())) < wire.MAX_OUTPUT_CHARS + wire.MAX_CELL_TEXT
    assert len(found) < len(flood)
    assert wire.outputs_of({wire.OUTPUTS: np.frombuffer(b"{not json", dtype=np.uint8)}) == {}
    assert wire.outputs_of(_report({"1": []})) == {} and wire.outputs_of(_report([{"key": "../1"}])) == {}


def test_the_guide_states_the_limits_the_wire_keeps():
    guide = (ROOT / "book" / "instructor_guide.md").read_text(encoding="utf-8")
    assert f"cut at {wire.MAX_CELL_TEXT:,} characters" in guide and f"at most {wire.MAX_IMAGES} images" in guide
    assert f"{wire.MAX_OUTPUT_CHARS // 10**6} million characters per notebook" in guide
    assert f"about {wire.MAX_IMAGE_CHARS * 3 // 4 // 1000} kB" in guide


def _class(tmp: Path) -> tuple[Path, list[str]]:
    folder = tmp / "submissions" / "alice"
    folder.mkdir(parents=True)
    nb = nbformat.read(DATA / "solutions" / NAME, as_version=4)
    nb.cells[0].source += "\n\n<img src='http://127.0.0.1:9/tracker.png'><script>document.title = 'ran'</script>"
    nbformat.write(nb, folder / NAME)
    return tmp / "out", [str(folder.parent), "--out", str(tmp / "out"), "--solutions", str(DATA / "solutions")]


def test_review_pdfs_are_printed_offline_with_scripts_off(tmp_path, monkeypatch, capsys):
    """``--review-pdf``: each review notebook printed by the system's Chromium, every request the student's page
    makes refused (here its tracking image); the graded run's outputs come from a stand-in for the grader."""
    from attention_course.course import classroom, review_pdf

    if review_pdf.converter_problem():
        pytest.skip(f"no PDF converter here: {review_pdf.converter_problem()}")
    out, argv = _class(tmp_path)
    outputs = {"2": [{"output_type": "stream", "name": "stdout", "text": "from the run\n"}]}
    monkeypatch.setattr(classroom, "_grade_in_child", lambda path, args: NotebookResult(
        path, [ExerciseResult(1, "Softmax", "warm-up", True)], reference=str(args.reference), outputs=outputs))
    refused = []
    monkeypatch.setattr(review_pdf, "_refuse", lambda route: (refused.append(route.request.url), route.abort()))
    assert classroom.main([*argv, "--review-pdf"]) == 0, capsys.readouterr().err
    pdf = out / "review" / "alice" / NAME.replace(".ipynb", ".pdf")
    assert pdf.read_bytes().startswith(b"%PDF-") and "review PDF not written" not in capsys.readouterr().err
    assert "http://127.0.0.1:9/tracker.png" in refused


def test_without_a_converter_review_pdfs_are_refused_before_grading(tmp_path, monkeypatch, capsys):
    from attention_course.course import classroom, review_pdf

    _, argv = _class(tmp_path)
    monkeypatch.setattr(review_pdf.shutil, "which", lambda name: None)
    monkeypatch.setattr(classroom, "_grade_in_child", lambda *a: pytest.fail("graded without a converter"))
    with pytest.raises(SystemExit) as info:
        classroom.main([*argv, "--review-pdf"])
    assert info.value.code == 2 and "--review-pdf: no chromium on PATH" in capsys.readouterr().err
