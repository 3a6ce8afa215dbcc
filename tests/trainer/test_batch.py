"""build_training_batch: failure policy, rewards, advantages over groups, shaping, metrics."""

from __future__ import annotations

import math

import pytest

from agentlightning.rewards import to_float32
from agentlightning.schemas import RolloutState
from agentlightning.trainer.advantage import group_advantages
from agentlightning.trainer.batch import build_training_batch
from agentlightning.trainer.collected import CollectedRollout
from agentlightning.trainer.config import load_core_config
from tests.trainer.scripts import call_event, reward_event


def _rollout(
    group: str,
    idx: int,
    reward: float | None,
    n_turns: int = 2,
    state: RolloutState = RolloutState.SUCCEEDED,
    version: int = 0,
    prompt_len: int = 3,
    step: int = 0,
) -> CollectedRollout:
    events = []
    prompt = list(range(100, 100 + prompt_len))
    for turn in range(n_turns):
        response = [turn + 1, turn + 2]
        events.append(call_event(prompt, response, [-0.5, -0.5], version))
        prompt = prompt + response + [50]  # a tool result between calls
    if reward is not None:
        events.append(reward_event(reward))
    return CollectedRollout(
        f"{group}-{idx}", group, state, events, step=step, sample_idx=int(group[1:]), index_in_group=idx
    )


def _config(mb: int = 1, **agl):
    return load_core_config(
        {
            "data": {"train_batch_size": 4},
            "actor_rollout_ref": {"rollout": {"n": 3}, "actor": {"ppo_mini_batch_size": mb}},
            "agentlightning": agl,
        }
    )


def test_rows_carry_group_reward_and_group_advantage():
    rollouts = [_rollout("g0", i, r) for i, r in enumerate([1.0, 0.0, 0.5])] + [
        _rollout("g1", i, r) for i, r in enumerate([0.0, 1.0, 1.0])
    ]
    batch = build_training_batch(rollouts, _config(), step=0)
    assert len(batch.rows) == 6  # one merged row per rollout
    expected = group_advantages([1.0, 0.0, 0.5]) + group_advantages([0.0, 1.0, 1.0])
    assert [r.advantage for r in batch.rows] == pytest.approx(expected)
    assert [r.reward for r in batch.rows] == [1.0, 0.0, 0.5, 0.0, 1.0, 1.0]
    assert batch.metrics["training/reward"] == pytest.approx(3.5 / 6)
    assert batch.metrics["training/n_groups"] == 2 and batch.metrics["training/n_minibatches"] == 2


def test_failed_rollouts_are_dropped_by_default_and_never_leave_a_lone_advantage():
    rollouts = [
        _rollout("g0", 0, 1.0),
        _rollout("g0", 1, 0.0, state=RolloutState.FAILED),
        _rollout("g0", 2, None, state=RolloutState.FAILED),
        _rollout("g1", 0, 1.0),
        _rollout("g1", 1, 0.0),
    ]
    batch = build_training_batch(rollouts, _config(), step=0)
    g0 = [r for r in batch.rows if r.group_id == "g0"]
    assert [r.rollout_id for r in g0] == ["g0-0"] and g0[0].advantage == 0.0  # lone survivor: no baseline
    assert batch.metrics["training/n_rollouts_failed"] == 2
    assert batch.metrics["training/n_rollouts_dropped_failed"] == 2


def test_train_policy_keeps_failed_rollouts_with_their_reward_or_the_fill_value():
    rollouts = [
        _rollout("g0", 0, 1.0),
        _rollout("g0", 1, 0.25, state=RolloutState.FAILED),
        _rollout("g0", 2, None, state=RolloutState.FAILED),
    ]
    batch = build_training_batch(rollouts, _config(failed_rollouts="train", reward_fillna_value=-1.0), step=0)
    assert [r.reward for r in batch.rows] == [1.0, 0.25, -1.0]
    assert [r.advantage for r in batch.rows] == pytest.approx(group_advantages([1.0, 0.25, -1.0]))
    assert batch.metrics["training/n_rollouts_w_reward"] == 2


def test_rewards_stay_float32():
    batch = build_training_batch([_rollout("g0", 0, 0.7), _rollout("g0", 1, 0.1)], _config(), step=0)
    assert [r.reward for r in batch.rows] == [to_float32(0.7), to_float32(0.1)]


def test_a_rollout_without_calls_is_not_in_its_group_baseline():
    silent = CollectedRollout(
        "g0-2", "g0", RolloutState.SUCCEEDED, [reward_event(1.0)], sample_idx=0, index_in_group=2
    )
    batch = build_training_batch([_rollout("g0", 0, 0.0), _rollout("g0", 1, 1.0), silent], _config(), step=0)
    assert [r.advantage for r in batch.rows] == pytest.approx(group_advantages([0.0, 1.0]))
    assert batch.metrics["training/n_rollouts_no_calls"] == 1


