"""Roles: the admin key, the controller key and agent tokens, against every route of the Gateway.

A hostile agent holding its own token tries every route, on its own rollout and on another one:
all it may do is call the model and post events for its own attempt, and read its own rollout.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from agentlightning.server.app import create_app
from agentlightning.server.auth import ALL, LiveTokens, TokenSigner

ADMIN, CONTROLLER = "admin-key", "controller-key"
MINE, OTHER, ATTEMPT = "mine", "other", "attempt-1"
REWARD = {"event_type": "reward", "data": {"value": 1.0}}


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture
def api() -> Iterator[TestClient]:
    # One try at the registered (dead) endpoint: the proxy's 502 comes at once, not after 15 s of backoff.
    config = {
        "key": ADMIN,
        "controller_key": CONTROLLER,
        "store": {"url": "memory://"},
        "proxy": {"max_tries": 1},
    }
    app = create_app(config)
    with TestClient(app, headers=bearer(ADMIN)) as client:
        client.gateway_app = app  # type: ignore[attr-defined]
        rollouts = [{"rollout_id": rid, "input": {"q": rid}} for rid in (MINE, OTHER)]
        assert client.post("/api/rollouts", json=rollouts).status_code == 201
        for rid in (MINE, OTHER):
            patch = {"status": {"state": "running", "last_attempt_id": ATTEMPT}}
            assert client.patch(f"/api/rollouts/{rid}", json=patch).status_code == 200
        assert client.post(
            "/api/models", json=[{"model": "policy", "endpoint": "http://127.0.0.1:9/v1"}]
        ).is_success
        yield client


def mint(api: TestClient, rollout_id: str = MINE, attempt_id: str = ATTEMPT, key: str = CONTROLLER) -> str:
    r = api.post(
        "/api/agent-tokens", json={"rollout_id": rollout_id, "attempt_id": attempt_id}, headers=bearer(key)
    )
    assert r.status_code == 200, r.text
    return r.json()["token"]


def snapshot(api: TestClient) -> Any:
    """Everything a caller could change: rollouts, events of every attempt, models, proxy state,
    training runs' metrics."""
    rollouts = api.get("/api/rollouts", params={"limit": 100}).json()
    events = {
        rid: api.get(f"/api/rollouts/{rid}/events", params={"attempt_id": aid}).json()
        for rid in (MINE, OTHER)
        for aid in (ATTEMPT, "attempt-2")
    }
    runs = api.get("/api/runs").json()
    return rollouts, events, api.get("/api/models").json(), api.get("/proxy/state").json(), runs


def every_route(api: TestClient) -> list[tuple[str, str]]:
    """(method, path template) of every route the app serves."""
    routes = [
        (method.upper(), path)
        for path, operations in api.gateway_app.openapi()["paths"].items()  # type: ignore[attr-defined]
        for method in operations
    ]
    # Routes left out of the schema: the proxy's catch-all for other OpenAI paths.
    hidden = "/proxy/rollout/{rollout_id}/attempt/{attempt_id}/mode/{mode}/openai/v1/{rest}"
    routes += [(method, hidden) for method in ("GET", "POST", "PUT", "PATCH", "DELETE")]
    assert len(routes) >= 20  # the whole API, not an empty list
    return routes


def fill(template: str, rollout_id: str, attempt_id: str) -> str:
    values = {
        "rollout_id": rollout_id,
        "attempt_id": attempt_id,
        "mode": "train",
        "rest": "models",
        "run_id": "run",
    }
    return re.sub(r"\{(\w+)\}", lambda m: values[m.group(1)], template)


def body_for(method: str, path: str) -> Any:
    if method not in ("POST", "PATCH", "PUT"):
        return None
    if path.endswith("/events"):
        return REWARD
    if path.endswith("/completions"):
        return {"model": "x", "messages": [{"role": "user", "content": "hi"}], "prompt": "hi"}
    if path == "/api/rollouts":
        return [{"rollout_id": "injected", "input": {}}]
    if path == "/api/models":
        return [{"model": "policy", "endpoint": "http://attacker.example/v1"}]
    if path == "/api/agent-tokens":
        return {"rollout_id": OTHER, "attempt_id": ATTEMPT}
    if path.endswith("/delete"):
        return {"rollout_ids": [MINE, OTHER]}
    if path.endswith("/events") or "batch" in path:
        return {"rollout_ids": [MINE, OTHER]}
    if method == "PATCH":
        return {"status": {"state": "failed", "error_message": "hijacked"}}
    return {"retry_after_seconds": 1}


