"""The Gateway's storage interface. Implementations: SQLite (default, durable), memory, Postgres.

Event payloads are stored as JSON bytes, serialized once when appended, together with their
precomputed triplet view, so reads never re-encode the payload.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any, Literal

from agentlightning.schemas import (
    AttemptOutcome,
    MetricPoint,
    Model,
    Rollout,
    RolloutState,
    RolloutStatusPatch,
    RunSummary,
    TerminalPage,
    check_transition,
)

MAX_STATUS_CHANGES = 50  # of one rollout's status changes, the first ones are kept for the dashboard
MAX_RUNS = 64  # training runs whose metrics are kept (the least recently updated go first)
MAX_POINTS_PER_RUN = 100_000  # steps kept per run (the oldest go first)
RUN_KEYS_FROM = 50  # a run's metric names: those of its last steps


class RolloutNotFound(KeyError):
    def __init__(self, rollout_id: str) -> None:
        super().__init__(rollout_id)
        self.rollout_id = rollout_id

    def __str__(self) -> str:
        return f"rollout {self.rollout_id!r} does not exist"


class StoreUnavailable(RuntimeError):
    """The store cannot be reached for now (a shared database restarting): answered 503 with
    Retry-After, so that clients retry."""

    retry_after_seconds = 2


@dataclass(frozen=True, slots=True)
class EventRecord:
    """An event ready for storage: payload already serialized."""

    rollout_id: str
    attempt_id: str
    event_type: str
    timestamp: float
    data: bytes  # JSON of the event's data
    triplet: bytes | None = None  # JSON of its training view, None if triplets omit it
    prompt_key: str | None = None  # identifies the prompt for triplet de-duplication
    # A model call stored as a delta (store/delta.py): on append its `CallDraft`, in a store the
    # encoded delta, with `data`/`triplet` holding the rest; None for events stored whole.
    call: Any = None


@dataclass(frozen=True, slots=True)
class StoredEvent:
    sequence: int
    record: EventRecord


Outcome = tuple[AttemptOutcome, str | None]  # an attempt's outcome and what showed it


def stronger(current: Outcome | None, outcome: AttemptOutcome, detail: str | None) -> Outcome:
    """What an attempt holds after evidence `outcome`: it, unless what it held is as strong."""
    if current is not None and current[0].rank >= outcome.rank:
        return current
    return outcome, detail


@dataclass(frozen=True, slots=True)
class AttemptStats:
    attempt_id: str
    n_events: int
    first_event_at: float
    last_event_at: float


def group_id_of(rollout: Rollout) -> str:
    """The terminal cursor's `data_id`: metadata.data_id (ours), else input.data_id or
    input.instance_id (v1.0's), else "" (as v1.0)."""
    if rollout.metadata.data_id:
        return rollout.metadata.data_id
    if isinstance(rollout.input, dict):
        return str(rollout.input.get("data_id") or rollout.input.get("instance_id") or "")
    return ""


def status_change(rollout: Rollout) -> dict[str, Any]:
    """One entry of a rollout's status history (`Store.status_history`)."""
    s = rollout.status
    return {
        "state": s.state.value,
        "version": s.version,
        "at": s.updated_at,
        "attempt_id": s.last_attempt_id,
        "error_message": s.error_message,
    }


def status_row(rollout: Rollout) -> tuple[Any, ...]:
    """A status change as the SQL stores' `status_changes` row: (rollout_id, version, state, at,
    attempt_id, error_message)."""
    s = rollout.status
    return (rollout.rollout_id, s.version, s.state.value, s.updated_at, s.last_attempt_id, s.error_message)


def apply_patch(rollout: Rollout, patch: RolloutStatusPatch, now: float) -> Rollout:
    """The patched copy of a rollout, version + 1. Raises IllegalTransition."""
    status = rollout.status
    changes = patch.model_dump(exclude_unset=True)
    if changes.get("state") is None:  # `"state": null` means "no state change", as if absent
        changes.pop("state", None)
    target = changes.get("state")
    if target is not None:
        check_transition(status.state, RolloutState(target))
    elif status.state.is_terminal:
        # Terminal means final: no field of it changes any more.
        check_transition(status.state, status.state)
    new_status = status.model_copy(update={**changes, "version": status.version + 1, "updated_at": now})
    return rollout.model_copy(update={"status": new_status})


class Store(abc.ABC):
    """Async storage of rollouts, events and model endpoints. Safe for one event loop."""

    # True when other processes write to the same store (Postgres replicas): then the Gateway
    # keeps its caches coherent through `watch` (server/replicas.py).
    shared = False

    def watch(self, on_change: Callable[[str, str], None]) -> None:  # noqa: B027 - optional
        """Call `on_change(kind, subject)` for changes other processes made (shared stores only)."""

    @abc.abstractmethod
    async def open(self) -> None: ...

    @abc.abstractmethod
    async def close(self) -> None: ...

    # rollouts
    @abc.abstractmethod
    async def create_rollouts(self, rollouts: list[Rollout]) -> list[Rollout]:
        """Insert each; an id that exists already returns the stored rollout unchanged."""

    @abc.abstractmethod
    async def get_rollout(self, rollout_id: str) -> Rollout | None: ...

    @abc.abstractmethod
    async def list_rollouts(self, states: Collection[RolloutState] | None, limit: int) -> list[Rollout]:
        """In creation order; all states when `states` is None."""

    @abc.abstractmethod
    async def patch_rollout(self, rollout_id: str, patch: RolloutStatusPatch, now: float) -> Rollout:
        """Atomic read-check-write. Raises RolloutNotFound or IllegalTransition."""

    @abc.abstractmethod
    async def delete_rollout(self, rollout_id: str) -> bool:
        """Remove a rollout and its events; False when it did not exist."""

    @abc.abstractmethod
    async def list_terminal(self, after: int, limit: int) -> TerminalPage:
        """Terminal rollouts in completion order, after the cursor `after`."""

    async def page_rollouts(
        self,
        states: Collection[RolloutState] | None,
        is_train: bool | None,
        search: str,
        offset: int,
        limit: int,
    ) -> tuple[int, list[Rollout]]:
        """Newest first, for the dashboard: (how many match, one page of them). `search` matches
        part of the rollout id or data id, case-insensitively."""
        found = await self.list_rollouts(states, 2**62)
        needle = search.lower()
        found = [
            r
            for r in found
            if (is_train is None or r.is_train == is_train)
            and (not needle or needle in r.rollout_id.lower() or needle in (r.metadata.data_id or "").lower())
        ]
        found.reverse()
        return len(found), found[offset : offset + limit]

    async def count_by_state(self) -> dict[str, int]:
        """How many rollouts are in each state (for metrics and the dashboard)."""
        counts: dict[str, int] = {}
        for rollout in await self.list_rollouts(None, 2**62):
            counts[rollout.status.state.value] = counts.get(rollout.status.state.value, 0) + 1
        return counts

    # events
    @abc.abstractmethod
    async def append_event(self, record: EventRecord) -> int:
        """Durably append; returns the event's sequence number. Raises RolloutNotFound."""

    @abc.abstractmethod
    async def list_events(
        self,
        rollout_id: str,
        attempt_id: str | None = None,
        event_type: str | None = None,
        view: Literal["data", "triplet", "triplet_delta"] = "data",
    ) -> list[StoredEvent]:
        """One rollout's events in append order, optionally of one attempt and one type, whole
        (calls stored as deltas are rebuilt: see store/delta.py).

        `view="triplet"` returns only events with a triplet view and may leave `data` empty;
        `view="triplet_delta"` those de-duplicated, with prompts as references (delta.materialize).
        """

    # MoE routes (R3): a call's `routed_experts`, kept apart from its event so that a later
    # call of the same trajectory can drop them (only the last call's routes are trained on).
    @abc.abstractmethod
    async def put_routes(self, rollout_id: str, sequence: int, routes: bytes, drop: list[int]) -> None:
        """Durably store the routes (JSON) of event `sequence` and delete those of `drop`."""

    @abc.abstractmethod
    async def get_routes(self, rollout_id: str) -> dict[int, bytes]:
        """The stored routes of a rollout's events, by event sequence."""

    @abc.abstractmethod
    async def list_attempts(self, rollout_id: str) -> list[AttemptStats]:
        """The rollout's attempts that have events, sorted by their first event."""

    # attempt outcomes (docs/reliability.md): the strongest evidence recorded for each attempt
    @abc.abstractmethod
    async def record_outcome(
        self, rollout_id: str, attempt_id: str, outcome: AttemptOutcome, detail: str | None, now: float
    ) -> tuple[AttemptOutcome, str | None]:
        """Record evidence of how an attempt ended; it replaces what the attempt holds only when
        stronger (`AttemptOutcome.rank`), atomically, so that replicas reporting at once agree.
        Returns what the attempt holds now. Raises RolloutNotFound."""

    @abc.abstractmethod
    async def list_outcomes(self, rollout_ids: Collection[str]) -> dict[tuple[str, str], Outcome]:
        """`(rollout_id, attempt_id) -> (outcome, detail)` of these rollouts' attempts that have one."""

    # model endpoints
    @abc.abstractmethod
    async def upsert_models(self, models: list[Model]) -> list[Model]: ...

    @abc.abstractmethod
    async def list_models(self) -> list[Model]: ...

    @abc.abstractmethod
    async def delete_models(self) -> None: ...

    # The dashboard's views. In the store, so that every replica of a shared store shows the same.
    @abc.abstractmethod
    async def status_history(self, rollout_id: str) -> list[dict[str, Any]]:
        """The rollout's status changes (`status_change`), oldest first, at most MAX_STATUS_CHANGES.
        create_rollouts and patch_rollout record them; a delete removes them."""

    @abc.abstractmethod
    async def count_finished_since(self, since: float) -> int:
        """Rollouts that reached a terminal state at or after `since` (unix seconds)."""

    # training runs' metrics, posted by trainers (routes/runs.py): a live view, bounded
    @abc.abstractmethod
    async def add_run_points(self, run_id: str, points: list[MetricPoint]) -> int:
        """Append points in step order; a step at or before the run's last one replaces the points
        from there on (a run resumed from a checkpoint logs those steps again). A point without a
        time gets now. Keeps MAX_RUNS runs and MAX_POINTS_PER_RUN points a run. Returns the run's
        point count."""

    @abc.abstractmethod
    async def list_runs(self) -> list[RunSummary]:
        """The runs, most recently updated first."""

    @abc.abstractmethod
    async def run_points(self, run_id: str, after_step: int = -1) -> list[MetricPoint] | None:
        """The run's points after `after_step`, in step order; None for a run never posted to."""
