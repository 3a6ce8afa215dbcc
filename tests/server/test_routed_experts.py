"""MoE routing replay (R3) on the Gateway: a real `agl-server` with `include_routed_experts`
asks the fake vLLM-shaped server for routes, hides them from the agent, keeps only the last
call's per trajectory, and returns them on event reads."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentlightning.aggregation import AggregationLevel, aggregate_rollout
from agentlightning.client import GatewayClient, expand_prompt_refs
from agentlightning.schemas import Model, Rollout, RolloutCreate
from agentlightning.server.proxy.experts import RouteIndex
from agentlightning.server.store import MemoryStore, RolloutNotFound, Store
from agentlightning.server.store.sqlite import SqliteStore
from tests.conftest import RunningGateway, start_gateway
from tests.fakes.model_server import (
    FakeModelServer,
    Reply,
    chat_prompt_ids,
    encode_routes,
    routes_for,
)

KEY = "r3-key"
ON = "default_proxy.include_routed_experts=true"
USER = {"role": "user", "content": "what is two plus two"}


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeModelServer]:
    with FakeModelServer() as server:
        yield server


def _prepare(gw: RunningGateway, fake: FakeModelServer) -> None:
    fake.state.reset()
    with GatewayClient(gw.url, KEY) as c:
        c.delete_models()
        c.register_models([Model(model="policy", endpoint=fake.base_url, version=1)])
        c.resume()


@pytest.fixture(scope="module")
def gw_on(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    gateway = start_gateway(tmp_path_factory.mktemp("r3on"), KEY, ON)
    yield gateway
    gateway.process.stop()


def new_rollout(gw: RunningGateway) -> str:
    rollout_id = f"r-{uuid.uuid4().hex[:12]}"
    with GatewayClient(gw.url, KEY) as c:
        c.create_rollouts([RolloutCreate(rollout_id=rollout_id, input={"q": 1})])
    return rollout_id


def http(gw: RunningGateway) -> httpx.Client:
    return httpx.Client(base_url=gw.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=60)


def chat(gw: RunningGateway, rollout_id: str, messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    url = f"/proxy/rollout/{rollout_id}/attempt/a1/mode/train/openai/v1/chat/completions"
    with http(gw) as h:
        r = h.post(url, json={"model": "any", "messages": messages, **extra})
    assert r.status_code == 200, r.text
    return r.json()


def read(gw: RunningGateway, rollout_id: str, **params: str) -> list[dict[str, Any]]:
    with http(gw) as h:
        r = h.get(f"/api/rollouts/{rollout_id}/events", params=params)
    assert r.status_code == 200, r.text
    return [e["data"] for e in r.json() if e["event_type"] == "model_request"]


def expected_routes(answer: dict[str, Any]) -> str:
    """What vLLM would route for this call: every token of prompt + response but the last."""
    ids = answer["prompt_token_ids"] + answer["choices"][0]["token_ids"]
    return encode_routes(routes_for(ids)[:-1])


def test_routes_are_captured_hidden_superseded_and_read_back(
    gw_on: RunningGateway, fake: FakeModelServer
) -> None:
    _prepare(gw_on, fake)
    rid = new_rollout(gw_on)
    fake.state.script(Reply(content="four"), Reply(content="five"), Reply(content="six"))
    first = chat(gw_on, rid, [USER])
    assert fake.state.requests[-1]["body"]["return_routed_experts"] is True
    assert all("routed_experts" not in c for c in first["choices"]), "the agent never sees routes"
    # The next turn extends the first call's prompt + response: it supersedes the first's routes.
    turn = [USER, {"role": "assistant", "content": "four"}, {"role": "user", "content": "and three"}]
    second = chat(gw_on, rid, turn)
    assert second["prompt_token_ids"][: len(expected_ids := first["prompt_token_ids"])] == expected_ids
    # An unrelated conversation in the same attempt keeps its own routes.
    other = chat(gw_on, rid, [{"role": "user", "content": "spell cat"}])

    raw = read(gw_on, rid)
    assert len(raw) == 3
    assert "routed_experts" not in raw[0], "superseded by the next turn"
    assert raw[1]["routed_experts"] == expected_routes(second)
    assert raw[2]["routed_experts"] == expected_routes(other)
    assert all("routed_experts" not in c for e in raw for c in e["response"]["choices"])

    triplets = read(gw_on, rid, format="triplet")
    assert [t.get("routed_experts") for t in triplets] == [
        None,
        expected_routes(second),
        expected_routes(other),
    ]
    assert triplets[1]["prompt_token_ids"] == second["prompt_token_ids"]

    for off in ("false", "0"):
        assert all("routed_experts" not in e for e in read(gw_on, rid, include_routed_experts=off))
        assert all(
            "routed_experts" not in t for t in read(gw_on, rid, format="triplet", include_routed_experts=off)
        )
    with http(gw_on) as h:
        bad = h.get(f"/api/rollouts/{rid}/events", params={"include_routed_experts": "maybe"})
        assert bad.status_code == 422 and "include_routed_experts" in bad.text
        for include, want in ((True, expected_routes(second)), (False, None)):
            r = h.post(
                "/api/rollouts/batch/events",
                json={"rollout_ids": [rid], "format": "triplet", "include_routed_experts": include},
            )
            assert r.status_code == 200, r.text
            calls = [e["data"] for e in r.json()[0]["events"] if e["event_type"] == "model_request"]
            assert calls[1].get("routed_experts") == want
        bad = h.post(
            "/api/rollouts/batch/events", json={"rollout_ids": [rid], "include_routed_experts": "yes"}
        )
        assert bad.status_code == 422 and "include_routed_experts" in bad.text


def test_a_retried_prompt_supersedes_and_streams_ask_for_no_routes(
    gw_on: RunningGateway, fake: FakeModelServer
) -> None:
    _prepare(gw_on, fake)
    rid = new_rollout(gw_on)
    fake.state.script(Reply(content="one"), Reply(content="two"))
    chat(gw_on, rid, [USER])
    again = chat(gw_on, rid, [USER])  # the same prompt again: a retry
    raw = read(gw_on, rid)
    assert "routed_experts" not in raw[0]
    assert raw[1]["routed_experts"] == expected_routes(again)

    url = f"/proxy/rollout/{rid}/attempt/a1/mode/train/openai/v1/chat/completions"
    with http(gw_on) as h:
        r = h.post(url, json={"model": "any", "messages": [USER], "stream": True})
        assert r.status_code == 200
    assert "return_routed_experts" not in fake.state.requests[-1]["body"]
    # Validation calls never train: no routes asked for. A server that sends them anyway (vLLM
    # 0.32 with enable_return_routed_experts) still never shows them to the agent; none stored.
    fake.state.routes_always = True
    try:
        with http(gw_on) as h:
            r = h.post(url.replace("/mode/train/", "/mode/val/"), json={"model": "any", "messages": [USER]})
            assert r.status_code == 200
            assert all("routed_experts" not in c for c in r.json()["choices"])
            assert "return_routed_experts" not in fake.state.requests[-1]["body"]
    finally:
        fake.state.routes_always = False
    stored = [e.get("routed_experts") is not None for e in read(gw_on, rid)]
    assert stored == [False, True, False, False]  # first call superseded; stream and val: none


def test_routes_survive_a_gateway_restart_and_are_superseded_after_it(
    tmp_path: Path, fake: FakeModelServer
) -> None:
    db = tmp_path / "g.db"
    gw = start_gateway(tmp_path, KEY, ON, db_path=db)
    try:
        _prepare(gw, fake)
        rid = new_rollout(gw)
        answer = chat(gw, rid, [USER])
    finally:
        gw.process.stop()
    gw = start_gateway(tmp_path, KEY, ON, db_path=db)
    try:
        [event] = read(gw, rid, format="triplet")
        assert event["routed_experts"] == expected_routes(answer)
        # The next turn, after the restart, still supersedes the routes stored before it.
        _prepare(gw, fake)
        fake.state.script(Reply(content="four"))
        turn = [USER, {"role": "assistant", "content": answer["choices"][0]["message"]["content"]}]
        second = chat(gw, rid, [*turn, {"role": "user", "content": "and three"}])
        assert [e.get("routed_experts") for e in read(gw, rid)] == [None, expected_routes(second)]
        with GatewayClient(gw.url, KEY) as c:
            c.delete_rollout(rid)
        with http(gw) as h:
            assert h.get(f"/api/rollouts/{rid}/events").status_code == 404
    finally:
        gw.process.stop()


def test_option_off_leaves_the_upstream_body_and_the_event_as_before(
    tmp_path: Path, fake: FakeModelServer
) -> None:
    gw = start_gateway(tmp_path, KEY)
    try:
        _prepare(gw, fake)
        rid = new_rollout(gw)
        chat(gw, rid, [USER])
        body = fake.state.requests[-1]["body"]
        assert "return_routed_experts" not in body
        assert set(body) == {"model", "messages", "temperature", "return_token_ids", "logprobs"}
        [event] = read(gw, rid)
        assert event["routed_experts"] is None
        assert event["response"]["prompt_token_ids"] == chat_prompt_ids([USER])
    finally:
        gw.process.stop()


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_stores_keep_drop_and_delete_routes(kind: str, tmp_path: Path) -> None:
    store: Store = MemoryStore() if kind == "memory" else SqliteStore(tmp_path / "s.db")
    await store.open()
    try:
        await store.create_rollouts([Rollout(rollout_id="r"), Rollout(rollout_id="s")])
        await store.put_routes("r", 1, b'"one"', [])
        await store.put_routes("r", 2, b'"two"', [1])
        await store.put_routes("s", 3, b"[[1,2]]", [])
        assert await store.get_routes("r") == {2: b'"two"'}
        assert await store.get_routes("s") == {3: b"[[1,2]]"}
        with pytest.raises(RolloutNotFound):
            await store.put_routes("missing", 4, b"1", [])
        assert await store.delete_rollout("r")
        assert await store.get_routes("r") == {}
        assert await store.get_routes("s") == {3: b"[[1,2]]"}
    finally:
        await store.close()


def test_route_index_supersedes_retries_and_extensions_only() -> None:
    index = RouteIndex()
    assert index.supersede("r", "a", 1, [1, 2, 3], [4, 5]) == []
    assert index.supersede("r", "a", 2, [9, 9], [8]) == []  # another conversation
    assert index.supersede("r", "b", 3, [1, 2, 3], [4, 5]) == []  # another attempt
    assert index.supersede("r", "a", 4, [1, 2, 3, 4], [7]) == []  # diverges from call 1's response
    assert index.supersede("r", "a", 5, [1, 2, 3, 4, 5, 6], [7]) == [1]  # the next turn of call 1
    assert index.supersede("r", "a", 6, [9, 9], [3]) == [2]  # a retry of call 2
    assert index.supersede("r", "a", 7, [], []) == []  # no prompt ids: nothing to compare


@pytest.mark.parametrize("fmt", ["triplet", "triplet_delta"])
def test_routes_reach_the_training_rows_of_a_trajectory(
    gw_on: RunningGateway, fake: FakeModelServer, fmt: str
) -> None:
    """Gateway -> batch read (as the trainer's collector reads) -> trajectory rows: the row gets
    the last call's routes, which cover its prompt + response. Long prompts: stored as deltas."""
    _prepare(gw_on, fake)
    rid = new_rollout(gw_on)
    long_user = {"role": "user", "content": " ".join(f"w{i}" for i in range(700))}
    fake.state.script(Reply(content="four"), Reply(content="five"))
    chat(gw_on, rid, [long_user])
    turn = [long_user, {"role": "assistant", "content": "four"}, {"role": "user", "content": "and three"}]
    last = chat(gw_on, rid, turn)
    with GatewayClient(gw_on.url, KEY) as c:
        [answer] = c.get_events_batch([rid], format=fmt)  # type: ignore[arg-type]
    if fmt == "triplet_delta":  # the second call's prompt is sent as a reference to the first's
        assert [e["data"]["prompt_ref"] is not None for e in answer["events"]] == [False, True]
    events = expand_prompt_refs(answer["events"], lazy=True)
    [row] = aggregate_rollout(events, rid, "g", 1.0)
    assert row.n_calls == 2
    assert row.prompt_ids + row.response_ids == last["prompt_token_ids"] + last["choices"][0]["token_ids"]
    assert row.routed_experts == expected_routes(last)
    # Each call its own row (transition): the first call's routes were superseded, so its row has none.
    rows = aggregate_rollout(events, rid, "g", 1.0, level=AggregationLevel.TRANSITION)
    assert [r.routed_experts for r in rows] == [None, expected_routes(last)]
