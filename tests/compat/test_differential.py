"""Differential test: Agent Lightning v1.0.2's `agl-server` and ours, side by side.

Both get the same requests for every v1.0 route — good and bad inputs, the state machine,
events, triplets, the terminal cursor, the proxy in front of one scripted model server, pause —
and must answer with the same status codes and the same JSON, field by field. What may differ is
listed below, each with its reason; everything else is a bug.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.compat.conftest import KEY, V1Gateway
from tests.conftest import RunningGateway, start_gateway
from tests.fakes.model_server import FakeModelServer

pytestmark = pytest.mark.timeout(300)

# --- what may differ, and why ------------------------------------------------------------------

# Values that differ between any two runs: clocks, latencies, the model server's answer ids.
VOLATILE = {"created_at", "updated_at", "timestamp", "latency_ms", "created", "id"}
# Our additions (optional fields, ignored by v1.0 clients): (parent key, key).
ADDED = {
    ("status", "log_path"),  # where the local runner writes the agent's output
    ("metadata", "data_id"),  # the prompt's group id, set by our trainer
    ("event", "sequence"),  # position in the Gateway's append order
    ("detail", "attempt_details"),  # the attempts with event counts and times
}
# Our additions to a `model_request` event: which API and mode, the rewritten parameters
# apart from the request, the upstream error text, our retry count's name, streaming flags, and
# whether the call's prompt continues the attempt's previous call (`segment`: a break's reason).
ADDED_MODEL_REQUEST = {"api", "mode", "params", "error", "retries", "stream", "incomplete", "segment"}
# v1.0 records the rewritten body as `request`; ours records the agent's own body there and the
# rewrite in `params` (so the agent's own choice of e.g. temperature stays visible). The test
# checks that v1.0's `request` == ours `{**request, **params}`.
#
# Requests where v1.0 answers something we deliberately answer differently (id → reason):
INTENDED = {
    "create-without-input": "v1.0 requires `input`; ours defaults it to null (an extension)",
    "list-without-state_in": "v1.0 requires `state_in`; without it ours lists every state (an extension)",
    "reward-not-a-number": "v1.0 stores any reward payload; ours refuses a reward without a finite value (422)",
    "patch-terminal-fields": "v1.0 lets a terminal rollout's fields change; ours: terminal is final (409)",
    "patch-same-state": "v1.0 answers 409 to running -> running; ours accepts it (a controller records a new"
    " attempt id without a state change)",
    "patch-unknown-top-level": "v1.0 ignores unknown fields beside `status` (200, unchanged); ours names them"
    " (422), so that a misplaced `state` is not silently dropped",
    "triplet-other-events": "the triplet view: v1.0 passes events other than model_request and reward through"
    " unchanged; ours leaves them out (the training view carries only what training reads)",
    "total-terminal-after-delete": "`total_terminal`: v1.0 counts deleted rollouts too; ours counts those still"
    " stored (next_after, the cursor, is the same)",
    "patch-null-state": "v1.0 answers 409 to `state: null`; ours reads it as 'no state change' (200)",
    "model-endpoint-not-http": "v1.0 registers any endpoint string; ours only http(s) URLs (422, security)",
    "proxy-stream": "v1.0 refuses `stream: true` (400); ours streams",
    "completions-logprobs": "train-mode completions: v1.0 asks the server for `logprobs: true`, which the"
    " completions API does not take (it wants a count), and records no log-probs; ours asks for `logprobs: 1`",
}


def normalize(value: Any, parent: str = "") -> Any:
    if isinstance(value, dict):
        kind = parent
        if "event_type" in value and "attempt_id" in value:
            kind = "event"
        elif "rollout" in value and "attempts" in value:
            kind = "detail"
        return {k: normalize(v, k) for k, v in value.items() if k not in VOLATILE and (kind, k) not in ADDED}
    if isinstance(value, list):
        return [normalize(v, parent) for v in value]
    return value


def first_difference(a: Any, b: Any, path: str = "") -> str | None:
    """Where two JSON values first differ, for the failure message."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                return f"{path}.{k}: only in {'ours' if k in b else 'v1.0'}"
            found = first_difference(a[k], b[k], f"{path}.{k}")
            if found:
                return found
        return None
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return f"{path}: {len(a)} items in v1.0, {len(b)} in ours"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            found = first_difference(x, y, f"{path}[{i}]")
            if found:
                return found
        return None
    return None if a == b else f"{path}: v1.0 {a!r}, ours {b!r}"


