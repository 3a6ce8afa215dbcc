"""Publishing with the verl backend against a real Gateway and stand-in vLLM replicas: the
Gateway is paused and drained before the replicas sleep, stays paused while the GPUs train,
the weight sync comes before the new version is registered, then it resumes — and no agent
call fails, while agents keep calling through the whole time."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from functools import partial
from typing import Any

import pytest

from .conftest import SKIP_REASON

pytest.importorskip("verl", reason=SKIP_REASON)

import openai

from agentlightning.client import GatewayClient
from agentlightning.schemas import RolloutCreate
from agentlightning.trainer import RolloutManager, TrainingBatch
from agentlightning.verl.backend import VerlBackend
from agentlightning.verl.batch import PADDING_ROLLOUT_ID
from agentlightning.verl.config import compose_config, validate
from tests.conftest import RunningGateway
from tests.fakes.model_server import Reply

from .rows import make_rows
from .standin import StandInWorkers

pytestmark = pytest.mark.timeout(300)


class Agents:
    """Threads that call the model through the Gateway's proxy until stopped, as agents do."""

    def __init__(self, gateway: RunningGateway, client: GatewayClient, n: int) -> None:
        self.gateway = gateway
        self.rollouts = [f"r-{uuid.uuid4().hex[:8]}" for _ in range(n)]
        client.create_rollouts([RolloutCreate(rollout_id=r, input={}) for r in self.rollouts])
        self.stop = threading.Event()
        self.ok = [0] * n
        self.failures: list[str] = []
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(n)]

    def _run(self, i: int) -> None:
        base = f"{self.gateway.url}/proxy/rollout/{self.rollouts[i]}/attempt/a1/mode/train/openai/v1"
        llm = openai.OpenAI(base_url=base, api_key=self.gateway.key, max_retries=1000, timeout=60)
        first = True
        while not self.stop.is_set():
            text = "hold me" if (i == 0 and first) else f"agent {i} call {self.ok[i]}"
            first = False
            try:
                llm.chat.completions.create(model="policy", messages=[{"role": "user", "content": text}])
                self.ok[i] += 1
            except Exception as exc:
                self.failures.append(f"agent {i}: {type(exc).__name__}: {exc}")
                return

    def __enter__(self) -> Agents:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=120)

    def wait_calls(self, more_than: int) -> None:
        deadline = time.monotonic() + 120
        while sum(self.ok) <= more_than:
            assert not self.failures, self.failures
            assert time.monotonic() < deadline, "agents made no progress"
            time.sleep(0.01)


@pytest.fixture
def setup(gateway: RunningGateway) -> Iterator[tuple[GatewayClient, StandInWorkers, VerlBackend]]:
    client = GatewayClient(gateway.url, gateway.key)
    workers = StandInWorkers(client)
    cfg = compose_config(
        overrides=[
            "actor_rollout_ref.model.path=/unused",
            f"agentlightning.agl_base_url={gateway.url}",
            f"agentlightning.agl_key={gateway.key}",
            "agentlightning.async_rollout.pause_retry_after_seconds=0.1",
            "data.train_batch_size=2",
            "actor_rollout_ref.actor.ppo_mini_batch_size=1",
            "trainer.n_gpus_per_node=2",
        ]
    )
    settings, ours, view = validate(cfg)
    backend = VerlBackend(settings.core, ours, view, client, workers.factory)
    try:
        yield client, workers, backend
    finally:
        backend.close()
        workers.close()
        client.close()


def events(client: GatewayClient, rollout_id: str) -> list[dict[str, Any]]:
    return [e for e in client.get_events_json(rollout_id, format="raw") if e["event_type"] == "model_request"]


