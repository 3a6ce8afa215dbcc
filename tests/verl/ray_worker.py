"""A verl `Worker` for the Ray test: runs verl's real `ppo_loss` with our loss inside a Ray worker
process, which only works if the runtime env's setup hook registered `per_rollout_mean` there."""

from __future__ import annotations

import os
from typing import Any

from verl.single_controller.base import Worker
from verl.single_controller.base.decorator import Dispatch, register


class LossProbe(Worker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def registered_losses(self) -> dict[str, Any]:
        from verl.trainer.ppo import core_algos

        fn = core_algos.POLICY_LOSS_REGISTRY.get("per_rollout_mean")
        return {
            "pid": os.getpid(),
            "rank": self.rank,
            "world_size": self.world_size,
            "loss": None if fn is None else f"{fn.__module__}.{fn.__qualname__}",
        }