def test_a_rollout_whose_rows_were_dropped_still_counts_in_its_group_baseline():
    long_prompt = _rollout("g0", 2, 1.0, prompt_len=50)
    cfg = load_core_config(
        {"actor_rollout_ref": {"actor": {"ppo_mini_batch_size": 1}}, "data": {"max_prompt_length": 20}}
    )
    batch = build_training_batch([_rollout("g0", 0, 0.0), _rollout("g0", 1, 0.0), long_prompt], cfg, step=0)
    assert [r.rollout_id for r in batch.rows] == ["g0-0", "g0-1"]
    expected = group_advantages([0.0, 0.0, 1.0])[:2]
    assert [r.advantage for r in batch.rows] == pytest.approx(expected)
    assert all(r.advantage < 0 for r in batch.rows)
    assert batch.metrics["training/n_sample_dropped/marked"] == 1


def test_shaping_drops_whole_no_signal_groups_to_fit_minibatches():
    rollouts = [_rollout("g0", i, r) for i, r in enumerate([1.0, 0.0])]
    rollouts += [_rollout("g1", i, 0.0) for i in range(2)]  # all equal: no signal
    rollouts += [_rollout("g2", i, r) for i, r in enumerate([0.0, 1.0])]
    batch = build_training_batch(rollouts, _config(mb=2), step=0)
    assert sorted({r.group_id for r in batch.rows}) == ["g0", "g2"]
    assert batch.metrics["training/n_sample_dropped/same_reward"] == 2
    assert batch.metrics["training/n_sample_dropped/random"] == 0


def test_minibatches_weigh_each_rollout_once():
    rollouts = [_rollout("g0", 0, 1.0, n_turns=3), _rollout("g0", 1, 0.0, n_turns=1)]
    rollouts += [_rollout("g1", i, float(i)) for i in range(2)]
    cfg = load_core_config(
        {
            "actor_rollout_ref": {"actor": {"ppo_mini_batch_size": 2}},
            "agentlightning": {"trace_aggregator": {"level": "transition"}},
        }
    )
    batch = build_training_batch(rollouts, cfg, step=3)
    (mb,) = batch.minibatches()
    per_rollout: dict[str, float] = {}
    for row in mb:
        per_rollout[row.rollout_id] = per_rollout.get(row.rollout_id, 0.0) + row.loss_weight * row.n_trainable
    assert len(per_rollout) == 4 and all(v == pytest.approx(0.25) for v in per_rollout.values())
    assert math.fsum(per_rollout.values()) == pytest.approx(1.0)
    assert batch.minibatches() == batch.minibatches()  # the same step shuffles the same way


def test_staleness_is_measured_against_the_policy_version():
    rollouts = [_rollout("g0", 0, 1.0, version=3), _rollout("g0", 1, 0.0, version=5)]
    batch = build_training_batch(rollouts, _config(), step=0, policy_version=5)
    m = batch.metrics
    assert m["training/policy_version"] == 5
    assert m["training/staleness/max"] == 2
    assert m["training/staleness/mean"] == pytest.approx(1.0)
    assert m["training/staleness/frac_stale_tokens"] == pytest.approx(0.5)


def test_validation_rollouts_are_not_trained_on():
    val = _rollout("g0", 0, 1.0)
    val.is_train = False
    batch = build_training_batch([val], _config(), step=0)
    assert batch.empty and batch.metrics["training/n_rollouts"] == 0


def test_result_does_not_depend_on_completion_order():
    rollouts = [_rollout(f"g{g}", i, float((g + i) % 2)) for g in range(5) for i in range(3)]
    a = build_training_batch(rollouts, _config(mb=2), step=7)
    b = build_training_batch(list(reversed(rollouts)), _config(mb=2), step=7)
    assert len({r.group_id for r in a.rows}) == 4
    assert [(r.rollout_id, r.advantage) for r in a.rows] == [(r.rollout_id, r.advantage) for r in b.rows]


def test_building_a_batch_leaves_the_garbage_collector_as_it_found_it():
    import gc

    rollouts = [_rollout("g0", 0, 1.0), _rollout("g0", 1, 0.0)]
    assert gc.isenabled()
    build_training_batch(rollouts, _config(), step=0)
    assert gc.isenabled()
    gc.disable()
    try:
        build_training_batch(rollouts, _config(), step=0)
        assert not gc.isenabled()
    finally:
        gc.enable()
