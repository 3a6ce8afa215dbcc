"""From collected rollouts to a shaped training batch: the core's algorithm, in one place.

1. Outcome policy (trainer/outcomes.py): infrastructure failures are left out, whatever their
   reward; an agent's own failure as `failed_rollouts` says (`drop`, the default, or `train`
   with its reward or the fill value, v1.0's behaviour) unless `outcomes.agent_error` says
   otherwise; groups left too thin are dropped whole. Counted per outcome.
2. Reward: the last `reward` event's value in float32; none -> `reward_fillna_value`.
3. Aggregation into rows (`trajectory` or `transition`), with limits, drops and truncation.
4. Advantage: one scalar per rollout over its group. The group is the prompt's accepted
   rollouts that made at least one usable model call (rows later dropped for a too-long prompt
   still count: the rollout was a real sample of the policy).
5. Shaping: drop whole groups to fill whole mini-batches within `max_ppo_update_times`.

`collect_training_batch` is a step's collection and build: with DAPO's dynamic sampling it
collects more batches while too few groups carry signal, and it says once, for the batch the
step trains on, what was left out.

Splitting into mini-batches with per-rollout loss weights is the backend's call to
`TrainingBatch.minibatches()`.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from agentlightning.aggregation import (
    AggregationLevel,
    AggregationStats,
    RowLimits,
    aggregate_calls,
    usable_calls,
)
from agentlightning.log import get_logger
from agentlightning.rewards import call_rewards, last_reward
from agentlightning.rows import TrainingRow
from agentlightning.trainer.advantage import (
    assign_advantages,
    rollout_advantages,
    step_advantages,
    step_returns,
)
from agentlightning.trainer.collected import CollectedRollout
from agentlightning.trainer.config import AdvantageMode, CoreConfig
from agentlightning.trainer.gcpause import gc_paused
from agentlightning.trainer.metrics import (
    aggregation_metrics,
    row_metrics,
    shaping_metrics,
    staleness_metrics,
)
from agentlightning.trainer.outcomes import parse_outcome_policy, select_by_outcome
from agentlightning.trainer.shaping import group_rows, shape_batch, split_minibatches
from agentlightning.trainer.staleness import split_stale_groups

log = get_logger("training_batch")


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
    loss_agg_mode: str = "seq-mean-token-mean"
    loss_length: int | None = None  # L of seq-mean-token-sum-norm

    @property
    def empty(self) -> bool:
        return not self.rows

    def minibatches(self, shuffle: bool = True) -> list[list[TrainingRow]]:
        """PPO mini-batches of whole groups, loss weights set; shuffled with the step's generator."""
        return split_minibatches(
            self.rows,
            self.groups_per_minibatch,
            shuffle=shuffle,
            rng=step_rng(self.seed, self.step, 2),
            mode=self.loss_agg_mode,
            length=self.loss_length,
        )


def build_training_batch(
    rollouts: Iterable[CollectedRollout],
    config: CoreConfig,
    step: int = 0,
    policy_version: int | None = None,
) -> TrainingBatch:
    """Rows, advantages and shaping for one step's collected train rollouts (says nothing: the
    step's one line is `collect_training_batch`'s, or the caller's `say_what_was_left_out`)."""
    with gc_paused():
        return _build(rollouts, config, step, policy_version)


Collect = Callable[[], tuple[list[CollectedRollout], dict[str, float]]]


