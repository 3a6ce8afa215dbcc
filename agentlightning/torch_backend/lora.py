"""LoRA for the torch backend (peft): the adapter is what trains, checkpoints and publishes.

Configured with verl's keys, so one config serves both backends:

    actor_rollout_ref.model.lora_rank        0 = full fine-tuning (the default), else the adapter's rank
    actor_rollout_ref.model.lora_alpha       the scale is lora_alpha / lora_rank
    actor_rollout_ref.model.target_modules   "all-linear" (every linear layer but the output head),
                                             or a list of module names (e.g. [q_proj, v_proj])

`apply_lora` injects the adapter into the Hugging Face model in place and freezes the rest. The
policy update and the torch engine keep working on the plain Hugging Face model (the adapter's
layers inside it), so everything that takes a model takes this one; `PeftModel` is kept only to
write the adapter in peft's own layout (`save_pretrained`), which vLLM loads.

* Update: the optimizer only gets parameters with `requires_grad` — the adapter's; the base
  weights never change (bit for bit).
* Publish: `adapter_state` — the adapter's tensors only — into the serving copy
  (`TorchEngine.publish(..., partial=True)`), or as a peft folder into vLLM
  (`vllm_engine.VLLMEngine`).
* Checkpoint: the adapter only (`adapter_state`), plus `adapter/` in peft's layout; the base is
  rebuilt from `actor_rollout_ref.model.path` on resume (`full_state` completes the state dict).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from agentlightning.trainer.checkpoint import LORA_KEY

ADAPTER_NAME = "default"  # peft's name for the one adapter
BASE_LAYER = ".base_layer"  # peft renames a wrapped layer's own weights under it


@dataclass(frozen=True)
class LoraSettings:
    """The three `actor_rollout_ref.model` keys, checked."""

    rank: int
    alpha: float
    target_modules: str | tuple[str, ...]

    @property
    def enabled(self) -> bool:
        return self.rank > 0


def lora_settings(rank: Any, alpha: Any, target_modules: Any) -> LoraSettings:
    """Check the keys (ValueError naming the key) and return them typed."""
    prefix = "actor_rollout_ref.model"
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        raise ValueError(f"{prefix}.lora_rank must be an integer >= 0 (0: full fine-tuning), got {rank!r}")
    if isinstance(alpha, bool) or not isinstance(alpha, int | float) or alpha <= 0:
        raise ValueError(f"{prefix}.lora_alpha must be a number > 0, got {alpha!r}")
    targets: str | tuple[str, ...]
    if isinstance(target_modules, str) and target_modules:
        targets = target_modules
    elif (
        isinstance(target_modules, list | tuple)
        and target_modules
        and all(isinstance(t, str) and t for t in target_modules)
    ):
        targets = tuple(target_modules)
    else:
        raise ValueError(
            f"{prefix}.target_modules must be 'all-linear' or a non-empty list of module names, "
            f"got {target_modules!r}"
        )
    return LoraSettings(rank, float(alpha), targets)


def apply_lora(model: Any, settings: LoraSettings) -> Any:
    """Inject a fresh adapter into `model` (in place) and freeze everything else; returns the
    `PeftModel` around it. `peft_model.get_base_model()` is `model`, now with the adapter inside."""
    from peft import LoraConfig, get_peft_model

    targets = settings.target_modules
    config = LoraConfig(
        r=settings.rank,
        lora_alpha=settings.alpha,  # type: ignore[arg-type]  # peft annotates int; it scales by alpha / r
        target_modules=targets if isinstance(targets, str) else list(targets),
        lora_dropout=0.0,  # the served log-probs must equal the policy's: no dropout anywhere
        bias="none",
    )
    try:
        return get_peft_model(model, config, adapter_name=ADAPTER_NAME)
    except ValueError as exc:  # peft: "Target modules {...} not found in the base model"
        raise ValueError(f"actor_rollout_ref.model.target_modules: {exc}") from None


def adapter_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The adapter's tensors (the trainable ones), named as in `model.state_dict()`."""
    return {name: p.detach() for name, p in model.named_parameters() if LORA_KEY in name}


def base_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The frozen base's tensors under the plain model's names (no adapter, no `.base_layer`):
    what a server that applies the adapter itself (vLLM) loads as the base model."""
    return {name.replace(BASE_LAYER, ""): t for name, t in model.state_dict().items() if LORA_KEY not in name}


def full_state(model: torch.nn.Module, adapter: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`model`'s state dict with the adapter's tensors replaced by `adapter` (a checkpoint's):
    what `load_state_dict(strict=True)` takes. Every tensor of `adapter` must belong to `model`."""
    state = dict(model.state_dict())
    unknown = sorted(set(adapter) - set(state))
    if unknown:
        raise ValueError(
            f"the checkpoint's adapter does not fit this model (lora_rank / target_modules changed?): "
            f"{unknown[:3]}"
        )
    reshaped = sorted(k for k, t in adapter.items() if t.shape != state[k].shape)
    if reshaped:
        raise ValueError(
            f"the checkpoint's adapter does not fit this model (lora_rank changed?): {reshaped[0]} is "
            f"{tuple(adapter[reshaped[0]].shape)} in the checkpoint, {tuple(state[reshaped[0]].shape)} here"
        )
    missing = sorted(k for k in state if LORA_KEY in k and k not in adapter)
    if missing:
        raise ValueError(f"the checkpoint's adapter lacks tensors of this model's adapter: {missing[:3]}")
    state.update(adapter)
    return state


def save_adapter(peft_model: Any, folder: str | Path) -> Path:
    """The adapter in peft's layout (`adapter_config.json`, `adapter_model.safetensors`): what
    vLLM's `load_lora_adapter` and `PeftModel.from_pretrained` read."""
    folder = Path(folder)
    peft_model.save_pretrained(str(folder))
    return folder


def count_parameters(model: torch.nn.Module) -> tuple[int, int]:
    """(trainable, all) parameter counts."""
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return trainable, sum(p.numel() for p in model.parameters())
