"""`agl-train --help` names every key the torch backend reads: the shipped train.yaml, then the
others with their defaults from the schema (generated: a key added to a schema shows up)."""

from __future__ import annotations

import pytest
import yaml

from agentlightning.commands.backends import main as agl_train
from agentlightning.config.schema import leaf_items
from agentlightning.torch_backend.config import torch_read_keys


def test_help_names_every_key_the_torch_backend_reads(capsys: pytest.CaptureFixture[str]) -> None:
    agl_train(["--help"])
    out = capsys.readouterr().out
    assert out.startswith("usage: agl-train [backend=torch|verl] [--config FILE.yaml] [key=value ...]")
    read, maps = torch_read_keys()
    shipped, listed = out.split("Defaults:\n\n")[1].split("\nThe other keys it reads")
    in_yaml = {key for key, _ in leaf_items(yaml.safe_load(shipped), maps=maps)}
    for key in sorted(read | maps):
        assert key in in_yaml or f"\n  {key}: " in listed, key
    # the keys an earlier --help left out
    for key in ("keep_rollouts", "failed_rollouts", "reward_fillna_value", "rollout_grace_seconds"):
        assert f"\n  {key}: " in out
    assert "\n  trace_aggregator:\n    level: trajectory" in out
    assert "  agentlightning.poll_wait_seconds: 30.0" in listed


def test_agl_train_help_names_the_same_keys(capsys: pytest.CaptureFixture[str]) -> None:
    from agentlightning.commands.train import main as agl_train_local

    agl_train(["--help"])
    keys = capsys.readouterr().out.split("\n\n", 1)[1]  # after agl-train's usage line
    assert agl_train_local(["--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: agl train CONFIG.yaml") and out.endswith(keys)
