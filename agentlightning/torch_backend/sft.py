"""`agl-sft`: supervised fine-tuning with the torch backend, on the Gateway's records or on chats.

    agl-sft [backend=torch|verl] [--config FILE.yaml] [key=value ...]   (keys: agentlightning/config/sft.yaml)

`backend=verl` trains the same rows with verl's own SFT trainer (`agentlightning/verl/sft.py`).

The rows come from `trainer.sft_data` (the recorded rollouts a selection keeps, built by the RL
path's aggregation; or a JSONL of chats rendered with the model's chat template); the loss is
the negative log-likelihood of their trainable tokens — the model's own — each token weighing
the same within an optimizer step. Full fine-tuning or a LoRA adapter, as the RL backend's
(`lora.py`). The result is a checkpoint in the RL layout (`trainer.checkpoint`):

    {output_dir}/global_step_{N}/loop_state.json    the step and the config, with the
                                                    `actor_rollout_ref.model` block agl-eval reads
    {output_dir}/global_step_{N}/policy_state.pt    the weights (LoRA: the adapter), AdamW state
    {output_dir}/global_step_{N}/adapter/           LoRA: the adapter in peft's layout
    {output_dir}/global_step_{N}/model/             a Hugging Face folder (LoRA merged): what RL
                                                    starts from (`actor_rollout_ref.model.path`)

`agl-eval policies=[sft={output_dir}]` evaluates it. Every setting is checked before anything
loads (a misspelt key fails with the closest one), and the data before anything trains.
"""

from __future__ import annotations

import copy
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
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
from agentlightning.log import get_logger
from agentlightning.rows import TrainingRow
from agentlightning.torch_backend.checkpoint import save_policy_state, torch_rng_state
from agentlightning.torch_backend.lora import (
    ADAPTER_DIR,
    adapter_state,
    apply_lora,
    count_parameters,
    lora_settings,
    save_adapter,
)
from agentlightning.torch_backend.models import load_model, resolve_device
from agentlightning.torch_backend.policy import ActorConfig, OptimConfig, PolicyUpdater
from agentlightning.trainer.sft_data import Selection, SelectionCounts, SFTDataError, chat_rows, store_rows

PROG = "agl-sft"
MODEL_DIR = "model"  # in a checkpoint folder: the policy as a Hugging Face folder

log = get_logger("sft")


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
        try:
            lora_settings(self.model.lora_rank, self.model.lora_alpha, self.model.target_modules)
        except ValueError as exc:
            raise ConfigError(str(exc).replace("actor_rollout_ref.model.", "model.")) from None
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


