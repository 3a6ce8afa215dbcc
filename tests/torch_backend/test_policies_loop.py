"""Two policies trained in one run through a real Gateway and Controller (docs/policies.md): each
role's calls go to its own policy and record its version, each policy is updated on its own rows
and published under one pause, and a resumed run continues with the steps, versions and data
order of an uninterrupted run."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentlightning.client import GatewayClient
from agentlightning.config.schema import ConfigError
from agentlightning.demo.task import make_dataset
from agentlightning.torch_backend.checkpoint import load_policy_state
from agentlightning.torch_backend.trainer import TorchTrainer, run_ppo
from agentlightning.trainer.checkpoint import latest_checkpoint, list_checkpoints, load_loop_state
from agentlightning.trainer.tracking import METRICS_FILE, read_metrics
from tests.conftest import RunningGateway, trainer_key

from .test_trainer import BATCH, N, config, expected_ids, inputs_by_step, services

__all__ = ["services"]  # the fixture, shared with test_trainer.py
pytestmark = pytest.mark.timeout(600)
ROLES = ("planner", "coder")


def test_two_policies_train_publish_and_resume_like_an_uninterrupted_run(
    services: tuple[RunningGateway, GatewayClient], tmp_path: Path
) -> None:
    gateway, client = services
    train = make_dataset(12, seed=0, prefix="t")

    def run(steps: int) -> None:
        cfg = config(
            tmp_path, gateway, total_training_steps=steps, save_freq=1, test_freq=0, val_before_train=False
        )
        cfg.agentlightning.local.agent_class = "tests.torch_backend.loop_agent:TwoRoleAgent"
        cfg.agentlightning.policies = {role: {} for role in ROLES}
        run_ppo(cfg, train, [])

    run(2)  # stops after step 2, as an interrupted run would have
    checkpoints = tmp_path / "run" / "checkpoints"
    assert list_checkpoints(checkpoints) == [1, 2]
    run(3)  # resumes from step 2's checkpoint and makes step 3

    records = read_metrics(tmp_path / "run" / METRICS_FILE)
    assert [r["step"] for r in records] == [1, 2, 3]
    for role in ROLES:
        p = f"policy/{role}/"
        # Each step's calls of this role were served by the role's last publish, and each step
        # updated the role once on its own rows: one call per rollout.
        assert [r[p + "training/policy_version"] for r in records] == [0, 1, 2]
        assert all(r[p + "training/staleness/max"] == 0 for r in records)
        assert all(r[p + "training/n_turns"] == BATCH * N for r in records)
        assert all(r[p + "actor/optimizer_steps"] == 1 for r in records)
        assert all(abs(r[p + "actor/ppo_kl"]) < 1e-4 for r in records), "served log-probs = the policy's"
    assert all(r["training/reward"] == 0.5 for r in records), "the shared reward, unprefixed"
    assert client.list_models() == []  # the clean stop ended both leases; the versions: below

    # The Gateway recorded each call with its role's policy and version: step 3's calls, version 2.
    step3 = [r for r in client.list_rollouts(limit=1000) if r.metadata.batch_idx == 3 and r.is_train]
    assert len(step3) == BATCH * N
    for rollout in step3:
        events = client.get_events_json(rollout.rollout_id, format="triplet")
        calls = [e["data"]["server"] for e in events if e["event_type"] == "model_request"]
        assert [(server["model"], server["version"]) for server in calls] == [
            ("planner", 2),
            ("coder", 2),
        ]

    latest = latest_checkpoint(checkpoints)
    assert latest is not None
    state = load_loop_state(latest)
    assert (state["step"], state["versions"], state["data"]["position"]) == (3, dict.fromkeys(ROLES, 3), 6)
    for role in ROLES:
        assert load_policy_state(latest / "policies" / role)["policy"]["steps"] == 3
    # Steps 1-2 (first run) and 3 (resumed) used the samples an uninterrupted run would have.
    by_step: dict[int, list[str]] = {}
    for run_id in {trainer_key(r, "run_id") for r in client.list_rollouts(limit=1000)}:
        by_step.update(inputs_by_step(client, run_id))
    assert by_step == expected_ids(train, 3)


def test_policies_settings_are_checked_before_anything_starts(tmp_path: Path) -> None:
    gateway = RunningGateway("http://127.0.0.1:9", "k", None, tmp_path / "x.db")  # type: ignore[arg-type]
    cfg = config(tmp_path, gateway)
    cfg.agentlightning.policies = {"planner": {}, "coder": {}}
    cfg.actor_rollout_ref.rollout.port = 8123
    with pytest.raises(ConfigError, match=r"actor_rollout_ref\.rollout\.port"):
        TorchTrainer(cfg, make_dataset(4, seed=0), None)
    cfg.actor_rollout_ref.rollout.port = 0
    cfg.algorithm = {"filter_groups": {"enable": True}}
    with pytest.raises(ConfigError, match="filter_groups"):
        TorchTrainer(cfg, make_dataset(4, seed=0), None)
