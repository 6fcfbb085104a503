# The Python interpreter that creates .venv (included by the Makefile).
# PYTHON=... on the command line or in the environment wins; otherwise the first of PYTHON_CANDIDATES that runs and
# is at least 3.11 (what pyproject.toml requires; CI and the stored notebook outputs use 3.11).
PYTHON_CANDIDATES := python3.11 python3.12 python3.13 python3
PYTHON_MIN := 3.11
PYTHON_OK = -c 'import sys; sys.exit(sys.version_info < (3, 11))'

ifeq ($(origin PYTHON),undefined)
PYTHON := $(firstword $(foreach p,$(PYTHON_CANDIDATES),$(shell $(p) $(PYTHON_OK) >/dev/null 2>&1 && echo $(p))))
endif
