#!/usr/bin/env bash
# SWE tasks on one machine: the Gateway (port 8181, with a key), the Controller running each
# rollout's mini-swe-agent as a local process (.venv-swe; every command the model writes runs in
# bubblewrap, the grader outside it), and the training in the foreground.
#   examples/swe/run_local.sh --train-file examples/swe/data/train.jsonl --model PATH [--async] [key=value ...]
# Every argument goes to train_swe_agent.py. On exit, failure or Ctrl-C, the processes this script
# started are stopped by their process ids (never by name); the sandboxes go with their agents.
# Environment: PYTHON, SWE_PYTHON (.venv-swe/bin/python), AGL_PORT (8181), AGL_KEY (default: a fresh
# random one), RUN_DIR, AGL_START_TIMEOUT (60 s for the Gateway to answer), SWE_* (the agent's knobs,
# see mini_agent.py), AGL_GATEWAY_ARGS (more agl-server key=value settings, space-separated, e.g.
# "default_proxy.val.temperature=0.0" for greedy validation).
set -euo pipefail
EXAMPLE_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck disable=SC2034  # both read by common.sh
TRAIN_SCRIPT="$EXAMPLE_DIR/train_swe_agent.py"
# shellcheck source=../calc_x/common.sh
source "$EXAMPLE_DIR/../calc_x/common.sh"

SWE_PYTHON="${SWE_PYTHON:-$REPO/.venv-swe/bin/python}"
[[ -x "$SWE_PYTHON" ]] || { echo "run_local.sh: $SWE_PYTHON not found (run 'make swe-venv')" >&2; exit 2; }
command -v bwrap >/dev/null || { echo "run_local.sh: bwrap not found (apt-get install -y bubblewrap)" >&2; exit 2; }
# The agents import the example (and the sandbox module) from the repository.
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"

read -ra GATEWAY_ARGS <<<"${AGL_GATEWAY_ARGS:-}"
start_gateway host=127.0.0.1 "${GATEWAY_ARGS[@]}"
start_controller runner_type=local \
  local_runner.python="$SWE_PYTHON" local_runner.cwd="$HERE" local_runner.log_dir="$RUN_DIR/agents"
status=0
train "$@" || status=$?
exit "$status"
