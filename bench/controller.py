"""Rollout Controller throughput: our local runner (warm fork server) against a fresh
interpreter per rollout (the v1.0 way, `local_runner.warm_start=false`), side by side in one run.

Each rollout runs a trivial agent: one chat call through the Gateway's proxy to the fake
vLLM-shaped model server, then one reward. Three agents: `TrivialAgent` (standard library only)
and two that import the `openai` package, as most agents do: `OpenAIAgent` builds its client in
run() (each rollout pays ~30 ms of CPU for a new TLS context), `SharedClientOpenAIAgent` builds
its HTTP client at import (paid once per warm process). For each agent and mode:

* rollouts/s: N rollouts created in one request, timed until the last one is terminal;
* start latency: single rollouts on an idle controller, from the Gateway's creation time to the
  first line of the agent's run();
* CPU per rollout of the controller and of the Gateway processes.

    .venv/bin/python bench/controller.py [--rollouts 400] [--fresh-rollouts 40] [--concurrency 32]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from agentlightning.client import GatewayClient  # noqa: E402
from agentlightning.launch import start_controller, start_gateway  # noqa: E402
from agentlightning.procs import ManagedProcess, free_port  # noqa: E402
from agentlightning.schemas import Model  # noqa: E402

KEY = "bench-key"
AGENTS = {
    "trivial (stdlib)": "bench.controller_agents:TrivialAgent",
    "openai, naive": "bench.controller_openai_agent:OpenAIAgent",
    "openai, shared": "bench.controller_openai_agent:SharedClientOpenAIAgent",
}


@dataclass
class Result:
    agent: str
    mode: str
    rollouts: int
    seconds: float
    latency_p50: float
    latency_max: float
    first_s: float
    controller_cpu_ms: float
    gateway_cpu_ms: float

    @property
    def rate(self) -> float:
        return self.rollouts / self.seconds


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process (Linux)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Waiter:
    """Follows the Gateway's terminal cursor (a long-poll) to see rollouts finish."""

    def __init__(self, client: GatewayClient) -> None:
        self.client = client
        self.after = client.terminal(0, limit=1).next_after
        self.after = self._drain()

    def _drain(self) -> int:
        after = self.after
        while True:
            page = self.client.terminal(after, limit=10000)
            if not page.items:
                return after
            after = page.next_after

    def wait(self, ids: Iterable[str], timeout: float = 600) -> dict[str, str]:
        pending, states = set(ids), {}
        deadline = time.monotonic() + timeout
        while pending:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(pending)} rollouts did not finish in {timeout}s")
            page = self.client.long_poll_terminal(self.after, wait_seconds=5, limit=10000).value
            self.after = page.next_after
            for item in page.items:
                if item.rollout_id in pending:
                    pending.discard(item.rollout_id)
                    states[item.rollout_id] = item.state.value
        return states


def start(name: str, argv: list[str], logs: Path, health: str | None = None) -> ManagedProcess:
    proc = ManagedProcess(name, argv, logs / f"{name}.log", cwd=REPO).start()
    if health:
        proc.wait_http_ok(health, timeout=60)
    return proc


def specs(agent_class: str, n: int, tag: str) -> list[dict]:
    config = {
        "timeout_seconds": 120,
        "local": {"agent_class": agent_class, "env_map": {"QUESTION": "input.q"}},
    }
    return [
        {"rollout_id": f"{tag}-{i}", "input": {"q": f"what is {i} plus {i}?"}, "config": config}
        for i in range(n)
    ]


