"""Attempt outcomes from the Gateway's own records (docs/reliability.md): a real proxy forwarding
to the fake vLLM-shaped engine that fails as engines fail, and the outcome route."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from agentlightning.server.app import create_app
from agentlightning.server.outcomes import call_outcome
from tests.fakes.model_server import FakeModelServer, Reply

KEY = "admin-key"
CONTROLLER = "controller-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
USER = [{"role": "user", "content": "what is two plus two"}]
# What engines answer to a prompt over their context: vLLM (before and since 0.10) and the torch
# engine (torch_backend/engine.py `_check_prompt`).
VLLM_OLD = (
    "This model's maximum context length is 2048 tokens. However, you requested 2100 tokens "
    "(2000 in the messages, 100 in the completion). Please reduce the length of the messages or completion."
)
VLLM_NEW = (
    "The decoder prompt (length 5000) is longer than the maximum model length of 4096. "
    "Make sure that `max_model_len` is no smaller than the number of text tokens."
)
TORCH_ENGINE = "this model's maximum context length is 64 tokens; the prompt has 80 tokens"


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeModelServer]:
    with FakeModelServer() as server:
        yield server


@pytest.fixture(params=["memory", "sqlite"])
def api(request: pytest.FixtureRequest, tmp_path: Path, fake: FakeModelServer) -> Iterator[TestClient]:
    fake.state.reset()
    url = "memory://" if request.param == "memory" else f"sqlite:///{tmp_path / 'g.db'}"
    config = {
        "key": KEY,
        "controller_key": CONTROLLER,
        "store": {"url": url},
        "proxy": {"max_tries": 2, "backoff_seconds": 0.01, "max_backoff_seconds": 0.02},
    }
    with TestClient(create_app(config), headers=AUTH) as client:
        r = client.post("/api/models", json=[{"model": "policy", "endpoint": fake.base_url}])
        assert r.status_code < 300, r.text
        yield client


def start(api: TestClient, rollout_id: str, attempt_id: str = "a1") -> None:
    r = api.post("/api/rollouts", json=[{"rollout_id": rollout_id, "input": {"q": 1}}])
    assert r.status_code == 201, r.text
    patch(api, rollout_id, state="running", last_attempt_id=attempt_id)


def patch(api: TestClient, rollout_id: str, **status: Any) -> None:
    r = api.patch(f"/api/rollouts/{rollout_id}", json={"status": status})
    assert r.status_code == 200, r.text


def call(api: TestClient, rollout_id: str, attempt_id: str = "a1") -> int:
    url = f"/proxy/rollout/{rollout_id}/attempt/{attempt_id}/mode/train/openai/v1/chat/completions"
    return api.post(url, json={"model": "policy", "messages": USER}).status_code


def reward(api: TestClient, rollout_id: str, value: float, attempt_id: str = "a1") -> None:
    r = api.post(
        f"/api/rollouts/{rollout_id}/attempt/{attempt_id}/events",
        json={"event_type": "reward", "data": {"value": value}},
    )
    assert r.status_code < 300, r.text


def attempts(api: TestClient, rollout_id: str) -> dict[str, tuple[str | None, str | None]]:
    detail = api.get(f"/api/rollouts/{rollout_id}").json()
    return {a["attempt_id"]: (a["outcome"], a["outcome_detail"]) for a in detail["attempt_details"]}


def batch_outcomes(api: TestClient, *rollout_ids: str) -> list[str | None]:
    r = api.post("/api/rollouts/batch/events", json={"rollout_ids": list(rollout_ids)})
    return [a.get("outcome") for a in r.json()]


def test_an_engine_that_answers_503_after_the_retries_makes_model_unavailable_whatever_the_agent_reports(
    api: TestClient, fake: FakeModelServer
) -> None:
    start(api, "r1")
    fake.script(Reply(status=503, times=2))  # both of the proxy's tries
    assert call(api, "r1") == 502  # the proxy's answer once its retries are used up
    reward(api, "r1", 0.0)  # what a naive agent reports after the error
    patch(api, "r1", state="succeeded")
    outcome, detail = attempts(api, "r1")["a1"]
    assert outcome == "model_unavailable" and detail is not None and "503" in detail
    assert batch_outcomes(api, "r1") == ["model_unavailable"]
    [shown] = api.get("/api/dashboard/rollouts/r1").json()["attempts"]  # the dashboard's attempt view
    assert (shown["outcome"], shown["outcome_detail"]) == (outcome, detail)


def test_a_retry_that_succeeds_is_no_evidence(api: TestClient, fake: FakeModelServer) -> None:
    start(api, "r1")
    fake.script(Reply(status=503))  # the second try gets the answer
    assert call(api, "r1") == 200
    reward(api, "r1", 1.0)
    patch(api, "r1", state="succeeded")
    assert attempts(api, "r1")["a1"] == ("ok", None)


@pytest.mark.parametrize("message", [VLLM_OLD, VLLM_NEW, TORCH_ENGINE])
def test_a_prompt_the_engine_refuses_for_its_length_makes_context_overflow(
    api: TestClient, fake: FakeModelServer, message: str
) -> None:
    start(api, "r1")
    body = {"error": {"message": message, "type": "BadRequestError", "code": 400}}
    fake.script(Reply(status=400, error_body=body))
    assert call(api, "r1") == 400
    patch(api, "r1", state="failed", error_message="agent raised BadRequestError")
    assert attempts(api, "r1")["a1"][0] == "context_overflow"


def test_another_400_is_no_evidence_and_the_failure_is_the_agents(
    api: TestClient, fake: FakeModelServer
) -> None:
    start(api, "r1")
    fake.script(Reply(status=400, error_body={"error": {"message": "temperature must be >= 0"}}))
    assert call(api, "r1") == 400
    patch(api, "r1", state="failed", error_message="agent raised")
    assert attempts(api, "r1")["a1"] == ("agent_error", "agent raised")


def test_the_end_of_a_rollout_without_evidence_says_ok_or_no_reward(api: TestClient) -> None:
    start(api, "good")
    reward(api, "good", 0.0)  # a real 0 is a reward
    patch(api, "good", state="succeeded")
    start(api, "silent")
    patch(api, "silent", state="succeeded")
    assert batch_outcomes(api, "good", "silent", "missing") == ["ok", "no_reward", None]
    assert attempts(api, "silent")["a1"][0] == "no_reward"


def test_the_outcome_route_keeps_the_strongest_evidence_and_only_the_controller_or_admin_may_report(
    api: TestClient,
) -> None:
    start(api, "r1")
    url = "/api/rollouts/r1/attempts/a1/outcome"
    # an agent's token may not speak for its own attempt's outcome
    token = api.post("/api/agent-tokens", json={"rollout_id": "r1", "attempt_id": "a1"}).json()["token"]
    r = api.put(url, json={"outcome": "ok"}, headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 403
    r = api.put(
        url,
        json={"outcome": "pod_lost", "detail": "OOMKilled"},
        headers={"Authorization": f"Bearer {CONTROLLER}"},
    )
    assert r.json() == {"rollout_id": "r1", "attempt_id": "a1", "outcome": "pod_lost", "detail": "OOMKilled"}
    r = api.put(url, json={"outcome": "agent_error"})
    assert r.json()["outcome"] == "pod_lost"  # weaker evidence does not replace it
    reward(api, "r1", 1.0)
    patch(api, "r1", state="succeeded")  # the agent's reward does not either
    assert attempts(api, "r1")["a1"] == ("pod_lost", "OOMKilled")
    # a rollout that never started an attempt ("-")
    api.post("/api/rollouts", json=[{"rollout_id": "r2"}])
    assert api.put("/api/rollouts/r2/attempts/-/outcome", json={"outcome": "lost"}).json()["attempt_id"] == ""
    assert batch_outcomes(api, "r2") == ["lost"]
    # bad input: named
    r = api.put(url, json={"outcome": "vanished"})
    assert r.status_code == 422 and "vanished" in r.text
    assert api.put("/api/rollouts/nope/attempts/a1/outcome", json={"outcome": "ok"}).status_code == 404


def test_v1_readers_see_the_attempts_they_knew(api: TestClient, fake: FakeModelServer) -> None:
    start(api, "r1")
    assert call(api, "r1") == 200
    patch(api, "r1", state="failed", error_message="boom")
    detail = api.get("/api/rollouts/r1").json()
    assert detail["attempts"] == ["a1"]  # v1.0's list: the attempts that have events
    assert detail["attempt_details"][0]["outcome"] == "agent_error"


def test_the_dashboard_counts_the_attempts_of_an_agent_that_failed_before_its_first_call(
    api: TestClient,
) -> None:
    """A wrong agent module: each attempt fails at launch, recording no event. The Controller
    reports the failed attempt's outcome, retries, and fails the rollout."""
    start(api, "r1", "a1")
    r = api.put(
        "/api/rollouts/r1/attempts/a1/outcome",
        json={"outcome": "agent_error", "detail": "No module named 'my_agnet'"},
        headers={"Authorization": f"Bearer {CONTROLLER}"},
    )
    assert r.status_code == 200, r.text
    patch(api, "r1", state="running", last_attempt_id="a2")
    patch(api, "r1", state="failed", error_message="No module named 'my_agnet'")
    [row] = api.get("/api/dashboard/rollouts").json()["items"]
    assert (row["rollout_id"], row["state"], row["attempts"]) == ("r1", "failed", 2)
    shown = api.get("/api/dashboard/rollouts/r1").json()["attempts"]
    assert [(a["attempt_id"], a["n_events"], a["outcome"]) for a in shown] == [
        ("a1", 0, "agent_error"),
        ("a2", 0, "agent_error"),
    ]
    assert [a["attempt_id"] for a in api.get("/api/rollouts/r1").json()["attempt_details"]] == ["a1", "a2"]


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"status": "ok", "http_status": 200}, None),
        ({"status": "error", "http_status": 502, "error": "after 6 tries: refused"}, "model_unavailable"),
        ({"status": "error", "http_status": 504, "error": "did not answer in time"}, "model_unavailable"),
        ({"status": "error", "http_status": 429, "error": "slow down"}, "model_unavailable"),
        ({"status": "error", "http_status": 400, "error": VLLM_NEW}, "context_overflow"),
        ({"status": "error", "http_status": 400, "error": "bad temperature"}, None),
        ({"status": "error", "http_status": 200, "incomplete": True, "error": "cut"}, None),
    ],
)
def test_which_failed_calls_are_evidence(data: dict[str, Any], expected: str | None) -> None:
    assert call_outcome(data) == expected


