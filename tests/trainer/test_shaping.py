from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentlightning.rows import TrainingRow
from agentlightning.trainer.advantage import assign_advantages, rollout_advantages
from agentlightning.trainer.shaping import (
    group_rows,
    n_groups_to_keep,
    set_loss_weights,
    shape_batch,
    split_minibatches,
)


def _rows_from(spec: list[list[tuple[float, list[int]]]]) -> list[TrainingRow]:
    """spec: groups -> rollouts (reward, trainable tokens per row) -> rows with advantages."""
    rows: list[TrainingRow] = []
    members = []
    for g, group in enumerate(spec):
        for r, (reward, row_sizes) in enumerate(group):
            rid, gid = f"g{g}-r{r}", f"g{g}"
            members.append((rid, gid, reward))
            for k, size in enumerate(row_sizes):
                # a context token in the middle: weights apply to trainable tokens only
                mask = [1] * size + [0] + [1] if size > 1 else [1]
                n = len(mask)
                rows.append(TrainingRow(rid, gid, [7], [3] * n, mask, None, [0] * n, reward, turn_index=k))
    assign_advantages(rows, rollout_advantages(members))
    return rows


rollout_spec = st.tuples(
    st.sampled_from([0.0, 1.0, 0.5]), st.lists(st.integers(1, 5), min_size=1, max_size=4)
)
batches = st.lists(st.lists(rollout_spec, min_size=1, max_size=5), min_size=0, max_size=14)


def _rollouts_by_group(rows: list[TrainingRow]) -> dict[str, set[str]]:
    return {g: {r.rollout_id for r in members} for g, members in group_rows(rows).items()}


@settings(max_examples=300, deadline=None)
@given(batches, st.integers(1, 5), st.one_of(st.none(), st.integers(1, 4)), st.integers(0, 10**6))
def test_shaping_keeps_whole_groups_that_fill_whole_minibatches(spec, mb, max_updates, seed):
    rows = _rows_from(spec)
    kept, stats = shape_batch(rows, mb, max_updates, random.Random(seed))
    before, after = _rollouts_by_group(rows), _rollouts_by_group(kept)
    # whole groups: every kept group has all of its rollouts and all of its rows
    for gid, rollouts in after.items():
        assert rollouts == before[gid]
        assert [r for r in kept if r.group_id == gid] == [r for r in rows if r.group_id == gid]
    assert len(after) % mb == 0
    if max_updates is not None:
        assert len(after) <= mb * max_updates
    assert len(after) == n_groups_to_keep(len(before), mb, max_updates)
    assert stats.n_groups_kept == len(after)
    assert stats.n_groups_dropped_same_reward + stats.n_groups_dropped_random == len(before) - len(after)
    assert stats.n_rows_dropped_same_reward + stats.n_rows_dropped_random == len(rows) - len(kept)
    # order is kept
    positions = [rows.index(r) for r in kept]
    assert positions == sorted(positions)


@settings(max_examples=300, deadline=None)
@given(batches, st.integers(1, 5), st.integers(0, 10**6))
def test_shaping_drops_no_signal_groups_first(spec, mb, seed):
    rows = _rows_from(spec)
    kept, stats = shape_batch(rows, mb, None, random.Random(seed))
    groups = group_rows(rows)
    kept_ids = set(group_rows(kept))
    no_signal = {g for g, members in groups.items() if all(r.advantage == 0.0 for r in members)}
    dropped = set(groups) - kept_ids
    if dropped - no_signal:  # a group with signal was dropped only when all no-signal ones went
        assert no_signal <= dropped
    assert stats.n_groups_dropped_same_reward == len(dropped & no_signal)


def test_shaping_is_deterministic_for_a_seed_and_varies_across_seeds():
    spec = [[(float(g % 2), [2]), (float((g + 1) % 2), [1])] for g in range(11)]
    rows = _rows_from(spec)
    pick = lambda seed: sorted(group_rows(shape_batch(rows, 4, None, random.Random(seed))[0]))  # noqa: E731
    assert pick(3) == pick(3)
    assert len({tuple(pick(s)) for s in range(20)}) > 1


def test_partial_minibatch_is_kept_when_asked():
    rows = _rows_from([[(1.0, [1]), (0.0, [1])] for _ in range(5)])
    kept, stats = shape_batch(rows, 4, None, keep_partial=True)
    assert len(group_rows(kept)) == 5 and stats.n_minibatches == 2
    kept, stats = shape_batch(rows, 4, None)
    assert len(group_rows(kept)) == 4 and stats.n_minibatches == 1


