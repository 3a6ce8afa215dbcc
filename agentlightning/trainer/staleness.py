"""Bounded staleness: how many policy versions behind the current one a rollout's calls are.

Every recorded call carries the model version that served it (`server.version` of its
`model_request` event). A rollout's staleness is `policy_version - v` for its oldest call with
a known version; a group's is the largest of its rollouts'. With `agentlightning.max_staleness`
set, a group staler than the bound is never trained on: `drop` leaves it out of the step
(counted), `wait` (async collection) discards it when it completes and waits for fresher
groups instead. Whole groups, never single rollouts: a group with one survivor has no baseline.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from agentlightning.schemas import EVENT_MODEL_REQUEST
from agentlightning.trainer.collected import CollectedRollout


def call_versions(events: Iterable[dict[str, Any]]) -> list[int]:
    """The known model versions of a rollout's recorded calls, in order."""
    out: list[int] = []
    for event in events:
        if event.get("event_type") != EVENT_MODEL_REQUEST:
            continue
        data = event.get("data")
        server = data.get("server") if isinstance(data, dict) else None
        version = server.get("version") if isinstance(server, dict) else None
        if isinstance(version, int) and not isinstance(version, bool) and version >= 0:
            out.append(version)
    return out


def rollout_staleness(rollout: CollectedRollout, policy_version: int) -> int:
    """Versions between the rollout's oldest call and `policy_version` (0 with no known version)."""
    versions = call_versions(rollout.events)
    return max(policy_version - min(versions), 0) if versions else 0


def split_stale_groups(
    rollouts: Sequence[CollectedRollout], policy_version: int, max_staleness: int | None
) -> tuple[list[CollectedRollout], list[CollectedRollout]]:
    """(fresh, stale): the rollouts of groups within the bound, and of groups beyond it."""
    if max_staleness is None:
        return list(rollouts), []
    worst: dict[str, int] = {}
    for rollout in rollouts:
        lag = rollout_staleness(rollout, policy_version)
        worst[rollout.group_id] = max(worst.get(rollout.group_id, 0), lag)
    fresh = [r for r in rollouts if worst[r.group_id] <= max_staleness]
    stale = [r for r in rollouts if worst[r.group_id] > max_staleness]
    return fresh, stale
