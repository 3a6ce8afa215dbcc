#!/usr/bin/env bash
# SWE tasks with every rollout as a Kubernetes Job on minikube: starts minikube (with Calico, so
# that the NetworkPolicy is enforced) if it is not running, builds the agent image inside it
# (agl-swe:latest, examples/swe/Dockerfile, from the repository root), applies the agents' egress
# policy (the Gateway on this machine as the only address they may reach, and DNS), then runs the
# Gateway here (pods reach it as host.minikube.internal), the Controller with the k8s runner and
# the training in the foreground.
#   examples/swe/run_minikube.sh --train-file examples/swe/data/train.jsonl --model PATH [--async] [key=value ...]
# Every argument goes to train_swe_agent.py. On exit or Ctrl-C the processes this script started
# are stopped by their ids; minikube keeps running (`minikube stop`), Jobs left over are deleted
# after ttlSecondsAfterFinished. The nodes must allow unprivileged user namespaces (bubblewrap runs
# the model's commands inside each pod; minikube's do).
# Environment: PYTHON, AGL_PORT (8181), AGL_KEY, RUN_DIR, NAMESPACE (default).
set -euo pipefail
EXAMPLE_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck disable=SC2034  # read by common.sh
TRAIN_SCRIPT="$EXAMPLE_DIR/train_swe_agent.py"
# shellcheck source=../calc_x/common.sh
source "$EXAMPLE_DIR/../calc_x/common.sh"

NAMESPACE="${NAMESPACE:-default}"
IMAGE=agl-swe:latest  # the image job-template.yaml names
command -v minikube >/dev/null || { echo "run_minikube.sh: minikube is not installed" >&2; exit 2; }
kubectl() { minikube kubectl -- "$@"; }

if ! minikube status >/dev/null 2>&1; then
  minikube start --cni=calico
fi
echo "Building $IMAGE inside minikube"
minikube image build -t "$IMAGE" -f examples/swe/Dockerfile "$REPO"

# The address pods reach this machine at; the policy admits that one address on the Gateway's port.
GATEWAY_IP="$(minikube ssh -- getent ahostsv4 host.minikube.internal | awk 'NR == 1 { print $1 }')"
[[ -n "$GATEWAY_IP" ]] || { echo "run_minikube.sh: host.minikube.internal does not resolve in the node" >&2; exit 1; }
PYTHONPATH="$REPO" "$PYTHON" -m examples.swe.policy --gateway-ip "$GATEWAY_IP" --port "$PORT" \
  | kubectl apply -n "$NAMESPACE" -f -

start_on_minikube "$NAMESPACE"
status=0
train "$@" || status=$?
exit "$status"
