"""Checkpoints in verl's layout: atomic, the latest one found, old ones pruned, the backend's
files inside the same folder."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from agentlightning.trainer.checkpoint import (
    BEST_FILE,
    LATEST_FILE,
    best_checkpoint,
    latest_checkpoint,
    list_checkpoints,
    load_loop_state,
    mark_best_checkpoint,
    python_rng_state,
    save_checkpoint,
    set_python_rng_state,
    step_dir,
)


def write_weights(value: str):
    def save(folder: Path) -> None:
        (folder / "weights.txt").write_text(value)

    return save


def test_save_load_and_keep_the_newest(tmp_path: Path) -> None:
    for step in (1, 2, 3):
        save_checkpoint(tmp_path, step, {"step": step}, write_weights(f"w{step}"), keep=2)
    assert list_checkpoints(tmp_path) == [2, 3]
    assert (tmp_path / LATEST_FILE).read_text().strip() == "3"
    latest = latest_checkpoint(tmp_path)
    assert latest == step_dir(tmp_path, 3)
    assert load_loop_state(latest) == {"step": 3}
    assert (latest / "weights.txt").read_text() == "w3"  # the backend's files beside the loop's
    assert not list(tmp_path.glob(".*tmp"))


def test_a_torn_latest_file_falls_back_to_the_newest_complete_checkpoint(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, 4, {"step": 4}, write_weights("a"))
    save_checkpoint(tmp_path, 6, {"step": 6}, write_weights("b"))
    (tmp_path / LATEST_FILE).write_text("")  # crashed while rewriting it
    (tmp_path / "global_step_7").mkdir()  # crashed before its state was written
    assert latest_checkpoint(tmp_path) == step_dir(tmp_path, 6)
    assert latest_checkpoint(tmp_path / "nothing-here") is None
    with pytest.raises(FileNotFoundError, match="no checkpoint at"):
        load_loop_state(tmp_path / "global_step_7")


def test_a_crash_before_the_latest_file_is_replaced_still_resumes_from_the_newest(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, 1, {"step": 1}, write_weights("a"))
    save_checkpoint(tmp_path, 2, {"step": 2}, write_weights("b"))
    (tmp_path / LATEST_FILE).write_text("1\n")  # killed after the rename, before the file's update
    assert latest_checkpoint(tmp_path) == step_dir(tmp_path, 2)


def test_a_backend_that_fails_to_save_leaves_the_previous_checkpoint_latest(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, 1, {"step": 1}, write_weights("a"))

    def broken(folder: Path) -> None:
        (folder / "half.bin").write_bytes(b"\0")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(tmp_path, 2, {"step": 2}, broken)
    assert latest_checkpoint(tmp_path) == step_dir(tmp_path, 1)
    assert list_checkpoints(tmp_path) == [1]


def test_python_rng_state_round_trips_through_json() -> None:
    state = json.loads(json.dumps(python_rng_state()))
    expected = [random.random() for _ in range(3)]
    set_python_rng_state(state)
    assert [random.random() for _ in range(3)] == expected


def test_the_best_checkpoint_is_marked_and_outlives_rotation(tmp_path: Path) -> None:
    assert best_checkpoint(tmp_path) is None
    save_checkpoint(tmp_path, 1, {"step": 1}, write_weights("best"), keep=2)
    mark_best_checkpoint(tmp_path, 1)
    for step in (2, 3, 4):
        save_checkpoint(tmp_path, step, {"step": step}, write_weights(f"w{step}"), keep=2, protect=1)
    assert list_checkpoints(tmp_path) == [1, 3, 4]  # the newest two, and the best
    assert (tmp_path / BEST_FILE).read_text().strip() == "1"
    best = best_checkpoint(tmp_path)
    assert best == step_dir(tmp_path, 1) and (best / "weights.txt").read_text() == "best"
    assert latest_checkpoint(tmp_path) == step_dir(tmp_path, 4)  # resuming takes the newest, not the best
    # A new best moves the mark; the old best then rotates out like any other checkpoint.
    save_checkpoint(tmp_path, 5, {"step": 5}, write_weights("w5"), keep=2, protect=5)
    mark_best_checkpoint(tmp_path, 5)
    assert list_checkpoints(tmp_path) == [4, 5]
    assert best_checkpoint(tmp_path) == step_dir(tmp_path, 5)
    # A mark whose folder is gone (removed by hand) names no checkpoint.
    mark_best_checkpoint(tmp_path, 1)
    assert best_checkpoint(tmp_path) is None
