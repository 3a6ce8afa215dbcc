"""The training loop, shared by every backend; a backend supplies only what differs.

Each step:

    collect    rollouts through the Gateway (sync, or async with groups kept in flight)
    build      rows, rewards, advantages, shaping (`collect_training_batch`; DAPO's top-up)
    update     the backend's policy update on the core's mini-batches
    publish    pause the Gateway, drain in-flight calls, the backend puts the new weights into its
               serving engines, register the new version, resume (`RolloutManager.update_weights`)
    validate   every `trainer.test_freq` steps, and before the first and after the last
    keep       a new best validation is saved and marked best; a collapse rolls back to it or
               stops the run (`gains.py`, `trainer.keep_best`, `trainer.collapse_guard`)
    save       every `trainer.save_freq` steps and after the last (`checkpoint.py`)

`trainer.resume_mode=auto` (the default) continues from the latest checkpoint: the step, model
version, data position and RNG are restored here and the backend restores its own state from
the same folder, so the run goes on with the step and the samples an uninterrupted run would
have had. Groups that were in flight in async mode when the run stopped are not restored:
their samples count as used. A checkpoint already at the run's last step is refused
(`RunAlreadyFinished`, a non-zero exit) rather than resumed into a run that does nothing.

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
from agentlightning.config.schema import ConfigError
from agentlightning.log import get_logger
from agentlightning.rewards import last_reward
from agentlightning.trainer.batch import (
    TrainingBatch,
    build_training_batch,
    collect_training_batch,
    say_what_was_left_out,
)
from agentlightning.trainer.checkpoint import (
    LOOP_STATE_FILE,
    best_checkpoint,
    latest_checkpoint,
    load_loop_state,
    mark_best_checkpoint,
    python_rng_state,
    save_checkpoint,
    set_python_rng_state,
    step_dir,
)
from agentlightning.trainer.collector import make_collector
from agentlightning.trainer.config import CoreConfig, DataConfig, TrainerConfig, TrainingConfig
from agentlightning.trainer.data import DataCursor, load_files
from agentlightning.trainer.failures import check_rollouts
from agentlightning.trainer.gains import GainKeeper, Verdict
from agentlightning.trainer.manager import RolloutManager
from agentlightning.trainer.metrics import validation_metrics
from agentlightning.trainer.outcomes import parse_outcome_policy, valid_for_validation
from agentlightning.trainer.policies import policy_views, prefixed, shared_view
from agentlightning.trainer.tracking import Tracker

log = get_logger("trainer")

FOREVER_EPOCHS = 10**9  # with trainer.total_training_steps, the data cycles until the steps are done


class RunAlreadyFinished(ConfigError):
    """The checkpoint to resume from is already at the run's last step: nothing would be trained.
    A ConfigError: the command lines exit 2 with the message (rerun with another output folder)."""


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

    def restore(self, folder: Path, lr_scale: float) -> None:
        """Load the policy and optimizer saved in a checkpoint folder (the collapse guard's
        rollback) and set the learning rate to the configured one times `lr_scale`; the loop
        publishes the restored policy next."""
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
        # Checked before anything starts: a bad rule is refused naming its key.
        parse_outcome_policy(self.core.agl.outcomes, self.core.agl.failed_rollouts)
        self.loop: TrainerConfig = settings.trainer
        guard = self.loop.collapse_guard
        if guard.enable and guard.action == "rollback" and not self.loop.keep_best:
            raise ConfigError(
                "trainer.collapse_guard.action=rollback reloads the best checkpoint, which "
                "trainer.keep_best=false does not keep: set keep_best=true, action=stop or enable=false"
            )
        self.gains = GainKeeper(guard)
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
            if self.step >= self.total_steps:
                raise self._already_finished(resume)
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
                if finished:
                    self._say_what_is_kept(tracker)
            for backend in self.backends.values():
                backend.close()
        return self.history[-1] if self.history else {}

    # --- the loop -------------------------------------------------------------------------

    def _run(self, manager: RolloutManager, tracker: Tracker) -> None:
        collector = make_collector(manager)
        loop = self.loop
        if self.step == 0 and loop.val_before_train:
            metrics = self._validate(manager, tracker)
            if self._judge(metrics, {}) is Verdict.NEW_BEST and loop.keep_best:
                self._save(best=True)  # the starting policy: what a run that only loses keeps
        last_validated = self.step
        while self.step < self.total_steps:
            started = time.perf_counter()
            step = self.step + 1
            rollouts, metrics = collector.collect(self.data.next, step)
            if not rollouts:
                log.warning("training_data_exhausted", step=self.step)
                break
            self._say_failures(tracker, rollouts, f"step {step}")
            if self.several:
                self._train_policies(manager, rollouts, step, metrics)
            else:
                self._train_one(manager, collector, rollouts, step, metrics)
            self.step = step
            metrics["training/epoch"] = self.data.epoch
            metrics["training/global_step"] = step
            metrics["timing/step_s"] = time.perf_counter() - started
            last = self.step == self.total_steps
            verdict = None
            if (loop.test_freq > 0 and step % loop.test_freq == 0) or last:
                validation = self._validate(manager, tracker, log_now=False)
                metrics.update(validation)
                verdict = self._judge(validation, metrics)
                last_validated = step
            tracker.log(metrics, step)
            best = verdict is Verdict.NEW_BEST and loop.keep_best
            if best or (loop.save_freq > 0 and (step % loop.save_freq == 0 or last)):
                self._save(best=best)
            if verdict is Verdict.ROLL_BACK:
                self._roll_back(manager, tracker)
            elif verdict is Verdict.STOP:
                tracker.print(self._collapse_line("stopping the run"))
                log.warning("training_stopped_by_collapse_guard", step=self.step, **self.gains.state_dict())
                break
        if last_validated != self.step:
            metrics = self._validate(manager, tracker)
            if self._judge(metrics, {}) is Verdict.NEW_BEST and loop.keep_best:
                self._save(best=True)

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

    def _say_failures(self, tracker: Tracker, rollouts: Sequence[Any], what: str) -> None:
        """Failed rollouts and missing rewards on the console (`failures.py`); every rollout
        failed: `AllRolloutsFailed`, unless agentlightning.stop_when_all_rollouts_fail=false."""
        for line in check_rollouts(rollouts, what, self.core.agl.stop_when_all_rollouts_fail):
            tracker.print(line)
            log.warning("rollouts_not_usable", what=what, detail=line)

    # --- keeping the gains ----------------------------------------------------------------

    def _judge(self, validation: dict[str, float], metrics: dict[str, float]) -> Verdict | None:
        """The gain keeper's verdict on a validation (None without the metric); its state goes
        into `metrics` as `training/best_val`, `training/rollbacks` and `training/lr_scale`."""
        value = validation.get(self.loop.best_metric)
        if value is None:
            return None
        verdict = self.gains.observe(self.step, value)
        s = self.gains.state
        metrics.update(
            {
                "training/best_val": float(s.best_value or 0.0),
                "training/best_step": float(s.best_step or 0),
                "training/rollbacks": float(s.rollbacks),
                "training/lr_scale": s.lr_scale,
            }
        )
        return verdict

    def _collapse_line(self, what: str) -> str:
        s = self.gains.state
        guard = self.loop.collapse_guard
        return (
            f"collapse guard: {self.loop.best_metric} more than {guard.margin:g} below its best "
            f"({s.best_value:.3f}, step {s.best_step}) for {guard.patience} validation(s): {what}"
        )

    def _roll_back(self, manager: RolloutManager, tracker: Tracker) -> None:
        """Reload the best checkpoint into every backend at the lowered learning rate and publish
        it as a new version; the run goes on from the current step with new samples."""
        folder = step_dir(self.loop.default_local_dir, self.gains.state.best_step or 0)
        if not (folder / LOOP_STATE_FILE).is_file():  # keep_best saved it: removed by hand
            raise RuntimeError(f"collapse guard: the best checkpoint {folder} is gone; cannot roll back")
        scale = self.gains.state.lr_scale
        tracker.print(
            self._collapse_line(f"rolling back to step {self.gains.state.best_step}, lr × {scale:g}")
        )
        log.warning(
            "collapse_guard_rollback", step=self.step, checkpoint=str(folder), **self.gains.state_dict()
        )
        for name, backend in self.backends.items():
            backend.restore(self._backend_dir(folder, name) or folder, scale)
        new_versions = {name: version + 1 for name, version in self.versions.items()}
        publish = {
            name: (lambda backend=backend, version=new_versions[name]: backend.publish(version))
            for name, backend in self.backends.items()
        }
        if self.several:
            manager.update_policies(publish, new_versions)
        else:
            name = next(iter(self.backends))
            manager.update_weights(publish[name], new_versions[name])
        self.versions = new_versions

    def _say_what_is_kept(self, tracker: Tracker) -> None:
        """The run's end, said plainly: which checkpoint is the best and what the final one is."""
        s = self.gains.state
        metric = self.loop.best_metric
        if s.best_step is None or not self.history:
            return
        root = self.loop.default_local_dir
        best = best_checkpoint(root) if self.loop.keep_best else None
        kept = f"kept as {best}" if best else "not saved (trainer.keep_best=false)"
        tracker.print(f"best: step {s.best_step}, {metric} {s.best_value:.3f}, {kept}")
        final = self.history[-1].get(metric)
        latest = step_dir(root, self.step)
        saved = f"saved as {latest}" if latest == latest_checkpoint(root) else "not saved (trainer.save_freq)"
        if final is not None:
            tracker.print(f"final: step {self.step}, {metric} {final:.3f}, {saved}")

    def _validate(self, manager: RolloutManager, tracker: Tracker, log_now: bool = True) -> dict[str, float]:
        if not self.val_dataset:
            return {}
        started = time.perf_counter()
        rollouts, _ = manager.collect(self.val_dataset, self.step, is_train=False)
        self._say_failures(tracker, rollouts, f"step {self.step} validation")
        fill = self.core.agl.reward_fillna_value
        # The infrastructure's failures measure it, not the policy (docs/reliability.md).
        every = rollouts
        rollouts, outcome_counts = valid_for_validation(every)
        if self.several:  # the task's (shared) reward unprefixed, each role's under policy/NAME/
            metrics = validation_metrics([shared_view(r) for r in rollouts], fill)
            for name in self.backends:
                metrics.update(prefixed(name, validation_metrics(policy_views(rollouts, name), fill)))
        else:
            metrics = validation_metrics(rollouts, fill)
        metrics.update(outcome_counts)
        metrics["val/n_rollouts"] = len(every)  # the counts keep counting them all
        metrics["val/n_rollouts_failed"] = sum(1 for r in every if r.failed)
        metrics["val/n_rollouts_infrastructure_failed"] = len(every) - len(rollouts)
        if not rollouts:  # every one failed by the infrastructure: nothing measured, nothing judged
            metrics = {k: v for k, v in metrics.items() if not k.endswith("/reward")}
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

    def _already_finished(self, checkpoint: Path) -> RunAlreadyFinished:
        """Said at warning level and raised before anything starts: a rerun into the same output
        folder would otherwise resume the finished run and quietly train nothing."""
        if self.loop.resume_mode == "auto":
            again = (
                "to train again from the start, set another trainer.output_dir or trainer.experiment_name, "
                f"or trainer.resume_mode=disable (overwrites the checkpoints in {self.loop.default_local_dir})"
            )
        else:
            again = "to train from an earlier step, point trainer.resume_from_path at its checkpoint"
        log.warning(
            "run_already_finished", checkpoint=str(checkpoint), step=self.step, total_steps=self.total_steps
        )
        return RunAlreadyFinished(
            f"trainer.resume_mode={self.loop.resume_mode}: the checkpoint {checkpoint} is at step "
            f"{self.step} of the run's {self.total_steps}: the run is finished, nothing to train; "
            f"{again}; to train longer, raise trainer.total_training_steps"
        )

    def _save(self, best: bool = False) -> None:
        """Checkpoint this step; `best`: and mark it the best (kept past rotation)."""
        state = {
            "step": self.step,
            "version": self.version,
            "versions": dict(self.versions),
            "data": self.data.state_dict(),
            "rng": python_rng_state(),
            "config": OmegaConf.to_container(self.config, resolve=True),
            "gains": self.gains.state_dict(),
        }

        def save_backends(folder: Path) -> None:
            for name, backend in self.backends.items():
                target = self._backend_dir(folder, name) or folder
                target.mkdir(parents=True, exist_ok=True)
                backend.save(target)

        root = self.loop.default_local_dir
        protect = self.gains.state.best_step if self.loop.keep_best else None
        save_checkpoint(root, self.step, state, save_backends, self.loop.max_actor_ckpt_to_keep, protect)
        if best:
            mark_best_checkpoint(root, self.step)

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
        self.gains = GainKeeper(self.loop.collapse_guard, state.get("gains"))
