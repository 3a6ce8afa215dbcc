"""Metrics of a training batch. Names follow v1.0 where it had one (`training/reward`,
`training/n_sample_dropped/…`, `training/n_truncated_sample`, `training/async/…`); the rest
are ours (staleness, failed and lost rollouts, merge mismatches, skipped calls)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from itertools import compress

from agentlightning.aggregation import AggregationStats
from agentlightning.rewards import last_reward
from agentlightning.rows import TrainingRow
from agentlightning.schemas import EVENT_MODEL_REQUEST
from agentlightning.trainer.collected import CollectedRollout
from agentlightning.trainer.shaping import ShapeStats, group_rows


def summary(prefix: str, values: Sequence[float]) -> dict[str, float]:
    """`{prefix}/mean`, `/min`, `/max` of the values; nothing for no values."""
    if not values:
        return {}
    return {
        f"{prefix}/mean": sum(values) / len(values),
        f"{prefix}/min": float(min(values)),
        f"{prefix}/max": float(max(values)),
    }


def aggregation_metrics(stats: AggregationStats) -> dict[str, float]:
    return {
        "training/n_sample_collected": stats.n_rows,
        "training/n_sample_dropped/marked": stats.n_dropped_prompt_too_long,
        "training/n_truncated_sample": stats.n_truncated,
        "training/n_skipped_empty_rows": stats.n_skipped_empty,
        "training/n_turns": stats.n_calls,
        "training/n_calls_error": stats.n_calls_error,
        "training/n_calls_no_tokens": stats.n_calls_no_tokens,
        "training/n_calls_no_log_probs": stats.n_calls_no_log_probs,
        "training/n_trace_merge_mismatch": stats.n_merge_mismatch,
        "training/n_unmerged_rollouts": stats.n_unmerged_rollouts,
        "training/n_rollouts_no_calls": stats.n_rollouts_no_calls,
    }


def shaping_metrics(stats: ShapeStats) -> dict[str, float]:
    return {
        "training/n_sample_dropped/same_reward": stats.n_rows_dropped_same_reward,
        "training/n_sample_dropped/random": stats.n_rows_dropped_random,
        "training/n_groups_dropped/same_reward": stats.n_groups_dropped_same_reward,
        "training/n_groups_dropped/random": stats.n_groups_dropped_random,
        "training/n_minibatches": stats.n_minibatches,
    }


def row_metrics(rows: Sequence[TrainingRow]) -> dict[str, float]:
    """Sizes and advantages of the rows that will be trained on."""
    groups = group_rows(rows)
    n_trainable = sum(r.n_trainable for r in rows)
    n_tokens = sum(len(r.response_ids) for r in rows)
    per_rollout: dict[str, float] = {}
    for row in rows:
        per_rollout[row.rollout_id] = row.advantage
    out: dict[str, float] = {
        "training/n_sample_trained": len(rows),
        "training/n_rollouts_trained": len(per_rollout),
        "training/n_groups": len(groups),
        "training/n_zero_adv_groups": sum(
            1 for members in groups.values() if all(r.advantage == 0.0 for r in members)
        ),
        "training/n_trainable_tokens": n_trainable,
        "training/n_context_tokens": n_tokens - n_trainable,
    }
    out.update(summary("training/advantage", list(per_rollout.values())))
    out.update(summary("training/prompt_length", [len(r.prompt_ids) for r in rows]))
    out.update(summary("training/response_length", [len(r.response_ids) for r in rows]))
    return out


def staleness_metrics(rows: Sequence[TrainingRow], policy_version: int) -> dict[str, float]:
    """Policy-version lag of the trainable tokens: how many updates old the policy that made them is.

    Tokens whose version is unknown (a call recorded without one) are counted, not measured.
    """
    versions: Counter[int] = Counter()
    for row in rows:
        versions.update(compress(row.model_versions, row.response_mask))  # C loops: ~1M tokens/step
    n_unknown = sum(n for v, n in versions.items() if v < 0)
    known = {v: n for v, n in versions.items() if v >= 0}
    n_known = sum(known.values())
    total = sum((policy_version - v) * n for v, n in known.items())
    n_stale = sum(n for v, n in known.items() if policy_version - v > 0)
    max_lag = max((policy_version - v for v in known), default=0)
    out: dict[str, float] = {
        "training/policy_version": policy_version,
        "training/staleness/unknown_version_tokens": n_unknown,
    }
    if n_known:
        out["training/staleness/mean"] = total / n_known
        out["training/staleness/max"] = max(max_lag, 0)
        out["training/staleness/frac_stale_tokens"] = n_stale / n_known
    return out


def validation_metrics(
    rollouts: Sequence[CollectedRollout], reward_fillna_value: float = 0.0
) -> dict[str, float]:
    """`val/…` metrics of validation rollouts; a rollout without a reward (or failed) counts as
    `reward_fillna_value`."""
    rewards: list[float] = []
    n_with_reward = 0
    n_calls: list[int] = []
    for rollout in rollouts:
        reward = last_reward(rollout.events)
        if reward is not None:
            n_with_reward += 1
        rewards.append(reward if reward is not None else reward_fillna_value)
        n_calls.append(sum(1 for e in rollout.events if e.get("event_type") == EVENT_MODEL_REQUEST))
    return {
        "val/reward": sum(rewards) / len(rewards) if rewards else 0.0,
        "val/n_rollouts": len(rollouts),
        "val/n_rollouts_w_reward": n_with_reward,
        "val/n_rollouts_failed": sum(1 for r in rollouts if r.failed),
        "val/turn_count": sum(n_calls) / len(n_calls) if n_calls else 0.0,
    }
