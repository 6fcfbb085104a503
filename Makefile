# One entry point for readers, students, instructors and CI.
#   make book     build the HTML book into _build/html (warnings are errors)
#   make test     unit tests + coverage, nbval over every notebook, browser test of the built book
#   make outputs  re-execute notebooks in place (NB="book/01_soft_lookup.ipynb" for one)
#   make bench    run the benchmarks and regenerate benchmarks/README.md
# Each target creates .venv and installs requirements.txt first, once: re-running installs nothing new.

PYTHON ?= python3.11
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

.PHONY: book test unit nbval browser outputs exercises bench clean

$(STAMP): requirements.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements.txt
	touch $(STAMP)

book: $(STAMP)
	$(BIN)/jupyter-book build . -W -n --keep-going
	@echo "Book built: open file://$(CURDIR)/_build/html/index.html"

browser: $(STAMP)
	@bash tools/install_browser.sh

test: book student-book browser
	$(BIN)/python -m pytest -n 2 --dist loadscope --timeout 900 \
	  --cov=attention_course --cov-report=term-missing:skip-covered --cov-fail-under=95 \
	  --nbval --nbval-sanitize-with tools/nbval_sanitize.cfg \
	  tests $(NOTEBOOK_DIRS)

outputs: $(STAMP)
	$(BIN)/python tools/execute_notebooks.py $(NB)

exercises: $(STAMP)
	$(BIN)/python -m attention_course.exercises

bench: $(STAMP)
	$(BIN)/python benchmarks/run_all.py

clean:
	rm -rf _build

# Student edition: the same book without solutions/ (_toc_student.yml, regenerated here from _toc.yml by
# tools/student_toc.py), same _config.yml, same execution cache (what `make book` ran is not run again).
.PHONY: student-book
student-book: $(STAMP)
	$(BIN)/python tools/student_toc.py
	$(BIN)/jupyter-book build . --toc _toc_student.yml --path-output _build/student -W -n --keep-going
	@echo "Student edition built: open file://$(CURDIR)/_build/student/_build/html/index.html"