# What an agent token may do on its own attempt (the proxy answers 502/503 here: no real server).
AGENT_ALLOWED = {
    ("POST", "/proxy/rollout/{rollout_id}/attempt/{attempt_id}/mode/{mode}/openai/v1/chat/completions"),
    ("POST", "/proxy/rollout/{rollout_id}/attempt/{attempt_id}/mode/{mode}/openai/v1/completions"),
    ("POST", "/proxy/rollout/{rollout_id}/attempt/{attempt_id}/mode/{mode}/openai/v1/responses"),
    ("POST", "/proxy/rollout/{rollout_id}/attempt/{attempt_id}/mode/{mode}/anthropic/v1/messages"),
    ("POST", "/api/rollouts/{rollout_id}/attempt/{attempt_id}/events"),
    ("GET", "/api/rollouts/{rollout_id}"),
    ("GET", "/api/rollouts/{rollout_id}/events"),
}


def test_a_hostile_agent_gets_401_or_403_everywhere_else_and_changes_nothing(api: TestClient) -> None:
    token = mint(api)
    before = snapshot(api)
    tried = 0
    for method, template in every_route(api):
        if template == "/healthz":
            continue
        own = fill(template, MINE, ATTEMPT) if (method, template) in AGENT_ALLOWED else None
        targets = {fill(template, rid, aid) for rid in (MINE, OTHER) for aid in (ATTEMPT, "attempt-2")}
        for path in sorted(targets - {own}):
            r = api.request(method, path, json=body_for(method, template), headers=bearer(token))
            assert r.status_code in (401, 403), (method, path, r.status_code, r.text)
            tried += 1
    assert tried > 40
    assert snapshot(api) == before


def test_an_agent_token_works_on_its_own_attempt_only(api: TestClient) -> None:
    token = mint(api)
    r = api.post(f"/api/rollouts/{MINE}/attempt/{ATTEMPT}/events", json=REWARD, headers=bearer(token))
    assert r.status_code == 200 and r.json()["rollout_id"] == MINE
    # x-api-key works as well as Bearer, as for keys.
    r = api.get(f"/api/rollouts/{MINE}", headers={"Authorization": "", "x-api-key": token})
    assert r.status_code == 200 and r.json()["rollout"]["rollout_id"] == MINE
    r = api.get(f"/api/rollouts/{MINE}/events", headers=bearer(token))
    assert r.status_code == 200 and [e["event_type"] for e in r.json()] == ["reward"]
    # Its model calls pass auth (the registered endpoint is down: the proxy's own 502, not 401/403).
    chat = {"model": "x", "messages": [{"role": "user", "content": "hi"}]}
    url = f"/proxy/rollout/{MINE}/attempt/{ATTEMPT}/mode/train/openai/v1/chat/completions"
    assert api.post(url, json=chat, headers=bearer(token)).status_code not in (401, 403)
    # Every agent API: the Responses and Anthropic Messages routes too, on its own attempt only.
    for tail, body in (
        ("openai/v1/responses", {"model": "x", "input": "hi"}),
        (
            "anthropic/v1/messages",
            {"model": "x", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]},
        ),
    ):
        own = f"/proxy/rollout/{MINE}/attempt/{ATTEMPT}/mode/train/{tail}"
        assert api.post(own, json=body, headers=bearer(token)).status_code not in (401, 403), tail
        other = f"/proxy/rollout/{OTHER}/attempt/{ATTEMPT}/mode/train/{tail}"
        assert api.post(other, json=body, headers=bearer(token)).status_code == 403, tail
    # The other rollout saw nothing.
    assert api.get(f"/api/rollouts/{OTHER}/events", params={"attempt_id": ATTEMPT}).json() == []


