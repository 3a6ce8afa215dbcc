"""The verl backend's whole loop on CPU (`cpu_e2e.py`): Gateway, Controller and demo agents,
rollouts served by real vLLM, updates by verl's actor worker with the KL term to verl's reference
worker, its weights synced into vLLM after every update, verl's checkpoints — two steps of the
demo task (the second shows what the first left: the weights synced after an update, the KL term's
drift, the older checkpoint and served weights deleted)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.learning import SIGNAL_HOOKS
from tests.vllm.available import vllm_python_or_skip

from .conftest import REPO, SKIP_REASON

pytest.importorskip("verl", reason=SKIP_REASON)

import torch
from safetensors.torch import load_file

pytestmark = pytest.mark.timeout(1500)

STEPS = 2
# vLLM in fp32 serving the actor's exact weights differs from the actor by ~4e-7 per token;
# serving weights one update stale, by ~1e-2 to 1 (docs/vllm.md).
SAME_WEIGHTS = 1e-4


def _processes_mentioning(text: str) -> list[int]:
    """Live processes whose command line contains `text` (the run's own folder)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if text in cmdline and int(entry.name) != os.getpid():
                pids.append(int(entry.name))
    return pids


def test_the_loop_trains_with_verls_worker_and_real_vllm_on_cpu(tmp_path: Path) -> None:
    vllm_python_or_skip()
    out = tmp_path / "run"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.verl.cpu_e2e",
            "run",
            f"output_dir={out}",
            "warmup.steps=200",  # enough for well-formed tool calls; the reward need not rise in 2 steps
            # A reward that differs within each group: step 1's update has signal whatever the model
            # wrote, so step 2's KL term shows the drift it made (with the agents' own rewards every
            # group of step 1 could be all equal: no update, KL 0 at step 2, as on a CI run).
            f"train.agentlightning.hooks={SIGNAL_HOOKS}",
            "val_problems=8",
            "agents_at_once=16",
            f"train.trainer.total_training_steps={STEPS}",
            f"train.trainer.test_freq={STEPS}",
            "train.trainer.save_freq=1",
            "train.trainer.max_actor_ckpt_to_keep=1",
            # the periodic checkpoints only (the best one on verl: tests/verl/test_loop.py)
            "train.trainer.keep_best=false",
            "train.trainer.collapse_guard.enable=false",
            "train.data.train_batch_size=4",
            "train.actor_rollout_ref.rollout.n=4",
            "train.actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "train.actor_rollout_ref.actor.use_kl_loss=true",
            "train.actor_rollout_ref.actor.kl_loss_coef=0.1",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1400,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    assert "validation reward:" in done.stdout.splitlines()[-1]
    run = out / "seed0"

    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = {int(r["step"]): r for r in records if "actor/optimizer_steps" in r}
    assert sorted(steps) == list(range(1, STEPS + 1))
    for step, r in steps.items():
        assert r["actor/optimizer_steps"] == 1 and r["actor/lr"] > 0, (step, r)  # verl's optimizer
        # vLLM served exactly the actor's weights: at step 1 the warm model both loaded, after
        # that the weights verl's engine exported and vLLM reloaded after the previous update
        assert r["actor/rollout_actor_log_prob_abs_diff"] < SAME_WEIGHTS, (step, r)
    assert any(r["actor/grad_norm"] > 0 for r in steps.values()), (
        "no step had a gradient: nothing was trained"
    )
    # the KL term to the warm model (the reference): 0 before the first update, then the drift
    assert steps[1]["actor/kl_loss"] == pytest.approx(0.0, abs=1e-6)
    assert steps[STEPS]["actor/kl_loss"] > 0, steps[STEPS]
    assert [int(r["step"]) for r in records if "val/reward" in r] == [0, STEPS]

    # what vLLM serves at the end is the trained model, not the warm one
    served = sorted((run / "vllm" / "weights").iterdir())
    assert [p.name for p in served] == [f"step{STEPS}"]  # older weight folders are deleted
    final = load_file(served[0] / "model.safetensors")
    warm = load_file(run / "warm_model" / "model.safetensors")
    assert final.keys() == warm.keys()
    assert any((final[k] - warm[k]).abs().max() > 0 for k in final)

    # verl's own checkpoint beside the loop's state, every step; the newest one is kept
    kept = sorted(p.name for p in (run / "checkpoints").glob("global_step_*"))
    assert kept == [f"global_step_{STEPS}"]
    folder = run / "checkpoints" / f"global_step_{STEPS}"
    assert json.loads((folder / "loop_state.json").read_text())["step"] == STEPS
    assert (folder / "actor" / "model_world_size_1_rank_0.pt").is_file()
    assert (folder / "actor" / "optim_world_size_1_rank_0.pt").is_file()
    assert _processes_mentioning(str(tmp_path)) == []

    # a resumed trainer's actor: verl's load_checkpoint restores exactly the weights vLLM served last
    restored = tmp_path / "restored"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.verl.cpu_e2e",
            "restore",
            str(run / "train.yaml"),
            str(folder),
            str(restored),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-5000:]
    weights = load_file(restored / "model.safetensors")
    assert weights.keys() == final.keys()
    assert all(
        torch.equal(weights[k], final[k]) for k in final
    )  # vLLM, Gateway, Controller, agents: all stopped
