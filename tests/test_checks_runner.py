"""Running the student's code safely (any check): exceptions, None, wrong types, NaN, inputs modified in place, time
limits, threads, messages without the checker's internals. Correct code in several styles passes with one line; each
planted wrong answer (PLANTED) gets its own code."""

import math
import re
import signal
import threading
import time

import numpy as np
import pytest
import torch

from attention_course import checks
from attention_course.checks import runner
from attention_impls import (
    sdpa_not_implemented,
    sdpa_raises,
    sdpa_requires_mask,
    sdpa_scratch,
    softmax_axis0,
    softmax_np,
)


def sdpa_returns_none(q, k, v, mask=None):
    sdpa_scratch(q, k, v, mask)


def sdpa_returns_string(q, k, v, mask=None):
    return "attention"


def sdpa_returns_triple(q, k, v, mask=None):
    return (*sdpa_scratch(q, k, v, mask), None)


def sdpa_returns_nan(q, k, v, mask=None):
    out, _ = sdpa_scratch(q, k, v, mask)
    return out * float("nan")


def sdpa_mutates_q(q, k, v, mask=None):
    q /= math.sqrt(q.shape[-1])  # in place!
    scores = q @ k.transpose(-2, -1)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    return weights @ v, weights


def sdpa_forever(q, k, v, mask=None):
    while True:
        pass


def sdpa_sleeps_forever(q, k, v, mask=None):
    while True:  # sleeps, so an abandoned thread running it costs no CPU
        time.sleep(0.01)


def test_exception_message_names_the_exception_and_the_call():
    with pytest.raises(checks.CheckFailed) as info:
        checks.check_scaled_dot_product_attention(sdpa_requires_mask)
    msg = str(info.value)
    assert msg.startswith("[raised-exception] Your code raised TypeError: ")
    assert "scaled_dot_product_attention(q of shape (4, 8), k of shape (4, 8), v of shape (4, 8), mask=None)" in msg


def test_not_implemented_quotes_the_exercise():
    with pytest.raises(checks.CheckFailed) as info:
        checks.check_scaled_dot_product_attention(sdpa_not_implemented)
    assert str(info.value).startswith("[not-implemented] Exercise 3: scaled dot-product attention: replace the")


def test_long_and_empty_exception_messages():
    def raises_long(q, k, v, mask=None):
        raise ValueError("x" * 500)

    def raises_empty(q, k, v, mask=None):
        raise RuntimeError

    with pytest.raises(checks.CheckFailed, match=r"ValueError: x{297}\.\.\.\n"):
        checks.check_scaled_dot_product_attention(raises_long)
    with pytest.raises(checks.CheckFailed, match=r"^\[raised-exception\] Your code raised RuntimeError\n"):
        checks.check_scaled_dot_product_attention(raises_empty)
    with pytest.raises(checks.CheckFailed, match=r"^\[not-implemented\] scaled_dot_product_attention is not"):
        checks.check_scaled_dot_product_attention(lambda q, k, v, mask=None: (_ for _ in ()).throw(
            NotImplementedError()))


def test_student_sys_exit_is_caught():
    def exits(x):
        raise SystemExit(3)

    with pytest.raises(checks.CheckFailed, match=r"^\[raised-exception\] Your code raised SystemExit: 3"):
        checks.check_softmax(exits)


def test_failure_hides_the_checker_internals():
    with pytest.raises(checks.CheckFailed) as info:
        checks.check_softmax(softmax_axis0)
    err = info.value
    assert err.__cause__ is None and err.__suppress_context__
    frames = []
    tb = err.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame.f_code.co_name)
        tb = tb.tb_next
    assert frames[1:] == ["check_softmax", "run_check"]  # the test, then two short checker frames
    rendered = err._render_traceback_()
    assert rendered == [f"\x1b[0;31mCheckFailed\x1b[0m: {err}"]
    assert not re.search(r"/work/|/tmp/|site-packages|\.py\b|File ", rendered[0])


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="needs the main thread")
def test_time_limit_with_an_alarm_on_the_main_thread():
    handler, (remaining, _) = signal.getsignal(signal.SIGALRM), signal.getitimer(signal.ITIMER_REAL)
    start = time.monotonic()
    with pytest.raises(checks.CheckFailed, match=r"^\[timeout\] Your code did not finish within 0.3 s"):
        checks.check_scaled_dot_product_attention(sdpa_forever, timeout=0.3)
    assert time.monotonic() - start < 5
    assert signal.getsignal(signal.SIGALRM) is handler  # restored (pytest-timeout may have one)
    assert (signal.getitimer(signal.ITIMER_REAL)[0] > 0) == (remaining > 0)


