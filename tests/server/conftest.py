"""Fixtures of the Gateway's tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.fakes.model_server import FakeModelServer


@pytest.fixture(scope="module")
def scale_out_fake() -> Iterator[FakeModelServer]:
    """The fake model server with vLLM's scale-out endpoints: the Gateway takes its token path."""
    with FakeModelServer() as server:
        server.state.scale_out = True
        yield server
