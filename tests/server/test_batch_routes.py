"""The batch routes (additions over v1.0): many rollouts' events, or deletes, in one request."""

from __future__ import annotations

import base64

import httpx
import orjson
import pytest

from agentlightning.client import BadRequest, GatewayClient, expand_prompt_refs
from agentlightning.schemas import MAX_BATCH_IDS, RolloutState
from agentlightning.server.triplet import to_triplet


def _call(prompt: list[int], response: list[int]) -> dict:
    return {
        "response": {"prompt_token_ids": prompt, "choices": [{"token_ids": response}]},
        "server": {"model": "policy", "version": 3},
    }


def _setup(c: GatewayClient) -> None:
    c.create_rollouts([{"rollout_id": rid, "input": {}} for rid in ("r1", "r2", "r3")])
    c.patch_rollout("r1", state="running", last_attempt_id="a1")
    c.post_event("r1", "a0", "model_request", _call([1], [9]))  # an older attempt: not returned
    c.post_event("r1", "a1", "model_request", _call([1, 2], [3]))
    c.post_event("r1", "a1", "log", {"line": "hello"})
    c.post_reward("r1", "a1", 0.5)
    c.patch_rollout("r1", state="succeeded")
    c.patch_rollout("r2", state="failed", error_message="agent crashed")


def test_batch_events_answer_every_id_in_order_with_the_per_rollout_view(gateway):
    with GatewayClient(gateway.url, gateway.key) as c:
        _setup(c)
        items = c.get_events_batch(["r2", "nope", "r1", "r3"])
        assert [(i["rollout_id"], i["found"]) for i in items] == [
            ("r2", True),
            ("nope", False),
            ("r1", True),
            ("r3", True),
        ]
        assert items[0]["state"] == "failed" and items[0]["error_message"] == "agent crashed"
        assert items[2]["state"] == RolloutState.SUCCEEDED and items[3]["state"] == "queuing"
        # exactly what the per-rollout route answers
        assert items[2]["events"] == c.get_events_json("r1", format="triplet")
        assert [e["event_type"] for e in items[2]["events"]] == ["model_request", "reward"]
        assert items[2]["events"][0]["data"]["prompt_token_ids"] == [1, 2]
        raw = c.get_events_batch(["r1"], format="raw")[0]["events"]
        assert raw == c.get_events_json("r1", format="raw") and len(raw) == 3
        rewards = c.get_events_batch(["r1"], format="raw", event_type="reward")[0]["events"]
        assert [e["data"] for e in rewards] == [{"value": 0.5}]
        assert c.get_events_batch([]) == []


def test_batch_delete_removes_rollouts_and_events_and_is_idempotent(gateway):
    with GatewayClient(gateway.url, gateway.key) as c:
        _setup(c)
        assert c.delete_rollouts(["r1", "r2", "nope"]) == 2
        assert c.delete_rollouts(["r1", "r2"]) == 0
        assert [r.rollout_id for r in c.list_rollouts()] == ["r3"]
        assert c.get_events_batch(["r1"])[0]["found"] is False


def test_batch_routes_refuse_bad_bodies_saying_what_is_wrong(gateway):
    with GatewayClient(gateway.url, gateway.key) as c:
        with pytest.raises(BadRequest, match="rollout_ids"):
            c.delete_rollouts([f"r{i}" for i in range(MAX_BATCH_IDS + 1)])
        with pytest.raises(BadRequest, match="rollout_ids"):
            c.get_events_batch(["has space"])
        with pytest.raises(BadRequest, match="format"):
            c.get_events_batch(["r1"], format="xml")  # type: ignore[arg-type]
    answer = httpx.post(
        f"{gateway.url}/api/rollouts/batch/delete",
        json={"rollout_ids": [], "extra": 1},
        headers={"Authorization": f"Bearer {gateway.key}"},
    )
    assert answer.status_code == 422 and "extra" in answer.text
    assert httpx.post(f"{gateway.url}/api/rollouts/batch/events", json={"rollout_ids": []}).status_code == 401


