#!/usr/bin/env bash
# Search-R1 on one machine: the Gateway (port 8181, with a key), the retrieval service (port 8000,
# BM25 over data/corpus.jsonl), the Controller running each rollout's agent as a local process
# (.venv-examples), and the training in the foreground.
#   examples/search_r1/run_local.sh --train-file examples/search_r1/data/train.jsonl \
#       --val-file examples/search_r1/data/test.jsonl --model PATH [--async] [key=value ...]
# Every argument goes to train_search_r1_agent.py. On exit, failure or Ctrl-C, the processes this
# script started are stopped by their process ids (never by name).
# Environment: PYTHON, AGENT_PYTHON, AGL_PORT (8181), AGL_KEY (default: a fresh random one), RUN_DIR,
# AGL_START_TIMEOUT (60 s for the Gateway to answer),
# RETRIEVAL_PORT (8000), RETRIEVAL_ARGS (more retrieval_server.py flags, e.g. "--retriever dense
# --dense-model DIR"), CORPUS (data/corpus.jsonl), SEARCH_R1_* (the agent's knobs, see the README).
set -euo pipefail
EXAMPLE_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck disable=SC2034  # both read by common.sh
TRAIN_SCRIPT="$EXAMPLE_DIR/train_search_r1_agent.py"
# shellcheck source=../calc_x/common.sh
source "$EXAMPLE_DIR/../calc_x/common.sh"

AGENT_PYTHON="${AGENT_PYTHON:-$REPO/.venv-examples/bin/python}"
[[ -x "$AGENT_PYTHON" ]] || { echo "run_local.sh: $AGENT_PYTHON not found (run 'make examples-venv')" >&2; exit 2; }
CORPUS="${CORPUS:-$HERE/data/corpus.jsonl}"
RETRIEVAL_PORT="${RETRIEVAL_PORT:-8000}"
export SEARCH_R1_RETRIEVAL_URL="http://127.0.0.1:$RETRIEVAL_PORT/retrieve"  # the agents inherit it

start_gateway host=127.0.0.1
# shellcheck disable=SC2086  # RETRIEVAL_ARGS is a list of flags
"$AGENT_PYTHON" "$HERE/retrieval_server.py" --corpus "$CORPUS" --port "$RETRIEVAL_PORT" ${RETRIEVAL_ARGS:-} \
  >"$RUN_DIR/retrieval.log" 2>&1 &
PIDS+=($!)
if ! "$PYTHON" - "http://127.0.0.1:$RETRIEVAL_PORT/healthz" "${PIDS[-1]}" <<'PY'
import os, sys, time, urllib.request
deadline = time.monotonic() + 300  # a dense index over a large corpus takes a while
while time.monotonic() < deadline:
    try:
        os.kill(int(sys.argv[2]), 0)
    except OSError:
        sys.exit(1)  # the service exited
    try:
        with urllib.request.urlopen(sys.argv[1], timeout=2) as r:
            if r.status == 200:
                sys.exit(0)
    except OSError:
        pass
    time.sleep(0.5)
sys.exit(1)
PY
then
  echo "run_local.sh: the retrieval service did not answer its /healthz; log:" >&2
  tail -n 20 "$RUN_DIR/retrieval.log" >&2
  exit 1
fi
echo "Retrieval   $SEARCH_R1_RETRIEVAL_URL (pid ${PIDS[-1]}, log $RUN_DIR/retrieval.log)"
start_controller runner_type=local \
  local_runner.python="$AGENT_PYTHON" local_runner.cwd="$HERE" local_runner.log_dir="$RUN_DIR/agents"
status=0
train "$@" || status=$?
exit "$status"
