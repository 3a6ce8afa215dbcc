"""The verl backend: `VerlBackend` for the trainer core's loop, and `run_ppo(config, train, val)`.

The loop (collect → build → update → publish → validate → save, resume, data order) is the
trainer core's; this backend trains with verl's FSDP workers and serves with verl's vLLM replicas
(`engine.VerlWorkers`). The Gateway routes agents' calls to the replicas' OpenAI servers,
registered under the Gateway's model name (vLLM's `served_model_name`) with the policy version.

A step, colocated (verl 0.9.1's legacy builder puts the actor and the replicas on the same GPUs):

    update    pause the Gateway (agents get 429 + Retry-After and retry), wait for in-flight calls
              to drain, put the replicas to sleep (free their GPU memory), then per mini-batch of
              the core: rows → `DataProto` (`batch.py`) → one `update_actor` call, one optimizer
              step; the Gateway stays paused while the GPUs train
    publish   (the core: pause — already paused — drain, then) verl's weight sync wakes the
              replicas with the new weights; the core registers the new version and resumes

With on-policy distillation (`algorithm.distill`, `trainer/distill.py`) the teacher scores the
step's rows before the pause (it is another server: agents need not wait for it), and each row
gets its per-token advantages, which `batch.py` puts in verl's `advantages` in place of the
rollout's scalar. The teacher's tokenizer is checked against the student's at start, before
Ray and the workers.

If the update fails, the Gateway is resumed before the error goes on. Checkpoints: the core
writes its loop state, this backend verl's actor checkpoint (weights, optimizer, LR scheduler,
RNG) into `actor/` of the same folder.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import torch
from omegaconf import DictConfig, OmegaConf

from agentlightning.client import GatewayClient
from agentlightning.config.schema import ConfigError
from agentlightning.log import get_logger
from agentlightning.rows import TrainingRow
from agentlightning.trainer import CoreConfig, TrainingBatch
from agentlightning.trainer.distill import Teacher, distill, open_teacher
from agentlightning.trainer.loop import TrainingLoop
from agentlightning.trainer.publish import EndpointPublisher
from agentlightning.verl.batch import rows_to_batch
from agentlightning.verl.config import VerlBackendConfig, compose_config, router_replay_mode, validate

log = get_logger("verl_backend")

ACTOR_DIR = "actor"


class Workers(Protocol):
    """What the backend needs from verl (`engine.VerlWorkers`; stand-ins in the tests)."""

    @property
    def dp_size(self) -> int: ...
    @property
    def pad_token_id(self) -> int: ...

    def start(self) -> list[str]: ...
    def addresses(self) -> list[str]: ...
    def sleep_replicas(self) -> None: ...
    def sync_weights(self, step: int) -> None: ...
    def compute_log_probs(self, batch: Any) -> torch.Tensor: ...
    def compute_ref_log_probs(self, batch: Any) -> torch.Tensor: ...
    def update(self, batch: Any) -> dict[str, float]: ...
    def save_checkpoint(self, path: str, step: int) -> None: ...
    def load_checkpoint(self, path: str) -> None: ...
    def close(self) -> None: ...


WorkersFactory = Callable[[DictConfig, int], Workers]


def _verl_workers(view: DictConfig, total_optimizer_steps: int) -> Workers:
    from agentlightning.verl.engine import VerlWorkers, start_ray

    started = start_ray(view)
    workers = VerlWorkers(view, total_optimizer_steps)
    workers.owns_ray = started  # shut Ray down at the end only if we started it
    return workers


class VerlBackend:
    """verl's workers and vLLM replicas behind the trainer core's `TrainerBackend` protocol."""

    def __init__(
        self,
        core: CoreConfig,
        ours: VerlBackendConfig,
        view: DictConfig,
        client: GatewayClient | None = None,
        workers: WorkersFactory = _verl_workers,
    ) -> None:
        """The parsed config (`validate`): the core's settings, ours, and the config verl sees."""
        self.core = core
        self.ours = ours
        self.view = view
        self._make_workers = workers
        self._own_client = client is None
        self.client = client or GatewayClient(self.core.agl.agl_base_url, self.core.agl.agl_key)
        async_cfg = self.core.agl.async_rollout
        self.gate = EndpointPublisher(
            self.client,
            self.core.agl.model_name,
            drain_timeout_seconds=async_cfg.drain_timeout_seconds,
            retry_after_seconds=async_cfg.pause_retry_after_seconds,
        )
        self.workers: Workers | None = None
        self.optimizer_steps = 0
        self.teacher: Teacher | None = None  # algorithm.distill: scores the rows' tokens before each update

    # --- TrainerBackend ----------------------------------------------------------------------

    def start(self, step: int, version: int, total_steps: int, checkpoint: Path | None) -> list[str]:
        if self.ours.distill.enable:  # before Ray and the workers: a wrong teacher fails in seconds
            self.teacher = open_teacher(self.ours.distill, self._student_tokenizer(), _load_tokenizer)
        per_step = -(-self.core.train_batch_size // self.core.ppo_mini_batch_size)
        epochs = int(self.view.actor_rollout_ref.actor.ppo_epochs)
        self.workers = self._make_workers(self.view, total_steps * per_step * epochs)
        addresses = self.workers.start()
        if checkpoint is not None:
            self.workers.load_checkpoint(str(checkpoint / ACTOR_DIR))
            self.workers.sync_weights(version)  # the replicas serve the restored weights
        log.info("verl_backend_started", replicas=addresses, dp_size=self.workers.dp_size, version=version)
        return addresses

    def update(self, batch: TrainingBatch) -> dict[str, float]:
        workers = self._need_workers()
        metrics: dict[str, float] = {}
        scores = self.teacher.score_rows(batch.rows) if self.teacher is not None and batch.rows else None
        state = self.client.pause(self.gate.retry_after_seconds, reason="verl: training on the serving GPUs")
        try:
            drained, residual = self.gate.drain(self.gate.drain_timeout_seconds)
            if not drained:
                log.warning("drain_timed_out_before_training", inflight=residual)
            workers.sleep_replicas()
            if scores is not None:
                metrics.update(self._distill(workers, batch.rows, scores))
            metrics.update(self._train(workers, batch))
        except BaseException:
            self.client.resume()  # replicas may sleep, but agents must not wait on a dead trainer
            raise
        metrics["training/async/proxy_inflight_at_training_pause"] = float(state.inflight)
        return metrics

    def publish(self, version: int) -> None:
        self._need_workers().sync_weights(version)

    def save(self, folder: Path) -> None:
        self._need_workers().save_checkpoint(str(folder / ACTOR_DIR), self.optimizer_steps)

    def restore(self, folder: Path, lr_scale: float) -> None:
        # lr_scale is 1 here: `validate` refuses any other (verl's scheduler is restored as saved)
        self._need_workers().load_checkpoint(str(folder / ACTOR_DIR))

    def close(self) -> None:
        if self.teacher is not None:
            self.teacher.close()
            self.teacher = None
        if self._own_client:
            self.client.close()
        workers, self.workers = self.workers, None
        if workers is not None:
            workers.close()

    # --- the update ---------------------------------------------------------------------------

    def _need_workers(self) -> Workers:
        if self.workers is None:
            raise RuntimeError("VerlBackend.start() first")
        return self.workers

    def _student_tokenizer(self) -> Any:
        """The student's tokenizer, loaded as verl's workers load it (`model.tokenizer_path`, else
        `model.path`)."""
        model = self.view.actor_rollout_ref.model
        key = "tokenizer_path" if model.get("tokenizer_path") else "path"
        path = model[key]
        try:
            return _load_tokenizer(path, bool(model.get("trust_remote_code", False)))
        except OSError as exc:
            raise ConfigError(
                f"actor_rollout_ref.model.{key}: cannot load the tokenizer of {path!r}: {exc}"
            ) from None

    def _to_batch(self, workers: Workers, rows: Sequence[TrainingRow]) -> tuple[Any, Any]:
        """Rows as verl's batch for these workers (ranks, whole micro-batches, R3 routes)."""
        actor = self.view.actor_rollout_ref.actor
        micro = 1 if actor.use_dynamic_bsz else int(actor.ppo_micro_batch_size_per_gpu)
        r3 = router_replay_mode(self.view) == "R3"
        return rows_to_batch(rows, workers.pad_token_id, workers.dp_size, micro, require_routed_experts=r3)

    def _distill(
        self, workers: Workers, rows: Sequence[TrainingRow], scores: Sequence[Sequence[float]]
    ) -> dict[str, float]:
        """Each row's `token_advantages` from the teacher's and the student's log-probs: those the
        Gateway recorded, or the actor's where a call lacked them (as the torch backend)."""
        missing = [r for r in rows if r.rollout_log_probs is None]
        recomputed: dict[int, list[float]] = {}
        if missing:
            proto, layout = self._to_batch(workers, missing)
            log_probs = workers.compute_log_probs(proto)
            for k, i in enumerate(layout.source):
                if i is not None:
                    recomputed[id(missing[i])] = log_probs[k, : len(missing[i].response_ids)].tolist()
        student = [r.rollout_log_probs or recomputed[id(r)] for r in rows]
        assert self.teacher is not None
        return distill(rows, scores, student, self.teacher.config)

    def _train(self, workers: Workers, batch: TrainingBatch) -> dict[str, float]:
        actor = self.view.actor_rollout_ref.actor
        protos = [self._to_batch(workers, mb)[0] for mb in batch.minibatches() if mb]
        recompute = self.ours.old_log_prob_source == "recompute"
        diffs: list[float] = []
        kl = bool(actor.use_kl_loss)
        for proto in protos:  # old (and reference) log-probs: all before the first optimizer step
            if recompute or not proto.meta_info["has_rollout_log_probs"]:
                diffs += self._recompute_old_log_probs(workers, proto)
            if kl:
                proto.batch["ref_log_prob"] = workers.compute_ref_log_probs(proto)
        sums: dict[str, float] = {}
        n = 0
        for _ in range(int(self.view.actor_rollout_ref.actor.ppo_epochs)):
            for proto in protos:
                for key, value in workers.update(proto).items():
                    sums[key] = sums.get(key, 0.0) + value
                n += 1
                self.optimizer_steps += 1
        metrics = {k: v / max(n, 1) for k, v in sums.items()}
        metrics["actor/optimizer_steps"] = float(n)
        metrics["actor/old_log_prob_recomputed"] = float(recompute)
        if diffs:  # how far the serving engine's log-probs are from the actor's (stale weights show here)
            metrics["actor/rollout_actor_log_prob_abs_diff"] = sum(diffs) / len(diffs)
        return metrics

    def _recompute_old_log_probs(self, workers: Workers, proto: Any) -> list[float]:
        """`old_log_probs` from the actor; the per-token |actor - rollout| log-prob gaps."""
        t = proto.batch
        mask = t["response_mask"].float()
        old = workers.compute_log_probs(proto).float() * mask
        diffs: list[float] = []
        if "rollout_log_probs" in t.keys():
            diffs = ((old - t["rollout_log_probs"]).abs()[mask > 0]).tolist()
        if self.ours.tis_imp_ratio_cap > 0 and "rollout_log_probs" in t.keys():
            # truncated importance weights vs the rollout's log-probs, folded into the loss weights
            ratio = (old - t["rollout_log_probs"]).clamp(-20, 20).exp().clamp(max=self.ours.tis_imp_ratio_cap)
            t["rollout_is_weights"] = t["rollout_is_weights"] * ratio * mask
        t["old_log_probs"] = old
        return diffs


def _load_tokenizer(path: str, trust_remote_code: bool = False) -> Any:
    from verl.utils import hf_tokenizer

    return hf_tokenizer(path, trust_remote_code=trust_remote_code)


class VerlTrainer(TrainingLoop):
    """The trainer core's loop with the verl backend."""

    def __init__(
        self,
        config: DictConfig | Mapping[str, Any],
        train_dataset: Sequence[Any] | None = None,
        val_dataset: Sequence[Any] | None = None,
        client: GatewayClient | None = None,
        workers: WorkersFactory = _verl_workers,
    ) -> None:
        cfg = compose_config(config if isinstance(config, DictConfig) else OmegaConf.create(dict(config)))
        settings, ours, view = validate(cfg)
        backend = VerlBackend(settings.core, ours, view, client, workers)
        super().__init__(cfg, settings, backend, train_dataset, val_dataset, client)


def run_ppo(
    config: DictConfig | Mapping[str, Any],
    train_dataset: Sequence[Any] | None = None,
    val_dataset: Sequence[Any] | None = None,
) -> dict[str, float]:
    """Train with verl, like v1.0's `run_ppo(config, train_dataset, val_dataset)`.

    `config` is merged over the packaged `agentlightning/verl/config.yaml` (verl's defaults + ours).
    Datasets are sequences of rollout inputs; None reads `data.train_files` / `data.val_files`.
    Returns the last validation's metrics.
    """
    return VerlTrainer(config, train_dataset, val_dataset).fit()
