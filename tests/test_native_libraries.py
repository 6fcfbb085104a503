"""Triton and TensorFlow in one process: importing the course's package first makes the order safe."""

import subprocess
import sys

import pytest

from attention_course.native_libraries import load_triton_library

pytest.importorskip("triton")
pytest.importorskip("tensorflow")

PROGRAM = "import attention_course, tensorflow, torch._dynamo, triton.language as tl; print(type(tl.sum).__name__)"


def test_triton_library_is_found():
    assert load_triton_library() is True


def test_tensorflow_then_triton_after_the_package():
    """Without the package first, TensorFlow then Triton aborts the interpreter (LLVM options registered twice)."""
    env = {"TF_CPP_MIN_LOG_LEVEL": "3", "TF_ENABLE_ONEDNN_OPTS": "0", "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() in ("JITFunction", "InterpretedFunction")


def test_the_course_processes_skip_the_iri_grammar():
    """nbformat's schema uses no "iri" string format: a grading, kernel or generator process does not pay the second
    of CPU that rfc3987_syntax spends building its grammar when jsonschema imports it; notebooks still validate."""
    code = ("import sys, attention_course.course, nbformat\n"
            "nbformat.validate(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell('1')]))\n"
            "print(sys.modules.get('rfc3987_syntax', 'not imported'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "None"


def test_the_graders_processes_import_no_torch():
    """The grader's command line, its per-notebook process and the sandbox worker import torch only when a notebook
    needs it (about 1.5 s of CPU each time): the package and its checks load their modules when first used."""
    program = ("import sys, attention_course.course.cli, attention_course.course.worker, attention_course.checks; "
               "print('torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "False"


def test_every_lazy_name_resolves_and_is_exported():
    import attention_course
    from attention_course import checks

    for package in (attention_course, checks):
        assert set(package._LAZY) | ({"CODES"} if package is checks else set()) == set(package.__all__)
        assert all(callable(getattr(package, name)) or name == "DEFAULT_TIMEOUT" for name in package._LAZY)
        assert set(package.__all__) <= set(dir(package))
    with pytest.raises(AttributeError, match="no attribute 'check_nothing'"):
        checks.check_nothing  # noqa: B018
