"""The `proxy:` config block: defaults, overrides, and bad values named at start-up."""

from __future__ import annotations

import pytest

from agentlightning.config.loader import load_cli_config
from agentlightning.server.config import load_server_config


def test_defaults_come_from_server_yaml() -> None:
    proxy = load_server_config(load_cli_config("server", [], prog="agl-server")).proxy
    assert (proxy.max_tries, proxy.backoff_seconds, proxy.max_backoff_seconds, proxy.jitter) == (
        6,
        0.5,
        8.0,
        0.25,
    )
    assert proxy.max_connections == 0, "no cap on upstream connections by default"


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("proxy.max_tries=0", "proxy.max_tries"),
        ("proxy.read_timeout_seconds=0", "proxy.read_timeout_seconds"),
        ("proxy.jitter=1.5", "proxy.jitter"),
        ("proxy.max_connections=-1", "proxy.max_connections"),
        ("proxy.token_stream_interval_ms=-5", "proxy.token_stream_interval_ms"),
    ],
)
def test_bad_values_fail_naming_the_key(override: str, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        load_server_config(load_cli_config("server", [override], prog="agl-server"))
