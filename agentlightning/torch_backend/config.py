"""The torch backend's configuration: verl's `actor_rollout_ref.*` keys where they mean the same.

Read in the trainer's one style (`agentlightning.trainer.config`): dataclass schemas filled by
`load_section`, checked by their `validate()`, every key checked by `check_keys`. One config file
can drive both backends, so verl's engine keys (`strategy`, `fsdp_config`, `rollout.name`,
`tensor_model_parallel_size`, …) are accepted unread with one warning; any other key the torch
backend does not read, a wrong type or a bad value fails at start-up with a `ConfigError` naming
the key.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from typing import Any

from omegaconf import DictConfig, OmegaConf

from agentlightning.config.schema import ConfigError, dataclass_keys
from agentlightning.torch_backend.lora import LoraSettings, lora_settings
from agentlightning.torch_backend.losses import RolloutCorrection
from agentlightning.torch_backend.policy import ActorConfig
from agentlightning.trainer.config import (
    FIXED_VERL_KEYS,
    VERL_KEYS,
    AgentLightningConfig,
    DataConfig,
    TrainerConfig,
    check_keys,
    core_config_keys,
    load_section,
)
from agentlightning.trainer.distill import DistillConfig


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
    # CPU, few cores: each server's engine-core process moved onto its worker's cores once ready
    # (it busy-polls the worker; beside the API server it holds streams back): docs/vllm.md
    engine_core_beside_worker: bool = False
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
    # algorithm.rollout_correction.* (verl's section), read by load_torch_backend_config
    rollout_correction: RolloutCorrection = field(default_factory=RolloutCorrection)
    # algorithm.distill.*: on-policy distillation (distill.py), read by load_torch_backend_config
    distill: DistillConfig = field(default_factory=DistillConfig)

    @property
    def lora(self) -> LoraSettings:
        return lora_settings(self.model.lora_rank, self.model.lora_alpha, self.model.target_modules)

    def validate(self) -> None:
        try:
            _ = self.lora  # a bad LoRA key fails here, naming it
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if self.rollout.n < 1:
            raise ConfigError("actor_rollout_ref.rollout.n must be at least 1")
        if self.rollout.engine not in ("auto", "torch", "vllm"):
            raise ConfigError(
                f"actor_rollout_ref.rollout.engine must be auto, torch or vllm, got {self.rollout.engine!r}"
            )
        if self.rollout.vllm.num_servers < 1:
            raise ConfigError("actor_rollout_ref.rollout.vllm.num_servers must be at least 1")
        if self.rollout.temperature <= 0:
            raise ConfigError("actor_rollout_ref.rollout.temperature must be > 0 for training")
        self.actor.temperature = self.rollout.temperature
        self.actor.gradient_checkpointing = self.model.enable_gradient_checkpointing
        try:
            self.actor.validate()
        except ValueError as exc:
            raise ConfigError(f"actor_rollout_ref.{exc}") from None
        try:
            self.rollout_correction.validate()
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        self.distill.validate()


def load_torch_backend_config(cfg: DictConfig | dict[str, Any] | None) -> TorchBackendConfig:
    """Read `actor_rollout_ref.{model,actor,rollout}` and `algorithm.rollout_correction` from a full
    training config, after checking that the torch backend reads every key of it."""
    root = OmegaConf.create(cfg or {})
    check_torch_keys(root)
    config: TorchBackendConfig = load_section(root, "actor_rollout_ref", TorchBackendConfig)
    config.rollout_correction = load_section(root, "algorithm.rollout_correction", RolloutCorrection)
    config.distill = load_section(root, "algorithm.distill", DistillConfig)
    config.validate()
    return config


# --- every key does something --------------------------------------------------------------

# Set by validate() from other keys: a user value would be overwritten, so they are not keys.
_DERIVED = ("actor_rollout_ref.actor.temperature", "actor_rollout_ref.actor.gradient_checkpointing")

# verl's keys for *how* verl runs (parallelism, memory, placement, its data loader, its other
# workers), not *what* it computes. Every v1.0 config is a verl config and carries some of them
# (calc_x sets rollout.name, multi_turn.format, engine_kwargs), so the torch backend accepts them
# unread, with one warning naming them (docs/training.md#keys-the-torch-backend-accepts-unread).
VERL_ENGINE_KEYS: dict[str, str] = {
    "actor_rollout_ref.hybrid_engine": "verl's actor/rollout colocation",
    "actor_rollout_ref.nccl_timeout": "verl's process groups",
    "actor_rollout_ref.ref.": "verl's reference worker (the torch backend keeps its own reference copy)",
    "actor_rollout_ref.actor.strategy": "verl's training engine",
    "actor_rollout_ref.actor.fsdp_config.": "verl's FSDP engine",
    "actor_rollout_ref.actor.megatron.": "verl's Megatron engine",
    "actor_rollout_ref.actor.checkpoint.": "verl's checkpoint contents",
    "actor_rollout_ref.actor.ulysses_sequence_parallel_size": "verl's sequence parallelism",
    "actor_rollout_ref.actor.use_torch_compile": "verl's FSDP engine",
    "actor_rollout_ref.actor.ppo_micro_batch_size": "verl's deprecated global micro-batch size",
    "actor_rollout_ref.actor.shuffle": "verl's data shuffle (the trainer core orders the mini-batches)",
    "actor_rollout_ref.actor.use_remove_padding": "verl's packing",
    "actor_rollout_ref.model.use_remove_padding": "verl's packing",
    "actor_rollout_ref.model.use_shm": "verl's model loading",
    "actor_rollout_ref.model.external_lib": "verl's model loading",
    "actor_rollout_ref.model.override_config.": "verl's model loading",
    "actor_rollout_ref.model.trust_remote_code": "verl's model loading",
    "actor_rollout_ref.model.enable_activation_offload": "verl's FSDP engine",
    "actor_rollout_ref.model.use_fused_kernels": "verl's FSDP engine",
    "actor_rollout_ref.rollout.name": "verl's rollout engine (the torch backend's is rollout.engine)",
    "actor_rollout_ref.rollout.mode": "verl's rollout mode",
    "actor_rollout_ref.rollout.tensor_model_parallel_size": "verl's vLLM parallelism",
    "actor_rollout_ref.rollout.data_parallel_size": "verl's vLLM parallelism",
    "actor_rollout_ref.rollout.expert_parallel_size": "verl's vLLM parallelism",
    "actor_rollout_ref.rollout.pipeline_model_parallel_size": "verl's vLLM parallelism",
    "actor_rollout_ref.rollout.gpu_memory_utilization": "verl's vLLM memory (the torch backend's is rollout.vllm.*)",
    "actor_rollout_ref.rollout.free_cache_engine": "verl's vLLM memory",
    "actor_rollout_ref.rollout.enforce_eager": "verl's vLLM start-up (the torch backend's is rollout.vllm.*)",
    "actor_rollout_ref.rollout.enable_chunked_prefill": "verl's vLLM scheduling",
    "actor_rollout_ref.rollout.load_format": "verl's vLLM weight loading",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size": "verl's log-prob pass",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": "verl's log-prob pass",
    "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz": "verl's log-prob pass",
    "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu": "verl's log-prob pass",
    "actor_rollout_ref.rollout.calculate_log_probs": "the Gateway records log-probs",
    "actor_rollout_ref.rollout.multi_turn.": "verl's own agent loop (agents run behind the Gateway)",
    "actor_rollout_ref.rollout.agent.": "verl's own agent loop (agents run behind the Gateway)",
    "actor_rollout_ref.rollout.engine_kwargs.": "verl's vLLM arguments (the torch backend's are rollout.vllm.extra_args)",
    "critic.": "verl's critic worker (GRPO-style algorithms need none)",
    "reward_model.": "verl's reward worker (rewards come from the agents)",
    "custom_reward_function.": "verl's reward function (rewards come from the agents)",
    "ray_init.": "Ray",
    "ray_kwargs.": "Ray",
    "global_profiler.": "verl's profiler",
    "transfer_queue.": "verl's transfer queue",
    "trainer.n_gpus_per_node": "verl's placement (the torch backend uses one device)",
    "trainer.nnodes": "verl's placement (the torch backend uses one device)",
    "trainer.device": "verl's placement (the torch backend's is rollout.device)",
    "trainer.use_v1": "verl's trainer choice",
    "trainer.critic_warmup": "verl's critic",
    "trainer.balance_batch": "verl's data-parallel balancing",
    "trainer.log_val_generations": "verl's validation printout",
    "trainer.ray_wait_register_center_timeout": "Ray",
    "data.truncation": "verl's dataset (rollout inputs are the agents' data)",
    "data.filter_overlong_prompts": "verl's dataset",
    "data.prompt_key": "verl's dataset",
    "data.reward_fn_key": "verl's dataset",
    "data.return_raw_chat": "verl's dataset",
    "data.return_raw_input_ids": "verl's dataset",
    "data.return_full_prompt": "verl's dataset",
    "data.tokenizer": "verl's dataset",
    "data.use_shm": "verl's dataset",
    "data.val_batch_size": "verl's dataset (validation runs every validation input at once)",
    "data.dataloader_num_workers": "verl's dataset",
    "algorithm.kl_ctrl.": "verl's in-reward KL (algorithm.use_kl_in_reward must be false)",
    "algorithm.kl_penalty": "verl's in-reward KL (algorithm.use_kl_in_reward must be false)",
}

# Keys of verl's algorithm that the torch backend implements at one value only.
TORCH_FIXED_KEYS: dict[str, tuple[Any, ...]] = {
    "algorithm.use_kl_in_reward": (False,),  # the KL term is actor.use_kl_loss
    "algorithm.lam": (1.0, 1),  # GAE's λ: no critic
    "critic.enable": (False, None),
}


def torch_read_keys() -> tuple[set[str], set[str]]:
    """(keys, mapping keys) the torch backend reads: the core's, the loop's and its own."""
    read, maps = dataclass_keys(
        "actor_rollout_ref.",
        TorchBackendConfig,
        skip=("actor_rollout_ref.rollout_correction", "actor_rollout_ref.distill"),
    )
    read -= set(_DERIVED)
    rc, _ = dataclass_keys("algorithm.rollout_correction.", RolloutCorrection)
    rc |= dataclass_keys("algorithm.distill.", DistillConfig)[0]
    trainer, _ = dataclass_keys("trainer.", TrainerConfig)
    data, _ = dataclass_keys("data.", DataConfig)
    read |= rc | trainer | data | set(core_config_keys())
    # user-chosen names below (outcomes: checked by trainer/outcomes.py when the loop is made)
    maps |= {"agentlightning.local.env_map", "agentlightning.policies", "agentlightning.outcomes"}
    return read, maps


@cache
def _schema_defaults() -> DictConfig:
    schema = OmegaConf.create(
        {
            "actor_rollout_ref": OmegaConf.structured(TorchBackendConfig),
            "agentlightning": OmegaConf.structured(AgentLightningConfig),
            "trainer": OmegaConf.structured(TrainerConfig),
            "data": OmegaConf.structured(DataConfig),
            "algorithm": {
                "rollout_correction": OmegaConf.structured(RolloutCorrection),
                "distill": OmegaConf.structured(DistillConfig),
            },
        }
    )
    OmegaConf.set_readonly(schema, True)
    return schema


_ABSENT = object()


def torch_default(key: str) -> Any:
    """The value the torch backend uses for `key` when no config sets it. The defaults are written
    once, in the schemas (the dataclasses here and in trainer/config.py, `VERL_KEYS` for the
    core's verl-named keys): `agl-train --help` shows them, and the shipped train.yaml is checked
    against them (tests/torch_backend/test_config_defaults.py). KeyError: a key it does not read."""
    if key in FIXED_VERL_KEYS:
        return FIXED_VERL_KEYS[key][-1]
    if key in VERL_KEYS:
        return VERL_KEYS[key][1]
    value = OmegaConf.select(_schema_defaults(), key, default=_ABSENT)
    if value is _ABSENT:
        raise KeyError(key)
    return OmegaConf.to_container(value) if OmegaConf.is_config(value) else value


def check_torch_keys(cfg: DictConfig | dict[str, Any]) -> dict[str, str]:
    """Fail start-up on a key the torch backend does not read (naming it, with a did-you-mean);
    verl's engine keys are accepted unread with one warning. Returns those."""
    read, maps = torch_read_keys()
    root = cfg if isinstance(cfg, DictConfig) else OmegaConf.create(cfg)
    for key, allowed in TORCH_FIXED_KEYS.items():
        value = OmegaConf.select(root, key, default=allowed[0])
        if not any(value == a and isinstance(value, bool) == isinstance(a, bool) for a in allowed):
            raise ConfigError(
                f"{key}={value!r} is not implemented by the torch backend (it implements {allowed[0]!r})"
            )

    def compat(key: str, value: Any) -> str | None:
        for pattern, why in VERL_ENGINE_KEYS.items():
            if key == pattern or (pattern.endswith(".") and key.startswith(pattern)):
                return why
        return None

    return check_keys(root, "torch", read | set(TORCH_FIXED_KEYS), maps, compat)
