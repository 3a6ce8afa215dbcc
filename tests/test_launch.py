"""The launcher: a real Gateway and Controller started, ready when it returns, stopped by pid."""

from __future__ import annotations

import signal
from pathlib import Path

import httpx
import pytest

from agentlightning.client import GatewayClient
from agentlightning.launch import start_controller, start_gateway
from agentlightning.procs import ProcessFailed
from tests.controller.helpers import pid_alive

pytestmark = pytest.mark.process  # whole processes, waited on: not in `make test-fast`


def test_gateway_and_controller_ready_on_return_and_stopped_by_their_context(tmp_path: Path) -> None:
    with start_gateway(key="k", store_url="memory://", log_path=tmp_path / "gw.log") as gateway:
        with GatewayClient(gateway.url, "k") as client:  # no wait: ready on return
            assert client.health()
        with start_controller(
            gateway.url, key="k", log_dir=tmp_path / "agents", log_path=tmp_path / "ctl.log"
        ) as ctl:
            assert httpx.get(f"{ctl.url}/metrics").status_code == 200
            controller_pid = ctl.pid
        assert not pid_alive(controller_pid)
        assert ctl.proc is not None and ctl.proc.returncode == 0  # SIGTERM, and it stopped cleanly
        assert "agl_server.url=" + gateway.url in ctl.argv
    # uvicorn re-raises the SIGTERM it handled; not SIGKILL: it stopped within the grace period
    assert gateway.proc is not None and gateway.proc.returncode == -signal.SIGTERM


def test_a_gateway_that_exits_at_start_up_fails_with_its_log(tmp_path: Path) -> None:
    with pytest.raises(ProcessFailed, match=r"store\.url"):
        start_gateway(store_url="mysql://x", log_path=tmp_path / "gw.log")


def test_an_override_of_an_argument_is_refused() -> None:
    with pytest.raises(ValueError, match="port is set by an argument"):
        start_gateway("port=1", port=2)
    with pytest.raises(ValueError, match=r"agl_server\.key is set by an argument"):
        start_controller("http://127.0.0.1:1", "agl_server.key=a", key="b")
