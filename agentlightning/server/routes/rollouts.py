"""Rollouts: create, list (with long-poll), terminal cursor, get, patch, delete (one or many)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Mapping, Sequence
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Response

from agentlightning.schemas import (
    ID_PATTERN,
    Attempt,
    AttemptOutcomeState,
    BatchDeleted,
    OutcomeReport,
    Rollout,
    RolloutConfig,
    RolloutCreate,
    RolloutDetail,
    RolloutIdList,
    RolloutMetadata,
    RolloutPatch,
    RolloutState,
    RolloutStatus,
    TerminalPage,
    now,
)
from agentlightning.server.outcomes import finish_attempt
from agentlightning.server.state import GatewayState, state_dependency
from agentlightning.server.store import RolloutNotFound
from agentlightning.server.store.base import AttemptStats, Outcome

router = APIRouter(prefix="/api/rollouts", tags=["rollouts"])
State = Annotated[GatewayState, Depends(state_dependency)]
WaitSeconds = Annotated[
    float,
    Query(
        ge=0,
        le=3600,
        description="long-poll: when nothing matches, wait up to this long for a change (capped by the server)",
    ),
]
LONG_POLL_HEADER = "X-Agl-Long-Poll"
# Pages are capped at this many rows; a larger `limit` is clamped, never refused (v1.0 accepts any).
MAX_PAGE = 10000
Limit = Annotated[int, Query(description=f"page size; values above {MAX_PAGE} are clamped to {MAX_PAGE}")]


PathId = Annotated[str, Path(pattern=ID_PATTERN)]
NO_ATTEMPT = "-"  # the attempt segment of a rollout failed before any attempt started


def clamp_limit(limit: int, least: int) -> int:
    return max(least, min(limit, MAX_PAGE))


def _new_rollout(spec: RolloutCreate, at: float) -> Rollout:
    return Rollout(
        rollout_id=spec.rollout_id or uuid.uuid4().hex,
        input=spec.input,
        is_train=spec.is_train,
        config=spec.config or RolloutConfig(),
        metadata=spec.metadata or RolloutMetadata(),
        status=RolloutStatus(created_at=at, updated_at=at),
    )


@router.post("", status_code=201, response_model=list[Rollout])
async def create_rollouts(body: list[RolloutCreate], state: State) -> list[Rollout]:
    at = now()
    created = await state.store.create_rollouts([_new_rollout(spec, at) for spec in body])
    state.rollout_changes.notify()
    return created


@router.get("", response_model=list[Rollout])
async def list_rollouts(
    state: State,
    response: Response,
    state_in: Annotated[list[RolloutState] | None, Query()] = None,
    limit: Limit = 500,
    wait_seconds: WaitSeconds = 0,
) -> list[Rollout]:
    states = set(state_in) if state_in else None
    limit = clamp_limit(limit, 0)  # 0: an empty page, as v1.0

    async def query() -> list[Rollout]:
        return await state.store.list_rollouts(states, limit) if limit else []

    if wait_seconds <= 0:
        return await query()
    response.headers[LONG_POLL_HEADER] = "true"
    wait = min(wait_seconds, state.config.long_poll_max_seconds)
    return await state.rollout_changes.poll(query, bool, wait)


@router.get("/terminal", response_model=TerminalPage)
async def terminal_rollouts(
    state: State,
    response: Response,
    after: Annotated[int, Query(description="cursor: next_after of the previous page")] = 0,
    limit: Limit = 1000,
    wait_seconds: WaitSeconds = 0,
) -> TerminalPage:
    after, limit = max(after, 0), clamp_limit(limit, 1)  # as v1.0: out-of-range values are clamped

    async def query() -> TerminalPage:
        return await state.store.list_terminal(after, limit)

    if wait_seconds <= 0:
        return await query()
    response.headers[LONG_POLL_HEADER] = "true"
    wait = min(wait_seconds, state.config.long_poll_max_seconds)
    return await state.terminal_changes.poll(query, lambda page: bool(page.items), wait)


@router.get("/{rollout_id}", response_model=RolloutDetail)
async def get_rollout(rollout_id: str, state: State) -> RolloutDetail:
    rollout = await state.store.get_rollout(rollout_id)
    if rollout is None:
        raise RolloutNotFound(rollout_id)
    stats = await state.store.list_attempts(rollout_id)
    attempts = attempt_details(rollout, stats, await state.store.list_outcomes([rollout_id]))
    ids = [s.attempt_id for s in stats]  # as v1.0: the attempts that have events
    return RolloutDetail(rollout=rollout, attempts=ids, attempt_details=attempts)


def attempt_details(
    rollout: Rollout, stats: Sequence[AttemptStats], outcomes: Mapping[tuple[str, str], Outcome]
) -> list[Attempt]:
    """Every attempt of a rollout: those with events (sorted by their first event), then those
    that recorded none — an agent that failed before its first call still made an attempt, known
    by its outcome or as the rollout's `last_attempt_id`. `outcomes`: `Store.list_outcomes`."""
    rollout_id = rollout.rollout_id

    def outcome_fields(attempt_id: str) -> dict[str, Any]:
        held = outcomes.get((rollout_id, attempt_id))
        return {} if held is None else {"outcome": held[0], "outcome_detail": held[1]}

    attempts = [
        Attempt(
            attempt_id=s.attempt_id,
            n_events=s.n_events,
            first_event_at=s.first_event_at,
            last_event_at=s.last_event_at,
            **outcome_fields(s.attempt_id),
        )
        for s in stats
    ]
    ids = [a.attempt_id for a in attempts]
    for rid, attempt_id in outcomes:  # started, nothing recorded yet (the last, or retried ones)
        if rid == rollout_id and attempt_id and attempt_id not in ids:
            ids.append(attempt_id)
            attempts.append(Attempt(attempt_id=attempt_id, n_events=0, **outcome_fields(attempt_id)))
    last = rollout.status.last_attempt_id
    if last is not None and last not in ids:
        attempts.append(Attempt(attempt_id=last, n_events=0))
    return attempts


