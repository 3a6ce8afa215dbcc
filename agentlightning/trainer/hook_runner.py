"""Running the rollout hooks (agentlightning/hooks.py) from the rollout manager, for every backend.

Hooks run in the trainer's loop, one rollout after another (as in v1.0). A finished rollout's
hook runs before its events are read for training, and the events it writes are posted to the
Gateway first, so a reward written by `on_succeeded` is the reward trained on (the last reward
event of a rollout wins). A hook that raises is logged with the rollout id; the events it wrote
before raising are dropped, and training goes on.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from agentlightning.client import GatewayClient, NotFound
from agentlightning.hooks import RolloutHooks, load_hooks
from agentlightning.log import get_logger
from agentlightning.schemas import Event, RolloutCreate, RolloutState, TerminalItem

log = get_logger("trainer")


@dataclass
class EventWriter:
    """The `writer` a hook gets: events are queued, then posted once the hook returns."""

    queued: list[tuple[str, str, str, dict[str, Any]]] = field(default_factory=list)

    def add_event(self, rollout_id: str, attempt_id: str, event_type: str, data: dict[str, Any]) -> None:
        self.queued.append((rollout_id, attempt_id, event_type, data))


class HookRunner:
    def __init__(self, hooks: RolloutHooks, client: GatewayClient) -> None:
        self.hooks = hooks
        self.client = client
        self.failures: list[tuple[str, str | None]] = []  # (hook, rollout id) of each failure
        self._ran: set[str] = set()  # hooked, not yet collected: a re-read page does not run them twice

    @classmethod
    def from_path(cls, path: str, client: GatewayClient) -> HookRunner:
        hooks = load_hooks(path)
        hooks.on_startup()
        log.info("hooks_loaded", path=path, hooks=type(hooks).__name__)
        return cls(hooks, client)

    def on_enqueue(self, spec: RolloutCreate) -> RolloutCreate:
        """The hook's version of a rollout request; the trainer's id is kept (creation stays idempotent)."""
        try:
            changed = self.hooks.on_enqueue(spec)
        except Exception:
            self._failed("on_enqueue", spec.rollout_id)
            return spec
        if not isinstance(changed, RolloutCreate):
            try:
                changed = RolloutCreate.model_validate(changed)
            except Exception:
                self._failed("on_enqueue", spec.rollout_id, "returned no RolloutCreate")
                return spec
        return changed.model_copy(update={"rollout_id": spec.rollout_id})

    def run_terminal(self, items: Sequence[TerminalItem]) -> None:
        for item in items:
            if item.rollout_id not in self._ran:
                self._ran.add(item.rollout_id)
                self.on_terminal(item)

    def collected(self, items: Sequence[TerminalItem]) -> None:
        self._ran.difference_update(item.rollout_id for item in items)

    def on_terminal(self, item: TerminalItem) -> None:
        """Run on_succeeded / on_failed for one finished rollout and post what it wrote."""
        name = "on_succeeded" if item.state == RolloutState.SUCCEEDED else "on_failed"
        writer = EventWriter()
        try:
            rollout = self.client.get_rollout(item.rollout_id).rollout
            if item.state == RolloutState.SUCCEEDED:
                events = self.client.get_events(item.rollout_id)
                fallback = rollout.status.last_attempt_id or "unknown"
                self.hooks.on_succeeded(rollout, events_by_attempt(events, fallback), writer)
            else:
                self.hooks.on_failed(rollout, writer)
        except NotFound:
            return  # deleted meanwhile: nothing to run the hook on
        except Exception:
            self._failed(name, item.rollout_id)
            return
        for rollout_id, attempt_id, event_type, data in writer.queued:
            try:
                self.client.post_event(rollout_id, attempt_id, event_type, data)
            except Exception:
                self._failed(f"{name} (posting its {event_type} event)", rollout_id)

    def _failed(self, hook: str, rollout_id: str | None, why: str = "raised") -> None:
        self.failures.append((hook, rollout_id))
        # A fresh logger each time: hook failures are rare, and tests can capture them.
        get_logger("trainer").exception("hook_failed", hook=hook, rollout_id=rollout_id, why=why)


def events_by_attempt(events: list[Event], fallback_attempt_id: str) -> dict[str, list[Event]]:
    """As v1.0: the events grouped by attempt, `{fallback: []}` when there are none."""
    grouped: dict[str, list[Event]] = defaultdict(list)
    for event in events:
        grouped[event.attempt_id or fallback_attempt_id].append(event)
    return dict(grouped) or {fallback_attempt_id: []}
