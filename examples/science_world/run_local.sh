#!/usr/bin/env bash
# ScienceWorld on one machine: the Gateway (port 8181, with a key), the Controller running each
# rollout's agent as a local process (.venv-examples; each agent starts its own simulator JVM),
# and the training (asynchronous, as v1.0) in the foreground.
#   examples/science_world/run_local.sh --train-file examples/science_world/data/train.jsonl \
#       --val-file examples/science_world/data/val.jsonl --model PATH [--sync] [key=value ...]
# Every argument goes to train_sw_agent.py. The agents' limits come from the environment
# (SCIENCE_WORLD_MAX_TURNS, SCIENCE_WORLD_MAX_TOKENS, ... in sw_agent.py). On exit, failure or
# Ctrl-C the processes this script started are stopped by their process ids (never by name); the
# Controller stops each agent's process group, JVM included.
# Environment: PYTHON, AGENT_PYTHON, AGL_PORT (8181), AGL_KEY (default: a fresh random one), RUN_DIR.
set -euo pipefail
SW_HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
RUN_DIR="${RUN_DIR:-$SW_HERE/.run}"
# shellcheck source=../calc_x/common.sh
source "$SW_HERE/../calc_x/common.sh"

AGENT_PYTHON="${AGENT_PYTHON:-$REPO/.venv-examples/bin/python}"
[[ -x "$AGENT_PYTHON" ]] || { echo "run_local.sh: $AGENT_PYTHON not found (run 'make examples-venv')" >&2; exit 2; }
command -v java >/dev/null 2>&1 || { echo "run_local.sh: no java on PATH (Debian: apt-get install default-jre-headless)" >&2; exit 2; }

# common.sh's train() runs Calc-X's script: this one runs ScienceWorld's.
train() {
  "$PYTHON" "$SW_HERE/train_sw_agent.py" --agl-base-url "$URL" --agl-key="$KEY" \
    trainer.output_dir="$RUN_DIR/trainer" "$@" &
  PIDS+=($!)
  local status=0
  wait "${PIDS[-1]}" || status=$?
  return "$status"
}

start_gateway host=127.0.0.1
start_controller runner_type=local \
  local_runner.python="$AGENT_PYTHON" local_runner.cwd="$SW_HERE" local_runner.log_dir="$RUN_DIR/agents"
status=0
train "$@" || status=$?
exit "$status"
