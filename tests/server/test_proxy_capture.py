"""Recording a call: the keys written are the ones `ModelCall` and `CallTriplet` declare, a call
whose content JSON cannot carry still leaves an event, and a record is freed as its call ends."""

from __future__ import annotations

import gc
from typing import Any

import httpx
import orjson

from agentlightning.model_call import CallTriplet, ModelCall
from agentlightning.schemas import Model, Rollout
from agentlightning.server.proxy.capture import CallRecord
from agentlightning.server.store import MemoryStore
from tests.fakes.model_server import FakeModelServer

from .router_app import router_app


async def test_unencodable_response_is_recorded_as_an_error_event() -> None:
    store = MemoryStore()
    await store.create_rollouts([Rollout(rollout_id="r")])
    record = CallRecord("r", "a", 1.0, "chat.completions", "train", {"messages": []}, {"model": "m"}, False)
    record.finish(
        http_status=200,
        latency_ms=5.0,
        model=Model(model="m", endpoint="http://x/v1", version=2),
        tries=1,
        response={"choices": [{"token_ids": [1], "weird": 2**70}]},
    )
    await record.save(store)
    [event] = await store.list_events("r")
    data = orjson.loads(event.record.data)
    assert data["status"] == "error" and "64-bit" in data["error"]
    assert data["response"] is None and data["server"]["version"] == 2 and data["http_status"] == 200


def _declared(typed_dict: Any) -> frozenset[str]:
    keys: frozenset[str] = typed_dict.__required_keys__ | typed_dict.__optional_keys__
    return keys


async def test_a_recorded_call_has_the_keys_its_types_declare() -> None:
    store = MemoryStore()
    await store.create_rollouts([Rollout(rollout_id="r")])
    record = CallRecord("r", "a", 1.0, "chat.completions", "train", {"messages": []}, {"model": "m"}, False)
    answer = {"prompt_token_ids": [1, 2], "choices": [{"token_ids": [3]}], "usage": {}}
    record.finish(
        http_status=200,
        latency_ms=5.0,
        model=Model(model="m", endpoint="http://x/v1", version=2),
        tries=2,
        response=answer,
    )
    await record.save(store)
    [event] = await store.list_events("r")
    [view] = await store.list_events("r", view="triplet")
    only_some_calls = {"segment", "chat_request", "api_response"}
    assert set(orjson.loads(event.record.data)) == _declared(ModelCall) - only_some_calls
    assert view.record.triplet is not None
    assert set(orjson.loads(view.record.triplet)) == _declared(CallTriplet) - {"error", "routed_experts"}


async def test_a_proxied_call_leaves_no_reference_cycle() -> None:
    """A passed-through call's record (holding both bodies) is freed when the call ends, not left
    to Python's cyclic collector: under load those collections cost a fifth of the Gateway's CPU."""
    enabled = gc.isenabled()
    async with router_app(token_exact=False) as (app, state):
        try:
            with FakeModelServer() as fake:
                await state.store.create_rollouts([Rollout(rollout_id="r1")])
                await state.models.upsert([Model(model="policy", endpoint=fake.base_url)])
                transport = httpx.ASGITransport(app=app)
                async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
                    url = "/proxy/rollout/r1/attempt/a1/mode/train/openai/v1/chat/completions"
                    body = {"messages": [{"role": "user", "content": "x"}]}
                    assert (await client.post(url, json=body)).status_code == 200  # connections opened
                    gc.collect()
                    gc.disable()
                    gc.set_debug(gc.DEBUG_SAVEALL)  # what a collection finds is kept in gc.garbage
                    assert (await client.post(url, json=body)).status_code == 200
                    gc.collect()
                    cyclic = [o for o in gc.garbage if isinstance(o, CallRecord)]
                assert len(await state.store.list_events("r1")) == 2
                assert cyclic == []
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
            if enabled:
                gc.enable()
