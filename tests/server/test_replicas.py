"""Two `agl-server` processes on one Postgres database behave as one Gateway: what one is told,
the other answers; long-polls wake across them; pause/drain is global."""

from __future__ import annotations

import concurrent.futures
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentlightning.aggregation import AggregationStats, aggregate_rollout
from agentlightning.client import GatewayClient
from tests import postgres
from tests.conftest import RunningGateway, start_gateway
from tests.fakes.model_server import FakeModelServer, Reply, ToolCall
from tests.server.test_proxy_token_exact import CHAT_TOOLS, WRITTEN, send_back_compact

pytestmark = pytest.mark.process  # whole processes, waited on: not in `make test-fast`

KEY = "replica-key"
SECRET = "replica-token-secret"
USER = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeModelServer]:
    with FakeModelServer() as server:
        yield server


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningGateway, RunningGateway]]:
    url = postgres.new_database()
    tmp = tmp_path_factory.mktemp("replicas")
    started: list[RunningGateway] = []
    try:
        for _ in range(2):
            started.append(start_gateway(tmp, KEY, f"store.url={url}", f"token_secret={SECRET}"))
        yield started[0], started[1]
    finally:
        for gw in started:
            gw.process.stop()


def api(gw: RunningGateway, method: str, path: str, key: str = KEY, **kw: Any) -> httpx.Response:
    return httpx.request(method, gw.url + path, headers={"x-api-key": key}, timeout=60, **kw)


def new_rollout(gw: RunningGateway) -> str:
    rid = f"r-{uuid.uuid4().hex[:10]}"
    assert api(gw, "POST", "/api/rollouts", json=[{"rollout_id": rid, "input": {"q": 1}}]).status_code == 201
    return rid


def call(gw: RunningGateway, rid: str, key: str = KEY, attempt: str = "a1") -> httpx.Response:
    return api(
        gw,
        "POST",
        f"/proxy/rollout/{rid}/attempt/{attempt}/mode/train/openai/v1/chat/completions",
        key=key,
        json={"model": "m", "messages": USER},
    )