def v1_model_request(ours: dict[str, Any]) -> dict[str, Any]:
    """Our `model_request` data as v1.0 writes it (see ADDED_MODEL_REQUEST above)."""
    data = {k: v for k, v in ours.items() if k not in ADDED_MODEL_REQUEST}
    data["request"] = {**ours["request"], **ours["params"]}
    return data


def as_v1(body: Any) -> Any:
    """Our answer with every model_request event in v1.0's shape."""
    if isinstance(body, list):
        return [as_v1(item) for item in body]
    if isinstance(body, dict) and body.get("event_type") == "model_request" and "params" in body["data"]:
        return {**body, "data": v1_model_request(body["data"])}
    return body


class Pair:
    """Sends every request to both Gateways and compares the answers."""

    def __init__(self, v1_url: str, ours_url: str) -> None:
        headers = {"Authorization": f"Bearer {KEY}"}
        self.v1 = httpx.Client(base_url=v1_url, headers=headers, timeout=60)
        self.ours = httpx.Client(base_url=ours_url, headers=headers, timeout=60)
        self.mismatches: list[str] = []
        self.intended_seen: set[str] = set()
        self.compared = 0

    def close(self) -> None:
        self.v1.close()
        self.ours.close()

    def send(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        content: bytes | None = None,
        params: Any = None,
        headers: dict[str, str] | None = None,
        intended: str | None = None,
        check: Callable[[httpx.Response, httpx.Response], None] | None = None,
    ) -> tuple[httpx.Response, httpx.Response]:
        answers = []
        for client in (self.v1, self.ours):
            kwargs: dict[str, Any] = {"params": params, "headers": headers}
            if content is not None:
                kwargs["content"] = content
                kwargs["headers"] = {**(headers or {}), "content-type": "application/json"}
            elif json is not None:
                kwargs["json"] = json
            answers.append(client.request(method, path, **kwargs))
        v1, ours = answers
        self.compared += 1
        where = f"{method} {path} {params or ''} {json if json is not None else ''}"[:300]
        same = self._same(v1, ours)
        if intended is not None:
            assert intended in INTENDED
            if same:
                self.mismatches.append(
                    f"{where}: listed as intended difference {intended!r} but answers agree"
                )
            self.intended_seen.add(intended)
        elif not same:
            where_json = (
                first_difference(normalize(v1.json()), normalize(as_v1(ours.json())))
                if v1.status_code == ours.status_code
                else f"status v1.0 {v1.status_code} {v1.text[:200]}, ours {ours.status_code} {ours.text[:200]}"
            )
            self.mismatches.append(f"{where}: {where_json}")
        if check is not None:
            check(v1, ours)
        return v1, ours

    @staticmethod
    def _same(v1: httpx.Response, ours: httpx.Response) -> bool:
        if v1.status_code != ours.status_code:
            return False
        if v1.status_code >= 400 or v1.status_code == 204:
            return True  # errors: the same status; our `detail` texts say more (wording differs)
        return normalize(v1.json()) == normalize(as_v1(ours.json()))


@pytest.fixture
def fake() -> Iterator[FakeModelServer]:
    with FakeModelServer() as server:
        yield server


@pytest.fixture
def pair(
    v1_gateway_factory: Callable[..., V1Gateway], tmp_path: Path, fake: FakeModelServer
) -> Iterator[Pair]:
    same = ("default_proxy.model_name=policy",)
    v1 = v1_gateway_factory(*same)
    ours: RunningGateway = start_gateway(tmp_path, KEY, "store.url=memory://", *same)
    p = Pair(v1.url, ours.url)
    yield p
    p.close()
    ours.process.stop()


