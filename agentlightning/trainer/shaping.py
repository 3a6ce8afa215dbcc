"""Batch shaping and per-rollout loss weights.

A PPO mini-batch is a number of whole prompt groups (`ppo_mini_batch_size`, counted in
prompts as in verl). When a step's groups do not fill whole mini-batches, or there are more
than `max_ppo_update_times` mini-batches, whole groups are dropped — never single rollouts,
so no group is left with one survivor whose advantage would lose its baseline. Groups whose
rewards were all equal go first (their advantages are all exactly zero: no signal), then
others at random, from a seeded generator. Shaping runs after the advantages are computed;
dropping a whole group changes no other group's advantages.

Loss weights make the loss a per-rollout mean: within one mini-batch of R rollouts, each
trainable token of a rollout with T trainable tokens (over all its rows) weighs 1/(R·T), so
`Σ loss_weight · mask · token_loss` over the mini-batch averages each rollout's token losses
and then averages over rollouts — whatever the split into rows and micro-batches. The other
aggregations of `actor_rollout_ref.actor.loss_agg_mode` (verl's names; a "sequence" is a
rollout) are other weights of the same sum, with N the mini-batch's trainable tokens and L a
constant length:

    seq-mean-token-mean (default)  1/(R·T)
    token-mean                     1/N        (DAPO: long rollouts weigh more)
    seq-mean-token-sum             1/R
    seq-mean-token-sum-norm        1/(R·L)    (Dr.GRPO: no length normalisation)
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from agentlightning.rows import TrainingRow


def group_rows(rows: Sequence[TrainingRow]) -> dict[str, list[TrainingRow]]:
    """Rows by group id, groups in order of first appearance."""
    groups: dict[str, list[TrainingRow]] = {}
    for row in rows:
        groups.setdefault(row.group_id, []).append(row)
    return groups


def _no_signal(rows: list[TrainingRow]) -> bool:
    """All advantages zero: the group's rewards were all equal (or it had one rollout)."""
    return all(r.advantage == 0.0 for r in rows)


@dataclass(slots=True)
class ShapeStats:
    n_groups_in: int = 0
    n_groups_kept: int = 0
    n_groups_dropped_same_reward: int = 0
    n_groups_dropped_random: int = 0
    n_rows_dropped_same_reward: int = 0
    n_rows_dropped_random: int = 0
    n_minibatches: int = 0


def n_groups_to_keep(
    n_groups: int, groups_per_minibatch: int, max_updates: int | None, keep_partial: bool = False
) -> int:
    """How many groups fill whole mini-batches within the update cap."""
    if groups_per_minibatch < 1:
        raise ValueError(f"groups_per_minibatch must be >= 1, got {groups_per_minibatch}")
    n_mb = -(-n_groups // groups_per_minibatch) if keep_partial else n_groups // groups_per_minibatch
    if max_updates is not None:
        n_mb = min(n_mb, max_updates)
    return min(n_groups, n_mb * groups_per_minibatch)


def shape_batch(
    rows: Sequence[TrainingRow],
    groups_per_minibatch: int,
    max_updates: int | None = None,
    rng: random.Random | None = None,
    keep_partial: bool = False,
) -> tuple[list[TrainingRow], ShapeStats]:
    """Drop whole groups so that the rest fills whole mini-batches within `max_updates`.

    Kept rows stay in their order. With `keep_partial` the last mini-batch may be smaller
    instead of dropped (the loss weights keep it exact).
    """
    rng = rng or random.Random(0)
    groups = group_rows(rows)
    stats = ShapeStats(n_groups_in=len(groups))
    keep = n_groups_to_keep(len(groups), groups_per_minibatch, max_updates, keep_partial)
    n_drop = len(groups) - keep
    dropped: set[str] = set()
    if n_drop > 0:
        same = [g for g, members in groups.items() if _no_signal(members)]
        other = [g for g, members in groups.items() if not _no_signal(members)]
        rng.shuffle(same)
        rng.shuffle(other)
        for gid in same[:n_drop]:
            dropped.add(gid)
            stats.n_groups_dropped_same_reward += 1
            stats.n_rows_dropped_same_reward += len(groups[gid])
        for gid in other[: n_drop - len(dropped)]:
            dropped.add(gid)
            stats.n_groups_dropped_random += 1
            stats.n_rows_dropped_random += len(groups[gid])
    kept = [row for row in rows if row.group_id not in dropped]
    stats.n_groups_kept = len(groups) - len(dropped)
    stats.n_minibatches = -(-stats.n_groups_kept // groups_per_minibatch)
    return kept, stats


def set_loss_weights(
    rows: Sequence[TrainingRow], mode: str = "seq-mean-token-mean", length: int | None = None
) -> None:
    """Weights for one mini-batch (see the module docstring): by default each trainable token
    of rollout r gets 1/(R·T_r). `length` is L of `seq-mean-token-sum-norm`."""
    trainable: dict[str, int] = {}
    for row in rows:
        trainable[row.rollout_id] = trainable.get(row.rollout_id, 0) + row.n_trainable
    n_rollouts = sum(1 for t in trainable.values() if t > 0)
    n_tokens = sum(trainable.values())
    for row in rows:
        t = trainable[row.rollout_id]
        if t <= 0:
            row.loss_weight = 0.0
        elif mode == "seq-mean-token-mean":
            row.loss_weight = 1.0 / (n_rollouts * t)
        elif mode == "token-mean":
            row.loss_weight = 1.0 / n_tokens
        elif mode == "seq-mean-token-sum":
            row.loss_weight = 1.0 / n_rollouts
        elif mode == "seq-mean-token-sum-norm":
            if not length or length < 1:
                raise ValueError("seq-mean-token-sum-norm needs a positive constant length")
            row.loss_weight = 1.0 / (n_rollouts * length)
        else:
            raise ValueError(f"unknown loss_agg_mode {mode!r}")


def split_minibatches(
    rows: Sequence[TrainingRow],
    groups_per_minibatch: int,
    shuffle: bool = False,
    rng: random.Random | None = None,
    mode: str = "seq-mean-token-mean",
    length: int | None = None,
) -> list[list[TrainingRow]]:
    """Split a shaped batch into PPO mini-batches of whole groups and set their loss weights.

    Each mini-batch holds `groups_per_minibatch` groups (the last one fewer when the batch
    was not shaped to fit). With `shuffle`, groups are assigned to mini-batches in a random
    order from `rng`; rows of a group stay together and in order.
    """
    if groups_per_minibatch < 1:
        raise ValueError(f"groups_per_minibatch must be >= 1, got {groups_per_minibatch}")
    groups = list(group_rows(rows).values())
    if shuffle:
        (rng or random.Random(0)).shuffle(groups)
    out: list[list[TrainingRow]] = []
    for start in range(0, len(groups), groups_per_minibatch):
        mb = [row for group in groups[start : start + groups_per_minibatch] for row in group]
        set_loss_weights(mb, mode, length)
        out.append(mb)
    return out
