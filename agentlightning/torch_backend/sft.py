"""`agl-sft` on the torch backend: supervised fine-tuning on the Gateway's records or on chats.

    agl-sft [backend=torch] [--config FILE.yaml] [key=value ...]   (keys: agentlightning/config/sft.yaml)

The config, the rows and the checkpoint's record are every backend's (`trainer.sft`; `backend=verl`
trains the same rows with verl's own SFT trainer, `verl/sft.py`). Here the loss is the negative
log-likelihood of the rows' trainable tokens — the model's own — each token weighing the same
within an optimizer step, on `PolicyUpdater`. Full fine-tuning or a LoRA adapter, as the RL
backend's (`lora.py`). The checkpoint is in the RL layout (`trainer.sft.write_sft_checkpoint`):
`policy_state.pt` holds the weights (LoRA: the adapter) and the AdamW state, `model/` a Hugging
Face folder (LoRA merged) that RL starts from and agl-eval reads.

Every setting is checked before anything loads (a misspelt key fails with the closest one), and
the data before anything trains.
"""

from __future__ import annotations

import copy
import random
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from agentlightning.config.schema import ConfigError
from agentlightning.log import get_logger
from agentlightning.rows import TrainingRow
from agentlightning.torch_backend.checkpoint import save_policy_state, torch_rng_state
from agentlightning.torch_backend.lora import (
    adapter_state,
    apply_lora,
    count_parameters,
    lora_settings,
    save_adapter,
)
from agentlightning.torch_backend.models import load_model, resolve_device
from agentlightning.torch_backend.policy import ActorConfig, OptimConfig, PolicyUpdater
from agentlightning.trainer.checkpoint import ADAPTER_DIR
from agentlightning.trainer.sft import (
    MODEL_DIR,
    PROG,
    SFTConfig,
    check_vocabulary,
    load_rows,
    load_sft_config,
    run_command,
    say,
    write_sft_checkpoint,
)

__all__ = ["MODEL_DIR", "PROG", "SFTConfig", "batches", "load_sft_config", "main", "run_sft"]

log = get_logger("sft")


def check_torch_config(config: SFTConfig) -> None:
    """What only the verl backend reads is refused here."""
    if config.verl_overrides:
        raise ConfigError(
            "verl_overrides is read by backend=verl only (verl's own SFT keys): remove it, or add backend=verl"
        )


# --- the data ------------------------------------------------------------------------------


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


def save(
    config: SFTConfig, updater: PolicyUpdater, peft_model: Any, tokenizer: Any, metrics: dict[str, Any]
) -> Path:
    def save_backend(folder: Path) -> None:
        policy = updater.state_dict()
        if peft_model is not None:
            policy["model"] = adapter_state(updater.model)
            save_adapter(peft_model, folder / ADAPTER_DIR)
        save_policy_state(folder, {"policy": policy, "rng": torch_rng_state()})
        if config.save_model_folder:
            merged = copy.deepcopy(peft_model).merge_and_unload() if peft_model is not None else updater.model
            merged.save_pretrained(folder / MODEL_DIR)
            tokenizer.save_pretrained(folder / MODEL_DIR)

    return write_sft_checkpoint(config, updater.steps, "torch", metrics, save_backend)


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(PROG, argv, check_torch_config, run_command_line)


def run_command_line(config: SFTConfig) -> Path:
    """`run_sft` from the command line: no progress bars of transformers' between its lines."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    return run_sft(config)


if __name__ == "__main__":
    raise SystemExit(main())
