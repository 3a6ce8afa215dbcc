"""`agl-sft backend=verl`: the same supervised fine-tuning, trained by verl's own SFT trainer.

    agl-sft backend=verl [--config FILE.yaml] [key=value ...]                  one GPU
    torchrun --nproc-per-node=N -m agentlightning.verl.sft [key=value ...]      N GPUs (FSDP)

The keys are agl-sft's (`agentlightning/config/sft.yaml`), read by the same config class, and the
rows the same (`trainer.sft_data`: the Gateway's records selected and aggregated as RL does, or a
JSONL of chats), loaded once by rank 0 and written to `{output_dir}/sft_rows.parquet`, which every
rank reads (on several nodes, `output_dir` must be shared storage). They go to verl 0.9.1's SFT trainer
(`verl.trainer.sft_trainer.SFTTrainer`: its `TrainingWorker` on the FSDP engine, its `sft_loss`,
optimizer, LR scheduler and loop) as a parquet file of token ids read by our dataset class
(`sft_rows.py`) through verl's `data.custom_cls` hook — verl's own chat dataset would re-tokenise.

The checkpoint is the torch backend's layout (`trainer.sft.write_sft_checkpoint`): verl's FSDP
weights gathered to rank 0, loaded strictly into the base model (LoRA: into the same peft adapter)
and written as `policy_state.pt` (no optimizer state: verl's is sharded, and SFT does not resume),
`adapter/` and `model/` — what agl-eval and `actor_rollout_ref.model.path` read.

What verl's trainer does differently from the torch backend, said at start-up: it shuffles with its
own sampler (seeded by `train.seed`) and drops each epoch's last incomplete batch.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from agentlightning.config.schema import ConfigError
from agentlightning.log import get_logger
from agentlightning.trainer.checkpoint import ADAPTER_DIR, LORA_KEY, POLICY_STATE_FILE
from agentlightning.trainer.sft import (
    MODEL_DIR,
    SFTConfig,
    SFTModelConfig,
    check_vocabulary,
    load_rows,
    run_command,
    say,
    write_sft_checkpoint,
)
from agentlightning.verl import sft_rows

PROG = "agl-sft backend=verl"
ROWS_FILE = "sft_rows.parquet"  # in output_dir: the rows verl trains on
PEFT_PREFIX = "base_model.model."  # peft's wrapper around the model, in verl's state dict names

log = get_logger("verl_sft")


def check_config(config: SFTConfig) -> None:
    """What verl's SFT trainer cannot do, refused naming the key before anything loads."""
    if config.device not in ("auto", "cuda"):
        raise ConfigError(
            f"device={config.device}: verl's SFT trainer runs one process per GPU and picks its GPU itself "
            "(choose them with CUDA_VISIBLE_DEVICES, several with torchrun); use backend=torch for the CPU "
            "or a device of your choice"
        )
    path = config.model.path
    assert path is not None  # load_sft_config checked it
    if not Path(path).is_dir() and (path.count("/") != 1 or ":" in path):
        raise ConfigError(
            f"model.path={path}: neither a folder nor a hub id (org/name): verl loads a Hugging Face model "
            "(the torch backend's built-in models, such as demo, are not one: save it with save_pretrained, "
            "or use backend=torch)"
        )
    if config.model.lora_rank and float(config.model.lora_alpha) != int(config.model.lora_alpha):
        raise ConfigError(
            f"model.lora_alpha={config.model.lora_alpha:g}: verl's LoRA takes a whole number (its "
            "model.lora_alpha is an int)"
        )
    verl_config(config, Path(ROWS_FILE))  # verl_overrides: refused now, not after the rows are loaded


