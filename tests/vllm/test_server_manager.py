"""The vLLM server manager's own behaviour: models vLLM cannot serve are refused before any server
starts, a server that fails to start is reported with its log's tail, and nothing is left."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentlightning.procs import ProcessFailed
from agentlightning.tiny_model import TinyModelConfig, build_model, build_tokenizer
from agentlightning.torch_backend.config import TorchRolloutConfig, VLLMRolloutConfig
from agentlightning.torch_backend.vllm_engine import VLLMEngineError, check_servable, choose_engine
from agentlightning.torch_backend.vllm_server import VLLMServerConfig, VLLMServers

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
