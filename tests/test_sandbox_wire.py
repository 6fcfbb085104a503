"""The grader's wire format and the sandbox worker's pieces, in this process: values round-trip without
pickles, malformed or oversized replies are refused, the worker describes objects and answers calls by name."""

import inspect
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from IPython.core.interactiveshell import InteractiveShell

from attention_course import checks
from attention_course.checks import runner
from attention_course.course import canonical, judge, sandbox, wire, worker


def _round_trip(value, framework_ok=True):
    arrays = {}
    tree = wire.encode(value, arrays)
    header, got = wire.unpack(wire.pack({"v": tree}, arrays)[8:])
    return wire.decode(header["v"], got, framework_ok)


def test_values_round_trip():
    value = {"x": np.arange(6.0).reshape(2, 3), "t": torch.ones(2, dtype=torch.bool), "n": 3, "f": 2.5,
             "s": "B", "none": None, "pair": (np.float32(1.5), [1, float("inf")])}
    got = _round_trip(value)
    assert np.array_equal(got["x"], value["x"]) and got["x"].dtype == np.float64
    assert isinstance(got["t"], torch.Tensor) and got["t"].dtype == torch.bool
    assert (got["n"], got["f"], got["s"], got["none"]) == (3, 2.5, "B", None)
    assert isinstance(got["pair"], tuple) and got["pair"][0] == np.float32(1.5)
    assert isinstance(_round_trip(torch.zeros(2, dtype=torch.bfloat16)), torch.Tensor)
    assert isinstance(_round_trip(torch.ones(3), framework_ok=False), np.ndarray)


def test_other_objects_arrive_as_named_opaque_values():
    got = _round_trip(object())
    assert isinstance(got, wire.Opaque) and type(got).__name__ == "object"
    assert type(_round_trip(np.array(["a"]))).__name__ == "ndarray"
    assert repr(wire.opaque("not a name")) == "<object>"


def test_malformed_and_oversized_messages_are_refused():
    with pytest.raises(wire.WireError, match="malformed"):
        wire.unpack(b"not an npz archive")
    read, write = os.pipe()
    try:
        wire.write_message(write, {"op": "x"}, {"a": np.zeros(1000)})
        with pytest.raises(wire.WireError, match="over the output limit"):
            wire.read_message(read, limit=100)
    finally:
        os.close(read)
        os.close(write)
    read, write = os.pipe()
    os.close(write)
    with pytest.raises(wire.WireError, match="ended"):
        wire.read_message(read)
    os.close(read)
    with pytest.raises(wire.WireError, match="unknown value kind"):
        wire.decode({"t": "pickle"}, {})


@pytest.fixture(scope="module")
def shell():
    shell = InteractiveShell.instance()
    shell.run_cell("import numpy as np\ndef double(x, scale=2):\n    return x * scale\nclass Model:\n    pass\n"
                   "answer = 'C'\ndef slow(x):\n    while True:\n        pass\ndef mutate(x):\n    x += 1\n"
                   "    return x", store_history=False)
    return shell


def test_the_worker_describes_what_a_check_is_given(shell):
    point = worker._check_point(shell, {"exprs": ["double", "answer", "missing"]}, "", (5, 50), worker.Recorder())
    objects = point["objects"]
    assert objects["double"] == {"kind": "function", "name": "double", "params": [["x", 1, False], ["scale", 1, True]]}
    assert wire.decode_value(objects["answer"]) == "C" and point["verdict"] is None
    assert objects["missing"]["kind"] == "error" and objects["missing"]["etype"] == "NameError"
    with pytest.raises(judge.Abort) as err:
        judge._resolve(("expr", "missing"), None, "0", objects)
    assert err.value.code == "NameError"


def test_a_check_given_a_class_does_not_run_in_the_sandbox(shell):
    """A class is described (its name, signature and bases), not checked there: the checker builds and calls
    it by reference from the grader. Only a check cell that is not a plain checker call runs there."""
    point = worker._check_point(shell, {"exprs": ["Model"]}, "raise AssertionError('[wrong-output] no')", (5, 50),
                                worker.Recorder())
    model = point["objects"]["Model"]
    assert (model["kind"], model["name"], model["class"], point["verdict"]) == ("class", "Model", True, None)
    assert "builtins.object" in model["types"]
    point = worker._check_point(shell, {"exprs": [], "run_in_sandbox": True},
                                 "raise AssertionError('[wrong-output] no')", (5, 50), worker.Recorder())
    assert judge.sandbox_verdict(point["verdict"]) == (False, "wrong-output", "[wrong-output] no")


