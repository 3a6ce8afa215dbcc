#!/usr/bin/env bash
# LLM-in-Sandbox on one machine: the Gateway (port 8181, with a key), the Controller running each
# rollout's agent as a local process (.venv-examples; its tools run in bubblewrap), and the
# training in the foreground.
#   examples/llm_in_sandbox/run_local.sh --train-file examples/llm_in_sandbox/data/train.jsonl \
#       --val-file examples/llm_in_sandbox/data/test.jsonl --model PATH [--async] [key=value ...]
# Every argument goes to train_llm_in_sandbox_agent.py. On exit, failure or Ctrl-C, the processes
# this script started are stopped by their process ids (never by name).
# Environment: PYTHON, AGENT_PYTHON, AGL_PORT (8181), AGL_KEY (default: a fresh random one), RUN_DIR,
# AGL_START_TIMEOUT (60 s for the Gateway to answer),
# SANDBOX_* (the agent's knobs, see the README).
set -euo pipefail
EXAMPLE_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck disable=SC2034  # both read by common.sh
TRAIN_SCRIPT="$EXAMPLE_DIR/train_llm_in_sandbox_agent.py"
# shellcheck source=../calc_x/common.sh
source "$EXAMPLE_DIR/../calc_x/common.sh"

AGENT_PYTHON="${AGENT_PYTHON:-$REPO/.venv-examples/bin/python}"
[[ -x "$AGENT_PYTHON" ]] || { echo "run_local.sh: $AGENT_PYTHON not found (run 'make examples-venv')" >&2; exit 2; }
command -v bwrap >/dev/null || { echo "run_local.sh: bwrap not found (apt-get install -y bubblewrap)" >&2; exit 2; }
# Pod mode runs the model's commands without bubblewrap: only inside a Job's pod (job-template.yaml).
[[ "${SANDBOX_ISOLATION:-bwrap}" == bwrap ]] || {
  echo "run_local.sh: SANDBOX_ISOLATION=$SANDBOX_ISOLATION is for Kubernetes Jobs only; here commands run in bubblewrap" >&2
  exit 2
}

start_gateway host=127.0.0.1
start_controller runner_type=local \
  local_runner.python="$AGENT_PYTHON" local_runner.cwd="$HERE" local_runner.log_dir="$RUN_DIR/agents"
status=0
train "$@" || status=$?
exit "$status"
