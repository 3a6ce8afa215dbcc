"""The verl backend's configuration: verl's `ppo_trainer` defaults plus our keys, validated.

`compose_config` builds the packaged `config.yaml` (verl's defaults through the Hydra search
path `pkg://verl/trainer/config`, then ours) and merges a user config over it. A config written
for the torch backend also works: keys verl does not know (the torch engine's `rollout.device`,
`trainer.torch_threads`, …) are left out of the view verl sees (`verl_view`) and logged once.

`validate` checks, in this order: the trainer's keys (`load_training_config`), the loss set-up
the per-rollout mean needs, our backend keys (in the trainer's one style: a dataclass schema read
by `load_section` and its `validate()`), then verl's own `validate_config` on the verl view — and
turns every failure into a `ConfigError` naming the key. The torch backend's keys are known from
its packaged config (`agentlightning/config/train.yaml`), not from its code: verl does not import
the torch backend.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig, OmegaConf

from agentlightning.config.loader import merge
from agentlightning.config.schema import ConfigError, leaf_items
from agentlightning.config.suggest import did_you_mean
from agentlightning.log import get_logger
from agentlightning.trainer.config import KL_LOSS_TYPES, TrainingConfig, load_section, load_training_config
from agentlightning.trainer.distill import KEY as DISTILL_KEY
from agentlightning.trainer.distill import DistillConfig
from agentlightning.verl.loss import LOSS_AGG_MODE, WEIGHTED_LOSSES

log = get_logger("verl_config")

_TRAIN_YAML = Path(__file__).resolve().parent.parent / "config" / "train.yaml"  # the torch defaults

# Keys of ours inside verl's sections: read by the backend, removed from verl's view.
OUR_KEYS = (
    "actor_rollout_ref.actor.old_log_prob_source",
    "actor_rollout_ref.actor.tis_imp_ratio_cap",
    "actor_rollout_ref.actor.loss_scale_factor",  # the core's loss weights carry it
)


@dataclass
class VerlBackendConfig:
    """What the backend reads beyond the core and verl: our keys in `actor_rollout_ref.actor`,
    and on-policy distillation's block, `algorithm.distill` (the torch backend's keys)."""

    old_log_prob_source: str = "rollout"  # rollout | recompute
    tis_imp_ratio_cap: float = -1.0
    distill: DistillConfig = field(default_factory=DistillConfig)  # read by load_backend_config

    def validate(self) -> None:
        if self.old_log_prob_source not in ("rollout", "recompute"):
            raise ConfigError(
                "actor_rollout_ref.actor.old_log_prob_source must be rollout or recompute, "
                f"got {self.old_log_prob_source!r}"
            )
        self.distill.validate()


@functools.cache
def _packaged() -> DictConfig:
    GlobalHydra.instance().clear()
    try:
        with initialize_config_module(config_module="agentlightning.verl", version_base=None):
            return compose(config_name="config")
    finally:
        GlobalHydra.instance().clear()


def compose_config(
    user: DictConfig | Mapping[str, Any] | None = None, overrides: Sequence[str] = ()
) -> DictConfig:
    """The packaged config (verl's defaults + ours) with `user` merged over it, then `overrides`."""
    base = copy.deepcopy(_packaged())
    OmegaConf.set_struct(base, False)
    if user is not None:
        base = merge(base, user if isinstance(user, DictConfig) else OmegaConf.create(dict(user)))
    if overrides:
        base = merge(base, OmegaConf.from_dotlist(list(overrides)))
    return base


@functools.cache
def _packaged_keys() -> dict[str, Any]:
    """The packaged config as a plain dict: which keys verl (and we) declare."""
    return OmegaConf.to_container(compose_config(), resolve=False)  # type: ignore[return-value]  # a DictConfig: a dict


def _free_form(key: str) -> bool:
    """A key under a mapping verl declares but leaves free: `fsdp_config.mixed_precision`
    (FSDPEngineConfig: an optional dict of dtypes, read as given) and the inference engine's own
    arguments, `rollout.engine_kwargs.{vllm,sglang,trtllm}.*` (handed to the engine as they are:
    e.g. vLLM's `enable_auto_tool_choice`, `tool_call_parser`)."""
    dotted = f".{key}"
    return ".fsdp_config.mixed_precision" in dotted or ".rollout.engine_kwargs." in dotted


def _unknown_keys(cfg: Any, known: Any, prefix: str = "") -> list[str]:
    """Dotted keys of `cfg` that `known` does not have (inside mappings `known` declares)."""
    if not isinstance(cfg, dict) or not isinstance(known, dict):
        return []
    out: list[str] = []
    for key, value in cfg.items():
        path = f"{prefix}{key}"
        if key not in known:
            out.append(path)
        elif isinstance(known[key], dict) and known[key]:
            out += _unknown_keys(value, known[key], f"{path}.")
    return out


@functools.cache
def _torch_defaults() -> DictConfig:
    """The torch backend's packaged config: the keys only it reads, at values that ask it for nothing."""
    return OmegaConf.load(_TRAIN_YAML)  # type: ignore[return-value]  # a mapping file: a DictConfig


@functools.cache
def _torch_backend_keys() -> frozenset[str]:
    """Every key of the torch backend's packaged config, dotted."""
    return frozenset(key for key, _ in leaf_items(_torch_defaults()))


def verl_view(cfg: DictConfig) -> DictConfig:
    """`cfg` without what verl does not read: the agentlightning block, our keys, other backends' keys;
    the loss as verl runs it: the registered weighted loss of `policy_loss.loss_mode`, `token-sum`
    over the core's weights (which carry `loss_agg_mode`)."""
    view = merge(OmegaConf.create(), OmegaConf.to_container(cfg, resolve=True))  # a resolved copy
    OmegaConf.set_struct(view, False)
    view.pop("agentlightning", None)
    algorithm = OmegaConf.select(view, "algorithm")
    if isinstance(algorithm, DictConfig):
        algorithm.pop("distill", None)  # ours: the backend scores the rows with the teacher
    actor = OmegaConf.select(view, "actor_rollout_ref.actor")
    if isinstance(actor, DictConfig):
        mode = OmegaConf.select(actor, "policy_loss.loss_mode", default="vanilla")
        if mode in WEIGHTED_LOSSES:
            actor.policy_loss.loss_mode = WEIGHTED_LOSSES[mode]
        actor.loss_agg_mode = LOSS_AGG_MODE
    for key in OUR_KEYS:
        parent, _, leaf = key.rpartition(".")
        node = OmegaConf.select(view, parent)
        if isinstance(node, DictConfig):
            node.pop(leaf, None)
    unknown = _unknown_keys(OmegaConf.to_container(view), _packaged_keys())
    # Keys only the torch backend reads (its engine's host, port, device, …) are dropped; any
    # other key goes on to verl, which knows fields its yaml does not list (and refuses bad ones).
    torch_only = _torch_backend_keys()
    dropped = [k for k in unknown if k in torch_only and k.startswith("actor_rollout_ref.")]
    for key in dropped:
        parent, _, leaf = key.rpartition(".")
        node = OmegaConf.select(view, parent) if parent else view
        if isinstance(node, DictConfig):
            node.pop(leaf, None)
    if dropped:
        log.info("config_keys_ignored_by_verl_backend", keys=sorted(dropped))
    return view


def check_verl_keys(cfg: DictConfig) -> None:
    """Every key is read by the verl backend (verl's own, ours, the core's), or start-up fails naming
    it. A key only the torch backend reads is accepted at the torch default (one file drives both
    backends; `verl_view` leaves it out, logged) and fails set to anything else."""
    plain = OmegaConf.to_container(cfg, resolve=False)
    assert isinstance(plain, dict)
    plain.pop("agentlightning", None)  # the core checks its own block
    if isinstance(plain.get("algorithm"), dict):
        plain["algorithm"].pop("distill", None)  # ours: load_backend_config checks it
    unknown = [k for k in _unknown_keys(plain, _packaged_keys()) if not _free_form(k)]
    torch_read = _torch_backend_keys()
    torch_defaults = _torch_defaults()
    missing = object()
    bad: list[str] = []
    for key in unknown:
        torch_only = key in torch_read or any(k.startswith(f"{key}.") for k in torch_read)
        if not torch_only:
            bad.append(key)
            continue
        value = OmegaConf.select(cfg, key)
        default = OmegaConf.select(torch_defaults, key, default=missing)
        if isinstance(value, DictConfig):
            value = OmegaConf.to_container(value, resolve=True)
        if isinstance(default, DictConfig):
            default = OmegaConf.to_container(default, resolve=True)
        if value != default:
            raise ConfigError(
                f"{key}={value!r} is read only by the torch backend: the verl backend does not read it "
                "(remove it, or train with backend=torch)"
            )
    if bad:
        known = {k for k, _ in leaf_items(_packaged_keys())}
        more = f"; also not read: {', '.join(bad[1:])}" if len(bad) > 1 else ""
        raise ConfigError(
            f"{bad[0]}: not a key the verl backend reads{did_you_mean(bad[0], known)}{more}. "
            "Every key must do something: remove it or fix its name (docs/training.md#configuration)"
        )


def load_backend_config(cfg: DictConfig) -> VerlBackendConfig:
    ours: VerlBackendConfig = load_section(
        cfg, "actor_rollout_ref.actor", VerlBackendConfig, unknown="quiet", skip=("distill",)
    )
    ours.distill = load_section(cfg, DISTILL_KEY, DistillConfig, unknown="error")
    ours.validate()
    return ours


def _check_loss(cfg: DictConfig) -> None:
    from verl.trainer.ppo import core_algos

    actor = "actor_rollout_ref.actor"
    mode = OmegaConf.select(cfg, f"{actor}.policy_loss.loss_mode")
    if mode not in WEIGHTED_LOSSES:
        raise ConfigError(
            f"{actor}.policy_loss.loss_mode must be vanilla, gspo or cispo with the verl backend, got {mode!r}: "
            "each is verl's own loss fed the trainer core's loss weights"
        )
    if WEIGHTED_LOSSES[mode] not in core_algos.POLICY_LOSS_REGISTRY:
        raise ConfigError(f"{actor}.policy_loss.loss_mode={mode}: this verl has no {mode!r} policy loss")
    correction = OmegaConf.select(cfg, "algorithm.rollout_correction", default=None)
    if isinstance(correction, DictConfig) and (correction.get("rollout_is") or correction.get("rollout_rs")):
        raise ConfigError(
            "algorithm.rollout_correction (rollout_is / rollout_rs) is not supported by the verl backend yet: "
            "verl's rollout_is_weights carry the trainer core's loss weights there. Use "
            f"{actor}.tis_imp_ratio_cap with old_log_prob_source=recompute, or the torch backend"
        )
    if OmegaConf.select(cfg, f"{actor}.use_kl_loss"):
        kind = OmegaConf.select(cfg, f"{actor}.kl_loss_type")
        if kind not in KL_LOSS_TYPES:
            raise ConfigError(
                f"{actor}.kl_loss_type must be one of {', '.join(KL_LOSS_TYPES)} (verl's kl_penalty), got {kind!r}"
            )
    if OmegaConf.select(cfg, f"{actor}.entropy_coeff"):
        raise ConfigError(
            f"{actor}.entropy_coeff != 0 is not supported by the verl backend yet: verl's ppo_loss adds the "
            "entropy term without the per-rollout weights"
        )
    if OmegaConf.select(cfg, "actor_rollout_ref.model.lora_rank", default=0):
        # verl 0.9.1 trains the adapter and loads it into its vLLM replicas, but applies it only on
        # its own token-in `generate` path; the OpenAI endpoint the Gateway calls serves the base.
        raise ConfigError(
            "actor_rollout_ref.model.lora_rank > 0 is not supported by the verl backend yet: verl's vLLM "
            "replicas apply the adapter only to verl's own generate calls, not to the OpenAI calls agents "
            "make through the Gateway, so rollouts would come from the base model (use the torch backend "
            "for LoRA, or lora_rank=0)"
        )
    if OmegaConf.select(cfg, "actor_rollout_ref.rollout.name") != "vllm":
        raise ConfigError("actor_rollout_ref.rollout.name must be vllm: the verl backend serves with vLLM")


def _check_rollback_lr(cfg: DictConfig, settings: TrainingConfig) -> None:
    """The collapse guard's rollback loads verl's checkpoint with its optimizer and scheduler as
    saved: verl's learning rate is not scaled. `lr_scale` is accepted at 1 and, like every torch-only
    key, at the torch default (one file drives both backends; said once), and refused otherwise."""
    guard = settings.trainer.collapse_guard
    if not guard.enable or guard.action != "rollback" or guard.lr_scale == 1.0:
        return
    key = "trainer.collapse_guard.lr_scale"
    if guard.lr_scale == OmegaConf.select(_torch_defaults(), key):
        log.warning(
            "config_key_not_applied_by_verl_backend",
            key=key,
            value=guard.lr_scale,
            reason="a rollback restores verl's optimizer and scheduler as saved, at the same learning rate",
        )
        return
    raise ConfigError(
        f"{key}={guard.lr_scale:g}: the verl backend rolls back by loading verl's checkpoint, optimizer and "
        "scheduler as saved, and cannot scale its learning rate; set lr_scale=1.0 or action=stop"
    )


def validate(cfg: DictConfig) -> tuple[TrainingConfig, VerlBackendConfig, DictConfig]:
    """The trainer's settings (parsed once here, for the loop and the backend), ours and the config
    verl sees; ConfigError naming the key when bad."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    settings = load_training_config(cfg)
    check_verl_keys(cfg)
    _check_rollback_lr(cfg, settings)
    _check_loss(cfg)
    ours = load_backend_config(cfg)
    if not OmegaConf.select(cfg, "actor_rollout_ref.model.path", default=None):
        raise ConfigError("actor_rollout_ref.model.path is not set: a Hugging Face model directory")
    view = verl_view(cfg)
    try:
        validate_config(view, use_reference_policy=need_reference_policy(view), use_critic=need_critic(view))
    except (AssertionError, ValueError, TypeError) as exc:
        raise ConfigError(f"verl rejects the config: {exc}") from None
    except Exception as exc:  # hydra's InstantiationException wraps verl's dataclass checks
        raise ConfigError(f"verl rejects the config: {str(exc).splitlines()[0]}") from None
    return settings, ours, view


def router_replay_mode(view: DictConfig) -> str:
    """verl's router replay mode for the actor: `disabled`, `R2` or `R3` (R3 replays the routes
    recorded at rollout, which the batch then must carry). Read as verl 0.9.1 reads it
    (verl/workers/engine_workers.py): from the megatron or veomni engine config, per strategy."""
    actor = view.actor_rollout_ref.actor
    strategy = OmegaConf.select(actor, "strategy", default=None)
    if strategy not in ("megatron", "veomni"):
        return "disabled"
    return str(OmegaConf.select(actor, f"{strategy}.router_replay.mode", default="disabled"))
