"""Leased model endpoints: a trainer's endpoints leave the table when their lease runs out (a
killed trainer renews nothing) or at once with `lease_seconds: 0` (a clean stop); endpoints
registered without a lease (v1.0) stay, answered in v1.0's shape."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from agentlightning.server.app import create_app

KEY = "k"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(params=["memory", "sqlite"])
def api(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[TestClient]:
    url = "memory://" if request.param == "memory" else f"sqlite:///{tmp_path / 'g.db'}"
    with TestClient(create_app({"key": KEY, "store": {"url": url}}), headers=AUTH) as client:
        yield client


def endpoints(api: TestClient) -> list[str]:
    r = api.get("/api/models")
    assert r.status_code == 200, r.text
    return [m["endpoint"] for m in r.json()]


def test_a_lease_that_is_not_renewed_expires_and_the_proxy_stops_routing_to_it(api: TestClient) -> None:
    r = api.post(
        "/api/models",
        json=[
            {"model": "policy", "endpoint": "http://127.0.0.1:9/v1", "lease_seconds": 0.5},
            {"model": "other", "endpoint": "http://127.0.0.1:8/v1"},  # v1.0: no lease
        ],
    )
    assert r.status_code == 201, r.text
    leased, plain = r.json()
    assert leased["lease_seconds"] == 0.5 and leased["expires_at"] > time.time() - 1
    assert plain == {"model": "other", "endpoint": "http://127.0.0.1:8/v1", "version": 0}  # v1.0's shape
    assert endpoints(api) == ["http://127.0.0.1:8/v1", "http://127.0.0.1:9/v1"]
    deadline = time.monotonic() + 30
    while "http://127.0.0.1:9/v1" in endpoints(api):
        assert time.monotonic() < deadline, "the lease never expired"
        time.sleep(0.05)
    assert endpoints(api) == ["http://127.0.0.1:8/v1"]  # the one without a lease stays
    assert api.post("/api/rollouts", json=[{"rollout_id": "r", "input": {}}]).status_code == 201
    api.patch("/api/rollouts/r", json={"status": {"state": "running", "last_attempt_id": "a"}})
    call = api.post(
        "/proxy/rollout/r/attempt/a/mode/train/openai/v1/chat/completions",
        json={"model": "policy", "messages": [{"role": "user", "content": "hi"}]},
    )
    assert call.status_code == 503 and "no_endpoint" in call.text, call.text  # nothing serves it any more


def test_renewing_keeps_it_and_a_zero_lease_removes_it_at_once(api: TestClient) -> None:
    body = [{"model": "policy", "endpoint": "http://127.0.0.1:9/v1", "lease_seconds": 60}]
    first = api.post("/api/models", json=body).json()[0]["expires_at"]
    renewed = api.post("/api/models", json=[{**body[0], "version": 1}]).json()[0]
    assert renewed["expires_at"] >= first and renewed["version"] == 1
    assert endpoints(api) == ["http://127.0.0.1:9/v1"]
    assert api.post("/api/models", json=[{**body[0], "lease_seconds": 0}]).status_code == 201
    assert endpoints(api) == []
    bad = api.post("/api/models", json=[{**body[0], "lease_seconds": -1}])
    assert bad.status_code == 422 and "lease_seconds" in bad.text
