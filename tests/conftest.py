"""Fixtures shared by the whole suite: real Gateway processes on random loopback ports."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from agentlightning.procs import ManagedProcess, free_port
from tests import postgres
from tests.postgres import store_is_postgres


@pytest.hookimpl(tryfirst=True)  # before xdist's worker reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under `pytest -n N --dist loadgroup`: a file's tests stay on one worker (its module
    fixtures start once), and so do all of tests/vllm (one real vLLM server for the session)."""
    root = Path(__file__).parent
    for item in items:
        parts = item.path.relative_to(root).parts
        group = "vllm" if parts[0] == "vllm" else "/".join(parts)
        item.add_marker(pytest.mark.xdist_group(group))


@dataclass
class RunningGateway:
    url: str
    key: str
    process: ManagedProcess
    db_path: Path


def start_gateway(
    tmp_path: Path, key: str = "test-key", *overrides: str, db_path: Path | None = None
) -> RunningGateway:
    port = free_port()
    db = db_path or tmp_path / "gateway.db"
    store_url = f"sqlite:///{db}"
    if store_is_postgres():  # the Postgres pass: stores not chosen as SQLite on purpose go to Postgres
        store_url = postgres.database_for(db)
        overrides = tuple(o for o in overrides if o != "store.url=memory://")
    argv = [
        sys.executable,
        "-m",
        "agentlightning.server",
        f"port={port}",
        f"key={key}",
        f"store.url={store_url}",
        *overrides,
    ]
    proc = ManagedProcess("agl-server", argv, tmp_path / f"gateway-{port}.log").start()
    url = f"http://127.0.0.1:{port}"
    try:
        proc.wait_http_ok(f"{url}/healthz")
    except Exception:
        proc.stop()
        raise
    return RunningGateway(url, key, proc, db)


@pytest.fixture
def gateway_factory(tmp_path: Path) -> Iterator[Callable[..., RunningGateway]]:
    """Start real `agl-server` processes; all are stopped at the end of the test."""
    started: list[RunningGateway] = []

    def factory(*overrides: str, key: str = "test-key", db_path: Path | None = None) -> RunningGateway:
        gw = start_gateway(tmp_path, key, *overrides, db_path=db_path)
        started.append(gw)
        return gw

    yield factory
    for gw in started:
        gw.process.stop()


@pytest.fixture
def gateway(gateway_factory: Callable[..., RunningGateway]) -> RunningGateway:
    return gateway_factory()
