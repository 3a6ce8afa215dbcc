"""The training loop, shared by every backend; a backend supplies only what differs.

Each step:

    collect    rollouts through the Gateway (sync, or async with groups kept in flight)
    build      rows, rewards, advantages, shaping (`collect_training_batch`; DAPO's top-up)
    update     the backend's policy update on the core's mini-batches
    publish    pause the Gateway, drain in-flight calls, the backend puts the new weights into its
               serving engines, register the new version, resume (`RolloutManager.update_weights`)
    validate   every `trainer.test_freq` steps, and before the first and after the last
    save       every `trainer.save_freq` steps and after the last (`checkpoint.py`)

`trainer.resume_mode=auto` (the default) continues from the latest checkpoint: the step, model
version, data position and RNG are restored here and the backend restores its own state from
the same folder, so the run goes on with the step and the samples an uninterrupted run would
have had. Groups that were in flight in async mode when the run stopped are not restored:
their samples count as used.

Several policies (`agentlightning.policies`, docs/policies.md): the backend is one per policy,
each serving under the policy's name; every step builds each policy's batch from its view of
the rollouts (`policies.py`), updates each policy with rows, and publishes them all under one
pause, each with its own version. Their metrics are prefixed `policy/NAME/`.
"""

from __future__ import annotations

import functools
import random
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from omegaconf import DictConfig, OmegaConf

from agentlightning.client import GatewayClient
from agentlightning.log import get_logger
from agentlightning.rewards import last_reward
from agentlightning.trainer.batch import (
    TrainingBatch,
    build_training_batch,
    collect_training_batch,
    say_what_was_left_out,
)
from agentlightning.trainer.checkpoint import (
    latest_checkpoint,
    load_loop_state,
    python_rng_state,
    save_checkpoint,
    set_python_rng_state,
)
from agentlightning.trainer.collector import make_collector
from agentlightning.trainer.config import ConfigError, CoreConfig, DataConfig, TrainerConfig, TrainingConfig
from agentlightning.trainer.data import DataCursor, load_files
from agentlightning.trainer.manager import RolloutManager
from agentlightning.trainer.metrics import validation_metrics
from agentlightning.trainer.policies import policy_views, prefixed, shared_view
from agentlightning.trainer.tracking import Tracker

log = get_logger("trainer")

FOREVER_EPOCHS = 10**9  # with trainer.total_training_steps, the data cycles until the steps are done


class TrainerBackend(Protocol):
    """What a backend supplies to the loop: the policy, its update and its serving engines."""

    def start(self, step: int, version: int, total_steps: int, checkpoint: Path | None) -> Sequence[str]:
        """Build the policy (restored from the `checkpoint` folder when resuming), start the serving
        engines at model `version`; return their OpenAI endpoints (`host:port` or URLs).
        `total_steps` is the run's length in loop steps (e.g. for a learning-rate schedule)."""
        ...

    def update(self, batch: TrainingBatch) -> dict[str, float]:
        """Update the policy on `batch.minibatches()`; return the update's metrics."""
        ...

    def publish(self, version: int) -> Sequence[str] | None:
        """Put the updated policy into the serving engines as `version`. Called while the Gateway
        is paused and drained. Returns the new endpoints, or None to keep the current ones."""
        ...

    def save(self, folder: Path) -> None:
        """Write the backend's state (weights, optimizer, RNG) into a checkpoint folder."""
        ...

    def close(self) -> None:
        """Stop the serving engines and free what `start` took; safe to call after a failed start."""
        ...