def test_fewer_groups_than_a_minibatch_leave_nothing_unless_partial_is_allowed():
    rows = _rows_from([[(1.0, [1]), (0.0, [1])] for _ in range(3)])
    assert shape_batch(rows, 4)[0] == []
    assert len(shape_batch(rows, 4, keep_partial=True)[0]) == 6


# --- loss weights --------------------------------------------------------------------------


def _per_rollout_mean_loss(rows: list[TrainingRow], token_loss) -> float:
    """The definition: mean over rollouts of the mean over the rollout's trainable tokens."""
    per_rollout: dict[str, list[float]] = {}
    for row in rows:
        for i, m in enumerate(row.response_mask):
            if m:
                per_rollout.setdefault(row.rollout_id, []).append(token_loss(row, i))
    return math.fsum(math.fsum(v) / len(v) for v in per_rollout.values()) / len(per_rollout)


def _weighted_loss(rows: list[TrainingRow], token_loss, n_micro: int, rng: random.Random) -> float:
    """What a backend computes, over micro-batches of arbitrary rows."""
    order = list(rows)
    rng.shuffle(order)
    total = 0.0
    for start in range(0, len(order), max(1, len(order) // n_micro)):
        micro = order[start : start + max(1, len(order) // n_micro)]
        total += math.fsum(
            row.loss_weight * m * token_loss(row, i) for row in micro for i, m in enumerate(row.response_mask)
        )
    return total


@settings(max_examples=200, deadline=None)
@given(batches.filter(bool), st.integers(1, 4), st.integers(1, 6), st.integers(0, 10**6))
def test_loss_weights_make_the_loss_a_per_rollout_mean_under_any_micro_batching(spec, mb, n_micro, seed):
    rows = _rows_from(spec)
    rng = random.Random(seed)
    losses = {(id(r), i): rng.uniform(-2, 2) for r in rows for i in range(len(r.response_ids))}
    token_loss = lambda row, i: losses[(id(row), i)]  # noqa: E731
    minibatches = split_minibatches(rows, mb, shuffle=True, rng=random.Random(seed))
    assert sorted(map(id, (r for m in minibatches for r in m))) == sorted(map(id, rows))
    for m in minibatches:
        assert _weighted_loss(m, token_loss, n_micro, rng) == pytest.approx(
            _per_rollout_mean_loss(m, token_loss), rel=1e-9, abs=1e-12
        )
        # the weights of a mini-batch sum to 1; each rollout's to 1/R
        n_rollouts = len({r.rollout_id for r in m})
        assert math.fsum(r.loss_weight * r.n_trainable for r in m) == pytest.approx(1.0)
        for rid in {r.rollout_id for r in m}:
            assert math.fsum(
                r.loss_weight * r.n_trainable for r in m if r.rollout_id == rid
            ) == pytest.approx(1 / n_rollouts)


@settings(max_examples=200, deadline=None)
@given(batches.filter(bool), st.integers(1, 4))
def test_minibatches_hold_whole_groups(spec, mb):
    rows = _rows_from(spec)
    minibatches = split_minibatches(rows, mb)
    seen: set[str] = set()
    for m in minibatches:
        groups = set(group_rows(m))
        assert len(groups) <= mb
        assert not groups & seen
        seen |= groups
        for gid in groups:
            assert [r for r in m if r.group_id == gid] == [r for r in rows if r.group_id == gid]
    assert all(len(group_rows(m)) == mb for m in minibatches[:-1])


def test_a_rollout_weighs_the_same_however_many_rows_it_made():
    one = [TrainingRow("a", "g", [1], [2] * 6, [1] * 6, None, [0] * 6, 1.0)]
    three = [TrainingRow("a", "g", [1], [2] * 2, [1] * 2, None, [0] * 2, 1.0) for _ in range(3)]
    other = [TrainingRow("b", "g", [1], [2], [1], None, [0], 0.0)]
    set_loss_weights(one + other)
    set_loss_weights(three + other[:])
    assert sum(r.loss_weight * r.n_trainable for r in one) == pytest.approx(0.5)
    assert sum(r.loss_weight * r.n_trainable for r in three) == pytest.approx(0.5)


def test_bad_minibatch_size_is_refused():
    with pytest.raises(ValueError, match="groups_per_minibatch"):
        split_minibatches([], 0)
    with pytest.raises(ValueError, match="groups_per_minibatch"):
        n_groups_to_keep(3, 0, None)
