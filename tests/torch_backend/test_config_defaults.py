"""Defaults in one place: the schemas (`torch_default`) are the source; every value the shipped
configs write for a key the trainer reads is that default, except the few listed below on purpose
(each with why), so that a default changed in one place and not the other fails here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from agentlightning.config.schema import leaf_items
from agentlightning.torch_backend.config import torch_default, torch_read_keys

PKG = Path(__file__).resolve().parents[2] / "agentlightning"

# Shipped values that differ from the schema's default on purpose: key -> why.
DIFFERENT: dict[str, str] = {
    # agl-train keeps each run in its own folder; `run_ppo(config)` from Python writes where it runs (v1.0)
    "trainer.output_dir": ".agl/runs/${trainer.experiment_name} on the command line, . from Python",
    "trainer.default_local_dir": "${trainer.output_dir}/checkpoints on the command line, checkpoints from Python",
    # null means data.train_batch_size: one mini-batch per step, 8 in both
    "actor_rollout_ref.actor.ppo_mini_batch_size": "8 = data.train_batch_size, what null means",
}


def _shipped_values() -> dict[str, Any]:
    _, maps = torch_read_keys()
    return dict(leaf_items(OmegaConf.load(PKG / "config" / "train.yaml"), maps=maps))


def test_every_key_the_torch_backend_reads_has_a_default() -> None:
    read, maps = torch_read_keys()
    for key in read | maps:
        torch_default(key)  # KeyError names a key whose default is written nowhere


def test_train_yaml_writes_the_schemas_defaults() -> None:
    shipped = _shipped_values()
    assert shipped["actor_rollout_ref.actor.optim.lr"] == torch_default("actor_rollout_ref.actor.optim.lr")
    differ = {key for key, value in shipped.items() if value != torch_default(key)}
    unexplained = sorted(differ - set(DIFFERENT))
    assert not unexplained, [(key, shipped[key], torch_default(key)) for key in unexplained]
    stale = sorted(set(DIFFERENT) - differ)
    assert not stale, f"the same now, delete from DIFFERENT: {stale}"


def test_the_verl_configs_agentlightning_block_writes_the_same_defaults() -> None:
    """verl's config.yaml carries our `agentlightning` block too (verl's own keys keep verl's
    defaults): the same values as the torch backend's."""
    verl = OmegaConf.load(PKG / "verl" / "config.yaml")
    _, maps = torch_read_keys()
    ours = {k: v for k, v in leaf_items(verl, maps=maps) if k.startswith("agentlightning.")}
    assert "agentlightning.agl_base_url" in ours
    for key, value in ours.items():
        assert value == torch_default(key), key
