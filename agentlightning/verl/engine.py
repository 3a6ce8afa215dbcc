"""verl's side of the backend: Ray, the FSDP actor workers, the vLLM replicas, the weight sync.

This is the one module that touches verl's trainer internals, through as few doors as possible:

* `BaseTaskRunner` (verl's own role → worker mapping and resource pools, `main_ppo_v0`),
* `RayPPOTrainer.init_workers()` — the legacy trainer, used only as the builder of the worker
  group, the vLLM server replicas (`llm_server_manager`) and the weight-sync manager
  (`checkpoint_manager`); its `fit()` loop, datasets and reward managers are not used
  (`_create_dataloader` is replaced; verl's agent loop is replaced by `NoAgentLoops`, because
  our agents reach vLLM through the Gateway),
* the worker group's `update_actor`, `compute_log_prob`, `compute_ref_log_prob`,
  `save_checkpoint`, `load_checkpoint`, and `set_loss_fn` where the KL term is on (`VerlActor`:
  the same calls work on one in-process `ActorRolloutRefWorker`),
* `llm_server_manager.get_addresses()`, `checkpoint_manager.sleep_replicas()` / `update_weights()`.

Why the legacy builder and not the V1 trainer: docs/verl_backend.md.

Ray: every worker process must know the `per_rollout_mean` loss before verl looks it up, so the
runtime env's `worker_process_setup_hook` runs `agentlightning.verl.loss.register` in each.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

import ray
import torch
from omegaconf import DictConfig, OmegaConf, open_dict

from agentlightning.log import get_logger
from agentlightning.verl.loss import actor_loss
from agentlightning.verl.loss import register as register_loss

log = get_logger("verl_engine")

LOSS_HOOK = "agentlightning.verl.loss.register"
NO_AGENT_LOOPS = "agentlightning.verl.engine.NoAgentLoops"


def ray_runtime_env(view: DictConfig) -> dict[str, Any]:
    """verl's PPO runtime env, the user's `ray_kwargs.ray_init.runtime_env`, and our loss hook."""
    from verl.trainer.constants_ppo import get_ppo_ray_runtime_env

    env: dict[str, Any] = dict(get_ppo_ray_runtime_env(view))
    user = OmegaConf.select(view, "ray_kwargs.ray_init.runtime_env", default=None)
    if user is not None:
        user_env = OmegaConf.to_container(user, resolve=True)
        if not isinstance(user_env, dict):
            raise ValueError("ray_kwargs.ray_init.runtime_env must be a mapping")
        for key, value in user_env.items():
            if key == "env_vars":
                env.setdefault("env_vars", {}).update(value or {})
            else:
                env[str(key)] = value
    hook = env.get("worker_process_setup_hook")
    if hook not in (None, LOSS_HOOK):
        raise ValueError(
            f"ray_kwargs.ray_init.runtime_env.worker_process_setup_hook is {hook!r}: the verl backend needs "
            f"{LOSS_HOOK} there (it registers the per_rollout_mean loss in every worker)"
        )
    env["worker_process_setup_hook"] = LOSS_HOOK
    return env


def start_ray(view: DictConfig, **overrides: Any) -> bool:
    """`ray.init` with our runtime env unless Ray is already up (then the caller's env must carry the
    hook). Returns whether this call started Ray (and so should shut it down)."""
    register_loss()  # the driver too
    if ray.is_initialized():
        log.info(
            "ray_already_initialized", hint=f"its runtime env must set worker_process_setup_hook={LOSS_HOOK}"
        )
        return False
    configured = OmegaConf.to_container(
        OmegaConf.select(view, "ray_kwargs.ray_init", default={}) or {}, resolve=True
    )
    if not isinstance(configured, dict):
        raise ValueError("ray_kwargs.ray_init must be a mapping")
    kwargs: dict[str, Any] = {str(k): v for k, v in configured.items() if v is not None}
    kwargs["runtime_env"] = ray_runtime_env(view)
    kwargs.update(overrides)
    ray.init(**kwargs)
    log.info("ray_started", resources=ray.cluster_resources())
    return True


class NoAgentLoops:
    """Stands in for verl's `AgentLoopManager`: our agents run under the Controller and reach the
    vLLM replicas through the Gateway, so verl's own agent-loop workers are not started."""

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs

    @classmethod
    def create(cls, *args: Any, **kwargs: Any) -> NoAgentLoops:
        return cls(**kwargs)


