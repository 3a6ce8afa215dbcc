"""Restart benchmark: rollouts survive a Gateway and a Controller killed with SIGKILL mid-batch.

A Gateway (SQLite store) and a Controller (local runner) serve a batch of rollouts whose agents
use the official `openai` client (bench/restarts_agent.py: it retries, and so does its reward
post); the fake vLLM-shaped model server answers. While the batch runs, the Gateway is
SIGKILLed and restarted on the same file and port `--gateway-kills` times, and the Controller
is SIGKILLed and restarted once (it adopts its running agents again from their pid files).
This script plays the trainer: it created the rollouts and waits for them.

It reports rollouts succeeded / failed / lost (created and acknowledged, but not terminal by
the deadline or gone from the store), and the failures' messages.

Usage: python bench/restarts.py [--rollouts 300] [--concurrency 16] [--gateway-kills 2]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from agentlightning.client import GatewayClient
from agentlightning.procs import ManagedProcess, free_port
from agentlightning.schemas import Model

REPO = Path(__file__).resolve().parent.parent
KEY = "restart-key"
AGENT = "bench.restarts_agent:RestartProofAgent"


def gateway(port: int, db: Path, logs: Path, n: int) -> ManagedProcess:
    argv = [
        sys.executable,
        "-m",
        "agentlightning.server",
        f"port={port}",
        f"key={KEY}",
        f"store.url=sqlite:///{db}",
        "log_level=warning",
    ]
    proc = ManagedProcess("agl-server", argv, logs / f"gateway-{n}.log", cwd=REPO).start()
    proc.wait_http_ok(f"http://127.0.0.1:{port}/healthz", timeout=120)
    return proc


def controller(url: str, logs: Path, concurrency: int, n: int) -> ManagedProcess:
    argv = [
        sys.executable,
        "-m",
        "agentlightning.controller",
        f"agl_server.url={url}",
        f"agl_server.key={KEY}",
        f"local_runner.maximum_size={concurrency}",
        f"local_runner.log_dir={logs / 'agents'}",
        "log_level=warning",
    ]
    return ManagedProcess("agl-controller", argv, logs / f"controller-{n}.log", cwd=REPO).start()


def states(client: GatewayClient, ids: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for start in range(0, len(ids), 100):
        for item in client.get_events_batch(ids[start : start + 100], event_type="reward"):
            out[item["rollout_id"]] = item["state"] if item["found"] else "gone"
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rollouts", type=int, default=300)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--gateway-kills", type=int, default=2)
    parser.add_argument("--deadline", type=float, default=900, help="seconds to wait for the batch")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="agl-restarts-") as tmp_dir:
        logs = Path(tmp_dir)
        port, fake_port = free_port(), free_port()
        url = f"http://127.0.0.1:{port}"
        db = logs / "gateway.db"
        fake = ManagedProcess(
            "fake-model",
            [sys.executable, "-m", "tests.fakes.model_server", "--port", str(fake_port), "--delay", "0.05"],
            logs / "fake.log",
            cwd=REPO,
        ).start()
        procs = {
            "gateway": gateway(port, db, logs, 0),
            "controller": controller(url, logs, args.concurrency, 0),
        }
        try:
            fake.wait_http_ok(f"http://127.0.0.1:{fake_port}/v1/models", timeout=60)
            with GatewayClient(url, KEY) as client:
                client.register_models([Model(model="policy", endpoint=f"http://127.0.0.1:{fake_port}/v1")])
                config = {
                    "timeout_seconds": 300,
                    "local": {"agent_class": AGENT, "env_map": {"QUESTION": "input.q"}},
                }
                ids = [f"r{i}" for i in range(args.rollouts)]
                created = client.create_rollouts(
                    [
                        {"rollout_id": rid, "input": {"q": f"{i}+{i}?"}, "config": config}
                        for i, rid in enumerate(ids)
                    ]
                )
                assert len(created) == len(ids)
                started = time.monotonic()
                # Kill points: by the share of the batch that is terminal.
                points = [((k + 1) / (args.gateway_kills + 2), "gateway") for k in range(args.gateway_kills)]
                points.insert(1 if points else 0, (0.45, "controller"))
                restarts = {"gateway": 0, "controller": 0}
                while True:
                    try:
                        now = states(client, ids)
                    except Exception:  # the Gateway is restarting: the client retried and gave up
                        time.sleep(0.5)
                        continue
                    done = sum(s in ("succeeded", "failed") for s in now.values())
                    if points and done >= points[0][0] * len(ids):
                        _, which = points.pop(0)
                        procs[which].kill()  # SIGKILL, whole process group
                        restarts[which] += 1
                        print(
                            f"  SIGKILL {which} at {done}/{len(ids)} terminal, t={time.monotonic() - started:.0f}s",
                            flush=True,
                        )
                        if which == "gateway":
                            procs[which] = gateway(port, db, logs, restarts[which])
                        else:
                            procs[which] = controller(url, logs, args.concurrency, restarts[which])
                        continue
                    if done == len(ids) or time.monotonic() - started > args.deadline:
                        break
                    time.sleep(0.5)
                final = states(client, ids)
                counts = Counter(final.get(rid, "gone") for rid in ids)
                lost = len(ids) - counts["succeeded"] - counts["failed"]
                print(
                    f"\n{len(ids)} rollouts, Gateway SIGKILLed {restarts['gateway']}x, Controller "
                    f"{restarts['controller']}x, in {time.monotonic() - started:.0f} s: "
                    f"succeeded {counts['succeeded']}, failed {counts['failed']}, lost {lost} {dict(counts)}"
                )
                failures = Counter(
                    (client.get_rollout(rid).rollout.status.error_message or "")[:160]
                    for rid in ids
                    if final.get(rid) == "failed"
                )
                for message, n in failures.most_common(5):
                    print(f"  failed x{n}: {message}")
        finally:
            for proc in (procs["controller"], procs["gateway"], fake):
                proc.stop()


if __name__ == "__main__":
    main()
