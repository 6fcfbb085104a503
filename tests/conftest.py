"""Shared fixtures. `assert_matches_reference` is THE parity check of the suite (also used by test_bug_classes)."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from attention_course import numpy_ref

# The parametrized tests whose first case has run in this process (see `cover_first_case`)
_TRACED_FUNCTIONS: set[str] = set()


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "cover_first_case: coverage traces the test's first parametrized case only; the others run the same library "
        "lines through code that tracing slows several times (TorchDynamo, Triton's interpreter, FlexAttention's "
        "eager path), so they run untraced, as under no_cover",
    )


def _untraced(item) -> bool:
    if item.get_closest_marker("no_cover") is not None:
        return True
    if item.get_closest_marker("cover_first_case") is None:
        return False
    function = f"{item.path}::{item.originalname}"
    seen = function in _TRACED_FUNCTIONS
    _TRACED_FUNCTIONS.add(function)
    return seen


@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_runtest_call(item):
    """pytest-cov's `no_cover` marker (and `cover_first_case`), made to hold under pytest-xdist as well.

    In an xdist worker pytest-cov runs two coverage collectors, one on top of the other (it starts one when it reads
    `-n`, and the worker's own). Its pause stops the top one, and coverage then resumes the one below: the test stays
    traced (tests/test_triton_attention.py's gpu_check test took 16.3 s under `-n 1 --cov`, 7.8 s with `--cov`
    alone, 2026-11-28). This wrapper runs inside pytest-cov's and takes the trace function away for the call.
    """
    if not _untraced(item):
        return (yield)
    tracer = sys.gettrace()
    sys.settrace(None)
    try:
        return (yield)
    finally:
        sys.settrace(tracer)


# Notebooks kept as test data (the grader's frozen chapter-1 exercises) are inputs, not notebooks for nbval to run.
collect_ignore_glob = ["data/*"]


def _assert_matches_reference(
    module, params, num_heads, query, key=None, value=None, mask=None, is_causal=False, atol=1e-10
):
    """Load `params` into `module` and compare its float64 eval-mode output and weights with numpy_ref.

    query/key/value are float64 arrays (B, T, features); mask a boolean array broadcastable to
    (B, H, Tq, Tk), True = may attend. `module` needs load_numpy_params and our forward signature.
    """
    key = query if key is None else key
    value = key if value is None else value
    module = module.double().eval()
    module.load_numpy_params(params)
    torch_mask = None if mask is None else torch.from_numpy(np.asarray(mask))
    inputs = (torch.from_numpy(np.asarray(x, dtype=np.float64)) for x in (query, key, value))
    with torch.no_grad():
        out, weights = module(*inputs, mask=torch_mask, is_causal=is_causal, return_weights=True)
    ref_mask = mask
    if is_causal:
        causal = numpy_ref.causal_mask(np.shape(query)[1], np.shape(key)[1])
        ref_mask = causal if mask is None else np.logical_and(mask, causal)
    ref_out, ref_weights = numpy_ref.multi_head_attention(query, key, value, params, num_heads, ref_mask)
    np.testing.assert_allclose(out.numpy(), ref_out, rtol=0, atol=atol, err_msg="output differs from numpy_ref")
    np.testing.assert_allclose(weights.numpy(), ref_weights, rtol=0, atol=atol, err_msg="weights differ from numpy_ref")


@pytest.fixture(scope="session")
def assert_matches_reference():
    """The suite's parity check against the float64 NumPy reference, as a function."""
    return _assert_matches_reference


@pytest.fixture
def rng():
    """A seeded NumPy generator."""
    return np.random.default_rng(0)