def run_mode(
    client: GatewayClient,
    waiter: Waiter,
    gateway: ManagedProcess,
    url: str,
    logs: Path,
    agent: str,
    mode: str,
    n: int,
    concurrency: int,
    latency_samples: int = 10,
) -> Result:
    tag = f"{mode}-{AGENTS[agent].rsplit(':', 1)[1]}-{time.time_ns()}"
    controller = start_controller(
        url,
        f"local_runner.warm_start={'true' if mode == 'warm' else 'false'}",
        key=KEY,
        max_agents=concurrency,
        log_dir=logs / tag,
        log_level="warning",
        log_path=logs / f"controller-{tag}.log",
        cwd=REPO,
    )
    try:
        # The first rollout pays the warm process's import once; then one batch warms caches.
        first_started = time.perf_counter()
        client.create_rollouts(specs(AGENTS[agent], 1, f"{tag}-first"))
        waiter.wait([f"{tag}-first-0"])
        first_s = time.perf_counter() - first_started
        warm_up = specs(AGENTS[agent], min(concurrency, n), f"{tag}-warmup")
        client.create_rollouts(warm_up)
        waiter.wait(s["rollout_id"] for s in warm_up)

        latencies = []
        for spec in specs(AGENTS[agent], latency_samples, f"{tag}-latency"):
            [rollout] = client.create_rollouts([spec])
            waiter.wait([rollout.rollout_id])
            [reward] = client.get_events(rollout.rollout_id, event_type="reward")
            latencies.append(reward.data["started"] - rollout.status.created_at)

        batch = specs(AGENTS[agent], n, f"{tag}-batch")
        cpu_before = cpu_seconds(controller.pid), cpu_seconds(gateway.pid)
        started = time.perf_counter()
        client.create_rollouts(batch)
        states = waiter.wait(s["rollout_id"] for s in batch)
        seconds = time.perf_counter() - started
        cpu_after = cpu_seconds(controller.pid), cpu_seconds(gateway.pid)
        failed = [rid for rid, state in states.items() if state != "succeeded"]
        if failed:
            detail = client.get_rollout(failed[0]).rollout.status.error_message
            raise RuntimeError(
                f"{len(failed)} of {n} rollouts failed in {mode} mode, e.g. {failed[0]}: {detail}"
            )
        for spec in batch[:: max(1, n // 5)]:  # each made its model call and its reward, in one attempt
            kinds = [e.event_type for e in client.get_events(spec["rollout_id"])]
            assert kinds == ["model_request", "reward"], kinds
        return Result(
            agent,
            mode,
            n,
            seconds,
            statistics.median(latencies),
            max(latencies),
            first_s,
            (cpu_after[0] - cpu_before[0]) / n * 1000,
            (cpu_after[1] - cpu_before[1]) / n * 1000,
        )
    finally:
        controller.stop()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rollouts", type=int, default=400, help="rollouts per warm-start run")
    parser.add_argument("--fresh-rollouts", type=int, default=40, help="rollouts per fresh-interpreter run")
    parser.add_argument("--concurrency", type=int, default=32, help="local_runner.maximum_size")
    parser.add_argument("--store", default="sqlite", choices=["sqlite", "memory"], help="the Gateway's store")
    parser.add_argument("--smoke", action="store_true", help="a few seconds, tiny sizes: that it runs")
    args = parser.parse_args()
    agents = AGENTS
    if args.smoke:  # one agent, a handful of rollouts each way
        agents = dict(list(AGENTS.items())[:1])
        args.rollouts, args.fresh_rollouts, args.concurrency = 4, 2, 2

    logs = Path(tempfile.mkdtemp(prefix="agl-bench-controller-"))
    model_port, gateway_port = free_port(), free_port()
    url = f"http://127.0.0.1:{gateway_port}"
    store = f"sqlite:///{logs / 'gateway.db'}" if args.store == "sqlite" else "memory://"
    processes: list[ManagedProcess] = []
    try:
        processes.append(
            start(
                "model",
                [sys.executable, "-m", "tests.fakes.model_server", "--port", str(model_port)],
                logs,
                f"http://127.0.0.1:{model_port}/health",
            )
        )
        gateway = start_gateway(
            port=gateway_port,
            key=KEY,
            store_url=store,
            log_path=logs / "gateway.log",
            cwd=REPO,
        )
        processes.append(gateway)
        results: list[Result] = []
        with GatewayClient(url, KEY, timeout=120) as client:
            client.register_models([Model(model="policy", endpoint=f"http://127.0.0.1:{model_port}/v1")])
            waiter = Waiter(client)
            for agent in agents:
                for mode, n in (("warm", args.rollouts), ("fresh", args.fresh_rollouts)):
                    samples = 2 if args.smoke else 10
                    result = run_mode(
                        client, waiter, gateway, url, logs, agent, mode, n, args.concurrency, samples
                    )
                    results.append(result)
                    print(
                        f"  done: {agent:17s} {mode:5s} {result.rate:7.1f} rollouts/s",
                        file=sys.stderr,
                        flush=True,
                    )
    finally:
        for proc in reversed(processes):
            proc.stop()

    print(
        f"\nRollout Controller, local runner: {os.cpu_count()} CPUs, concurrency {args.concurrency}, "
        f"Gateway store {args.store}; logs in {logs}"
    )
    header = (
        f"{'agent':18s} {'mode':6s} {'rollouts':>8s} {'seconds':>8s} {'rollouts/s':>10s} "
        f"{'start p50':>10s} {'start max':>10s} {'1st rollout':>11s} {'ctl CPU/r':>10s} {'gw CPU/r':>9s}"
    )
    print(header)
    print("-" * len(header))
    for r in results:
        print(
            f"{r.agent:18s} {r.mode:6s} {r.rollouts:8d} {r.seconds:8.2f} {r.rate:10.1f} "
            f"{r.latency_p50 * 1000:8.0f}ms {r.latency_max * 1000:8.0f}ms {r.first_s:10.2f}s "
            f"{r.controller_cpu_ms:8.1f}ms {r.gateway_cpu_ms:7.1f}ms"
        )
    print()
    by = {(r.agent, r.mode): r for r in results}
    for agent in agents:
        warm, fresh = by[(agent, "warm")], by[(agent, "fresh")]
        print(
            f"{agent:18s} warm start is {warm.rate / fresh.rate:5.1f}x the fresh interpreter ({warm.rate:.1f} vs {fresh.rate:.1f} rollouts/s)"
        )
    print(
        "\nstart: Gateway creation time -> the agent's run() begins (idle controller). 1st rollout: the first"
        "\nrollout of a new controller, including the warm process's import. CPU/r: CPU seconds of the"
        "\ncontroller and Gateway processes per rollout during the timed batch (agents not included)."
    )


if __name__ == "__main__":
    main()