def eventually(check: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


@pytest.fixture
def models(pair: tuple[RunningGateway, RunningGateway], fake: FakeModelServer) -> FakeModelServer:
    a, b = pair
    fake.state.reset()
    api(a, "POST", "/proxy/resume")
    api(a, "DELETE", "/api/models")
    # Registered through A only: B's model table follows.
    assert (
        api(a, "POST", "/api/models", json=[{"model": "policy", "endpoint": fake.base_url}]).status_code
        == 201
    )
    rid = new_rollout(b)
    eventually(lambda: call(b, rid).status_code == 200)
    return fake


def test_every_route_answers_the_same_on_either_replica(pair: tuple[RunningGateway, RunningGateway]) -> None:
    a, b = pair
    rid = new_rollout(a)
    assert api(b, "GET", f"/api/rollouts/{rid}").json()["rollout"]["rollout_id"] == rid
    patched = api(b, "PATCH", f"/api/rollouts/{rid}", json={"status": {"state": "running"}}).json()
    assert patched["status"]["version"] == 2
    assert api(a, "GET", f"/api/rollouts/{rid}").json()["rollout"]["status"]["state"] == "running"
    event = {"event_type": "reward", "data": {"value": 1.0}}
    assert api(a, "POST", f"/api/rollouts/{rid}/attempt/a1/events", json=event).status_code == 200
    assert [e["data"] for e in api(b, "GET", f"/api/rollouts/{rid}/events").json()] == [{"value": 1.0}]


def test_the_dashboard_shows_the_same_history_and_training_curves_on_either_replica(
    pair: tuple[RunningGateway, RunningGateway],
) -> None:
    a, b = pair
    rid = new_rollout(a)
    api(b, "PATCH", f"/api/rollouts/{rid}", json={"status": {"state": "running", "last_attempt_id": "a1"}})
    api(a, "PATCH", f"/api/rollouts/{rid}", json={"status": {"state": "succeeded"}})
    for gw in (a, b):
        history = api(gw, "GET", f"/api/dashboard/rollouts/{rid}").json()["history"]
        assert [(h["state"], h["version"]) for h in history] == [
            ("queuing", 1),
            ("running", 2),
            ("succeeded", 3),
        ]
        assert api(gw, "GET", "/api/dashboard/overview").json()["rollouts_per_minute"] >= 1
    run = f"run-{uuid.uuid4().hex[:8]}"
    steps = [{"step": s, "metrics": {"training/reward": s / 10}} for s in (1, 2)]
    assert api(a, "POST", f"/api/runs/{run}/metrics", json=steps).json()["n_points"] == 2
    assert api(b, "POST", f"/api/runs/{run}/metrics", json=[{"step": 3, "metrics": {"x": 1.0}}]).is_success
    for gw in (a, b):
        points = api(gw, "GET", f"/api/runs/{run}/metrics").json()["points"]
        assert [p["step"] for p in points] == [1, 2, 3]
        listed = {r["run_id"]: r for r in api(gw, "GET", "/api/runs").json()}
        assert listed[run]["n_points"] == 3 and listed[run]["keys"] == ["training/reward", "x"]


def test_long_polls_wake_on_changes_made_through_the_other_replica(
    pair: tuple[RunningGateway, RunningGateway],
) -> None:
    a, b = pair
    rid = new_rollout(a)
    after = api(b, "GET", "/api/rollouts/terminal", params={"limit": 10000}).json()["next_after"]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        failed = pool.submit(
            api, b, "GET", "/api/rollouts", params={"state_in": "failed", "wait_seconds": 50}
        )
        terminal = pool.submit(
            api, b, "GET", "/api/rollouts/terminal", params={"after": after, "wait_seconds": 50}
        )
        time.sleep(0.3)  # let both waits begin; a change before they do is found by their first read
        api(a, "PATCH", f"/api/rollouts/{rid}", json={"status": {"state": "running"}})
        api(a, "PATCH", f"/api/rollouts/{rid}", json={"status": {"state": "failed"}})
        assert [r["rollout_id"] for r in failed.result(timeout=30).json()] == [rid]
        assert [i["rollout_id"] for i in terminal.result(timeout=30).json()["items"]] == [rid]
        assert failed.result().headers["X-Agl-Long-Poll"] == "true"


def start_attempt(gw: RunningGateway, rollout_id: str, attempt_id: str = "a1") -> str:
    """The rollout running its attempt, and that attempt's agent token."""
    status = {"state": "running", "last_attempt_id": attempt_id}
    api(gw, "PATCH", f"/api/rollouts/{rollout_id}", json={"status": status})
    body = {"rollout_id": rollout_id, "attempt_id": attempt_id}
    return str(api(gw, "POST", "/api/agent-tokens", json=body).json()["token"])


def test_deletes_and_token_revocation_reach_the_other_replica(
    pair: tuple[RunningGateway, RunningGateway], models: FakeModelServer
) -> None:
    a, b = pair
    rid = new_rollout(a)
    token = start_attempt(a, rid)
    assert call(b, rid, key=token).status_code == 200  # B now holds the token as live, the rollout as known
    # A moves the rollout to another attempt: B refuses the old attempt's token.
    api(a, "PATCH", f"/api/rollouts/{rid}", json={"status": {"last_attempt_id": "a2"}})
    eventually(lambda: call(b, rid, key=token).status_code == 401)
    assert call(b, rid, attempt="a2").status_code == 200
    # A deletes it: B's known-rollout cache forgets it, the next call is refused before the model.
    served = models.state.total
    assert api(a, "DELETE", f"/api/rollouts/{rid}").status_code == 204
    eventually(lambda: call(b, rid, attempt="a2").status_code == 404)
    assert models.state.total == served


def test_a_pause_sent_to_one_replica_holds_calls_on_the_other_and_counts_both(
    pair: tuple[RunningGateway, RunningGateway], models: FakeModelServer
) -> None:
    a, b = pair
    rids = [new_rollout(a) for _ in range(3)]
    models.script(Reply(gate="weights", times=2))
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        held = [pool.submit(call, a, rids[0]), pool.submit(call, b, rids[1])]
        models.state.wait_active(2)
        paused = api(a, "POST", "/proxy/pause", json={"retry_after_seconds": 3, "reason": "update"}).json()
        assert paused["paused"] is True and paused["inflight"] == 2  # one call in flight on each replica
        refused = call(b, rids[2])
        assert refused.status_code == 429 and refused.headers["X-Agl-Paused"] == "true"
        assert refused.headers["Retry-After"] == "3"
        state = api(b, "GET", "/proxy/state").json()
        assert state["paused"] is True and state["inflight"] == 2 and state["reason"] == "update"
        models.state.open_gate("weights")
        assert [f.result(timeout=30).status_code for f in held] == [200, 200]
    eventually(lambda: api(a, "GET", "/proxy/state").json()["inflight"] == 0)  # drained everywhere
    resumed = api(b, "POST", "/proxy/resume").json()
    assert resumed["paused"] is False
    eventually(lambda: call(a, rids[2]).status_code == 200)


def test_a_replica_started_while_paused_starts_paused(
    pair: tuple[RunningGateway, RunningGateway], tmp_path: Path
) -> None:
    a, _ = pair
    url = [arg for arg in a.process.argv if arg.startswith("store.url=")][-1]  # the last one counts
    api(a, "POST", "/proxy/pause", json={"retry_after_seconds": 1})
    try:
        c = start_gateway(tmp_path, KEY, url, f"token_secret={SECRET}")
        try:
            assert api(c, "GET", "/proxy/state").json()["paused"] is True
        finally:
            c.process.stop()
    finally:
        api(a, "POST", "/proxy/resume")


def test_a_rollout_deleted_and_created_again_through_one_replica_is_new_on_the_other(
    pair: tuple[RunningGateway, RunningGateway], models: FakeModelServer
) -> None:
    a, b = pair
    rid = new_rollout(a)
    old = start_attempt(a, rid)
    # B learns the rollout as known, the token as live, the attempt's call history.
    assert call(b, rid, key=old).status_code == 200
    reward = {"event_type": "reward", "data": {"value": 0.0}}
    assert api(b, "POST", f"/api/rollouts/{rid}/attempt/a1/events", key=old, json=reward).status_code == 200
    assert api(a, "DELETE", f"/api/rollouts/{rid}").status_code == 204
    fresh = api(a, "POST", "/api/rollouts", json=[{"rollout_id": rid, "input": {"q": 2}}]).json()[0]
    assert fresh["input"] == {"q": 2} and fresh["status"]["version"] == 1
    # The same attempt id again: only the rollout's creation tells the two tokens apart.
    api(a, "PATCH", f"/api/rollouts/{rid}", json={"status": {"state": "running", "last_attempt_id": "a1"}})
    new = api(a, "POST", "/api/agent-tokens", json={"rollout_id": rid, "attempt_id": "a1"}).json()["token"]
    assert new != old
    eventually(lambda: call(b, rid, key=old).status_code == 401)  # once B heard of the delete
    refused = api(b, "POST", f"/api/rollouts/{rid}/attempt/a1/events", key=old, json=reward)
    assert refused.status_code == 401 and "deleted" in refused.json()["detail"]
    assert api(b, "GET", f"/api/rollouts/{rid}", key=old).status_code == 401
    # The new agent's calls and events through B land on the new rollout, and only there.
    assert call(b, rid, key=new).status_code == 200
    won = {"event_type": "reward", "data": {"value": 1.0}}
    assert api(b, "POST", f"/api/rollouts/{rid}/attempt/a1/events", key=new, json=won).status_code == 200
    for gw in (a, b):
        assert api(gw, "GET", f"/api/rollouts/{rid}").json()["rollout"]["input"] == {"q": 2}
        events = api(gw, "GET", f"/api/rollouts/{rid}/events").json()
        assert [e["event_type"] for e in events] == ["model_request", "reward"]
        assert events[1]["data"] == {"value": 1.0}
        history = api(gw, "GET", f"/api/dashboard/rollouts/{rid}").json()["history"]
        assert [(h["state"], h["version"]) for h in history] == [("queuing", 1), ("running", 2)]


def test_an_attempt_served_by_both_replicas_in_turn_stays_one_token_sequence(
    pair: tuple[RunningGateway, RunningGateway],
) -> None:
    """Each replica keeps the token history of the calls it served: a call whose history repeats
    an answer the other replica recorded reads the attempt back from the database, so a tool loop
    sent A, B, A on the token path (the model's tool calls sent back compact, as harnesses do)
    is still one token sequence: one training row."""
    a, b = pair
    with FakeModelServer() as fake:
        fake.state.scale_out = True
        api(a, "DELETE", "/api/models")
        assert (
            api(a, "POST", "/api/models", json=[{"model": "policy", "endpoint": fake.base_url}]).status_code
            == 201
        )
        probe = new_rollout(a)
        eventually(lambda: call(b, probe).status_code == 200 and fake.state.total > 0)
        fake.state.reset()
        fake.script(
            Reply(content="", tool_calls=[ToolCall("calc", WRITTEN)]),
            Reply(content="", tool_calls=[ToolCall("calc", '{"expr": "9+1"}')]),
            Reply(content="it is 10"),
        )
        rid = new_rollout(a)
        messages: list[dict[str, Any]] = [{"role": "user", "content": "what is 3*3+1"}]
        for gw in (a, b, a):
            path = f"/proxy/rollout/{rid}/attempt/a1/mode/train/openai/v1/chat/completions"
            body = {"model": "m", "messages": messages, "tools": CHAT_TOOLS}
            message = api(gw, "POST", path, json=body).json()["choices"][0]["message"]
            send_back_compact(messages, message)
        assert message["content"] == "it is 10"
        with GatewayClient(a.url, KEY) as client:
            events = client.get_events_json(rid, format="raw", attempt_id="a1")
            triplets = client.get_events_json(rid, format="triplet", attempt_id="a1")
        assert [e["data"]["segment"] for e in events] == [
            {"continues": False, "token_exact": True, "first": True},
            {"continues": True, "token_exact": True},
            {"continues": True, "token_exact": True},
        ]
        (row,) = aggregate_rollout(triplets, rid, "g", reward=1.0, stats=AggregationStats())
        assert row.n_calls == 3


def test_a_lease_expires_on_every_replica_and_ends_on_every_replica(
    pair: tuple[RunningGateway, RunningGateway],
) -> None:
    """Leased endpoints (a trainer's): registered through A, B routes to them; unrenewed, they
    leave both tables when the lease runs out; a zero lease through B ends A's at once."""
    a, b = pair
    api(a, "DELETE", "/api/models")

    def listed(gw: RunningGateway) -> list[str]:
        return [m["endpoint"] for m in api(gw, "GET", "/api/models").json()]

    short = [{"model": "policy", "endpoint": "http://127.0.0.1:9/v1", "lease_seconds": 1}]
    assert api(a, "POST", "/api/models", json=short).status_code == 201
    eventually(lambda: listed(b) == ["http://127.0.0.1:9/v1"])
    eventually(lambda: listed(a) == [] and listed(b) == [], timeout=30)
    long = [{**short[0], "lease_seconds": 600}]
    assert api(a, "POST", "/api/models", json=long).status_code == 201
    eventually(lambda: listed(b) == ["http://127.0.0.1:9/v1"])
    assert api(b, "POST", "/api/models", json=[{**short[0], "lease_seconds": 0}]).status_code == 201
    eventually(lambda: listed(a) == [] and listed(b) == [])
