"""The torch backend's part of a checkpoint: weights and optimizer state, and torch's RNG."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from agentlightning.torch_backend.checkpoint import (
    load_policy_state,
    save_policy_state,
    set_torch_rng_state,
    torch_rng_state,
)


def test_policy_state_round_trips(tmp_path: Path) -> None:
    save_policy_state(tmp_path, {"w": torch.arange(3.0)})
    assert torch.equal(load_policy_state(tmp_path)["w"], torch.arange(3.0))
    with pytest.raises(FileNotFoundError, match="no torch backend state"):
        load_policy_state(tmp_path / "elsewhere")


def test_torch_rng_state_round_trips() -> None:
    state = torch_rng_state()
    expected = torch.rand(3)
    set_torch_rng_state(state)
    assert torch.equal(torch.rand(3), expected)
