"""The real `agl-server` process: CLI config, auth, and durability across SIGKILL."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from agentlightning.client import AsyncGatewayClient, GatewayClient, Unauthorized
from agentlightning.procs import ManagedProcess, free_port
from tests.conftest import RunningGateway

pytestmark = pytest.mark.process  # whole processes, waited on: not in `make test-fast`


def run_cli(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agentlightning.server", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_cli_overrides_as_in_the_issue(tmp_path: Path) -> None:
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "agentlightning.server",
        f"port={port}",
        "key=dummy",
        "default_proxy.model_name=Qwen/Qwen2.5-1.5B-Instruct",
        f"store.url=sqlite:///{tmp_path / 'g.db'}",
    ]
    proc = ManagedProcess("agl-server", argv, tmp_path / "log").start()
    try:
        proc.wait_http_ok(f"http://127.0.0.1:{port}/healthz")
        with GatewayClient(f"http://127.0.0.1:{port}", key="dummy") as c:
            assert c.list_rollouts() == []
        with GatewayClient(f"http://127.0.0.1:{port}", key="wrong") as c, pytest.raises(Unauthorized):
            c.list_rollouts()
        assert "Qwen/Qwen2.5-1.5B-Instruct" in proc.log_tail()
    finally:
        proc.stop()
    assert (tmp_path / "g.db").exists()


def test_cli_rejects_bad_config_naming_the_key() -> None:
    r = run_cli("port=notanumber")
    assert r.returncode == 2 and "port" in r.stderr
    r = run_cli("colour=red")
    assert r.returncode == 2 and "colour" in r.stderr
    r = run_cli("store.url=mysql://x")
    assert r.returncode == 2 and "store.url" in r.stderr
    r = run_cli("store.url=postgresql://127.0.0.1:1/agl")  # a database it cannot reach: said, not served
    assert r.returncode != 0 and "cannot reach the database" in r.stderr
    r = run_cli("--bogus")
    assert r.returncode == 2 and "--bogus" in r.stderr


def test_cli_help_lists_the_defaults() -> None:
    r = run_cli("--help")
    assert r.returncode == 0 and "default_proxy" in r.stdout and "store" in r.stdout


def test_cli_config_file_then_overrides(tmp_path: Path) -> None:
    cfg = tmp_path / "gw.yaml"
    port = free_port()
    cfg.write_text(f"port: 1\nkey: from-file\nstore:\n  url: sqlite:///{tmp_path / 'f.db'}\n")
    argv = [sys.executable, "-m", "agentlightning.server", "--config", str(cfg), f"port={port}"]
    proc = ManagedProcess("agl-server", argv, tmp_path / "log").start()
    try:
        proc.wait_http_ok(f"http://127.0.0.1:{port}/healthz")
        with GatewayClient(f"http://127.0.0.1:{port}", key="from-file") as c:
            assert c.list_rollouts() == []
    finally:
        proc.stop()


def test_empty_key_disables_auth_with_a_warning(gateway_factory: Callable[..., RunningGateway]) -> None:
    gw = gateway_factory(key="")
    with GatewayClient(gw.url) as c:
        assert c.create_rollouts([{"rollout_id": "open"}])[0].rollout_id == "open"
    assert "auth_disabled" in gw.process.log_tail()


def test_second_server_on_the_same_file_refuses_to_start(gateway: RunningGateway, tmp_path: Path) -> None:
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "agentlightning.server",
        f"port={port}",
        f"store.url=sqlite:///{gateway.db_path}",
    ]
    proc = ManagedProcess("agl-server-2", argv, tmp_path / "second.log").start()
    assert proc.proc is not None and proc.proc.wait(30) != 0
    assert "another process" in proc.log_tail()


def test_acknowledged_writes_survive_sigkill(
    gateway_factory: Callable[..., RunningGateway], tmp_path: Path
) -> None:
    gw = gateway_factory()
    n_rollouts, n_events = 40, 25

    async def write() -> None:
        async with AsyncGatewayClient(gw.url, key=gw.key) as c:
            await c.create_rollouts([{"rollout_id": f"r{i}", "input": {"i": i}} for i in range(n_rollouts)])
            await c.register_models([{"model": "policy", "endpoint": "http://m/v1", "version": 7}])
            await asyncio.gather(
                *(
                    c.post_event(f"r{i}", "a1", "model_request", {"i": i, "j": j, "blob": "x" * 2000})
                    for i in range(n_rollouts)
                    for j in range(n_events)
                )
            )
            for i in range(0, n_rollouts, 2):
                await c.patch_rollout(f"r{i}", state="running", last_attempt_id="a1")
                await c.patch_rollout(f"r{i}", state="succeeded")
            await c.post_run_metrics("exp", [{"step": 1, "metrics": {"training/reward": 0.5}}])

    asyncio.run(write())
    gw.process.kill()  # SIGKILL right after the last acknowledgement: no shutdown, no flush
    restarted = gateway_factory(db_path=gw.db_path)
    with GatewayClient(restarted.url, key=restarted.key) as c:
        rollouts = c.list_rollouts(limit=1000)
        assert len(rollouts) == n_rollouts
        assert sum(r.status.state == "succeeded" for r in rollouts) == n_rollouts // 2
        assert c.terminal().total_terminal == n_rollouts // 2
        assert c.list_models()[0].version == 7
        # the dashboard's views are in the store too: the history and the training curve
        detail = httpx.get(
            f"{restarted.url}/api/dashboard/rollouts/r0", headers={"x-api-key": restarted.key}
        ).json()
        assert [h["state"] for h in detail["history"]] == ["queuing", "running", "succeeded"]
        runs = httpx.get(f"{restarted.url}/api/runs/exp/metrics", headers={"x-api-key": restarted.key}).json()
        assert [p["metrics"] for p in runs["points"]] == [{"training/reward": 0.5}]
        for i in range(n_rollouts):
            events = c.get_events(f"r{i}")
            assert sorted(e.data["j"] for e in events) == list(range(n_events)), i


def test_sigterm_does_not_wait_for_long_polls(gateway: RunningGateway) -> None:
    def hold() -> None:
        with GatewayClient(gateway.url, key=gateway.key) as c:
            try:
                c.long_poll_rollouts(["queuing"], wait_seconds=60)
            except Exception:
                pass  # the server went away under it

    waiter = threading.Thread(target=hold, daemon=True)
    waiter.start()
    time.sleep(0.5)
    start = time.monotonic()
    assert gateway.process.proc is not None
    gateway.process.signal_group(signal.SIGTERM)
    gateway.process.proc.wait(30)
    assert time.monotonic() - start < 10


def test_a_clean_shutdown_answers_long_polls_and_logs_no_traceback(gateway: RunningGateway) -> None:
    """SIGTERM during a long-poll: the poll answers (an empty page, 200) instead of being cancelled
    when the grace period ends, which uvicorn logged as an error with a traceback."""
    sent = threading.Event()
    outcome: list[object] = []

    def poll() -> None:
        hooks = {"request": [lambda request: sent.set()]}
        with httpx.Client(base_url=gateway.url, event_hooks=hooks, timeout=60) as http:
            try:
                outcome.append(
                    http.get(
                        "/api/rollouts",
                        params={"state_in": "queuing", "wait_seconds": 60},
                        headers={"Authorization": f"Bearer {gateway.key}"},
                    )
                )
            except httpx.HTTPError as exc:
                outcome.append(exc)

    waiter = threading.Thread(target=poll, daemon=True)
    waiter.start()
    assert sent.wait(30)
    # The event loop serves connections in order: once this answers, the poll has been read too.
    assert httpx.get(f"{gateway.url}/healthz", timeout=30).status_code == 200
    assert gateway.process.proc is not None
    gateway.process.signal_group(signal.SIGTERM)
    gateway.process.proc.wait(30)  # uvicorn re-raises the SIGTERM once it has shut down
    waiter.join(30)
    response = outcome[0]
    assert isinstance(response, httpx.Response), response
    assert response.status_code == 200 and response.json() == []
    log = gateway.process.log_tail(lines=10_000)
    assert "Traceback" not in log and "ERROR" not in log, log
