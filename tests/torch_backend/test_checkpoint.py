"""Checkpoints in verl's layout: atomic, the latest one found, old ones pruned."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from agentlightning.torch_backend.checkpoint import (
    LATEST_FILE,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    rng_state,
    save_checkpoint,
    set_rng_state,
    step_dir,
)


def test_save_load_and_keep_the_newest(tmp_path: Path) -> None:
    for step in (1, 2, 3):
        save_checkpoint(tmp_path, step, {"step": step, "w": torch.full((2,), float(step))}, keep=2)
    assert list_checkpoints(tmp_path) == [2, 3]
    assert (tmp_path / LATEST_FILE).read_text().strip() == "3"
    latest = latest_checkpoint(tmp_path)
    assert latest == step_dir(tmp_path, 3)
    state = load_checkpoint(latest)
    assert state["step"] == 3 and torch.equal(state["w"], torch.tensor([3.0, 3.0]))
    assert not list(tmp_path.glob(".*tmp"))


def test_a_torn_latest_file_falls_back_to_the_newest_complete_checkpoint(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, 4, {"step": 4})
    save_checkpoint(tmp_path, 6, {"step": 6})
    (tmp_path / LATEST_FILE).write_text("")  # crashed while rewriting it
    (tmp_path / "global_step_7").mkdir()  # crashed before its state was written
    assert latest_checkpoint(tmp_path) == step_dir(tmp_path, 6)
    assert latest_checkpoint(tmp_path / "nothing-here") is None
    with pytest.raises(FileNotFoundError, match="no checkpoint at"):
        load_checkpoint(tmp_path / "global_step_7")


def test_rng_state_round_trips() -> None:
    state = rng_state()
    expected = (random.random(), torch.rand(3))
    set_rng_state(state)
    assert random.random() == expected[0]
    assert torch.equal(torch.rand(3), expected[1])
