"""The trainer core's loop with the verl backend (`VerlTrainer`, as `run_ppo` builds it) against a
real Gateway, a driver playing controller and agents, and stand-in verl workers: steps, validation,
publish after every update, checkpoints with verl's actor state in them, and a resume that loads
it, syncs it into the replicas and continues the step count."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from .conftest import SKIP_REASON

pytest.importorskip("verl", reason=SKIP_REASON)

from agentlightning.client import GatewayClient
from agentlightning.schemas import Rollout, RolloutState
from agentlightning.trainer.checkpoint import (
    best_checkpoint,
    latest_checkpoint,
    list_checkpoints,
    load_loop_state,
)
from agentlightning.trainer.tracking import METRICS_FILE, read_metrics
from agentlightning.verl.backend import ACTOR_DIR, VerlTrainer
from tests.conftest import RunningGateway, trainer_key
from tests.trainer.driver import Driver, two_turn_calls

pytestmark = pytest.mark.timeout(300)


def plan(rollout: Rollout) -> tuple[list[dict[str, Any]], float, RolloutState]:
    index = trainer_key(rollout, "index_in_group") or 0
    return two_turn_calls(seed=index), float(index % 2), RolloutState.SUCCEEDED


def config(tmp_path: Path, gateway: RunningGateway, steps: int) -> dict[str, Any]:
    return {
        "data": {"train_batch_size": 2, "seed": 3},
        "actor_rollout_ref": {
            "model": {"path": "/unused"},
            "actor": {"ppo_mini_batch_size": 1},
            "rollout": {"n": 2},
        },
        "trainer": {
            "n_gpus_per_node": 2,
            "total_training_steps": steps,
            "test_freq": 1,
            "save_freq": 1,
            "output_dir": str(tmp_path / "run"),
            "logger": ["jsonl"],
        },
        "agentlightning": {
            "agl_base_url": gateway.url,
            "agl_key": gateway.key,
            "rollout_timeout_seconds": 60,
            "async_rollout": {"pause_retry_after_seconds": 0.1},
        },
    }


def test_the_loop_trains_publishes_checkpoints_and_resumes(gateway: RunningGateway, tmp_path: Path) -> None:
    from .standin import StandInWorkers

    train = [{"id": f"t{i}"} for i in range(6)]
    val = [{"id": "v0"}]
    client = GatewayClient(gateway.url, gateway.key)
    first = StandInWorkers(client)
    with Driver(gateway.url, gateway.key, plan):
        VerlTrainer(config(tmp_path, gateway, 2), train, val, client, first.factory).fit()
    first.close()

    names = [w for w, _ in first.log]
    assert names == ["start", *(["sleep", "update", "update", "sync"] * 2)]
    assert [s["step"] for w, s in first.log if w == "sync"] == [1, 2]
    records = read_metrics(tmp_path / "run" / METRICS_FILE)
    assert [r["step"] for r in records] == [0, 1, 2]
    for r in records[1:]:
        assert r["training/n_rollouts"] == 4 and r["actor/optimizer_steps"] == 2
        assert r["actor/pg_loss"] == 0.5  # the workers' metrics reach the sinks
    root = tmp_path / "run" / "checkpoints"
    assert load_loop_state(root / "global_step_2")["version"] == 2
    assert client.list_models() == []  # the clean stop ended the trainer's endpoint lease
    # step 0's validation is the best so far (every reward is 0 here): kept besides the newest two
    assert list_checkpoints(root) == [0, 1, 2] and best_checkpoint(root) == root / "global_step_0"
    assert [Path(p).relative_to(root).parts[-1] for p, _ in first.saved] == [ACTOR_DIR] * 3
    assert [s for _, s in first.saved] == [0, 2, 4]  # optimizer steps so far

    second = StandInWorkers(client)
    with Driver(gateway.url, gateway.key, plan):
        VerlTrainer(config(tmp_path, gateway, 3), train, val, client, second.factory).fit()
    second.close()
    client.close()
    last = latest_checkpoint(root)
    assert last is not None and list_checkpoints(root) == [0, 2, 3]  # max_actor_ckpt_to_keep=2, and the best
    assert second.loaded == [str(root / "global_step_2" / ACTOR_DIR)]
    # restored weights synced into the replicas at the restored version, then one more step
    assert [w for w, _ in second.log] == ["start", "sync", "sleep", "update", "update", "sync"]
    assert [s["step"] for w, s in second.log if w == "sync"] == [2, 3]
    assert [r["step"] for r in read_metrics(tmp_path / "run" / METRICS_FILE)][-1] == 3
