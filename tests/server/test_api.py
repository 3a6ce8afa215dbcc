"""Every Gateway API route and rule, through HTTP (in-process ASGI)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from agentlightning.server.app import create_app

KEY = "secret-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(params=["memory", "sqlite"])
def api(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[TestClient]:
    url = "memory://" if request.param == "memory" else f"sqlite:///{tmp_path / 'g.db'}"
    app = create_app({"key": KEY, "store": {"url": url}, "max_body_bytes": 100_000})
    with TestClient(app, headers=AUTH) as client:
        yield client


def create(api: TestClient, *specs: dict[str, Any]) -> list[dict[str, Any]]:
    r = api.post("/api/rollouts", json=list(specs))
    assert r.status_code == 201, r.text
    return r.json()


def model_request(
    prompt: list[int], response: list[int], logprobs: list[float] | None = None
) -> dict[str, Any]:
    choice: dict[str, Any] = {
        "index": 0,
        "message": {"role": "assistant", "content": "x"},
        "token_ids": response,
    }
    if logprobs is not None:
        choice["logprobs"] = {"content": [{"token": "t", "logprob": lp} for lp in logprobs]}
    return {
        "event_type": "model_request",
        "data": {
            "request": {"messages": [{"role": "user", "content": "hi"}]},
            "response": {"prompt_token_ids": prompt, "choices": [choice]},
            "server": {"model": "policy", "endpoint": "http://m/v1", "version": 3},
            "http_status": 200,
            "status": "ok",
        },
    }


def test_healthz_needs_no_key(api: TestClient) -> None:
    r = api.get("/healthz", headers={"Authorization": ""})
    assert r.status_code == 200 and r.json() == {"status": "ok"}


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer wrong"}, {"x-api-key": "wrong"}, {"Authorization": f"Basic {KEY}"}],
)
def test_every_other_route_needs_the_key(api: TestClient, headers: dict[str, str]) -> None:
    api.headers.pop("Authorization")
    for method, path in [("GET", "/api/rollouts"), ("POST", "/api/models"), ("GET", "/openapi.json")]:
        r = api.request(method, path, headers=headers, json=[])
        assert r.status_code == 401, (method, path)
        assert "Bearer" in r.json()["detail"]


def test_x_api_key_header_is_accepted(api: TestClient) -> None:
    api.headers.pop("Authorization")
    assert api.get("/api/rollouts", headers={"x-api-key": KEY}).status_code == 200


def test_create_assigns_ids_and_defaults(api: TestClient) -> None:
    [r] = create(api, {"input": {"question": "1+1"}})
    assert len(r["rollout_id"]) == 32
    assert r["is_train"] is True
    assert r["config"]["timeout_seconds"] == 3600
    assert r["status"]["state"] == "queuing" and r["status"]["version"] == 1
    assert r["status"]["created_at"] == r["status"]["updated_at"] > 0


def test_create_with_existing_id_returns_stored_rollout_unchanged(api: TestClient) -> None:
    create(api, {"rollout_id": "r1", "input": 1, "metadata": {"data_id": "d", "custom": [1, 2]}})
    api.patch("/api/rollouts/r1", json={"status": {"state": "running"}})
    [again, new] = create(api, {"rollout_id": "r1", "input": 2}, {"rollout_id": "r2", "input": 3})
    assert again["input"] == 1 and again["status"]["state"] == "running"
    assert again["metadata"] == {
        "batch_idx": None,
        "sample_idx_in_batch": None,
        "data_id": "d",
        "custom": [1, 2],
    }
    assert new["rollout_id"] == "r2"


def test_create_rejects_bad_bodies_with_messages(api: TestClient) -> None:
    r = api.post("/api/rollouts", content=b"[{", headers={"content-type": "application/json"})
    assert r.status_code == 422 and "not valid JSON" in r.json()["detail"]
    r = api.post("/api/rollouts", json={"input": 1})
    assert r.status_code == 422 and "list" in str(r.json()["detail"])
    r = api.post("/api/rollouts", json=[{"rollout_id": "has/slash"}])
    assert r.status_code == 422
    r = api.post("/api/rollouts", json=[{"config": {"timeout_seconds": -1}}])
    assert r.status_code == 422 and "timeout_seconds" in str(r.json()["detail"])
    r = api.post("/api/rollouts", json=[{"is_train": "maybe"}])
    assert r.status_code == 422


def test_list_filters_by_state_and_limit(api: TestClient) -> None:
    create(api, *({"rollout_id": f"r{i}"} for i in range(5)))
    api.patch("/api/rollouts/r2", json={"status": {"state": "running"}})
    r = api.get("/api/rollouts", params=[("state_in", "running")])
    assert [x["rollout_id"] for x in r.json()] == ["r2"]
    r = api.get("/api/rollouts", params=[("state_in", "queuing"), ("state_in", "running"), ("limit", 3)])
    assert [x["rollout_id"] for x in r.json()] == ["r0", "r1", "r2"]
    assert len(api.get("/api/rollouts").json()) == 5
    r = api.get("/api/rollouts", params={"state_in": "paused"})
    assert r.status_code == 422 and "queuing" in str(r.json()["detail"])
    assert api.get("/api/rollouts", params={"limit": 0}).json() == []  # as v1.0
    assert len(api.get("/api/rollouts", params={"limit": 10**9}).json()) == 5  # clamped, not refused


def test_get_rollout_with_attempts_sorted_by_first_event(api: TestClient) -> None:
    create(api, {"rollout_id": "r"})
    api.post("/api/rollouts/r/attempt/a2/events", json={"event_type": "log", "data": {}})
    api.post("/api/rollouts/r/attempt/a1/events", json={"event_type": "log", "data": {}})
    api.post("/api/rollouts/r/attempt/a2/events", json={"event_type": "log", "data": {}})
    api.patch("/api/rollouts/r", json={"status": {"state": "running", "last_attempt_id": "a3"}})
    body = api.get("/api/rollouts/r").json()
    assert body["rollout"]["status"]["last_attempt_id"] == "a3"
    assert body["attempts"] == ["a2", "a1"]  # ids of the attempts with events, as v1.0
    assert [(a["attempt_id"], a["n_events"]) for a in body["attempt_details"]] == [
        ("a2", 2),
        ("a1", 1),
        ("a3", 0),
    ]
    r = api.get("/api/rollouts/nope")
    assert r.status_code == 404 and "nope" in r.json()["detail"]


def test_patch_state_machine(api: TestClient) -> None:
    create(api, {"rollout_id": "r"})
    r = api.patch("/api/rollouts/r", json={"status": {"state": "running", "last_attempt_id": "a1"}})
    assert r.status_code == 200 and r.json()["status"]["version"] == 2
    r = api.patch("/api/rollouts/r", json={"status": {"k8s_job_name": "job-1", "log_path": "/tmp/x.log"}})
    assert r.json()["status"]["version"] == 3 and r.json()["status"]["k8s_job_name"] == "job-1"
    r = api.patch("/api/rollouts/r", json={"status": {"state": "queuing"}})
    assert r.status_code == 409 and "running to queuing" in r.json()["detail"]
    r = api.patch("/api/rollouts/r", json={"status": {"state": "succeeded"}})
    assert r.status_code == 200 and r.json()["status"]["version"] == 4
    for state in ["running", "failed", "succeeded"]:
        r = api.patch("/api/rollouts/r", json={"status": {"state": state}})
        assert r.status_code == 409 and "terminal" in r.json()["detail"]
    assert api.get("/api/rollouts/r").json()["rollout"]["status"]["version"] == 4


def test_patch_with_null_state_changes_only_the_other_fields(api: TestClient) -> None:
    create(api, {"rollout_id": "r"})
    r = api.patch("/api/rollouts/r", json={"status": {"state": None, "k8s_job_name": "j"}})
    assert r.status_code == 200
    assert r.json()["status"]["state"] == "queuing" and r.json()["status"]["k8s_job_name"] == "j"


def test_patch_rejects_unknown_fields_states_and_ids(api: TestClient) -> None:
    create(api, {"rollout_id": "r"})
    r = api.patch("/api/rollouts/r", json={"status": {"state": "running", "colour": "red"}})
    assert r.status_code == 422 and "colour" in str(r.json()["detail"])
    r = api.patch("/api/rollouts/r", json={"status": {"state": "done"}})
    assert r.status_code == 422
    r = api.patch("/api/rollouts/r", json={"state": "running"})
    assert r.status_code == 422
    r = api.patch("/api/rollouts/ghost", json={"status": {"state": "running"}})
    assert r.status_code == 404
    assert api.get("/api/rollouts/r").json()["rollout"]["status"]["version"] == 1


def test_delete_is_idempotent_and_removes_events(api: TestClient) -> None:
    create(api, {"rollout_id": "r"})
    api.post("/api/rollouts/r/attempt/a/events", json={"event_type": "reward", "data": {"value": 1}})
    assert api.delete("/api/rollouts/r").status_code == 204
    assert api.delete("/api/rollouts/r").status_code == 204
    assert api.get("/api/rollouts/r").status_code == 404
    assert api.get("/api/rollouts/r/events").status_code == 404
    create(api, {"rollout_id": "r"})  # the id can be reused and starts empty
    assert api.get("/api/rollouts/r/events").json() == []


def test_terminal_cursor(api: TestClient) -> None:
    create(api, {"rollout_id": "a", "metadata": {"data_id": "p1"}}, {"rollout_id": "b", "is_train": False})
    for rid, final in [("b", "failed"), ("a", "succeeded")]:
        api.patch(f"/api/rollouts/{rid}", json={"status": {"state": "running"}})
        api.patch(f"/api/rollouts/{rid}", json={"status": {"state": final}})
    page = api.get("/api/rollouts/terminal", params={"after": 0, "limit": 1}).json()
    assert page["items"] == [{"rollout_id": "b", "state": "failed", "data_id": "", "is_train": False}]
    assert page["total_terminal"] == 2
    page2 = api.get("/api/rollouts/terminal", params={"after": page["next_after"]}).json()
    assert page2["items"] == [{"rollout_id": "a", "state": "succeeded", "data_id": "p1", "is_train": True}]
    page3 = api.get("/api/rollouts/terminal", params={"after": page2["next_after"]}).json()
    assert page3["items"] == [] and page3["next_after"] == page2["next_after"]
    clamped = api.get("/api/rollouts/terminal", params={"after": -1, "limit": 0}).json()  # as v1.0
    assert clamped["items"] == page["items"] and clamped["next_after"] == 1
    huge = api.get("/api/rollouts/terminal", params={"limit": 10**9, "after": 0}).json()
    assert len(huge["items"]) == 2  # clamped, not refused (as v1.0)


def test_post_event_and_read_last_attempt(api: TestClient) -> None:
    create(api, {"rollout_id": "r"})
    r = api.post("/api/rollouts/r/attempt/a1/events", json={"event_type": "reward", "data": {"value": 0.25}})
    assert r.status_code == 200
    ev = r.json()
    assert ev["event_type"] == "reward" and ev["rollout_id"] == "r" and ev["attempt_id"] == "a1"
    assert ev["data"] == {"value": 0.25} and ev["timestamp"] > 0 and ev["sequence"] >= 1
    api.post("/api/rollouts/r/attempt/a2/events", json={"event_type": "log", "data": {"msg": "x"}})
    api.post("/api/rollouts/r/attempt/a2/events", json={"event_type": "reward", "data": {"value": 1}})
    # no last_attempt_id recorded: the attempt with the latest first event is the last one
    got = api.get("/api/rollouts/r/events").json()
    assert [(e["attempt_id"], e["event_type"]) for e in got] == [("a2", "log"), ("a2", "reward")]
    api.patch("/api/rollouts/r", json={"status": {"state": "running", "last_attempt_id": "a1"}})
    got = api.get("/api/rollouts/r/events").json()
    assert [e["data"] for e in got] == [{"value": 0.25}]
    got = api.get("/api/rollouts/r/events", params={"attempt_id": "a2", "event_type": "reward"}).json()
    assert [e["data"] for e in got] == [{"value": 1}]


def test_events_of_a_rollout_without_events(api: TestClient) -> None:
    create(api, {"rollout_id": "r"})
    assert api.get("/api/rollouts/r/events").json() == []
    assert api.get("/api/rollouts/r/events", params={"format": "triplet"}).json() == []
    assert api.get("/api/rollouts/r/events", params={"format": "xml"}).json() == []  # raw, as v1.0


def test_event_validation(api: TestClient) -> None:
    create(api, {"rollout_id": "r"})
    url = "/api/rollouts/r/attempt/a/events"
    for data in [{}, {"value": "high"}, {"value": None}]:
        r = api.post(url, json={"event_type": "reward", "data": data})
        assert r.status_code == 422 and "value" in r.json()["detail"], data
    r = api.post(
        url,
        content=b'{"event_type": "reward", "data": {"value": NaN}}',
        headers={"content-type": "application/json"},
    )
    assert r.status_code in (400, 422)
    assert api.post(url, json={"event_type": "", "data": {}}).status_code == 422
    assert api.post(url, json={"data": {}}).status_code == 422
    assert api.post(url, json={"event_type": "x", "data": [1]}).status_code == 422
    r = api.post(
        url,
        content=b'{"event_type": "x", "data": {"n": 88616459123279527936}}',
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 422 and "64-bit" in r.json()["detail"]
    r = api.post(
        url,
        content=b'{"event_type": "x", "data": {"s": "\\udb35"}}',
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 422 and "not valid JSON" in r.json()["detail"]
    r = api.post("/api/rollouts/ghost/attempt/a/events", json={"event_type": "log", "data": {}})
    assert r.status_code == 404 and "ghost" in r.json()["detail"]
    assert api.get("/api/rollouts/r/events").json() == []


def test_triplet_format(api: TestClient) -> None:
    create(api, {"rollout_id": "r"})
    url = "/api/rollouts/r/attempt/a/events"
    api.post(url, json=model_request([1, 2], [3, 4], [-0.5, -0.25]))
    api.post(url, json={"event_type": "log", "data": {"note": "dropped in triplets"}})
    api.post(url, json=model_request([1, 2, 3, 4, 9], [5], None))
    retried = model_request([1, 2], [7, 8], [-1.0, -2.0])
    api.post(url, json=retried)  # same prompt as the first call: a retry; only this one is kept
    api.post(url, json={"event_type": "reward", "data": {"value": 1.5, "source": "judge", "extra": 1}})
    got = api.get("/api/rollouts/r/events", params={"format": "triplet"}).json()
    assert [e["event_type"] for e in got] == ["model_request", "model_request", "reward"]
    assert got[0]["data"] == {
        "prompt_token_ids": [1, 2, 3, 4, 9],
        "response_token_ids": [5],
        "response_log_probs": None,
        "server": {"model": "policy", "version": 3},
        "http_status": 200,
        "status": "ok",
    }
    assert got[1]["data"]["response_token_ids"] == [7, 8]
    assert got[1]["data"]["response_log_probs"] == [-1.0, -2.0]
    assert got[2]["data"] == {"value": 1.5, "source": "judge"}
    only_rewards = api.get(
        "/api/rollouts/r/events", params={"format": "triplet", "event_type": "reward"}
    ).json()
    assert [e["data"]["value"] for e in only_rewards] == [1.5]
    raw = api.get("/api/rollouts/r/events").json()
    assert len(raw) == 5 and raw[1]["data"] == {"note": "dropped in triplets"}


def test_models_upsert_list_delete(api: TestClient) -> None:
    r = api.post(
        "/api/models",
        json=[{"model": "m", "endpoint": "http://b/v1"}, {"model": "m", "endpoint": "http://a/v1"}],
    )
    assert r.status_code == 201 and [m["version"] for m in r.json()] == [0, 0]
    api.post("/api/models", json=[{"model": "m", "endpoint": "http://b/v1", "version": 4}])
    assert api.get("/api/models").json() == [
        {"model": "m", "endpoint": "http://a/v1", "version": 0},
        {"model": "m", "endpoint": "http://b/v1", "version": 4},
    ]
    assert (
        api.post("/api/models", json=[{"model": "m", "endpoint": "http://a/v1", "version": -1}]).status_code
        == 422
    )
    assert api.post("/api/models", json=[{"model": "", "endpoint": "x"}]).status_code == 422
    r = api.delete("/api/models")
    assert r.status_code == 200 and r.json() == {"status": "ok"}
    assert api.get("/api/models").json() == []


def test_body_limit_gives_413(api: TestClient) -> None:
    big = [{"input": "x" * 200_000}]
    r = api.post("/api/rollouts", json=big)
    assert r.status_code == 413 and "max_body_bytes" in r.json()["detail"]

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted while read
        yield b'[{"input": "'
        for _ in range(30):
            yield b"y" * 10_000
        yield b'"}]'

    r = api.post("/api/rollouts", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413
    small = api.post(
        "/api/rollouts",
        content=iter([b'[{"rollout_id": "c"}]']),
        headers={"content-type": "application/json"},
    )
    assert small.status_code == 201 and small.json()[0]["rollout_id"] == "c"


def test_unknown_routes_404(api: TestClient) -> None:
    assert api.get("/api/nothing").status_code == 404
    assert api.put("/api/rollouts/r").status_code == 405


def test_long_poll_wakes_on_new_rollout(tmp_path: Path) -> None:
    app = create_app({"store": {"url": "memory://"}})
    with TestClient(app) as api:
        # nothing queued: the read waits until a rollout is created
        def later() -> None:
            time.sleep(0.3)
            api.post("/api/rollouts", json=[{"rollout_id": "late"}])

        t = threading.Thread(target=later)
        start = time.monotonic()
        t.start()
        r = api.get("/api/rollouts", params={"state_in": "queuing", "wait_seconds": 10})
        waited = time.monotonic() - start
        t.join()
        assert [x["rollout_id"] for x in r.json()] == ["late"]
        assert r.headers["x-agl-long-poll"] == "true"
        assert 0.2 < waited < 5
        # something matches already: answers at once
        r = api.get("/api/rollouts", params={"state_in": "queuing", "wait_seconds": 10})
        assert [x["rollout_id"] for x in r.json()] == ["late"]
        # without wait_seconds: the v1.0 behaviour, no header
        assert "x-agl-long-poll" not in api.get("/api/rollouts").headers


def test_long_poll_times_out_empty_and_terminal_wakes(tmp_path: Path) -> None:
    app = create_app({"store": {"url": "memory://"}, "long_poll_max_seconds": 0.3})
    with TestClient(app) as api:
        start = time.monotonic()
        r = api.get("/api/rollouts", params={"state_in": "running", "wait_seconds": 100})
        assert r.json() == [] and 0.25 < time.monotonic() - start < 5  # capped by the server
        api.post("/api/rollouts", json=[{"rollout_id": "r"}])
        api.patch("/api/rollouts/r", json={"status": {"state": "running"}})

        def finish() -> None:
            time.sleep(0.1)
            api.patch("/api/rollouts/r", json={"status": {"state": "succeeded"}})

        t = threading.Thread(target=finish)
        t.start()
        page = api.get("/api/rollouts/terminal", params={"after": 0, "wait_seconds": 5}).json()
        t.join()
        assert [i["rollout_id"] for i in page["items"]] == ["r"]


def test_concurrent_appends_through_the_app(tmp_path: Path) -> None:
    import httpx

    app = create_app({"store": {"url": f"sqlite:///{tmp_path / 'c.db'}"}})

    async def run() -> list[int]:
        transport = httpx.ASGITransport(app=app)
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(transport=transport, base_url="http://t") as c,
        ):
            await c.post("/api/rollouts", json=[{"rollout_id": "r"}])
            rs = await asyncio.gather(
                *(
                    c.post("/api/rollouts/r/attempt/a/events", json={"event_type": "n", "data": {"i": i}})
                    for i in range(100)
                )
            )
            assert all(r.status_code == 200 for r in rs)
            events = (await c.get("/api/rollouts/r/events")).json()
            return [e["data"]["i"] for e in events]

    got = asyncio.run(run())
    assert sorted(got) == list(range(100))
