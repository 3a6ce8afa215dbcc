"""From collected rollouts to a shaped training batch: the core's algorithm, in one place.

1. Failure policy: `drop` (default) leaves failed rollouts out, counted; `train` keeps them
   with their reward or the fill value (v1.0's behaviour).
2. Reward: the last `reward` event's value in float32; none -> `reward_fillna_value`.
3. Aggregation into rows (`trajectory` or `transition`), with limits, drops and truncation.
4. Advantage: one scalar per rollout over its group. The group is the prompt's accepted
   rollouts that made at least one usable model call (rows later dropped for a too-long prompt
   still count: the rollout was a real sample of the policy).
5. Shaping: drop whole groups to fill whole mini-batches within `max_ppo_update_times`.

Splitting into mini-batches with per-rollout loss weights is the backend's call to
`TrainingBatch.minibatches()`.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from agentlightning.trainer.advantage import assign_advantages, rollout_advantages
from agentlightning.trainer.aggregation import AggregationStats, RowLimits, aggregate_calls, usable_calls
from agentlightning.trainer.collected import CollectedRollout
from agentlightning.trainer.config import CoreConfig, FailedRolloutPolicy
from agentlightning.trainer.gcpause import gc_paused
from agentlightning.trainer.metrics import (
    aggregation_metrics,
    row_metrics,
    shaping_metrics,
    staleness_metrics,
)
from agentlightning.trainer.rewards import last_reward
from agentlightning.trainer.rows import TrainingRow
from agentlightning.trainer.shaping import shape_batch, split_minibatches


def step_rng(seed: int, step: int, purpose: int = 0) -> random.Random:
    """A generator fixed by (seed, step, purpose): the same run makes the same choices."""
    return random.Random((seed * 1_000_003 + step) * 101 + purpose)


@dataclass
class TrainingBatch:
    rows: list[TrainingRow]
    metrics: dict[str, float] = field(default_factory=dict)
    groups_per_minibatch: int = 1
    seed: int = 0
    step: int = 0

    @property
    def empty(self) -> bool:
        return not self.rows

    def minibatches(self, shuffle: bool = True) -> list[list[TrainingRow]]:
        """PPO mini-batches of whole groups, loss weights set; shuffled with the step's generator."""
        return split_minibatches(
            self.rows, self.groups_per_minibatch, shuffle=shuffle, rng=step_rng(self.seed, self.step, 2)
        )


def build_training_batch(
    rollouts: Iterable[CollectedRollout],
    config: CoreConfig,
    step: int = 0,
    policy_version: int | None = None,
) -> TrainingBatch:
    """Rows, advantages and shaping for one step's collected train rollouts."""
    with gc_paused():
        return _build(rollouts, config, step, policy_version)


def _build(
    rollouts: Iterable[CollectedRollout], config: CoreConfig, step: int, policy_version: int | None
) -> TrainingBatch:
    started = time.perf_counter()
    agl = config.agl
    ordered = sorted(
        (r for r in rollouts if r.is_train),
        key=lambda r: (r.step, r.sample_idx, r.group_id, r.index_in_group),
    )
    n_failed = sum(1 for r in ordered if r.failed)
    n_lost = sum(1 for r in ordered if r.lost)
    if agl.failed_rollouts == FailedRolloutPolicy.DROP:
        accepted = [r for r in ordered if not r.failed]
    else:
        accepted = list(ordered)

    limits = RowLimits(config.prompt_limit, config.response_limit)
    level = agl.trace_aggregator.level
    stats = AggregationStats()
    rows: list[TrainingRow] = []
    members: list[tuple[str, str, float]] = []
    rewards: list[float] = []
    n_with_reward = 0
    for rollout in accepted:
        reward = last_reward(rollout.events)
        if reward is not None:
            n_with_reward += 1
        else:
            reward = agl.reward_fillna_value
        rewards.append(reward)
        calls = usable_calls(rollout.events, stats)
        if calls:
            members.append((rollout.rollout_id, rollout.group_id, reward))
        rows.extend(
            aggregate_calls(calls, rollout.rollout_id, rollout.group_id, reward, level, limits, stats)
        )

    advantages = rollout_advantages(
        members, config.adv_estimator, config.norm_adv_by_std_in_grpo, agl.adv_epsilon
    )
    assign_advantages(rows, advantages)
    shaped, shape_stats = shape_batch(
        rows,
        config.ppo_mini_batch_size,
        agl.max_ppo_update_times,
        rng=step_rng(agl.seed, step, 1),
        keep_partial=agl.keep_partial_minibatch,
    )

    metrics: dict[str, float] = {
        "training/reward": sum(rewards) / len(rewards) if rewards else 0.0,
        "training/n_rollouts": len(ordered),
        "training/n_rollouts_failed": n_failed,
        "training/n_rollouts_lost": n_lost,
        "training/n_rollouts_dropped_failed": len(ordered) - len(accepted),
        "training/n_rollouts_w_reward": n_with_reward,
        "training/n_rollouts_w_trace": len(members),
    }
    metrics.update(aggregation_metrics(stats))
    metrics.update(shaping_metrics(shape_stats))
    metrics.update(row_metrics(shaped))
    if policy_version is not None:
        metrics.update(staleness_metrics(shaped, policy_version))
    metrics["timing/build_batch_s"] = time.perf_counter() - started
    return TrainingBatch(shaped, metrics, config.ppo_mini_batch_size, agl.seed, step)
