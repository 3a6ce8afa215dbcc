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
from functools import partial
from typing import Any, Protocol

from agentlightning.trainer.collected import CollectedRollout
from agentlightning.trainer.config import StalePolicy
from agentlightning.trainer.manager import Group, RolloutManager
from agentlightning.trainer.staleness import split_stale_groups

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

    def _has_complete(self, target: int) -> bool:
        return len(self._complete()) >= target

    def collect(
        self, next_samples: SampleSource, step: int
    ) -> tuple[list[CollectedRollout], dict[str, float]]:
        started = time.perf_counter()
        config = self.manager.config
        n_prev_carry = sum(len(g.rollout_ids) for g in self._in_flight.values())
        n_prev_groups = len(self._in_flight)
        wait_fresh = config.agl.max_staleness is not None and config.agl.stale_policy == StalePolicy.WAIT
        taken: list[Group] = []
        rollouts: list[CollectedRollout] = []
        n_stale_groups = n_stale_rollouts = 0
        while len(taken) < config.train_batch_size:
            need = config.agl.async_rollout.async_train_batch_size - len(self._in_flight)
            if need > 0:
                samples = next_samples(need)
                if samples:
                    for group in self.manager.submit(samples, step):
                        self._in_flight[group.group_id] = group
            target = min(config.train_batch_size - len(taken), len(self._in_flight))
            if target <= 0:
                break  # the data are exhausted
            self.manager.wait(partial(self._has_complete, target))
            complete = self._complete()
            seq = self.manager.finish_seq
            complete.sort(key=lambda g: max(seq(r) for r in g.rollout_ids))
            batch = complete[:target]
            for group in batch:
                del self._in_flight[group.group_id]
            got = self.manager.take(r for g in batch for r in g.rollout_ids)
            if wait_fresh:  # stale groups are discarded here and fresher ones awaited instead
                got, stale = split_stale_groups(got, self.manager.policy_version, config.agl.max_staleness)
                stale_ids = {r.group_id for r in stale}
                n_stale_groups += len(stale_ids)
                n_stale_rollouts += len(stale)
                batch = [g for g in batch if g.group_id not in stale_ids]
            taken += batch
            rollouts += got
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
        if wait_fresh:
            metrics["training/staleness/n_groups_discarded_waiting"] = n_stale_groups
            metrics["training/staleness/n_rollouts_discarded_waiting"] = n_stale_rollouts
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