def micro_batch_size(config: SFTConfig, world_size: int) -> int:
    """Rows per forward pass on each GPU: train.micro_batch_size, at most a GPU's share of a step."""
    return min(config.train.micro_batch_size, config.train.batch_size // world_size)


def agl_settings(config: SFTConfig, rows_file: Path, world_size: int) -> dict[str, tuple[Any, str]]:
    """The keys of verl's SFT config that agl-sft sets: verl key -> (value, what it comes from)."""
    from verl.utils.device import get_device_name

    m, t = config.model, config.train
    targets = m.target_modules if isinstance(m.target_modules, str) else list(m.target_modules)
    return {
        "model.path": (m.path, "model.path"),
        "model.lora_rank": (m.lora_rank, "model.lora_rank"),
        "model.lora_alpha": (int(m.lora_alpha), "model.lora_alpha"),
        "model.target_modules": (targets, "model.target_modules"),
        "data.train_files": (str(rows_file), "the rows agl-sft selects"),
        "data.custom_cls.path": (sft_rows.__file__, "the rows agl-sft selects"),
        "data.custom_cls.name": (sft_rows.DATASET_CLASS, "the rows agl-sft selects"),
        "data.pad_mode": ("no_padding", "the rows agl-sft selects"),
        "data.train_batch_size": (t.batch_size, "train.batch_size"),
        "data.micro_batch_size_per_gpu": (micro_batch_size(config, world_size), "train.micro_batch_size"),
        # micro-batches of rows, as the torch backend's, not of a token budget
        "data.use_dynamic_bsz": (False, "train.micro_batch_size"),
        "data.num_workers": (0, "the rows agl-sft selects"),  # in memory: no loader processes
        "optim.lr": (t.lr, "train.lr"),
        "optim.weight_decay": (t.weight_decay, "train.weight_decay"),
        "optim.clip_grad": (t.grad_clip, "train.grad_clip"),
        "optim.lr_warmup_steps": (t.warmup_steps, "train.warmup_steps"),
        # linear warm-up, then constant: the torch backend's schedule
        "optim.lr_scheduler_type": ("constant", "train.warmup_steps"),
        "engine.seed": (t.seed, "train.seed"),
        "trainer.seed": (t.seed, "train.seed"),
        "trainer.total_epochs": (t.epochs, "train.epochs"),
        "trainer.default_local_dir": (config.output_dir, "output_dir"),
        "trainer.save_freq": (-1, "output_dir"),  # one checkpoint, after the last step, as agl-sft's
        "trainer.test_freq": (-1, "the rows agl-sft selects"),
        "trainer.resume_mode": ("disable", "output_dir"),
        "trainer.logger": (["console"], "log_level"),
        "trainer.device": (get_device_name(), "device"),
    }


def verl_config(config: SFTConfig, rows_file: Path, world_size: int = 1) -> DictConfig:
    """verl's `sft_trainer_engine` config with `verl_overrides` (verl's own keys: what agl-sft has no
    key for, such as the FSDP strategy or flash-attn's remove-padding), then agl-sft's settings. An
    override of a key agl-sft sets is refused, naming the agl-sft key to set instead."""
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    settings = agl_settings(config, rows_file, world_size)
    for item in config.verl_overrides:
        key = item.partition("=")[0].lstrip("+~")
        if key in settings:
            raise ConfigError(
                f"verl_overrides: {key} is set by agl-sft from {settings[key][1]}: set that instead"
            )
    GlobalHydra.instance().clear()
    try:
        with initialize_config_module(config_module="verl.trainer.config", version_base=None):
            cfg = compose(config_name="sft_trainer_engine", overrides=list(config.verl_overrides))
    except Exception as exc:  # hydra's override errors: a key verl's SFT config does not have, a bad value
        raise ConfigError(
            f"verl_overrides: verl's SFT config refuses them: {str(exc).splitlines()[0]}"
        ) from None
    finally:
        GlobalHydra.instance().clear()
    for key, (value, _) in settings.items():
        OmegaConf.update(cfg, key, value, merge=False)
    return cfg


# --- the trainer ---------------------------------------------------------------------------


def trainer_class() -> type:
    """verl's SFT trainer with our checkpoints and a record of each step's loss; defined once verl
    may be imported (a test registers its CPU platform before verl's workers are imported)."""
    from verl.trainer.sft_trainer import SFTTrainer

    class Trainer(SFTTrainer):  # type: ignore[misc, valid-type, unused-ignore]  # verl is Any in .venv
        def __init__(self, cfg: DictConfig, sft: SFTConfig, metrics: dict[str, Any]) -> None:
            self.sft = sft
            self.metrics = metrics  # the rows' counts, for the checkpoint
            self.losses: list[float] = []
            super().__init__(cfg)

        def _build_dataloader(self) -> None:
            super()._build_dataloader()
            self.train_sampler.seed = self.sft.train.seed  # its shuffle: seed + epoch

        def _build_engine(self) -> None:
            super()._build_engine()
            train_batch = self.training_client.train_batch

            def recorded(data: Any) -> Any:
                output = train_batch(data)
                if self.engine.is_mp_src_rank_with_outputs():
                    from verl.utils import tensordict_utils as tu

                    self.losses.append(_mean(tu.get(output, "metrics")["loss"]))
                return output

            self.training_client.train_batch = recorded

        def _build_ckpt_handler(self) -> None:
            self.ckpt_handler = Checkpoints(self)

        def epoch_losses(self) -> list[float]:
            """The mean loss of each epoch's steps, so far."""
            n = max(1, self.steps_per_epoch)
            parts = [self.losses[i : i + n] for i in range(0, len(self.losses), n)]
            return [sum(part) / len(part) for part in parts]

    return Trainer


class Checkpoints:
    """In place of verl's `CheckpointHandler`: our layout, and no resume (as the torch backend's SFT)."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer
        self.folder: Path | None = None

    def load_checkpoint(self) -> int:
        return 0

    def save_checkpoint(self, step: int) -> None:
        from verl.utils.fsdp_utils import get_fsdp_full_state_dict

        state = get_fsdp_full_state_dict(self.trainer.engine.module, offload_to_cpu=True, rank0_only=True)
        if torch.distributed.get_rank() == 0:
            self.folder = self.write(step, state)
        torch.distributed.barrier()

    def write(self, step: int, state: dict[str, torch.Tensor]) -> Path:
        """verl's weights loaded strictly into the base model (and adapter), written as agl-sft writes."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        sft: SFTConfig = self.trainer.sft
        assert sft.model.path is not None
        model = AutoModelForCausalLM.from_pretrained(sft.model.path).float()
        tokenizer = AutoTokenizer.from_pretrained(sft.model.path)
        peft_model = with_adapter(model, sft.model) if sft.model.lora_rank else None
        weights = {k.removeprefix(PEFT_PREFIX): v.float() for k, v in state.items()}
        model.load_state_dict(weights, strict=True)  # every name verl trained is one of the model's
        # policy_state.pt as the torch backend writes it (agl-eval reads it): LoRA, the adapter only
        policy = {k: v for k, v in weights.items() if LORA_KEY in k} if peft_model is not None else weights

        def save_backend(folder: Path) -> None:
            torch.save(
                {"policy": {"model": policy}, "rng": {"torch": torch.get_rng_state()}},
                folder / POLICY_STATE_FILE,
            )
            if peft_model is not None:
                peft_model.save_pretrained(str(folder / ADAPTER_DIR))
            if sft.save_model_folder:
                merged = peft_model.merge_and_unload() if peft_model is not None else model
                merged.save_pretrained(folder / MODEL_DIR)
                tokenizer.save_pretrained(folder / MODEL_DIR)

        losses = self.trainer.epoch_losses()
        metrics = {"sft/loss": losses[-1] if losses else float("nan"), **self.trainer.metrics}
        return write_sft_checkpoint(sft, step, "verl", metrics, save_backend)


def with_adapter(model: Any, settings: SFTModelConfig) -> Any:
    """A fresh LoRA adapter injected into `model` in place, named as verl's peft names it (and as the
    torch backend's `lora.apply_lora` does); returns the `PeftModel` around it."""
    from peft import LoraConfig, get_peft_model

    targets = settings.target_modules
    config = LoraConfig(
        r=settings.lora_rank,
        lora_alpha=int(settings.lora_alpha),
        target_modules=targets if isinstance(targets, str) else list(targets),
        lora_dropout=0.0,
        bias="none",
    )
    return get_peft_model(model, config, adapter_name="default")


def _mean(value: Any) -> float:
    """A verl metric (a number, a tensor, a `Metric`, or a list of them over micro-batches) as one number."""
    values = value if isinstance(value, list) else [value]
    numbers = []
    for v in values:
        number: Any = getattr(v, "value", v)
        numbers.append(
            float(number.detach().float().mean()) if isinstance(number, torch.Tensor) else float(number)
        )
    return sum(numbers) / len(numbers)


# --- the run -------------------------------------------------------------------------------


def _init_process_group() -> bool:
    """One process per GPU: torchrun's environment, or this process alone as rank 0 of 1. Returns
    whether this call created the group (and so destroys it)."""
    if torch.distributed.is_initialized():
        return False
    from verl.utils.distributed import initialize_global_process_group

    from agentlightning.procs import free_port

    if "WORLD_SIZE" not in os.environ:
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(free_port()))
    initialize_global_process_group()
    return True


