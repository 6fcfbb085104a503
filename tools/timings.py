"""Where the time of `make test` goes: its phases, the slowest notebooks, the slowest tests.

`make test` writes into one folder (_build/times):
* `clock`: `start<TAB>time<TAB>0`, then one line per phase as it ends, `name<TAB>time<TAB>exit status` (times in
  seconds since the epoch), appended by the Makefile;
* `pytest.json`: written by this module as a pytest plugin (`-p tools.timings`): every item's duration, its setup,
  call and teardown together (an nbval item is one cell; its notebook's kernel starts in its first cell's setup);
* `cpu.json` (where the machine has /proc/stat): the session's wall time and how many CPU-seconds the whole machine
  spent busy meanwhile. On an idle machine this says whether the workers keep every core busy (a busy share well
  under 100 % means more workers would help) and how much of the wall time no test accounts for (collection,
  start-up, the coverage report).
Then `python tools/timings.py _build/times` prints the phase table, the ten slowest notebooks (their cells summed),
the ten slowest tests and the CPU line. `make test` prints it at the end, and also when a phase fails.

`python tools/timings.py --cells NOTEBOOK...` runs each notebook in a fresh kernel (the course's kernel environment,
the thread count of OMP_NUM_THREADS) and prints its slowest cells with their wall time and the kernel's CPU time:
on a shared, loaded machine the CPU seconds are the number to hold against a chapter's budget.
"""

import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

NOTEBOOK = ".ipynb"
SLOWEST = 10
OPTION = "--timings-dir"


# --- the pytest plugin ---------------------------------------------------------------------------------------------

def pytest_addoption(parser):
    parser.addoption(OPTION, default="_build/times", help="where to write pytest.json (tools/timings.py)")


def pytest_configure(config):
    if not hasattr(config, "workerinput"):  # under xdist the controller gets every worker's reports
        config.pluginmanager.register(Recorder(Path(config.getoption(OPTION))), "timings-recorder")


def cpu_ticks(stat="/proc/stat"):
    """(busy, all) clock ticks (os.sysconf("SC_CLK_TCK") a second) the machine has spent since it started, summed over
    its cores, or None where there is no /proc/stat (macOS). Busy is everything but idle and I/O wait. Integers, so
    that differences are exact: in seconds, busy came out above all by 1e-11 on a machine that was never idle."""
    try:
        with open(stat, encoding="ascii") as f:
            fields = [int(n) for n in f.readline().split()[1:]]
    except OSError:
        return None
    idle = fields[3] + fields[4]
    return sum(fields) - idle, sum(fields)


class Recorder:
    def __init__(self, folder):
        self.folder = folder
        self.durations = defaultdict(float)
        self.started = (time.time(), cpu_ticks())

    def pytest_runtest_logreport(self, report):
        self.durations[report.nodeid] += report.duration

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self):
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / "pytest.json").write_text(json.dumps(self.durations, indent=0), encoding="utf-8")
        (start, cpu), now = self.started, cpu_ticks()
        if cpu is not None and now is not None:
            second = os.sysconf("SC_CLK_TCK")
            usage = {"wall": time.time() - start, "busy": (now[0] - cpu[0]) / second,
                     "all": (now[1] - cpu[1]) / second, "cores": os.cpu_count()}
            (self.folder / "cpu.json").write_text(json.dumps(usage), encoding="utf-8")


# --- the report ----------------------------------------------------------------------------------------------------

def clock(seconds):
    """`12.3 s`, and from a minute on also in minutes: `288.0 s = 4 min 48 s`."""
    minutes, rest = divmod(round(seconds), 60)
    return f"{seconds:7.1f} s" + (f" = {minutes} min {rest:02d} s" if minutes else "")


def phase_table(lines):
    """Rows (phase, seconds) from the `clock` file's lines, with a total; a phase that failed says so."""
    rows, previous = [], None
    for line in lines:
        name, time, status = line.split("\t")
        if previous is not None:
            rows.append((name if status == "0" else f"{name} (FAILED, exit status {status})", float(time) - previous))
        previous = float(time)
    return rows + [("total", sum(seconds for _, seconds in rows))]


def _top(seconds_by_name):
    return sorted(seconds_by_name.items(), key=lambda item: -item[1])[:SLOWEST]


