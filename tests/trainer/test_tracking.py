"""Metrics sinks: the JSONL file (rewritten after a resume), TensorBoard, the console."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest

from agentlightning.config.schema import ConfigError
from agentlightning.trainer.config import TrainerConfig
from agentlightning.trainer.tracking import METRICS_FILE, Tracker, read_metrics


def test_jsonl_records_every_step_and_skips_non_finite(tmp_path: Path) -> None:
    tracker = Tracker(["jsonl"], tmp_path, total_steps=2, stream=io.StringIO())
    tracker.log({"val/reward": 0.25}, 0)
    tracker.log({"training/reward": 0.5, "actor/grad_norm": float("nan")}, 1)
    tracker.close()
    records = read_metrics(tmp_path / METRICS_FILE)
    assert [(r["step"], r.get("val/reward"), r.get("training/reward")) for r in records] == [
        (0, 0.25, None),
        (1, None, 0.5),
    ]
    assert "actor/grad_norm" not in records[1]


def test_resume_drops_the_steps_after_the_checkpoint_and_a_torn_line(tmp_path: Path) -> None:
    tracker = Tracker(["jsonl"], tmp_path, total_steps=5, stream=io.StringIO())
    for step in range(4):
        tracker.log({"training/reward": step / 10}, step)
    tracker.close()
    with open(tmp_path / METRICS_FILE, "a") as f:
        f.write('{"step": 4, "training/rew')  # a crash in the middle of a write
    assert [r["step"] for r in read_metrics(tmp_path / METRICS_FILE)] == [0, 1, 2, 3]
    resumed = Tracker(["jsonl"], tmp_path, total_steps=5, first_step=2, stream=io.StringIO())
    resumed.log({"training/reward": 0.9}, 3)
    resumed.close()
    records = read_metrics(tmp_path / METRICS_FILE)
    assert [(r["step"], r["training/reward"]) for r in records] == [(0, 0.0), (1, 0.1), (2, 0.2), (3, 0.9)]


def test_console_prints_validations_and_tensorboard_writes_events(tmp_path: Path) -> None:
    out = io.StringIO()
    tracker = Tracker(["console", "tensorboard"], tmp_path, total_steps=3, stream=out)
    tracker.log({"val/reward": 0.125}, 0)
    tracker.log({"training/reward": 0.5, "timing/step_s": 2.0}, 1)
    tracker.close()
    text = out.getvalue()
    assert "step 0: validation reward 0.125" in text
    assert "reward=0.500" in text and "val=0.125" in text
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert not (tmp_path / METRICS_FILE).exists()


def test_unknown_logger_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"trainer\.logger: unknown logger 'mlflow'"):
        Tracker(["console", "mlflow"], tmp_path, total_steps=1)


def test_the_default_loggers_work_without_torch_and_tqdm(tmp_path: Path) -> None:
    """The core does not install torch or tqdm: with both unimportable, the default `trainer.logger`
    still writes the JSONL file and the console lines, and says why TensorBoard is off."""
    script = f"""
import io, pathlib, sys
sys.modules["torch"] = None  # `import torch` now raises ImportError, as where it is not installed
sys.modules["tqdm"] = None
from agentlightning.trainer.config import TrainerConfig
from agentlightning.trainer.tracking import Tracker
console = io.StringIO()
tracker = Tracker(TrainerConfig().logger, {str(tmp_path)!r}, total_steps=2, stream=console)
tracker.log({{"training/reward": 0.5}}, 1)
tracker.log({{"training/reward": 0.75, "val/reward": 0.25}}, 2)
tracker.close()
pathlib.Path({str(tmp_path / "console.txt")!r}).write_text(console.getvalue())
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert TrainerConfig().logger == ["console", "jsonl", "tensorboard"]
    assert [r["step"] for r in read_metrics(tmp_path / METRICS_FILE)] == [1, 2]
    assert (tmp_path / "console.txt").read_text().splitlines() == [
        "training: step 1/2, reward 0.500",
        "step 2: validation reward 0.250",
        "training: step 2/2, reward 0.750, val 0.250",
    ]
    assert "tensorboard_not_installed" in proc.stdout + proc.stderr
