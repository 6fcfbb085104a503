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