@router.patch("/{rollout_id}", response_model=Rollout)
async def patch_rollout(rollout_id: str, body: RolloutPatch, state: State) -> Rollout:
    if body.status is None or not body.status.model_fields_set:
        current = await state.store.get_rollout(rollout_id)  # nothing to change, no new version
        if current is None:
            raise RolloutNotFound(rollout_id)
        return current
    updated = await state.store.patch_rollout(rollout_id, body.status, now())
    if updated.status.state.is_terminal and body.status.state is not None:
        # Before the trainer can see it finished: its outcome is there when it reads it.
        await finish_attempt(state.store, updated)
        state.terminal_changes.notify()
    state.rollout_changes.notify()
    return updated


@router.put("/{rollout_id}/attempts/{attempt_id}/outcome", response_model=AttemptOutcomeState)
async def report_outcome(
    rollout_id: PathId, attempt_id: PathId, body: OutcomeReport, state: State
) -> AttemptOutcomeState:
    """Evidence of how an attempt ended (an addition over v1.0; controller or admin key): the
    Controller's (the process's or pod's end, a timeout) and the trainer's (`lost`). The attempt
    keeps the strongest evidence reported (docs/reliability.md); the answer says which it holds.
    `attempt_id` `-` stands for a rollout that never started an attempt."""
    key = "" if attempt_id == NO_ATTEMPT else attempt_id
    outcome, detail = await state.store.record_outcome(rollout_id, key, body.outcome, body.detail, now())
    return AttemptOutcomeState(rollout_id=rollout_id, attempt_id=key, outcome=outcome, detail=detail)


@router.post("/batch/delete", response_model=BatchDeleted)
async def delete_rollouts(body: RolloutIdList, state: State) -> BatchDeleted:
    """Delete many rollouts and their events in one request (an addition over v1.0); idempotent."""
    # Concurrent deletes reach the SQLite writer together and share one transaction.
    results = await asyncio.gather(*(state.store.delete_rollout(rid) for rid in body.rollout_ids))
    for rid in body.rollout_ids:
        state.proxy.forget(rid)  # the next model call for it is refused before the model is called
    if any(results):
        state.rollout_changes.notify()
    return BatchDeleted(deleted=sum(results))


@router.delete("/{rollout_id}", status_code=204, response_class=Response)
async def delete_rollout(rollout_id: str, state: State) -> Response:
    if await state.store.delete_rollout(rollout_id):
        state.rollout_changes.notify()
    state.proxy.forget(rollout_id)  # the next model call for it is refused before the model is called
    return Response(status_code=204)