def _builder_class() -> type:
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    # verl is installed only in .venv-verl: where it is not, RayPPOTrainer is Any.
    class WorkerBuilder(RayPPOTrainer):  # type: ignore[misc, valid-type, unused-ignore]
        """verl's trainer as a builder of workers only: no datasets, no loop."""

        def _create_dataloader(self, *args: Any, **kwargs: Any) -> None:
            self.total_training_steps = self.config.actor_rollout_ref.actor.optim.total_training_steps

    return WorkerBuilder


class VerlActor:
    """The actor side of the backend's `Workers`: calls to verl's `ActorRolloutRefWorker`
    (`update_actor`, `compute_log_prob`, `save_checkpoint`, `load_checkpoint`) on `self.actor`,
    the Ray worker group in `VerlWorkers` (the same methods, dispatched to every rank)."""

    view: DictConfig
    actor: Any = None
    ref: Any = None  # the reference model's worker group, with use_kl_loss
    tokenizer: Any = None

    @property
    def dp_size(self) -> int:
        raise NotImplementedError

    @property
    def pad_token_id(self) -> int:
        pad = self.tokenizer.pad_token_id
        return int(pad if pad is not None else self.tokenizer.eos_token_id)

    def compute_log_probs(self, batch: Any) -> torch.Tensor:
        """The actor's log-probs of the batch's responses, padded like `response_mask`
        (`old_log_probs` for `recompute`); as verl's `RayPPOTrainer._compute_old_log_prob`."""
        return self._log_probs(batch, lambda td: self.actor.compute_log_prob(td))

    def compute_ref_log_probs(self, batch: Any) -> torch.Tensor:
        """The reference model's log-probs of the batch's responses (`ref_log_prob` for the KL
        term), padded like `response_mask`; as verl's `RayPPOTrainer._compute_ref_log_prob`."""
        if self.ref is None:
            raise RuntimeError("no reference model: actor_rollout_ref.actor.use_kl_loss is false")
        return self._log_probs(batch, lambda td: self.ref.compute_ref_log_prob(td))

    def _log_probs(self, batch: Any, compute: Callable[[Any], Any]) -> torch.Tensor:
        from verl.utils import tensordict_utils as tu
        from verl.workers.utils.padding import left_right_2_no_padding, no_padding_2_padding

        td = left_right_2_no_padding(self._with_sampling_info(batch).to_tensordict())
        tu.assign_non_tensor(td, calculate_entropy=False, calculate_sum_pi_squared=False, compute_loss=False)
        return no_padding_2_padding(tu.get(compute(td), "log_probs"), td).float()

    def update(self, batch: Any) -> dict[str, float]:
        """One optimizer step on one mini-batch (`rows_to_batch` order, rank-laid-out)."""
        from verl.utils import tensordict_utils as tu
        from verl.workers.utils.padding import left_right_2_no_padding

        td = left_right_2_no_padding(self._with_sampling_info(batch).to_tensordict())
        size = len(batch)
        tu.assign_non_tensor(
            td,
            calculate_entropy=bool(self.view.actor_rollout_ref.actor.get("calculate_entropy", False)),
            distillation_use_topk=False,
            distillation_only=False,
            global_batch_size=size,
            mini_batch_size=size,  # the whole call is one mini-batch: one optimizer step
            epochs=1,
            seed=int(self.view.actor_rollout_ref.actor.get("data_loader_seed", 0) or 0),
            dataloader_kwargs={"shuffle": False},
            compute_loss=True,
        )
        output = self.actor.update_actor(td)
        return _flatten_metrics(tu.get(output, "metrics"))

    def use_kl_term(self, ref: Any, model: Any) -> None:
        """`use_kl_loss`: `ref` computes the reference log-probs, and the actor's loss is ours, its
        KL term weighted like the policy term (`loss.actor_loss`). `model` is verl's model config."""
        from verl.utils.config import omega_conf_to_dataclass

        self.ref = ref
        config = omega_conf_to_dataclass(self.view.actor_rollout_ref.actor)
        config.model_config = model  # as the worker's `init_model` builds its ActorConfig
        self.actor.set_loss_fn(actor_loss(config))

    def _with_sampling_info(self, batch: Any) -> Any:
        """The rollout's temperature (verl's engine divides the logits by it) and multi-turn flag,
        which every actor call reads from the batch (verl's own fit loop sets them the same way)."""
        rollout = self.view.actor_rollout_ref.rollout
        batch.meta_info["temperature"] = rollout.temperature
        batch.meta_info["multi_turn"] = rollout.multi_turn.enable
        return batch

    def save_checkpoint(self, path: str, step: int) -> None:
        self.actor.save_checkpoint(path, None, step, max_ckpt_to_keep=None)

    def load_checkpoint(self, path: str) -> None:
        if not os.path.isdir(path):
            raise FileNotFoundError(f"no verl actor checkpoint at {path}")
        self.actor.load_checkpoint(path, None, del_local_after_load=False)


