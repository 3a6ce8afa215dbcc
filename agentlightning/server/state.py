"""What the Gateway's routes share: config, store, change signals, the model endpoint table."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fastapi import Request

from agentlightning.schemas import Model
from agentlightning.server.auth import Authenticator
from agentlightning.server.change_signal import ChangeSignal
from agentlightning.server.config import ServerConfig
from agentlightning.server.metrics import GatewayMetrics
from agentlightning.server.proxy.runtime import ProxyRuntime
from agentlightning.server.store import Store

if TYPE_CHECKING:
    from agentlightning.server.replicas import ReplicaSync


class ModelTable:
    """Registered inference endpoints, kept in memory for the proxy's hot path; the store is the record.

    A leased endpoint (`Model.expires_at`) is left out once its lease runs out: a trainer renews
    its own, so a killed trainer's endpoints go by themselves. The expiry is a time in the store,
    so every replica of a shared store drops them at the same moment."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._by_name: dict[str, dict[str, Model]] = {}
        self._sorted: dict[str, list[Model]] = {}  # endpoints() per model, rebuilt after a change
        self._next_expiry = math.inf  # the earliest lease's end

    async def load(self) -> None:
        models = await self._store.list_models()  # read first: calls meanwhile see the old table
        self._by_name.clear()
        self._remember(models)

    def _remember(self, models: list[Model]) -> None:
        self._sorted.clear()
        for m in models:
            self._by_name.setdefault(m.model, {})[m.endpoint] = m
        self._expire()

    def _expire(self) -> None:
        """Forget the endpoints whose lease ran out (in memory: the store keeps their rows until
        they are registered again or deleted, and every reload forgets them again)."""
        at = time.time()
        self._next_expiry = math.inf
        for name, by_endpoint in list(self._by_name.items()):
            for endpoint, m in list(by_endpoint.items()):
                if m.expires_at is None:
                    continue
                if m.expires_at <= at:
                    del by_endpoint[endpoint]
                    self._sorted.pop(name, None)
                else:
                    self._next_expiry = min(self._next_expiry, m.expires_at)
            if not by_endpoint:
                del self._by_name[name]

    async def upsert(self, models: list[Model]) -> list[Model]:
        stored = await self._store.upsert_models(models)
        self._remember(stored)
        return stored

    async def clear(self) -> None:
        await self._store.delete_models()
        self._by_name.clear()
        self._sorted.clear()

    def all(self) -> list[Model]:
        if time.time() >= self._next_expiry:
            self._expire()
        return [m for name in sorted(self._by_name) for _, m in sorted(self._by_name[name].items())]

    def endpoints(self, model: str) -> list[Model]:
        """The endpoints serving `model`, sorted by URL (the order sticky routing hashes over).

        Read on every proxied call, so kept sorted until the table changes. Do not modify it.
        """
        if time.time() >= self._next_expiry:
            self._expire()
        cached = self._sorted.get(model)
        if cached is None:
            cached = self._sorted[model] = [m for _, m in sorted(self._by_name.get(model, {}).items())]
        return cached


@dataclass
class GatewayState:
    config: ServerConfig
    store: Store
    models: ModelTable
    rollout_changes: ChangeSignal = field(default_factory=ChangeSignal)
    terminal_changes: ChangeSignal = field(default_factory=ChangeSignal)
    proxy: ProxyRuntime = field(default_factory=ProxyRuntime)
    # The dashboard's and Prometheus' views (server/metrics.py; None when metrics.enabled=false).
    metrics: GatewayMetrics | None = None
    auth: Authenticator = field(default_factory=lambda: Authenticator(""))
    # Set when the store is shared by several replicas (server/replicas.py).
    replicas: ReplicaSync | None = None

    def end_long_polls(self) -> None:
        """Shutdown has begun: every long-poll answers with what it has."""
        self.rollout_changes.close()
        self.terminal_changes.close()


def get_state(request: Request) -> GatewayState:
    state: GatewayState = request.app.state.gateway
    return state


async def state_dependency(request: Request) -> GatewayState:
    """`Depends(state_dependency)`: async, because FastAPI runs a plain-def dependency in a
    thread pool, a hop on every request."""
    return get_state(request)