def _call(kept, expr, *args, seconds=(5, 50)):
    arrays = {}
    request = {"expr": expr, "args": wire.encode(list(args), arrays), "kwargs": wire.encode({}, arrays)}
    return worker._reply_to_call(request, arrays, worker.Objects(kept), seconds)


def test_the_worker_answers_calls(shell):
    kept = {name: shell.user_ns[name] for name in ("double", "slow", "mutate")}
    header, out = _call(kept, "double", np.ones(3))
    assert header["ok"] and np.array_equal(wire.decode(header["result"], out), np.full(3, 2.0))
    header, out = _call(kept, "mutate", np.zeros(2))
    after = wire.decode(header["args_after"], out)
    assert np.array_equal(after[0][0], np.ones(2))  # the grader compares: [mutates-input], nothing written back
    assert _call(kept, "double", "a", "b")[0]["etype"] == "TypeError"
    assert _call(kept, "nothing")[0]["etype"] == "NameError"
    assert _call(kept, "slow", 1, seconds=(0.2, 50))[0] == {"ok": False, "timeout": True}


def test_a_call_is_limited_in_cpu_time_with_a_wall_time_backstop():
    """The submission's work is limited in CPU time, which the machine's load does not change: a call that waits
    (here: sleeps) longer than the CPU limit is not stopped by it; one that waits longer than the wall limit is."""
    import time

    kept = {"nap": lambda seconds: time.sleep(seconds) or "rested"}
    header, out = _call(kept, "nap", 0.6, seconds=(0.2, 30))
    assert header["ok"] and wire.decode(header["result"], out) == "rested"
    assert _call(kept, "nap", 30, seconds=(0.2, 0.5))[0] == {"ok": False, "timeout": True}
    limits = sandbox.Limits(cell_s=5)
    assert limits.cell_wall_s >= 3 * limits.cell_s + 10  # two busy processes per core: a third of a core each


class Loopback(sandbox.Sandbox):
    """A sandbox whose worker runs in this process: the real request building of ``Sandbox.call`` and
    ``Sandbox.attribute``, every request and reply packed and unpacked in the wire format, and the worker's table
    keeping the objects it hands out."""

    def __init__(self, named: dict):
        self.table = worker.Objects(named)

    def _ask(self, request, arrays):
        header, arrays = wire.unpack(wire.pack(request, arrays)[8:])
        reply, out = worker._reply_to_call(header, arrays, self.table, (10, 100))
        return wire.unpack(wire.pack(reply, out)[8:])


def _remote_class(cls):
    box = Loopback({cls.__name__: cls})
    return judge.Remote(box, "0", cls.__name__, worker._describe(cls)), box


def test_a_remote_module_is_built_loaded_and_called_by_reference():
    """What the module checks do to a student's class, done through the wire: the module and its layers stay in
    the worker, weights copied into a layer change the module there, outputs come back as data."""
    remote_cls, box = _remote_class(torch.nn.Linear)
    assert runner.is_class(remote_cls) and remote_cls.__name__ == "Linear"
    assert repr(remote_cls) == "<class Linear in the sandbox>"
    assert list(inspect.signature(remote_cls).parameters)[:2] == ["in_features", "out_features"]
    layer = remote_cls(3, 2).eval()
    assert type(layer).__name__ == "Linear" and isinstance(layer, judge.Remote)
    assert runner.is_instance(layer, torch.nn.Module) and not runner.is_instance(layer, torch.nn.LayerNorm)
    assert tuple(layer.weight.shape) == (2, 3) and layer.weight.dtype == torch.float32
    layer.weight.copy_(torch.arange(6.0).reshape(2, 3))  # in the worker, without autograd
    layer.bias.copy_(torch.zeros(2))
    out = layer(torch.ones(1, 3))
    assert isinstance(out, torch.Tensor) and out.tolist() == [[3.0, 12.0]]
    state = layer.state_dict()  # an OrderedDict of tensors: data
    assert sorted(state) == ["bias", "weight"] and isinstance(state["weight"], torch.Tensor)
    keys = layer.load_state_dict(state, strict=False)  # a named tuple: kept, its fields read by reference
    assert keys.missing_keys == [] and keys.unexpected_keys == []
    with pytest.raises(RuntimeError, match="size mismatch"):  # the worker's RuntimeError is one here too
        layer.load_state_dict({"weight": torch.zeros(5, 5), "bias": torch.zeros(2)})
    assert getattr(layer, "w_q", None) is None  # AttributeError in the worker
    with pytest.raises(AttributeError, match="cannot set"):
        layer.weight = None
    with pytest.raises(AttributeError):
        layer.__array__  # noqa: B018 - special names are never forwarded
    assert not runner.is_instance(torch.nn.Linear(2, 2), torch.nn.LayerNorm)  # local objects: plain isinstance
    assert box.table.objects  # the module and its layers live in the worker's table


