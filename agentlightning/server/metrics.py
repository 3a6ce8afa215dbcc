"""The Gateway's Prometheus metrics (`GET /metrics`) and the recent call rate the dashboard shows.

One registry per app (not prometheus-client's global one), so that several Gateways in one
process (tests) do not share counters. The proxy's hot path only increments prepared
children (label lookups cached per (mode, status)); gauges that describe state — in-flight
calls, pause, rollouts by state — are read when scraped, costing the hot path nothing.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

# Latency buckets in seconds: a model call takes from milliseconds to minutes.
CALL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
STORE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5)
RATE_WINDOW_SECONDS = 60


class _StateCollector(Collector):
    """Gauges read at scrape time from callbacks set by the app."""

    def __init__(self) -> None:
        self.proxy_state: Callable[[], tuple[int, bool]] = lambda: (0, False)
        self.rollout_counts: Mapping[str, int] = {}

    def collect(self) -> Iterable[GaugeMetricFamily]:
        inflight, paused = self.proxy_state()
        yield GaugeMetricFamily("agl_proxy_inflight", "model calls in flight through the proxy", inflight)
        yield GaugeMetricFamily("agl_proxy_paused", "1 while the proxy is paused for a weight update", paused)
        family = GaugeMetricFamily("agl_rollouts", "rollouts in the store by state", labels=["state"])
        for state, count in sorted(self.rollout_counts.items()):
            family.add_metric([state], count)
        yield family


class CallRate:
    """Model calls per second over the last minute, in one-second buckets (cheap to count)."""

    def __init__(self, window: int = RATE_WINDOW_SECONDS) -> None:
        self.window = window
        self._buckets: deque[list[int]] = deque()  # [second, count]

    def add(self, now: float | None = None) -> None:
        second = int(time.monotonic() if now is None else now)
        buckets = self._buckets
        if buckets and buckets[-1][0] == second:
            buckets[-1][1] += 1
            return
        buckets.append([second, 1])
        while buckets and buckets[0][0] <= second - self.window:
            buckets.popleft()

    def per_second(self, now: float | None = None) -> float:
        second = int(time.monotonic() if now is None else now)
        total = sum(c for s, c in self._buckets if s > second - self.window)
        return total / self.window


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        r = self.registry
        self.calls = Counter(
            "agl_proxy_calls", "proxied model calls by mode and HTTP status", ["mode", "status"], registry=r
        )
        self.latency = Histogram(
            "agl_proxy_latency_seconds",
            "time from a call's arrival to its answer (for a stream: to its last event)",
            ["mode"],
            buckets=CALL_BUCKETS,
            registry=r,
        )
        self.upstream_latency = Histogram(
            "agl_proxy_upstream_latency_seconds",
            "time spent waiting on inference servers per call, retries included",
            buckets=CALL_BUCKETS,
            registry=r,
        )
        self.retries = Counter("agl_proxy_retries", "upstream retries of proxied calls", registry=r)
        self.paused_answers = Counter(
            "agl_proxy_paused_answers", "calls answered 429 because the proxy was paused", registry=r
        )
        self.events = Counter(
            "agl_events_written", "events appended to the store by type", ["type"], registry=r
        )
        self.store_latency = Histogram(
            "agl_store_latency_seconds", "store operations by kind", ["op"], buckets=STORE_BUCKETS, registry=r
        )
        self.state = _StateCollector()
        r.register(self.state)
        self.call_rate = CallRate()
        self._calls: dict[tuple[str, int], Any] = {}
        self._latency = {m: self.latency.labels(m) for m in ("train", "val")}
        self._events: dict[str, Any] = {}
        self._store_ops: dict[str, Any] = {}

    def observe_call(
        self, mode: str, status: int, latency_s: float, upstream_s: float | None, retries: int
    ) -> None:
        """One finished proxied call (the hot path: cached children only)."""
        key = (mode, status)
        child = self._calls.get(key)
        if child is None:
            child = self._calls[key] = self.calls.labels(mode, str(status))
        child.inc()
        latency = self._latency.get(mode)
        if latency is not None:
            latency.observe(latency_s)
        if upstream_s is not None:
            self.upstream_latency.observe(upstream_s)
        if retries:
            self.retries.inc(retries)
        self.call_rate.add()

    def paused_answer(self, mode: str) -> None:
        self.paused_answers.inc()
        key = (mode, 429)
        child = self._calls.get(key)
        if child is None:
            child = self._calls[key] = self.calls.labels(mode, "429")
        child.inc()

    def event_written(self, event_type: str) -> None:
        child = self._events.get(event_type)
        if child is None:
            # Agents choose event types: past a bound, the rest share one label (no unbounded series).
            label = event_type if len(self._events) < 64 else "other"
            child = self._events[event_type] = self.events.labels(label)
        child.inc()

    def store_op(self, op: str) -> Any:
        """The histogram child of one store operation (`with metrics.store_op("x").time(): ...`)."""
        child = self._store_ops.get(op)
        if child is None:
            child = self._store_ops[op] = self.store_latency.labels(op)
        return child

    def render(self) -> bytes:
        return generate_latest(self.registry)