def _chat(prompt: list[int], messages: list[dict], response: list[int]) -> dict:
    return {
        "request": {"messages": messages},
        "response": {
            "prompt_token_ids": prompt,
            "choices": [
                {"token_ids": response, "logprobs": {"content": [{"logprob": -0.5} for _ in response]}}
            ],
        },
        "server": {"model": "policy", "version": 3},
        "http_status": 200,
    }


def test_calls_stored_as_deltas_read_back_byte_for_byte_on_every_route(gateway):
    """Raw, triplet and batch reads return exactly the JSON of what was posted; the collection
    format sends each call's new prompt ids only."""
    posted = []
    prompt, messages = list(range(100, 700)), [{"role": "user", "content": "go"}]  # long enough to split
    for t in range(5):
        posted.append(("model_request", _chat(list(prompt), list(messages), [7, t])))
        if t == 2:
            posted.append(
                ("model_request", {"request": {"messages": messages}, "response": None, "status": "error"})
            )
        prompt = [*prompt, 7, t, 50, 51]
        messages = [*messages, {"role": "assistant", "content": f"a{t}"}, {"role": "tool", "content": "é\n"}]
    posted.append(("reward", {"value": 1.0}))
    with GatewayClient(gateway.url, gateway.key) as c:
        c.create_rollouts([{"rollout_id": "long", "input": {}}])
        c.patch_rollout("long", state="running", last_attempt_id="a1")
        for event_type, data in posted:
            c.post_event("long", "a1", event_type, data)
        http = c._http
        auth = {"Authorization": f"Bearer {gateway.key}"}
        raw = http.get(f"{gateway.url}/api/rollouts/long/events", headers=auth).content
        triplet = http.get(f"{gateway.url}/api/rollouts/long/events?format=triplet", headers=auth).content
        batch = {
            fmt: http.post(
                f"{gateway.url}/api/rollouts/batch/events",
                json={"rollout_ids": ["long"], "format": fmt},
                headers=auth,
            ).content
            for fmt in ("raw", "triplet", "triplet_delta")
        }

    def expected(answer: bytes, payloads: list[bytes]) -> bytes:
        heads = [
            orjson.dumps(
                {k: e[k] for k in ("event_type", "rollout_id", "attempt_id", "timestamp", "sequence")}
            )
            for e in orjson.loads(answer)
        ]
        assert len(heads) == len(payloads)
        return (
            b"["
            + b",".join(h[:-1] + b',"data":' + p + b"}" for h, p in zip(heads, payloads, strict=True))
            + b"]"
        )

    assert raw == expected(raw, [orjson.dumps(d) for _, d in posted])
    converted = [to_triplet(t, d) for t, d in posted]
    triplets = [orjson.dumps(c[0]) for c in converted if c is not None]
    assert len(triplets) == len(posted)
    assert triplet == expected(triplet, triplets)
    assert (
        batch["raw"]
        == b'[{"rollout_id":"long","found":true,"state":"running","error_message":null,"outcome":null,"events":'
        + raw
        + b"}]"
    )
    assert batch["triplet"].endswith(b'"events":' + triplet + b"}]")
    delta = orjson.loads(batch["triplet_delta"])[0]["events"]
    calls = [
        e["data"] for e in delta if e["event_type"] == "model_request" and e["data"].get("status") != "error"
    ]
    assert calls[0]["prompt_ref"] is None and len(base64.b64decode(calls[0]["prompt_suffix"])) == 600 * 4
    assert [len(base64.b64decode(c["prompt_suffix"])) // 4 for c in calls[1:]] == [4, 4, 4, 4]
    assert [c["prompt_ref"][1] for c in calls[1:]] == [600, 604, 608, 612]
    assert orjson.dumps(expand_prompt_refs(delta)) == triplet
    assert len(batch["triplet_delta"]) < len(batch["triplet"])
