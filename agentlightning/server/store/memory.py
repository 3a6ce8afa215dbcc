"""In-memory store: for tests and throwaway runs. Everything is lost when the process ends.

Deleted rollouts' memory goes back to the system: each event payload is one malloc'd bytes
object, and glibc keeps the heap pages of freed ones (only its heap's top is given back), so
a Gateway that creates and deletes rollouts for days grew by about a round's payloads per round
although nothing was referenced any more (tracemalloc: flat; `malloc_trim(0)`: RSS back to
its start). After every `TRIM_AFTER_BYTES` of deleted payloads the store calls `malloc_trim`,
in a worker thread, off the event loop.
"""

from __future__ import annotations

import asyncio
import bisect
import ctypes
import ctypes.util
from collections import deque
from collections.abc import Callable, Collection
from typing import Any

from agentlightning.schemas import (
    AttemptOutcome,
    MetricPoint,
    Model,
    Rollout,
    RolloutState,
    RolloutStatusPatch,
    RunSummary,
    TerminalItem,
    TerminalPage,
)
from agentlightning.server.store.base import (
    MAX_STATUS_CHANGES,
    AttemptStats,
    EventRecord,
    Outcome,
    RolloutNotFound,
    Store,
    StoredEvent,
    apply_patch,
    group_id_of,
    status_change,
    stronger,
)
from agentlightning.server.store.delta import CallDraft, CallIndex, View, materialize
from agentlightning.server.store.runs import RunMetricsTable

TRIM_AFTER_BYTES = 16 * 1024 * 1024
FINISH_TIMES = 100_000  # the latest completion times kept, for count_finished_since


def _find_malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim, or None where the C library has none (musl, macOS)."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


_malloc_trim = _find_malloc_trim()


