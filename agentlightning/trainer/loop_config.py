"""The loop's configuration (`trainer.*`, the loop's `data.*`), and the section loader backends use.

Keys with verl's names mean what they mean in verl, so one config file can drive either backend:
a section is read into a dataclass that declares the keys its reader uses; the others (verl's
own) are logged once and ignored, and a key with a wrong type fails at start-up, naming the key.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf

from agentlightning.log import get_logger
from agentlightning.trainer.config import VERL_KEYS

log = get_logger("trainer_config")


def load_section(root: DictConfig, name: str, schema: type) -> Any:
    """The `schema` dataclass filled from section `name` of the config. Keys the schema does not
    declare (verl's own) are logged once and ignored; a wrong type fails naming the key."""
    section = OmegaConf.select(root, name, default=None)
    values = OmegaConf.to_container(section, resolve=True) if section is not None else {}
    picked, ignored = _split_known(values, schema)
    ignored = [k for k in ignored if f"{name}.{k}" not in VERL_KEYS]  # the trainer core reads these
    if ignored:
        log.info("config_keys_ignored", keys=sorted(f"{name}.{k}" for k in ignored))
    try:
        merged = OmegaConf.merge(OmegaConf.structured(schema), picked)
    except Exception as exc:
        key = getattr(exc, "full_key", None) or "?"
        raise ValueError(f"{name}.{key}: {str(exc).splitlines()[0]}") from None
    return OmegaConf.to_object(merged)


def _split_known(values: Any, schema: type, prefix: str = "") -> tuple[dict[str, Any], list[str]]:
    """The part of `values` that `schema` (a dataclass) declares, and the dotted keys it does not."""
    if not isinstance(values, dict):
        return {}, []
    declared = {f.name: f for f in fields(schema)}
    picked: dict[str, Any] = {}
    ignored: list[str] = []
    for key, value in values.items():
        f = declared.get(key)
        if f is None:
            ignored.append(f"{prefix}{key}")
            continue
        sub = _dataclass_type(f)
        if sub is not None and isinstance(value, dict):
            inner, more = _split_known(value, sub, f"{prefix}{key}.")
            picked[key] = inner
            ignored += more
        else:
            picked[key] = value
    return picked, ignored


def _dataclass_type(f: Any) -> type | None:
    default_factory = f.default_factory
    if callable(default_factory):
        try:
            value = default_factory()
        except TypeError:
            return None
        if is_dataclass(value):
            return type(value)
    return None


@dataclass
class TrainerConfig:
    """`trainer.*` (verl names where they mean the same)."""

    total_epochs: int = 1
    total_training_steps: int | None = None  # None: total_epochs × (train samples // train_batch_size)
    test_freq: int = 5  # validate every this many steps (and after the last); <= 0: only before and after
    save_freq: int = 10  # checkpoint every this many steps (and after the last); <= 0: never
    val_before_train: bool = True
    project_name: str = "agentlightning"
    experiment_name: str = "run"
    default_local_dir: str = "checkpoints"  # where checkpoints go
    resume_mode: str = "auto"  # auto (the latest checkpoint, if any) | disable | resume_path
    resume_from_path: str | None = None  # a global_step_N directory, for resume_mode=resume_path
    max_actor_ckpt_to_keep: int | None = 2  # None: keep all
    logger: list[str] = field(default_factory=lambda: ["console", "jsonl", "tensorboard"])
    # Ours:
    output_dir: str = "."  # metrics.jsonl, tensorboard/
    torch_threads: int = 0  # torch's intra-op threads; 0: torch's default
    log_level: str = "info"

    def validate(self) -> None:
        if self.total_epochs < 1:
            raise ValueError(f"trainer.total_epochs must be >= 1, got {self.total_epochs}")
        if self.total_training_steps is not None and self.total_training_steps < 1:
            raise ValueError(f"trainer.total_training_steps must be >= 1, got {self.total_training_steps}")
        if self.resume_mode not in ("auto", "disable", "resume_path"):
            raise ValueError(
                f"trainer.resume_mode must be auto, disable or resume_path, got {self.resume_mode!r}"
            )
        if self.resume_mode == "resume_path" and not self.resume_from_path:
            raise ValueError("trainer.resume_mode=resume_path needs trainer.resume_from_path")
        if self.torch_threads < 0:
            raise ValueError(f"trainer.torch_threads must be >= 0, got {self.torch_threads}")


@dataclass
class DataConfig:
    """`data.*` read by the loop (the batch size and length limits are the trainer core's)."""

    train_files: Any = None  # a .jsonl / .json / .parquet path or a list of them
    val_files: Any = None
    shuffle: bool = True
    seed: int = 0


def load_loop_config(cfg: DictConfig | dict[str, Any] | None) -> tuple[TrainerConfig, DataConfig]:
    """Read `trainer.*` and the loop's `data.*` keys; unknown ones are ignored (verl has many the
    torch backend does not use), a wrong type fails naming the key."""
    root = OmegaConf.create(cfg or {})
    trainer: TrainerConfig = load_section(root, "trainer", TrainerConfig)
    data: DataConfig = load_section(root, "data", DataConfig)
    trainer.validate()
    return trainer, data
