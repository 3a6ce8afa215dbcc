#!/usr/bin/env bash
# Install the verl backend's stack on a GPU machine: verl, vLLM and a torch built for that CUDA,
# then Agent Lightning with its verl extra, into the current Python environment (a venv or conda
# env you activated). Usage (as v1.0's `setup_verl.sh 0.8.0 cu130`):
#
#   scripts/setup_verl.sh VERL_VERSION CUDA        e.g.  scripts/setup_verl.sh 0.9.1 cu128
#
# It refuses on a machine without an NVIDIA GPU (verl's workers and vLLM need one); for the CPU
# test venv use `make .venv-verl/.installed`. Set PYTHON to choose the interpreter.
set -euo pipefail

PYTHON=${PYTHON:-python3}
SUPPORTED_VERL=0.9.1

die() { echo "setup_verl.sh: $*" >&2; exit 2; }

[ $# -eq 2 ] || die "usage: scripts/setup_verl.sh VERL_VERSION CUDA   (e.g. 0.9.1 cu128)"
VERL_VERSION=$1
CUDA=$2

case "$VERL_VERSION" in
  0.9.1) VLLM_VERSION=0.24.0; TORCH_VERSION=2.11.0 ;;  # verl 0.9.1's own `vllm` extra pins these
  *) die "verl $VERL_VERSION is not supported: agentlightning.verl is written against verl $SUPPORTED_VERL" ;;
esac
[[ "$CUDA" =~ ^cu[0-9]{3}$ ]] || die "CUDA must look like cu128 (the PyTorch wheel index tag), got '$CUDA'"

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  die "no NVIDIA GPU here (nvidia-smi finds none): the verl backend trains on GPUs. For the CPU tests: make .venv-verl/.installed"
fi

cd "$(dirname "$0")/.."
echo "setup_verl.sh: torch $TORCH_VERSION ($CUDA), vLLM $VLLM_VERSION, verl $VERL_VERSION into $($PYTHON -c 'import sys; print(sys.prefix)')"
"$PYTHON" -m pip install --upgrade pip
# torch first, from PyTorch's index for this CUDA; then everything else with torch held at it.
"$PYTHON" -m pip install "torch==$TORCH_VERSION" --index-url "https://download.pytorch.org/whl/$CUDA"
"$PYTHON" -m pip install "torch==$TORCH_VERSION" "vllm==$VLLM_VERSION" "verl[vllm]==$VERL_VERSION" -e ".[verl,train]"
"$PYTHON" -m pip check
"$PYTHON" - <<PY
import torch, vllm, verl
assert torch.cuda.is_available(), "torch does not see the GPU: is $CUDA the CUDA of this machine's driver?"
import agentlightning.verl  # checks the verl version
print(f"ok: torch {torch.__version__} (CUDA {torch.version.cuda}, {torch.cuda.device_count()} GPUs), "
      f"vllm {vllm.__version__}, verl {verl.__version__}")
PY
