"""Publishing and teaching wiring: CI workflows run the README's commands, every notebook starts with the install
cell that makes the Colab button work, the tocs list existing files, the launch/download/repository buttons are
configured and present on every notebook page of the built book (_build/html; those checks skip until `make book` has
run), and the instructor guide agrees with the chapters, the exercise notebooks and the checks' diagnosis codes."""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
HTML = ROOT / "_build" / "html"
WORKFLOWS = ROOT / ".github" / "workflows"
NOTEBOOK_DIRS = ("book", "exercises", "solutions")

# The first code cell of every notebook, tagged hide-cell (CONTRIBUTING.md, "Adding a chapter").
INSTALL_SOURCE = (
    "# Colab and other hosted notebooks do not have the course package: install it once "
    "(locally it is already installed).\n"
) + '''try:
    import attention_course
except ModuleNotFoundError:
    %pip install --quiet "attention_course @ git+https://github.com/attention-step-by-step/attention-course"'''

sys.path.insert(0, str(ROOT / "tools"))
from check_links import parse_pages  # noqa: E402
from student_toc import toc_docnames  # noqa: E402


def load_yaml(path):
    return yaml.safe_load(Path(path).read_text(encoding="utf-8"))


def readme_blocks():
    """The README's fenced bash blocks, each as a list of commands (comments dropped, `\\` continuations joined)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = []
    for block in re.findall(r"^```(?:bash|sh|shell)\n(.*?)^```", text, re.M | re.S):
        joined = block.replace("\\\n", " ")
        commands = [" ".join(line.split("#", 1)[0].split()) for line in joined.splitlines()]
        blocks.append([c for c in commands if c])
    return blocks


def readme_commands():
    return {command for block in readme_blocks() for command in block}


def workflow_runs(workflow):
    """Every shell command of every `run:` step, with the uses: of every step."""
    runs, uses = [], []
    for job in workflow["jobs"].values():
        for step in job.get("steps", []):
            if "run" in step:
                runs += [" ".join(line.split()) for line in step["run"].splitlines() if line.strip()]
            if "uses" in step:
                uses.append(step)
    return runs, uses


def _uses(steps, action):
    return [s for s in steps if s["uses"].split("@")[0] == action]


def _triggers(workflow):
    return workflow.get("on", workflow.get(True))  # YAML 1.1 reads a bare `on:` key as True


# --- CI --------------------------------------------------------------------------------------------------------


def test_readme_names_the_two_commands():
    assert {"make book", "make test"} <= readme_commands()


def test_test_workflow_runs_make_test_with_python_3_11():
    workflow = load_yaml(WORKFLOWS / "test.yml")
    assert {"push", "pull_request"} <= set(_triggers(workflow))
    runs, steps = workflow_runs(workflow)
    assert "make test" in runs
    undocumented = set(runs) - readme_commands()
    assert not undocumented, f"commands that the README does not document: {undocumented}"
    setup = _uses(steps, "actions/setup-python")
    assert setup and str(setup[0]["with"]["python-version"]) == "3.11"
    assert _uses(steps, "actions/checkout")
    assert all(job["runs-on"].startswith("ubuntu") for job in workflow["jobs"].values())


def test_pages_workflow_builds_with_make_book_and_deploys_the_html():
    workflow = load_yaml(WORKFLOWS / "pages.yml")
    runs, steps = workflow_runs(workflow)
    assert runs == ["make book"]
    assert "make book" in readme_commands()
    setup = _uses(steps, "actions/setup-python")
    assert setup and str(setup[0]["with"]["python-version"]) == "3.11"
    upload = _uses(steps, "actions/upload-pages-artifact")
    assert upload and upload[0]["with"]["path"].rstrip("/") == "_build/html"
    assert _uses(steps, "actions/deploy-pages")
    assert workflow["permissions"]["pages"] == "write" and workflow["permissions"]["id-token"] == "write"
    assert "push" in _triggers(workflow)


def test_makefile_runs_exactly_the_readme_test_command():
    """The README says which pytest command `make test` runs; `make -n` (prints, runs nothing) must agree."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    runs_pytest = re.compile(r"^(\w+=\S+ )*\.venv/bin/python -m pytest ")  # environment assignments may come first
    pytest_blocks = [b for b in readme_blocks() if any(runs_pytest.match(c) for c in b)]
    assert len(pytest_blocks) == 1, "the README should show the test command in one block"
    (command,) = pytest_blocks[0]
    # The README shows the 2-core machine's thread count (cores / workers); fixed here so any machine compares alike.
    dry_run = subprocess.run(["make", "-n", "--no-print-directory", "test", "OMP_NUM_THREADS=1"], cwd=ROOT,
                             capture_output=True, text=True, check=True).stdout
    recipe = " ".join(dry_run.replace("\\\n", " ").split())
    assert command in recipe, f"`make -n test` does not run the README's command:\n{dry_run}"


# --- notebooks and tocs ------------------------------------------------------------------------------------------


def notebooks():
    return sorted(p for d in NOTEBOOK_DIRS for p in (ROOT / d).glob("*.ipynb"))


