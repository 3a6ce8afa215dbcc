"""Event encoding: payloads are serialized once, on append; reads join stored bytes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import orjson

from agentlightning.schemas import EVENT_MODEL_REQUEST
from agentlightning.server.store.base import EventRecord, StoredEvent
from agentlightning.server.triplet import keep_last_per_prompt, to_triplet


class UnencodableEvent(ValueError):
    """The event's data cannot be stored as portable JSON."""


def make_record(
    rollout_id: str, attempt_id: str, event_type: str, data: dict[str, Any], timestamp: float
) -> EventRecord:
    """Encode an event for storage. Raises UnencodableEvent for integers beyond 64 bits or
    strings with lone surrogates, which JSON readers elsewhere would not read back the same."""
    try:
        encoded = orjson.dumps(data)
    except orjson.JSONEncodeError as exc:
        raise UnencodableEvent(f"event data cannot be stored as JSON: {exc}") from None
    triplet = to_triplet(event_type, data)
    return EventRecord(
        rollout_id=rollout_id,
        attempt_id=attempt_id,
        event_type=event_type,
        timestamp=timestamp,
        data=encoded,
        triplet=orjson.dumps(triplet[0]) if triplet else None,
        prompt_key=triplet[1] if triplet else None,
    )


def render_events(events: Sequence[StoredEvent], view: Literal["data", "triplet"] = "data") -> bytes:
    """A JSON array of events. In the triplet view, repeated prompts keep only their last call."""
    if view == "triplet":
        keys = [e.record.prompt_key if e.record.event_type == EVENT_MODEL_REQUEST else None for e in events]
        events = [events[i] for i in keep_last_per_prompt(keys)]
    parts = []
    for e in events:
        r = e.record
        head = orjson.dumps(
            {
                "event_type": r.event_type,
                "rollout_id": r.rollout_id,
                "attempt_id": r.attempt_id,
                "timestamp": r.timestamp,
                "sequence": e.sequence,
            }
        )
        payload = r.triplet if view == "triplet" else r.data
        parts.append(head[:-1] + b',"data":' + (payload or b"{}") + b"}")
    return b"[" + b",".join(parts) + b"]"
