"""What a policy to evaluate is, checked before anything starts, and how it is served.

A policy is given as `NAME=SOURCE` (or `SOURCE`, named after it), SOURCE one of:

* a checkpoint of ours: a `global_step_N` folder of a training run (full fine-tuning or LoRA;
  the base model is the run's `actor_rollout_ref.model.path`, read from the checkpoint), or a
  run's checkpoints folder (the best checkpoint it kept, else its latest complete one);
* a Hugging Face model folder (`config.json`);
* a built-in model by name (`demo`: the demo's tiny model, random init);
* an OpenAI-compatible endpoint, `http(s)://host:port/v1` (e.g. a vLLM server you run): it
  must answer `GET /models` when the eval starts.

A checkpoint is written out once as a Hugging Face folder (LoRA merged into the base) in the
eval's own folder, so both engines (the built-in torch server, vLLM) serve it as they serve
any model folder.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import httpx

from agentlightning.trainer.checkpoint import (
    LATEST_FILE,
    LOOP_STATE_FILE,
    POLICY_STATE_FILE,
    best_checkpoint,
    latest_checkpoint,
)

BUILTIN = ("demo",)  # torch_backend.models.BUILTIN_MODELS's names
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")

Kind = Literal["checkpoint", "hf", "builtin", "endpoint"]


class PolicyError(ValueError):
    """A policy that cannot be evaluated, and why."""


@dataclass(frozen=True)
class Policy:
    name: str
    kind: Kind
    source: str  # the folder (absolute), the built-in name, or the endpoint URL

    def describe(self) -> str:
        return f"{self.name} ({self.kind} {self.source})"


def parse_policy(spec: str) -> Policy:
    """`NAME=SOURCE` or `SOURCE`, checked: PolicyError naming what is wrong."""
    name, sep, source = spec.partition("=")
    if not sep or "://" in name:
        name, source = "", spec
    source = source.strip()
    if not source:
        raise PolicyError(f"policy {spec!r}: no source (expected NAME=SOURCE or SOURCE)")
    kind, resolved = _classify(spec, source)
    name = name.strip() or _default_name(kind, resolved)
    if not NAME.match(name):
        raise PolicyError(
            f"policy {spec!r}: the name {name!r} must be 1-64 letters, digits, '_', '.' or '-' "
            "(give one as NAME=SOURCE)"
        )
    return Policy(name, kind, resolved)


def _default_name(kind: Kind, source: str) -> str:
    if kind in ("builtin", "endpoint"):
        return re.sub(r"[^A-Za-z0-9_.-]+", "-", source.split("://")[-1]).strip("-")[:64] or "policy"
    path = Path(source)
    name = f"{path.parent.parent.name}-{path.name}" if path.name.startswith("global_step_") else path.name
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-")[:64] or "policy"


def _classify(spec: str, source: str) -> tuple[Kind, str]:
    if source.startswith(("http://", "https://")):
        return "endpoint", source.rstrip("/")
    if source in BUILTIN:
        return "builtin", source
    path = Path(source).expanduser()
    if not path.exists():
        raise PolicyError(
            f"policy {spec!r}: {source} does not exist (expected a checkpoint folder, a Hugging Face "
            f"model folder, an http(s):// endpoint or a built-in model: {', '.join(BUILTIN)})"
        )
    if not path.is_dir():
        raise PolicyError(f"policy {spec!r}: {source} is a file, not a checkpoint or model folder")
    path = path.resolve()
    if (path / LATEST_FILE).exists() or (not (path / LOOP_STATE_FILE).exists() and latest_checkpoint(path)):
        # A run's folder: the checkpoint it kept as its best (trainer.keep_best), else its latest.
        kept = best_checkpoint(path) or latest_checkpoint(path)
        if kept is None:
            raise PolicyError(f"policy {spec!r}: {source} holds no complete checkpoint (global_step_N/)")
        path = kept
    if (path / LOOP_STATE_FILE).is_file():
        check_checkpoint(spec, path)
        return "checkpoint", str(path)
    if (path / "config.json").is_file():
        return "hf", str(path)
    raise PolicyError(
        f"policy {spec!r}: {source} is neither a checkpoint of ours ({LOOP_STATE_FILE} and "
        f"{POLICY_STATE_FILE}) nor a Hugging Face model folder (config.json)"
    )


def checkpoint_model(loop_state: dict[str, Any]) -> dict[str, Any]:
    """The `actor_rollout_ref.model` block of the run that saved the checkpoint."""
    model = loop_state.get("config", {}).get("actor_rollout_ref", {}).get("model", {})
    return model if isinstance(model, dict) else {}


def check_checkpoint(spec: str, folder: Path) -> None:
    try:
        state = json.loads((folder / LOOP_STATE_FILE).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise PolicyError(f"policy {spec!r}: {folder / LOOP_STATE_FILE} cannot be read: {exc}") from None
    if (folder / "policies").is_dir():
        raise PolicyError(
            f"policy {spec!r}: {folder} is a checkpoint of several policies; evaluation takes one "
            "policy's model at a time (not supported yet for multi-policy checkpoints)"
        )
    if not (folder / POLICY_STATE_FILE).is_file():
        raise PolicyError(
            f"policy {spec!r}: {folder} has no {POLICY_STATE_FILE}: not a torch-backend checkpoint "
            "(verl checkpoints: export them to a Hugging Face folder with verl's model merger first)"
        )
    base = checkpoint_model(state).get("path")
    if not isinstance(base, str) or not base:
        raise PolicyError(f"policy {spec!r}: {folder}'s config names no actor_rollout_ref.model.path")
    if base not in BUILTIN and not Path(base).is_dir():
        raise PolicyError(
            f"policy {spec!r}: the checkpoint's base model {base} (actor_rollout_ref.model.path) is not there"
        )


def check_endpoint(policy: Policy, timeout: float = 10.0) -> None:
    """The endpoint answers `GET {url}/models` with 200, or PolicyError saying what it did."""
    url = f"{policy.source}/models"
    try:
        response = httpx.get(url, timeout=timeout, trust_env=False)
    except httpx.HTTPError as exc:
        raise PolicyError(
            f"policy {policy.name}: the endpoint {policy.source} does not answer ({type(exc).__name__}: {exc}); "
            "is the server running, and is the URL its OpenAI base (ending in /v1)?"
        ) from None
    if response.status_code != 200:
        raise PolicyError(
            f"policy {policy.name}: GET {url} answered {response.status_code}: {response.text[:200]}"
        )


def export_checkpoint(folder: str, target: Path) -> Path:
    """The checkpoint's policy as a Hugging Face folder at `target` (LoRA merged into the base),
    written beside it and renamed into place: a crash leaves no half-written model."""
    if (target / "config.json").is_file():
        return target
    import torch
    from transformers.utils import logging as hf_logging

    from agentlightning.torch_backend.lora import apply_lora, full_state, lora_settings
    from agentlightning.torch_backend.models import load_model

    hf_logging.disable_progress_bar()
    state = json.loads((Path(folder) / LOOP_STATE_FILE).read_text())
    model_cfg = checkpoint_model(state)
    seed = int(state.get("config", {}).get("agentlightning", {}).get("seed", 0) or 0)
    model, tokenizer = load_model(str(model_cfg["path"]), torch.device("cpu"), torch.float32, seed)
    saved = torch.load(Path(folder) / POLICY_STATE_FILE, map_location="cpu", weights_only=False)
    weights = saved["policy"]["model"]
    settings = lora_settings(
        model_cfg.get("lora_rank", 0),
        model_cfg.get("lora_alpha", 16.0),
        model_cfg.get("target_modules", "all-linear"),
    )
    if settings.enabled:
        peft_model = apply_lora(model, settings)
        model.load_state_dict(full_state(model, weights))
        model = peft_model.merge_and_unload()
    else:
        model.load_state_dict(weights)
    tmp = target.with_name(f".{target.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    os.replace(tmp, target)
    return target
