"""The Controller's Prometheus metrics, served on `metrics_port` (`GET /metrics`).

Running agents are read when scraped; starts, failures by reason and start latency are
counted by the reconciler as attempts go.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

START_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
# Why an attempt failed, as a small fixed set of labels (the messages themselves go to the Gateway).
FAILURE_REASONS = ("launch", "timeout", "agent", "stopped")


class ControllerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        r = self.registry
        self.running = Gauge("agl_controller_running_agents", "agents this controller runs now", registry=r)
        self.starts = Counter("agl_controller_starts", "attempts started (agents launched)", registry=r)
        self.failures = Counter(
            "agl_controller_failures",
            "attempts that failed, by reason: launch (could not start), timeout, agent (it failed "
            "or died), stopped (the controller stopped it)",
            ["reason"],
            registry=r,
        )
        self.start_latency = Histogram(
            "agl_controller_start_latency_seconds",
            "time to launch an agent (process spawned or Job created)",
            buckets=START_BUCKETS,
            registry=r,
        )
        self.reported = Counter(
            "agl_controller_reported", "rollouts reported finished, by state", ["state"], registry=r
        )
        for reason in FAILURE_REASONS:
            self.failures.labels(reason)

    def track_running(self, count: Callable[[], int]) -> None:
        self.running.set_function(lambda: float(count()))

    def serve(self, port: int, host: str) -> int:
        """Serve `/metrics` from a thread; returns the port (useful when `port` is 0)."""
        server, _ = start_http_server(port, addr=host, registry=self.registry)
        return int(server.server_port)
