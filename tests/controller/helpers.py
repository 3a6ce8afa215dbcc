"""Starting controllers and waiting for rollouts in the controller tests."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TypeVar

from agentlightning import launch
from agentlightning.client import GatewayClient
from agentlightning.launch import Service
from agentlightning.schemas import Rollout

T = TypeVar("T")
REPO = Path(__file__).resolve().parents[2]
TERMINAL = ("succeeded", "failed")


def start_controller(
    url: str,
    key: str,
    log_dir: Path,
    *overrides: str,
    name: str = "agl-controller",
    metrics_port: int | None = None,
) -> Service:
    """A real `agl-controller` process, serving its metrics; its own output goes to
    log_dir/../{name}-N.log."""
    n = len(list(log_dir.parent.glob(f"{name}-*.log")))
    return launch.start_controller(
        url,
        "local_runner.kill_grace_seconds=0.5",
        "resync_interval=0.5",
        "shutdown_timeout=10",
        *overrides,
        key=key,
        log_dir=log_dir,
        metrics_port=metrics_port,
        log_path=log_dir.parent / f"{name}-{n}.log",
        cwd=REPO,
        name=name,
    )


def wait_until(fn: Callable[[], T | None], timeout: float = 30.0, what: str = "condition") -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def wait_terminal(client: GatewayClient, ids: Iterable[str], timeout: float = 30.0) -> dict[str, Rollout]:
    """Until every rollout is succeeded or failed; returns them by id."""
    ids = list(ids)

    def check() -> dict[str, Rollout] | None:
        rollouts = {i: client.get_rollout(i).rollout for i in ids}
        return rollouts if all(r.status.state in TERMINAL for r in rollouts.values()) else None

    try:
        return wait_until(check, timeout, f"rollouts {ids} to finish")
    except AssertionError:
        states = {i: client.get_rollout(i).rollout.status.state.value for i in ids}
        raise AssertionError(f"rollouts did not finish in {timeout}s: {states}") from None


def file_text(path: Path) -> str:
    """`path`'s text, or "" while it is not there yet (for `wait_until`)."""
    return path.read_text() if path.exists() else ""


def pid_gone(pid: int) -> bool:
    return not pid_alive(pid)


def pid_alive(pid: int) -> bool:
    """True while the process exists and is not a zombie (an exited child nobody reaped yet)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    return stat[stat.rindex(")") + 2] not in "ZX"


def local_config(agent: str, **env_map: str) -> dict:
    return {"local": {"agent_class": agent, "env_map": env_map}}


# The Gateway waits for in-flight long-polls before it exits; a short cap keeps test teardown fast.
GATEWAY_OVERRIDES = ("long_poll_max_seconds=2",)


def start_gateway_at(
    tmp_path: Path, port: int, key: str, db: Path, module: str = "agentlightning.server"
) -> Service:
    """A Gateway on a given port (to restart it in place); `module` may be a compatible stand-in."""
    n = len(list(tmp_path.glob("gateway-at-*.log")))
    return launch.start_gateway(
        *GATEWAY_OVERRIDES,
        port=port,
        key=key,
        store_url=f"sqlite:///{db}",
        log_path=tmp_path / f"gateway-at-{n}.log",
        cwd=REPO,
        command=[sys.executable, "-m", module],
        name="gateway",
    )
