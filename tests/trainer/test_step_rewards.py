"""Rewards on calls: a `reward` event naming a call (`data.call_index`) is kept per row and
segment, the rollout's reward ignores it, and `advantage_mode: step` turns the per-call
rewards into per-call advantages (discounted returns, normalised per step position), checked
against hand computations."""

from __future__ import annotations

import math

import pytest

from agentlightning.config.schema import ConfigError
from agentlightning.rewards import call_rewards, last_reward
from agentlightning.schemas import RolloutState
from agentlightning.server.triplet import to_triplet
from agentlightning.trainer.advantage import step_advantages, step_returns
from agentlightning.trainer.batch import build_training_batch
from agentlightning.trainer.collected import CollectedRollout
from agentlightning.trainer.config import CoreConfig, load_core_config
from tests.trainer.scripts import call_event, reward_event


def _call_reward(index: int, value: float) -> dict:
    event = reward_event(value)
    event["data"]["call_index"] = index
    return event


def _rollout(group: str, idx: int, outcome: float, step_rewards: dict[int, float], n_calls: int = 2):
    events = []
    prompt = [100, 101]
    for turn in range(n_calls):
        response = [turn + 1, turn + 2]
        events.append(call_event(prompt, response, [-0.5, -0.5], 0))
        prompt = prompt + response + [50]
    events += [_call_reward(k, v) for k, v in step_rewards.items()]
    events.append(reward_event(outcome))
    return CollectedRollout(f"{group}-{idx}", group, RolloutState.SUCCEEDED, events, index_in_group=idx)


def _config(**agl: object) -> CoreConfig:
    return load_core_config(
        {
            "data": {"train_batch_size": 1},
            "actor_rollout_ref": {"rollout": {"n": 3}, "actor": {"ppo_mini_batch_size": 1}},
            "algorithm": {"gamma": agl.pop("gamma", 1.0)},
            "agentlightning": agl,
        }
    )


def test_the_triplet_view_keeps_the_call_index_and_old_rewards_stay_rollout_rewards() -> None:
    payload, _ = to_triplet("reward", {"value": 0.5, "call_index": 1, "source": "hook"})  # type: ignore[misc]
    assert payload == {"value": 0.5, "source": "hook", "call_index": 1}
    events = [reward_event(1.0), _call_reward(0, 0.25), _call_reward(0, 0.5), _call_reward(1, 0.1)]
    assert last_reward(events) == 1.0  # a reward naming a call is not the rollout's
    assert call_rewards(events) == {0: 0.5, 1: pytest.approx(0.1)}  # the last per call


def test_step_returns_by_hand() -> None:
    # r̃ = [0.5, 0 + outcome 1]: G_1 = 1, G_0 = 0.5 + 0.9 · 1
    assert step_returns([0.5, 0.0], 1.0, gamma=0.9) == pytest.approx([1.4, 1.0])
    assert step_returns([0.0], 0.0) == [0.0]


def test_step_advantages_normalise_per_step_position_by_hand() -> None:
    members = [("A", "g", [1.4, 1.0]), ("B", "g", [0.0, 0.0]), ("C", "g", [0.5])]
    adv = step_advantages(members)
    # position 0: 1.4, 0, 0.5 — mean 19/30, sample std
    mean = 1.9 / 3
    std = math.sqrt(((1.4 - mean) ** 2 + mean**2 + (0.5 - mean) ** 2) / 2)
    assert adv[("A", 0)] == pytest.approx((1.4 - mean) / (std + 1e-6))
    assert adv[("C", 0)] == pytest.approx((0.5 - mean) / (std + 1e-6))
    # position 1: only A and B took a second step: ±0.5 / sqrt(0.5)
    assert adv[("A", 1)] == pytest.approx(0.5 / (math.sqrt(0.5) + 1e-6))
    assert adv[("B", 1)] == pytest.approx(-0.5 / (math.sqrt(0.5) + 1e-6))
    assert ("C", 1) not in adv


def test_aggregation_keeps_call_rewards_per_row_and_segment() -> None:
    rollouts = [
        _rollout("g", 0, 1.0, {0: 0.5}),
        _rollout("g", 1, 0.0, {}),
        _rollout("g", 2, 0.0, {1: 0.2, 7: 1.0}),
    ]
    batch = build_training_batch(rollouts, _config(), step=1)  # trajectory: one row of two calls each
    rows = {r.rollout_id: r for r in batch.rows}
    assert rows["g-0"].call_rewards == [0.5, 0.0]
    assert rows["g-1"].call_rewards is None
    assert rows["g-2"].call_rewards == [0.0, pytest.approx(0.2)]
    assert [r.reward for r in batch.rows] == [1.0, 0.0, 0.0]  # rollout rewards unchanged
    assert batch.metrics["training/n_call_rewards"] == 3
    assert batch.metrics["training/n_call_rewards_unmatched"] == 1  # call 7 was never made


def test_step_mode_gives_each_call_its_advantage_by_hand() -> None:
    rollouts = [_rollout("g", 0, 1.0, {0: 0.5}), _rollout("g", 1, 0.0, {}), _rollout("g", 2, 0.0, {0: 0.5})]
    cfg = _config(advantage_mode="step", trace_aggregator={"level": "transition"}, gamma=0.5)
    batch = build_training_batch(rollouts, cfg, step=1)
    adv = {(r.rollout_id, r.turn_index): r.advantage for r in batch.rows}
    # returns: g-0 [0.5 + 0.5·1, 1] = [1, 1]; g-1 [0, 0]; g-2 [0.5, 0]
    s0 = math.sqrt(((1 - 0.5) ** 2 + 0.5**2 + 0) / 2)  # position 0: 1, 0, 0.5 (mean 0.5)
    assert adv[("g-0", 0)] == pytest.approx(0.5 / (s0 + 1e-6))
    assert adv[("g-2", 0)] == pytest.approx(0.0, abs=1e-9)
    s1 = math.sqrt(((1 - 1 / 3) ** 2 + 2 * (1 / 3) ** 2) / 2)  # position 1: 1, 0, 0 (mean 1/3)
    assert adv[("g-0", 1)] == pytest.approx((2 / 3) / (s1 + 1e-6))
    assert adv[("g-2", 1)] == pytest.approx((-1 / 3) / (s1 + 1e-6))
    rollout_mode = build_training_batch(rollouts, _config(trace_aggregator={"level": "transition"}), step=1)
    # rollout mode: the right first call of g-2 earns nothing; its advantage is its outcome's
    expected = -1 / 3 / (math.sqrt(1 / 3) + 1e-6)
    assert [r.advantage for r in rollout_mode.rows if r.rollout_id == "g-2"] == pytest.approx([expected] * 2)


@pytest.mark.parametrize(
    ("agl", "names"),
    [
        ({"advantage_mode": "step"}, "trace_aggregator.level=transition"),
        ({"advantage_mode": "per_step"}, "advantage_mode"),
        ({"gamma": 0.9}, "algorithm.gamma"),  # a discount with rollout advantages does nothing
        ({"gamma": 0.0, "advantage_mode": "step", "trace_aggregator": {"level": "transition"}}, "gamma"),
    ],
)
def test_step_mode_settings_fail_naming_the_key(agl: dict, names: str) -> None:
    with pytest.raises(ConfigError, match=names.replace(".", r"\.")):
        _config(**agl)
