# Quick start: `make demo` trains the tiny model on CPU; `make test` runs the suite.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
LINT_DIRS := $(wildcard agentlightning tests bench examples docs)

.PHONY: venv test test-verl lint demo clean

venv: $(STAMP)

# torch==2.13.0 first: the CPU build on this machine's disk, instead of a multi-GB CUDA download.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[train,k8s,dev]'
	touch $(STAMP)

# The verl backend's tests run in their own venv: verl 0.9.1 on the CPU torch. torch==2.13.0 on the
# same command line keeps pip from pulling a CUDA torch and its nvidia packages; leftovers removed.
VERL_VENV := .venv-verl
$(VERL_VENV)/.installed: pyproject.toml
	rm -rf $(VERL_VENV)
	$(PYTHON) -m venv $(VERL_VENV)
	$(VERL_VENV)/bin/pip install --quiet --upgrade pip
	$(VERL_VENV)/bin/pip install --quiet torch==2.13.0 -e '.[verl,train,dev]'
	$(VERL_VENV)/bin/pip list --format=freeze | grep -iE '^(nvidia-|triton=)' | cut -d= -f1 \
		| xargs -r $(VERL_VENV)/bin/pip uninstall --quiet -y
	$(VERL_VENV)/bin/pip check
	touch $@

test-verl: $(VERL_VENV)/.installed
	$(VERL_VENV)/bin/python -m pytest -q tests/verl

lint: venv
	$(BIN)/ruff check $(LINT_DIRS)
	$(BIN)/ruff format --check $(LINT_DIRS)

test: lint test-verl
	$(BIN)/pytest -q

# The full loop on CPU: Gateway, Controller and trainer as three processes (docs/demo.md).
demo: venv
	$(BIN)/agl-demo $(ARGS)

clean:
	rm -rf $(VENV) $(VERL_VENV) .pytest_cache .ruff_cache .hypothesis
