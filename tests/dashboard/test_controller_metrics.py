"""The Controller's `GET /metrics` (metrics_port), parsed with prometheus-client's text parser,
after a real controller ran real agents: starts, failures by reason, reports, running agents."""

from __future__ import annotations

import uuid
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from agentlightning.client import GatewayClient
from agentlightning.procs import free_port
from tests.conftest import start_gateway
from tests.controller.helpers import (
    GATEWAY_OVERRIDES,
    local_config,
    start_controller,
    wait_terminal,
    wait_until,
)

KEY = "ctl-metrics-key"
AGENTS = "tests.controller.agents"


Metrics = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(url: str) -> Metrics:
    text = httpx.get(url, timeout=10).text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_controller_metrics_count_what_it_ran(tmp_path: Path) -> None:
    gw = start_gateway(tmp_path, KEY, *GATEWAY_OVERRIDES)
    port = free_port()
    controller = start_controller(
        gw.url, KEY, tmp_path / "logs", "local_runner.warm_start=false", metrics_port=port
    )
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        wait_until(lambda: _up(url), 60, "the controller's metrics port")
        with GatewayClient(gw.url, KEY) as client:
            ids = {
                kind: [f"{kind}-{uuid.uuid4().hex[:8]}" for _ in range(n)]
                for kind, n in (("ok", 2), ("crash", 1))
            }
            agents = {"ok": f"{AGENTS}.RewardAgent", "crash": f"{AGENTS}.CrashAgent"}
            client.create_rollouts(
                [
                    {"rollout_id": r, "input": {}, "config": local_config(agents[kind])}
                    for kind, rs in ids.items()
                    for r in rs
                ]
            )
            done = wait_terminal(client, [r for rs in ids.values() for r in rs], timeout=120)
        assert [done[r].status.state for r in ids["ok"]] == ["succeeded", "succeeded"]
        assert done[ids["crash"][0]].status.state == "failed"

        def counted() -> Metrics | None:
            s = scrape(url)
            return s if s[("agl_controller_reported_total", (("state", "failed"),))] == 1 else None

        m = wait_until(counted, 30, "the last report to be counted")
        assert m[("agl_controller_starts_total", ())] == 3
        assert m[("agl_controller_start_latency_seconds_count", ())] == 3
        assert m[("agl_controller_failures_total", (("reason", "agent"),))] == 1
        assert m[("agl_controller_failures_total", (("reason", "launch"),))] == 0
        assert m[("agl_controller_failures_total", (("reason", "timeout"),))] == 0
        assert m[("agl_controller_reported_total", (("state", "succeeded"),))] == 2
        assert m[("agl_controller_running_agents", ())] == 0
    finally:
        controller.stop()
        gw.process.stop()


def _up(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
