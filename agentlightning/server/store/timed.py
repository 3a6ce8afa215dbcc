"""Timing a store's operations and counting the events written, for `/metrics`.

The store's own methods are wrapped on the instance (not by a wrapper class), so every
implementation, and any method added to the interface later, keeps working unchanged.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Awaitable, Callable
from typing import Any

from agentlightning.server.metrics import GatewayMetrics
from agentlightning.server.store.base import EventRecord, Store

TIMED_OPS = (
    "create_rollouts",
    "get_rollout",
    "list_rollouts",
    "count_by_state",
    "page_rollouts",
    "patch_rollout",
    "delete_rollout",
    "list_terminal",
    "list_events",
    "list_attempts",
    "upsert_models",
    "list_models",
    "delete_models",
    "status_history",
    "count_finished_since",
    "add_run_points",
    "list_runs",
    "run_points",
)


def _timed(op: Callable[..., Awaitable[Any]], histogram: Any) -> Callable[..., Awaitable[Any]]:
    @functools.wraps(op)
    async def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return await op(*args, **kwargs)
        finally:
            histogram.observe(time.perf_counter() - started)

    return timed


def instrument_store(store: Store, metrics: GatewayMetrics) -> Store:
    """Observe each operation in `agl_store_latency_seconds{op}`; count appends by event type."""
    for name in TIMED_OPS:
        op = getattr(store, name, None)
        if op is not None:
            setattr(store, name, _timed(op, metrics.store_op(name)))
    append = store.append_event
    histogram = metrics.store_op("append_event")
    event_written = metrics.event_written

    async def append_event(record: EventRecord) -> int:
        started = time.perf_counter()
        sequence = await append(record)
        histogram.observe(time.perf_counter() - started)
        event_written(record.event_type)
        return sequence

    store.append_event = append_event  # type: ignore[method-assign]  # timed in place: one store object
    return store