class MemoryStore(Store):
    def __init__(self) -> None:
        self._rollouts: dict[str, Rollout] = {}  # insertion order is creation order
        self._events: dict[str, list[StoredEvent]] = {}
        self._sequence = 0
        # completion order: sorted cursor values, and cursor -> rollout id (deleted ids removed)
        self._terminal_seqs: list[int] = []
        self._terminal_ids: dict[int, str] = {}
        self._terminal_seq_of: dict[str, int] = {}
        self._models: dict[tuple[str, str], Model] = {}
        self._calls = CallIndex()
        self._routes: dict[str, dict[int, bytes]] = {}  # rollout -> event sequence -> routes JSON
        self._history: dict[str, list[dict[str, Any]]] = {}
        self._outcomes: dict[str, dict[str, Outcome]] = {}  # rollout -> attempt -> outcome
        self._finish_times: deque[float] = deque(maxlen=FINISH_TIMES)
        self._runs = RunMetricsTable()
        self._freed_bytes = 0  # payload bytes deleted since the last malloc_trim
        self._trimming: asyncio.Future[int] | None = None
        self.trims = 0

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        if self._trimming is not None:
            await self._trimming

    async def create_rollouts(self, rollouts: list[Rollout]) -> list[Rollout]:
        out = []
        for rollout in rollouts:
            stored = self._rollouts.setdefault(rollout.rollout_id, rollout)
            if stored is rollout:
                self._events[rollout.rollout_id] = []
                self._history[rollout.rollout_id] = [status_change(rollout)]
            out.append(stored)
        return out

    async def get_rollout(self, rollout_id: str) -> Rollout | None:
        return self._rollouts.get(rollout_id)

    async def list_rollouts(self, states: Collection[RolloutState] | None, limit: int) -> list[Rollout]:
        out: list[Rollout] = []
        for rollout in self._rollouts.values():
            if states is None or rollout.status.state in states:
                out.append(rollout)
                if len(out) >= limit:
                    break
        return out

    async def patch_rollout(self, rollout_id: str, patch: RolloutStatusPatch, now: float) -> Rollout:
        current = self._rollouts.get(rollout_id)
        if current is None:
            raise RolloutNotFound(rollout_id)
        updated = apply_patch(current, patch, now)
        self._rollouts[rollout_id] = updated
        history = self._history[rollout_id]
        if len(history) < MAX_STATUS_CHANGES:
            history.append(status_change(updated))
        if updated.status.state.is_terminal and not current.status.state.is_terminal:
            self._mark_terminal(rollout_id)
            self._finish_times.append(updated.status.updated_at)
        return updated

    def _mark_terminal(self, rollout_id: str) -> None:
        seq = self._terminal_seqs[-1] + 1 if self._terminal_seqs else 1
        self._terminal_seqs.append(seq)
        self._terminal_ids[seq] = rollout_id
        self._terminal_seq_of[rollout_id] = seq

    async def delete_rollout(self, rollout_id: str) -> bool:
        self._calls.forget(rollout_id)
        if self._rollouts.pop(rollout_id, None) is None:
            return False
        events = self._events.pop(rollout_id, None) or ()
        self._routes.pop(rollout_id, None)
        self._history.pop(rollout_id, None)
        self._outcomes.pop(rollout_id, None)
        self._freed_bytes += sum(len(e.record.data) + len(e.record.triplet or b"") for e in events)
        if self._freed_bytes >= TRIM_AFTER_BYTES:
            self._give_back_memory()
        seq = self._terminal_seq_of.pop(rollout_id, None)
        if seq is not None:
            del self._terminal_ids[seq]
            if len(self._terminal_ids) * 2 < len(self._terminal_seqs):
                # compact, but keep the last cursor so that new ones keep increasing
                last = self._terminal_seqs[-1]
                self._terminal_seqs = [s for s in self._terminal_seqs if s in self._terminal_ids or s == last]
        return True

    def _give_back_memory(self) -> None:
        if _malloc_trim is None or (self._trimming is not None and not self._trimming.done()):
            return  # one at a time; when it ends, it looks again at what was freed meanwhile
        self._freed_bytes = 0
        self.trims += 1
        self._trimming = asyncio.get_running_loop().run_in_executor(None, _malloc_trim, 0)
        self._trimming.add_done_callback(self._trimmed)

    def _trimmed(self, _: asyncio.Future[int]) -> None:
        if self._freed_bytes >= TRIM_AFTER_BYTES:
            self._give_back_memory()

    async def list_terminal(self, after: int, limit: int) -> TerminalPage:
        items: list[TerminalItem] = []
        next_after = after
        start = bisect.bisect_right(self._terminal_seqs, after)
        for seq in self._terminal_seqs[start:]:
            rollout_id = self._terminal_ids.get(seq)
            if rollout_id is None:
                continue
            if len(items) >= limit:
                break
            rollout = self._rollouts[rollout_id]
            items.append(
                TerminalItem(
                    rollout_id=rollout_id,
                    state=rollout.status.state,
                    data_id=group_id_of(rollout),
                    is_train=rollout.is_train,
                )
            )
            next_after = seq
        return TerminalPage(items=items, next_after=next_after, total_terminal=len(self._terminal_ids))

    async def append_event(self, record: EventRecord) -> int:
        events = self._events.get(record.rollout_id)
        if events is None:
            raise RolloutNotFound(record.rollout_id)
        pending = None
        if isinstance(record.call, CallDraft):
            record, pending = self._calls.encode(record, record.call)
        self._sequence += 1
        events.append(StoredEvent(self._sequence, record))
        if pending is not None:
            self._calls.remember(pending, self._sequence)
        return self._sequence

    async def list_events(
        self,
        rollout_id: str,
        attempt_id: str | None = None,
        event_type: str | None = None,
        view: View = "data",
    ) -> list[StoredEvent]:
        events = [
            e
            for e in self._events.get(rollout_id, ())
            if (attempt_id is None or e.record.attempt_id == attempt_id)
            and (event_type is None or e.record.event_type == event_type)
            and (view == "data" or e.record.triplet is not None)
        ]
        return materialize(events, view)

    async def put_routes(self, rollout_id: str, sequence: int, routes: bytes, drop: list[int]) -> None:
        if rollout_id not in self._events:
            raise RolloutNotFound(rollout_id)
        held = self._routes.setdefault(rollout_id, {})
        for seq in drop:
            held.pop(seq, None)
        held[sequence] = routes

    async def get_routes(self, rollout_id: str) -> dict[int, bytes]:
        return dict(self._routes.get(rollout_id, {}))

    async def list_attempts(self, rollout_id: str) -> list[AttemptStats]:
        stats: dict[str, AttemptStats] = {}
        for e in self._events.get(rollout_id, ()):
            r = e.record
            s = stats.get(r.attempt_id)
            if s is None:
                stats[r.attempt_id] = AttemptStats(r.attempt_id, 1, r.timestamp, r.timestamp)
            else:
                stats[r.attempt_id] = AttemptStats(
                    r.attempt_id, s.n_events + 1, s.first_event_at, max(s.last_event_at, r.timestamp)
                )
        return list(stats.values())  # dict order is first-event order

    async def record_outcome(
        self, rollout_id: str, attempt_id: str, outcome: AttemptOutcome, detail: str | None, now: float
    ) -> Outcome:
        if rollout_id not in self._rollouts:
            raise RolloutNotFound(rollout_id)
        attempts = self._outcomes.setdefault(rollout_id, {})
        held = attempts[attempt_id] = stronger(attempts.get(attempt_id), outcome, detail)
        return held

    async def list_outcomes(self, rollout_ids: Collection[str]) -> dict[tuple[str, str], Outcome]:
        return {
            (rollout_id, attempt_id): held
            for rollout_id in rollout_ids
            for attempt_id, held in self._outcomes.get(rollout_id, {}).items()
        }

    async def upsert_models(self, models: list[Model]) -> list[Model]:
        for m in models:
            self._models[(m.model, m.endpoint)] = m
        return models

    async def list_models(self) -> list[Model]:
        return list(self._models.values())

    async def delete_models(self) -> None:
        self._models.clear()

    async def status_history(self, rollout_id: str) -> list[dict[str, Any]]:
        return list(self._history.get(rollout_id, ()))

    async def count_finished_since(self, since: float) -> int:
        return sum(1 for at in self._finish_times if at >= since)

    async def add_run_points(self, run_id: str, points: list[MetricPoint]) -> int:
        return self._runs.add(run_id, points)

    async def list_runs(self) -> list[RunSummary]:
        return self._runs.runs()

    async def run_points(self, run_id: str, after_step: int = -1) -> list[MetricPoint] | None:
        return self._runs.points(run_id, after_step)
