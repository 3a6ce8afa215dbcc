"""Read-only views for the dashboard (`/ui`): overview, the rollouts table, one rollout.

Everything here is derived from the store and the Gateway's live state; nothing is written.
The training view of a rollout is built by the aggregation the trainer core uses
(`agentlightning.aggregation`), so it shows the rows the trainer would build.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Annotated, Any, Literal

import orjson
from fastapi import APIRouter, Depends, Query

from agentlightning.aggregation import (
    AggregationLevel,
    AggregationStats,
    Call,
    RowLimits,
    aggregate_calls,
    usable_calls,
)
from agentlightning.rewards import last_reward
from agentlightning.schemas import EVENT_MODEL_REQUEST, EVENT_REWARD, Rollout, RolloutState
from agentlightning.server.events import render_events
from agentlightning.server.routes.rollouts import attempt_details
from agentlightning.server.state import GatewayState, state_dependency
from agentlightning.server.store import RolloutNotFound

router = APIRouter(prefix="/api/dashboard", tags=["dashboard"])
State = Annotated[GatewayState, Depends(state_dependency)]
RECENT_FAILURES = 20


async def _events(
    state: GatewayState, rollout: Rollout, view: Literal["data", "triplet"]
) -> list[dict[str, Any]]:
    """The events of the rollout's last attempt (as GET /api/rollouts/{id}/events gives them)."""
    attempt_id = rollout.status.last_attempt_id
    if attempt_id is None:
        attempts = await state.store.list_attempts(rollout.rollout_id)
        if not attempts:
            return []
        attempt_id = attempts[-1].attempt_id
    stored = await state.store.list_events(rollout.rollout_id, attempt_id, None, view=view)
    events: list[dict[str, Any]] = orjson.loads(render_events(stored, view))
    return events


def _duration(rollout: Rollout, at: float) -> float | None:
    s = rollout.status
    if s.state == RolloutState.QUEUING:
        return None
    end = s.updated_at if s.state.is_terminal else at
    return max(end - s.created_at, 0.0)


@router.get("/overview")
async def overview(state: State) -> dict[str, Any]:
    counts = await state.store.count_by_state()
    _, failed = await state.store.page_rollouts({RolloutState.FAILED}, None, "", 0, RECENT_FAILURES)
    metrics = state.metrics
    return {
        "counts": {s.value: counts.get(s.value, 0) for s in RolloutState},
        "total": sum(counts.values()),
        "rollouts_per_minute": await state.store.count_finished_since(time.time() - 60),
        "calls_per_second": metrics.call_rate.per_second() if metrics is not None else None,
        "failures": [
            {
                "rollout_id": r.rollout_id,
                "data_id": r.metadata.data_id,
                "error_message": r.status.error_message,
                "updated_at": r.status.updated_at,
            }
            for r in failed
        ],
        "proxy": state.proxy.state().model_dump(),
        "models": [m.model_dump() for m in state.models.all()],
        "now": time.time(),
    }


def _usage_tokens(usage: Any) -> int:
    if not isinstance(usage, dict):
        return 0
    total = usage.get("total_tokens")
    if isinstance(total, int):
        return total
    return sum(v for k in ("prompt_tokens", "completion_tokens") if isinstance(v := usage.get(k), int))


