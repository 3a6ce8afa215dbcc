#!/usr/bin/env bash
# Calc-X on one machine: the Gateway (port 8181, with a key), the Controller running each rollout's
# agent as a local process (in .venv-examples), and the training in the foreground.
#   examples/calc_x/run_local.sh --train-file data/train.parquet --val-file data/test.parquet --model PATH [--async] [key=value ...]
# Every argument goes to train_calc_agent.py. On exit, failure or Ctrl-C, the processes this script
# started are stopped by their process ids (never by name).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
PYTHON="${PYTHON:-$REPO/.venv/bin/python}"                   # Gateway, Controller, trainer
AGENT_PYTHON="${AGENT_PYTHON:-$REPO/.venv-examples/bin/python}"  # the agents (AutoGen, MCP)
PORT="${AGL_PORT:-8181}"
RUN_DIR="${RUN_DIR:-$HERE/.run}"
KEY="${AGL_KEY:-$("$PYTHON" -c 'import secrets; print(secrets.token_urlsafe(24))')}"
URL="http://127.0.0.1:$PORT"

for exe in "$PYTHON" "$AGENT_PYTHON"; do
  [[ -x "$exe" ]] || { echo "run_local.sh: $exe not found (run 'make venv examples-venv' in $REPO)" >&2; exit 2; }
done
mkdir -p "$RUN_DIR"

PIDS=()
cleanup() {
  trap - EXIT INT TERM
  local pid i
  # Newest first: the trainer, then the Controller (it stops its agents), then the Gateway.
  for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do
    pid="${PIDS[i]}"
    kill -TERM "$pid" 2>/dev/null || continue
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

"$PYTHON" -m agentlightning.server port="$PORT" key="$KEY" \
  store.url="sqlite:///$RUN_DIR/gateway.db" >"$RUN_DIR/gateway.log" 2>&1 &
PIDS+=($!)

# The Gateway answers /healthz once it is up; give it 60 s.
if ! "$PYTHON" - "$URL/healthz" <<'PY'
import sys, time, urllib.request
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
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
  echo "run_local.sh: the Gateway did not answer $URL/healthz within 60 s; log:" >&2
  tail -n 20 "$RUN_DIR/gateway.log" >&2
  exit 1
fi
echo "Gateway     $URL (pid ${PIDS[0]}, log $RUN_DIR/gateway.log)"

"$PYTHON" -m agentlightning.controller runner_type=local \
  agl_server.url="$URL" agl_server.key="$KEY" \
  local_runner.python="$AGENT_PYTHON" local_runner.cwd="$HERE" \
  local_runner.log_dir="$RUN_DIR/agents" >"$RUN_DIR/controller.log" 2>&1 &
PIDS+=($!)
echo "Controller  pid ${PIDS[1]}, local runner (agents: $AGENT_PYTHON, logs $RUN_DIR/agents)"

# The trainer runs in the background only so that this script can react to signals at once; its
# output comes here and the script ends with its exit status.
"$PYTHON" "$HERE/train_calc_agent.py" --agl-base-url "$URL" --agl-key "$KEY" \
  trainer.output_dir="$RUN_DIR/trainer" "$@" &
PIDS+=($!)
status=0
wait "${PIDS[2]}" || status=$?
exit "$status"
