"""`agl-sft`'s half that every backend shares: its config, its rows and its checkpoint's record.

The torch backend (`torch_backend/sft.py`) and the verl backend (`verl/sft.py`) read the same keys
(`agentlightning/config/sft.yaml`, `SFTConfig`), train on the same rows (`load_rows`: the Gateway's
records selected and aggregated as RL does, or a JSONL of chats; `trainer.sft_data`) and write the
same checkpoint (`write_sft_checkpoint`: the RL layout, `trainer.checkpoint`):

    {output_dir}/global_step_{N}/loop_state.json    the step, the backend and the config, with the
                                                    `actor_rollout_ref.model` block agl-eval reads
    {output_dir}/global_step_{N}/policy_state.pt    the weights (LoRA: the adapter), as {"policy": {"model": ...}}
    {output_dir}/global_step_{N}/adapter/           LoRA: the adapter in peft's layout
    {output_dir}/global_step_{N}/model/             a Hugging Face folder (LoRA merged): what RL
                                                    starts from (`actor_rollout_ref.model.path`)

The backend writes the last three (`save_backend`), under `trainer.checkpoint`'s names, which
agl-eval reads (`evaluation.policies`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from agentlightning.aggregation import AggregationLevel, AggregationStats, RowLimits
from agentlightning.client import GatewayClient, GatewayUnavailable, Unauthorized
from agentlightning.config.loader import (
    catch_interrupts,
    exit_on_interrupt,
    fail,
    load_cli_config,
    setup_logging,
)
from agentlightning.config.schema import ConfigError, fill
from agentlightning.rows import TrainingRow
from agentlightning.trainer.checkpoint import save_checkpoint
from agentlightning.trainer.sft_data import Selection, SelectionCounts, SFTDataError, chat_rows, store_rows

PROG = "agl-sft"
MODEL_DIR = "model"  # in a checkpoint folder: the policy as a Hugging Face folder


# --- the config ----------------------------------------------------------------------------


@dataclass
class SFTModelConfig:
    path: str | None = None
    lora_rank: int = 0
    lora_alpha: float = 16.0
    target_modules: Any = "all-linear"


@dataclass
class GatewaySource:
    url: str | None = None
    key: str = ""


@dataclass
class SFTDataConfig:
    source: str = "gateway"
    gateway: GatewaySource = field(default_factory=GatewaySource)
    select: Selection = field(default_factory=Selection)
    level: str = AggregationLevel.TRAJECTORY.value
    max_prompt_length: int | None = None
    max_response_length: int | None = None
    chats_file: str | None = None
    max_length: int | None = None


@dataclass
class SFTTrainConfig:
    epochs: int = 3
    batch_size: int = 16
    micro_batch_size: int = 16
    lr: float = 1e-5
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    warmup_steps: int = 0
    seed: int = 0


@dataclass
class SFTConfig:
    model: SFTModelConfig = field(default_factory=SFTModelConfig)
    data: SFTDataConfig = field(default_factory=SFTDataConfig)
    train: SFTTrainConfig = field(default_factory=SFTTrainConfig)
    output_dir: str = "checkpoints/sft"
    save_model_folder: bool = True
    device: str = "auto"
    torch_threads: int = 0
    log_level: str = "info"
    verl_overrides: list[str] = field(default_factory=list)  # backend=verl only: verl's own SFT keys

    def validate(self) -> None:
        if not self.model.path:
            raise ConfigError(
                "model.path is not set: the model to fine-tune (a Hugging Face folder or `demo`)"
            )
        check_lora_keys(self.model)
        data = self.data
        if data.source not in ("gateway", "chats"):
            raise ConfigError(f"data.source must be gateway or chats, got {data.source!r}")
        if data.source == "gateway":
            if not data.gateway.url:
                raise ConfigError("data.source=gateway needs data.gateway.url (and data.gateway.key)")
            if data.chats_file:
                raise ConfigError("data.chats_file is read with data.source=chats only: set one source")
        else:
            if not data.chats_file:
                raise ConfigError("data.source=chats needs data.chats_file (a JSONL of OpenAI chats)")
            if data.gateway.url:
                raise ConfigError("data.gateway.url is read with data.source=gateway only: set one source")
        try:
            AggregationLevel(data.level)
        except ValueError:
            raise ConfigError(f"data.level must be trajectory or transition, got {data.level!r}") from None
        try:
            data.select.validate()
        except SFTDataError as exc:
            raise ConfigError(str(exc)) from None
        for key in ("max_prompt_length", "max_response_length", "max_length"):
            value = getattr(data, key)
            if value is not None and value < 1:
                raise ConfigError(f"data.{key} must be >= 1 or null, got {value}")
        t = self.train
        for key in ("epochs", "batch_size", "micro_batch_size"):
            if getattr(t, key) < 1:
                raise ConfigError(f"train.{key} must be >= 1, got {getattr(t, key)}")
        if not t.lr > 0:
            raise ConfigError(f"train.lr must be > 0, got {t.lr}")
        if t.warmup_steps < 0 or t.weight_decay < 0 or t.grad_clip <= 0:
            raise ConfigError("train.warmup_steps and train.weight_decay must be >= 0, train.grad_clip > 0")
        if self.torch_threads < 0:
            raise ConfigError(f"torch_threads must be >= 0, got {self.torch_threads}")
        for item in self.verl_overrides:
            if "=" not in str(item):
                raise ConfigError(f"verl_overrides: {item!r} is not key=value (a key of verl's SFT config)")


def check_lora_keys(model: SFTModelConfig) -> None:
    """model.lora_rank, lora_alpha and target_modules, as the backends' LoRA reads them."""
    rank, alpha, targets = model.lora_rank, model.lora_alpha, model.target_modules
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        raise ConfigError(f"model.lora_rank must be an integer >= 0 (0: full fine-tuning), got {rank!r}")
    if isinstance(alpha, bool) or not isinstance(alpha, int | float) or alpha <= 0:
        raise ConfigError(f"model.lora_alpha must be a number > 0, got {alpha!r}")
    names = isinstance(targets, list | tuple) and targets and all(isinstance(t, str) and t for t in targets)
    if not (isinstance(targets, str) and targets) and not names:
        raise ConfigError(
            f"model.target_modules must be 'all-linear' or a non-empty list of module names, got {targets!r}"
        )


