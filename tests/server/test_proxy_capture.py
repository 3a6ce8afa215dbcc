"""Recording a call whose content JSON cannot carry still leaves an event."""

from __future__ import annotations

import orjson

from agentlightning.schemas import Model, Rollout
from agentlightning.server.proxy.capture import CallRecord
from agentlightning.server.store import MemoryStore


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
