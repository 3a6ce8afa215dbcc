"""The console at the default level: no line per HTTP request (httpx logs one at info)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from agentlightning.log import CHATTY_LOGGERS, configure_logging


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