@router.get("/rollouts")
async def rollouts(
    state: State,
    state_in: Annotated[list[RolloutState] | None, Query(alias="state")] = None,
    split: Annotated[Literal["all", "train", "val"], Query()] = "all",
    q: Annotated[str, Query(max_length=256, description="part of a rollout id or data id")] = "",
    offset: Annotated[int, Query(ge=0)] = 0,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> dict[str, Any]:
    """A page of rollouts, newest first, with per-rollout reward, attempts, calls and tokens."""
    is_train = None if split == "all" else split == "train"
    total, page = await state.store.page_rollouts(
        set(state_in) if state_in else None, is_train, q.strip(), offset, limit
    )
    at = time.time()
    items = []
    outcomes = await state.store.list_outcomes([r.rollout_id for r in page])
    for r in page:
        events = await _events(state, r, "data")
        calls = [e for e in events if e["event_type"] == EVENT_MODEL_REQUEST]
        items.append(
            {
                "rollout_id": r.rollout_id,
                "data_id": r.metadata.data_id,
                "is_train": r.is_train,
                "state": r.status.state.value,
                "reward": last_reward(events),
                "duration": _duration(r, at),
                # those that recorded no event too (a failed agent's): as the detail lists them
                "attempts": len(attempt_details(r, await state.store.list_attempts(r.rollout_id), outcomes)),
                "model_calls": len(calls),
                "tokens": sum(_usage_tokens(e["data"].get("usage")) for e in calls),
                "created_at": r.status.created_at,
                "error_message": r.status.error_message,
            }
        )
    return {"total": total, "offset": offset, "limit": limit, "items": items}


def _call_view(event: dict[str, Any]) -> dict[str, Any]:
    """A model call as the page shows it: the conversation, without token ids and log-probs."""
    d = event.get("data") or {}
    request: dict[str, Any] = d["request"] if isinstance(d.get("request"), dict) else {}
    response: dict[str, Any] = d["response"] if isinstance(d.get("response"), dict) else {}
    answers = []
    for choice in response.get("choices") or []:
        if isinstance(choice, dict):
            answers.append(
                {
                    "message": choice.get("message"),
                    "text": choice.get("text"),
                    "finish_reason": choice.get("finish_reason"),
                }
            )
    server = d.get("server") if isinstance(d.get("server"), dict) else None
    return {
        "timestamp": event.get("timestamp"),
        "sequence": event.get("sequence"),
        "api": d.get("api"),
        "mode": d.get("mode"),
        "messages": request.get("messages"),
        "prompt": request.get("prompt"),
        "tools": request.get("tools"),
        "params": d.get("params"),
        "answers": answers,
        "usage": d.get("usage"),
        "latency_ms": d.get("latency_ms"),
        "retries": d.get("retries"),
        "http_status": d.get("http_status"),
        "status": d.get("status"),
        "error": d.get("error"),
        "stream": d.get("stream"),
        "model": server.get("model") if server else None,
        "model_version": server.get("version") if server else None,
    }


def _break_reason(before: Call, call: Call) -> str:
    """Why `call` could not extend the row ending with `before` (the trajectory merge rule)."""
    seq = [*before.prompt_ids, *before.response_ids]
    p = call.prompt_ids
    if len(p) < len(seq):
        return (
            f"the call's prompt ({len(p)} tokens) is shorter than the row so far "
            f"({len(seq)} tokens: previous prompt + response)"
        )
    for i, (a, b) in enumerate(zip(seq, p, strict=False)):
        if a != b:
            where = "previous prompt" if i < len(before.prompt_ids) else "previous response"
            return f"the call's prompt differs from the row at token {i} (in the {where}): {b} instead of {a}"
    return "the call's prompt does not begin with the row's tokens"


def training_view(triplet_events: list[dict[str, Any]], rollout: Rollout) -> dict[str, Any]:
    """The rows the trainer core builds from these calls (trajectory aggregation, no length limits)."""
    stats = AggregationStats()
    calls = usable_calls(triplet_events, stats)
    reward = last_reward(triplet_events)
    group_id = rollout.metadata.data_id or rollout.rollout_id
    rows = aggregate_calls(
        calls,
        rollout.rollout_id,
        group_id,
        reward if reward is not None else 0.0,
        AggregationLevel.TRAJECTORY,
        RowLimits(),
        stats,
    )
    out = []
    for row in rows:
        trainable = row.n_trainable
        out.append(
            {
                "turn_index": row.turn_index,
                "n_calls": row.n_calls,
                "prompt_tokens": len(row.prompt_ids),
                "trainable_tokens": trainable,
                "context_tokens": len(row.response_ids) - trainable,
                "model_versions": sorted({v for v in row.model_versions if v >= 0}),
                "has_log_probs": row.rollout_log_probs is not None,
                "truncated": row.truncated,
                "break_reason": (
                    _break_reason(calls[row.turn_index - 1], calls[row.turn_index])
                    if row.turn_index > 0
                    else None
                ),
                "response_mask": row.response_mask,
            }
        )
    return {"reward": reward, "rows": out, "stats": asdict(stats)}


@router.get("/rollouts/{rollout_id}")
async def rollout_detail(rollout_id: str, state: State) -> dict[str, Any]:
    rollout = await state.store.get_rollout(rollout_id)
    if rollout is None:
        raise RolloutNotFound(rollout_id)
    attempts = attempt_details(
        rollout, await state.store.list_attempts(rollout_id), await state.store.list_outcomes([rollout_id])
    )
    events = await _events(state, rollout, "data")
    triplets = await _events(state, rollout, "triplet")
    return {
        "rollout": rollout.model_dump(mode="json"),
        "history": await state.store.status_history(rollout_id),
        # each with how it ended (docs/reliability.md): outcome and what showed it
        "attempts": [a.model_dump(mode="json") for a in attempts],
        "calls": [_call_view(e) for e in events if e["event_type"] == EVENT_MODEL_REQUEST],
        "rewards": [e for e in events if e["event_type"] == EVENT_REWARD],
        "other_events": [e for e in events if e["event_type"] not in (EVENT_MODEL_REQUEST, EVENT_REWARD)],
        "reward": last_reward(events),
        "duration": _duration(rollout, time.time()),
        "training": training_view(triplets, rollout),
    }
