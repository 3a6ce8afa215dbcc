"""Each rollout's status changes as the Gateway saw them, for the dashboard (in memory, bounded).

The store keeps a rollout's current status only; this remembers the way there while the
Gateway runs. It also counts rollouts that finish, for the overview's throughput.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from agentlightning.schemas import Rollout
from agentlightning.server.metrics import CallRate

MAX_ROLLOUTS = 100_000
MAX_CHANGES = 50


class StatusHistory:
    def __init__(self, max_rollouts: int = MAX_ROLLOUTS) -> None:
        self.max_rollouts = max_rollouts
        self._changes: OrderedDict[str, list[dict[str, Any]]] = OrderedDict()
        self.finished = CallRate()  # rollouts that reached a terminal state, per second

    def record(self, rollout: Rollout) -> None:
        s = rollout.status
        changes = self._changes.get(rollout.rollout_id)
        if changes is None:
            changes = self._changes[rollout.rollout_id] = []
            if len(self._changes) > self.max_rollouts:
                self._changes.popitem(last=False)
        elif changes[-1]["version"] >= s.version:
            return  # an idempotent re-create: nothing changed
        if s.state.is_terminal and (not changes or changes[-1]["state"] != s.state.value):
            self.finished.add()
        if len(changes) < MAX_CHANGES:
            changes.append(
                {
                    "state": s.state.value,
                    "version": s.version,
                    "at": s.updated_at,
                    "attempt_id": s.last_attempt_id,
                    "error_message": s.error_message,
                }
            )

    def of(self, rollout_id: str) -> list[dict[str, Any]]:
        return list(self._changes.get(rollout_id, []))