def set_total_optimizer_steps(view: DictConfig, total_optimizer_steps: int) -> None:
    """The LR scheduler's horizon: the core's optimizer steps, not verl's dataloader's."""
    with open_dict(view):
        view.actor_rollout_ref.actor.optim.total_training_steps = total_optimizer_steps


class VerlWorkers(VerlActor):
    """The FSDP actor worker group, the vLLM replicas serving it, and the weight sync between them."""

    def __init__(self, view: DictConfig, total_optimizer_steps: int) -> None:
        self.view = view
        with open_dict(view):
            view.actor_rollout_ref.rollout.setdefault("agent", {})
            view.actor_rollout_ref.rollout.agent.agent_loop_manager_class = NO_AGENT_LOOPS
        set_total_optimizer_steps(view, total_optimizer_steps)
        self.trainer: Any = None
        self.owns_ray = False  # set by whoever started Ray for these workers

    def start(self) -> list[str]:
        """Build the workers and replicas (weights loaded, replicas awake); the replicas' addresses."""
        from verl.trainer.main_ppo_v0 import BaseTaskRunner
        from verl.trainer.ppo.utils import need_critic
        from verl.utils.config import omega_conf_to_dataclass

        if need_critic(self.view):
            raise ValueError("the verl backend trains without a critic: set critic.enable=false")
        runner = BaseTaskRunner()
        _, worker_group_cls = runner.add_actor_rollout_worker(self.view)
        pools = runner.init_resource_pool_mgr(self.view)
        model = omega_conf_to_dataclass(self.view.actor_rollout_ref.model)
        self.tokenizer = model.tokenizer
        self.trainer = _builder_class()(
            config=self.view,
            tokenizer=self.tokenizer,
            processor=model.processor,
            role_worker_mapping=runner.role_worker_mapping,
            resource_pool_manager=pools,
            ray_worker_group_cls=worker_group_cls,
        )
        self.trainer.init_workers()  # ends with the replicas asleep
        self.actor = self.trainer.actor_rollout_wg
        if self.view.actor_rollout_ref.actor.use_kl_loss:  # verl built the reference model
            self.use_kl_term(self.trainer.ref_policy_wg, model)
        self.trainer.checkpoint_manager.update_weights(0)  # wake them with the actor's weights
        return self.addresses()

    @property
    def dp_size(self) -> int:
        return int(self.trainer._get_dp_size(self.actor, "actor"))

    # --- serving ----------------------------------------------------------------------------

    def addresses(self) -> list[str]:
        """`host:port` of every vLLM replica (verl gives no scheme, no /v1)."""
        return list(self.trainer.llm_server_manager.get_addresses())

    def sleep_replicas(self) -> None:
        """Free the replicas' GPU memory (weights and KV cache) for training, colocated."""
        self.trainer.checkpoint_manager.sleep_replicas()

    def sync_weights(self, step: int) -> None:
        """The actor's weights into every replica (waking them when asleep)."""
        self.trainer.checkpoint_manager.update_weights(step)

    def close(self) -> None:
        if self.owns_ray:
            ray.shutdown()


def _flatten_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    """verl's worker metrics (lists over micro-batches, `Metric`s) as `actor/*` means."""
    out: dict[str, float] = {}
    for key, value in metrics.items():
        values = value if isinstance(value, list) else [value]
        numbers = []
        for v in values:
            v = getattr(v, "value", v)
            if isinstance(v, torch.Tensor):
                v = v.detach().float().mean().item()
            if isinstance(v, int | float):
                numbers.append(float(v))
        if numbers:
            name = key if "/" in key else f"actor/{key}"
            out[name] = sum(numbers) / len(numbers)
    return out
