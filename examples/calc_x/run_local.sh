#!/usr/bin/env bash
# Calc-X on one machine: the Gateway (port 8181, with a key), the Controller running each rollout's
# agent as a local process (AutoGen + MCP in .venv-examples), and the training in the foreground.
#   examples/calc_x/run_local.sh --train-file data/train.parquet --val-file data/test.parquet \
#       --model PATH [--async] [key=value ...]
# Every argument goes to train_calc_agent.py. On exit, failure or Ctrl-C, the processes this script
# started are stopped by their process ids (never by name).
# Environment: PYTHON, AGENT_PYTHON, AGL_PORT (8181), AGL_KEY (default: a fresh random one), RUN_DIR.
set -euo pipefail
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

AGENT_PYTHON="${AGENT_PYTHON:-$REPO/.venv-examples/bin/python}"
[[ -x "$AGENT_PYTHON" ]] || { echo "run_local.sh: $AGENT_PYTHON not found (run 'make examples-venv')" >&2; exit 2; }

start_gateway host=127.0.0.1
start_controller runner_type=local \
  local_runner.python="$AGENT_PYTHON" local_runner.cwd="$HERE" local_runner.log_dir="$RUN_DIR/agents"
status=0
train "$@" || status=$?
exit "$status"
