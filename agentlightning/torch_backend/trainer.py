"""The torch backend's training loop, and `run_ppo(config, train_dataset, val_dataset)`.

One process holds the policy (fp32, trained by `PolicyUpdater`) and a serving copy behind the
built-in inference server; agents reach the server only through the Gateway. Each step:

    collect    the trainer core makes rollouts (sync, or async with groups kept in flight)
               and hands back what the Gateway recorded
    build      rows, rewards, advantages, shaping (`build_training_batch`)
    update     GRPO/PPO on the core's mini-batches
    publish    pause the Gateway, drain in-flight calls, swap the weights into the server,
               register the new version, resume (`RolloutManager.update_weights`)
    validate   every `trainer.test_freq` steps, and before the first and after the last
    save       every `trainer.save_freq` steps and after the last (`checkpoint.py`)

`trainer.resume_mode=auto` (the default) continues from the latest checkpoint: the weights,
optimizer, step, model version and data position are restored, so the run goes on with the
step and the samples an uninterrupted run would have had. Groups that were in flight in async
mode when the run stopped are not restored: their samples count as used.
"""

from __future__ import annotations

import copy
import random
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from agentlightning.client import GatewayClient
from agentlightning.log import get_logger
from agentlightning.torch_backend.checkpoint import (
    latest_checkpoint,
    load_checkpoint,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from agentlightning.torch_backend.config import (
    DataConfig,
    TorchBackendConfig,
    TrainerConfig,
    load_loop_config,
    load_torch_backend_config,
)
from agentlightning.torch_backend.engine import TorchEngine
from agentlightning.torch_backend.inference_server import (
    InferenceServer,
    load_model,
    resolve_device,
    resolve_dtype,
)
from agentlightning.torch_backend.policy import PolicyUpdater
from agentlightning.trainer import (
    ConfigError,
    CoreConfig,
    RolloutManager,
    build_training_batch,
    load_core_config,
    make_collector,
    validation_metrics,
)
from agentlightning.trainer.data import DataCursor, load_files
from agentlightning.trainer.tracking import Tracker

log = get_logger("torch_trainer")

FOREVER_EPOCHS = 10**9  # with trainer.total_training_steps, the data cycles until the steps are done


class TorchTrainer:
    """The loop over one Gateway (`agentlightning.agl_base_url`) and its controller's agents."""

    def __init__(
        self,
        config: DictConfig | Mapping[str, Any],
        train_dataset: Sequence[Any] | None = None,
        val_dataset: Sequence[Any] | None = None,
        client: GatewayClient | None = None,
    ) -> None:
        cfg = config if isinstance(config, DictConfig) else OmegaConf.create(dict(config))
        self.config = cfg
        self.core: CoreConfig = load_core_config(cfg)
        self.backend: TorchBackendConfig = load_torch_backend_config(cfg)
        self.loop: TrainerConfig
        self.data_config: DataConfig
        self.loop, self.data_config = load_loop_config(cfg)
        train = list(train_dataset) if train_dataset is not None else None
        if train is None:
            train = load_files(self.data_config.train_files, "data.train_files")
        if not train:
            raise ConfigError("no training data: pass train_dataset or set data.train_files")
        self.val_dataset = (
            list(val_dataset)
            if val_dataset is not None
            else load_files(self.data_config.val_files, "data.val_files")
        )
        batch = self.core.train_batch_size
        epochs = FOREVER_EPOCHS if self.loop.total_training_steps else self.loop.total_epochs
        self.data = DataCursor(train, epochs, self.data_config.shuffle, self.data_config.seed)
        if self.loop.total_training_steps:
            self.total_steps = self.loop.total_training_steps
        else:
            self.total_steps = len(train) * self.loop.total_epochs // batch
            if self.total_steps == 0:
                raise ConfigError(
                    f"data.train_batch_size ({batch}) is larger than the training data "
                    f"({len(train)} samples × {self.loop.total_epochs} epochs): no step can be made"
                )
        self.client = client
        self.step = 0
        self.version = 0
        self.history: list[dict[str, float]] = []  # validation metrics, with their step

    # --- public ---------------------------------------------------------------------------

    def fit(self) -> dict[str, float]:
        """Train to `total_steps`; returns the last validation's metrics (empty without val data)."""
        if self.loop.torch_threads:
            torch.set_num_threads(self.loop.torch_threads)
        device = resolve_device(self.backend.rollout.device)
        resume = self._resume_path()
        state = load_checkpoint(resume) if resume is not None else None
        torch.manual_seed(self.core.agl.seed)
        random.seed(self.core.agl.seed)
        try:
            policy, tokenizer = load_model(self.backend.model.path, device, torch.float32, self.core.agl.seed)
        except OSError as exc:
            raise ConfigError(
                f"actor_rollout_ref.model.path: cannot load {self.backend.model.path!r}: {exc}"
            ) from None
        self._set_lr_horizon()
        updater = PolicyUpdater(policy, self.backend.actor, device=device)
        if state is not None:
            self._restore(state, updater)
            log.info("resumed", checkpoint=str(resume), step=self.step, version=self.version)
        serving = copy.deepcopy(updater.model).to(dtype=resolve_dtype(self.backend.rollout.dtype, device))
        rollout = self.backend.rollout
        engine = TorchEngine(
            serving,
            tokenizer,
            max_num_seqs=rollout.max_num_seqs,
            max_model_len=rollout.max_model_len,
            max_num_batched_tokens=rollout.max_num_batched_tokens,
            seed=rollout.seed + self.step,
            version=self.version,
        )
        server: InferenceServer | None = None
        manager: RolloutManager | None = None
        tracker: Tracker | None = None
        finished = False
        try:
            server = InferenceServer(engine, self.core.agl.model_name, rollout.host, rollout.port).start()
            manager = RolloutManager(self.core, self.client)
            manager.register_endpoints([server.endpoint], self.version)
            tracker = Tracker(
                self.loop.logger,
                self.loop.output_dir,
                self.total_steps,
                first_step=self.step,
                project=self.loop.project_name,
                experiment=self.loop.experiment_name,
                config=OmegaConf.to_container(self.config, resolve=True),  # type: ignore[arg-type]
                gateway=manager.client,
            )
            log.info(
                "training_started",
                steps=self.total_steps,
                first_step=self.step,
                endpoint=server.endpoint,
                device=str(device),
                train_samples=len(self.data.samples),
                val_samples=len(self.val_dataset),
            )
            self._run(manager, updater, engine, tracker)
            finished = True
        finally:
            if manager is not None:
                # Rollouts still in flight: after a crash or Ctrl-C, and in async mode the groups
                # carried past the last step. Fail them before their inference server goes away.
                abandoned = manager.abandon()
                if abandoned:
                    reason = "in flight after the last step" if finished else "the trainer stopped"
                    log.warning("rollouts_abandoned", n=abandoned, reason=reason)
                manager.close()
            if tracker is not None:
                tracker.close()
            if server is not None:
                server.stop()
            engine.close()
        return self.history[-1] if self.history else {}

    # --- the loop -------------------------------------------------------------------------

    def _run(
        self, manager: RolloutManager, updater: PolicyUpdater, engine: TorchEngine, tracker: Tracker
    ) -> None:
        collector = make_collector(manager)
        loop = self.loop
        if self.step >= self.total_steps:
            log.info("nothing_to_train", step=self.step, total_steps=self.total_steps)
            return
        if self.step == 0 and loop.val_before_train:
            self._validate(manager, tracker)
        last_validated = self.step
        while self.step < self.total_steps:
            started = time.perf_counter()
            step = self.step + 1
            rollouts, metrics = collector.collect(self.data.next, step)
            if not rollouts:
                log.warning("training_data_exhausted", step=self.step)
                break
            batch = build_training_batch(rollouts, self.core, step, policy_version=self.version)
            metrics.update(batch.metrics)
            if batch.empty:
                log.warning("empty_batch_no_update", step=step, hint="see training/n_* metrics in the log")
            else:
                metrics.update(updater.update(batch.minibatches()))
                new_version = self.version + 1

                def publish(new_version: int = new_version) -> None:
                    engine.publish(updater.model, new_version)

                metrics.update(manager.update_weights(publish, new_version))
                self.version = new_version
            self.step = step
            metrics["training/epoch"] = self.data.epoch
            metrics["training/global_step"] = step
            metrics["timing/step_s"] = time.perf_counter() - started
            last = self.step == self.total_steps
            if (loop.test_freq > 0 and step % loop.test_freq == 0) or last:
                metrics.update(self._validate(manager, tracker, log_now=False))
                last_validated = step
            tracker.log(metrics, step)
            if loop.save_freq > 0 and (step % loop.save_freq == 0 or last):
                self._save(updater)
        if last_validated != self.step:
            self._validate(manager, tracker)

    def _validate(self, manager: RolloutManager, tracker: Tracker, log_now: bool = True) -> dict[str, float]:
        if not self.val_dataset:
            return {}
        started = time.perf_counter()
        rollouts, _ = manager.collect(self.val_dataset, self.step, is_train=False)
        metrics = validation_metrics(rollouts, self.core.agl.reward_fillna_value)
        metrics["timing/validation_s"] = time.perf_counter() - started
        self.history.append({"step": float(self.step), **metrics})
        if log_now:
            tracker.log(metrics, self.step)
        return metrics

    # --- checkpoints ----------------------------------------------------------------------

    def _resume_path(self) -> Path | None:
        mode = self.loop.resume_mode
        if mode == "disable":
            return None
        if mode == "resume_path":
            return Path(self.loop.resume_from_path or "")
        return latest_checkpoint(self.loop.default_local_dir)

    def _save(self, updater: PolicyUpdater) -> None:
        state = {
            "step": self.step,
            "version": self.version,
            "policy": updater.state_dict(),
            "data": self.data.state_dict(),
            "rng": rng_state(),
            "config": OmegaConf.to_container(self.config, resolve=True),
        }
        save_checkpoint(self.loop.default_local_dir, self.step, state, self.loop.max_actor_ckpt_to_keep)

    def _restore(self, state: dict[str, Any], updater: PolicyUpdater) -> None:
        updater.load_state_dict(state["policy"])
        self.data.load_state_dict(state["data"])
        self.step = int(state["step"])
        self.version = int(state["version"])
        set_rng_state(state["rng"])

    def _set_lr_horizon(self) -> None:
        """Tell the learning-rate warm-up how many optimizer steps the run makes (when unset)."""
        optim = self.backend.actor.optim
        if optim.total_training_steps <= 0:
            per_step = -(-self.core.train_batch_size // self.core.ppo_mini_batch_size)
            optim.total_training_steps = self.total_steps * per_step * self.backend.actor.ppo_epochs


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
