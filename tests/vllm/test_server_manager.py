"""The vLLM server manager's own behaviour: models vLLM cannot serve are refused before any server
starts, a server that fails to start is reported with its log's tail, and nothing is left; the
engine core moved beside its worker."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentlightning.procs import ProcessFailed, descendants
from agentlightning.tiny_model import TinyModelConfig, build_model, build_tokenizer
from agentlightning.torch_backend.config import TorchRolloutConfig, VLLMRolloutConfig
from agentlightning.torch_backend.vllm_engine import VLLMEngineError, check_servable, choose_engine
from agentlightning.torch_backend.vllm_server import (
    ENGINE_CORE_NAME,
    WORKER_NAME,
    VLLMServerConfig,
    VLLMServers,
    engine_core_beside_worker,
)

from .conftest import ScriptedVLLM
from .helpers import process_group_alive

pytestmark = pytest.mark.timeout(600)


def test_models_vllm_cannot_serve_are_refused_with_the_reason() -> None:
    tokenizer = build_tokenizer()
    small_heads = build_model(
        TinyModelConfig(num_attention_heads=4, tie_word_embeddings=False), tokenizer=tokenizer
    )
    with pytest.raises(VLLMEngineError, match="head size of at least 32, this model has 16"):
        check_servable(small_heads)
    # A tied output head is fine: the engine serves it untied (its own copy on every publish).
    check_servable(
        build_model(TinyModelConfig(num_attention_heads=2, tie_word_embeddings=True), tokenizer=tokenizer)
    )


def test_a_server_that_fails_to_start_is_reported_with_its_log_tail(vllm_ready: str, tmp_path: Path) -> None:
    config = VLLMServerConfig(python=vllm_ready, start_timeout_seconds=600)
    # One server: a second runs the same start and fails the same way, for ~13 s more CPU (its
    # imports) and nothing more shown.
    servers = VLLMServers(tmp_path / "no-such-model", "policy", config, tmp_path / "vllm")
    with pytest.raises(ProcessFailed) as failed:
        servers.start()
    message = str(failed.value)
    assert "failed to start" in message and "no-such-model" in message
    assert str(tmp_path / "vllm" / "server0" / "server.log") in message
    assert all(not process_group_alive(pid) for pid in servers.pids)
    # Scratch space and caches went into the run's folder, not /tmp or ~/.cache.
    assert (tmp_path / "vllm" / "server0" / "tmp").is_dir() and (
        tmp_path / "vllm" / "server0" / "cache"
    ).is_dir()


def test_auto_engine_picks_vllm_only_for_a_large_servable_model_where_vllm_is_installed(
    vllm_ready: str,
) -> None:
    tokenizer = build_tokenizer()
    servable = build_model(
        TinyModelConfig(num_attention_heads=2, tie_word_embeddings=False), tokenizer=tokenizer
    )
    small_heads = build_model(TinyModelConfig(num_attention_heads=4), tokenizer=tokenizer)

    def rollout(min_params: int, python: str | None = vllm_ready) -> TorchRolloutConfig:
        return TorchRolloutConfig(vllm=VLLMRolloutConfig(python=python, auto_min_parameters=min_params))

    assert choose_engine("torch", "/m", servable, rollout(0)) == ("torch", "asked for")
    assert choose_engine("vllm", "/m", small_heads, rollout(0)) == (
        "vllm",
        "asked for",
    )  # refused later, by name
    assert choose_engine("auto", "demo", servable, rollout(0))[0] == "torch"
    engine, why = choose_engine("auto", "/m", servable, rollout(10**9))
    assert engine == "torch" and "torch engine is as fast" in why
    engine, why = choose_engine("auto", "/m", small_heads, rollout(0))
    assert engine == "torch" and "head size of at least 32" in why
    engine, why = choose_engine("auto", "/m", servable, rollout(0, python="/no/such/python"))
    assert engine == "torch" and "not installed" in why
    assert choose_engine("auto", "/m", servable, rollout(0))[0] == "vllm"


def test_the_engine_core_runs_on_its_workers_cores(vllm_server: ScriptedVLLM) -> None:
    """The session's server runs with `engine_core_beside_worker`: every thread of its engine
    core may run only where its worker is bound (and the cores are not all of the machine's,
    else nothing was moved)."""
    if vllm_server.pid is None:
        pytest.skip("a server named by AGL_TEST_VLLM_URL: its processes are not this session's")
    below = descendants(vllm_server.pid)
    (engine,) = [pid for pid, name in below.items() if name.startswith(ENGINE_CORE_NAME)]
    workers = [pid for pid, name in below.items() if name.startswith(WORKER_NAME)]
    cores = set().union(*(os.sched_getaffinity(pid) for pid in workers))
    assert workers and cores != os.sched_getaffinity(0)
    assert all(os.sched_getaffinity(int(t)) == cores for t in os.listdir(f"/proc/{engine}/task"))
    assert engine_core_beside_worker(vllm_server.pid) == cores  # moving it again changes nothing


def test_engine_core_beside_worker_on_a_process_that_is_not_vllm_says_what_it_found() -> None:
    # A parent and its child, both waiting for the end of the parent's stdin.
    script = "import subprocess, sys; subprocess.run([sys.executable, '-c', 'import sys; sys.stdin.read()'])"
    parent = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE)
    assert parent.stdin is not None
    try:
        with pytest.raises(
            RuntimeError, match="has no 'VLLM::EngineCor' or no 'VLLM::Worker' process below it"
        ):
            engine_core_beside_worker(parent.pid)
    finally:
        parent.stdin.close()  # both end
        parent.wait(timeout=60)
