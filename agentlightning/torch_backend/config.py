"""The torch backend's configuration: verl's `actor_rollout_ref.*` keys where they mean the same.

One config file can drive both backends, so keys that only verl uses (`strategy`, `fsdp_config`,
`rollout.name`, `tensor_model_parallel_size`, …) are accepted and ignored (and listed once in
the log); a key the torch backend uses but with a wrong type fails at start-up, naming the key.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf

from agentlightning.log import get_logger
from agentlightning.torch_backend.policy import ActorConfig
from agentlightning.trainer.config import VERL_KEYS

log = get_logger("torch_config")


@dataclass
class ModelConfig:
    """`actor_rollout_ref.model.*`"""

    path: str = "demo"  # a Hugging Face model directory, or "demo" (the demo's tiny model)
    enable_gradient_checkpointing: bool = False


@dataclass
class ValKwargs:
    """`actor_rollout_ref.rollout.val_kwargs.*`: sampling for validation."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = -1
    n: int = 1


@dataclass
class VLLMRolloutConfig:
    """`actor_rollout_ref.rollout.vllm.*`: real vLLM servers (`rollout.engine=vllm`)."""

    num_servers: int = 1  # vLLM servers, each a child process; the Gateway spreads rollouts over them
    python: str | None = (
        None  # the interpreter with vLLM; null: .venv-vllm/bin/python if present, else this one
    )
    kv_cache_memory_bytes: int | None = 64 * 1024 * 1024  # CPU: the KV cache per server; null on GPU
    gpu_memory_utilization: float | None = None  # GPU: vLLM's share of the device; the update uses the rest
    enforce_eager: bool = True  # no graph capture/compilation: faster start, slower decoding on GPU
    tool_call_parser: str | None = "hermes"  # vLLM's tool-call parser; null: no tool calls
    start_timeout_seconds: float = 600.0
    cpu_binds: list[str] = field(
        default_factory=list
    )  # per server: VLLM_CPU_OMP_THREADS_BIND, e.g. ["0", "1"]
    extra_args: list[str] = field(default_factory=list)  # more `vllm serve` flags, verbatim


@dataclass
class TorchRolloutConfig:
    """`actor_rollout_ref.rollout.*`: the rollout engine (the built-in one, or real vLLM)."""

    n: int = 4  # rollouts per prompt (the GRPO group size)
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    val_kwargs: ValKwargs = field(default_factory=ValKwargs)
    dtype: str = "auto"  # auto: float32 on CPU, bfloat16 on CUDA | float32 | bfloat16 | float16
    max_num_seqs: int = 256  # most sequences decoded together
    max_model_len: int | None = None  # default: the model's max_position_embeddings
    max_num_batched_tokens: int = 16384  # prompt tokens prefilled together
    # Ours:
    engine: str = "torch"  # torch: the built-in inference server | vllm: real vLLM servers (rollout.vllm)
    vllm: VLLMRolloutConfig = field(default_factory=VLLMRolloutConfig)
    device: str = "auto"  # auto | cpu | cuda | cuda:N (shared by the policy update)
    host: str = "127.0.0.1"
    port: int = 0  # 0: a free port
    seed: int = 0


@dataclass
class TorchBackendConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    rollout: TorchRolloutConfig = field(default_factory=TorchRolloutConfig)

    def validate(self) -> None:
        if self.rollout.n < 1:
            raise ValueError("actor_rollout_ref.rollout.n must be at least 1")
        if self.rollout.engine not in ("torch", "vllm"):
            raise ValueError(
                f"actor_rollout_ref.rollout.engine must be torch or vllm, got {self.rollout.engine!r}"
            )
        if self.rollout.vllm.num_servers < 1:
            raise ValueError("actor_rollout_ref.rollout.vllm.num_servers must be at least 1")
        if self.rollout.temperature <= 0:
            raise ValueError("actor_rollout_ref.rollout.temperature must be > 0 for training")
        self.actor.temperature = self.rollout.temperature
        self.actor.gradient_checkpointing = self.model.enable_gradient_checkpointing
        try:
            self.actor.validate()
        except ValueError as exc:
            raise ValueError(f"actor_rollout_ref.{exc}") from None


def load_torch_backend_config(cfg: DictConfig | dict[str, Any] | None) -> TorchBackendConfig:
    """Read `actor_rollout_ref.{model,actor,rollout}` from a full training config."""
    config: TorchBackendConfig = _load_section(
        OmegaConf.create(cfg or {}), "actor_rollout_ref", TorchBackendConfig
    )
    config.validate()
    return config


def _load_section(root: DictConfig, name: str, schema: type) -> Any:
    """The `schema` dataclass filled from section `name` of the config. Keys the schema does not
    declare (verl's own) are logged once and ignored; a wrong type fails naming the key."""
    section = OmegaConf.select(root, name, default=None)
    values = OmegaConf.to_container(section, resolve=True) if section is not None else {}
    picked, ignored = _split_known(values, schema)
    ignored = [k for k in ignored if f"{name}.{k}" not in VERL_KEYS]  # the trainer core reads these
    if ignored:
        log.info("config_keys_ignored_by_torch_backend", keys=sorted(f"{name}.{k}" for k in ignored))
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


# --- the loop: `trainer.*` and `data.*` -------------------------------------------------------


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
    trainer: TrainerConfig = _load_section(root, "trainer", TrainerConfig)
    data: DataConfig = _load_section(root, "data", DataConfig)
    trainer.validate()
    return trainer, data
