"""Fixtures shared by the whole suite: real Gateway processes on random loopback ports."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from _pytest.nodeid import coerce_node_id

from agentlightning.launch import Service
from agentlightning.launch import start_gateway as start_gateway_process
from agentlightning.procs import free_port
from agentlightning.schemas import Rollout
from tests import postgres
from tests.postgres import store_is_postgres

pytest_plugins = ("tests.cpu_profile",)  # AGL_CPU_PROFILE=1: CPU-seconds per test (tests/cpu_profile.py)

# Session fixtures whose tests all run on one worker, so that each is built once: the session's
# real vLLM server (~200 s to start), the demo's warm model (a minute of supervised warm-up).
GROUPED_FIXTURES = {"vllm_server": "vllm", "warm_demo_model": "demo"}


@pytest.hookimpl(tryfirst=True)  # before xdist's worker reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under `pytest -n N --dist loadgroup`: the tests on one of `GROUPED_FIXTURES` all run on one
    worker, so that it is built once; every other test goes to whichever worker is free (the vLLM
    tests that start servers of their own run beside them)."""
    # On an xdist worker, `--dist loadgroup` is read back as `config.option.loadgroup`.
    on_loadgroup_worker = bool(os.environ.get("PYTEST_XDIST_WORKER")) and getattr(
        config.option, "loadgroup", False
    )
    for item in items:
        names = getattr(item, "fixturenames", ())
        group = next((g for fixture, g in GROUPED_FIXTURES.items() if fixture in names), None)
        if group is None:
            continue
        item.add_marker(pytest.mark.xdist_group(group))
        if on_loadgroup_worker and "@" not in item.nodeid:
            # xdist 3.8 groups by an `@GROUP` suffix it writes to `item._nodeid`, which pytest 9
            # no longer reads (a node's id is `_id`): without this the group's tests went to any
            # worker, and each worker started the session's vLLM server (~200 s) again.
            item._id = coerce_node_id(f"{item.nodeid}@{group}")


def trainer_key(rollout: Rollout, key: str) -> Any:
    """A key the trainer writes into a rollout's metadata besides the declared ones (`run_id`,
    `index_in_group`); KeyError when it is not there."""
    return (rollout.metadata.model_extra or {})[key]


@dataclass
class RunningGateway:
    url: str
    key: str
    process: Service
    db_path: Path


def start_gateway(
    tmp_path: Path, key: str = "test-key", *overrides: str, db_path: Path | None = None
) -> RunningGateway:
    db = db_path or tmp_path / "gateway.db"
    store_url = f"sqlite:///{db}"
    if store_is_postgres():  # the Postgres pass: stores not chosen as SQLite on purpose go to Postgres
        store_url = postgres.database_for(db)
        overrides = tuple(o for o in overrides if o != "store.url=memory://")
    chosen = [o for o in overrides if o.startswith("store.url=")]
    if chosen:  # a store chosen by the test
        store_url = chosen[-1].removeprefix("store.url=")
        overrides = tuple(o for o in overrides if not o.startswith("store.url="))
    port = free_port()
    proc = start_gateway_process(
        *overrides, port=port, key=key, store_url=store_url, log_path=tmp_path / f"gateway-{port}.log"
    )
    return RunningGateway(proc.url, key, proc, db)


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