def check_torch_config(config: SFTConfig) -> None:
    """What only the verl backend reads is refused here."""
    if config.verl_overrides:
        raise ConfigError(
            "verl_overrides is read by backend=verl only (verl's own SFT keys): remove it, or add backend=verl"
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


def batches(rows: Sequence[TrainingRow], size: int, rng: random.Random) -> list[list[TrainingRow]]:
    """The rows shuffled into optimizer steps of `size`, each row's trainable tokens weighted so
    that every trainable token of a step weighs the same (the weights of a step sum to 1)."""
    order = list(rows)
    rng.shuffle(order)
    out = []
    for start in range(0, len(order), size):
        step = [copy.copy(r) for r in order[start : start + size]]
        tokens = sum(r.n_trainable for r in step)
        for r in step:
            r.loss_weight = 1.0 / tokens
        out.append(step)
    return out


# --- the run -------------------------------------------------------------------------------


def say(line: str) -> None:
    print(line, flush=True)


def run_sft(config: SFTConfig) -> Path:
    """Fine-tune; returns the checkpoint folder."""
    check_torch_config(config)
    if config.torch_threads:
        torch.set_num_threads(config.torch_threads)
    torch.manual_seed(config.train.seed)
    device = resolve_device(config.device)
    assert config.model.path is not None
    try:
        model, tokenizer = load_model(config.model.path, device, torch.float32, config.train.seed)
    except OSError as exc:
        raise ConfigError(f"model.path: cannot load {config.model.path!r}: {exc}") from None
    rows, seen = load_rows(config, tokenizer)
    check_vocabulary(rows, int(model.get_input_embeddings().num_embeddings))
    n_tokens = sum(r.n_trainable for r in rows)
    say(f"{PROG}: {len(rows)} rows, {n_tokens} trainable tokens" + (f" ({seen})" if seen else ""))
    settings = lora_settings(config.model.lora_rank, config.model.lora_alpha, config.model.target_modules)
    peft_model = apply_lora(model, settings) if settings.enabled else None
    trainable, total = count_parameters(model)
    t = config.train
    actor = ActorConfig(
        optim=OptimConfig(lr=t.lr, weight_decay=t.weight_decay, lr_warmup_steps=t.warmup_steps),
        ppo_micro_batch_size_per_gpu=t.micro_batch_size,
        grad_clip=t.grad_clip,
        calculate_entropy=False,
    )
    updater = PolicyUpdater(model, actor, device=device)
    rng = random.Random(t.seed)
    started = time.perf_counter()
    n_steps = t.epochs * -(-len(rows) // t.batch_size)
    say(
        f"{PROG}: {'LoRA rank ' + str(settings.rank) if settings.enabled else 'full fine-tuning'} "
        f"({trainable} of {total} parameters), {t.epochs} epoch(s), {n_steps} steps of {t.batch_size} rows, lr {t.lr:g}"
    )
    loss = float("nan")
    for epoch in range(t.epochs):
        losses = []
        for step_rows in batches(rows, t.batch_size, rng):
            losses.append(updater.nll_backward(step_rows))
            grad_norm = updater.optimizer_step()
            log.debug("sft_step", step=updater.steps, loss=losses[-1], grad_norm=grad_norm)
        loss = sum(losses) / len(losses)
        say(f"{PROG}: epoch {epoch + 1}/{t.epochs}: loss {loss:.4f} ({time.perf_counter() - started:.0f} s)")
    folder = save(config, updater, peft_model, tokenizer, {"sft/loss": loss, "sft/rows": len(rows), **seen})
    say(f"{PROG}: checkpoint {folder}")
    return folder


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


def save(
    config: SFTConfig, updater: PolicyUpdater, peft_model: Any, tokenizer: Any, metrics: dict[str, Any]
) -> Path:
    policy = updater.state_dict()
    if peft_model is not None:
        policy["model"] = adapter_state(updater.model)
    return write_checkpoint(config, updater.steps, policy, updater.model, peft_model, tokenizer, metrics)


def write_checkpoint(
    config: SFTConfig,
    step: int,
    policy: dict[str, Any],
    model: Any,
    peft_model: Any,
    tokenizer: Any,
    metrics: dict[str, Any],
    backend: str = "torch",
) -> Path:
    """The checkpoint of `step` in the RL layout, whichever backend trained `model`: `policy` is
    what policy_state.pt holds (its "model": the weights, LoRA: the adapter), `peft_model` the
    adapter's peft wrapper around `model` (or None)."""
    from agentlightning.trainer.checkpoint import save_checkpoint

    def save_backend(folder: Path) -> None:
        if peft_model is not None:
            save_adapter(peft_model, folder / ADAPTER_DIR)
        save_policy_state(folder, {"policy": policy, "rng": torch_rng_state()})
        if config.save_model_folder:
            merged = copy.deepcopy(peft_model).merge_and_unload() if peft_model is not None else model
            merged.save_pretrained(folder / MODEL_DIR)
            tokenizer.save_pretrained(folder / MODEL_DIR)

    state = {
        "step": step,
        "version": step,
        "kind": "sft",
        "backend": backend,
        "metrics": metrics,
        "config": checkpoint_config(config),
    }
    return save_checkpoint(config.output_dir, step, state, save_backend)


def main(argv: Sequence[str] | None = None) -> int:
    from agentlightning.commands.backends import split_backend

    backend, args = split_backend(list(sys.argv[1:] if argv is None else argv))
    if backend == "verl":  # the same keys, trained by verl's SFT trainer (agentlightning/verl/sft.py)
        try:
            from agentlightning.verl.sft import main as verl_main
        except ImportError as exc:  # VerlVersionError says which verl and how to install it
            fail(f"{PROG} backend=verl", str(exc))
        return verl_main(args)
    if backend != "torch":
        fail(PROG, f"backend must be torch or verl, got {backend!r}")
    cfg = load_cli_config("sft", args, prog=PROG, strict=False)
    try:
        config = load_sft_config(cfg)
        check_torch_config(config)
    except ConfigError as exc:
        fail(PROG, f"bad config: {exc}")
    setup_logging(PROG, config.log_level)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    catch_interrupts()
    try:
        with exit_on_interrupt(PROG):
            run_sft(config)
    except (ConfigError, SFTDataError) as exc:
        fail(PROG, str(exc))
    except (GatewayUnavailable, Unauthorized) as exc:
        fail(PROG, f"the Gateway at {config.data.gateway.url} (data.gateway.url): {exc}", 1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
