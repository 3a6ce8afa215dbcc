"""The proxy's live state: pause flag, in-flight count, known rollouts, upstream client."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from agentlightning.schemas import ProxyState
from agentlightning.server.config import ProxyConfig
from agentlightning.server.proxy.context import ContextLimits
from agentlightning.server.proxy.experts import RouteIndex
from agentlightning.server.proxy.faults import fault_injector
from agentlightning.server.proxy.token_exact import TokenExact
from agentlightning.server.proxy.upstream import UpstreamClient

KNOWN_ROLLOUTS = 65536


class ProxyRuntime:
    """One per Gateway. Touched only from the event loop, so plain fields are enough."""

    def __init__(self, config: ProxyConfig | None = None) -> None:
        self.config = config or ProxyConfig()
        self.upstream = UpstreamClient(self.config)
        self.paused = False
        self.retry_after_seconds = 5.0
        self.reason: str | None = None
        self._inflight = 0
        # Called when the count changes while paused (server/replicas.py reports the drain).
        self.on_inflight_change: Callable[[], None] | None = None
        # Rollouts seen to exist, so that an agent's every call does not read the store.
        # Bounded (least recently used are forgotten); deleting a rollout forgets it, so that
        # its next call is refused before it reaches the model.
        self._known: OrderedDict[str, None] = OrderedDict()
        self.forgotten = 0  # deletions so far: `remember` after a store read checks none came between
        self.routes = RouteIndex()  # calls still holding MoE routes (include_routed_experts)
        self.tokens = TokenExact(self.upstream)  # tokens in / tokens out, and attempts' token history
        self.context = ContextLimits(self.upstream)  # each endpoint's context, to fit max_tokens to
        self.faults = fault_injector(self.config)

    @property
    def inflight(self) -> int:
        return self._inflight

    @inflight.setter
    def inflight(self, value: int) -> None:
        self._inflight = value
        if self.paused and self.on_inflight_change is not None:
            self.on_inflight_change()

    async def open(self) -> None:
        await self.upstream.open()

    async def close(self) -> None:
        await self.upstream.close()

    def pause(self, retry_after_seconds: float, reason: str | None) -> None:
        self.paused = True
        self.retry_after_seconds = retry_after_seconds
        self.reason = reason

    def resume(self) -> None:
        self.paused = False
        self.reason = None

    def state(self) -> ProxyState:
        return ProxyState(
            paused=self.paused,
            retry_after_seconds=self.retry_after_seconds,
            reason=self.reason,
            inflight=self.inflight,
        )

    def is_known(self, rollout_id: str) -> bool:
        if rollout_id in self._known:
            self._known.move_to_end(rollout_id)
            return True
        return False

    def remember(self, rollout_id: str, forgotten_before_read: int) -> None:
        """Remember a rollout the store showed to exist, unless one was deleted since that read."""
        if self.forgotten != forgotten_before_read:
            return
        self._known[rollout_id] = None
        if len(self._known) > KNOWN_ROLLOUTS:
            self._known.popitem(last=False)

    def forget(self, rollout_id: str) -> None:
        """A deleted rollout: nothing of it is kept (its id may be created again)."""
        self.forgotten += 1
        self._known.pop(rollout_id, None)
        self.tokens.history.forget(rollout_id)

    def forget_all(self) -> None:
        self.forgotten += 1
        self._known.clear()  # the call histories stay: clearing them would split running rollouts' rows
