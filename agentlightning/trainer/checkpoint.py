"""Checkpoints of the training loop, in verl's layout, shared by every backend.

    {default_local_dir}/global_step_{N}/loop_state.json       the loop's own state (the core)
    {default_local_dir}/global_step_{N}/...                   the backend's files (weights, optimizer)
    {default_local_dir}/latest_checkpointed_iteration.txt     (holds N)
    {default_local_dir}/best_checkpointed_iteration.txt       (the best validation's N: `trainer.keep_best`)

The loop state is the step, the served model version, the data position, Python's RNG and the
config. A checkpoint is written into a temporary directory — the backend's files first, the
loop state last, as the mark of a complete checkpoint — and renamed into place; the `latest`
file is replaced after it, so a crash while saving leaves the previous checkpoint as the latest.
The newest complete directory is the latest checkpoint, even where a crash left the file behind.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentlightning.log import get_logger

log = get_logger("checkpoint")

LATEST_FILE = "latest_checkpointed_iteration.txt"
BEST_FILE = "best_checkpointed_iteration.txt"
LOOP_STATE_FILE = "loop_state.json"
# The backends' files in a checkpoint folder, by these names on every backend (agl-eval reads them):
POLICY_STATE_FILE = "policy_state.pt"  # the policy's weights (LoRA: the adapter) and optimizer state
ADAPTER_DIR = "adapter"  # LoRA: the adapter in peft's layout
LORA_KEY = ".lora_"  # in the name of every adapter tensor (lora_A, lora_B)
_STEP_DIR = re.compile(r"^global_step_(\d+)$")


def step_dir(root: str | Path, step: int) -> Path:
    return Path(root) / f"global_step_{step}"


def python_rng_state() -> list[Any]:
    """`random.getstate()` in a JSON-able form."""
    version, internal, gauss = random.getstate()
    return [version, list(internal), gauss]


def set_python_rng_state(state: list[Any]) -> None:
    version, internal, gauss = state
    random.setstate((version, tuple(internal), gauss))


def save_checkpoint(
    root: str | Path,
    step: int,
    loop_state: dict[str, Any],
    save_backend: Callable[[Path], None],
    keep: int | None = None,
    protect: int | None = None,
) -> Path:
    """Write the checkpoint of `step`: `save_backend(folder)` writes the backend's files, then the
    loop state is written; keep the newest `keep` checkpoints (None or <= 0: all) and the one of
    step `protect` (the best)."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = step_dir(root, step)
    tmp = root / f".global_step_{step}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    save_backend(tmp)
    state_file = tmp / LOOP_STATE_FILE
    state_file.write_text(json.dumps(loop_state))
    for path in tmp.rglob("*"):
        if path.is_file():
            fsync_file(path)
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    _write_step_file(root, LATEST_FILE, step)
    if keep is not None and keep > 0:
        for old in sorted(list_checkpoints(root))[:-keep]:
            if old != protect:
                shutil.rmtree(step_dir(root, old), ignore_errors=True)
    log.info("checkpoint_saved", step=step, path=str(final))
    return final


def mark_best_checkpoint(root: str | Path, step: int) -> None:
    """Record the checkpoint of `step` as the best (`best_checkpointed_iteration.txt`)."""
    _write_step_file(Path(root), BEST_FILE, step)


def best_checkpoint(root: str | Path) -> Path | None:
    """The directory of the checkpoint marked best, or None (none marked, or it is gone)."""
    file = Path(root) / BEST_FILE
    try:
        folder = step_dir(root, int(file.read_text().strip()))
    except (OSError, ValueError):
        return None
    return folder if (folder / LOOP_STATE_FILE).is_file() else None


def _write_step_file(root: Path, name: str, step: int) -> None:
    tmp = root / f".{name}.tmp"
    tmp.write_text(f"{step}\n")
    fsync_file(tmp)
    tmp.replace(root / name)


def list_checkpoints(root: str | Path) -> list[int]:
    """The steps of the complete checkpoints under `root`, in order."""
    root = Path(root)
    if not root.is_dir():
        return []
    steps = []
    for child in root.iterdir():
        m = _STEP_DIR.match(child.name)
        if m and (child / LOOP_STATE_FILE).is_file():
            steps.append(int(m.group(1)))
    return sorted(steps)


def latest_checkpoint(root: str | Path) -> Path | None:
    """The directory of the newest complete checkpoint under `root`, or None.

    A checkpoint directory is renamed into place complete, and the `latest` file (kept for
    verl's tools) is replaced after it: a crash between the two leaves the file one checkpoint
    behind, so the directories, not the file, say which checkpoint is the latest."""
    steps = list_checkpoints(root)
    return step_dir(root, steps[-1]) if steps else None


def load_loop_state(path: str | Path) -> dict[str, Any]:
    """The loop state saved in a checkpoint directory."""
    file = Path(path) / LOOP_STATE_FILE
    if not file.is_file():
        raise FileNotFoundError(f"no checkpoint at {path} (expected {file})")
    state: dict[str, Any] = json.loads(file.read_text())
    return state


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
