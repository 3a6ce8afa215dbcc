"""Fixtures shared by the whole suite: real Gateway processes on random loopback ports."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import structlog
from _pytest.mark.expression import Expression
from _pytest.nodeid import coerce_node_id

from agentlightning.launch import Service
from agentlightning.launch import start_gateway as start_gateway_process
from agentlightning.procs import free_port
from agentlightning.schemas import Rollout
from tests import postgres
from tests.postgres import store_is_postgres

pytest_plugins = ("tests.cpu_profile",)  # AGL_CPU_PROFILE=1: CPU-seconds per test (tests/cpu_profile.py)

TESTS = Path(__file__).resolve().parent

# What a test needs, marked by its folder: `heavy`, an environment besides .venv (vLLM, the examples'
# agents, v1.0.2, the coding CLIs: `make test-heavy`); `process`, whole processes started and waited on
# (end-to-end and training runs, a browser: left out of `make test-fast`). A test of whole processes in
# another folder says so itself (`pytestmark = pytest.mark.process`, or on the test). tests/verl runs in
# its own venv (tests/verl/conftest.py).
FOLDER_MARKERS = {
    "vllm": "heavy",
    "examples": "heavy",
    "compat": "heavy",
    "bench": "heavy",
    "verl": "heavy",  # in its own venv: `make test-verl`
    "e2e": "process",
    "dashboard": "process",
    "torch_backend": "process",
}


def folder_marker(path: Path) -> str | None:
    """The marker of the folder of tests/ that `path` is in (or is), if any."""
    parts, depth = path.resolve().parts, len(TESTS.parts)
    if parts[:depth] != TESTS.parts or len(parts) == depth:
        return None
    return FOLDER_MARKERS.get(parts[depth])


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """A folder that `-m` leaves out whatever its tests say is not imported at all: collecting the
    heavy folders alone is ~10 s of CPU a worker."""
    markexpr = config.option.markexpr
    marker = folder_marker(collection_path)
    if not markexpr or marker is None:
        return None
    expression = Expression.compile(markexpr)

    def selects(marks: set[str]) -> bool:
        def has(name: str, /, **_: str | int | bool | None) -> bool:
            return name in marks

        return expression.evaluate(has)

    # A test may add `process` itself: the folder is left out only if neither set of marks is selected.
    return None if selects({marker}) or selects({marker, "process"}) else True


@pytest.fixture(autouse=True, scope="session")
def loggers_not_cached() -> Iterator[None]:
    """`configure_logging` caches each logger on its first use (right for a service). In the test
    process, a command run in-process configures logging; a module's logger used then keeps that
    configuration, and once another test configures again, `structlog.testing.capture_logs` (which
    edits the configuration of the moment) no longer sees that logger. Here nothing is cached."""
    configure = structlog.configure

    def uncached(*args: Any, **kwargs: Any) -> None:
        configure(*args, **{**kwargs, "cache_logger_on_first_use": False})

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(structlog, "configure", uncached)
        yield


@pytest.fixture(autouse=True)
def logging_configuration_restored(loggers_not_cached: None) -> Iterator[None]:
    """A test that runs a command in-process leaves structlog configured at the command's level
    (`log_level=warning` filters out info lines before any processor): `capture_logs`, which swaps
    the processors only, then saw nothing in a later test on the same worker, depending on the
    order xdist gave. Each test ends with the configuration it started with."""
    before = structlog.get_config()
    yield
    structlog.configure(**before)


# Session fixtures whose tests all run on one worker, so that each is built once: the session's
# real vLLM server (~200 s to start), the demo's warm model (a minute of supervised warm-up).
GROUPED_FIXTURES = {"vllm_server": "vllm", "warm_demo_model": "demo"}


@pytest.hookimpl(tryfirst=True)  # before xdist's worker reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Each test gets its folder's marker (`FOLDER_MARKERS`) before `-m` selects.

    Under `pytest -n N --dist loadgroup`: the tests on one of `GROUPED_FIXTURES` all run on one
    worker, so that it is built once; every other test goes to whichever worker is free (the vLLM
    tests that start servers of their own run beside them)."""
    # On an xdist worker, `--dist loadgroup` is read back as `config.option.loadgroup`.
    on_loadgroup_worker = bool(os.environ.get("PYTEST_XDIST_WORKER")) and getattr(
        config.option, "loadgroup", False
    )
    with_xdist = config.pluginmanager.hasplugin("xdist")  # its marker is unknown under `-p no:xdist`
    give_unique_node_ids(items)
    for item in items:
        marker = folder_marker(item.path)
        if marker is not None:
            item.add_marker(marker)
        names = getattr(item, "fixturenames", ())
        group = next((g for fixture, g in GROUPED_FIXTURES.items() if fixture in names), None)
        if group is None or not with_xdist:
            continue
        item.add_marker(pytest.mark.xdist_group(group))
        if on_loadgroup_worker and "@" not in item.nodeid:
            # xdist 3.8 groups by an `@GROUP` suffix it writes to `item._nodeid`, which pytest 9
            # no longer reads (a node's id is `_id`): without this the group's tests went to any
            # worker, and each worker started the session's vLLM server (~200 s) again.
            item._id = coerce_node_id(f"{item.nodeid}@{group}")


def give_unique_node_ids(items: list[pytest.Item]) -> None:
    """schemathesis 4.32 gives each API operation's test the test function's node id (the operation
    is in its name only): xdist's `--dist loadgroup` keys its queue by node id and so ran one of the
    30 operations in `make test`. Such a test gets its name as its id; any node id still shared
    stops the collection, so that no test is lost again without a word."""
    counts = Counter(item.nodeid for item in items)
    for item in items:
        if counts[item.nodeid] > 1 and not item.nodeid.endswith(f"::{item.name}"):
            item._id = coerce_node_id(f"{item.nodeid.rsplit('::', 1)[0]}::{item.name}")
    shared = sorted(nodeid for nodeid, n in Counter(item.nodeid for item in items).items() if n > 1)
    if shared:
        raise pytest.UsageError(f"tests share node ids (xdist would run one of each): {shared[:5]}")


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
