"""The proxy's FastAPI routes alone on a memory store, without the Gateway's fast path in front:
for tests that drive the routes and read the store the Gateway's state holds."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI

from agentlightning.server.config import load_server_config
from agentlightning.server.proxy import routes
from agentlightning.server.proxy.runtime import ProxyRuntime
from agentlightning.server.state import GatewayState, ModelTable
from agentlightning.server.store.memory import MemoryStore


@asynccontextmanager
async def router_app(**proxy: Any) -> AsyncIterator[tuple[FastAPI, GatewayState]]:
    """An app serving `routes.router` and its state; `proxy`: `default_proxy` settings."""
    config = load_server_config({"store": {"url": "memory://"}, "default_proxy": proxy})
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
        yield app, state
    finally:
        await state.proxy.close()
        await store.close()
