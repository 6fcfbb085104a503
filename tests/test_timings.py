"""tools/timings.py, which tells where the time of `make test` goes: its pytest plugin records every test's duration
(a notebook's cells summed into the notebook), and its report prints the phase table and the slowest of both."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
from timings import cell_times, cells_report, cpu_line, cpu_ticks, phase_table, report, slowest  # noqa: E402


def test_the_plugin_records_each_test_with_its_setup_and_teardown(tmp_path):
    (tmp_path / "test_sleepy.py").write_text(
        "import time, pytest\n"
        "@pytest.fixture\n"
        "def slow_fixture():\n"
        "    time.sleep(0.3)\n"
        "    yield\n"
        "    time.sleep(0.2)\n"
        "def test_slow(slow_fixture):\n"
        "    time.sleep(0.1)\n"
        "def test_fast():\n"
        "    pass\n")
    times = tmp_path / "times"
    # no plugin but this one: a bare pytest starts in a second, not in several (this tests nothing else)
    env = dict(os.environ, PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tools.timings",
                    "--timings-dir", str(times), "--rootdir", str(tmp_path), str(tmp_path / "test_sleepy.py")],
                   cwd=ROOT, env=env, check=True, capture_output=True)
    durations = json.loads((times / "pytest.json").read_text(encoding="utf-8"))
    slow, fast = (durations[k] for k in ("test_sleepy.py::test_slow", "test_sleepy.py::test_fast"))
    assert slow >= 0.6 > fast  # 0.3 s setup + 0.1 s call + 0.2 s teardown: all three are counted
    if Path("/proc/stat").exists():  # the machine's CPU time over the session, beside it
        usage = json.loads((times / "cpu.json").read_text(encoding="utf-8"))
        assert usage["wall"] >= 0.6 and 0 <= usage["busy"] <= usage["all"] and usage["cores"] >= 1


def test_cpu_ticks_count_idle_and_io_wait_as_not_busy(tmp_path):
    """/proc/stat's first line: user nice system idle iowait irq softirq steal, in ticks of 1 / SC_CLK_TCK s."""
    stat = tmp_path / "stat"
    stat.write_text("cpu  600 0 200 1000 200 0 0 0 0 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n")
    assert cpu_ticks(str(stat)) == (800, 2000)
    assert cpu_ticks(str(tmp_path / "missing")) is None
    usage = {"wall": 600.4, "busy": 900.0, "all": 1200.0, "cores": 2}
    assert cpu_line(usage, {"a": 500.0, "b": 600.0}) == (
        "pytest: 600 s; the machine's 2 cores busy 75% of that time; the tests' durations sum to 1100 s")


def test_slowest_sums_a_notebooks_cells_and_keeps_tests_apart():
    durations = {f"book/{n:02d}_x.ipynb::Cell {c}": n + c / 10 for n in range(1, 13) for c in range(3)}
    durations |= {f"tests/test_a.py::test_{i}": float(i) for i in range(12)}
    notebooks, tests = slowest(durations)
    assert notebooks[0] == ("book/12_x.ipynb", 36.3) and len(notebooks) == 10
    assert notebooks[-1][0] == "book/03_x.ipynb"
    assert [name for name, _ in tests] == [f"tests/test_a.py::test_{i}" for i in range(11, 1, -1)]


def test_phase_table_takes_each_phase_from_the_clock_before_it():
    lines = ["start\t1000.0\t0", "set-up\t1000.5\t0", "lint\t1012.5\t0", "pytest\t1300.0\t1"]
    assert phase_table(lines) == [("set-up", 0.5), ("lint", 12.0), ("pytest (FAILED, exit status 1)", 287.5),
                                  ("total", 300.0)]


def test_report_prints_the_three_tables(tmp_path):
    (tmp_path / "pytest.json").write_text(json.dumps({"book/01_a.ipynb::Cell 0": 61.0, "tests/test_b.py::test_c": 2.0}))
    (tmp_path / "clock").write_text("start\t0\t0\nbook\t75\t0\n")
    assert report(tmp_path).splitlines() == [
        "Slowest notebooks (nbval; their cells summed, in one of 2 workers):",
        "  book/01_a.ipynb     61.0 s = 1 min 01 s",
        "",
        "Slowest tests (setup, call and teardown):",
        "  tests/test_b.py::test_c      2.0 s",
        "",
        "make test, phase by phase:",
        "  book      75.0 s = 1 min 15 s",
        "  total     75.0 s = 1 min 15 s",
    ]


def test_cell_times_measure_each_code_cell_with_the_kernels_cpu_time(tmp_path):
    """--cells: a cell that burns CPU is charged its CPU seconds, one that sleeps its wall time but no CPU."""
    import nbformat

    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("import time"),
        nbformat.v4.new_markdown_cell("text"),
        # 0.6 s burnt, 0.5 s asserted: the kernel's CPU clock is read another way than process_time, with its own
        # granularity (a 0.5 s burn once measured 0.49999999999999994)
        nbformat.v4.new_code_cell("end = time.process_time() + 0.6\nwhile time.process_time() < end:\n    pass"),
        nbformat.v4.new_code_cell("time.sleep(0.5)"),
    ])
    path = tmp_path / "burn.ipynb"
    nbformat.write(nb, path)
    rows = cell_times(path)
    assert [index for index, *_ in rows] == [0, 2, 3]
    (_, _, burn_cpu, burn_line), (_, sleep_wall, sleep_cpu, _) = rows[1:]
    assert burn_cpu >= 0.5 and burn_line == "end = time.process_time() + 0.6"
    assert sleep_wall >= 0.5 and sleep_cpu < 0.25
    assert "3 code cells" in cells_report(path, rows) and "cell   2" in cells_report(path, rows)
