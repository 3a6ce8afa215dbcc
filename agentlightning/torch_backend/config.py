"""The torch backend's configuration: verl's `actor_rollout_ref.*` keys where they mean the same.

One config file can drive both backends, so keys that only verl uses (`strategy`, `fsdp_config`,
`rollout.name`, `tensor_model_parallel_size`, …) are accepted and ignored (and listed once in
the log); a key the torch backend uses but with a wrong type fails at start-up, naming the key.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig, OmegaConf

from agentlightning.torch_backend.lora import LoraSettings, lora_settings
from agentlightning.torch_backend.policy import ActorConfig
from agentlightning.trainer.loop_config import load_section


@dataclass
class ModelConfig:
    """`actor_rollout_ref.model.*`"""

    path: str = "demo"  # a Hugging Face model directory, or "demo" (the demo's tiny model)
    enable_gradient_checkpointing: bool = False
    # LoRA (verl's keys, `lora.py`): 0 = full fine-tuning; > 0 trains only an adapter of this rank
    lora_rank: int = 0
    lora_alpha: float = 16.0  # the adapter's scale is lora_alpha / lora_rank
    target_modules: Any = "all-linear"  # "all-linear" (all but the output head) or a list of module names


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
    # engine=auto: vLLM for models at least this large (below, the torch engine is faster on CPU)
    auto_min_parameters: int = 5_000_000


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
    # auto: vLLM for a Hugging Face model of at least vllm.auto_min_parameters that vLLM can serve,
    # where it is installed; else torch (the built-in server) | torch | vllm (rollout.vllm)
    engine: str = "auto"
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

    @property
    def lora(self) -> LoraSettings:
        return lora_settings(self.model.lora_rank, self.model.lora_alpha, self.model.target_modules)

    def validate(self) -> None:
        _ = self.lora  # a bad LoRA key fails here, naming it
        if self.rollout.n < 1:
            raise ValueError("actor_rollout_ref.rollout.n must be at least 1")
        if self.rollout.engine not in ("auto", "torch", "vllm"):
            raise ValueError(
                f"actor_rollout_ref.rollout.engine must be auto, torch or vllm, got {self.rollout.engine!r}"
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
    config: TorchBackendConfig = load_section(
        OmegaConf.create(cfg or {}), "actor_rollout_ref", TorchBackendConfig
    )
    config.validate()
    return config
