"""Real vLLM for the tests: one server per test session, serving the scripted tool-calling model.

vLLM lives in its own venv (`.venv-vllm`, made by `make vllm` / `make test`). Where it is
missing or cannot import vLLM the tests here skip with the reason — except on CI (`CI` set),
where they fail: there they must run.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from agentlightning.torch_backend.vllm_server import VLLMServer, VLLMServerConfig
from tests.conftest import RunningGateway, start_gateway
from tests.vllm.available import vllm_python_or_skip

from .scripted import save_scripted_model

SERVED_NAME = "policy"


@pytest.fixture(scope="session")
def vllm_ready() -> str:
    """The interpreter that runs vLLM; skips (fails on CI) when there is none."""
    return vllm_python_or_skip()


@dataclass
class ScriptedVLLM:
    base_url: str
    model_dir: Path
    pid: int | None = None  # its API server's; None for a server named by AGL_TEST_VLLM_URL

    @property
    def endpoint(self) -> str:
        return f"{self.base_url}/v1"


@pytest.fixture(scope="session")
def vllm_server(vllm_ready: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ScriptedVLLM]:
    """One real vLLM OpenAI server (fp32, Hermes tool parser) for the whole session, streaming as
    it generates.

    Tests that reload other weights into it put the scripted weights back before they end.
    While developing, AGL_TEST_VLLM_URL and AGL_TEST_VLLM_MODEL_DIR name a server already
    running on the scripted model (`save_scripted_model`), to skip its start-up."""
    running = os.environ.get("AGL_TEST_VLLM_URL")
    if running:
        yield ScriptedVLLM(running.rstrip("/"), Path(os.environ["AGL_TEST_VLLM_MODEL_DIR"]))
        return
    scripted_model_dir = save_scripted_model(tmp_path_factory.mktemp("scripted") / "model")
    # Its engine core beside its worker: on two cores its busy-polling otherwise holds the API
    # server's streams back until a generation ends (docs/vllm.md).
    config = VLLMServerConfig(
        python=vllm_ready, dtype="float32", max_model_len=1024, engine_core_beside_worker=True
    )
    server = VLLMServer(scripted_model_dir, SERVED_NAME, config, tmp_path_factory.mktemp("vllm"))
    server.start()
    try:
        server.wait_ready()
        yield ScriptedVLLM(server.base_url, scripted_model_dir, server.pid)
    finally:
        server.stop()


@pytest.fixture(scope="module")
def vllm_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    """A real Gateway process (the model name `policy`, log-probs on train calls)."""
    gw = start_gateway(tmp_path_factory.mktemp("gateway"), "test-key")
    try:
        yield gw
    finally:
        gw.process.stop()
