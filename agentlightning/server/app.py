"""The API Gateway application: `create_app(config)`."""

from __future__ import annotations

import gc
import inspect
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import APIRouter, FastAPI
from omegaconf import DictConfig

from agentlightning import __version__
from agentlightning.log import get_logger
from agentlightning.server.auth import Authenticator, AuthMiddleware, LiveTokens
from agentlightning.server.body_limit import BodyLimitMiddleware
from agentlightning.server.config import ServerConfig, load_server_config
from agentlightning.server.errors import StoreUnavailableMiddleware, install_error_handlers
from agentlightning.server.metrics import GatewayMetrics
from agentlightning.server.proxy import routes as proxy
from agentlightning.server.proxy.asgi import ProxyFastPath
from agentlightning.server.proxy.runtime import ProxyRuntime
from agentlightning.server.routes import dashboard, events, health, metrics, models, rollouts, runs, tokens
from agentlightning.server.state import GatewayState, ModelTable
from agentlightning.server.store import Store, store_from_url
from agentlightning.server.store.timed import instrument_store
from agentlightning.server.ui import mount_ui

log = get_logger("gateway")

# FastAPI >= 0.160 looks up OpenTelemetry providers on every request (7% of the proxy's CPU
# per call, profiled); the Gateway exports none, so that is switched off where it exists.
_NO_TELEMETRY: dict[str, Any] = (
    {"telemetry": {"tracing": False, "metrics": False, "logs": False}}
    if "telemetry" in inspect.signature(FastAPI.__init__).parameters
    else {}
)

# Python's cyclic GC, at its default thresholds, took a third of the Gateway's CPU with a
# thousand proxied calls in flight (bench/proxy.py, 1024 in flight: 0.49 -> 0.32 ms per call):
# every call allocates many short-lived containers, and each collection walks all live ones.
# Collect less often, and never walk the objects that exist once the app has started.
GC_THRESHOLDS = (50_000, 20, 20)

ROUTERS: list[APIRouter] = [
    health.router,
    rollouts.router,
    events.router,
    models.router,
    tokens.router,
    proxy.router,
]
ROUTERS += [metrics.router, runs.router, dashboard.router]


def create_app(
    config: ServerConfig | DictConfig | dict[str, Any] | None = None, store: Store | None = None
) -> FastAPI:
    """The Gateway as an ASGI app. The store opens when the app starts and closes when it stops."""
    if not isinstance(config, ServerConfig):
        config = load_server_config(config)
    if store is None:
        store = store_from_url(
            config.store.url,
            config.store.synchronous,
            config.store.read_threads,
            config.store.wal_max_bytes,
            config.store.pool_size,
        )
    gateway_metrics = GatewayMetrics() if config.metrics.enabled else None
    if gateway_metrics is not None:
        store = instrument_store(store, gateway_metrics)
    state = GatewayState(
        config=config,
        store=store,
        models=ModelTable(store),
        proxy=ProxyRuntime(config.proxy),
        metrics=gateway_metrics,
        auth=Authenticator(config.key, config.controller_key, config.token_secret),
    )
    live_tokens = LiveTokens()  # agent tokens found live; other replicas' changes forget them
    if gateway_metrics is not None:
        proxy_runtime = state.proxy
        gateway_metrics.proxy_state = lambda: (proxy_runtime.inflight, proxy_runtime.paused)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await store.open()
        await state.models.load()
        await state.proxy.open()
        if store.shared:  # replicas on one database: caches, long-polls and pause made coherent
            from agentlightning.server.replicas import ReplicaSync

            state.replicas = ReplicaSync(state, store, live_tokens)  # type: ignore[arg-type]  # a PostgresStore (checked above)
            await state.replicas.start()
        gc_before = gc.get_threshold()
        gc.collect()
        gc.freeze()
        gc.set_threshold(*GC_THRESHOLDS)
        if not config.key:
            log.warning(
                "auth_disabled", hint="set key=... so that only holders of the key can use the Gateway"
            )
        log.info("gateway_ready", store=config.store.url, model=config.default_proxy.model_name)
        try:
            yield
        finally:
            gc.set_threshold(*gc_before)
            gc.unfreeze()
            if state.replicas is not None:
                await state.replicas.stop()
            await state.proxy.close()
            await store.close()

    app = FastAPI(
        title="Agent Lightning API Gateway", version=__version__, lifespan=lifespan, **_NO_TELEMETRY
    )
    app.state.gateway = state
    install_error_handlers(app)
    for router in ROUTERS:
        app.include_router(router)
    mount_ui(app)
    # Last added runs first: auth rejects strangers before any body is read; the proxy's hot
    # path runs after both.
    app.add_middleware(ProxyFastPath, state=state)
    app.add_middleware(BodyLimitMiddleware, max_bytes=config.max_body_bytes)
    app.add_middleware(AuthMiddleware, auth=state.auth, load_rollout=store.get_rollout, live=live_tokens)
    app.add_middleware(StoreUnavailableMiddleware)
    return app