def test_a_call_that_changes_its_arguments_fails_and_nothing_is_written_back(shell):
    """The stand-in compares what the call left in its arguments with what it sent: [mutates-input], as a local
    check reports it, while the grader's own array keeps its values."""
    box = Loopback({"mutate": shell.user_ns["mutate"], "double": shell.user_ns["double"]})
    mutate = judge.stand_in(box, "0", "mutate", worker._describe(shell.user_ns["mutate"]))
    mine = np.zeros(2)
    with pytest.raises(judge.Abort) as err:
        mutate(mine)
    assert err.value.code == "mutates-input" and np.array_equal(mine, np.zeros(2))
    double = judge.stand_in(box, "0", "double", worker._describe(shell.user_ns["double"]))
    assert np.array_equal(double(np.ones(2)), np.full(2, 2.0))


def test_module_checks_judge_a_remote_class_and_name_its_mistake():
    """The module checkers run unchanged on the stand-in: a correct class passes, a planted bug is named."""
    from attention_course import block, bug_zoo
    from attention_course.multi_head import MultiHeadAttention

    checks.check_multi_head_attention(_remote_class(MultiHeadAttention)[0])
    checks.check_pre_ln_block(_remote_class(type("PreLNBlock", (block.EncoderBlock,), {
        "__init__": lambda self, d, h, f, dropout=0.0: block.EncoderBlock.__init__(self, d, h, f, dropout,
                                                                                      norm_first=True)}))[0])

    with pytest.raises(checks.CheckFailed, match=r"^\[missing-scale\]"):
        checks.check_single_head_attention(_remote_class(bug_zoo.SHAMissingScale)[0])
    with pytest.raises(checks.CheckFailed, match=r"^\[weight-not-transposed\]"):
        checks.check_single_head_attention(_remote_class(bug_zoo.SHAWeightNotTransposed)[0])


def test_check_cells_are_parsed_into_checker_calls():
    calls = canonical.parse_check('checks.check_choice("q1", answer)\nchecks.check_softmax(f, timeout=3)')
    assert [(c.checker, c.args, c.kwargs) for c in calls] == [
        ("check_choice", [("literal", "q1"), ("expr", "answer")], {}),
        ("check_softmax", [("expr", "f")], {"timeout": ("literal", 3)})]
    assert canonical.expressions(calls) == ["answer", "f"]
    for source in ("pass", "x = 1", "checks.check_softmax(*fs)", "check_softmax(f)", "checks.other(f)", "(("):
        assert canonical.parse_check(source) is None, source


def test_sandbox_limits_and_paths():
    paths = sandbox._readonly_paths()
    assert "/etc" not in paths and all(os.path.exists(p) for p in paths)
    env = sandbox._environment(sandbox.Limits(), "/tmp")
    assert env["HOME"] == "/tmp" and "PYTHONPATH" in env and not any("TOKEN" in k or "KEY" in k for k in env)


def test_the_model_cache_is_readable_in_the_sandbox_where_it_is_built(monkeypatch, tmp_path):
    """Capstone 2 loads SmolLM2 in the submission's notebook: the grader's cache folder, read-only, named by
    ATTENTION_COURSE_CACHE (without it the sandbox would de-quantise the wheel into its small /tmp)."""
    from attention_course import pretrained

    monkeypatch.setenv("ATTENTION_COURSE_CACHE", str(tmp_path))
    env = sandbox._environment(sandbox.Limits(), "/tmp")
    assert sandbox.model_cache() is None and "ATTENTION_COURSE_CACHE" not in env
    pretrained.cache_folder().mkdir()
    env = sandbox._environment(sandbox.Limits(), "/tmp")
    assert sandbox.model_cache() == pretrained.cache_folder() and env["ATTENTION_COURSE_CACHE"] == str(tmp_path)
    assert str(pretrained.cache_folder()) in sandbox._readonly_paths()


@pytest.mark.parametrize("folder", [None, Path("/tmp/attention-grade-1-x")], ids=["bwrap-tmpfs", "own-tmpfs"])
def test_a_package_under_tmp_stays_visible_in_the_sandbox(monkeypatch, folder):
    """bwrap mounts in order: the private /tmp (bubblewrap's tmpfs, or the grader's own, limited in files too)
    must come before the read-only binds, or a clone or a virtual environment under /tmp would be hidden and no
    cell could import the package."""
    monkeypatch.setattr(sandbox, "_readonly_paths", lambda: ["/usr", "/tmp/clone/.venv", "/tmp/clone/src"])
    cmd, _ = sandbox._command(folder, sandbox.Limits())
    tmp = cmd.index("/tmp")
    assert cmd[tmp - 1] == ("--tmpfs" if folder is None else str(folder / "tmp"))
    assert all(tmp < i for i, arg in enumerate(cmd) if arg == "--ro-bind")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie is dead, only not yet reaped
    except FileNotFoundError:
        return False


