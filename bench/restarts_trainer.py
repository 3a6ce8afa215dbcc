"""The trainer of bench/restarts.py's trainer phase: `agl-train` itself (the torch backend, the
same command line), run as `python -m bench.restarts_trainer ARGS`.

With `AGL_BENCH_KILL_IN_UPDATE=K` it SIGKILLs itself in step K's policy update: after the
optimizer step, before the new weights are published or saved — the in-memory policy is a step
ahead of every checkpoint. An outside observer cannot hit that point reliably (the tiny model's
update takes milliseconds), so the trainer does it to itself; it is still a SIGKILL, with no
clean-up of any kind.
"""

from __future__ import annotations

import os
import signal
from typing import Any

from agentlightning.torch_backend import trainer as torch_trainer
from agentlightning.torch_backend.cli import main

KILL_IN_UPDATE = "AGL_BENCH_KILL_IN_UPDATE"


def kill_in_update(step: int) -> None:
    update = torch_trainer.TorchBackend.update

    def update_then_die(self: torch_trainer.TorchBackend, batch: Any) -> dict[str, float]:
        metrics = update(self, batch)
        if batch.step == step:
            os.kill(os.getpid(), signal.SIGKILL)
        return metrics

    torch_trainer.TorchBackend.update = update_then_die  # type: ignore[method-assign]


if __name__ == "__main__":
    if os.environ.get(KILL_IN_UPDATE):
        kill_in_update(int(os.environ[KILL_IN_UPDATE]))
    main()
