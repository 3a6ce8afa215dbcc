"""The console at the default level: no line per HTTP request (httpx logs one at info); and, in
the test process, a logger stays visible to `capture_logs` whatever configured logging before."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from structlog.testing import capture_logs

from agentlightning.log import CHATTY_LOGGERS, configure_logging, get_logger


@pytest.fixture(autouse=True)
def _restore_levels() -> Iterator[None]:
    levels = {name: logging.getLogger(name).level for name in CHATTY_LOGGERS}
    yield
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)


@pytest.mark.parametrize(("level", "per_request"), [("info", False), ("warning", False), ("debug", True)])
def test_http_clients_log_each_request_only_at_debug(level: str, per_request: bool) -> None:
    configure_logging(level)
    assert logging.getLogger("httpx").isEnabledFor(logging.INFO) is per_request
    assert logging.getLogger("httpx").isEnabledFor(logging.WARNING)


def test_a_logger_used_between_two_configurations_is_still_captured() -> None:
    """tests/conftest.py's `loggers_not_cached`: a command run in-process configures logging, its
    modules log, another configures again; a later test's capture must still see those loggers."""
    log = get_logger("test")
    configure_logging("info")
    log.info("before")
    configure_logging("info")
    with capture_logs() as logs:
        log.info("captured")
    assert [e["event"] for e in logs] == ["captured"]