@pytest.mark.parametrize(
    "change",
    ["other-secret", "swap-ids", "edit-signature", "edit-created", "no-created", "garbage", "no-prefix"],
)
def test_forged_tokens_are_401(api: TestClient, change: str) -> None:
    genuine = mint(api)
    prefix, rid, aid, rest = genuine.split(".", 3)
    created, _, sig = rest.rpartition(".")  # created_at's repr has a dot
    at = float(created)
    forged = {
        "other-secret": TokenSigner(b"guessed").mint(MINE, ATTEMPT, at),
        "swap-ids": ".".join((prefix, TokenSigner(b"x").mint(OTHER, ATTEMPT, at).split(".")[1], aid, rest)),
        "edit-signature": ".".join((prefix, rid, aid, created, ("A" if sig[0] != "A" else "B") + sig[1:])),
        "edit-created": ".".join((prefix, rid, aid, repr(at + 1), sig)),
        "no-created": ".".join((prefix, rid, aid, sig)),  # the format before created_at was signed
        "garbage": "agl1.%%%.***.!!!",
        "no-prefix": ".".join((rid, aid, rest)),
    }[change]
    r = api.post(f"/api/rollouts/{MINE}/attempt/{ATTEMPT}/events", json=REWARD, headers=bearer(forged))
    assert r.status_code == 401
    assert api.get(f"/api/rollouts/{MINE}/events").json() == []


def test_a_token_expires_when_its_rollout_ends_is_deleted_or_moves_on(api: TestClient) -> None:
    def post(token: str, rid: str = MINE, aid: str = ATTEMPT) -> int:
        return api.post(
            f"/api/rollouts/{rid}/attempt/{aid}/events", json=REWARD, headers=bearer(token)
        ).status_code

    token = mint(api)
    assert post(token) == 200
    # A new attempt of the same rollout: the old attempt's token is dead, the new one's works.
    api.patch(f"/api/rollouts/{MINE}", json={"status": {"last_attempt_id": "attempt-2"}})
    assert post(token) == 401
    token2 = mint(api, attempt_id="attempt-2")
    assert post(token2, aid="attempt-2") == 200
    api.patch(f"/api/rollouts/{MINE}", json={"status": {"state": "succeeded"}})
    r = api.post(f"/api/rollouts/{MINE}/attempt/attempt-2/events", json=REWARD, headers=bearer(token2))
    assert r.status_code == 401 and "succeeded" in r.json()["detail"]
    # No token for a finished rollout; deleting a rollout kills its tokens.
    r = api.post("/api/agent-tokens", json={"rollout_id": MINE, "attempt_id": "attempt-2"})
    assert r.status_code == 409
    other = mint(api, OTHER)
    assert api.delete(f"/api/rollouts/{OTHER}").status_code == 204
    r = api.get(f"/api/rollouts/{OTHER}", headers=bearer(other))
    assert r.status_code == 401 and "no longer exists" in r.json()["detail"]
    # Created again under the same id, even at the same attempt: the deleted rollout's token is dead.
    assert api.post("/api/rollouts", json=[{"rollout_id": OTHER, "input": {"q": 2}}]).status_code == 201
    api.patch(f"/api/rollouts/{OTHER}", json={"status": {"state": "running", "last_attempt_id": ATTEMPT}})
    r = api.post(f"/api/rollouts/{OTHER}/attempt/{ATTEMPT}/events", json=REWARD, headers=bearer(other))
    assert r.status_code == 401 and "deleted" in r.json()["detail"]
    assert post(mint(api, OTHER), rid=OTHER) == 200
    assert api.post("/api/agent-tokens", json={"rollout_id": "ghost", "attempt_id": "a"}).status_code == 404


