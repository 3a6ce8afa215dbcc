"""Start the Gateway (`agl-server`) and the Controller (`agl-controller`) as child processes.

The one place that builds their command lines: typed arguments for what callers set most, then
`overrides` (`key=value`, as on the command line). Each process gets its own process group, is
waited for until it answers (the Gateway's `/healthz`, the Controller's metrics port) within a
deadline, and is stopped by its pid: SIGTERM, then SIGKILL after a grace period.

    with start_gateway(key="k", store_url="memory://", log_path=tmp / "gw.log") as gateway:
        with start_controller(gateway.url, key="k", log_path=tmp / "ctl.log") as controller:
            ...
"""

from __future__ import annotations

import os
import ssl
import sys
from collections.abc import Mapping, Sequence
from types import TracebackType

from agentlightning.procs import ManagedProcess, free_port

PathLike = str | os.PathLike[str]


def gateway_command() -> list[str]:
    """`agl-server` in this interpreter."""
    return [sys.executable, "-m", "agentlightning.server"]


def controller_command() -> list[str]:
    """`agl-controller` in this interpreter."""
    return [sys.executable, "-m", "agentlightning.controller"]


class Service(ManagedProcess):
    """A started Gateway or Controller: `url`, `pid`, `stop()`; stopped when its `with` block ends."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_path: PathLike | None,
        url: str,
        env: Mapping[str, str] | None,
        cwd: PathLike | None,
        stop_grace: float,
    ) -> None:
        super().__init__(name, argv, log_path, env=env, cwd=cwd)
        self.url = url
        self.stop_grace = stop_grace

    def stop(self, timeout: float | None = None) -> int | None:
        """SIGTERM its process group, SIGKILL it `timeout` (default: `stop_grace`) seconds later."""
        return super().stop(self.stop_grace if timeout is None else timeout)

    def __enter__(self) -> Service:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def _argv(command: Sequence[str], settings: dict[str, object], overrides: Sequence[str]) -> list[str]:
    """`command key=value ...`: the typed settings that are set, then the overrides. An override of a
    key given as an argument is refused: which one would win is not obvious at the call site."""
    given = {k: v for k, v in settings.items() if v is not None}
    for override in overrides:
        key = override.partition("=")[0].strip()
        if key in given:
            raise ValueError(f"{override!r}: {key} is set by an argument of the launcher; pass it there")
    return [*command, *(f"{k}={v}" for k, v in given.items()), *overrides]


def _start(
    service: Service, ready_url: str, ready_timeout: float | None, verify: ssl.SSLContext | bool
) -> Service:
    service.start()
    if ready_timeout is None:
        return service
    try:
        service.wait_http_ok(ready_url, timeout=ready_timeout, verify=verify)
    except BaseException:
        service.stop()
        raise
    return service


def start_gateway(
    *overrides: str,
    port: int | None = None,
    host: str = "127.0.0.1",
    key: str | None = None,
    store_url: str | None = None,
    log_level: str | None = None,
    tls: tuple[PathLike, PathLike] | None = None,
    log_path: PathLike | None = None,
    env: Mapping[str, str] | None = None,
    cwd: PathLike | None = None,
    command: Sequence[str] | None = None,
    name: str = "agl-server",
    ready_timeout: float | None = 60.0,
    stop_grace: float = 10.0,
) -> Service:
    """An `agl-server` on `port` (a free one if None), answering `/healthz` before this returns.

    `tls`: (certfile, keyfile); the URL is then https:// and readiness trusts `certfile`.
    `command`: another compatible program (e.g. another venv's `agl-server`) instead of this one.
    `ready_timeout`: None to return at once (for a Gateway expected to refuse to start)."""
    port = free_port() if port is None else port
    settings: dict[str, object] = {
        "port": port,
        "host": host,
        "key": key,
        "store.url": store_url,
        "log_level": log_level,
        "tls.certfile": tls[0] if tls else None,
        "tls.keyfile": tls[1] if tls else None,
    }
    argv = _argv(gateway_command() if command is None else command, settings, overrides)
    reach = "127.0.0.1" if host in ("0.0.0.0", "") else host
    url = f"{'https' if tls else 'http'}://{reach}:{port}"
    verify: ssl.SSLContext | bool = ssl.create_default_context(cafile=str(tls[0])) if tls else True
    service = Service(name, argv, log_path, url, env, cwd, stop_grace)
    return _start(service, f"{url}/healthz", ready_timeout, verify)


def start_controller(
    gateway_url: str,
    *overrides: str,
    key: str | None = None,
    runner_type: str | None = None,
    log_dir: PathLike | None = None,
    max_agents: int | None = None,
    log_level: str | None = None,
    metrics_port: int | None = None,
    log_path: PathLike | None = None,
    env: Mapping[str, str] | None = None,
    cwd: PathLike | None = None,
    command: Sequence[str] | None = None,
    name: str = "agl-controller",
    ready_timeout: float | None = 60.0,
    stop_grace: float = 10.0,
) -> Service:
    """An `agl-controller` working for the Gateway at `gateway_url`, serving its metrics before this
    returns (on `metrics_port`, a free one if None; its `url` is that endpoint's).

    `log_dir`: the agents' logs (local_runner.log_dir); `max_agents`: local_runner.maximum_size.
    `ready_timeout`: None to return at once, without waiting for the metrics port."""
    metrics_port = free_port() if metrics_port is None else metrics_port
    if metrics_port < 0 and ready_timeout is not None:
        raise ValueError("metrics_port < 0 (off) leaves nothing to wait for: pass ready_timeout=None")
    settings: dict[str, object] = {
        "runner_type": runner_type,
        "agl_server.url": gateway_url,
        "agl_server.key": key,
        "local_runner.log_dir": log_dir,
        "local_runner.maximum_size": max_agents,
        "log_level": log_level,
        "metrics_port": metrics_port,
        "metrics_host": "127.0.0.1",
    }
    argv = _argv(controller_command() if command is None else command, settings, overrides)
    url = f"http://127.0.0.1:{metrics_port}"
    service = Service(name, argv, log_path, url, env, cwd, stop_grace)
    return _start(service, f"{url}/metrics", ready_timeout, True)


def torch_server_command() -> list[str]:
    """`agl-torch-server` in this interpreter."""
    return [sys.executable, "-m", "agentlightning.torch_backend.server_cli"]


def start_torch_server(
    model: str,
    *overrides: str,
    served_model_name: str = "policy",
    port: int | None = None,
    seed: int | None = None,
    torch_threads: int | None = None,
    log_level: str | None = None,
    log_path: PathLike | None = None,
    env: Mapping[str, str] | None = None,
    name: str = "agl-torch-server",
    ready_timeout: float | None = 300.0,
    stop_grace: float = 10.0,
) -> Service:
    """An `agl-torch-server` serving `model` (a Hugging Face folder or a built-in name), answering
    `/health` before this returns; its `url` is the OpenAI base (`http://127.0.0.1:PORT/v1`)."""
    port = free_port() if port is None else port
    settings: dict[str, object] = {
        "model": model,
        "served_model_name": served_model_name,
        "host": "127.0.0.1",
        "port": port,
        "seed": seed,
        "torch_threads": torch_threads,
        "log_level": log_level,
    }
    argv = _argv(torch_server_command(), settings, overrides)
    service = Service(name, argv, log_path, f"http://127.0.0.1:{port}/v1", env, None, stop_grace)
    return _start(service, f"http://127.0.0.1:{port}/health", ready_timeout, True)
