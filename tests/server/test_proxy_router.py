"""The proxy's FastAPI routes work on their own, without the Gateway's fast path in front."""

from __future__ import annotations

import httpx

from agentlightning.schemas import Model, Rollout
from tests.fakes.model_server import FakeModelServer, Reply

from .router_app import router_app


async def test_router_alone_proxies_records_and_pauses() -> None:
    async with router_app() as (app, state):
        store = state.store
        with FakeModelServer() as fake:
            fake.script(Reply(content="routed"))
            await store.create_rollouts([Rollout(rollout_id="r1")])
            await state.models.upsert([Model(model="policy", endpoint=fake.base_url)])
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
                url = "/proxy/rollout/r1/attempt/a1/mode/train/openai/v1"
                r = await client.post(
                    f"{url}/chat/completions", json={"messages": [{"role": "user", "content": "x"}]}
                )
                assert r.json()["choices"][0]["message"]["content"] == "routed"
                (event,) = await store.list_events("r1")
                assert event.record.event_type == "model_request"
                assert (await client.post("/proxy/pause", json={"retry_after_seconds": 1})).json()[
                    "paused"
                ] is True
                assert (await client.post(f"{url}/completions", json={"prompt": "x"})).status_code == 429
                assert (await client.get("/proxy/state")).json() == {
                    "paused": True,
                    "retry_after_seconds": 1.0,
                    "reason": None,
                    "inflight": 0,
                }
                assert (await client.post("/proxy/resume")).json()["paused"] is False
