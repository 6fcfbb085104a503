"""Gradescope: the autograder bundle, and the run inside Gradescope's
    container.

Build the bundle (one command)::

    python -P -m attention_course.grade bundle --out autograder [--notebooks 02_single_head_exercises ...]
        [--points points.toml] [--isolation bwrap|rlimit]

It writes ``setup.sh``, ``run_autograder``, ``check_image.sh``, ``solutions/``
(the reference notebooks), ``course/`` (the package's source and its
requirements), ``points.toml`` if given, and ``autograder.zip`` with all of
them at its root, which is what Gradescope takes. ``setup.sh`` installs
bubblewrap and the course's requirements (torch from its CPU-only index) and
makes the reference notebooks and the points file readable by root only; it
fails the image's build, saying why, where the image cannot run the grader
(``check_image.sh``: Python >= 3.11 and pip >= 23 before the installs; after
them, a reference notebook graded as a submission under the bundle's isolation,
so that a sandbox that cannot start is found at build time, not by every
student's 0). ``run_autograder`` runs::

    python3 -P -m attention_course.grade gradescope --submission /autograder/submission \\
        --results /autograder/results/results.json --solutions /autograder/source/solutions

with the bundled package on the import path; ``AUTOGRADER_ROOT`` (default
``/autograder``) and ``AUTOGRADER_PYTHON`` (default ``python3``) change where
and with what it runs, for a test.

The run grades every ``.ipynb`` of the submission folder whose name matches a
reference notebook (with one reference and one notebook, whatever its name),
each as the command line grades it: in a sandbox, under the isolation the
bundle was built with (never weaker: without bubblewrap the result says so and
scores nothing unless the bundle was built with ``--isolation=rlimit``). Under
bubblewrap the student's code sees only the system's and the package's files,
so not ``/autograder/source/solutions`` nor the points file; the hidden cases
are drawn in the grader's process from a seed that is never in the sandbox's
environment. It always writes ``results.json``
(:func:`.exports.gradescope_results`), also when nothing could be graded, with
the hidden cases' seed in its ``extra_data`` and in the run's log (its stdout,
which students do not see).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import stat
import zipfile
from pathlib import Path

from .canonical import (
    AUTO,
    check_cells,
    default_reference,
    find_reference,
    read_notebook,
)
from .cli import (
    ISOLATION_HELP,
    _grade_in_child,
    _without_current_folder,
    add_points_argument,
    load_points,
)
from .exports import gradescope_results
from .grade import DEFAULT_NOTEBOOK_TIMEOUT_S, DEFAULT_TIMEOUT_S, score_result
from .points import Points
from .results import NotebookResult
from .sandbox import ISOLATIONS, Limits, adopt_orphans, bwrap_works

RUN_AUTOGRADER = """#!/usr/bin/env bash
# Gradescope runs this in its container for each submission; the course's grader writes results/results.json.
set -u
ROOT="${{AUTOGRADER_ROOT:-/autograder}}"
mkdir -p "$ROOT/results"
cd "$ROOT"
export PYTHONPATH="$ROOT/source/course/src"
exec "${{AUTOGRADER_PYTHON:-python3}}" -P -m attention_course.grade gradescope \\
    --submission "$ROOT/submission" --results "$ROOT/results/results.json" \\
    --solutions "$ROOT/source/solutions" --isolation {isolation}{points}
"""

SETUP_SH = """#!/usr/bin/env bash
# Gradescope runs this once when it builds the autograder's image (Ubuntu, as root).
set -euo pipefail
SOURCE=/autograder/source
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap python3 python3-pip python3-venv
bash "$SOURCE/check_image.sh" python  # Python >= 3.11, pip >= 23: else the build fails here, saying so
python3 -m pip install --break-system-packages --quiet torch=={torch} --index-url https://download.pytorch.org/whl/cpu
python3 -m pip install --break-system-packages --quiet -r "$SOURCE/course/requirements.txt"
# the student's code must never read the reference notebooks or the points: root only (the package stays readable)
chmod -R go-rwx "$SOURCE/solutions"
[ -e "$SOURCE/points.toml" ] && chmod go-rwx "$SOURCE/points.toml"
chmod -R a+rX "$SOURCE/course"
chmod +x "$SOURCE/run_autograder"
bash "$SOURCE/check_image.sh" sandbox  # a reference notebook graded as a submission: else the build fails here
"""

CHECK_IMAGE = """#!/usr/bin/env bash
# Whether Gradescope's image can run the grader, checked when the image is built (setup.sh), so that a missing
# requirement fails the build loudly instead of giving every student 0. `check_image.sh python`: Python >= 3.11 and
# pip >= 23; `check_image.sh sandbox`: a reference notebook graded, as a submission, under the bundle's isolation.
set -uo pipefail
SOURCE="${{AUTOGRADER_SOURCE:-/autograder/source}}"
PYTHON="${{AUTOGRADER_PYTHON:-python3}}"
fail() {{ echo "AUTOGRADER SETUP FAILED: $*" >&2; exit 1; }}
case "${{1:-}}" in
python)
    "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' ||
        fail "the grader needs Python >= 3.11; this image has $("$PYTHON" -V 2>&1): choose a newer base image" \
             "(Ubuntu 24.04) in the assignment's autograder settings"
    PIP=$("$PYTHON" -m pip --version 2>/dev/null | cut -d' ' -f2)
    [ "${{PIP%%.*}}" -ge 23 ] 2>/dev/null || fail "the grader needs pip >= 23; this image has ${{PIP:-no pip}}" ;;
