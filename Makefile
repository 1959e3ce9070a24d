# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-dev
export DS_BUILD_OPS := 0
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: install dev test lint typecheck pytest demo clean

# Login-node install: the tuner alone (no torch, no GPU).
install:
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -e .

# Development install: test tools plus the CPU training stack (torch 2.13.0 CPU, DeepSpeed
# without building GPU ops), torch pinned so nothing pulls another build.
$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -c constraints.txt torch==2.13.0
	$(PY) -m pip install -q -c constraints.txt -e '.[test,train]'
	touch $(STAMP)

dev: $(STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: $(STAMP)
	$(VENV)/bin/mypy

pytest: $(STAMP)
	$(VENV)/bin/pytest -q

test: lint typecheck pytest

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
