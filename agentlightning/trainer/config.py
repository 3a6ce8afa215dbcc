"""The trainer core's settings, read from the one config every backend shares.

Keys that mean the same as in verl keep verl's names (`data.train_batch_size`,
`actor_rollout_ref.rollout.n`, `actor_rollout_ref.actor.ppo_mini_batch_size`,
`algorithm.adv_estimator`, …); everything of ours lives in the `agentlightning` block,
whose schema is `AgentLightningConfig` below. A wrong type, a bad value or an unknown key in
that block fails at start-up with a `ConfigError` naming the key.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, fields
from enum import StrEnum
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from agentlightning.aggregation import AggregationLevel
from agentlightning.log import get_logger

log = get_logger("trainer_config")


class ConfigError(ValueError):
    """A bad trainer setting. The message names the key and what is wrong with it."""


class AdvEstimator(StrEnum):
    GRPO = "grpo"
    RLOO = "rloo"
    MEAN = "mean"
    REINFORCE_PLUS_PLUS = "reinforce_plus_plus"  # verl's name: whitened over the batch, no group baseline
    REINFORCE_PLUS_PLUS_BASELINE = "reinforce_plus_plus_baseline"  # group mean, then batch whitening


class LossAggMode(StrEnum):
    """`actor_rollout_ref.actor.loss_agg_mode` (verl's names); a "sequence" is a rollout here."""

    SEQ_MEAN_TOKEN_MEAN = "seq-mean-token-mean"  # per-rollout mean (our default)
    TOKEN_MEAN = "token-mean"  # every trainable token of the mini-batch weighs the same (DAPO)
    SEQ_MEAN_TOKEN_SUM = "seq-mean-token-sum"  # token sums, averaged over rollouts
    SEQ_MEAN_TOKEN_SUM_NORM = "seq-mean-token-sum-norm"  # token sums / a constant length (Dr.GRPO)


V1_LOSS_AGG_MODE = "token-sum"  # what v1.0 configs set with its per_rollout_mean loss


class AdvantageMode(StrEnum):
    ROLLOUT = "rollout"  # one advantage per rollout, from its group's rewards
    STEP = "step"  # one per call: discounted per-call returns, normalised per step position


class StalePolicy(StrEnum):
    DROP = "drop"  # groups with a call older than max_staleness are left out of the step, counted
    WAIT = "wait"  # async: stale groups are discarded at collection and fresher ones awaited


class FailedRolloutPolicy(StrEnum):
    DROP = "drop"
    TRAIN = "train"


# --- the `agentlightning` block ------------------------------------------------------------


@dataclass
class TraceAggregatorConfig:
    level: str = AggregationLevel.TRAJECTORY.value  # checked into an AggregationLevel
    # None: fall back to data.max_prompt_length / data.max_response_length (v1.0 behaviour)
    trajectory_max_prompt_length: int | None = None
    trajectory_max_response_length: int | None = None


@dataclass
class LocalAgentConfig:
    agent_class: str | None = None
    env_map: dict[str, str] = field(default_factory=dict)


@dataclass
class K8sAgentConfig:
    job_template_path: str | None = None


@dataclass
class AsyncRolloutConfig:
    enabled: bool = False
    async_train_batch_size: int = 0  # prompt groups kept in flight; must exceed data.train_batch_size
    drain_timeout_seconds: float = 120.0
    pause_retry_after_seconds: float = 5.0


@dataclass
class AgentLightningConfig:
    agl_base_url: str = "http://127.0.0.1:8080"
    agl_key: str = ""
    model_name: str = "policy"
    rollout_timeout_seconds: float = 600.0
    rollout_grace_seconds: float = 120.0
    keep_rollouts: bool = False
    hooks: str | None = None  # v1.0: a Python file with one RolloutHooks subclass (agentlightning/hooks.py)
    fetch_concurrency: int = 8
    poll_wait_seconds: float = 30.0
    local: LocalAgentConfig = field(default_factory=LocalAgentConfig)
    k8s: K8sAgentConfig = field(default_factory=K8sAgentConfig)
    trace_aggregator: TraceAggregatorConfig = field(default_factory=TraceAggregatorConfig)
    reward_fillna_value: float = 0.0
    failed_rollouts: str = FailedRolloutPolicy.DROP.value  # checked into a FailedRolloutPolicy
    max_ppo_update_times: int | None = None
    keep_partial_minibatch: bool = False
    adv_epsilon: float = 1e-6
    seed: int = 0
    async_rollout: AsyncRolloutConfig = field(default_factory=AsyncRolloutConfig)
    # None: no bound. Else a group whose trainable tokens include one generated more than this
    # many policy versions ago is handled by `stale_policy` (whole groups: no lone survivors).
    max_staleness: int | None = None
    stale_policy: str = StalePolicy.DROP.value  # checked into a StalePolicy
    advantage_mode: str = AdvantageMode.ROLLOUT.value  # checked into an AdvantageMode


# --- the resolved settings ------------------------------------------------------------------


@dataclass(frozen=True)
class CoreConfig:
    """Everything the trainer core reads, resolved and validated. Build it with `load_core_config`."""

    agl: AgentLightningConfig = field(default_factory=AgentLightningConfig)
    train_batch_size: int = 8  # data.train_batch_size: prompt groups per step
    rollout_n: int = 4  # actor_rollout_ref.rollout.n: rollouts per prompt
    val_rollout_n: int = 1  # actor_rollout_ref.rollout.val_kwargs.n
    ppo_mini_batch_size: int = 8  # actor_rollout_ref.actor.ppo_mini_batch_size: groups per mini-batch
    adv_estimator: AdvEstimator = AdvEstimator.GRPO  # algorithm.adv_estimator
    norm_adv_by_std_in_grpo: bool = True  # algorithm.norm_adv_by_std_in_grpo
    max_prompt_length: int | None = None  # data.max_prompt_length
    max_response_length: int | None = None  # data.max_response_length
    loss_agg_mode: LossAggMode = LossAggMode.SEQ_MEAN_TOKEN_MEAN  # actor_rollout_ref.actor.loss_agg_mode
    loss_scale_factor: int | None = None  # actor_rollout_ref.actor.loss_scale_factor (sum-norm's length)
    filter_groups: bool = False  # algorithm.filter_groups.enable: DAPO's dynamic sampling
    filter_groups_max_batches: int = 0  # algorithm.filter_groups.max_num_gen_batches; 0: no limit
    gamma: float = 1.0  # algorithm.gamma: the discount of per-call rewards (advantage_mode=step)

    @property
    def prompt_limit(self) -> int | None:
        """The row prompt limit of the configured aggregation level."""
        agg = self.agl.trace_aggregator
        if agg.level == AggregationLevel.TRAJECTORY and agg.trajectory_max_prompt_length is not None:
            return agg.trajectory_max_prompt_length
        return self.max_prompt_length

    @property
    def response_limit(self) -> int | None:
        agg = self.agl.trace_aggregator
        if agg.level == AggregationLevel.TRAJECTORY and agg.trajectory_max_response_length is not None:
            return agg.trajectory_max_response_length
        return self.max_response_length

    def job_template(self) -> str | None:
        """The Kubernetes Job template text, read from `agentlightning.k8s.job_template_path`."""
        path = self.agl.k8s.job_template_path
        if not path:
            return None
        try:
            return Path(path).read_text()
        except OSError as exc:
            raise ConfigError(f"agentlightning.k8s.job_template_path: cannot read {path!r}: {exc}") from exc


# verl-named keys the core reads: config path -> (CoreConfig field, default)
VERL_KEYS: dict[str, tuple[str, Any]] = {
    "data.train_batch_size": ("train_batch_size", 8),
    "actor_rollout_ref.rollout.n": ("rollout_n", 4),
    "actor_rollout_ref.rollout.val_kwargs.n": ("val_rollout_n", 1),
    "actor_rollout_ref.actor.ppo_mini_batch_size": ("ppo_mini_batch_size", None),
    "algorithm.adv_estimator": ("adv_estimator", "grpo"),
    "algorithm.norm_adv_by_std_in_grpo": ("norm_adv_by_std_in_grpo", True),
    "data.max_prompt_length": ("max_prompt_length", None),
    "data.max_response_length": ("max_response_length", None),
    "actor_rollout_ref.actor.loss_agg_mode": ("loss_agg_mode", "seq-mean-token-mean"),
    "actor_rollout_ref.actor.loss_scale_factor": ("loss_scale_factor", None),
    "algorithm.filter_groups.enable": ("filter_groups", False),
    "algorithm.filter_groups.max_num_gen_batches": ("filter_groups_max_batches", 0),
    "algorithm.gamma": ("gamma", 1.0),
}
# Keys of verl's that the core accepts only at the one value it implements (verl's default).
FIXED_VERL_KEYS: dict[str, Any] = {
    "algorithm.filter_groups.metric": ("acc", "score", "seq_reward", "seq_final_reward", None),
}


def _plain(cfg: DictConfig | Mapping[str, Any] | None) -> DictConfig:
    if cfg is None:
        return OmegaConf.create({})
    if isinstance(cfg, DictConfig):
        return cfg
    return OmegaConf.create(dict(cfg))


def _load_agl_block(raw: Any, backend_keys: Collection[str]) -> AgentLightningConfig:
    block = OmegaConf.to_container(raw, resolve=True) if isinstance(raw, DictConfig) else raw
    if block is None:
        block = {}
    if not isinstance(block, Mapping):
        raise ConfigError(f"agentlightning must be a mapping of settings, got {type(block).__name__}")
    ours = {k: v for k, v in block.items() if k not in backend_keys}
    try:
        merged = OmegaConf.merge(OmegaConf.structured(AgentLightningConfig), ours)
        return OmegaConf.to_object(merged)  # type: ignore[return-value]
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", None) or getattr(exc, "key", None) or "?"
        msg = str(exc).splitlines()[0]
        raise ConfigError(f"agentlightning.{key}: {msg}") from None


def _int(key: str, value: Any, minimum: int, allow_none: bool = False) -> int | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{key} must be an integer, got {value!r}")
    if value < minimum:
        raise ConfigError(f"{key} must be >= {minimum}, got {value}")
    return value


def _choice(key: str, value: str, enum: type[StrEnum]) -> Any:
    try:
        return enum(value)
    except ValueError:
        choices = ", ".join(e.value for e in enum)
        raise ConfigError(f"{key} must be one of {choices}, got {value!r}") from None


def _check_agl(agl: AgentLightningConfig) -> None:
    agl.trace_aggregator.level = _choice(
        "agentlightning.trace_aggregator.level", agl.trace_aggregator.level, AggregationLevel
    )
    agl.failed_rollouts = _choice("agentlightning.failed_rollouts", agl.failed_rollouts, FailedRolloutPolicy)
    agl.stale_policy = _choice("agentlightning.stale_policy", agl.stale_policy, StalePolicy)
    agl.advantage_mode = _choice("agentlightning.advantage_mode", agl.advantage_mode, AdvantageMode)
    _int("agentlightning.max_staleness", agl.max_staleness, 0, allow_none=True)

    def positive(key: str, value: float) -> None:
        if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
            raise ConfigError(f"agentlightning.{key} must be a positive number, got {value!r}")

    positive("rollout_timeout_seconds", agl.rollout_timeout_seconds)
    positive("poll_wait_seconds", agl.poll_wait_seconds)
    positive("adv_epsilon", agl.adv_epsilon)
    positive("async_rollout.drain_timeout_seconds", agl.async_rollout.drain_timeout_seconds)
    if agl.rollout_grace_seconds < 0:
        raise ConfigError(
            f"agentlightning.rollout_grace_seconds must be >= 0, got {agl.rollout_grace_seconds}"
        )
    if agl.async_rollout.pause_retry_after_seconds < 0:
        raise ConfigError("agentlightning.async_rollout.pause_retry_after_seconds must be >= 0")
    if not math.isfinite(agl.reward_fillna_value):
        raise ConfigError("agentlightning.reward_fillna_value must be a finite number")
    _int("agentlightning.fetch_concurrency", agl.fetch_concurrency, 1)
    _int("agentlightning.max_ppo_update_times", agl.max_ppo_update_times, 1, allow_none=True)
    agg = agl.trace_aggregator
    _int(
        "agentlightning.trace_aggregator.trajectory_max_prompt_length",
        agg.trajectory_max_prompt_length,
        1,
        True,
    )
    _int(
        "agentlightning.trace_aggregator.trajectory_max_response_length",
        agg.trajectory_max_response_length,
        1,
        True,
    )
    if not agl.model_name:
        raise ConfigError(
            "agentlightning.model_name must not be empty: it is the model name the proxy routes by"
        )
    if agl.hooks and not Path(agl.hooks).is_file():
        raise ConfigError(f"agentlightning.hooks: no such file: {agl.hooks!r}")
    if agl.local.agent_class is not None and not agl.local.agent_class.strip():
        raise ConfigError("agentlightning.local.agent_class must be module.Class or module:Class, got ''")


def load_core_config(
    cfg: DictConfig | Mapping[str, Any] | None = None, backend_keys: Collection[str] = ()
) -> CoreConfig:
    """Resolve and validate the core's settings from a full (verl-style) config.

    `backend_keys` are keys of the `agentlightning` block that belong to the calling backend;
    the core ignores them instead of rejecting them as unknown.
    """
    root = _plain(cfg)
    agl = _load_agl_block(OmegaConf.select(root, "agentlightning", default=None), backend_keys)
    _check_agl(agl)
    values: dict[str, Any] = {}
    for path, (name, default) in VERL_KEYS.items():
        value = OmegaConf.select(root, path, default=default)
        values[name] = OmegaConf.to_container(value) if isinstance(value, DictConfig) else value

    values["train_batch_size"] = _int("data.train_batch_size", values["train_batch_size"], 1)
    values["rollout_n"] = _int("actor_rollout_ref.rollout.n", values["rollout_n"], 1)
    values["val_rollout_n"] = _int("actor_rollout_ref.rollout.val_kwargs.n", values["val_rollout_n"], 1)
    if values["ppo_mini_batch_size"] is None:
        values["ppo_mini_batch_size"] = values["train_batch_size"]
    values["ppo_mini_batch_size"] = _int(
        "actor_rollout_ref.actor.ppo_mini_batch_size", values["ppo_mini_batch_size"], 1
    )
    for key in ("data.max_prompt_length", "data.max_response_length"):
        name = VERL_KEYS[key][0]
        values[name] = _int(key, values[name], 1, allow_none=True)
    values["adv_estimator"] = _choice("algorithm.adv_estimator", values["adv_estimator"], AdvEstimator)
    if values["loss_agg_mode"] == V1_LOSS_AGG_MODE:
        # v1.0's per_rollout_mean loss needed verl's token-sum over its weights: the per-rollout mean
        log.warning(
            "v1_config_key_value_read_as",
            key="actor_rollout_ref.actor.loss_agg_mode",
            value=V1_LOSS_AGG_MODE,
            read_as=LossAggMode.SEQ_MEAN_TOKEN_MEAN.value,
        )
        values["loss_agg_mode"] = LossAggMode.SEQ_MEAN_TOKEN_MEAN.value
    values["loss_agg_mode"] = _choice(
        "actor_rollout_ref.actor.loss_agg_mode", values["loss_agg_mode"], LossAggMode
    )
    values["loss_scale_factor"] = _int(
        "actor_rollout_ref.actor.loss_scale_factor", values["loss_scale_factor"], 1, allow_none=True
    )
    if (
        values["loss_agg_mode"] == LossAggMode.SEQ_MEAN_TOKEN_SUM_NORM
        and values["loss_scale_factor"] is None
        and values["max_response_length"] is None
    ):
        raise ConfigError(
            "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum-norm divides token sums by a constant "
            "length: set actor_rollout_ref.actor.loss_scale_factor or data.max_response_length"
        )
    if not isinstance(values["filter_groups"], bool):
        raise ConfigError(
            f"algorithm.filter_groups.enable must be true or false, got {values['filter_groups']!r}"
        )
    values["filter_groups_max_batches"] = _int(
        "algorithm.filter_groups.max_num_gen_batches", values["filter_groups_max_batches"], 0
    )
    for key, allowed in FIXED_VERL_KEYS.items():
        value = OmegaConf.select(root, key, default=None)
        if value not in allowed:
            raise ConfigError(
                f"{key}: the trainer core implements {allowed[0]!r} (a group's rewards), got {value!r}"
            )
    gamma = values["gamma"]
    if isinstance(gamma, bool) or not isinstance(gamma, int | float) or not 0 < gamma <= 1:
        raise ConfigError(f"algorithm.gamma must be a number in (0, 1], got {gamma!r}")
    values["gamma"] = float(gamma)
    if agl.advantage_mode == AdvantageMode.STEP:
        if agl.trace_aggregator.level != AggregationLevel.TRANSITION:
            raise ConfigError(
                "agentlightning.advantage_mode=step gives every call its own advantage: it needs "
                "agentlightning.trace_aggregator.level=transition (one row per call)"
            )
        if values["adv_estimator"] not in (AdvEstimator.GRPO, AdvEstimator.MEAN):
            raise ConfigError(
                "agentlightning.advantage_mode=step normalises per step position as grpo or mean do; "
                f"algorithm.adv_estimator={values['adv_estimator'].value} has no step form"
            )
    elif values["gamma"] != 1.0:
        raise ConfigError(
            "algorithm.gamma discounts per-call rewards: it needs agentlightning.advantage_mode=step "
            "(a rollout-level advantage has nothing to discount)"
        )
    if (
        agl.stale_policy == StalePolicy.WAIT
        and agl.max_staleness is not None
        and not agl.async_rollout.enabled
    ):
        raise ConfigError(
            "agentlightning.stale_policy=wait needs agentlightning.async_rollout.enabled: in sync mode every "
            "group is made by the current policy"
        )
    if not isinstance(values["norm_adv_by_std_in_grpo"], bool):
        raise ConfigError(
            f"algorithm.norm_adv_by_std_in_grpo must be true or false, got {values['norm_adv_by_std_in_grpo']!r}"
        )

    if agl.async_rollout.enabled and agl.async_rollout.async_train_batch_size <= values["train_batch_size"]:
        raise ConfigError(
            "agentlightning.async_rollout.async_train_batch_size "
            f"({agl.async_rollout.async_train_batch_size}) must be greater than data.train_batch_size "
            f"({values['train_batch_size']}): it is the number of prompt groups kept in flight"
        )
    return CoreConfig(agl=agl, **values)


def core_config_keys() -> list[str]:
    """Every key the core reads, dotted, for documentation and `--help`."""
    keys = list(VERL_KEYS) + list(FIXED_VERL_KEYS)

    def walk(prefix: str, cls: type) -> None:
        for f in fields(cls):
            default = f.default_factory() if callable(f.default_factory) else f.default  # type: ignore[misc]
            if hasattr(default, "__dataclass_fields__"):
                walk(f"{prefix}{f.name}.", type(default))
            else:
                keys.append(f"{prefix}{f.name}")

    walk("agentlightning.", AgentLightningConfig)
    return keys