def collect_training_batch(
    first: list[CollectedRollout],
    collect: Collect,
    config: CoreConfig,
    step: int,
    metrics: dict[str, float],
    policy_version: int | None = None,
) -> TrainingBatch:
    """The step's batch from its `first` collected rollouts. With DAPO's dynamic sampling
    (`algorithm.filter_groups.enable`), while all-equal groups were filtered out and fewer than
    `data.train_batch_size` groups are left, `collect()` another batch (at most
    `max_num_gen_batches` in all; 0: no limit) and build again from everything collected.
    `metrics` (the collection's) gets the collect time of the extra batches and
    `training/n_generated_batches`. What the step leaves out is said once, for the final batch:
    the builds in between are not the step's batch."""
    rollouts = list(first)
    batch = build_training_batch(rollouts, config, step, policy_version)
    n_batches = 1
    while config.filter_groups and batch.metrics.get("training/n_groups", 0) < config.train_batch_size:
        if config.filter_groups_max_batches and n_batches >= config.filter_groups_max_batches:
            log.warning("filter_groups_batch_not_full", step=step, generated_batches=n_batches)
            break
        more, more_metrics = collect()
        if not more:
            break
        n_batches += 1
        metrics["timing/collect_s"] = metrics.get("timing/collect_s", 0.0) + more_metrics.get(
            "timing/collect_s", 0.0
        )
        rollouts.extend(more)
        batch = build_training_batch(rollouts, config, step, policy_version)
    metrics["training/n_generated_batches"] = n_batches
    say_what_was_left_out(step, batch.metrics)
    return batch


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
    # By outcome (trainer/outcomes.py): infrastructure failures and what the policy drops go here,
    # before any reward or advantage is computed.
    selection = select_by_outcome(ordered, parse_outcome_policy(agl.outcomes, agl.failed_rollouts))
    accepted = selection.kept
    kept = {r.rollout_id for r in accepted}
    stale: list[CollectedRollout] = []
    if policy_version is not None:
        accepted, stale = split_stale_groups(accepted, policy_version, agl.max_staleness)

    limits = RowLimits(config.prompt_limit, config.response_limit)
    level = agl.trace_aggregator.level
    stats = AggregationStats()
    rows: list[TrainingRow] = []
    members: list[tuple[str, str, float]] = []
    rewards: list[float] = []
    n_with_reward = 0
    step_mode = agl.advantage_mode == AdvantageMode.STEP
    step_members: list[tuple[str, str, list[float]]] = []
    n_call_rewards = n_call_rewards_unmatched = 0
    for rollout in accepted:
        reward = last_reward(rollout.events)
        if reward is not None:
            n_with_reward += 1
        set_reward = selection.rewards.get(rollout.rollout_id)
        if set_reward is not None:
            reward = set_reward
        elif reward is None:
            reward = agl.reward_fillna_value
        rewards.append(reward)
        calls = usable_calls(rollout.events, stats)
        if calls:
            members.append((rollout.rollout_id, rollout.group_id, reward))
        rollout_rows = aggregate_calls(
            calls, rollout.rollout_id, rollout.group_id, reward, AggregationLevel(level), limits, stats
        )
        per_call = call_rewards(rollout.events)
        usable = [per_call.get(c.index, 0.0) for c in calls]
        if per_call:
            n_call_rewards += len(per_call)
            n_call_rewards_unmatched += len(set(per_call) - {c.index for c in calls})
            for row in rollout_rows:  # kept per row (and segment): the rewards of its calls
                row.call_rewards = usable[row.turn_index : row.turn_index + row.n_calls]
        if step_mode and calls:
            step_members.append(
                (rollout.rollout_id, rollout.group_id, step_returns(usable, reward, config.gamma))
            )
        rows.extend(rollout_rows)

    if step_mode:
        by_step = step_advantages(step_members, config.norm_adv_by_std_in_grpo, agl.adv_epsilon)
        for row in rows:  # transition rows: one call each
            row.advantage = by_step[(row.rollout_id, row.turn_index)]
    else:
        advantages = rollout_advantages(
            members, config.adv_estimator, config.norm_adv_by_std_in_grpo, agl.adv_epsilon
        )
        assign_advantages(rows, advantages)
    n_filtered_groups = n_filtered_rows = n_surplus_groups = 0
    if config.filter_groups:  # DAPO's dynamic sampling: all-equal groups carry no signal
        no_signal = {g for g, members in group_rows(rows).items() if len({r.reward for r in members}) == 1}
        n_filtered_groups = len(no_signal)
        n_filtered_rows = sum(1 for r in rows if r.group_id in no_signal)
        rows = [r for r in rows if r.group_id not in no_signal]
        # Topped-up batches may hold more signal groups than a step trains on: the first ones.
        signal_groups = list(group_rows(rows))
        keep = set(signal_groups[: config.train_batch_size])
        n_surplus_groups = len(signal_groups) - len(keep)
        rows = [r for r in rows if r.group_id in keep]
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
        "training/n_rollouts_dropped_failed": sum(
            1 for r in ordered if r.failed and r.rollout_id not in kept
        ),
        "training/n_rollouts_dropped_outcome": len(ordered) - len(accepted),
        "training/n_rollouts_w_reward": n_with_reward,
        "training/n_rollouts_w_trace": len(members),
        "training/staleness/n_rollouts_dropped": len(stale),
        "training/staleness/n_groups_dropped": len({r.group_id for r in stale}),
        "training/n_groups_filtered/same_reward": n_filtered_groups,
        "training/n_sample_filtered/same_reward": n_filtered_rows,
        "training/n_groups_filtered/surplus": n_surplus_groups,
        "training/n_call_rewards": n_call_rewards,
        "training/n_call_rewards_unmatched": n_call_rewards_unmatched,
    }
    metrics.update(selection.metrics)
    metrics.update(aggregation_metrics(stats))
    metrics.update(shaping_metrics(shape_stats))
    metrics.update(row_metrics(shaped))
    if policy_version is not None:
        metrics.update(staleness_metrics(shaped, policy_version))
    metrics["timing/build_batch_s"] = time.perf_counter() - started
    length = config.loss_scale_factor or config.max_response_length
    return TrainingBatch(
        shaped, metrics, config.ppo_mini_batch_size, agl.seed, step, config.loss_agg_mode.value, length
    )


# Counters said in the step's one `batch_left_out` line when not zero: nothing is skipped quietly.
_LEFT_OUT = {
    "training/n_zero_adv_groups": "groups_all_equal_trained_with_zero_advantage",
    "training/n_groups_dropped/same_reward": "groups_all_equal_dropped_by_shaping",
    "training/n_groups_filtered/same_reward": "groups_all_equal_filtered",
    "training/n_groups_filtered/surplus": "groups_beyond_train_batch_size_after_top_up",
    "training/n_calls_no_log_probs": "calls_without_log_probs",
    "training/n_calls_error": "calls_failed",
    "training/n_calls_no_tokens": "calls_without_tokens",
    "training/n_rollouts_dropped_failed": "rollouts_failed_dropped",
    "training/n_rollouts_dropped_infrastructure": "rollouts_infrastructure_failed_dropped",
    "training/n_groups_dropped/too_few_valid": "groups_too_few_valid_dropped",
    "training/staleness/n_groups_dropped": "groups_too_stale_dropped",
    "training/n_sample_dropped/marked": "rows_prompt_too_long",
    "training/n_call_rewards_unmatched": "call_rewards_naming_no_trainable_call",
}


def say_what_was_left_out(step: int, metrics: dict[str, float], **context: str) -> None:
    """The step's one line (per policy, named in `context`, when a run has several):
    `batch_empty_nothing_to_train` (a warning: no update, nothing published) when no row is
    trained, else `batch_left_out` with every non-zero count, if any."""
    said = {name: int(metrics[key]) for key, name in _LEFT_OUT.items() if metrics.get(key)}
    if metrics.get("training/n_sample_trained", 0) == 0:
        log.warning("batch_empty_nothing_to_train", step=step, **context, **said)
    elif said:
        log.info("batch_left_out", step=step, **context, **said)