class TrainingLoop:
    """The loop over one Gateway (`agentlightning.agl_base_url`) and its controller's agents.

    `config` is the run's config as given (recorded with its metrics and checkpoints); `settings`
    the same parsed once by the entry point (`load_training_config`), which also hands the backend
    its parsed block."""

    def __init__(
        self,
        config: DictConfig | Mapping[str, Any],
        settings: TrainingConfig,
        backend: TrainerBackend | Mapping[str, TrainerBackend],
        train_dataset: Sequence[Any] | None = None,
        val_dataset: Sequence[Any] | None = None,
        client: GatewayClient | None = None,
    ) -> None:
        self.config = config if isinstance(config, DictConfig) else OmegaConf.create(dict(config))
        self.core: CoreConfig = settings.core
        # One backend per policy, keyed by the name it serves under (one policy: `model_name`).
        names = self.core.agl.policy_names
        self.several = bool(self.core.agl.policies)
        if isinstance(backend, Mapping):
            if list(backend) != names:
                raise ConfigError(f"agentlightning.policies: backends for {list(backend)}, policies {names}")
            self.backends: dict[str, TrainerBackend] = dict(backend)
        elif self.several:
            raise ConfigError(
                "agentlightning.policies: this backend trains one policy; several policies in one run "
                "need the torch backend (docs/policies.md)"
            )
        else:
            self.backends = {names[0]: backend}
        self.backend = self.backends[names[0]]
        if self.several and self.core.filter_groups:
            raise ConfigError(
                "algorithm.filter_groups.enable with agentlightning.policies: dynamic sampling of "
                "several policies is not implemented (a group may carry signal for one role only)"
            )
        self.loop: TrainerConfig = settings.trainer
        self.data_config: DataConfig = settings.data
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
        self.versions = dict.fromkeys(self.backends, 0)  # each policy's served version
        self.history: list[dict[str, float]] = []  # validation metrics, with their step

    # --- public ---------------------------------------------------------------------------

    def fit(self) -> dict[str, float]:
        """Train to `total_steps`; returns the last validation's metrics (empty without val data)."""
        resume = self._resume_path()
        random.seed(self.core.agl.seed)
        if resume is not None:
            self._restore(load_loop_state(resume))
        manager: RolloutManager | None = None
        tracker: Tracker | None = None
        finished = False
        try:
            served = {
                name: list(
                    backend.start(
                        self.step, self.versions[name], self.total_steps, self._backend_dir(resume, name)
                    )
                )
                for name, backend in self.backends.items()
            }
            endpoints = [e for urls in served.values() for e in urls]
            if resume is not None:
                log.info("resumed", checkpoint=str(resume), step=self.step, versions=self.versions)
            manager = RolloutManager(self.core, self.client)
            manager.register_policies(served, self.versions)
            tracker = Tracker(
                self.loop.logger,
                self.loop.output_dir,
                self.total_steps,
                first_step=self.step,
                project=self.loop.project_name,
                experiment=self.loop.experiment_name,
                config=OmegaConf.to_container(self.config, resolve=True),  # type: ignore[arg-type]  # a DictConfig: a dict
                gateway=manager.client,
            )
            log.info(
                "training_started",
                steps=self.total_steps,
                first_step=self.step,
                endpoints=list(endpoints),
                train_samples=len(self.data.samples),
                val_samples=len(self.val_dataset),
            )
            self._run(manager, tracker)
            finished = True
        finally:
            if manager is not None:
                # Rollouts still in flight: after a crash or Ctrl-C, and in async mode the groups
                # carried past the last step. Fail them before their serving engines go away.
                abandoned = manager.abandon()
                if abandoned:
                    reason = "in flight after the last step" if finished else "the trainer stopped"
                    log.warning("rollouts_abandoned", n=abandoned, reason=reason)
                manager.close()
            if tracker is not None:
                tracker.close()
            for backend in self.backends.values():
                backend.close()
        return self.history[-1] if self.history else {}

    # --- the loop -------------------------------------------------------------------------

    def _run(self, manager: RolloutManager, tracker: Tracker) -> None:
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
            if self.several:
                self._train_policies(manager, rollouts, step, metrics)
            else:
                self._train_one(manager, collector, rollouts, step, metrics)
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
                self._save()
        if last_validated != self.step:
            self._validate(manager, tracker)

    @property
    def version(self) -> int:
        """The (first) policy's served version."""
        return self.versions[next(iter(self.versions))]

    def _train_one(
        self,
        manager: RolloutManager,
        collector: Any,
        rollouts: list[Any],
        step: int,
        metrics: dict[str, float],
    ) -> None:
        """One policy: build (with DAPO's top-up), update, publish (the v1.0 shape)."""
        name = next(iter(self.backends))
        more = functools.partial(collector.collect, self.data.next, step)  # DAPO's top-up
        batch = collect_training_batch(rollouts, more, self.core, step, metrics, self.versions[name])
        metrics.update(batch.metrics)
        if batch.empty:  # said once (`batch_empty_nothing_to_train`): no update
            return
        metrics.update(self.backend.update(batch))
        new_version = self.versions[name] + 1

        def publish(new_version: int = new_version) -> Sequence[str] | None:
            return self.backend.publish(new_version)

        metrics.update(manager.update_weights(publish, new_version))
        self.versions[name] = new_version

    def _train_policies(
        self, manager: RolloutManager, rollouts: list[Any], step: int, metrics: dict[str, float]
    ) -> None:
        """Several policies: each its batch from its view of the rollouts, its update; one publish."""
        new_versions = dict(self.versions)
        publish: dict[str, Any] = {}
        for name, backend in self.backends.items():
            views = policy_views(rollouts, name)
            batch = build_training_batch(views, self.core, step, policy_version=self.versions[name])
            metrics.update(prefixed(name, batch.metrics))
            say_what_was_left_out(step, batch.metrics, policy=name)
            publish[name] = lambda: None  # keeps its endpoints and version
            if batch.empty:
                continue
            metrics.update(prefixed(name, backend.update(batch)))
            new_versions[name] += 1
            publish[name] = lambda backend=backend, version=new_versions[name]: backend.publish(version)
        # The task's (shared) reward, as the validation's `val/reward`; each role's is prefixed.
        shared = [last_reward(shared_view(r).events) for r in rollouts if r.is_train]
        fill = self.core.agl.reward_fillna_value
        metrics["training/reward"] = sum(fill if v is None else v for v in shared) / max(len(shared), 1)
        if new_versions != self.versions:
            metrics.update(manager.update_policies(publish, new_versions))
            self.versions = new_versions

    def _validate(self, manager: RolloutManager, tracker: Tracker, log_now: bool = True) -> dict[str, float]:
        if not self.val_dataset:
            return {}
        started = time.perf_counter()
        rollouts, _ = manager.collect(self.val_dataset, self.step, is_train=False)
        fill = self.core.agl.reward_fillna_value
        if self.several:  # the task's (shared) reward unprefixed, each role's under policy/NAME/
            metrics = validation_metrics([shared_view(r) for r in rollouts], fill)
            for name in self.backends:
                metrics.update(prefixed(name, validation_metrics(policy_views(rollouts, name), fill)))
        else:
            metrics = validation_metrics(rollouts, fill)
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

    def _save(self) -> None:
        state = {
            "step": self.step,
            "version": self.version,
            "versions": dict(self.versions),
            "data": self.data.state_dict(),
            "rng": python_rng_state(),
            "config": OmegaConf.to_container(self.config, resolve=True),
        }

        def save_backends(folder: Path) -> None:
            for name, backend in self.backends.items():
                target = self._backend_dir(folder, name) or folder
                target.mkdir(parents=True, exist_ok=True)
                backend.save(target)

        save_checkpoint(
            self.loop.default_local_dir, self.step, state, save_backends, self.loop.max_actor_ckpt_to_keep
        )

    def _backend_dir(self, folder: Path | None, name: str) -> Path | None:
        """Where a policy's backend state lives in a checkpoint: the folder itself for one policy
        (as before policies existed), `policies/NAME/` in it for several."""
        if folder is None or not self.several:
            return folder
        return folder / "policies" / name

    def _restore(self, state: dict[str, Any]) -> None:
        self.data.load_state_dict(state["data"])
        self.step = int(state["step"])
        versions = state.get("versions") if self.several else None
        versions = versions or {next(iter(self.versions)): state["version"]}
        if set(versions) != set(self.versions):
            raise ConfigError(
                f"trainer.resume_mode: the checkpoint holds policies {sorted(versions)}, "
                f"the run declares {sorted(self.versions)} (agentlightning.policies)"
            )
        self.versions = {name: int(versions[name]) for name in self.versions}
        set_python_rng_state(state["rng"])
