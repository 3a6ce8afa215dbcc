"""A checkpoint of ours written out as a model folder: full fine-tuning and LoRA (merged) give
the checkpoint's policy, the same logits as the policy the trainer held."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from agentlightning.evaluation.policies import PolicyError, export_checkpoint, parse_policy
from agentlightning.torch_backend.lora import adapter_state, apply_lora, lora_settings
from agentlightning.torch_backend.models import load_model
from agentlightning.trainer.checkpoint import mark_best_checkpoint

CPU = torch.device("cpu")


def checkpoint(folder: Path, weights: dict[str, torch.Tensor], lora_rank: int = 0) -> Path:
    """A `global_step_N` folder as the torch backend writes it (the parts export reads)."""
    folder.mkdir(parents=True)
    model = {"path": "demo", "lora_rank": lora_rank, "lora_alpha": 8, "target_modules": "all-linear"}
    config = {"actor_rollout_ref": {"model": model}, "agentlightning": {"seed": 3}}
    (folder / "loop_state.json").write_text(json.dumps({"step": 5, "config": config}))
    torch.save({"policy": {"model": weights, "steps": 5}, "rng": {}}, folder / "policy_state.pt")
    return folder


def logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([[5, 17, 42, 99, 7]])).logits


def test_full_checkpoint(tmp_path: Path) -> None:
    policy, _ = load_model("demo", CPU, torch.float32, seed=3)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.01 * torch.randn_like(p))  # "trained": not the base any more
    folder = checkpoint(tmp_path / "run" / "global_step_5", policy.state_dict())
    assert parse_policy(f"ck={tmp_path / 'run'}").source == str(folder)  # a run's folder: its latest
    best = checkpoint(tmp_path / "run" / "global_step_2", policy.state_dict())
    mark_best_checkpoint(tmp_path / "run", 2)
    assert parse_policy(f"ck={tmp_path / 'run'}").source == str(best)  # ... or the best it kept
    exported, _ = load_model(str(export_checkpoint(str(folder), tmp_path / "out")), CPU, torch.float32)
    torch.testing.assert_close(logits(exported), logits(policy))


def test_lora_checkpoint_is_merged(tmp_path: Path) -> None:
    policy, _ = load_model("demo", CPU, torch.float32, seed=3)
    base_logits = logits(policy)
    apply_lora(policy, lora_settings(4, 8, "all-linear"))
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.add_(0.05 * torch.randn_like(p))  # a trained adapter changes the outputs
    trained_logits = logits(policy)
    assert not torch.allclose(trained_logits, base_logits)
    folder = checkpoint(tmp_path / "global_step_5", adapter_state(policy), lora_rank=4)
    out = export_checkpoint(str(folder), tmp_path / "out")
    exported, _ = load_model(str(out), CPU, torch.float32)
    assert not any("lora" in k for k in exported.state_dict())  # a plain model folder
    torch.testing.assert_close(logits(exported), trained_logits, atol=1e-5, rtol=1e-5)


def test_a_checkpoint_whose_base_is_gone(tmp_path: Path) -> None:
    folder = tmp_path / "global_step_1"
    checkpoint(folder, {})
    state = json.loads((folder / "loop_state.json").read_text())
    state["config"]["actor_rollout_ref"]["model"]["path"] = str(tmp_path / "moved_away")
    (folder / "loop_state.json").write_text(json.dumps(state))
    with pytest.raises(PolicyError, match=r"base model .*moved_away .* is not there"):
        parse_policy(str(folder))