def test_injected_faults_strike_the_same_calls_again_never_reach_the_model_and_are_evidence(
    tmp_path: Path, fake: FakeModelServer
) -> None:
    """`proxy.fault_rate` (chaos testing): a struck call is answered as after the retries and
    recorded as model_unavailable; the same request sent again is struck again; others pass."""
    fake.state.reset()
    config = {"key": KEY, "store": {"url": "memory://"}, "proxy": {"fault_rate": 0.5, "fault_seed": 7}}
    with TestClient(create_app(config), headers=AUTH) as api:
        api.post("/api/models", json=[{"model": "policy", "endpoint": fake.base_url}])
        ids = [f"r{i}" for i in range(40)]
        first = {}
        for rollout_id in ids:
            start(api, rollout_id)
            first[rollout_id] = call(api, rollout_id)
        struck = [r for r in ids if first[r] == 502]
        assert set(first.values()) == {200, 502} and 8 <= len(struck) <= 32  # about half of 40
        assert fake.state.total == len(ids) - len(struck)  # a struck call never reached the model
        assert {r: call(api, r) for r in ids} == first  # the agent's retry: struck again, or not
        for rollout_id in ids:
            reward(api, rollout_id, 0.0)
            patch(api, rollout_id, state="succeeded")
        outcomes = {r: attempts(api, r)["a1"] for r in ids}
        assert {r for r, (o, _) in outcomes.items() if o == "model_unavailable"} == set(struck)
        assert "fault injected" in (outcomes[struck[0]][1] or "")


