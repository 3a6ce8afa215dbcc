"""The trainer's configuration: the core's settings, the loop's, and the one way every section is read.

One config file drives every backend. Keys that mean the same as in verl keep verl's names
(`data.train_batch_size`, `actor_rollout_ref.rollout.n`, `algorithm.adv_estimator`, …); everything
of ours lives in the `agentlightning` block (`AgentLightningConfig`). The config is parsed once, by
the loop's entry point (`load_training_config`), and the parsed settings are handed to the backend.

One style for every section, here, in the backends' own blocks (`torch_backend/config.py`,
`verl/config.py`) and in the Gateway's, Controller's and commands' configs: a section's schema is a
dataclass, filled by `config/schema.py` (a wrong type fails naming the key); its `validate()` checks
the values (a bad one fails naming the key). Because one training file holds several backends'
keys, `load_section` here fills a section leniently and `check_keys` then fails on a key no reader
declares, with the closest one it does ("did you mean"). Every failure is a `ConfigError` that
names the key.
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal

from omegaconf import DictConfig, OmegaConf

from agentlightning.aggregation import AggregationLevel
from agentlightning.config.schema import (
    ConfigError,
    build,
    dataclass_keys,
    leaf_items,
    plain,
    split_known,
    unknown_key,
)
from agentlightning.config.suggest import did_you_mean
from agentlightning.log import get_logger

log = get_logger("trainer_config")


POLICY_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


# --- reading a section: the one style ---------------------------------------------------------


def load_section(
    root: DictConfig,
    name: str,
    schema: type,
    unknown: Literal["ignore", "quiet", "error"] = "ignore",
    skip: Collection[str] = (),
) -> Any:
    """The `schema` dataclass filled from section `name` of the config; a wrong type fails naming
    the key. A key the schema does not declare is logged once and ignored (`ignore`: one file
    carries every backend's keys; `check_keys` is what refuses them), ignored unlogged (`quiet`: a
    few keys of ours in a section of verl's), or fails with a did-you-mean (`error`: a block that
    is ours alone). Keys in `skip` belong to another reader."""
    values = plain(OmegaConf.select(root, name, default=None))
    if values is None:
        values = {}
    if not isinstance(values, Mapping):
        raise ConfigError(f"{name} must be a mapping of settings, got {type(values).__name__}")
    picked, ignored = split_known({k: v for k, v in values.items() if k not in skip}, schema)
    if unknown == "error" and ignored:
        raise unknown_key(name, ignored[0], schema)
    ignored = [k for k in ignored if f"{name}.{k}" not in VERL_KEYS]  # the trainer core reads these
    if ignored and unknown == "ignore":
        log.info("config_keys_ignored", keys=sorted(f"{name}.{k}" for k in ignored))
    return build(schema, picked, name)


def check_keys(
    cfg: DictConfig | Mapping[str, Any],
    backend: str,
    read: Collection[str],
    maps: Collection[str] = (),
    compat: Callable[[str, Any], str | None] | None = None,
) -> dict[str, str]:
    """No silent no-ops: fail on any key the backend neither reads (`read`, and the user-named keys
    under `maps`) nor accepts unread (`compat` returns the reason: v1.0 compatibility, a v1.0 config
    is a verl config and its engine keys say how verl runs, not what it computes). The failure names
    the key and the backend, with the closest key it reads ("did you mean"). Returns the
    accepted-unread keys (`key -> reason`), which are logged once as a warning."""
    unknown: list[str] = []
    accepted: dict[str, str] = {}
    for key, value in leaf_items(cfg, maps=maps):
        if key in read or any(key.startswith(f"{m}.") or key == m for m in maps):
            continue
        reason = compat(key, value) if compat is not None else None
        if reason is not None:
            accepted[key] = reason
        else:
            unknown.append(key)
    if unknown:
        first = unknown[0]
        more = f"; also not read: {', '.join(unknown[1:])}" if len(unknown) > 1 else ""
        raise ConfigError(
            f"{first}: not a key the {backend} backend reads{did_you_mean(first, read)}{more}. "
            "Every key must do something: remove it or fix its name (docs/training.md#configuration)"
        )
    if accepted:
        log.warning(f"config_keys_not_read_by_{backend}_backend", keys=accepted)
    return accepted


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


# --- the core's choices ----------------------------------------------------------------------


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
    agent_class: str | None = None  # a Python agent: module:Class with a run() method
    # ... or an agent in any language: its argv (a list, or one string split as a shell does)
    command: Any = None
    env_map: dict[str, str] = field(default_factory=dict)

    def argv(self, key: str = "agentlightning.local.command") -> list[str] | None:
        """`command` as an argv (None when unset); ConfigError naming `key` when it is not a command."""
        if self.command is None:
            return None
        if isinstance(self.command, str):
            try:
                argv = shlex.split(self.command)
            except ValueError as exc:
                raise ConfigError(f"{key}: {exc} in {self.command!r}") from None
        elif isinstance(self.command, list | tuple) and all(isinstance(a, str) for a in self.command):
            argv = list(self.command)
        else:
            raise ConfigError(f"{key} must be a command line or a list of its words, got {self.command!r}")
        if not argv or not all(argv):
            raise ConfigError(f"{key} must name a program, got {self.command!r}")
        return argv


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
    unclaimed_warning_seconds: float = 30.0  # no rollout taken from the queue by then: a warning; 0: never
    keep_rollouts: bool = False
    # Without keep_rollouts: the newest this many collected rollouts stay on the Gateway (the
    # dashboard shows the run's last ones); older ones are deleted. 0: each one once collected.
    keep_last_rollouts: int = 256
    # The trainer's endpoints are registered with this lease, renewed while it runs: a killed
    # trainer's endpoints leave the Gateway's table within it. 0: no lease (they stay, as in v1.0).
    endpoint_lease_seconds: float = 60.0
    hooks: str | None = None  # v1.0: a Python file with one RolloutHooks subclass (agentlightning/hooks.py)
    fetch_concurrency: int = 8
    poll_wait_seconds: float = 30.0
    local: LocalAgentConfig = field(default_factory=LocalAgentConfig)
    k8s: K8sAgentConfig = field(default_factory=K8sAgentConfig)
    trace_aggregator: TraceAggregatorConfig = field(default_factory=TraceAggregatorConfig)
    reward_fillna_value: float = 0.0
    failed_rollouts: str = FailedRolloutPolicy.DROP.value  # checked into a FailedRolloutPolicy
    # How each rollout outcome is trained: outcome -> rule, and min_group; checked by
    # trainer/outcomes.py when the loop is made (docs/reliability.md). Infrastructure failures are
    # never trained, whatever is set here.
    outcomes: dict[str, Any] = field(default_factory=dict)
    stop_when_all_rollouts_fail: bool = True  # a step or validation whose every rollout failed stops the run
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
    # Several policies trained in one run (docs/policies.md): name -> {path?: its own model}.
    # Empty: one policy, served as `model_name` (v1.0).
    policies: dict[str, Any] = field(default_factory=dict)

    @property
    def policy_names(self) -> list[str]:
        """The names the run's policies are served (and recorded) under, in declared order."""
        return list(self.policies) if self.policies else [self.model_name]

    def policy_path(self, name: str) -> str | None:
        """The model a policy loads, when it has its own (`policies.NAME.path`); None: the run's."""
        spec = self.policies.get(name) or {}
        path = spec.get("path")
        return str(path) if path else None

    def validate(self) -> None:
        """Check the values (the types are the schema's); turn the choices into their enums."""
        self.trace_aggregator.level = _choice(
            "agentlightning.trace_aggregator.level", self.trace_aggregator.level, AggregationLevel
        )
        self.failed_rollouts = _choice(
            "agentlightning.failed_rollouts", self.failed_rollouts, FailedRolloutPolicy
        )
        self.stale_policy = _choice("agentlightning.stale_policy", self.stale_policy, StalePolicy)
        self.advantage_mode = _choice("agentlightning.advantage_mode", self.advantage_mode, AdvantageMode)
        _int("agentlightning.max_staleness", self.max_staleness, 0, allow_none=True)

        def positive(key: str, value: float) -> None:
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise ConfigError(f"agentlightning.{key} must be a positive number, got {value!r}")

        positive("rollout_timeout_seconds", self.rollout_timeout_seconds)
        positive("poll_wait_seconds", self.poll_wait_seconds)
        positive("adv_epsilon", self.adv_epsilon)
        positive("async_rollout.drain_timeout_seconds", self.async_rollout.drain_timeout_seconds)
        if self.rollout_grace_seconds < 0:
            raise ConfigError(
                f"agentlightning.rollout_grace_seconds must be >= 0, got {self.rollout_grace_seconds}"
            )
        if self.async_rollout.pause_retry_after_seconds < 0:
            raise ConfigError("agentlightning.async_rollout.pause_retry_after_seconds must be >= 0")
        if not self.unclaimed_warning_seconds >= 0:
            raise ConfigError(
                "agentlightning.unclaimed_warning_seconds must be >= 0 (0: never warn), "
                f"got {self.unclaimed_warning_seconds}"
            )
        if not math.isfinite(self.reward_fillna_value):
            raise ConfigError("agentlightning.reward_fillna_value must be a finite number")
        _int("agentlightning.fetch_concurrency", self.fetch_concurrency, 1)
        _int("agentlightning.keep_last_rollouts", self.keep_last_rollouts, 0)
        lease = self.endpoint_lease_seconds
        if isinstance(lease, bool) or not isinstance(lease, int | float) or not (0 <= lease < math.inf):
            raise ConfigError(f"agentlightning.endpoint_lease_seconds must be a number >= 0, got {lease!r}")
        _int("agentlightning.max_ppo_update_times", self.max_ppo_update_times, 1, allow_none=True)
        agg = self.trace_aggregator
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
        if not self.model_name:
            raise ConfigError(
                "agentlightning.model_name must not be empty: it is the model name the proxy routes by"
            )
        for name, spec in self.policies.items():
            key = f"agentlightning.policies.{name}"
            if not POLICY_NAME.fullmatch(str(name)):
                raise ConfigError(
                    f"{key}: a policy name is letters, digits, '.', '_' or '-' (it names a model)"
                )
            if spec is None:
                continue
            if not isinstance(spec, Mapping):
                raise ConfigError(f"{key} must be a mapping ({{}} or {{path: MODEL}}), got {spec!r}")
            for k, v in spec.items():
                if k != "path":
                    raise ConfigError(f"{key}.{k}: not a key of a policy (its keys: path)")
                if v is not None and (not isinstance(v, str) or not v.strip()):
                    raise ConfigError(f"{key}.path must be a model path or module:function, got {v!r}")
        if self.hooks and not Path(self.hooks).is_file():
            raise ConfigError(f"agentlightning.hooks: no such file: {self.hooks!r}")
        if self.local.agent_class is not None and not self.local.agent_class.strip():
            raise ConfigError("agentlightning.local.agent_class must be module.Class or module:Class, got ''")
        if self.local.argv() is not None and self.local.agent_class is not None:
            raise ConfigError(
                "agentlightning.local: set agent_class (a Python class) or command (an agent in any "
                "language), not both"
            )


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
# `actor_rollout_ref.actor.kl_loss_type`: verl's `kl_penalty` estimators, on both backends.
KL_LOSS_TYPES = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")


