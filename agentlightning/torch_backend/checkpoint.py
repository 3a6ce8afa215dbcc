"""Checkpoints of the torch backend, in verl's layout.

    {default_local_dir}/global_step_{N}/trainer_state.pt
    {default_local_dir}/latest_checkpointed_iteration.txt     (holds N)

`trainer_state.pt` holds the policy's weights, the AdamW and learning-rate scheduler state, the
step, the served model version, the data position and the RNG states. A checkpoint is written
into a temporary directory and renamed into place, and the `latest` file is replaced after it,
so a crash while saving leaves the previous checkpoint as the latest.
"""

from __future__ import annotations

import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

import torch

from agentlightning.log import get_logger

log = get_logger("checkpoint")

LATEST_FILE = "latest_checkpointed_iteration.txt"
STATE_FILE = "trainer_state.pt"
_STEP_DIR = re.compile(r"^global_step_(\d+)$")


def step_dir(root: str | Path, step: int) -> Path:
    return Path(root) / f"global_step_{step}"


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(root: str | Path, step: int, state: dict[str, Any], keep: int | None = None) -> Path:
    """Write `state` as the checkpoint of `step`; keep the newest `keep` (None or <= 0: all)."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = step_dir(root, step)
    tmp = root / f".global_step_{step}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    torch.save(state, tmp / STATE_FILE)
    _fsync_file(tmp / STATE_FILE)
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    latest_tmp = root / f".{LATEST_FILE}.tmp"
    latest_tmp.write_text(f"{step}\n")
    _fsync_file(latest_tmp)
    latest_tmp.replace(root / LATEST_FILE)
    if keep is not None and keep > 0:
        for old in sorted(list_checkpoints(root))[:-keep]:
            shutil.rmtree(step_dir(root, old), ignore_errors=True)
    log.info("checkpoint_saved", step=step, path=str(final))
    return final


def list_checkpoints(root: str | Path) -> list[int]:
    root = Path(root)
    if not root.is_dir():
        return []
    steps = []
    for child in root.iterdir():
        m = _STEP_DIR.match(child.name)
        if m and (child / STATE_FILE).is_file():
            steps.append(int(m.group(1)))
    return sorted(steps)


def latest_checkpoint(root: str | Path) -> Path | None:
    """The directory of the latest complete checkpoint under `root`, or None."""
    root = Path(root)
    try:
        step = int((root / LATEST_FILE).read_text().strip())
    except (OSError, ValueError):
        steps = list_checkpoints(root)  # no (or a torn) latest file: the newest complete one
        return step_dir(root, steps[-1]) if steps else None
    path = step_dir(root, step)
    return path if (path / STATE_FILE).is_file() else None


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """The state saved in a checkpoint directory (or its `trainer_state.pt`)."""
    path = Path(path)
    file = path / STATE_FILE if path.is_dir() else path
    if not file.is_file():
        raise FileNotFoundError(f"no checkpoint at {path} (expected {file})")
    return torch.load(file, map_location="cpu", weights_only=False)


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
