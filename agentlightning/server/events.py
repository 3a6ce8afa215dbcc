"""Event encoding: payloads are serialized once, on append; reads join stored bytes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, Literal

import orjson

from agentlightning.model_call import CallTriplet
from agentlightning.schemas import EVENT_MODEL_REQUEST
from agentlightning.server.store.base import EventRecord, StoredEvent
from agentlightning.server.store.delta import CallDraft, prompt_key_of, split_call
from agentlightning.server.triplet import keep_last_per_prompt, model_request_triplet, prompt_key, to_triplet


class UnencodableEvent(ValueError):
    """The event's data cannot be stored as portable JSON."""


def make_record(
    rollout_id: str,
    attempt_id: str,
    event_type: str,
    data: Mapping[str, Any],
    timestamp: float,
    delta: bool = True,
    call: CallTriplet[list[int]] | None = None,
) -> EventRecord:
    """Encode an event for storage. Raises UnencodableEvent for integers beyond 64 bits or
    strings with lone surrogates, which JSON readers elsewhere would not read back the same.

    A model call is split for storage as a delta against an earlier one (store/delta.py)
    unless `delta` is False (then it is stored whole, as before). `call`: the model call's
    `model_request_triplet(data)` where the caller already has it."""
    if call is None and event_type == EVENT_MODEL_REQUEST:
        call = model_request_triplet(data)
    try:
        if delta and call is not None:
            split = split_call(data, call)
            if split is not None:  # stored as a delta against an earlier call (store/delta.py)
                residual, tail, draft = split
                return EventRecord(
                    rollout_id=rollout_id,
                    attempt_id=attempt_id,
                    event_type=event_type,
                    timestamp=timestamp,
                    data=residual,
                    triplet=tail,
                    prompt_key=prompt_key_of(draft),
                    call=draft,
                )
        encoded = orjson.dumps(data)
    except orjson.JSONEncodeError as exc:
        raise UnencodableEvent(f"event data cannot be stored as JSON: {exc}") from None
    triplet: bytes | None = None
    key: str | None = None
    if call is not None:
        triplet = orjson.dumps(call)
        if call["prompt_token_ids"]:
            key = prompt_key(call["prompt_token_ids"])
    elif (view := to_triplet(event_type, data)) is not None:  # a reward's (other events have none)
        triplet = orjson.dumps(view[0])
    return EventRecord(
        rollout_id=rollout_id,
        attempt_id=attempt_id,
        event_type=event_type,
        timestamp=timestamp,
        data=encoded,
        triplet=triplet,
        prompt_key=key,
    )


def appended_event(sequence: int, record: EventRecord) -> bytes:
    """The JSON of an event just appended (from the record given to the store)."""
    if isinstance(record.call, CallDraft):
        record = replace(record, data=record.call.full_data(record.data), call=None)
    return render_events([StoredEvent(sequence, record)])[1:-1]


def render_events(
    events: Sequence[StoredEvent],
    view: Literal["data", "triplet", "triplet_delta"] = "data",
    routes: Mapping[int, bytes] | None = None,
) -> bytes:
    """A JSON array of events. In the triplet views, repeated prompts keep only their last call.

    `routes` (event sequence -> JSON) are the MoE routes of calls that still hold them
    (proxy/experts.py): spliced into the payload as `routed_experts`, in every view."""
    if view != "data":
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
        payload = (r.data if view == "data" else r.triplet) or b"{}"
        if routes and e.sequence in routes:
            sep = b"" if payload == b"{}" else b","
            payload = payload[:-1] + sep + b'"routed_experts":' + routes[e.sequence] + b"}"
        parts.append(head[:-1] + b',"data":' + payload + b"}")
    return b"[" + b",".join(parts) + b"]"