def test_injected_faults_strike_only_the_modes_named(fake: FakeModelServer) -> None:
    config = {
        "key": KEY,
        "store": {"url": "memory://"},
        "proxy": {"fault_rate": 1.0, "fault_modes": ["train"]},
    }
    with TestClient(create_app(config), headers=AUTH) as api:
        api.post("/api/models", json=[{"model": "policy", "endpoint": fake.base_url}])
        start(api, "r1")
        assert call(api, "r1") == 502
        url = "/proxy/rollout/r1/attempt/a1/mode/val/openai/v1/chat/completions"
        assert api.post(url, json={"model": "policy", "messages": USER}).status_code == 200


@pytest.mark.parametrize(
    ("proxy", "message"),
    [
        ({"fault_rate": -0.1}, r"proxy\.fault_rate must be in \[0, 1\]"),
        ({"fault_rate": 1.5}, r"proxy\.fault_rate must be in \[0, 1\]"),
        ({"fault_modes": ["training"]}, r"proxy\.fault_modes: unknown mode 'training'"),
        ({"fault_rate": 0.2, "fault_modes": []}, r"proxy\.fault_modes is empty"),
    ],
)
def test_bad_fault_settings_are_refused_naming_the_key(proxy: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        create_app({"key": KEY, "store": {"url": "memory://"}, "proxy": proxy})
