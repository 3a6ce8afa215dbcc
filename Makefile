# Quick start: `make demo` trains the tiny model on CPU; `make test` runs the suite.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
LINT_DIRS := $(wildcard agentlightning tests bench examples docs)

.PHONY: venv test lint demo clean

venv: $(STAMP)

# torch==2.13.0 first: the CPU build on this machine's disk, instead of a multi-GB CUDA download.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[train,k8s,dev]'
	touch $(STAMP)

lint: venv
	$(BIN)/ruff check $(LINT_DIRS)
	$(BIN)/ruff format --check $(LINT_DIRS)

test: lint
	$(BIN)/pytest -q

# The full loop on CPU: Gateway, Controller and trainer as three processes (docs/demo.md).
demo: venv
	$(BIN)/agl-demo $(ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