def slowest(durations):
    """The slowest notebooks (their cells summed) and the slowest other tests: two lists of (name, seconds)."""
    notebooks, tests = defaultdict(float), {}
    for nodeid, seconds in durations.items():
        path = nodeid.split("::", 1)[0]
        if path.endswith(NOTEBOOK):
            notebooks[path] += seconds
        else:
            tests[nodeid] = seconds
    return _top(notebooks), _top(tests)


def table(title, rows):
    width = max(len(name) for name, _ in rows)
    return "\n".join([title] + [f"  {name:<{width}}  {clock(seconds)}" for name, seconds in rows])


def cpu_line(usage, durations):
    """One line: the share of the machine's CPU time spent busy during pytest, and the tests' durations summed."""
    share = usage["busy"] / usage["all"] if usage["all"] else 0.0
    return (f"pytest: {usage['wall']:.0f} s; the machine's {usage['cores']} cores busy {share:.0%} of that time; "
            f"the tests' durations sum to {sum(durations.values()):.0f} s")


def report(folder):
    """The two lists of the slowest (from pytest.json) and the phase table (from clock), as far as they exist."""
    folder = Path(folder)
    sections = []
    if (folder / "pytest.json").exists():
        notebooks, tests = slowest(json.loads((folder / "pytest.json").read_text(encoding="utf-8")))
        if notebooks:
            sections.append(table("Slowest notebooks (nbval; their cells summed, in one of 2 workers):", notebooks))
        if tests:
            sections.append(table("Slowest tests (setup, call and teardown):", tests))
    if (folder / "clock").exists():
        lines = (folder / "clock").read_text(encoding="utf-8").splitlines()
        sections.append(table("make test, phase by phase:", phase_table(lines)))
    if (folder / "cpu.json").exists() and (folder / "pytest.json").exists():
        durations = json.loads((folder / "pytest.json").read_text(encoding="utf-8"))
        sections.append(cpu_line(json.loads((folder / "cpu.json").read_text(encoding="utf-8")), durations))
    return "\n\n".join(sections)


# --- one notebook, cell by cell --------------------------------------------------------------------------------------

_CPU = "import os as _os; _t = _os.times(); print(_t.user + _t.system)"  # the kernel's own CPU seconds so far


def cell_times(path):
    """[(cell index, wall s, CPU s of the kernel, first line)] for each code cell of the notebook at `path`, run top
    to bottom in a fresh kernel started in its folder (the kernel start is not counted)."""
    import time

    import nbformat
    from jupyter_client.manager import start_new_kernel

    from attention_course.course.kernel import KERNEL_ARGS, use_kernel_environment

    use_kernel_environment()
    path = Path(path)
    manager, client = start_new_kernel(kernel_name="python3", cwd=str(path.parent), extra_arguments=KERNEL_ARGS)

    def run(code):
        printed = []
        client.execute_interactive(code, timeout=900, output_hook=lambda msg: printed.append(
            msg["content"].get("text", "") if msg["msg_type"] == "stream" else ""))
        return "".join(printed)

    rows = []
    try:
        cpu = float(run(_CPU))
        for index, cell in enumerate(nbformat.read(path, as_version=4).cells):
            if cell.cell_type != "code":
                continue
            start = time.perf_counter()
            run(cell.source)
            wall = time.perf_counter() - start
            now = float(run(_CPU))  # the CPU seconds include the probe's own: a millisecond
            rows.append((index, wall, now - cpu, (cell.source.splitlines() or [""])[0][:60]))
            cpu = now
    finally:
        manager.shutdown_kernel(now=True)
    return rows


def cells_report(path, rows):
    wall, cpu = sum(r[1] for r in rows), sum(r[2] for r in rows)
    lines = [f"{path}: {len(rows)} code cells, {wall:.1f} s wall, {cpu:.1f} s CPU (slowest cells by CPU):"]
    lines += [f"  cell {i:3d}  {w:7.1f} s wall  {c:7.1f} s CPU  {text}" for i, w, c, text in
              sorted(rows, key=lambda r: -r[2])[:SLOWEST]]
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "--cells":
        for notebook in sys.argv[2:]:
            print(cells_report(notebook, cell_times(notebook)))
    elif len(sys.argv) == 2:
        print(report(sys.argv[1]))
    else:
        sys.exit(__doc__)
