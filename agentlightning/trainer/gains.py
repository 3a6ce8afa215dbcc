"""Keeping what training gained: the best validation so far, and a guard against a collapse.

RL on a small policy can gain and then lose it (examples/swe: greedy validation 0.40 → 0.60 after
3 steps, 0.00 by step 9). The loop asks `GainKeeper` after each validation:

    new best    the loop saves a checkpoint and marks it best (`best_checkpointed_iteration.txt`);
                rotation (`max_actor_ckpt_to_keep`) never deletes it
    holding     nothing to do
    collapsed   the metric stayed more than `margin` below the best for `patience` validations
                in a row: `rollback` (the backend reloads the best checkpoint, its learning rate
                times `lr_scale`, and training goes on; at most `max_rollbacks` times, then stop)
                or `stop` (the run ends; the best checkpoint is what it kept)

The keeper's state is part of the loop state, so a resumed run keeps its best and its count.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any

from agentlightning.trainer.config import CollapseGuardConfig


class Verdict(StrEnum):
    NEW_BEST = "new_best"
    HOLDING = "holding"
    ROLL_BACK = "roll_back"
    STOP = "stop"


@dataclass
class GainsState:
    best_value: float | None = None
    best_step: int | None = None
    below: int = 0  # validations in a row more than `margin` below the best
    rollbacks: int = 0
    lr_scale: float = 1.0  # the product of the rollbacks' `lr_scale`


class GainKeeper:
    def __init__(self, guard: CollapseGuardConfig, state: dict[str, Any] | None = None) -> None:
        self.guard = guard
        self.state = GainsState(**state) if state else GainsState()

    def observe(self, step: int, value: float) -> Verdict:
        """The verdict on validation `value` at `step` (higher is better)."""
        s = self.state
        if s.best_value is None or value > s.best_value:
            s.best_value, s.best_step, s.below = value, step, 0
            return Verdict.NEW_BEST
        if not self.guard.enable or value >= s.best_value - self.guard.margin:
            s.below = 0
            return Verdict.HOLDING
        s.below += 1
        if s.below < self.guard.patience:
            return Verdict.HOLDING
        s.below = 0
        if self.guard.action == "rollback" and s.rollbacks < self.guard.max_rollbacks:
            s.rollbacks += 1
            s.lr_scale *= self.guard.lr_scale
            return Verdict.ROLL_BACK
        return Verdict.STOP

    def state_dict(self) -> dict[str, Any]:
        return asdict(self.state)
