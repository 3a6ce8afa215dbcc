#!/usr/bin/env bash
# GPU smoke test of the verl backend: a few steps of the demo task (agl-demo: Gateway, Controller,
# agents) with a tiny Qwen2 model, served by verl's vLLM replicas and trained by verl's FSDP workers.
# Needs one NVIDIA GPU and the stack from `scripts/setup_verl.sh 0.9.1 cuXYZ` in the current env.
#
#   scripts/gpu_smoke.sh [OUTPUT_DIR]        (default: a new temporary folder)
#
# Passes when the trainer finishes its steps and every step has verl's actor metrics; prints the
# validation reward before -> after (3 steps are too few to expect a rise; it checks the plumbing).
set -euo pipefail

PYTHON=${PYTHON:-python3}
STEPS=${STEPS:-3}
die() { echo "gpu_smoke.sh: $*" >&2; exit 2; }

cd "$(dirname "$0")/.."
command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 \
  || die "no NVIDIA GPU here: the verl backend's smoke test needs one"
"$PYTHON" -c "import vllm, agentlightning.verl" 2>/dev/null \
  || die "verl/vLLM are not importable with $PYTHON: run scripts/setup_verl.sh 0.9.1 cu128 first"

OUT=${1:-$(mktemp -d "${TMPDIR:-/tmp}/agl-gpu-smoke.XXXXXX")}
mkdir -p "$OUT"
export RAY_TMPDIR="$OUT/ray" RAY_USAGE_STATS_ENABLED=0 VLLM_CACHE_ROOT="$OUT/vllm-cache"
echo "gpu_smoke.sh: output in $OUT"

# Head size 64 (256 / 4 heads): a size every vLLM GPU attention backend takes. sdpa: no flash-attn needed.
"$PYTHON" -m agentlightning.demo.cli \
  trainer_backend=verl output_dir="$OUT" warmup.steps=300 agents_at_once=16 \
  model.hidden_size=256 model.intermediate_size=512 model.num_attention_heads=4 model.num_key_value_heads=4 \
  train.trainer.total_training_steps="$STEPS" train.trainer.test_freq="$STEPS" train.trainer.save_freq=0 \
  train.trainer.n_gpus_per_node=1 train.trainer.nnodes=1 train.trainer.logger='[console,jsonl]' \
  train.data.train_batch_size=4 train.actor_rollout_ref.actor.ppo_mini_batch_size=4 \
  train.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8 \
  train.actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8 \
  train.actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
  train.actor_rollout_ref.rollout.gpu_memory_utilization=0.3 \
  train.actor_rollout_ref.rollout.max_model_len=1024 \
  train.actor_rollout_ref.model.override_config.attn_implementation=sdpa \
  | tee "$OUT/smoke.log"

"$PYTHON" - "$OUT" "$STEPS" <<'PY'
import sys
from pathlib import Path
from agentlightning.trainer.tracking import METRICS_FILE, read_metrics

out, steps = Path(sys.argv[1]), int(sys.argv[2])
files = list(out.rglob(METRICS_FILE))
assert files, f"no {METRICS_FILE} under {out}"
records = read_metrics(files[0])
trained = [r for r in records if "actor/pg_loss" in r]
assert [int(r["step"]) for r in trained] == list(range(1, steps + 1)), [r.get("step") for r in records]
print(f"gpu_smoke.sh: ok: {steps} verl steps; last grad norm {trained[-1].get('actor/grad_norm')}")
PY
