# shellcheck shell=bash
# Shared by run_local.sh and run_minikube.sh: start processes in the background, remember their
# ids, stop exactly those on exit or Ctrl-C (never by name), wait for the Gateway's /healthz
# (AGL_START_TIMEOUT seconds, 60 by default).
# Other examples source it too, setting EXAMPLE_DIR (their folder) and TRAIN_SCRIPT first.

HERE="${EXAMPLE_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)}"
REPO="$(cd "$HERE/../.." && pwd)"
PYTHON="${PYTHON:-$REPO/.venv/bin/python}"  # Gateway, Controller, trainer
PORT="${AGL_PORT:-8181}"
RUN_DIR="${RUN_DIR:-$HERE/.run}"
URL="http://127.0.0.1:$PORT"
PIDS=()

[[ -x "$PYTHON" ]] || { echo "$(basename "$0"): $PYTHON not found (run 'make venv' in $REPO)" >&2; exit 2; }

# Started with SIGINT ignored (a background job of a non-interactive shell: `cmd &` in a script,
# many CI runners), bash cannot trap it: Ctrl-C or `kill -INT` would be ignored and the run could
# end as a success. Start again with SIGINT restored, as agl-demo does for itself.
SIGIGN="$(sed -n 's/^SigIgn:[[:space:]]*//p' "/proc/$$/status" 2>/dev/null || true)"
if [[ -n "$SIGIGN" ]] && (( 0x$SIGIGN & 2 )); then
  exec "$PYTHON" -c 'import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execv(sys.argv[1], sys.argv[1:])' \
    "$BASH" "$0" "$@"
fi
KEY="${AGL_KEY:-$("$PYTHON" -c 'import secrets; print(secrets.token_urlsafe(24))')}"
mkdir -p "$RUN_DIR"

# shellcheck disable=SC2329  # called by the EXIT trap
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

# start_gateway [key=value ...]: agl-server on $PORT with $KEY, its log in $RUN_DIR/gateway.log.
start_gateway() {
  "$PYTHON" -m agentlightning.server port="$PORT" key="$KEY" \
    store.url="sqlite:///$RUN_DIR/gateway.db" "$@" >"$RUN_DIR/gateway.log" 2>&1 &
  PIDS+=($!)
  if ! "$PYTHON" - "$URL/healthz" "${AGL_START_TIMEOUT:-60}" <<'PY'
import sys, time, urllib.request
deadline = time.monotonic() + float(sys.argv[2])
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
    echo "$(basename "$0"): the Gateway did not answer $URL/healthz within ${AGL_START_TIMEOUT:-60} s; log:" >&2
    tail -n 20 "$RUN_DIR/gateway.log" >&2
    exit 1
  fi
  echo "Gateway     $URL (pid ${PIDS[-1]}, log $RUN_DIR/gateway.log)"
}

# start_controller key=value ...: agl-controller connected to the Gateway, log in $RUN_DIR/controller.log.
start_controller() {
  "$PYTHON" -m agentlightning.controller agl_server.url="$URL" agl_server.key="$KEY" "$@" \
    >"$RUN_DIR/controller.log" 2>&1 &
  PIDS+=($!)
  echo "Controller  pid ${PIDS[-1]} (log $RUN_DIR/controller.log)"
}

# start_on_minikube NAMESPACE: the Gateway on every interface (pods reach it through the host as
# host.minikube.internal; the key protects it) and the Controller running rollouts as Jobs there.
start_on_minikube() {
  start_gateway host=0.0.0.0
  start_controller runner_type=k8s k8s_runner.namespace="$1" \
    agl_server.agent_url="http://host.minikube.internal:$PORT"
}

# train ARGS...: $TRAIN_SCRIPT (default train_calc_agent.py) against this Gateway; returns its exit
# status. It runs in the background only so that this script reacts to Ctrl-C at once; its output
# comes here.
# --agl-key=KEY, not --agl-key KEY: a random key may start with "-" (token_urlsafe's alphabet),
# which argparse would take for an option.
train() {
  "$PYTHON" "${TRAIN_SCRIPT:-$HERE/train_calc_agent.py}" --agl-base-url "$URL" --agl-key="$KEY" \
    trainer.output_dir="$RUN_DIR/trainer" "$@" &
  PIDS+=($!)
  local status=0
  wait "${PIDS[-1]}" || status=$?
  return "$status"
}