CHAT = {
    "model": "anything",
    "messages": [{"role": "user", "content": "what is two plus two"}],
    "max_tokens": 6,
}
PROXY = "/proxy/rollout/{rid}/attempt/{aid}/mode/{mode}/openai/v1/{path}"


def proxy(rid: str, aid: str = "a1", mode: str = "train", path: str = "chat/completions") -> str:
    return PROXY.format(rid=rid, aid=aid, mode=mode, path=path)


def test_v1_and_ours_answer_alike(pair: Pair, fake: FakeModelServer) -> None:
    p = pair
    # health and auth
    p.send("GET", "/healthz")
    p.send("GET", "/api/rollouts", params={"state_in": "queuing"}, headers={"Authorization": ""})
    p.send("GET", "/api/rollouts", params={"state_in": "queuing"}, headers={"Authorization": "Bearer wrong"})
    p.send(
        "GET",
        "/api/rollouts",
        params={"state_in": "queuing"},
        headers={"Authorization": "", "x-api-key": KEY},
    )

    # create: explicit ids, every field, idempotent re-create, bad bodies
    r1 = {"rollout_id": "r1", "input": {"data_id": "d1", "q": 1}}
    r2 = {
        "rollout_id": "r2",
        "input": "plain text",
        "is_train": False,
        "config": {"timeout_seconds": 30, "local": {"agent_class": "m.C", "env_map": {"Q": "input"}}},
        "metadata": {"batch_idx": 0, "sample_idx_in_batch": 1, "extra": "x"},
    }
    r3 = {
        "rollout_id": "r3",
        "input": {"instance_id": "i3"},
        "config": {"k8s": {"job_template": "kind: Job"}},
    }
    p.send("POST", "/api/rollouts", json=[r1, r2, r3])
    p.send("POST", "/api/rollouts", json=[{**r1, "input": "changed"}])  # existing id: unchanged
    p.send("POST", "/api/rollouts", json={"input": 1})  # not a list
    p.send("POST", "/api/rollouts", json=[{"input": 1, "is_train": "maybe"}])
    p.send("POST", "/api/rollouts", json=[{"input": 1, "config": {"timeout_seconds": "soon"}}])
    p.send("POST", "/api/rollouts", content=b"[{not json")
    p.send("POST", "/api/rollouts", json=[{"rollout_id": "no-input"}], intended="create-without-input")
    p.send("DELETE", "/api/rollouts/no-input")
    v1, ours = p.send(
        "POST",
        "/api/rollouts",
        json=[{"input": {"auto": True}}],
        check=lambda a, b: None,
    )
    # server-assigned ids differ by nature: both 32 hex characters; then removed again
    for answer in (v1, ours):
        assert answer.status_code == 201 and re.fullmatch(r"[0-9a-f]{32}", answer.json()[0]["rollout_id"])
    p.mismatches = [m for m in p.mismatches if "auto" not in m]
    p.v1.delete(f"/api/rollouts/{v1.json()[0]['rollout_id']}")
    p.ours.delete(f"/api/rollouts/{ours.json()[0]['rollout_id']}")

    # list
    queuing = [("state_in", "queuing")]
    p.send("GET", "/api/rollouts", params=queuing)
    p.send("GET", "/api/rollouts", params=[*queuing, ("state_in", "running")])
    for limit in (1, 2, 0, 100_000):
        p.send("GET", "/api/rollouts", params=[*queuing, ("limit", limit)])
    p.send("GET", "/api/rollouts", params=[("state_in", "paused")])
    p.send("GET", "/api/rollouts", params=[*queuing, ("limit", "many")])
    p.send("GET", "/api/rollouts", intended="list-without-state_in")

    # get
    p.send("GET", "/api/rollouts/r1")
    p.send("GET", "/api/rollouts/r2")
    p.send("GET", "/api/rollouts/ghost")

    # the state machine
    p.send("PATCH", "/api/rollouts/r1", json={"status": {"state": "running", "last_attempt_id": "a1"}})
    p.send("PATCH", "/api/rollouts/r1", json={"status": {"state": "queuing"}})
    p.send("PATCH", "/api/rollouts/r1", json={"status": {"k8s_job_name": "job-1"}})
    p.send("PATCH", "/api/rollouts/r1", json={"status": {}})
    p.send("PATCH", "/api/rollouts/r1", json={})
    p.send("PATCH", "/api/rollouts/r1", json={"status": {"colour": "red"}})
    p.send("PATCH", "/api/rollouts/r1", json={"status": {"state": "done"}})
    p.send("PATCH", "/api/rollouts/r1", json={"state": "running"}, intended="patch-unknown-top-level")
    p.send("PATCH", "/api/rollouts/ghost", json={"status": {"state": "running"}})
    p.send("PATCH", "/api/rollouts/r2", json={"status": {"state": "succeeded"}})  # queuing -> succeeded
    # on a rollout of their own, removed afterwards: versions then differ by design
    p.send("POST", "/api/rollouts", json=[{"rollout_id": "r4", "input": 4}])
    p.send("PATCH", "/api/rollouts/r4", json={"status": {"state": "queuing"}}, intended="patch-same-state")
    p.send("PATCH", "/api/rollouts/r4", json={"status": {"state": None}}, intended="patch-null-state")
    p.send(
        "POST",
        "/api/rollouts/r4/attempt/a9/events",
        json={"event_type": "reward", "data": {"value": "high"}},
        intended="reward-not-a-number",
    )
    p.send("DELETE", "/api/rollouts/r4")
    p.send("GET", "/api/rollouts/r1")

    # events
    reward = {"event_type": "reward", "data": {"value": 0.5, "source": "agent", "reason": "ok", "note": "n"}}
    p.send("POST", "/api/rollouts/r1/attempt/a1/events", json=reward)
    p.send(
        "POST",
        "/api/rollouts/r1/attempt/a1/events",
        json={"event_type": "log", "data": {"msg": "x", "n": [1]}},
    )
    p.send("POST", "/api/rollouts/r1/attempt/a0/events", json={"event_type": "log", "data": {"old": True}})
    p.send("POST", "/api/rollouts/r1/attempt/a1/events", json={"event_type": "log"})
    p.send("POST", "/api/rollouts/r1/attempt/a1/events", json={"data": {}})
    p.send("POST", "/api/rollouts/r1/attempt/a1/events", json={"event_type": "log", "data": [1]})
    p.send("POST", "/api/rollouts/ghost/attempt/a1/events", json=reward)
    p.send("POST", "/api/rollouts/r2/attempt/0/events", json={"event_type": "log", "data": {"default": 0}})
    p.send("GET", "/api/rollouts/r1/events")
    p.send("GET", "/api/rollouts/r1/events", params={"event_type": "reward"})
    p.send("GET", "/api/rollouts/r1/events", params={"format": "triplet"}, intended="triplet-other-events")
    p.send("GET", "/api/rollouts/r1/events", params={"format": "other"})
    p.send("GET", "/api/rollouts/r1/events", params={"format": "triplet", "event_type": "reward"})
    p.send("GET", "/api/rollouts/r2/events")  # no last attempt: v1.0's default attempt "0"
    p.send("GET", "/api/rollouts/ghost/events")
    p.send("GET", "/api/rollouts/r1")  # attempts, sorted by first event

    # models and the proxy in front of one scripted model server
    p.send("POST", "/api/models", json=[{"model": "policy", "endpoint": fake.base_url}])
    p.send("POST", "/api/models", json=[{"model": "policy", "endpoint": fake.base_url, "version": 3}])
    p.send("POST", "/api/models", json=[{"model": "policy"}])
    p.send(
        "POST",
        "/api/models",
        json=[{"model": "x", "endpoint": "file:///etc"}],
        intended="model-endpoint-not-http",
    )
    p.send("POST", proxy("r1"), json=CHAT)
    p.send(
        "POST", proxy("r1"), json={**CHAT, "messages": [{"role": "user", "content": "and three plus three"}]}
    )
    completion = {"model": "x", "prompt": "one two three", "max_tokens": 4}
    p.send("POST", proxy("r1", mode="val", path="completions"), json=completion)
    p.send("POST", proxy("r1", mode="val"), json={**CHAT, "temperature": 0.1})
    p.send("POST", proxy("r1", mode="test"), json=CHAT)
    p.send("POST", proxy("r1", path="embeddings"), json=CHAT)
    p.send("POST", proxy("ghost"), json=CHAT)
    p.send("POST", proxy("r1"), content=b"{broken")
    p.send("POST", proxy("r1"), json=[1, 2])
    p.send("GET", "/api/rollouts/r1/events", params={"event_type": "model_request"})
    p.send("GET", "/api/rollouts/r1/events", params={"format": "triplet", "event_type": "model_request"})
    # where we differ on purpose, on a rollout of its own
    p.send("POST", "/api/rollouts", json=[{"rollout_id": "r6", "input": 6}])
    p.send("POST", proxy("r6"), json={**CHAT, "stream": True}, intended="proxy-stream")
    p.send("POST", proxy("r6", path="completions"), json=completion)
    p.send("GET", "/api/rollouts/r6/events", params={"format": "triplet"}, intended="completions-logprobs")
    p.send("DELETE", "/api/rollouts/r6")

    # pause, resume
    p.send("GET", "/proxy/state")

    def same_paused_headers(v1: httpx.Response, ours: httpx.Response) -> None:
        for name in ("retry-after", "x-agl-paused"):
            assert v1.headers.get(name) == ours.headers.get(name), name

    p.send("POST", "/proxy/pause", json={"retry_after_seconds": 3, "reason": "weights"})
    p.send("POST", proxy("r1"), json=CHAT, check=same_paused_headers)
    p.send("GET", "/proxy/state")
    p.send("POST", "/proxy/pause", json={"retry_after_seconds": "soon"})
    p.send("POST", "/proxy/resume")
    p.send("POST", "/proxy/pause", json={})
    p.send("POST", "/proxy/resume")

    # terminal states and the cursor
    p.send("PATCH", "/api/rollouts/r1", json={"status": {"state": "succeeded"}})
    p.send("PATCH", "/api/rollouts/r1", json={"status": {"state": "failed"}})
    p.send("PATCH", "/api/rollouts/r3", json={"status": {"state": "failed", "error_message": "boom"}})
    p.send("PATCH", "/api/rollouts/r2", json={"status": {"state": "running"}})
    p.send("PATCH", "/api/rollouts/r2", json={"status": {"state": "failed"}})
    for params in ({}, {"after": 1}, {"after": 1, "limit": 1}, {"after": -5}, {"limit": 0}, {"limit": 10**6}):
        p.send("GET", "/api/rollouts/terminal", params=params)
    p.send("GET", "/api/rollouts/terminal", params={"after": "x"})
    p.send("GET", "/api/rollouts", params=[("state_in", "succeeded"), ("state_in", "failed")])

    # a terminal rollout's fields, on a rollout of its own
    p.send("POST", "/api/rollouts", json=[{"rollout_id": "r5", "input": 5}])
    p.send("PATCH", "/api/rollouts/r5", json={"status": {"state": "failed"}})
    p.send(
        "PATCH",
        "/api/rollouts/r5",
        json={"status": {"error_message": "late"}},
        intended="patch-terminal-fields",
    )
    p.send("DELETE", "/api/rollouts/r5")

    # delete
    p.send("DELETE", "/api/rollouts/r1")
    p.send("DELETE", "/api/rollouts/r1")
    p.send("GET", "/api/rollouts/r1")
    p.send("GET", "/api/rollouts/r1/events")
    p.send("POST", "/api/rollouts/r1/attempt/a1/events", json=reward)
    p.send("GET", "/api/rollouts/terminal", intended="total-terminal-after-delete")
    p.send("DELETE", "/api/models")
    p.send("POST", proxy("r2"), json=CHAT)  # no model server any more

    assert p.compared > 90
    assert not p.mismatches, f"{len(p.mismatches)} unintended differences:\n" + "\n".join(p.mismatches)
    assert p.intended_seen == set(INTENDED)
