"""The backend's one seam to what serves its rollouts: whatever `open_rollout_engine` returns is
started, published to and closed the same way; with LoRA it is handed the PeftModel."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from agentlightning.tiny_model import build_tiny
from agentlightning.torch_backend import trainer as trainer_module
from agentlightning.torch_backend.config import load_torch_backend_config
from agentlightning.torch_backend.models import BUILTIN_MODELS, is_builtin, model_builder
from agentlightning.torch_backend.rollout_engine import RolloutEngine
from agentlightning.torch_backend.trainer import TorchBackend
from agentlightning.trainer.config import load_training_config

pytestmark = pytest.mark.timeout(600)  # a hang guard, not a speed test: machines may be busy


class RecordingEngine:
    def __init__(self, **opened: Any) -> None:
        self.opened = opened
        self.calls: list[tuple[str, Any, int | None]] = []

    def start(self, policy: Any) -> list[str]:
        self.calls.append(("start", policy, None))
        return ["http://127.0.0.1:1/v1"]

    def publish(self, policy: Any, version: int) -> None:
        self.calls.append(("publish", policy, version))

    def close(self) -> None:
        self.calls.append(("close", None, None))


@pytest.mark.parametrize("lora_rank", [0, 4])
def test_the_backend_drives_any_engine_through_the_seam(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lora_rank: int
) -> None:
    engines: list[RecordingEngine] = []

    def open_engine(rollout: Any, **opened: Any) -> RolloutEngine:
        engines.append(RecordingEngine(**opened))
        return engines[-1]

    monkeypatch.setattr(trainer_module, "open_rollout_engine", open_engine)
    cfg = OmegaConf.create(
        {
            "actor_rollout_ref": {
                "model": {"path": "demo", "lora_rank": lora_rank},
                "rollout": {"engine": "torch", "device": "cpu"},
            },
            "trainer": {"output_dir": str(tmp_path / "run"), "torch_threads": 0},
        }
    )
    backend = TorchBackend(load_training_config(cfg), load_torch_backend_config(cfg))
    assert backend.start(3, 2, 5, None) == ["http://127.0.0.1:1/v1"]
    backend.publish(3)
    backend.close()
    backend.close()  # idempotent: the engine is closed once

    (engine,) = engines
    assert engine.opened["version"] == 2 and engine.opened["step"] == 3
    assert engine.opened["lora_rank"] == lora_rank
    assert backend.updater is not None
    served = backend.peft_model if lora_rank else backend.updater.model
    assert served is not None
    if lora_rank:
        assert served.get_base_model() is backend.updater.model  # the PeftModel around the policy
    assert engine.calls == [("start", served, None), ("publish", served, 3), ("close", None, None)]


def test_built_in_models_are_named_or_given_by_import_path() -> None:
    assert is_builtin("demo") and is_builtin("agentlightning.tiny_model:build_tiny")
    assert not is_builtin("/models/Qwen2.5-0.5B") and not is_builtin("Qwen/Qwen2.5-0.5B-Instruct")
    assert model_builder("demo") is BUILTIN_MODELS["demo"] is build_tiny
    assert model_builder("agentlightning.tiny_model:build_tiny") is build_tiny
    with pytest.raises(ValueError, match="no function"):
        model_builder("agentlightning.tiny_model:no_such_builder")
