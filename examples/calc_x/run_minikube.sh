#!/usr/bin/env bash
# Calc-X with every rollout as a Kubernetes Job on minikube: starts minikube (if it is not running),
# builds the agent image inside it (agl-calc-x:latest, this folder's Dockerfile, from the repository
# root: the agent imports agentlightning/agent_events.py), then runs the Gateway on this machine
# (reachable from pods as host.minikube.internal:8181), the Controller with the k8s runner, and the
# training in the foreground.
#   examples/calc_x/run_minikube.sh --train-file data/train.parquet --val-file data/test.parquet \
#       --model PATH [--async] [key=value ...]
# On exit or Ctrl-C the processes this script started are stopped by their ids; minikube keeps
# running (stop it with `minikube stop`). Jobs left over are deleted after ttlSecondsAfterFinished.
# Environment: PYTHON, AGL_PORT (8181), AGL_KEY, RUN_DIR, NAMESPACE (default).
set -euo pipefail
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

NAMESPACE="${NAMESPACE:-default}"
IMAGE=agl-calc-x:latest  # the image job-template.yaml names
command -v minikube >/dev/null || { echo "run_minikube.sh: minikube is not installed" >&2; exit 2; }

if ! minikube status >/dev/null 2>&1; then
  minikube start
fi
echo "Building $IMAGE inside minikube (the build checks that the MCP calculator starts)"
minikube image build -t "$IMAGE" -f examples/calc_x/Dockerfile "$REPO"

start_on_minikube "$NAMESPACE"
status=0
train "$@" || status=$?
exit "$status"
