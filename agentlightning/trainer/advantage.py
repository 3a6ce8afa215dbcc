"""Rollout-level advantages: one scalar per rollout, from the rewards of its group.

The group is the set of rollouts made from the same prompt that take part in training. The
estimate is computed once per rollout and then broadcast to every trainable token of every
row of that rollout, so a rollout that made many rows still casts one vote.

* `grpo`: `(r - mean) / (std + eps)` with the unbiased sample std (as verl), or `r - mean`
  when `norm_by_std` is off.
* `rloo`: `r - mean(other rewards of the group)`.
* `mean`: `r - mean`.
* `reinforce_plus_plus` (REINFORCE++, Hu 2025, arXiv:2501.03262; verl's name): no group
  baseline, the rewards are whitened over the whole batch: `(r - mean_B) / (std_B + eps)`.
  (verl whitens over tokens; here over rollouts, so a long rollout casts one vote.)
* `reinforce_plus_plus_baseline`: `r - mean` within the group, then whitened over the batch.

A group with a single rollout has no baseline: its advantage is 0, never its raw reward. For
the group estimators a group whose rewards are all equal gets exactly 0.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

from agentlightning.rows import TrainingRow
from agentlightning.trainer.config import AdvEstimator


def group_advantages(
    rewards: Sequence[float],
    estimator: AdvEstimator = AdvEstimator.GRPO,
    norm_by_std: bool = True,
    eps: float = 1e-6,
) -> list[float]:
    """The advantage of each reward of one group, in order."""
    n = len(rewards)
    if n <= 1 or all(r == rewards[0] for r in rewards):
        return [0.0] * n  # no baseline, or no signal: exactly zero, not rounding noise
    mean = math.fsum(rewards) / n
    centred = [r - mean for r in rewards]
    if estimator == AdvEstimator.RLOO:
        # r - (sum - r)/(n-1) == n/(n-1) * (r - mean)
        return [c * n / (n - 1) for c in centred]
    if estimator == AdvEstimator.GRPO and norm_by_std:
        std = math.sqrt(math.fsum(c * c for c in centred) / (n - 1))
        return [c / (std + eps) for c in centred]
    return centred


def whiten(values: Sequence[float], eps: float = 1e-6) -> list[float]:
    """`(v - mean) / (std + eps)` over all values (sample std); all equal or fewer than 2: zeros."""
    n = len(values)
    if n <= 1 or all(v == values[0] for v in values):
        return [0.0] * n
    mean = math.fsum(values) / n
    std = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1))
    return [(v - mean) / (std + eps) for v in values]


def rollout_advantages(
    members: Iterable[tuple[str, str, float]],
    estimator: AdvEstimator = AdvEstimator.GRPO,
    norm_by_std: bool = True,
    eps: float = 1e-6,
) -> dict[str, float]:
    """`rollout_id -> advantage` for `(rollout_id, group_id, reward)` triples, grouped by group_id."""
    groups: dict[str, list[tuple[str, float]]] = {}
    seen: set[str] = set()
    for rollout_id, group_id, reward in members:
        if rollout_id in seen:
            raise ValueError(f"rollout {rollout_id} appears twice among the advantage members")
        seen.add(rollout_id)
        groups.setdefault(group_id, []).append((rollout_id, reward))
    out: dict[str, float] = {}
    if estimator in (AdvEstimator.REINFORCE_PLUS_PLUS, AdvEstimator.REINFORCE_PLUS_PLUS_BASELINE):
        ids: list[str] = []
        values: list[float] = []
        for group in groups.values():
            rewards = [r for _, r in group]
            if estimator == AdvEstimator.REINFORCE_PLUS_PLUS_BASELINE:
                rewards = group_advantages(rewards, AdvEstimator.MEAN)
            ids += [rollout_id for rollout_id, _ in group]
            values += rewards
        return dict(zip(ids, whiten(values, eps), strict=True))
    for group in groups.values():
        advs = group_advantages([r for _, r in group], estimator, norm_by_std, eps)
        for (rollout_id, _), adv in zip(group, advs, strict=True):
            out[rollout_id] = adv
    return out


def assign_advantages(rows: Iterable[TrainingRow], advantages: Mapping[str, float]) -> None:
    """Broadcast each rollout's advantage to all of its rows."""
    for row in rows:
        row.advantage = advantages[row.rollout_id]


# --- step advantages (agentlightning.advantage_mode: step) ----------------------------------


def step_returns(rewards: Sequence[float], outcome: float, gamma: float = 1.0) -> list[float]:
    """Per-call discounted returns `G_k = Σ_{j≥k} γ^(j−k) r̃_j`, with r̃_j the reward of call j
    plus, on the last call, the rollout's outcome reward."""
    out = [0.0] * len(rewards)
    running = 0.0
    for k in range(len(rewards) - 1, -1, -1):
        r = rewards[k] + (outcome if k == len(rewards) - 1 else 0.0)
        running = r + gamma * running
        out[k] = running
    return out


def step_advantages(
    members: Iterable[tuple[str, str, Sequence[float]]],
    norm_by_std: bool = True,
    eps: float = 1e-6,
) -> dict[tuple[str, int], float]:
    """`(rollout_id, k) -> advantage` for `(rollout_id, group_id, returns)`: each call's return is
    normalised against the returns at the same step position k of the other rollouts of its
    group (GRPO per step position; rollouts with fewer calls take no part at k)."""
    by_position: dict[tuple[str, int], list[tuple[str, float]]] = {}
    for rollout_id, group_id, returns in members:
        for k, g in enumerate(returns):
            by_position.setdefault((group_id, k), []).append((rollout_id, g))
    out: dict[tuple[str, int], float] = {}
    estimator = AdvEstimator.GRPO if norm_by_std else AdvEstimator.MEAN
    for (_, k), entries in by_position.items():
        advs = group_advantages([g for _, g in entries], estimator, norm_by_std, eps)
        for (rollout_id, _), adv in zip(entries, advs, strict=True):
            out[(rollout_id, k)] = adv
    return out
