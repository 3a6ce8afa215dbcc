"""One step's rollouts: sync (make a batch, wait for all of it) or async (keep groups in flight).

Async: `async_train_batch_size` prompt groups are kept in flight. Each step tops them up
with new prompts, waits until `train_batch_size` groups are complete (every rollout of the
group finished), hands out the first `train_batch_size` to complete and carries the rest over
— whole groups, with the step that made them, so their age is known. Rollouts of carried
groups keep running through the weight update (the Gateway is paused during it), so some of
their calls are served by an older policy: the rows record each token's model version and the
batch metrics report the staleness.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from agentlightning.trainer.collected import CollectedRollout
from agentlightning.trainer.manager import Group, RolloutManager

# next_samples(k): the next k prompts of the training data (fewer only when it is exhausted)
SampleSource = Callable[[int], Sequence[Any]]


class Collector(Protocol):
    manager: RolloutManager

    def collect(
        self, next_samples: SampleSource, step: int
    ) -> tuple[list[CollectedRollout], dict[str, float]]:
        """The rollouts of `train_batch_size` complete groups, and metrics."""
        ...

    def abandon(self) -> int:
        """Fail and forget what is still in flight (at shutdown)."""
        ...


class SyncCollector:
    def __init__(self, manager: RolloutManager) -> None:
        self.manager = manager

    def collect(
        self, next_samples: SampleSource, step: int
    ) -> tuple[list[CollectedRollout], dict[str, float]]:
        samples = next_samples(self.manager.config.train_batch_size)
        return self.manager.collect(samples, step)

    def abandon(self) -> int:
        return self.manager.abandon()


class AsyncCollector:
    def __init__(self, manager: RolloutManager) -> None:
        self.manager = manager
        self._in_flight: dict[str, Group] = {}  # every submitted group not handed out yet

    @property
    def in_flight(self) -> list[Group]:
        return list(self._in_flight.values())

    def _complete(self) -> list[Group]:
        done = self.manager.is_done
        return [g for g in self._in_flight.values() if all(done(r) for r in g.rollout_ids)]

    def collect(
        self, next_samples: SampleSource, step: int
    ) -> tuple[list[CollectedRollout], dict[str, float]]:
        started = time.perf_counter()
        config = self.manager.config
        n_prev_carry = sum(len(g.rollout_ids) for g in self._in_flight.values())
        n_prev_groups = len(self._in_flight)
        need = config.agl.async_rollout.async_train_batch_size - len(self._in_flight)
        if need > 0:
            samples = next_samples(need)
            if samples:
                for group in self.manager.submit(samples, step):
                    self._in_flight[group.group_id] = group
        target = min(config.train_batch_size, len(self._in_flight))
        self.manager.wait(lambda: len(self._complete()) >= target)
        complete = self._complete()
        seq = self.manager.finish_seq
        complete.sort(key=lambda g: max(seq(r) for r in g.rollout_ids))
        taken = complete[: config.train_batch_size]
        for group in taken:
            del self._in_flight[group.group_id]
        rollouts = self.manager.take(r for g in taken for r in g.rollout_ids)
        carried = list(self._in_flight.values())
        taken_ages = [step - g.step for g in taken]
        metrics: dict[str, float] = {
            "training/async/n_prev_carry_over_rollouts": n_prev_carry,
            "training/async/n_prev_carry_over_groups": n_prev_groups,
            "training/async/n_completed_rollouts": len(rollouts),
            "training/async/n_new_carry_over_rollouts": sum(len(g.rollout_ids) for g in carried),
            "training/async/n_new_carry_over_groups": len(carried),
            "training/async/new_carry_over_age_max_steps": max((step - g.step for g in carried), default=0),
            "training/async/taken_group_age_max_steps": max(taken_ages, default=0),
            "training/async/taken_group_age_mean_steps": sum(taken_ages) / len(taken_ages)
            if taken_ages
            else 0.0,
            "timing/collect_s": time.perf_counter() - started,
        }
        return rollouts, metrics

    def abandon(self) -> int:
        n = self.manager.abandon()
        # Collected rollouts of groups never handed out are dropped too.
        for group in self._in_flight.values():
            for rollout_id in group.rollout_ids:
                if self.manager.is_done(rollout_id):
                    self.manager.take([rollout_id])
        self._in_flight.clear()
        return n


def make_collector(manager: RolloutManager) -> SyncCollector | AsyncCollector:
    """The collector `agentlightning.async_rollout.enabled` asks for."""
    if manager.config.agl.async_rollout.enabled:
        return AsyncCollector(manager)
    return SyncCollector(manager)
