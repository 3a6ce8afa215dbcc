"""The Gateway's Prometheus metrics (`GET /metrics`) and the recent call rate the dashboard shows.

One registry per app (not prometheus-client's global one), so that several Gateways in one
process (tests) do not share counters. The proxy's hot path adds to plain numbers (about
1 µs per call, against 11 µs with prometheus-client's locked children, measured); they become
Prometheus families, rendered by prometheus-client, when scraped. Gauges that describe state —
in-flight calls, pause, rollouts by state — are read at scrape time only.
"""

from __future__ import annotations

import math
import time
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Iterable, Mapping

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

# Latency buckets in seconds: a model call takes from milliseconds to minutes.
CALL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
STORE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5)
RATE_WINDOW_SECONDS = 60
MAX_EVENT_TYPES = 64


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


class FastHistogram:
    """A histogram as plain numbers: one bisect and two adds per observation.

    prometheus-client's own children take a lock and walk their buckets on every call (about
    2 µs); the Gateway touches its metrics only from its event loop, so no lock is needed.
    """

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one: above every bound (+Inf)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    def time(self) -> _Timer:
        return _Timer(self)

    def buckets(self) -> list[tuple[str, float]]:
        out: list[tuple[str, float]] = []
        total = 0
        for bound, count in zip((*self.bounds, math.inf), self.counts, strict=True):
            total += count
            out.append((floatToGoString(bound), total))
        return out


class _Timer:
    __slots__ = ("histogram", "started")

    def __init__(self, histogram: FastHistogram) -> None:
        self.histogram = histogram

    def __enter__(self) -> None:
        self.started = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        self.histogram.observe(time.perf_counter() - self.started)


class GatewayMetrics(Collector):
    """Counted in plain dicts on the hot path; turned into Prometheus families when scraped."""

    def __init__(self) -> None:
        self.calls: dict[tuple[str, int], int] = {}
        self.latency = {m: FastHistogram(CALL_BUCKETS) for m in ("train", "val")}
        self.upstream_latency = FastHistogram(CALL_BUCKETS)
        self.retries = 0
        self.paused_answers = 0
        self.history_breaks: dict[str, int] = {}  # calls whose prompt does not continue the attempt's last
        self.events: dict[str, int] = {}
        self.store_latency: dict[str, FastHistogram] = {}
        self.call_rate = CallRate()
        # Read when scraped (set by the app): state, not events, so the hot path never touches them.
        self.proxy_state: Callable[[], tuple[int, bool]] = lambda: (0, False)
        self.rollout_counts: Mapping[str, int] = {}
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    def observe_call(
        self, mode: str, status: int, latency_s: float, upstream_s: float | None, retries: int
    ) -> None:
        """One finished proxied call."""
        key = (mode, status)
        self.calls[key] = self.calls.get(key, 0) + 1
        latency = self.latency.get(mode)
        if latency is not None:
            latency.observe(latency_s)
        if upstream_s is not None:
            self.upstream_latency.observe(upstream_s)
        self.retries += retries
        self.call_rate.add()

    def paused_answer(self, mode: str) -> None:
        self.paused_answers += 1
        key = (mode, 429)
        self.calls[key] = self.calls.get(key, 0) + 1

    def history_break(self, reason: str) -> None:
        self.history_breaks[reason] = self.history_breaks.get(reason, 0) + 1

    def event_written(self, event_type: str) -> None:
        events = self.events
        if event_type not in events and len(events) >= MAX_EVENT_TYPES:
            event_type = "other"  # agents choose event types: no unbounded label set
        events[event_type] = events.get(event_type, 0) + 1

    def store_op(self, op: str) -> FastHistogram:
        """The latency histogram of one store operation (`with metrics.store_op("x").time(): ...`)."""
        histogram = self.store_latency.get(op)
        if histogram is None:
            histogram = self.store_latency[op] = FastHistogram(STORE_BUCKETS)
        return histogram

    def collect(self) -> Iterable[Metric]:
        calls = CounterMetricFamily(
            "agl_proxy_calls", "proxied model calls by mode and HTTP status", labels=["mode", "status"]
        )
        for (mode, status), n in sorted(self.calls.items()):
            calls.add_metric([mode, str(status)], n)
        yield calls
        latency = HistogramMetricFamily(
            "agl_proxy_latency_seconds",
            "time from a call's arrival to its answer's last byte (streams: the last event)",
            labels=["mode"],
        )
        for mode, h in self.latency.items():
            latency.add_metric([mode], h.buckets(), h.sum)
        yield latency
        upstream = HistogramMetricFamily(
            "agl_proxy_upstream_latency_seconds",
            "time waiting on inference servers per call, retries included (streams: until the answer starts)",
        )
        upstream.add_metric([], self.upstream_latency.buckets(), self.upstream_latency.sum)
        yield upstream
        yield CounterMetricFamily("agl_proxy_retries", "upstream retries of proxied calls", self.retries)
        yield CounterMetricFamily(
            "agl_proxy_paused_answers", "calls answered 429 because the proxy was paused", self.paused_answers
        )
        breaks = CounterMetricFamily(
            "agl_proxy_history_breaks",
            "calls whose prompt does not continue the attempt's previous call (a new segment), by reason",
            labels=["reason"],
        )
        for reason, n in sorted(self.history_breaks.items()):
            breaks.add_metric([reason], n)
        yield breaks
        inflight, paused = self.proxy_state()
        yield GaugeMetricFamily("agl_proxy_inflight", "model calls in flight through the proxy", inflight)
        yield GaugeMetricFamily("agl_proxy_paused", "1 while the proxy is paused for a weight update", paused)
        rollouts = GaugeMetricFamily("agl_rollouts", "rollouts in the store by state", labels=["state"])
        for state, count in sorted(self.rollout_counts.items()):
            rollouts.add_metric([state], count)
        yield rollouts
        events = CounterMetricFamily(
            "agl_events_written", "events appended to the store by type", labels=["type"]
        )
        for event_type, n in sorted(self.events.items()):
            events.add_metric([event_type], n)
        yield events
        store = HistogramMetricFamily("agl_store_latency_seconds", "store operations by kind", labels=["op"])
        for op, h in sorted(self.store_latency.items()):
            store.add_metric([op], h.buckets(), h.sum)
        yield store

    def render(self) -> bytes:
        return generate_latest(self.registry)
