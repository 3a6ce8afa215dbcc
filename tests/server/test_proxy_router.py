"""The proxy's FastAPI routes work on their own, without the Gateway's fast path in front."""

from __future__ import annotations

import httpx
from fastapi import FastAPI

from agentlightning.schemas import Model, Rollout
from agentlightning.server.config import load_server_config
from agentlightning.server.proxy import routes
from agentlightning.server.proxy.runtime import ProxyRuntime
from agentlightning.server.state import GatewayState, ModelTable
from agentlightning.server.store.memory import MemoryStore
from tests.fakes.model_server import FakeModelServer, Reply


async def test_router_alone_proxies_records_and_pauses() -> None:
    config = load_server_config({"store": {"url": "memory://"}})
    store = MemoryStore()
    await store.open()
    state = GatewayState(
        config=config, store=store, models=ModelTable(store), proxy=ProxyRuntime(config.proxy)
    )
    app = FastAPI()
    app.include_router(routes.router)
    app.state.gateway = state
    await state.proxy.open()
    try:
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
    finally:
        await state.proxy.close()
        await store.close()
