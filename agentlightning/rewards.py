"""A rollout's reward: the value of its last `reward` event, kept in float32.

v1.0 rounded rewards through bfloat16 (0.7 became 0.69921875); we round to float32 only, the
precision the backends train in.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable
from typing import Any

from agentlightning.schemas import EVENT_REWARD

_F32 = struct.Struct("<f")


def to_float32(value: float) -> float:
    """`value` rounded to the nearest float32. Raises OverflowError past float32's range."""
    return float(_F32.unpack(_F32.pack(value))[0])


def reward_value(data: Any) -> float | None:
    """The float32 value of a reward event's data, or None when it holds no usable number."""
    if not isinstance(data, dict):
        return None
    value = data.get("value")
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    try:
        return to_float32(float(value))
    except OverflowError:
        return None


def call_index(data: Any) -> int | None:
    """The call a reward event names (`data.call_index`, 0-based among the rollout's recorded
    calls), None for a reward of the whole rollout."""
    index = data.get("call_index") if isinstance(data, dict) else None
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        return None
    return index


def last_reward(events: Iterable[dict[str, Any]]) -> float | None:
    """The value of the last rollout `reward` event (one naming no call) that carries a usable
    number, None when there is none."""
    found: float | None = None
    for event in events:
        if event.get("event_type") == EVENT_REWARD:
            data = event.get("data")
            if isinstance(data, dict) and "call_index" in data:
                continue  # a reward for one call, not for the rollout
            value = reward_value(data)
            if value is not None:
                found = value
    return found


def call_rewards(events: Iterable[dict[str, Any]]) -> dict[int, float]:
    """`call_index -> value` of the reward events that name a call (the last one per call)."""
    out: dict[int, float] = {}
    for event in events:
        if event.get("event_type") == EVENT_REWARD:
            data = event.get("data")
            index = call_index(data)
            value = reward_value(data)
            if index is not None and value is not None:
                out[index] = value
    return out