INTERMEDIATE = """
import subprocess, sys, time
from attention_course.course import sandbox
preexec = sandbox._preexec(sandbox.Limits(), []) if sys.argv[1] == "sandbox" else None
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], preexec_fn=preexec)
print(child.pid, flush=True)
time.sleep(60)
"""


@pytest.mark.parametrize("how", ["sandbox", "plain"])
def test_a_killed_grader_takes_its_worker_with_it(how):
    """The worker is started with PR_SET_PDEATHSIG (what bwrap's --die-with-parent does): kill the process that
    started it and the worker dies too. A plain child outlives it, which shows the test can fail."""
    parent = subprocess.Popen([sys.executable, "-c", INTERMEDIATE, how], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    try:
        assert _alive(child)
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
        deadline = time.monotonic() + (5 if how == "sandbox" else 1)  # 1 s: long enough to see it survive
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _alive(child) == (how == "plain")
    finally:
        if _alive(child):
            os.kill(child, signal.SIGKILL)


def test_the_worker_runs_a_call_inside_the_checks_observers():
    """The grader's observers travel with a call: the worker counts the scores the student's code computes, records
    its fused calls (with the NaN stand-in of older kernels) and watches the tensors it forms, and reports them."""
    from attention_course.checks import observe

    def dense(q, k):
        return q @ k.T

    def fused_float(q, mask):
        return torch.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=mask.float().log())

    table = worker.Objects({"dense": dense, "fused_float": fused_float})
    q, keys = torch.randn(6, 17), torch.randn(1, 1, 6, 17)
    mask = torch.ones(6, 6, dtype=torch.bool).tril()
    mask[0] = False  # a row that may attend nothing: NaN, as older kernels give
    formed_from = keys[0, 0] + 1  # an argument whose numbers are not the watched keys
    for expr, args, observers in (("dense", [q, formed_from], [observe.ScoreCounter(17), observe.FormedTensors(keys)]),
                                  ("fused_float", [q, mask], [observe.FusedAttentionCalls()])):
        arrays: dict = {}
        request = {"op": wire.CALL, "key": "0", "expr": expr, "args": wire.encode(args, arrays),
                   "kwargs": wire.encode({}, arrays), "observe": wire.encode([o.spec() for o in observers], arrays)}
        header, arrays = wire.unpack(wire.pack(request, arrays)[8:])
        reply, out = worker._reply_to_call(header, arrays, table, (10, 100))
        reply, out = wire.unpack(wire.pack(reply, out)[8:])
        assert reply["ok"], reply
        if expr == "dense":
            assert reply["observed"] == [{"scores": 36}, {"formed": False}]
        else:
            assert reply["observed"] == [{"mask_dtypes": ["float32"]}]
            assert torch.isnan(torch.as_tensor(wire.decode(reply["result"], out))[0]).all()


class _Reporting(sandbox.Sandbox):
    """A sandbox whose replies are given: what the worker would say the observers saw (or nothing)."""

    def __init__(self, observed):
        self.observed = observed

    def _ask(self, request, arrays):
        reply = {"ok": True, "result": wire.encode(None, {}), "args_after": wire.encode([[], {}], {})}
        return ({**reply, "observed": self.observed} if self.observed is not None else reply), {}


def test_the_grader_adds_what_the_sandbox_observed_and_refuses_a_reply_without_it():
    from attention_course.checks import observe

    fn = judge.stand_in(_Reporting([{"scores": 2304}, {"mask_dtypes": ["bool", None]}]), "0", "f", {"name": "f"})
    assert observe.observable(fn)
    with observe.ScoreCounter(16) as counter, observe.FusedAttentionCalls() as fused:
        fn()
    assert counter.scores == 2304 and fused.mask_dtypes == [torch.bool, None]
    for observed in (None, [{"scores": 1}], [{"scores": "many"}]):
        fn = judge.stand_in(_Reporting(observed), "0", "f", {"name": "f"})
        with observe.ScoreCounter(16), observe.FusedAttentionCalls(), pytest.raises(judge.Abort) as err:
            fn()
        assert err.value.code == "wrong-type"
    fn()  # no observer active: nothing is sent, nothing expected back