def test_the_controller_key_lists_patches_and_mints_but_nothing_else(api: TestClient) -> None:
    ctl = bearer(CONTROLLER)
    assert [r["rollout_id"] for r in api.get("/api/rollouts", headers=ctl).json()] == [MINE, OTHER]
    assert api.get("/api/rollouts/terminal", headers=ctl).status_code == 200
    assert api.get(f"/api/rollouts/{MINE}", headers=ctl).status_code == 200
    r = api.patch(f"/api/rollouts/{MINE}", json={"status": {"k8s_job_name": "j"}}, headers=ctl)
    assert r.status_code == 200
    before = snapshot(api)
    denied: list[tuple[str, str, Any]] = [
        ("POST", "/api/rollouts", [{"input": {}}]),
        ("DELETE", f"/api/rollouts/{MINE}", None),
        ("POST", "/api/rollouts/batch/delete", {"rollout_ids": [MINE]}),
        ("POST", "/api/models", [{"model": "policy", "endpoint": "http://evil.example/v1"}]),
        ("DELETE", "/api/models", None),
        ("GET", "/api/models", None),
        ("POST", "/proxy/pause", {}),
        ("POST", "/proxy/resume", None),
        ("POST", f"/api/rollouts/{MINE}/attempt/{ATTEMPT}/events", REWARD),
        ("GET", f"/api/rollouts/{MINE}/events", None),
        ("POST", f"/proxy/rollout/{MINE}/attempt/{ATTEMPT}/mode/train/openai/v1/chat/completions", {}),
    ]
    for method, path, body in denied:
        r = api.request(method, path, json=body, headers=ctl)
        assert r.status_code == 403, (method, path, r.status_code)
    assert snapshot(api) == before


def test_wrong_keys_are_401_and_the_admin_key_does_everything(api: TestClient) -> None:
    for headers in ({"Authorization": ""}, bearer("wrong"), {"Authorization": "", "x-api-key": "wrong"}):
        assert api.get("/api/rollouts", headers=headers).status_code == 401
    assert api.get("/healthz", headers={"Authorization": ""}).status_code == 200
    assert api.delete(f"/api/rollouts/{OTHER}").status_code == 204  # the admin key (the fixture's)


def test_model_endpoints_must_be_http_urls(api: TestClient) -> None:
    for endpoint in (
        "file:///etc/passwd",
        "unix:///var/run/docker.sock",
        "ftp://h/v1",
        "http:///v1",
        "h:8000",
    ):
        r = api.post("/api/models", json=[{"model": "policy", "endpoint": endpoint}])
        assert r.status_code == 422 and "http" in r.text, endpoint
    assert [m["endpoint"] for m in api.get("/api/models").json()] == ["http://127.0.0.1:9/v1"]


def test_a_v1_single_key_gateway_works_as_before() -> None:
    app = create_app({"key": "only", "store": {"url": "memory://"}})
    with TestClient(app, headers=bearer("only")) as api:
        assert api.post("/api/rollouts", json=[{"rollout_id": "r", "input": {}}]).status_code == 201
        assert api.post("/api/rollouts/r/attempt/0/events", json=REWARD).status_code == 200
        assert (
            api.post("/api/models", json=[{"model": "policy", "endpoint": "http://h:1/v1"}]).status_code
            == 201
        )
        assert api.post("/proxy/pause", json={}).json()["paused"] is True
        assert api.delete("/api/rollouts/r").status_code == 204
        assert api.get("/api/rollouts", headers=bearer("other")).status_code == 401


def test_a_batch_delete_kills_cached_tokens(api: TestClient) -> None:
    token = mint(api)
    url = f"/api/rollouts/{MINE}"
    assert api.get(url, headers=bearer(token)).status_code == 200  # checked live, remembered
    assert api.post("/api/rollouts/batch/delete", json={"rollout_ids": [MINE]}).json() == {"deleted": 1}
    assert api.get(url, headers=bearer(token)).status_code == 401


def test_live_tokens_do_not_remember_a_check_that_overlapped_a_change() -> None:
    live = LiveTokens(capacity=2)
    generation = live.generation
    live.forget("r1")  # a patch of r1 ran while the check read the rollout
    live.remember("r1", "a", 1.0, generation)
    assert not live.is_live("r1", "a", 1.0)
    live.remember("r1", "a", 1.0, live.generation)
    assert live.is_live("r1", "a", 1.0) and not live.is_live("r1", "b", 1.0)
    assert not live.is_live("r1", "a", 2.0)  # a token of another rollout once named r1
    live.remember("r2", "a", 1.0, live.generation)
    live.remember("r3", "a", 1.0, live.generation)  # over capacity: the oldest goes
    assert not live.is_live("r1", "a", 1.0) and live.is_live("r3", "a", 1.0)
    live.forget(ALL)
    assert not live.is_live("r2", "a", 1.0) and not live.is_live("r3", "a", 1.0)
