"""Recording a model call: the `model_request` event (its payload: `model_call.ModelCall`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agentlightning.model_call import CallTriplet, ModelCall
from agentlightning.schemas import EVENT_MODEL_REQUEST, Model
from agentlightning.server.events import UnencodableEvent, make_record
from agentlightning.server.outcomes import record_call_outcome
from agentlightning.server.store import Store
from agentlightning.server.triplet import model_request_triplet

ERROR_TEXT_LIMIT = 2000


class CallRecord:
    """The event of one call, filled in as the call goes; `save` appends it to the store."""

    def __init__(
        self,
        rollout_id: str,
        attempt_id: str,
        timestamp: float,
        api: str,
        mode: str,
        request: dict[str, Any],
        params: dict[str, Any],
        stream: bool,
    ) -> None:
        # e.g. noting the call's token segment. Given the record rather than closing over it: a
        # closure held here would make a reference cycle, left (with the call's bodies) to the
        # cyclic GC, whose collections then took a fifth of the Gateway's CPU under load.
        self.before_save: Callable[[CallRecord, CallTriplet[list[int]]], None] | None = None
        self.rollout_id = rollout_id
        self.attempt_id = attempt_id
        self.timestamp = timestamp
        # A plain dict (a TypedDict): no validation on the hot path.
        self.data: ModelCall = {
            "api": api,
            "mode": mode,
            "request": request,
            "params": params,
            "response": None,
            "server": None,
            "latency_ms": None,
            "http_status": None,
            "status": "ok",
            "error": None,
            "retries": 0,
            "retry_count": 0,
            "routed_experts": None,  # v1.0's MoE routing capture, not supported
            "usage": None,
            "finish_reason": None,
            "stream": stream,
            "incomplete": False,
        }

    def finish(
        self,
        *,
        http_status: int,
        latency_ms: float,
        model: Model | None,
        tries: int,
        response: Any = None,
        error: str | None = None,
        incomplete: bool = False,
    ) -> None:
        d = self.data
        d["http_status"] = http_status
        d["latency_ms"] = round(latency_ms, 3)
        d["retries"] = d["retry_count"] = max(tries - 1, 0)  # retry_count: v1.0's name
        if model is not None:
            d["server"] = {"model": model.model, "endpoint": model.endpoint, "version": model.version}
            d["model"], d["model_version"] = model.model, model.version  # v1.0's copies of server
        if isinstance(response, dict):
            d["response"] = response
            d["usage"] = response.get("usage")
            choices = response.get("choices")
            if isinstance(choices, list) and choices and isinstance(choices[0], dict):
                d["finish_reason"] = choices[0].get("finish_reason")
        d["incomplete"] = incomplete
        if error is not None or incomplete or not 200 <= http_status < 300:
            d["status"] = "error"
            d["error"] = (error or f"HTTP {http_status}")[:ERROR_TEXT_LIMIT]

    async def save(self, store: Store) -> int:
        """Append durably. Raises RolloutNotFound when the rollout was deleted meanwhile."""
        call = model_request_triplet(self.data)  # once, for the history and the stored record
        if self.before_save is not None:
            self.before_save(self, call)
        try:
            record = make_record(
                self.rollout_id, self.attempt_id, EVENT_MODEL_REQUEST, self.data, self.timestamp, call=call
            )
        except UnencodableEvent as exc:
            # The call itself went fine for the agent; record that its content could not be kept.
            d = self.data
            d["request"] = d["response"] = d["usage"] = None
            d["status"] = "error"
            d["error"] = str(exc)
            record = make_record(
                self.rollout_id, self.attempt_id, EVENT_MODEL_REQUEST, self.data, self.timestamp
            )
        sequence = await store.append_event(record)
        # A call that failed for the agent may be evidence of how its attempt ends.
        await record_call_outcome(store, self.rollout_id, self.attempt_id, self.data)
        return sequence
