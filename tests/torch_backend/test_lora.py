"""LoRA in the torch backend: only the adapter trains, publishes and is checkpointed; the base
stays bit-identical; the torch engine serves the adapter with the policy's own log-probs."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
from omegaconf import OmegaConf

from agentlightning.config.schema import ConfigError
from agentlightning.torch_backend.checkpoint import load_policy_state
from agentlightning.torch_backend.config import load_torch_backend_config
from agentlightning.torch_backend.engine import EngineError, SamplingParams, TorchEngine
from agentlightning.torch_backend.lora import (
    adapter_state,
    apply_lora,
    base_state,
    full_state,
    lora_settings,
)
from agentlightning.torch_backend.policy import ActorConfig, OptimConfig, PolicyUpdater
from agentlightning.torch_backend.rollout_engine import TorchRolloutEngine
from agentlightning.torch_backend.trainer import TorchBackend
from agentlightning.trainer.checkpoint import ADAPTER_DIR, LORA_KEY
from agentlightning.trainer.config import load_training_config
from agentlightning.trainer.shaping import set_loss_weights

from .test_policy import make_row, toy_rows, with_rollout_log_probs
from .tiny import fresh_copy

pytestmark = pytest.mark.timeout(600)  # a hang guard, not a speed test: machines may be busy
LORA = lora_settings(4, 8, "all-linear")


def lora_updater(tiny_model: Any, tokenizer: Any, lr: float = 1e-2) -> tuple[Any, PolicyUpdater]:
    model = fresh_copy(tiny_model, tokenizer)
    peft_model = apply_lora(model, LORA)
    return peft_model, PolicyUpdater(model, ActorConfig(optim=OptimConfig(lr=lr, weight_decay=0.1)))


def trained_once(updater: PolicyUpdater) -> None:
    rows = toy_rows()
    with_rollout_log_probs(updater, rows)
    set_loss_weights(rows)
    updater.update([rows])


def test_the_update_trains_the_adapter_only_and_the_base_stays_bit_identical(
    tiny_model: Any, tokenizer: Any
) -> None:
    _, updater = lora_updater(tiny_model, tokenizer)
    base_before = {k: v.clone() for k, v in base_state(updater.model).items()}
    adapter_before = {k: v.clone() for k, v in adapter_state(updater.model).items()}
    optimized = {id(p) for group in updater.optimizer.param_groups for p in group["params"]}
    assert optimized == {id(p) for n, p in updater.model.named_parameters() if LORA_KEY in n}
    # every linear layer of every block (q, k, v, o, gate, up, down) but the output head
    assert len(adapter_before) == 2 * 7 * tiny_model.config.num_hidden_layers

    trained_once(updater)
    trained_once(updater)  # a second step: weight decay and momentum have had their chance

    base_after = base_state(updater.model)
    assert base_after.keys() == tiny_model.state_dict().keys()  # the plain model's names
    for name, before in base_before.items():
        assert torch.equal(base_after[name], before), name
    changed = [k for k, v in adapter_state(updater.model).items() if not torch.equal(v, adapter_before[k])]
    assert len(changed) == len(adapter_before)


def test_an_adapter_publish_serves_the_policys_log_probs(tiny_model: Any, tokenizer: Any) -> None:
    _, updater = lora_updater(tiny_model, tokenizer)
    engine = TorchEngine(copy.deepcopy(updater.model), tokenizer, seed=0)
    try:
        trained_once(updater)
        assert engine.publish(adapter_state(updater.model), 1, partial=True) == 1
        prompts = [[3, 4, 5], [7, 8]]
        params = SamplingParams(max_tokens=12, temperature=1.0, seed=3, ignore_eos=True)
        served = engine.generate(prompts, params)
        rows = [
            make_row(f"r{i}", p, s.token_ids, 1.0)
            for i, (p, s) in enumerate(zip(prompts, served, strict=True))
        ]
        for lp, s in zip(updater.compute_log_probs(rows), served, strict=True):
            assert s.version == 1
            assert lp == pytest.approx(s.logprobs, abs=1e-4)
        # A tensor the served model does not have fails the publish and changes nothing.
        before = {k: v.clone() for k, v in engine.model.state_dict().items()}
        bad = {**adapter_state(updater.model), "model.nope.lora_A.default.weight": torch.zeros(1)}
        with pytest.raises(EngineError, match="not tensors of the served model"):
            engine.publish({k: v + 1 for k, v in bad.items()}, 2, partial=True)
        assert engine.version == 1
        for k, v in engine.model.state_dict().items():
            assert torch.equal(v, before[k]), k
    finally:
        engine.close()


def test_full_state_completes_an_adapter_and_rejects_one_that_does_not_fit(
    tiny_model: Any, tokenizer: Any
) -> None:
    _, updater = lora_updater(tiny_model, tokenizer)
    adapter = {k: torch.full_like(v, 0.5) for k, v in adapter_state(updater.model).items()}
    state = full_state(updater.model, adapter)
    assert state.keys() == updater.model.state_dict().keys()
    assert all(torch.equal(state[k], v) for k, v in adapter.items())
    with pytest.raises(ValueError, match="does not fit"):
        full_state(updater.model, {**adapter, "x.lora_A.default.weight": torch.zeros(1)})
    with pytest.raises(ValueError, match="lacks"):
        full_state(updater.model, dict(list(adapter.items())[1:]))


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("lora_rank", -1, "lora_rank must be an integer >= 0"),
        ("lora_rank", 2.5, "lora_rank"),
        ("lora_alpha", 0, "lora_alpha must be a number > 0"),
        ("target_modules", [], "target_modules must be"),
        ("target_modules", 3, "target_modules must be"),
    ],
)
def test_bad_lora_keys_fail_naming_the_key(key: str, value: Any, message: str) -> None:
    cfg = OmegaConf.create({"actor_rollout_ref": {"model": {"lora_rank": 8, key: value}}})
    with pytest.raises(ValueError, match=f"actor_rollout_ref.model.{message}"):
        load_torch_backend_config(cfg)


def test_verl_style_keys_are_read() -> None:
    cfg = OmegaConf.create(
        {"actor_rollout_ref": {"model": {"lora_rank": 8, "lora_alpha": 16, "target_modules": ["q_proj"]}}}
    )
    assert load_torch_backend_config(cfg).lora == lora_settings(8, 16.0, ["q_proj"])
    assert not load_torch_backend_config({}).lora.enabled  # 0: full fine-tuning, the default


def make_backend(tmp_path: Path, **model: Any) -> TorchBackend:
    cfg = OmegaConf.create(
        {
            "actor_rollout_ref": {
                "model": {"path": "demo", "lora_rank": 4, "lora_alpha": 8, **model},
                "actor": {"optim": {"lr": 1e-2}},
                "rollout": {"engine": "torch", "device": "cpu"},
            },
            "trainer": {"output_dir": str(tmp_path / "run"), "torch_threads": 0},
        }
    )
    return TorchBackend(load_training_config(cfg), load_torch_backend_config(cfg))


def test_the_backend_checkpoints_the_adapter_and_resumes_from_it(tmp_path: Path) -> None:
    first = make_backend(tmp_path)
    first.start(0, 0, 2, None)
    try:
        assert first.updater is not None
        trained_once(first.updater)
        first.publish(1)
        folder = tmp_path / "ckpt"
        folder.mkdir()
        first.save(folder)
        saved = adapter_state(first.updater.model)
        moments = first.updater.optimizer.state_dict()["state"]
    finally:
        first.close()

    policy = load_policy_state(folder)["policy"]
    assert set(policy["model"]) == set(saved)  # the adapter only, no base weights
    assert (folder / ADAPTER_DIR / "adapter_config.json").is_file()
    assert (folder / ADAPTER_DIR / "adapter_model.safetensors").is_file()

    second = make_backend(tmp_path)
    second.start(1, 1, 2, folder)
    try:
        assert second.updater is not None and isinstance(second.engine, TorchRolloutEngine)
        served = second.engine.engine
        assert served is not None and second.updater.steps == 1
        for k, v in adapter_state(second.updater.model).items():
            assert torch.equal(v, saved[k]), k
            assert torch.equal(served.model.state_dict()[k], v), k  # served from the start
        restored = second.updater.optimizer.state_dict()["state"]
        assert restored.keys() == moments.keys()
        assert all(torch.equal(restored[i]["exp_avg"], moments[i]["exp_avg"]) for i in moments)
    finally:
        second.close()

    other_rank = make_backend(tmp_path, lora_rank=2)
    try:
        with pytest.raises(ConfigError, match="lora_rank"):
            other_rank.start(1, 1, 2, folder)
    finally:
        other_rank.close()


def test_unknown_target_modules_fail_at_start(tmp_path: Path) -> None:
    backend = make_backend(tmp_path, target_modules=["no_such_proj"])
    try:
        with pytest.raises(ConfigError, match="target_modules"):
            backend.start(0, 0, 1, None)
    finally:
        backend.close()
