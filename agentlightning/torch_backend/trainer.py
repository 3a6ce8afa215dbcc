"""The torch backend: `TorchBackend` for the trainer core's loop, and `run_ppo(config, train, val)`.

One process holds the policy (fp32, trained by `PolicyUpdater`); a rollout engine
(`rollout_engine.py`) serves it — a serving copy behind the built-in inference server, or with
`actor_rollout_ref.rollout.engine=vllm` real vLLM servers started as child processes
(`vllm_engine.py`); agents reach the servers only through the Gateway. The loop itself —
collect, build, update, publish, validate, save, resume — is the trainer core's
(`agentlightning.trainer.loop`); this backend supplies the update, the publish to its
engine and its part of each checkpoint.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from agentlightning.client import GatewayClient
from agentlightning.log import get_logger
from agentlightning.torch_backend.checkpoint import (
    load_policy_state,
    save_policy_state,
    set_torch_rng_state,
    torch_rng_state,
)
from agentlightning.torch_backend.config import TorchBackendConfig, load_torch_backend_config
from agentlightning.torch_backend.lora import (
    adapter_state,
    apply_lora,
    count_parameters,
    full_state,
    save_adapter,
)
from agentlightning.torch_backend.models import load_model, load_tokenizer, resolve_device
from agentlightning.torch_backend.policy import PolicyUpdater
from agentlightning.torch_backend.rollout_engine import RolloutEngine, open_rollout_engine
from agentlightning.trainer import ConfigError, CoreConfig, TrainingBatch
from agentlightning.trainer.checkpoint import ADAPTER_DIR
from agentlightning.trainer.config import TrainingConfig, load_training_config
from agentlightning.trainer.distill import Teacher, distill, open_teacher
from agentlightning.trainer.loop import TrainingLoop

log = get_logger("torch_backend")


class TorchBackend:
    """The policy and its update in this process; a rollout engine (torch or vLLM) serves it."""

    def __init__(
        self, settings: TrainingConfig, config: TorchBackendConfig, policy: str | None = None
    ) -> None:
        """`settings`: the run's parsed config (`load_training_config`); `config`: this backend's
        block (`load_torch_backend_config`). `policy`: with several policies
        (`agentlightning.policies`), the one this backend trains and serves under its name."""
        self.core: CoreConfig = settings.core
        self.config = config
        self.served_name = policy or self.core.agl.model_name
        self.model_path = (self.core.agl.policy_path(policy) if policy else None) or config.model.path
        self.torch_threads = settings.trainer.torch_threads
        self.output_dir = Path(settings.trainer.output_dir)
        if policy:  # each policy's engine files (vLLM's) apart
            self.output_dir = self.output_dir / "policies" / policy
        self.updater: PolicyUpdater | None = None
        self.engine: RolloutEngine | None = None  # serves the policy: the torch engine or vLLM
        self.peft_model: Any = None  # with LoRA: the PeftModel around the policy (for its adapter files)
        self.teacher: Teacher | None = None  # algorithm.distill: scores the rows' tokens before each update

    def start(self, step: int, version: int, total_steps: int, checkpoint: Path | None) -> list[str]:
        if self.torch_threads:
            torch.set_num_threads(self.torch_threads)
        device = resolve_device(self.config.rollout.device)
        state = load_policy_state(checkpoint) if checkpoint is not None else None
        torch.manual_seed(self.core.agl.seed)
        try:
            policy, tokenizer = load_model(self.model_path, device, torch.float32, self.core.agl.seed)
        except OSError as exc:
            key = "actor_rollout_ref.model.path"
            if self.model_path != self.config.model.path:
                key = f"agentlightning.policies.{self.served_name}.path"
            raise ConfigError(f"{key}: cannot load {self.model_path!r}: {exc}") from None
        if self.config.distill.enable:
            seed = self.core.agl.seed
            self.teacher = open_teacher(
                self.config.distill, tokenizer, lambda name: load_tokenizer(name, seed)
            )
        policy = self._with_lora(policy)
        self._set_lr_horizon(total_steps)
        self.updater = PolicyUpdater(
            policy, self.config.actor, device=device, correction=self.config.rollout_correction
        )
        if state is not None:
            self._load_policy(state["policy"])
            set_torch_rng_state(state["rng"])
        self.engine = open_rollout_engine(
            self.config.rollout,
            model_path=self.model_path,
            model=self.updater.model,
            tokenizer=tokenizer,
            served_model_name=self.served_name,
            device=device,
            workdir=self.output_dir / "vllm",
            version=version,
            step=step,
            lora_rank=self.config.lora.rank,
        )
        return self.engine.start(self._served())

    def _load_policy(self, policy_state: dict[str, Any]) -> None:
        """A checkpoint's policy and optimizer state into the updater."""
        assert self.updater is not None, "start() first"
        if self.peft_model is not None:  # the checkpoint holds the adapter; the base is rebuilt
            try:
                policy_state = {
                    **policy_state,
                    "model": full_state(self.updater.model, policy_state["model"]),
                }
            except ValueError as exc:
                raise ConfigError(f"actor_rollout_ref.model.lora_rank: {exc}") from None
        self.updater.load_state_dict(policy_state)

    def _served(self) -> Any:
        """What the engine serves: the policy, or with LoRA its PeftModel (the engine moves the adapter)."""
        assert self.updater is not None, "start() first"
        return self.peft_model or self.updater.model

    def _with_lora(self, model: Any) -> Any:
        """With `lora_rank > 0`: the model with a fresh adapter in it, everything else frozen."""
        settings = self.config.lora
        if not settings.enabled:
            return model
        try:
            self.peft_model = apply_lora(model, settings)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        trainable, total = count_parameters(model)
        log.info(
            "lora_adapter",
            rank=settings.rank,
            alpha=settings.alpha,
            target_modules=settings.target_modules,
            trainable_parameters=trainable,
            parameters=total,
        )
        return model

    def update(self, batch: TrainingBatch) -> dict[str, float]:
        assert self.updater is not None, "start() first"
        metrics: dict[str, float] = {}
        if self.teacher is not None and batch.rows:
            rows = batch.rows
            missing = [r for r in rows if r.rollout_log_probs is None]
            recomputed = dict(zip(map(id, missing), self.updater.compute_log_probs(missing), strict=True))
            student = [r.rollout_log_probs or recomputed[id(r)] for r in rows]
            metrics = distill(rows, self.teacher.score_rows(rows), student, self.config.distill)
        return {**self.updater.update(batch.minibatches()), **metrics}

    def publish(self, version: int) -> None:
        assert self.engine is not None, "start() first"
        self.engine.publish(self._served(), version)

    def save(self, folder: Path) -> None:
        assert self.updater is not None, "start() first"
        policy = self.updater.state_dict()
        if self.peft_model is not None:  # the adapter only (and in peft's layout, for other tools)
            policy["model"] = adapter_state(self.updater.model)
            save_adapter(self.peft_model, folder / ADAPTER_DIR)
        save_policy_state(folder, {"policy": policy, "rng": torch_rng_state()})

    def restore(self, folder: Path, lr_scale: float) -> None:
        self._load_policy(load_policy_state(folder)["policy"])
        assert self.updater is not None
        self.updater.set_lr(self.config.actor.optim.lr * lr_scale)

    def close(self) -> None:
        if self.teacher is not None:
            self.teacher.close()
            self.teacher = None
        if self.engine is not None:
            self.engine.close()
            self.engine = None

    def _set_lr_horizon(self, total_steps: int) -> None:
        """Tell the learning-rate warm-up how many optimizer steps the run makes (when unset)."""
        optim = self.config.actor.optim
        if optim.total_training_steps <= 0:
            per_step = -(-self.core.train_batch_size // self.core.ppo_mini_batch_size)
            optim.total_training_steps = total_steps * per_step * self.config.actor.ppo_epochs


class TorchTrainer(TrainingLoop):
    """The trainer core's loop with the torch backend."""

    def __init__(
        self,
        config: DictConfig | Mapping[str, Any],
        train_dataset: Sequence[Any] | None = None,
        val_dataset: Sequence[Any] | None = None,
        client: GatewayClient | None = None,
    ) -> None:
        cfg = config if isinstance(config, DictConfig) else OmegaConf.create(dict(config))
        settings = load_training_config(cfg)
        torch_config = load_torch_backend_config(cfg)
        backend: TorchBackend | dict[str, TorchBackend] = TorchBackend(settings, torch_config)
        if settings.core.agl.policies:  # several policies: one backend each, its own copy of the config
            if torch_config.rollout.port:
                raise ConfigError(
                    "actor_rollout_ref.rollout.port: with agentlightning.policies each policy's server "
                    "takes a free port; leave it 0"
                )
            backend = {
                name: TorchBackend(settings, copy.deepcopy(torch_config), policy=name)
                for name in settings.core.agl.policy_names
            }
        super().__init__(cfg, settings, backend, train_dataset, val_dataset, client)


def run_ppo(
    config: DictConfig | Mapping[str, Any],
    train_dataset: Sequence[Any] | None = None,
    val_dataset: Sequence[Any] | None = None,
) -> dict[str, float]:
    """Train with the torch backend, like v1.0's `run_ppo(config, train_dataset, val_dataset)`.

    Datasets are sequences of rollout inputs; None reads `data.train_files` / `data.val_files`.
    Returns the last validation's metrics.
    """
    return TorchTrainer(config, train_dataset, val_dataset).fit()
