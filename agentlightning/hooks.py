"""Rollout lifecycle hooks, as Agent Lightning v1.0 defines them (`agentlightning.hooks`).

A hooks file (`agentlightning.hooks: path/to/hooks.py` in the trainer config) holds exactly one
`RolloutHooks` subclass. A file written for v1.0 works unchanged: same module, class, method
names and signatures. The trainer core calls them (agentlightning/trainer/hook_runner.py):

* `on_startup()` once, when the trainer starts;
* `on_enqueue(request) -> request` for every rollout before it is created (e.g. a per-sample config);
* `on_succeeded(rollout, events_by_attempt, writer)` when a rollout succeeded, before its
  training rows are built: events written through `writer.add_event(...)` (e.g. a reward
  computed from the trace) are on the Gateway before the trainer reads the rollout;
* `on_failed(rollout, writer)` when it failed.

A hook that raises is logged with the rollout id; training goes on.
"""

from __future__ import annotations

import importlib.util
import inspect
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from agentlightning.schemas import RolloutCreate

if TYPE_CHECKING:
    from agentlightning.schemas import Rollout


class TraceWriter(Protocol):
    def add_event(self, rollout_id: str, attempt_id: str, event_type: str, data: dict[str, Any]) -> Any: ...


class RolloutHooks:
    """Base class for synchronous rollout lifecycle hooks (v1.0's signatures)."""

    def on_startup(self, store: Any | None = None) -> None:
        """Initialize hook state once after startup."""

    def on_enqueue(self, request: RolloutCreate) -> RolloutCreate:
        """Transform a rollout request before it is persisted."""
        return request

    def on_succeeded(self, rollout: Rollout, events: dict[str, list[Any]], store: TraceWriter) -> None:
        """Run after a rollout transitions to SUCCEEDED."""

    def on_failed(self, rollout: Rollout, store: TraceWriter) -> None:
        """Run after a rollout transitions to FAILED."""


def load_hooks(path: str) -> RolloutHooks:
    """Load the single `RolloutHooks` subclass from a Python file and instantiate it."""
    module_path = Path(path).resolve()
    if not module_path.exists():
        raise FileNotFoundError(f"Hooks module not found: {module_path}")
    spec = importlib.util.spec_from_file_location("_agl_hooks", str(module_path))
    if spec is None or spec.loader is None:
        raise ValueError(f"cannot load {module_path} as a Python module")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    hook_classes = [
        obj
        for _, obj in inspect.getmembers(module, inspect.isclass)
        if issubclass(obj, RolloutHooks) and obj is not RolloutHooks
    ]
    if not hook_classes:
        raise ValueError(f"No RolloutHooks subclass found in {path}")
    if len(hook_classes) > 1:
        names = [cls.__name__ for cls in hook_classes]
        raise ValueError(f"Multiple RolloutHooks subclasses found in {path}: {names}")
    return hook_classes[0]()