def test_publish_order_and_no_agent_call_fails(gateway: RunningGateway, setup: Any) -> None:
    client, workers, backend = setup
    endpoints = backend.start(step=0, version=0, total_steps=3, checkpoint=None)
    assert endpoints == [r.address for r in workers.replicas]
    assert workers.total_optimizer_steps == 3 * 2  # 2 mini-batches per step, 1 epoch
    manager = RolloutManager(backend.core, client)
    manager.register_endpoints(endpoints, 0)
    # agent 0's first call is held inside a replica: the training must wait for it (drain)
    for r in workers.replicas:
        r.server.script(Reply(gate="held", when="hold me"))

    with Agents(gateway, client, n=4) as agents:
        deadline = time.monotonic() + 60
        while not any(r.server.state.active for r in workers.replicas):
            assert time.monotonic() < deadline, "the held call never reached a replica"
            time.sleep(0.01)
        agents.wait_calls(20)

        for version in (1, 2):
            rows = make_rows(version, n_groups=2, group_size=2)
            batch = TrainingBatch(rows, groups_per_minibatch=1, step=version)
            failure: list[BaseException] = []

            def update(batch: TrainingBatch = batch, failure: list[BaseException] = failure) -> None:
                try:
                    backend.update(batch)
                except BaseException as exc:
                    failure.append(exc)

            trainer = threading.Thread(target=update)
            trainer.start()
            if version == 1:
                # paused and waiting on the held call: nothing may sleep yet
                deadline = time.monotonic() + 120
                while not client.proxy_state().paused:
                    assert not failure, failure
                    assert time.monotonic() < deadline, "the update never paused the Gateway"
                    time.sleep(0.01)
                assert client.proxy_state().inflight >= 1
                assert not any(what == "sleep" for what, _ in workers.log)
                for r in workers.replicas:
                    r.server.open_gate("held")
            trainer.join(timeout=120)
            assert not failure, failure
            assert client.proxy_state().paused  # still paused: the GPUs trained, replicas asleep
            manager.update_weights(partial(backend.publish, version), version)
            assert not client.proxy_state().paused
            seen = sum(agents.ok)
            agents.wait_calls(seen + 20)  # agents go on, served by the new weights

    assert not agents.failures, agents.failures
    assert all(n > 0 for n in agents.ok)
    # the order, and the Gateway's state at each step of it
    names = [what for what, _ in workers.log]
    assert names == ["start", "sleep", "update", "update", "sync", "sleep", "update", "update", "sync"]
    for what, state in workers.log[1:]:
        assert state["paused"], (what, state)
        if what == "sleep":
            assert state["inflight"] == 0
        if what == "update":
            assert state["asleep"]
    assert [s["step"] for w, s in workers.log if w == "sync"] == [1, 2]
    # the Gateway serves version 2 from the replicas, registered as verl gave them
    models = client.list_models()
    assert sorted(m.endpoint for m in models) == sorted(f"http://{a}/v1" for a in endpoints)
    assert {m.version for m in models} == {2}
    # every recorded call succeeded, versions never went back, and all three versions served
    versions: set[int] = set()
    for rid in agents.rollouts:
        seq = [e["data"]["server"]["version"] for e in events(client, rid)]
        assert all(e["data"]["http_status"] == 200 for e in events(client, rid))
        assert seq == sorted(seq)
        versions.update(seq)
    assert versions == {0, 1, 2}
    # the batches verl got: whole groups per mini-batch, laid out for 2 ranks
    for proto in workers.batches:
        assert len(proto) % 2 == 0
        uids = {u for u in proto.non_tensor_batch["uid"] if u != PADDING_ROLLOUT_ID}
        assert len(uids) == 1


def test_a_failed_update_resumes_the_gateway(setup: Any) -> None:
    client, workers, backend = setup
    backend.start(step=0, version=0, total_steps=1, checkpoint=None)

    def boom(batch: Any) -> dict[str, float]:
        raise RuntimeError("CUDA out of memory (stand-in)")

    workers.update = boom
    with pytest.raises(RuntimeError, match="out of memory"):
        backend.update(TrainingBatch(make_rows(0, n_groups=1, group_size=2), groups_per_minibatch=1))
    assert not client.proxy_state().paused
