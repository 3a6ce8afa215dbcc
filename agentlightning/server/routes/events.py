"""Events: agents and the proxy append; trainers read a rollout's last attempt, raw or as triplets."""

from __future__ import annotations

from typing import Annotated, Literal

import orjson
from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from agentlightning.schemas import (
    EVENT_REWARD,
    ID_PATTERN,
    BatchEventsQuery,
    Event,
    EventCreate,
    RewardData,
    Rollout,
    RolloutEvents,
    now,
)
from agentlightning.server.events import UnencodableEvent, appended_event, make_record, render_events
from agentlightning.server.outcomes import attempt_key
from agentlightning.server.state import GatewayState, state_dependency
from agentlightning.server.store import RolloutNotFound, StoredEvent
from agentlightning.server.store.delta import View

router = APIRouter(prefix="/api/rollouts", tags=["events"])
State = Annotated[GatewayState, Depends(state_dependency)]
PathId = Annotated[str, Path(pattern=ID_PATTERN)]
ROUTES_HELP = (
    "v1.0's parameter: with default_proxy.include_routed_experts, model calls carry the MoE "
    "routes vLLM used (`routed_experts`, only the last call of each trajectory keeps them); "
    "false leaves them out"
)


# The body is parsed by pydantic-core straight from bytes: several times faster than FastAPI's
# stdlib-json path for event payloads full of token ids.
_EVENT_BODY = {"required": True, "content": {"application/json": {"schema": EventCreate.model_json_schema()}}}


async def _event_body(request: Request) -> EventCreate:
    try:
        return EventCreate.model_validate_json(await request.body())
    except ValidationError as exc:
        errors = [{**e, "loc": ("body", *e["loc"])} for e in exc.errors(include_url=False)]
        raise RequestValidationError(errors) from None


@router.post(
    "/{rollout_id}/attempt/{attempt_id}/events",
    response_model=Event,
    openapi_extra={"requestBody": _EVENT_BODY},
)
async def post_event(rollout_id: PathId, attempt_id: PathId, request: Request, state: State) -> Response:
    body = await _event_body(request)
    if body.event_type == EVENT_REWARD:
        try:
            RewardData.model_validate(body.data)
        except ValidationError as exc:
            problems = "; ".join(f"data.{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
            raise HTTPException(
                422, f'a reward event needs data {{"value": <finite number>}}: {problems}'
            ) from None
    try:
        record = make_record(rollout_id, attempt_id, body.event_type, body.data, now())
    except UnencodableEvent as exc:
        raise HTTPException(422, str(exc)) from None
    sequence = await state.store.append_event(record)
    return Response(appended_event(sequence, record), media_type="application/json")


@router.get(
    "/{rollout_id}/events",
    response_class=Response,
    responses={200: {"model": list[Event], "description": "events of the last attempt, in order"}},
)
async def get_events(
    rollout_id: str,
    state: State,
    event_type: Annotated[str | None, Query()] = None,
    format: Annotated[
        str, Query(description="triplet: the training view; anything else: raw (as v1.0)")
    ] = "raw",
    attempt_id: Annotated[str | None, Query(description="an attempt other than the last one")] = None,
    include_routed_experts: Annotated[bool, Query(description=ROUTES_HELP)] = True,
) -> Response:
    rollout = await state.store.get_rollout(rollout_id)
    if rollout is None:
        raise RolloutNotFound(rollout_id)
    view: Literal["data", "triplet"] = "triplet" if format == "triplet" else "data"
    events = await _attempt_events(state, rollout, attempt_id, event_type, view)
    routes = await _routes(state, rollout_id, include_routed_experts)
    return Response(render_events(events, view, routes), media_type="application/json")


async def _routes(state: GatewayState, rollout_id: str, include: bool) -> dict[int, bytes] | None:
    """The rollout's stored MoE routes when asked for and recorded at all (a read spared otherwise)."""
    if not include or not state.config.default_proxy.include_routed_experts:
        return None
    return await state.store.get_routes(rollout_id)


async def _attempt_events(
    state: GatewayState,
    rollout: Rollout,
    attempt_id: str | None,
    event_type: str | None,
    view: View,
) -> list[StoredEvent]:
    """Events of `attempt_id`, or of the last attempt (see docs/gateway.md)."""
    if attempt_id is None:
        attempt_id = rollout.status.last_attempt_id
    if attempt_id is None:
        attempts = await state.store.list_attempts(rollout.rollout_id)
        if not attempts:
            return []
        attempt_id = attempts[-1].attempt_id
    return await state.store.list_events(rollout.rollout_id, attempt_id, event_type or None, view=view)


@router.post(
    "/batch/events",
    response_class=Response,
    responses={200: {"model": list[RolloutEvents], "description": "one entry per id, in the order asked"}},
)
async def batch_events(body: BatchEventsQuery, state: State) -> Response:
    """The events of many rollouts' last attempts in one answer (an addition over v1.0): a
    trainer collecting a step reads hundreds of rollouts, and one request per rollout would
    cost more than the reads themselves. An unknown id answers `found: false`."""
    view: View = "data" if body.format == "raw" else body.format
    parts: list[bytes] = []
    outcomes = await state.store.list_outcomes(body.rollout_ids)
    for rollout_id in body.rollout_ids:
        rollout = await state.store.get_rollout(rollout_id)
        if rollout is None:
            parts.append(orjson.dumps({"rollout_id": rollout_id, "found": False, "events": []}))
            continue
        events = await _attempt_events(state, rollout, None, body.event_type, view)
        routes = await _routes(state, rollout_id, body.include_routed_experts)
        head = orjson.dumps(
            {
                "rollout_id": rollout_id,
                "found": True,
                "state": rollout.status.state.value,
                "error_message": rollout.status.error_message,
                "outcome": (outcomes.get((rollout_id, attempt_key(rollout))) or (None,))[0],
            }
        )
        parts.append(head[:-1] + b',"events":' + render_events(events, view, routes) + b"}")
    return Response(b"[" + b",".join(parts) + b"]", media_type="application/json")
