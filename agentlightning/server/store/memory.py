"""In-memory store: for tests and throwaway runs. Everything is lost when the process ends."""

from __future__ import annotations

import bisect
from collections.abc import Collection

from agentlightning.schemas import (
    Model,
    Rollout,
    RolloutState,
    RolloutStatusPatch,
    TerminalItem,
    TerminalPage,
)
from agentlightning.server.store.base import (
    AttemptStats,
    EventRecord,
    RolloutNotFound,
    Store,
    StoredEvent,
    apply_patch,
    group_id_of,
)
from agentlightning.server.store.delta import CallDraft, CallIndex, View, materialize


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

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def create_rollouts(self, rollouts: list[Rollout]) -> list[Rollout]:
        out = []
        for rollout in rollouts:
            stored = self._rollouts.setdefault(rollout.rollout_id, rollout)
            if stored is rollout:
                self._events[rollout.rollout_id] = []
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
        if updated.status.state.is_terminal and not current.status.state.is_terminal:
            self._mark_terminal(rollout_id)
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
        self._events.pop(rollout_id, None)
        seq = self._terminal_seq_of.pop(rollout_id, None)
        if seq is not None:
            del self._terminal_ids[seq]
            if len(self._terminal_ids) * 2 < len(self._terminal_seqs):
                # compact, but keep the last cursor so that new ones keep increasing
                last = self._terminal_seqs[-1]
                self._terminal_seqs = [s for s in self._terminal_seqs if s in self._terminal_ids or s == last]
        return True

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

    async def upsert_models(self, models: list[Model]) -> list[Model]:
        for m in models:
            self._models[(m.model, m.endpoint)] = m
        return models

    async def list_models(self) -> list[Model]:
        return list(self._models.values())

    async def delete_models(self) -> None:
        self._models.clear()
