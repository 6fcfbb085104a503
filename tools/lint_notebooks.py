"""Lint the course's notebooks for outputs that would not be the same on another machine.

Usage: python tools/lint_notebooks.py [NOTEBOOK_OR_FOLDER ...]   (default: book exercises solutions)
Exit status 1 if anything is found; each finding names the notebook, the cell and the rule.

nbval compares every stored output with a fresh run, so a notebook may print only what every correct machine
prints. Float rounding differs across CPUs, SIMD kernels and thread counts, hence the rules:

* ``float-e-format`` (source): a print that formats a number in e notation (``{d:.0e}``, ``{x:e}``) or with
  five or more decimals (``{d:.6f}``) shows rounding noise; print a verdict against a tolerance instead
  (``max |ours - ref| < 1e-5: {d < 1e-5}``).
* ``fragile-float`` (output): a stored output holding an e-notation number that is not part of a verdict
  (``= 7e-07``, ``< 1e-06`` -- a bucket flips when another CPU rounds across its edge).
* ``no-output``: a code cell stored without an execution count is run but never compared by nbval.
* ``stray-error``: an error output in a cell not tagged ``raises-exception``.
* ``address``: a ``<... at 0x...>`` repr (end plot lines with ``;``).
* ``tf-log``: TensorFlow C++ log lines stored in stderr (start kernels with TF_CPP_MIN_LOG_LEVEL=3).
* ``long-line`` (source): a code line longer than ``CODE_LINE_LENGTH`` (79) characters. The book's code column holds
  about 80 characters of its monospace font at 1280 px (tests/test_browser.py measures it); a longer line wraps to
  the left margin, where it reads as a new statement. Wrap the call (``ruff format --line-length 79`` does it for
  code; split long strings into adjacent literals). The install cell is exempt: its text is fixed
  (tests/test_publishing.py) and it is hidden behind its toggle.
* ``ignored-output``: ``nbval-ignore-output`` on a cell that neither times, measures memory, shows a progress bar,
  prints versions nor generates or decodes text (``.generate(``, ``.decode(``: a pretrained model's greedy text
  can flip on a near-tie between CPUs); only such cells may hide their output.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path

# The longest code line (79): one number for this rule and for the exercise generator's stub lines.
from attention_course.course.exercises import CODE_LINE_LENGTH

DEFAULT_DIRS = ("book", "exercises", "solutions")
IGNORE_TAG = "nbval-ignore-output"
# Notebooks whose code the long-line rule checks.
LINE_LENGTH_DIRS = ("book", "exercises", "solutions")
INSTALL_CELL_START = "# Colab and other hosted notebooks do not have the course package"

# {value:.0e}, {value:e}, {value:.3E}, {value:.6f} and longer fixed-point formats inside f-strings or format().
E_FORMAT = re.compile(r"\{[^{}]*:[^{}]*?(?:\.\d+)?[eE]\}|\{[^{}]*:[^{}]*?\.(?:[5-9]|\d\d)f\}")
# A small number in e notation (7e-07, 1.5e-12), or any e-notation number after "=", "<" or ":" ("= 0e+00"),
# unless it is the tolerance of a verdict ("< 1e-5: True", "equal within 1e-05: output True"). Constants such as
# "+1e10" in prose-like output pass.
E_NUMBER = re.compile(
    r"(?:[-+]?\d(?:\.\d+)?[eE]-\d+|(?<=[=<:] )[-+]?\d(?:\.\d+)?[eE][-+]?\d+)(?![\d.])(?!\)?\s*:.*\b(?:True|False)\b)"
)
ADDRESS = re.compile(r" at 0x[0-9a-fA-F]{6,}>")
TF_LOG = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: [IWEF] |oneDNN custom operations are on", re.M)
# What a cell whose output may be ignored does: time something, measure memory, or report versions or progress
# (a progress bar stores elapsed times and rates).
VARIABLE_OUTPUT = re.compile(
    r"time\.|perf_counter|timeit|measure_peak_memory|__version__|version\(|tqdm|progress=True|benchmark|platform\.|"
    r"\.generate\(|\.decode\("
)


def cell_source(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def output_text(output: dict) -> str:
    text = output.get("text", output.get("data", {}).get("text/plain", ""))
    return "".join(text) if isinstance(text, list) else text


def print_lines(source: str) -> Iterator[str]:
    """The lines of ``source`` that print or display something (a multi-line call counts from its first line)."""
    for line in source.splitlines():
        code = line.split("#", 1)[0]
        if "print(" in code or "display(" in code or ".format(" in code or 'f"' in code or "f'" in code:
            yield code


def long_lines(source: str) -> list[str]:
    """The lines of a code cell that the book's code column cannot hold (none for the install cell)."""
    if source.startswith(INSTALL_CELL_START):
        return []
    return [line for line in source.splitlines() if len(line) > CODE_LINE_LENGTH]


def lint_cell(cell: dict, line_length: bool = True) -> list[tuple[str, str]]:
    """(rule, detail) for every problem of one code cell; ``line_length``: apply the long-line rule."""
    source = cell_source(cell)
    tags = set(cell.get("metadata", {}).get("tags", []))
    ignored = IGNORE_TAG in tags or "# NBVAL_IGNORE_OUTPUT" in source
    found = []
    if source.strip() and cell.get("execution_count") is None:
        found.append(("no-output", "stored without outputs: nbval runs it but compares nothing"))
    if ignored and not VARIABLE_OUTPUT.search(source):
        found.append(("ignored-output", f"tagged {IGNORE_TAG} but neither times, measures memory nor prints versions"))
    if not ignored:
        for line in print_lines(source):
            if E_FORMAT.search(line):
                found.append(("float-e-format", f"prints rounding noise: {E_FORMAT.search(line).group(0)}"))
    if line_length:
        found += [("long-line", f"{len(line)} > {CODE_LINE_LENGTH} characters: {line.strip()[:60]}")
                  for line in long_lines(source)]
    for output in cell.get("outputs", []):
        text = output_text(output)
        if output.get("output_type") == "error" and "raises-exception" not in tags:
            found.append(("stray-error", f"stored {output.get('ename')} in a cell not tagged raises-exception"))
        if ADDRESS.search(text) and not ignored:
            found.append(("address", f"memory address in the output: {ADDRESS.search(text).group(0)}"))
        if output.get("name") == "stderr" and TF_LOG.search(text):
            found.append(("tf-log", "TensorFlow log lines in stderr"))
        if not ignored and E_NUMBER.search(text):
            found.append(("fragile-float", f"output shows a float error: {E_NUMBER.search(text).group(0)!r}"))
    return found


def lint_notebook(path: Path) -> list[str]:
    nb = json.loads(path.read_text(encoding="utf-8"))
    findings = []
    line_length = path.resolve().parent.name in LINE_LENGTH_DIRS
    for index, cell in enumerate(nb.get("cells", [])):
        if cell.get("cell_type") == "code":
            findings += [f"{path} cell {index}: [{rule}] {detail}" for rule, detail in lint_cell(cell, line_length)]
    return findings


def notebooks(args: list[str]) -> list[Path]:
    paths = []
    for arg in args or DEFAULT_DIRS:
        p = Path(arg)
        paths += sorted(p.glob("*.ipynb")) if p.is_dir() else [p]
    return paths


def main(argv: list[str] | None = None) -> int:
    paths = notebooks(sys.argv[1:] if argv is None else argv)
    findings = [f for path in paths for f in lint_notebook(path)]
    for finding in findings:
        print(finding)
    print(f"lint_notebooks: {len(paths)} notebooks, {len(findings)} findings")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
