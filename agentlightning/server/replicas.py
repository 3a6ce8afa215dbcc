"""Several Gateway replicas on one shared store (Postgres) acting as one Gateway.

What one process keeps in memory is made coherent through the store's change feed (NOTIFY,
delivered after the change committed):

* long-polls (`wait_seconds`) wake on rollouts created, patched or deleted through any replica;
* agent-token checks (auth.LiveTokens), the proxy's known-rollout cache, the MoE route index
  and the model table forget what another replica changed;
* pause/drain is global: the pause state is a row every replica applies, and each replica
  reports its in-flight calls in its own row. A pause answers once every live replica applied
  it (so no call can start anywhere after the answer), with the in-flight calls of all of them;
  `GET /proxy/state` adds them up too. A replica that stops reporting (killed) stops counting
  after LIVE_WITHIN_S.

When the feed is lost (the database restarted), everything cached is dropped and every
long-poll re-reads once it is back: changes missed meanwhile cannot leave a stale cache.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from agentlightning.log import get_logger
from agentlightning.schemas import ProxyState

if TYPE_CHECKING:
    from agentlightning.server.auth import LiveTokens
    from agentlightning.server.state import GatewayState
    from agentlightning.server.store.postgres import PostgresStore

log = get_logger("replicas")
HEARTBEAT_S = 1.0  # each replica writes its row at least this often
LIVE_WITHIN_S = 5.0  # a replica whose row is older is taken as gone
ACK_TIMEOUT_S = 5.0  # the longest a pause waits for the other replicas to apply it
ACK_POLL_S = 0.02


class ReplicaSync:
    def __init__(self, state: GatewayState, store: PostgresStore, live_tokens: LiveTokens) -> None:
        self.state = state
        self.store = store
        self.live_tokens = live_tokens
        self.epoch = -1  # the pause state's epoch applied here
        self._dirty = asyncio.Event()
        self._reporter: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()

    @property
    def replica_id(self) -> str:
        return self.store.replica_id

    async def start(self) -> None:
        self._apply(*await self.store.get_pause())
        self.store.watch(self._on_change)
        self.state.proxy.on_inflight_change = self._dirty.set
        await self.store.report_replica(self.state.proxy.inflight, self.epoch)
        self._reporter = asyncio.create_task(self._report_loop(), name="agl-replica-report")
        log.info("replica_joined", replica_id=self.replica_id, paused=self.state.proxy.paused)

    async def stop(self) -> None:
        self.state.proxy.on_inflight_change = None
        for task in [self._reporter, *self._tasks]:
            if task is not None:
                task.cancel()
        await asyncio.gather(
            *(t for t in [self._reporter, *self._tasks] if t is not None), return_exceptions=True
        )
        try:
            await self.store.remove_replica()
        except Exception as exc:  # the database is gone: the row ages out
            log.warning("replica_leave_failed", error=str(exc))

    # --- the change feed ------------------------------------------------------------------

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _on_change(self, kind: str, subject: str) -> None:
        state = self.state
        if kind in ("patch", "terminal", "delete"):
            self.live_tokens.forget(subject)
        if kind == "delete":
            state.proxy.forget(subject)
            state.proxy.routes.forget(subject)
        if kind == "routes":
            state.proxy.routes.forget(subject)
        if kind in ("rollouts", "patch", "terminal", "delete"):
            state.rollout_changes.notify()
        if kind == "terminal":
            state.terminal_changes.notify()
        if kind == "models":
            self._spawn(self._reload_models())
        if kind == "proxy":
            self._spawn(self._refresh_pause())
        if kind == "resync":
            from agentlightning.server.auth import ALL

            self.live_tokens.forget(ALL)
            state.proxy.forget_all()
            state.proxy.routes.clear()
            state.rollout_changes.notify()
            state.terminal_changes.notify()
            self._spawn(self._reload_models())
            self._spawn(self._refresh_pause())

    async def _reload_models(self) -> None:
        try:
            await self.state.models.load()
        except Exception as exc:
            log.warning("model_table_reload_failed", error=str(exc))

    async def _refresh_pause(self) -> None:
        try:
            self._apply(*await self.store.get_pause())
        except Exception as exc:
            log.warning("pause_state_read_failed", error=str(exc))

    def _apply(self, paused: bool, retry_after_seconds: float, reason: str | None, epoch: int) -> None:
        if epoch <= self.epoch:  # an older read answered late
            return
        runtime = self.state.proxy
        if paused:
            runtime.pause(retry_after_seconds, reason)
        else:
            runtime.resume()
        self.epoch = epoch
        self._dirty.set()  # acknowledge: report the epoch and the in-flight count now

    # --- in-flight counts ---------------------------------------------------------------

    async def _report_loop(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self._dirty.wait(), HEARTBEAT_S)
            except TimeoutError:
                pass
            self._dirty.clear()
            try:
                await self.store.report_replica(self.state.proxy.inflight, self.epoch)
            except Exception as exc:
                log.warning("replica_report_failed", error=str(exc))
                await asyncio.sleep(HEARTBEAT_S)

    async def _inflight_everywhere(self) -> int:
        rows = await self.store.live_replicas(LIVE_WITHIN_S)
        others = sum(inflight for rid, inflight, _ in rows if rid != self.replica_id)
        return others + self.state.proxy.inflight

    # --- the pause routes ---------------------------------------------------------------

    async def pause(self, retry_after_seconds: float, reason: str | None) -> ProxyState:
        epoch = await self.store.set_pause(True, retry_after_seconds, reason)
        self._apply(True, retry_after_seconds, reason, epoch)
        await self.store.report_replica(self.state.proxy.inflight, self.epoch)
        deadline = time.monotonic() + ACK_TIMEOUT_S
        while True:
            rows = await self.store.live_replicas(LIVE_WITHIN_S)
            behind = [rid for rid, _, seen in rows if seen < epoch]
            if not behind:
                break
            if time.monotonic() > deadline:
                log.warning("pause_not_acknowledged", replicas=behind, epoch=epoch)
                break
            await asyncio.sleep(ACK_POLL_S)
        return await self.proxy_state()

    async def resume(self) -> ProxyState:
        runtime = self.state.proxy
        epoch = await self.store.set_pause(False, runtime.retry_after_seconds, None)
        self._apply(False, runtime.retry_after_seconds, None, epoch)
        return await self.proxy_state()

    async def proxy_state(self) -> ProxyState:
        state = self.state.proxy.state()
        return state.model_copy(update={"inflight": await self._inflight_everywhere()})
