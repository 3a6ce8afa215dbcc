"""Checkpoints in verl's layout: atomic, the latest one found, old ones pruned, the backend's
files inside the same folder."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from agentlightning.config.schema import ConfigError
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
from agentlightning.trainer.config import load_training_config


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


class SavesOnly:
    """A backend that only saves (nothing of its own): the refusal comes before it starts."""

    started = False

    def save(self, folder: Path) -> None:
        (folder / "weights.txt").write_text("w")

    def start(self, *args: object) -> list[str]:
        self.started = True
        raise AssertionError("the backend started for a run that is already finished")

    def close(self) -> None:
        pass


@pytest.mark.parametrize("resume_mode", ["auto", "resume_path"])
def test_rerunning_a_finished_run_is_refused_saying_what_to_do(tmp_path: Path, resume_mode: str) -> None:
    from agentlightning.trainer.loop import RunAlreadyFinished, TrainingLoop

    trainer = {"total_training_steps": 2, "default_local_dir": str(tmp_path / "ckpt"), "logger": []}
    cfg = {"data": {"train_batch_size": 1}, "actor_rollout_ref": {"rollout": {"n": 1}}, "trainer": trainer}
    finished = TrainingLoop(cfg, load_training_config(cfg), SavesOnly(), train_dataset=[{"q": 1}])  # type: ignore[arg-type]
    finished.step = 2
    finished._save()
    trainer.update(resume_mode=resume_mode, resume_from_path=str(step_dir(tmp_path / "ckpt", 2)))
    backend = SavesOnly()
    rerun = TrainingLoop(cfg, load_training_config(cfg), backend, train_dataset=[{"q": 1}])  # type: ignore[arg-type]
    with capture_logs() as logs, pytest.raises(RunAlreadyFinished) as refused:
        rerun.fit()
    assert isinstance(refused.value, ConfigError)  # the command lines exit 2 with the message
    said = str(refused.value)
    assert f"checkpoint {step_dir(tmp_path / 'ckpt', 2)} is at step 2 of the run's 2" in said
    if resume_mode == "auto":
        assert "another trainer.output_dir or trainer.experiment_name, or trainer.resume_mode=disable" in said
    else:
        assert "trainer.resume_from_path at its checkpoint" in said
    assert not backend.started
    assert [(e["event"], e["log_level"]) for e in logs] == [("run_already_finished", "warning")]
    # Starting over is still one key away: resume_mode=disable trains from step 0.
    trainer.update(resume_mode="disable")
    fresh = TrainingLoop(cfg, load_training_config(cfg), SavesOnly(), train_dataset=[{"q": 1}])  # type: ignore[arg-type]
    with pytest.raises(AssertionError, match="backend started"):
        fresh.fit()
