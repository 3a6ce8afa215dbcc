"""Outcomes produced for real (docs/reliability.md): a Gateway process whose proxy forwards to the
fake engine (answering 503, or 400 for a prompt over its context), a controller running naive
agent processes (that exit 1, never report, are killed by a signal, or run past their timeout),
and the trainer's own collection: each rollout's outcome is right, and no training row comes
from an attempt the infrastructure failed, though the naive agents reported a reward of 0."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentlightning.client import GatewayClient
from agentlightning.procs import ManagedProcess
from agentlightning.trainer.batch import build_training_batch
from agentlightning.trainer.collected import CollectedRollout
from agentlightning.trainer.config import load_core_config
from agentlightning.trainer.manager import RolloutManager
from tests.conftest import RunningGateway, start_gateway
from tests.controller.helpers import GATEWAY_OVERRIDES, local_config, start_controller, wait_terminal
from tests.fakes.model_server import FakeModelServer, Reply

pytestmark = pytest.mark.process

KEY = "outcomes-key"
FAST_RETRIES = ("proxy.max_tries=2", "proxy.backoff_seconds=0.01", "proxy.max_backoff_seconds=0.02")
OVERFLOW = "This model's maximum context length is 2048 tokens. However, you requested 4100 tokens."


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeModelServer]:
    with FakeModelServer() as server:
        yield server


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    gateway = start_gateway(tmp_path_factory.mktemp("gw"), KEY, *GATEWAY_OVERRIDES, *FAST_RETRIES)
    yield gateway
    gateway.process.stop()


@pytest.fixture(scope="module")
def controller(gw: RunningGateway, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ManagedProcess]:
    proc = start_controller(gw.url, KEY, tmp_path_factory.mktemp("ctl") / "logs", "max_attempts=2")
    yield proc
    assert proc.alive(), f"the controller died:\n{proc.log_tail(60)}"
    proc.stop()


def core_config(gw: RunningGateway, n_samples: int, **agl: Any) -> Any:
    return load_core_config(
        {
            "data": {"train_batch_size": n_samples},
            "actor_rollout_ref": {"rollout": {"n": 1}, "actor": {"ppo_mini_batch_size": 1}},
            "agentlightning": {
                "agl_base_url": gw.url,
                "agl_key": KEY,
                "poll_wait_seconds": 2,
                "keep_rollouts": True,
                "keep_partial_minibatch": True,
                "local": {
                    "agent_class": "tests.controller.agents.NaiveAgent",
                    "env_map": {"BEHAVIOUR": "input.behaviour", "QUESTION": "input.question"},
                },
                **agl,
            },
        }
    )


SAMPLES = {  # name -> (the sample, the outcome its rollout must get)
    "ok": ({"behaviour": "ok", "question": "q ok"}, "ok"),
    "unavailable": ({"behaviour": "model_error", "question": "unavailable"}, "model_unavailable"),
    "overflow": ({"behaviour": "model_error", "question": "overflow"}, "context_overflow"),
    "exit": ({"behaviour": "exit", "question": "q exit"}, "agent_error"),
    "silent": ({"behaviour": "silent", "question": "q silent"}, "no_reward"),
    "killed": ({"behaviour": "killed", "question": "q killed"}, "sandbox_lost"),
}


def name_of(rollout: CollectedRollout) -> str:
    return next(name for name, (sample, _) in SAMPLES.items() if sample == rollout.input)


def test_each_outcome_is_recorded_and_no_row_comes_from_an_infrastructure_failure(
    gw: RunningGateway, fake: FakeModelServer, controller: ManagedProcess
) -> None:
    fake.state.reset()
    body = {"error": {"message": OVERFLOW, "type": "BadRequestError", "code": 400}}
    fake.script(
        Reply(status=503, when="unavailable fail", times=2),  # both of the proxy's tries
        Reply(status=400, error_body=body, when="overflow fail"),
    )
    # failed_rollouts=train: the most that is ever trained (the agent's own failure included)
    cfg = core_config(gw, len(SAMPLES), failed_rollouts="train")
    with RolloutManager(cfg) as manager:
        manager.register_endpoints([fake.base_url], version=0)
        rollouts, _ = manager.collect([sample for sample, _ in SAMPLES.values()], step=0)
    by_name = {name_of(r): r for r in rollouts}
    assert {name: r.outcome for name, r in by_name.items()} == {n: o for n, (_, o) in SAMPLES.items()}
    # the naive agents reported 0 after the model's failure: the Gateway's evidence wins
    with GatewayClient(gw.url, KEY) as client:
        for name in ("unavailable", "overflow"):
            assert [
                e.data["value"] for e in client.get_events(by_name[name].rollout_id, event_type="reward")
            ] == [0.0]
        killed = client.get_rollout(by_name["killed"].rollout_id)
        assert [a.outcome for a in killed.attempt_details] == ["sandbox_lost", "sandbox_lost"]  # retried once

    batch = build_training_batch(rollouts, cfg)
    trained = {name_of(r) for r in rollouts if r.rollout_id in {row.rollout_id for row in batch.rows}}
    assert trained == {"ok", "exit", "silent"}
    assert batch.metrics["rollout/outcome/model_unavailable"] == 1
    assert batch.metrics["rollout/outcome/sandbox_lost"] == 1
    # what the typed outcomes prevent: without them the same rollouts train the zeros
    for r in rollouts:
        r.outcome = None
    naive = build_training_batch(rollouts, cfg)
    assert {"unavailable", "overflow", "killed"} <= {
        name_of(r) for r in rollouts if r.rollout_id in {row.rollout_id for row in naive.rows}
    }


def test_an_agent_past_its_timeout_is_timeout(
    gw: RunningGateway, controller: ManagedProcess, tmp_path: Path
) -> None:
    with GatewayClient(gw.url, KEY) as client:
        rollout_id = f"r-{uuid.uuid4().hex[:10]}"
        config = {
            **local_config("tests.controller.agents.SleepAgent", PID_FILE="input.pid_file"),
            "timeout_seconds": 1.5,
        }
        client.create_rollouts(
            [{"rollout_id": rollout_id, "input": {"pid_file": str(tmp_path / "p")}, "config": config}]
        )
        status = wait_terminal(client, [rollout_id])[rollout_id].status
        assert status.state == "failed"
        [attempt] = client.get_rollout(rollout_id).attempt_details
        assert (attempt.attempt_id, attempt.outcome) == (status.last_attempt_id, "timeout")
