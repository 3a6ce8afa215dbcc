"""The standalone server process: `python -m agentlightning.torch_backend.server_cli`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from agentlightning.procs import ManagedProcess, free_port

pytestmark = pytest.mark.timeout(600)  # a hang guard, not a speed test: machines may be busy
MODULE = "agentlightning.torch_backend.server_cli"


def test_server_process_serves_the_demo_model(tmp_path: Path) -> None:
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        MODULE,
        "model=demo",
        f"port={port}",
        "torch_threads=1",
        "max_model_len=256",
    ]
    proc = ManagedProcess("torch-server", argv, tmp_path / "server.log").start()
    try:
        base = f"http://127.0.0.1:{port}"
        proc.wait_http_ok(f"{base}/health", timeout=90)
        models = httpx.get(f"{base}/v1/models", trust_env=False).json()["data"]
        assert models[0]["id"] == "policy" and models[0]["version"] == 0 and models[0]["max_model_len"] == 256
        r = httpx.post(
            f"{base}/v1/chat/completions",
            json={
                "model": "policy",
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 5,
                "return_token_ids": True,
                "ignore_eos": True,
            },
            timeout=30,
            trust_env=False,
        )
        assert r.status_code == 200 and len(r.json()["choices"][0]["token_ids"]) == 5
    finally:
        assert proc.stop() is not None


def test_bad_config_exits_2_naming_the_problem() -> None:
    r = subprocess.run(
        [sys.executable, "-m", MODULE, "dtype=float8"], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 2 and "dtype" in r.stderr
    r = subprocess.run(
        [sys.executable, "-m", MODULE, "port=notaport"], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 2 and "port" in r.stderr