class OuterAlarm(BaseException):
    pass


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="needs the main thread")
def test_an_outer_alarm_is_kept_and_restored():
    def outer(signum, frame):
        raise OuterAlarm

    previous = signal.signal(signal.SIGALRM, outer)
    try:
        signal.setitimer(signal.ITIMER_REAL, 30)
        with pytest.raises(checks.CheckFailed, match=r"^\[timeout\]"):
            checks.check_softmax(lambda x: sdpa_forever(x, x, x), timeout=0.2)
        assert signal.getsignal(signal.SIGALRM) is outer
        assert 25 < signal.getitimer(signal.ITIMER_REAL)[0] <= 30
        # an outer alarm due before the check's own limit fires as usual
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        with pytest.raises(OuterAlarm):
            checks.check_softmax(lambda x: sdpa_forever(x, x, x), timeout=10)
        assert signal.getitimer(signal.ITIMER_REAL)[0] == 0  # it fired: not re-armed to fire a second time
        # and one due right after a fast check is re-armed (1.5 s: the check may be slow on a loaded machine)
        signal.setitimer(signal.ITIMER_REAL, 1.5)
        checks.check_softmax(softmax_np, timeout=10)
        with pytest.raises(OuterAlarm):
            time.sleep(5)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_time_limit_in_a_thread():
    """Off the main thread no alarm is possible: the check runs in a daemon thread and is abandoned."""
    result = {}

    def run():
        try:
            checks.check_scaled_dot_product_attention(sdpa_sleeps_forever, timeout=0.3)
        except checks.CheckFailed as err:
            result["error"] = str(err)

    worker = threading.Thread(target=run)
    worker.start()
    worker.join(10)
    assert result["error"].startswith("[timeout] Your code did not finish within 0.3 s")


def test_checks_in_a_thread_still_pass_and_fail(capsys):
    result = {}

    def run():
        checks.check_softmax(softmax_np, timeout=30)
        try:
            checks.check_softmax(softmax_axis0, timeout=30)
        except checks.CheckFailed as err:
            result["error"] = err.code

    worker = threading.Thread(target=run)
    worker.start()
    worker.join(60)
    assert result["error"] == "softmax-wrong-axis"
    assert capsys.readouterr().out.startswith("✓ softmax")


def test_no_time_limit(capsys):
    checks.check_softmax(softmax_np, timeout=None)
    checks.check_softmax(softmax_np, timeout=0)
    assert capsys.readouterr().out.count("✓") == 2


def test_lists_tensors_and_tf_like_objects_convert():
    class FakeTF:
        def __init__(self, a):
            self.a = a

        def numpy(self):
            return self.a

    case = "c"
    assert runner.as_array([1, 2], "result", case).dtype == np.float64
    assert runner.as_array(torch.tensor([1, 2]), "result", case).tolist() == [1.0, 2.0]
    assert runner.as_array(FakeTF(np.ones(2)), "result", case).tolist() == [1.0, 1.0]
    assert runner.as_array(3.5, "result", case).shape == ()
    for bad in (["a"], {"x": 1}, torch.tensor([1j])):
        with pytest.raises(checks.CheckFailed, match=r"^\[wrong-type\]"):
            runner.as_array(bad, "result", case)
    with pytest.raises(checks.CheckFailed, match=r"^\[returned-none\] Your function returned None as its weights"):
        runner.as_array(None, "weights", case)


def test_exception_messages_are_cleaned():
    def wrapped(cls, inner_message):
        try:
            try:
                raise cls(inner_message)
            except cls:
                raise cls("Exception encountered when calling Layer.call().\n\n\x1b[1m" + inner_message +
                          "\x1b[0m\n\nArguments received by Layer.call():\n  • x=tf.Tensor(shape=(2,))") from None
        except cls as outer:
            assert outer.__cause__ is None and str(outer.__context__) == inner_message  # what Keras raises
            return outer

    err = wrapped(NotImplementedError, "Exercise 4: A layer")
    assert str(runner.original_error(err)) == "Exercise 4: A layer"
    lonely = ValueError("Exception encountered when calling Layer.call(). Nothing else.")
    assert runner.original_error(lonely) is lonely
    assert runner.first_line(RuntimeError("{{function_node __wrapped__Op}} bad shapes\nmore [Op:X] name: ")) == (
        "bad shapes")
    assert runner.first_line(RuntimeError("bad [Op:X] name: ")) == "bad [Op:X]"

    def raises_wrapped(x):
        raise wrapped(NotImplementedError, "Exercise 1: Softmax")

    def raises_wrapped_value_error(x):
        raise wrapped(ValueError, "the real error")

    with pytest.raises(checks.CheckFailed, match=r"^\[not-implemented\] Exercise 1: Softmax: replace the"):
        checks.check_softmax(raises_wrapped)
    with pytest.raises(checks.CheckFailed, match=r"^\[raised-exception\] Your code raised ValueError: the real "
                       r"error\n"):
        checks.check_softmax(raises_wrapped_value_error)


def test_describe_call():
    args = {"x": np.zeros((2, 3)), "params": {"w": torch.zeros(4, 5)}, "n": 3, "d": {"a": 1}}
    assert runner.describe_call("f", args) == "f(x of shape (2, 3), params={w: (4, 5)}, n=3, d={'a': 1})"


PLANTED = [
    # (check, a wrong implementation, the code it must get)
    (checks.check_scaled_dot_product_attention, sdpa_not_implemented, "not-implemented"),
    (checks.check_scaled_dot_product_attention, sdpa_raises, "raised-exception"),
    (checks.check_scaled_dot_product_attention, sdpa_requires_mask, "raised-exception"),
    (checks.check_scaled_dot_product_attention, sdpa_returns_none, "returned-none"),
    (checks.check_scaled_dot_product_attention, sdpa_returns_string, "wrong-type"),
    (checks.check_scaled_dot_product_attention, sdpa_returns_triple, "wrong-type"),
    (checks.check_scaled_dot_product_attention, sdpa_returns_nan, "nan-output"),
    (checks.check_scaled_dot_product_attention, sdpa_mutates_q, "mutates-input"),
    (checks.check_scaled_dot_product_attention, lambda q, k, v, mask=None: sdpa_scratch(q.unsqueeze_(0), k, v, mask),
     "mutates-input"),  # in-place change of shape
]
