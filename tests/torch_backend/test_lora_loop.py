"""A LoRA run through a real Gateway and Controller: it publishes adapter versions, checkpoints
the adapter, and a second run resumes from it with the step, versions and data order of an
uninterrupted run."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentlightning.client import GatewayClient
from agentlightning.demo.task import make_dataset
from agentlightning.torch_backend.checkpoint import load_policy_state
from agentlightning.torch_backend.trainer import run_ppo
from agentlightning.trainer.checkpoint import (
    ADAPTER_DIR,
    LORA_KEY,
    latest_checkpoint,
    list_checkpoints,
    load_loop_state,
)
from agentlightning.trainer.tracking import METRICS_FILE, read_metrics
from tests.conftest import RunningGateway, trainer_key

from .test_trainer import config, expected_ids, inputs_by_step, services

__all__ = ["services"]  # the fixture, shared with test_trainer.py
pytestmark = pytest.mark.timeout(600)


def test_a_lora_run_resumes_from_its_adapter_with_the_same_steps_versions_and_data(
    services: tuple[RunningGateway, GatewayClient], tmp_path: Path
) -> None:
    gateway, client = services
    train = make_dataset(12, seed=0, prefix="t")
    lora = {"model": {"lora_rank": 4, "lora_alpha": 8}}

    def run(steps: int) -> None:
        cfg = config(
            tmp_path, gateway, total_training_steps=steps, save_freq=1, test_freq=0, val_before_train=False
        )
        cfg.actor_rollout_ref.merge_with(lora)
        run_ppo(cfg, train, [])

    run(2)  # stops after step 2, as an interrupted run would have
    checkpoints = tmp_path / "run" / "checkpoints"
    assert list_checkpoints(checkpoints) == [1, 2]
    run(3)  # resumes from step 2's checkpoint (resume_mode=auto) and makes step 3

    records = read_metrics(tmp_path / "run" / METRICS_FILE)
    assert [r["step"] for r in records] == [1, 2, 3]
    assert [r["training/policy_version"] for r in records] == [0, 1, 2]  # each step's calls: the last publish
    assert all(r["training/staleness/max"] == 0 for r in records)
    # The log-probs the Gateway recorded (served by base + adapter) are the policy's: one optimizer
    # step per training step, so the PPO ratio is measured before it and is 1.
    assert all(abs(r["actor/ppo_kl"]) < 1e-4 and r["actor/pg_clipfrac"] == 0 for r in records)
    assert client.list_models() == []  # the clean stop ended the endpoint lease; the version: below
    latest = latest_checkpoint(checkpoints)
    assert latest is not None
    state = load_loop_state(latest)
    assert (state["step"], state["version"], state["data"]["position"]) == (3, 3, 3 * 2)
    policy = load_policy_state(latest)["policy"]
    assert policy["steps"] == 3 and policy["model"] and all(LORA_KEY in k for k in policy["model"])
    assert (latest / ADAPTER_DIR / "adapter_model.safetensors").is_file()
    # Steps 1-2 (first run) and 3 (resumed) used the samples an uninterrupted run would have.
    by_step: dict[int, list[str]] = {}
    for run_id in {trainer_key(r, "run_id") for r in client.list_rollouts(limit=1000)}:
        by_step.update(inputs_by_step(client, run_id))
    assert by_step == expected_ids(train, 3)