@pytest.mark.parametrize("path", notebooks(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_first_code_cell_is_the_install_cell(path):
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    first = next(c for c in cells if c["cell_type"] == "code")
    source = "".join(first["source"]) if isinstance(first["source"], list) else first["source"]
    assert source == INSTALL_SOURCE, "the first code cell must be exactly the install cell of the brief"
    assert "hide-cell" in first.get("metadata", {}).get("tags", [])


def test_install_cell_installs_from_the_repository_the_buttons_point_to():
    url = load_yaml(ROOT / "_config.yml")["repository"]["url"]
    assert f"git+{url}" in INSTALL_SOURCE


@pytest.mark.parametrize("toc", ["_toc.yml", "_toc_student.yml"])
def test_every_toc_entry_exists(toc):
    for docname in toc_docnames(ROOT / toc):
        assert any((ROOT / (docname + s)).is_file() for s in (".ipynb", ".md")), f"{toc}: {docname} does not exist"


def test_launch_download_and_repository_settings():
    config = load_yaml(ROOT / "_config.yml")
    assert config["only_build_toc_files"] is True  # the student edition relies on it
    repository = config["repository"]
    assert urlsplit(repository["url"]).netloc == "github.com" and repository["branch"]
    html = config["html"]
    assert html["use_repository_button"] and html["use_issues_button"]
    launch = config["launch_buttons"]
    assert launch["binderhub_url"] == "https://mybinder.org"
    assert launch["colab_url"] == "https://colab.research.google.com"
    assert launch["notebook_interface"] in ("classic", "jupyterlab")
    assert (ROOT / "binder" / "requirements.txt").is_file(), "Binder installs binder/requirements.txt"
    assert "book_html_fixes" in config["sphinx"]["local_extensions"]
    assert (ROOT / config["sphinx"]["local_extensions"]["book_html_fixes"] / "book_html_fixes.py").is_file()


# --- the built book ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def built_pages():
    if not (HTML / "index.html").is_file():
        pytest.skip(f"{HTML.relative_to(ROOT)}/index.html not found: run `make book` first")
    return parse_pages(HTML)


def test_every_notebook_page_has_launch_download_repository_and_edit_buttons_and_the_licence(built_pages):
    config = load_yaml(ROOT / "_config.yml")
    repo_url, branch = config["repository"]["url"], config["repository"]["branch"]
    repo = urlsplit(repo_url).path.strip("/")
    interface = "lab/tree" if config["launch_buttons"]["notebook_interface"] == "jupyterlab" else "tree"
    problems, notebook_pages = [], 0
    for docname in toc_docnames(ROOT / "_toc.yml"):
        page = f"{docname}.html"
        assert page in built_pages, f"{page} is missing from _build/html (built before _toc.yml changed? `make book`)"
        links = {url for _, _, url in built_pages[page].links}
        suffix = ".ipynb" if (ROOT / f"{docname}.ipynb").is_file() else ".md"
        expected = {"repository button": repo_url, "edit this page": f"{repo_url}/edit/{branch}/{docname}{suffix}",
                    "licence (footer)": "https://creativecommons.org/licenses/by/4.0/"}
        if (ROOT / f"{docname}.ipynb").is_file():
            notebook_pages += 1
            depth = "../" * docname.count("/")
            expected |= {
                "Binder": f"https://mybinder.org/v2/gh/{repo}/{branch}?urlpath={interface}/{docname}.ipynb",
                "Colab": f"https://colab.research.google.com/github/{repo}/blob/{branch}/{docname}.ipynb",
                "download .ipynb": f"{depth}_sources/{docname}.ipynb",
            }
        problems += [f"{page}: no {what} ({url})" for what, url in expected.items() if url not in links]
        if suffix == ".ipynb" and "initThebeSBT()" not in (HTML / page).read_text(encoding="utf-8"):
            problems.append(f"{page}: no live-code (Thebe) button")
    assert notebook_pages, "no notebook in _toc.yml"
    assert not problems, "\n".join(problems)


def test_no_page_declares_an_inline_script_twice(built_pages):
    """A duplicated inline <script> (Sphinx 7.4 with sphinx-thebe: `const THEBE_JS_URL` twice) is a page error;
    tools/book_html_fixes.py removes them. The browser test sees the error too; this check needs no browser."""
    problems = []
    for page in built_pages:
        text = (HTML / page).read_text(encoding="utf-8")
        bodies = [b.strip() for b in re.findall(r"<script>(.*?)</script>", text, re.S) if b.strip()]
        duplicated = {b[:60] for b in bodies if bodies.count(b) > 1}
        problems += [f"{page}: {b!r}" for b in sorted(duplicated)]
    assert not problems, "inline scripts written twice:\n" + "\n".join(problems)


def test_mathjax_on_the_pages_is_the_major_version_the_browser_test_serves(built_pages):
    intro = (HTML / f"{toc_docnames(ROOT / '_toc.yml')[0]}.html").read_text(encoding="utf-8")
    sources = re.findall(r'<script[^>]*src="([^"]*mathjax[^"]*)"', intro, re.I)
    assert sources and all("mathjax@3" in s for s in sources), f"MathJax scripts: {sources}"
    script = (ROOT / "tools" / "install_browser.sh").read_text(encoding="utf-8")
    assert re.search(r"^MATHJAX_VERSION=3\.", script, re.M), "tools/install_browser.sh must fetch MathJax 3"


# --- the instructor guide ----------------------------------------------------------------------------------------

GUIDE = ROOT / "book" / "instructor_guide.md"
CHAPTERS = ["01_soft_lookup", "02_single_head", "03_multi_head", "04_masking", "05_einsum", "06_tensorflow",
            "07_bug_field_guide", "08_kv_cache", "09_efficient_attention", "10_positions",
            "11_transformer_block", "12_attention_learns", "13_distributed_attention", "14_modern_attention",
            "15_flex_attention", "16_triton_kernel", "17_linear_attention", "18_serving"]


def guide_sections():
    """{chapter file stem: section text} for the guide's `### N. Title` sections."""
    text = GUIDE.read_text(encoding="utf-8")
    parts = re.split(r"^### (\d+\. .+)$", text, flags=re.M)
    sections = {}
    for title, body in zip(parts[1::2], parts[2::2], strict=True):
        body = body.split("\n## ", 1)[0]
        found = re.search(r"\]\((\d\d_\w+)\.ipynb\)", body)
        number = title.split(".")[0]
        assert found and found[1].startswith(f"{int(number):02d}_"), f"section {title!r} does not link its chapter"
        sections[found[1]] = f"# {title}\n{body}"
    return sections


def _notebook_text(path):
    return "\n".join("".join(c["source"]) for c in json.loads(path.read_text(encoding="utf-8"))["cells"])


def test_instructor_guide_maps_every_chapter_with_its_exercises():
    sections = guide_sections()
    assert list(sections) == CHAPTERS
    for stem, body in sections.items():
        assert f"](../exercises/{stem}_exercises.ipynb)" in body, f"{stem}: no link to its exercises"
        assert "solutions/" not in body, f"{stem}: the guide must not link to solutions (student edition)"
        for field in ("**Objectives:**", "**Prerequisites:**", "**Exercises:**"):
            assert field in body, f"{stem}: no {field}"


@pytest.mark.parametrize("stem", CHAPTERS)
def test_instructor_guide_agrees_with_the_chapter_and_its_exercises(stem):
    """The guide's time is the chapter's own estimate; its exercise list is the solution notebook's headings."""
    body = guide_sections()[stem]
    chapter = ROOT / "book" / f"{stem}.ipynb"
    guide_time = re.search(r"estimated time \*\*(\d+) minutes\*\*", body)
    if chapter.is_file():
        text = _notebook_text(chapter)
        assert body.splitlines()[0] == text.splitlines()[0], f"{stem}: the title differs from the chapter's"
        stated = re.search(r"\*\*Estimated time:\*\*\s*(\d+) minutes", text)
        assert (guide_time and guide_time[1]) == (stated and stated[1]), f"{stem}: the time differs from the chapter's"
    else:
        assert guide_time is None, f"{stem}: the guide states a time for a chapter that does not exist yet"
    listed = re.findall(r"^\s+\d+\. (.+) \*\((warm-up|core|challenge)\)\*$", body, re.M)
    solution = ROOT / "solutions" / f"{stem}_exercises.ipynb"
    if solution.is_file():
        headings = re.findall(r"^##\s+Exercise\s+\d+\s+\(([^)]*)\)\s*:\s*(.+?)\s*$", _notebook_text(solution), re.M)
        assert listed == [(title, level) for level, title in headings], f"{stem}: exercises differ from {solution.name}"
    else:
        assert not listed, f"{stem}: the guide lists exercises that do not exist yet"


def test_instructor_guide_sample_grader_output_matches_the_notebooks():
    text = GUIDE.read_text(encoding="utf-8")
    notebook, rows = None, 0
    for line in text.splitlines():
        header = re.match(r"^((?:solutions|exercises)/\S+\.ipynb): (\d+)/(\d+) exercises, [\d.]+/[\d.]+ points$",
                          line)
        if header:
            notebook = ROOT / header[1]
            headings = re.findall(r"^##\s+Exercise\s+(\d+)\s+\([^)]*\)\s*:\s*(.+?)\s*$", _notebook_text(notebook), re.M)
            assert int(header[3]) == len(headings), f"{header[1]}: the guide's total differs from the notebook"
            continue
        row = re.match(r"^\s+Exercise (\d+)\s+(.+?)\s+[\d.]+/[\d.]+\s+(pass|PART|FAIL)\b", line)
        if row:
            assert notebook is not None and (row[1], row[2]) in headings, f"{line!r} is not an exercise of {notebook}"
            rows += 1
    assert rows, "the guide shows no sample output of the grader"


def test_diagnosis_codes_named_in_the_docs_exist():
    from attention_course.checks import CODES

    for doc in (GUIDE, ROOT / "CONTRIBUTING.md"):
        unknown = set(re.findall(r"`\[([a-z][a-z-]+)\]", doc.read_text(encoding="utf-8"))) - set(CODES)
        assert not unknown, f"{doc.name} names diagnosis codes that attention_course.checks does not have: {unknown}"
