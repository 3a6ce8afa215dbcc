"""No silent no-ops with the torch backend: every key of every shipped config (agl-train's
train.yaml, agl-demo's `train` block, the verl backend's config.yaml) is read by the torch
backend, or accepted unread with a warning that says why (verl's engine keys, for v1.0
configs), or start-up fails naming the key and the backend. A misspelt key always fails."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from omegaconf import DictConfig, OmegaConf

from agentlightning.commands.backends import main as agl_train
from agentlightning.config.schema import ConfigError, leaf_items
from agentlightning.torch_backend.config import (
    TORCH_FIXED_KEYS,
    check_torch_keys,
    load_torch_backend_config,
    torch_read_keys,
)
from agentlightning.trainer.config import load_core_config

PKG = Path(__file__).resolve().parents[2] / "agentlightning"


def _mapping(cfg: Any) -> DictConfig:
    """`cfg`, a config of keys (OmegaConf's loaders are typed for lists too)."""
    assert isinstance(cfg, DictConfig), type(cfg)
    return cfg


def _train_yaml() -> DictConfig:
    return _mapping(OmegaConf.load(PKG / "config" / "train.yaml"))


def _shipped() -> dict[str, DictConfig]:
    demo = _mapping(OmegaConf.load(PKG / "config" / "demo.yaml"))
    verl = _mapping(OmegaConf.load(PKG / "verl" / "config.yaml"))
    for directive in ("hydra", "defaults"):  # Hydra's composition directives, not settings
        verl.pop(directive)
    return {
        "agl-train": _train_yaml(),
        "agl-demo": _mapping(OmegaConf.merge(_train_yaml(), demo.train)),
        "verl": verl,
    }


def _with(cfg: DictConfig, key: str, value: Any) -> DictConfig:
    out = _mapping(OmegaConf.create(OmegaConf.to_container(cfg, resolve=False)))
    OmegaConf.update(out, key, value, force_add=True)
    return out


def _without(cfg: DictConfig, key: str) -> DictConfig:
    out = _mapping(OmegaConf.create(OmegaConf.to_container(cfg, resolve=False)))
    parent, _, leaf = key.rpartition(".")
    node = OmegaConf.select(out, parent) if parent else out
    node.pop(leaf)
    return out


def _misspelt(key: str) -> str:
    parent, _, leaf = key.rpartition(".")
    bad = leaf[:-2] + leaf[-1] + leaf[-2] if len(leaf) > 2 and leaf[-1] != leaf[-2] else leaf + "x"
    return f"{parent}.{bad}" if parent else bad


@pytest.mark.parametrize("name", ["agl-train", "agl-demo", "verl"])
def test_every_key_of_every_shipped_config_is_read_or_said(name: str) -> None:
    cfg = _shipped()[name]
    read, maps = torch_read_keys()
    accepted = check_torch_keys(cfg)
    for key, value in leaf_items(cfg, maps=maps):
        if key in accepted:
            assert accepted[key]  # said, with the reason
            continue
        bad = _misspelt(key)
        if key in TORCH_FIXED_KEYS:  # verl's, checked at the one value the torch backend runs
            with pytest.raises(ConfigError, match=key.replace(".", "[.]")):
                check_torch_keys(_with(cfg, key, "something else"))
            continue
        assert key in read or key in maps, key
        # A misspelling of it is never accepted, and the message names it and the backend.
        with pytest.raises(ConfigError, match=rf"{bad.replace('.', '[.]')}.*torch backend"):
            check_torch_keys(_with(_without(cfg, key), bad, value))
    if name != "verl":
        assert accepted == {}  # our own configs carry no key the torch backend leaves unread


@pytest.mark.parametrize(
    ("key", "value", "meant"),
    [
        ("actor_rollout_ref.actor.clip_ratio_hgih", 0.28, "actor_rollout_ref.actor.clip_ratio_high"),
        ("actor_rollout_ref.rollout.temprature", 0.7, "actor_rollout_ref.rollout.temperature"),
        ("algorithm.adv_estimater", "rloo", "algorithm.adv_estimator"),
        ("trainer.total_trainig_steps", 3, "trainer.total_training_steps"),
        ("data.train_batch_szie", 4, "data.train_batch_size"),
    ],
)
def test_misspelt_keys_fail_with_a_did_you_mean(key: str, value: Any, meant: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_torch_backend_config(_with(_train_yaml(), key, value))
    assert str(err.value).startswith(f"{key}: not a key the torch backend reads (did you mean {meant}?)")


def test_agl_train_refuses_a_misspelt_key_before_anything_starts(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # keep the process's logging as it is (configured here it would print to capsys' closed stream later)
    monkeypatch.setattr("agentlightning.config.loader.configure_logging", lambda level: None)
    with pytest.raises(SystemExit) as exit_:
        agl_train(
            ["actor_rollout_ref.rollout.temprature=0.7", "agentlightning.agl_base_url=http://127.0.0.1:9"]
        )
    assert exit_.value.code == 2
    assert (
        "actor_rollout_ref.rollout.temprature: not a key the torch backend reads" in capsys.readouterr().err
    )


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("algorithm.use_kl_in_reward", True),
        ("algorithm.gamma", 0.9),
        ("critic.enable", True),
        ("actor_rollout_ref.actor.policy_loss.clip_cov_ratio", 0.0002),  # a verl loss knob we do not run
        ("actor_rollout_ref.actor.temperature", 0.5),  # set from rollout.temperature: never a key
    ],
)
def test_verl_algorithm_keys_the_torch_backend_does_not_run_fail(key: str, value: Any) -> None:
    cfg = _with(_train_yaml(), key, value)
    with pytest.raises(ConfigError, match=key.replace(".", "[.]")):
        load_core_config(cfg)  # algorithm.gamma: the core's (it discounts step rewards only)
        load_torch_backend_config(cfg)


def test_verl_engine_keys_are_accepted_unread_with_the_reason() -> None:
    cfg = _with(_train_yaml(), "actor_rollout_ref.rollout.tensor_model_parallel_size", 2)
    cfg = _with(cfg, "actor_rollout_ref.actor.fsdp_config.param_offload", True)
    accepted = check_torch_keys(cfg)
    assert set(accepted) == {
        "actor_rollout_ref.rollout.tensor_model_parallel_size",
        "actor_rollout_ref.actor.fsdp_config.param_offload",
    }
    assert "parallelism" in accepted["actor_rollout_ref.rollout.tensor_model_parallel_size"]


def test_the_algorithm_keys_reach_the_loss_and_the_core() -> None:
    cfg = _train_yaml()
    for key, value in {
        "actor_rollout_ref.actor.policy_loss.loss_mode": "gspo",
        "actor_rollout_ref.actor.loss_agg_mode": "token-mean",
        "actor_rollout_ref.actor.clip_ratio_high": 0.28,
        "actor_rollout_ref.actor.old_log_prob_source": "recompute",
        "algorithm.adv_estimator": "reinforce_plus_plus",
        "algorithm.filter_groups.enable": True,
        "algorithm.rollout_correction.rollout_is": "token",
        "algorithm.rollout_correction.rollout_rs": "geometric",
        "algorithm.rollout_correction.rollout_rs_threshold": 1.5,
    }.items():
        cfg = _with(cfg, key, value)
    torch_cfg = load_torch_backend_config(cfg)
    core = load_core_config(cfg)
    assert torch_cfg.actor.policy_loss.loss_mode == "gspo"
    assert torch_cfg.actor.clip_high == 0.28
    assert torch_cfg.rollout_correction.rollout_is == "token"
    assert torch_cfg.rollout_correction.rollout_rs_threshold == 1.5
    assert core.loss_agg_mode == "token-mean"
    assert core.adv_estimator == "reinforce_plus_plus"
    assert core.filter_groups is True


def test_rollout_correction_without_recomputed_old_log_probs_fails() -> None:
    from agentlightning.torch_backend.policy import ActorConfig, PolicyUpdater  # noqa: F401

    cfg = _with(_train_yaml(), "actor_rollout_ref.actor.tis_imp_ratio_cap", 2.0)
    with pytest.raises(ValueError, match="old_log_prob_source=recompute"):
        load_torch_backend_config(cfg)


def test_v1_loss_mode_per_rollout_mean_is_the_vanilla_loss() -> None:
    cfg = _with(_train_yaml(), "actor_rollout_ref.actor.policy_loss.loss_mode", "per_rollout_mean")
    assert load_torch_backend_config(cfg).actor.policy_loss.loss_mode == "vanilla"


def test_outcome_rules_are_the_cores_to_check_not_unknown_keys() -> None:
    """`agentlightning.outcomes` holds outcome names below it (docs/reliability.md): the key check
    passes them on; trainer/outcomes.py refuses a bad one when the loop is made."""
    cfg = _with(_train_yaml(), "agentlightning.outcomes.no_reward", {"action": "fail", "max_share": 0.2})
    cfg = _with(cfg, "agentlightning.outcomes.min_group", 3)
    assert check_torch_keys(cfg) == {}
