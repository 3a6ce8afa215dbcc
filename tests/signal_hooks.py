"""A rollout hook for the tests whose loop must show an update with signal on a model that
cannot earn a reward yet (random init, a few steps): every finished rollout gets a last reward
of `index_in_group % 2`, so each GRPO group of two or more holds a 0 and a 1 — non-zero
advantages whatever the model wrote. Pass it as `agentlightning.hooks=tests/signal_hooks.py`
(the v1.0 hooks key); what it shows is the update path through the real harness, not learning."""

from __future__ import annotations

from typing import Any

from agentlightning.hooks import RolloutHooks, TraceWriter


class GroupParityReward(RolloutHooks):
    def on_succeeded(self, rollout: Any, events: dict[str, list[Any]], store: TraceWriter) -> None:
        attempt = list(events)[-1]
        store.add_event(
            rollout.rollout_id, attempt, "reward", {"value": float(rollout.metadata.index_in_group % 2)}
        )
