"""The published Agent Lightning v1.0.2, installed in its own venv by `make .venv-v1/.installed`.

Its processes run from a scratch directory (never the repository, whose `agentlightning`
package would shadow v1.0's) with Hydra's output directory there too.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentlightning.procs import ManagedProcess, free_port

REPO = Path(__file__).resolve().parents[2]
V1_BIN = REPO / ".venv-v1" / "bin"
KEY = "compat-key"


@pytest.fixture(scope="session")
def v1_bin() -> Path:
    if not (V1_BIN / "agl-server").exists():
        reason = f"Agent Lightning v1.0.2 is not installed at {V1_BIN.parent}: run `make .venv-v1/.installed`"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    return V1_BIN


def v1_env() -> dict[str, str]:
    """The environment without anything that would put our package on v1.0's path."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}


def start_v1(v1_bin: Path, program: str, workdir: Path, *overrides: str) -> ManagedProcess:
    workdir.mkdir(parents=True, exist_ok=True)
    argv = [str(v1_bin / program), f"hydra.run.dir={workdir}", "hydra.output_subdir=null", *overrides]
    return ManagedProcess(
        f"v1-{program}", argv, workdir / f"{program}.log", env=v1_env(), cwd=workdir
    ).start()


class V1Gateway:
    def __init__(self, v1_bin: Path, workdir: Path, *overrides: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process = start_v1(
            v1_bin, "agl-server", workdir, "host=127.0.0.1", f"port={self.port}", f"key={KEY}", *overrides
        )
        try:
            self.process.wait_http_ok(f"{self.url}/healthz", timeout=90)
        except Exception:
            self.process.stop()
            raise


@pytest.fixture
def v1_gateway_factory(v1_bin: Path, tmp_path: Path) -> Iterator:
    started: list[V1Gateway] = []

    def factory(*overrides: str) -> V1Gateway:
        gw = V1Gateway(v1_bin, tmp_path / f"v1-gateway-{len(started)}", *overrides)
        started.append(gw)
        return gw

    yield factory
    for gw in started:
        gw.process.stop()
