"""The trainer of bench/restarts.py's trainer phase: `agl-train` itself (the torch backend, the
same command line), run as `python -m bench.restarts_trainer ARGS`.

With `AGL_BENCH_KILL_IN_UPDATE=K` it SIGKILLs itself in step K's policy update: after the
optimizer step, before the new weights are published or saved — the in-memory policy is a step
ahead of every checkpoint. With `AGL_BENCH_KILL_IN_SAVE=K` it SIGKILLs itself while writing step
K's checkpoint: after the backend's files (weights, optimizer), before the loop state that marks
the checkpoint complete. An outside observer cannot hit those points reliably (the tiny model's
update and save take milliseconds), so the trainer does it to itself; it is still a SIGKILL,
with no clean-up of any kind.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

from agentlightning.torch_backend import trainer as torch_trainer
from agentlightning.torch_backend.cli import main

KILL_IN_UPDATE = "AGL_BENCH_KILL_IN_UPDATE"
KILL_IN_SAVE = "AGL_BENCH_KILL_IN_SAVE"
_STEP_DIR = ".global_step_"  # the temporary folder a checkpoint is written into (trainer/checkpoint.py)


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def kill_in_update(step: int) -> None:
    update = torch_trainer.TorchBackend.update

    def update_then_die(self: torch_trainer.TorchBackend, batch: Any) -> dict[str, float]:
        metrics = update(self, batch)
        if batch.step == step:
            die()
        return metrics

    torch_trainer.TorchBackend.update = update_then_die  # type: ignore[method-assign]


def kill_in_save(step: int) -> None:
    save = torch_trainer.TorchBackend.save

    def save_then_die(self: torch_trainer.TorchBackend, folder: Path) -> None:
        save(self, folder)
        if folder.name == f"{_STEP_DIR}{step}.tmp":
            die()

    torch_trainer.TorchBackend.save = save_then_die  # type: ignore[method-assign]


if __name__ == "__main__":
    if os.environ.get(KILL_IN_UPDATE):
        kill_in_update(int(os.environ[KILL_IN_UPDATE]))
    if os.environ.get(KILL_IN_SAVE):
        kill_in_save(int(os.environ[KILL_IN_SAVE]))
    main()