sandbox)
    REFERENCE=$(ls "$SOURCE"/solutions/*.ipynb | head -n 1)
    OUT=$(PYTHONPATH="$SOURCE/course/src" "$PYTHON" -P -m attention_course.grade "$REFERENCE" --solutions \
          "$SOURCE/solutions" --isolation {isolation} 2>&1) ||
        fail "grading the reference notebook $REFERENCE in this image (isolation {isolation}) failed:" \
             "$OUT"$'\n'"where bubblewrap cannot run, rebuild the bundle with --isolation=rlimit (weaker; see the" \
             "instructor guide)"
    echo "$OUT" ;;
*) fail "usage: check_image.sh python|sandbox" ;;
esac
"""

# what the grader needs besides torch (installed from its CPU index by
# setup.sh)
BUNDLE_REQUIREMENTS = [
    "numpy",
    "matplotlib",
    "einops",
    "tqdm",
    "tensorflow-cpu",
    "keras",
    "ipykernel",
    "nbformat",
    "nbclient",
    "pyyaml",
    "transformers",
]


def _pins(root: Path) -> dict[str, str]:
    """``{package: pinned line}`` from the course's requirements files."""
    pins = {}
    for name in ("requirements-reader.txt", "requirements.txt"):
        path = root / name
        if not path.is_file():
            continue
        for line in path.read_text(encoding="utf-8").splitlines():
            spec = line.split("#")[0].strip()
            if "==" in spec and ";" not in spec:
                pins[spec.split("==")[0].strip().lower()] = spec
    return pins


def build_bundle(
    out: Path,
    reference: Path,
    notebooks: list[str] | None,
    points: str | None,
    isolation: str,
) -> Path:
    """Write the bundle into ``out`` (see the module docstring); return the
    zip's path."""
    import attention_course

    src = Path(attention_course.__file__).resolve().parent
    root = src.parents[1]
    refs = (
        sorted(reference.glob("*.ipynb"))
        if reference.is_dir()
        else [reference]
    )
    if notebooks:
        wanted = {Path(n).stem for n in notebooks}
        missing = wanted - {p.stem for p in refs}
        if missing:
            raise ValueError(
                "--notebooks: no reference notebook named "
                f"{', '.join(sorted(missing))} in {reference}"
            )
        refs = [p for p in refs if p.stem in wanted]
    out.mkdir(parents=True, exist_ok=True)
    for old in ("solutions", "course"):
        shutil.rmtree(out / old, ignore_errors=True)
    (out / "solutions").mkdir()
    for path in refs:
        shutil.copy(path, out / "solutions" / path.name)
    shutil.copytree(
        src,
        out / "course" / "src" / "attention_course",
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
    )
    pins = _pins(root)
    requirements = [pins.get(name, name) for name in BUNDLE_REQUIREMENTS]
    (out / "course" / "requirements.txt").write_text(
        "\n".join(requirements) + "\n", encoding="utf-8"
    )
    if points:
        shutil.copy(points, out / "points.toml")
    else:
        (out / "points.toml").unlink(missing_ok=True)
    points_arg = (
        ' \\\n    --points "$ROOT/source/points.toml"' if points else ""
    )
    torch = pins.get("torch", "torch==2.13.0").split("==")[1]
    for name, text in (
        (
            "run_autograder",
            RUN_AUTOGRADER.format(isolation=isolation, points=points_arg),
        ),
        ("setup.sh", SETUP_SH.format(torch=torch)),
        ("check_image.sh", CHECK_IMAGE.format(isolation=isolation)),
    ):
        (out / name).write_text(text, encoding="utf-8")
        (out / name).chmod(0o755)
    archive = out / "autograder.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as z:
        for path in sorted(out.rglob("*")):
            if path.is_file() and path != archive:
                info = zipfile.ZipInfo.from_file(
                    path, str(path.relative_to(out))
                )
                info.external_attr = (
                    stat.S_IFREG
                    | (0o755 if os.access(path, os.X_OK) else 0o644)
                ) << 16
                z.writestr(info, path.read_bytes(), zipfile.ZIP_DEFLATED)
    return archive


def main_bundle(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -P -m attention_course.grade bundle",
        description="Build Gradescope's autograder bundle (setup.sh, "
        "run_autograder).",
    )
    parser.add_argument(
        "--out",
        required=True,
        help="folder to write the bundle and autograder.zip into",
    )
    parser.add_argument(
        "--notebooks",
        nargs="*",
        help="the reference notebooks of this assignment (default: all)",
    )
    parser.add_argument(
        "--solutions",
        "--reference",
        dest="reference",
        default=AUTO,
        help="folder of solution notebooks (default: the course's solutions/)",
    )
    parser.add_argument(
        "--isolation", choices=ISOLATIONS, default="bwrap", help=ISOLATION_HELP
    )
    add_points_argument(parser)
    args = parser.parse_args(argv)
    args.reference = (
        default_reference()
        if args.reference == AUTO
        else Path(args.reference).resolve()
    )
    if args.reference is None or not Path(args.reference).exists():
        parser.error(f"--solutions {args.reference}: no such file or folder")
    load_points(parser, args)
    try:
        archive = build_bundle(
            Path(args.out),
            Path(args.reference),
            args.notebooks,
            args.points,
            args.isolation,
        )
    except (OSError, ValueError) as err:
        parser.error(str(err))
    print(
        f"wrote {archive}: upload it as the assignment's autograder "
        f"(isolation: {args.isolation})"
    )
    return 0


def _notebooks(
    submission: Path, reference: Path
) -> list[tuple[Path, Path | None]]:
    """(notebook, its reference) for every ``.ipynb`` of the submission."""
    paths = [
        p
        for p in sorted(submission.rglob("*.ipynb"))
        if ".ipynb_checkpoints" not in p.parts
    ]
    refs = (
        sorted(reference.glob("*.ipynb"))
        if reference.is_dir()
        else [reference]
    )
    if len(paths) == 1 and len(refs) == 1:
        return [(paths[0], refs[0])]
    return [(p, find_reference(p.name, reference)) for p in paths]


def _possible(reference: Path, points: Points) -> float:
    """The points the reference notebook's exercises are worth (0 if it cannot
    be read)."""
    nb, _ = read_notebook(reference)
    cells = check_cells(nb) if nb is not None else []
    return round(
        sum(points.of(reference.stem, c.number, c.level)[0] for c in cells), 4
    )


def main_run(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -P -m attention_course.grade gradescope",
        description="Grade one Gradescope submission and write results.json.",
    )
    parser.add_argument(
        "--submission",
        required=True,
        help="the submission's folder (/autograder/submission)",
    )
    parser.add_argument(
        "--results", required=True, help="where to write results.json"
    )
    parser.add_argument(
        "--solutions",
        "--reference",
        dest="reference",
        required=True,
        help="the reference notebooks (a folder, or one notebook)",
    )
    parser.add_argument(
        "--isolation", choices=ISOLATIONS, default="bwrap", help=ISOLATION_HELP
    )
    parser.add_argument("--timeout", type=int, default=DEFAULT_TIMEOUT_S)
    parser.add_argument(
        "--notebook-timeout", type=int, default=DEFAULT_NOTEBOOK_TIMEOUT_S
    )
    parser.add_argument("--memory-mb", type=int, default=Limits.memory_mb)
    add_points_argument(parser)
    args = parser.parse_args(argv)
    _without_current_folder()
    args.reference = Path(args.reference).resolve()
    # the bundle may hold some chapters of a course's file
    points = load_points(parser, args, complete=False)
    args.seed = secrets.randbelow(2**31)
    results: list[NotebookResult] = []
    possible: dict[str, float] = {}
    note = None
    if args.isolation == "bwrap" and not bwrap_works():
        note = (
            "Not graded: bubblewrap cannot run in this container; the "
            "instructor can rebuild the autograder "
            "with --isolation=rlimit (weaker; see the instructor guide)"
        )
    else:
        adopt_orphans()
        found = _notebooks(Path(args.submission), args.reference)
        if not found:
            note = (
                "No .ipynb file in the submission: upload your exercise "
                "notebook."
            )
        for path, reference in found:
            if reference is None:
                results.append(
                    NotebookResult(
                        str(path.name),
                        error="no reference notebook has this name: upload "
                        "the exercise notebook under the name it was given",
                    )
                )
                continue
            child = argparse.Namespace(
                **{**vars(args), "reference": reference}
            )
            result = score_result(_grade_in_child(str(path), child), points)
            result.notebook = (
                str(path.relative_to(args.submission))
                if path.is_relative_to(args.submission)
                else path.name
            )
            possible[result.notebook] = _possible(reference, points)
            results.append(result)
    out = Path(args.results)
    out.parent.mkdir(parents=True, exist_ok=True)
    data = gradescope_results(
        results, note, possible, points.hidden_visibility
    )
    # kept with the submission: the hidden cases can be drawn again
    data["extra_data"] = {"seed": args.seed}
    out.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    # stdout: the instructor's log (hidden from students)
    print(f"wrote {out}; hidden-case seed {args.seed}")
    return 0
