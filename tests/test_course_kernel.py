"""attention_course.course.kernel: one kernel environment and one notebook runner for tools, generator, grader."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from nbclient.exceptions import CellExecutionError
from nbformat.v4 import new_code_cell, new_notebook

from attention_course.course import kernel

ROOT = Path(__file__).resolve().parents[1]


def test_makefile_exports_the_kernel_environment():
    exports = dict(re.findall(r"^export (\w+) := (\S+)$", (ROOT / "Makefile").read_text(), flags=re.MULTILINE))
    expected = {k: v for k, v in kernel.KERNEL_ENV.items() if k != "MPLBACKEND"}  # ipykernel plots inline anyway
    assert {k: v for k, v in exports.items() if k != "PATH"} == expected


def test_use_kernel_environment_keeps_values_already_set(monkeypatch):
    for key in kernel.KERNEL_ENV:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("PYTHONHASHSEED", "7")
    kernel.use_kernel_environment()
    assert os.environ["PYTHONHASHSEED"] == "7"
    assert all(os.environ[k] == v for k, v in kernel.KERNEL_ENV.items() if k != "PYTHONHASHSEED")


def test_execute_notebook(tmp_path):
    (tmp_path / "data.txt").write_text("here", encoding="utf-8")
    nb = new_notebook(cells=[
        new_code_cell("import os\nprint(open('data.txt').read(), os.environ['TF_ENABLE_ONEDNN_OPTS'])"),
        new_code_cell("raise ValueError('planned')", metadata={"tags": ["raises-exception"]}),
        new_code_cell("import time\ntime.sleep(30)"),
        new_code_cell("print('after')"),
    ])
    kernel.execute_notebook(nb, tmp_path, timeout=3, allow_errors=True, interrupt_on_timeout=True)
    assert nb.cells[0].outputs[0]["text"] == "here 0\n"  # runs in cwd, with the kernel environment
    assert nb.cells[1].outputs[0]["ename"] == "ValueError"
    assert nb.cells[2].outputs[0]["ename"] == "KeyboardInterrupt"  # interrupted at the time limit, run goes on
    assert nb.cells[3].outputs[0]["text"] == "after\n"
    assert not any("execution" in cell.metadata for cell in nb.cells)  # no timestamps to diff


def test_execute_notebook_stops_at_an_unexpected_error(tmp_path):
    nb = new_notebook(cells=[new_code_cell("1 / 0"), new_code_cell("print('never')")])
    with pytest.raises(CellExecutionError, match="ZeroDivisionError"):
        kernel.execute_notebook(nb, tmp_path)
    assert nb.cells[1].outputs == [] and not any("execution" in cell.metadata for cell in nb.cells)


@pytest.mark.parametrize("command", ["grade", "exercises"])
def test_entry_modules(command):
    env = os.environ | {"PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run([sys.executable, "-m", f"attention_course.{command}", "--help"], capture_output=True,
                          text=True, env=env, timeout=120, check=False)
    assert done.returncode == 0 and f"usage: python -m attention_course.{command}" in done.stdout


def test_entry_modules_are_the_course_commands():
    from attention_course import exercises, grade
    from attention_course.course import cli as course_cli
    from attention_course.course import exercises as course_exercises

    assert grade.main is course_cli.main and exercises.main is course_exercises.main