def _plain(cfg: DictConfig | Mapping[str, Any] | None) -> DictConfig:
    if cfg is None:
        return OmegaConf.create({})
    if isinstance(cfg, DictConfig):
        return cfg
    return OmegaConf.create(dict(cfg))


def load_core_config(
    cfg: DictConfig | Mapping[str, Any] | None = None, backend_keys: Collection[str] = ()
) -> CoreConfig:
    """Resolve and validate the core's settings from a full (verl-style) config.

    `backend_keys` are keys of the `agentlightning` block that belong to the calling backend;
    the core ignores them instead of rejecting them as unknown.
    """
    root = _plain(cfg)
    agl: AgentLightningConfig = load_section(
        root, "agentlightning", AgentLightningConfig, unknown="error", skip=backend_keys
    )
    agl.validate()
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
    leaves, maps = dataclass_keys("agentlightning.", AgentLightningConfig)
    return list(VERL_KEYS) + list(FIXED_VERL_KEYS) + sorted(leaves | maps)


# --- the loop's sections -----------------------------------------------------------------------


@dataclass
class CollapseGuardConfig:
    """`trainer.collapse_guard.*`: what to do when validation falls from its best (`trainer/gains.py`)."""

    enable: bool = True
    margin: float = 0.15  # a collapse: `best_metric` more than this below the best ...
    patience: int = 2  # ... for this many validations in a row
    action: str = "rollback"  # rollback: reload the best checkpoint, lr × lr_scale, go on | stop
    lr_scale: float = 0.5
    max_rollbacks: int = 2  # then stop

    def validate(self) -> None:
        key = "trainer.collapse_guard"
        if self.action not in ("rollback", "stop"):
            raise ConfigError(f"{key}.action must be rollback or stop, got {self.action!r}")
        if self.margin < 0:
            raise ConfigError(f"{key}.margin must be >= 0, got {self.margin}")
        if self.patience < 1:
            raise ConfigError(f"{key}.patience must be >= 1, got {self.patience}")
        if not 0 < self.lr_scale <= 1:
            raise ConfigError(f"{key}.lr_scale must be in (0, 1], got {self.lr_scale}")
        if self.max_rollbacks < 0:
            raise ConfigError(f"{key}.max_rollbacks must be >= 0, got {self.max_rollbacks}")


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
    max_actor_ckpt_to_keep: int | None = 2  # None: keep all (the best is kept besides these)
    keep_best: bool = True  # save and keep the checkpoint of the best validation (`best_metric`)
    best_metric: str = "val/reward"  # higher is better
    collapse_guard: CollapseGuardConfig = field(default_factory=CollapseGuardConfig)
    logger: list[str] = field(default_factory=lambda: ["console", "jsonl", "tensorboard"])
    # Ours:
    output_dir: str = "."  # metrics.jsonl, tensorboard/
    torch_threads: int = 0  # torch's intra-op threads; 0: torch's default
    log_level: str = "info"

    def validate(self) -> None:
        if self.total_epochs < 1:
            raise ConfigError(f"trainer.total_epochs must be >= 1, got {self.total_epochs}")
        if self.total_training_steps is not None and self.total_training_steps < 1:
            raise ConfigError(f"trainer.total_training_steps must be >= 1, got {self.total_training_steps}")
        if self.resume_mode not in ("auto", "disable", "resume_path"):
            raise ConfigError(
                f"trainer.resume_mode must be auto, disable or resume_path, got {self.resume_mode!r}"
            )
        if self.resume_mode == "resume_path" and not self.resume_from_path:
            raise ConfigError("trainer.resume_mode=resume_path needs trainer.resume_from_path")
        if self.torch_threads < 0:
            raise ConfigError(f"trainer.torch_threads must be >= 0, got {self.torch_threads}")
        if not self.best_metric.startswith("val/"):
            raise ConfigError(
                f"trainer.best_metric must be a validation metric (val/...), got {self.best_metric!r}"
            )
        self.collapse_guard.validate()


@dataclass
class DataConfig:
    """`data.*` read by the loop (the batch size and length limits are the trainer core's)."""

    train_files: Any = None  # a .jsonl / .json / .parquet path or a list of them
    val_files: Any = None
    shuffle: bool = True
    seed: int = 0


@dataclass(frozen=True)
class TrainingConfig:
    """A training config, parsed once (`load_training_config`): the core's settings and the loop's.
    The loop hands it to the backend, which reads its own block with its own loader."""

    core: CoreConfig
    trainer: TrainerConfig
    data: DataConfig


def load_training_config(
    cfg: DictConfig | Mapping[str, Any] | None, backend_keys: Collection[str] = ()
) -> TrainingConfig:
    """The core's settings (`load_core_config`), `trainer.*` and the loop's `data.*`. Keys of the
    loop's sections that it does not read are left to the backend's `check_keys`."""
    root = _plain(cfg)
    core = load_core_config(root, backend_keys)
    trainer: TrainerConfig = load_section(root, "trainer", TrainerConfig)
    data: DataConfig = load_section(root, "data", DataConfig)
    trainer.validate()
    return TrainingConfig(core, trainer, data)