def load_sft_config(cfg: DictConfig | dict[str, Any]) -> SFTConfig:
    """The checked config; a key it does not read fails naming the closest one it does."""
    config: SFTConfig = fill(SFTConfig, cfg, label="agl-sft")
    config.validate()
    return config


# --- the data ------------------------------------------------------------------------------


def load_rows(config: SFTConfig, tokenizer: Any) -> tuple[list[TrainingRow], dict[str, Any]]:
    """The rows to train on and what their selection saw (SFTDataError when there are none)."""
    data = config.data
    if data.source == "chats":
        assert data.chats_file is not None  # validate() checked it
        return chat_rows(data.chats_file, tokenizer, data.max_length), {}
    counts = SelectionCounts()
    assert data.gateway.url is not None
    with GatewayClient(data.gateway.url, data.gateway.key) as client:
        rows = store_rows(
            client,
            data.select,
            AggregationLevel(data.level),
            RowLimits(data.max_prompt_length, data.max_response_length),
            counts,
        )
    stats: AggregationStats = counts.stats
    return rows, {
        "rollouts_kept": counts.kept,
        "prompts": counts.groups,
        "terminal_rollouts": counts.terminal,
        "calls": stats.n_calls,
        "rows_truncated": stats.n_truncated,
        "rows_dropped_prompt_too_long": stats.n_dropped_prompt_too_long,
        "merge_mismatches": stats.n_merge_mismatch,
    }


def check_vocabulary(rows: Sequence[TrainingRow], size: int) -> None:
    """Every token id fits the model's embedding (`size` ids); else the rows come from another tokenizer."""
    top = max(max(r.prompt_ids + r.response_ids) for r in rows)
    if top >= size:
        raise SFTDataError(
            f"the rows hold token id {top}, past the model's vocabulary ({size} ids): they were recorded "
            "with another tokenizer; fine-tune the model that produced them (or one sharing its tokenizer)"
        )


def say(line: str) -> None:
    print(line, flush=True)


def run_command(
    prog: str,
    argv: Sequence[str] | None,
    check: Callable[[SFTConfig], None],
    run: Callable[[SFTConfig], object],
) -> int:
    """A backend's `agl-sft` command line: the config read and checked (`check`: what that backend
    cannot do) before anything loads, then `run`; every failure said in one line, with exit 2 for
    the config and the data, 1 for the Gateway."""
    args = list(sys.argv[1:] if argv is None else argv)
    cfg = load_cli_config("sft", args, prog=prog, strict=False)
    try:
        config = load_sft_config(cfg)
        check(config)
    except ConfigError as exc:
        fail(prog, f"bad config: {exc}")
    setup_logging(prog, config.log_level)
    catch_interrupts()
    try:
        with exit_on_interrupt(prog):
            run(config)
    except (ConfigError, SFTDataError) as exc:
        fail(prog, str(exc))
    except (GatewayUnavailable, Unauthorized) as exc:
        fail(prog, f"the Gateway at {config.data.gateway.url} (data.gateway.url): {exc}", 1)
    return 0


# --- the checkpoint ------------------------------------------------------------------------


def checkpoint_config(config: SFTConfig) -> dict[str, Any]:
    """The config a checkpoint records: ours, and the RL keys that say what model it holds
    (what agl-eval and the RL trainer read from a checkpoint)."""
    model = config.model
    return {
        "actor_rollout_ref": {
            "model": {
                "path": model.path,
                "lora_rank": model.lora_rank,
                "lora_alpha": model.lora_alpha,
                "target_modules": model.target_modules,
            }
        },
        "agentlightning": {"seed": config.train.seed},
        "sft": OmegaConf.to_container(OmegaConf.structured(config), resolve=True),
    }


def write_sft_checkpoint(
    config: SFTConfig,
    step: int,
    backend: str,
    metrics: dict[str, Any],
    save_backend: Callable[[Path], None],
) -> Path:
    """The checkpoint of `step`: `save_backend(folder)` writes the weights (policy_state.pt, adapter/,
    model/), then the loop state records the step, the backend and the config."""
    state = {
        "step": step,
        "version": step,
        "kind": "sft",
        "backend": backend,
        "metrics": metrics,
        "config": checkpoint_config(config),
    }
    return save_checkpoint(config.output_dir, step, state, save_backend)
