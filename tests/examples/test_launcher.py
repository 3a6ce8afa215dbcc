"""The examples' training entry point: config = train.yaml ← the example's block ← options ←
overrides, validated by the trainer core and the torch backend; a clear exit for a missing
verl backend."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
from omegaconf import OmegaConf

from agentlightning.torch_backend.config import load_torch_backend_config
from agentlightning.trainer.config import load_core_config, load_training_config
from tests.examples.stack import EXAMPLES


def _load(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


calc_x = _load(EXAMPLES / "calc_x" / "train_calc_agent.py", "train_calc_agent")
launcher = sys.modules["launcher"]  # what train_calc_agent imported
SAMPLE = str(EXAMPLES / "calc_x" / "data" / "sample.jsonl")


def config(*argv: str):
    args, overrides = launcher.parse_args(argv, "test")
    return launcher.build_config(calc_x.CALC_X, args, overrides, "test")


def test_calc_x_settings_on_the_base_config() -> None:
    cfg = config("--train-file", SAMPLE, "--val-file", SAMPLE, "--model", "/models/qwen", "--run-name", "r1")
    assert cfg.data.train_files == SAMPLE and cfg.data.val_files == SAMPLE
    assert (cfg.data.train_batch_size, cfg.data.max_prompt_length, cfg.data.max_response_length) == (
        32,
        4096,
        2048,
    )
    assert cfg.actor_rollout_ref.rollout.n == 4
    assert cfg.actor_rollout_ref.actor.use_kl_loss is False and cfg.algorithm.adv_estimator == "grpo"
    assert cfg.actor_rollout_ref.rollout.engine_kwargs.vllm.tool_call_parser == "hermes"
    assert cfg.actor_rollout_ref.model.path == "/models/qwen"
    assert cfg.trainer.experiment_name == "r1"
    agl = cfg.agentlightning
    assert agl.rollout_timeout_seconds == 300
    assert dict(agl.local.env_map) == {"QUESTION": "input.question", "RESULT": "input.result"}
    assert agl.local.agent_class == "calc_agent:CalcAgent"
    assert Path(agl.k8s.job_template_path) == EXAMPLES / "calc_x" / "job-template.yaml"
    assert cfg.actor_rollout_ref.actor.optim.weight_decay == 0.01  # train.yaml's default kept
    core = load_core_config(cfg)  # the trainer core and the torch backend accept it
    assert core.train_batch_size == 32 and core.rollout_n == 4
    assert "{{ input.question | yaml_escape }}" in (core.job_template() or "")
    load_torch_backend_config(cfg)
    load_training_config(cfg)


def test_async_keeps_twice_the_batch_in_flight() -> None:
    cfg = config("--train-file", SAMPLE, "--async")
    assert cfg.agentlightning.async_rollout.enabled is True
    assert cfg.agentlightning.async_rollout.async_train_batch_size == 64
    cfg = config("--train-file", SAMPLE, "--async", "data.train_batch_size=8")
    assert cfg.agentlightning.async_rollout.async_train_batch_size == 16
    cfg = config("--train-file", SAMPLE, "--async", "agentlightning.async_rollout.async_train_batch_size=40")
    assert cfg.agentlightning.async_rollout.async_train_batch_size == 40
    assert load_core_config(cfg).agl.async_rollout.async_train_batch_size == 40


def test_overrides_win_and_options_map_to_keys() -> None:
    cfg = config(
        "--train-file",
        SAMPLE,
        "--agl-base-url",
        "http://gw:9",
        "--agl-key",
        "k",
        "actor_rollout_ref.rollout.n=8",
    )
    assert cfg.actor_rollout_ref.rollout.n == 8
    assert (cfg.agentlightning.agl_base_url, cfg.agentlightning.agl_key) == ("http://gw:9", "k")


@pytest.mark.parametrize(
    "argv", [[], ["--train-file", SAMPLE, "--bogus"], ["--train-file", SAMPLE, "--backend", "jax"]]
)
def test_bad_arguments_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        config(*argv)
    assert exc.value.code == 2
    assert "usage:" in capsys.readouterr().err


CALLS: list[tuple[str, list[str]]] = []  # (backend, argv) the recorders below were called with


def record_torch(argv: list[str]) -> None:
    CALLS.append(("torch", argv))


def record_verl(argv: list[str]) -> None:
    CALLS.append(("verl", argv))


@pytest.mark.parametrize("backend", ["torch", "verl"])
def test_main_trains_through_agl_train_with_the_chosen_backend(
    backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agentlightning.commands.backends import BACKENDS

    monkeypatch.setitem(BACKENDS, "torch", f"{__name__}:record_torch")
    monkeypatch.setitem(BACKENDS, "verl", f"{__name__}:record_verl")
    CALLS.clear()
    argv = ["--train-file", SAMPLE, "--backend", backend, "--async", f"trainer.output_dir={tmp_path}"]
    launcher.main(calc_x.CALC_X, argv, prog="test")
    path = tmp_path / launcher.EFFECTIVE_CONFIG
    assert CALLS == [(backend, ["--config", str(path)])]
    # the file agl-train reads is the composed config: train.yaml <- the example <- options <- overrides
    written = OmegaConf.load(path)
    assert written.data.train_batch_size == 32 and written.data.train_files == SAMPLE
    assert written.agentlightning.async_rollout.async_train_batch_size == 64
    assert written.actor_rollout_ref.actor.optim.weight_decay == 0.01


@pytest.mark.parametrize("example", ["gsm8k", "openai_agents", "langgraph"])
def test_other_examples_configs_are_valid(example: str) -> None:
    module = _load(EXAMPLES / example / f"train_{example}_agent.py", f"train_{example}")
    block = next(
        v for k, v in vars(module).items() if k.isupper() and isinstance(v, dict) and "agentlightning" in v
    )
    args, overrides = launcher.parse_args(
        ["--train-file", str(EXAMPLES / example / "data" / "sample.jsonl")], "t"
    )
    cfg = launcher.build_config(block, args, overrides, "t")
    core = load_core_config(cfg)
    assert core.agl.local.agent_class is not None
    agent_module = core.agl.local.agent_class.split(":")[0]
    assert (EXAMPLES / example / f"{agent_module}.py").exists()
    assert set(core.agl.local.env_map) <= {"QUESTION", "ANSWER", "RESULT"}