def prepare_rows(config: SFTConfig, world_size: int) -> tuple[Path, dict[str, Any]]:
    """Rank 0's part: the rows loaded, checked and written for verl (`sft_rows.write_rows`)."""
    from transformers import AutoConfig, AutoTokenizer

    assert config.model.path is not None
    try:
        tokenizer = AutoTokenizer.from_pretrained(config.model.path)
        vocabulary = int(AutoConfig.from_pretrained(config.model.path).vocab_size)
    except OSError as exc:
        raise ConfigError(f"model.path: cannot load {config.model.path!r}: {exc}") from None
    rows, seen = load_rows(config, tokenizer)
    check_vocabulary(rows, vocabulary)
    t = config.train
    if t.batch_size % world_size:
        raise ConfigError(f"train.batch_size={t.batch_size} must be a multiple of the {world_size} GPUs")
    if (t.batch_size // world_size) % micro_batch_size(config, world_size):
        raise ConfigError(
            f"train.micro_batch_size={t.micro_batch_size} must divide the {t.batch_size // world_size} rows each "
            "GPU takes a step (train.batch_size / GPUs): verl splits a step into whole micro-batches"
        )
    if len(rows) < t.batch_size:
        raise ConfigError(
            f"train.batch_size={t.batch_size} is more than the {len(rows)} rows: verl's SFT trainer drops an "
            "incomplete batch, so no step would run; set train.batch_size <= the rows"
        )
    path = sft_rows.write_rows(rows, Path(config.output_dir) / ROWS_FILE)
    n_tokens = sum(r.n_trainable for r in rows)
    say(f"{PROG}: {len(rows)} rows, {n_tokens} trainable tokens" + (f" ({seen})" if seen else ""))
    if len(rows) % t.batch_size:
        say(
            f"{PROG}: verl drops each epoch's last incomplete batch: {len(rows) % t.batch_size} of the shuffled "
            f"rows are left out of each epoch (train.batch_size={t.batch_size})"
        )
    return path, {"sft/rows": len(rows), **seen}


def run_verl_sft(config: SFTConfig) -> Path | None:
    """Fine-tune with verl's SFT trainer; returns the checkpoint folder (on rank 0; None elsewhere)."""
    check_config(config)
    if config.torch_threads:
        torch.set_num_threads(config.torch_threads)
    created = _init_process_group()
    try:
        rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
        shared: list[Any] = [None]
        if rank == 0:
            try:
                shared[0] = prepare_rows(config, world)
            except Exception as exc:  # every rank stops with it, none waits for rows that never come
                shared[0] = exc
        if world > 1:
            torch.distributed.broadcast_object_list(shared, src=0)
        if isinstance(shared[0], Exception):
            raise shared[0]
        rows_file, metrics = shared[0]
        cfg = verl_config(config, rows_file, world)
        trainer = trainer_class()(cfg, config, metrics)
        t = config.train
        if rank == 0:
            say(
                f"{PROG}: {'LoRA rank ' + str(config.model.lora_rank) if config.model.lora_rank else 'full fine-tuning'}, "
                f"{t.epochs} epoch(s), {trainer.total_training_steps} steps of {t.batch_size} rows, lr {t.lr:g}"
            )
        trainer.fit()
        folder: Path | None = trainer.ckpt_handler.folder
        if rank == 0:
            for epoch, loss in enumerate(trainer.epoch_losses()):
                say(f"{PROG}: epoch {epoch + 1}/{t.epochs}: loss {loss:.4f}")
            say(f"{PROG}: checkpoint {folder}")
        return folder
    finally:
        if created:
            torch.distributed.destroy_process_group()


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(PROG, argv, check_config, run_verl_sft)


if __name__ == "__main__":
    raise SystemExit(main())
