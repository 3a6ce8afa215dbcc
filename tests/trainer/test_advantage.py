from __future__ import annotations

import math
import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentlightning.rows import TrainingRow
from agentlightning.trainer.advantage import assign_advantages, group_advantages, rollout_advantages
from agentlightning.trainer.config import AdvEstimator

rewards = st.lists(st.sampled_from([0.0, 0.25, 0.5, 1.0, -1.0, 3.0]), min_size=1, max_size=12)
estimators = st.sampled_from(list(AdvEstimator))


def test_grpo_matches_the_formula_with_the_sample_std():
    r = [1.0, 0.0, 0.0, 1.0, 1.0]
    mean, std = statistics.fmean(r), statistics.stdev(r)
    assert group_advantages(r) == pytest.approx([(x - mean) / (std + 1e-6) for x in r], rel=1e-12)


def test_grpo_without_std_is_mean_centred():
    r = [1.0, 0.0, 0.5]
    assert group_advantages(r, AdvEstimator.GRPO, norm_by_std=False) == pytest.approx([0.5, -0.5, 0.0])
    assert group_advantages(r, AdvEstimator.MEAN) == pytest.approx([0.5, -0.5, 0.0])


def test_rloo_is_reward_minus_the_mean_of_the_others():
    r = [1.0, 0.0, 0.0, 0.5]
    expected = [x - (sum(r) - x) / (len(r) - 1) for x in r]
    assert group_advantages(r, AdvEstimator.RLOO) == pytest.approx(expected)


@pytest.mark.parametrize("estimator", list(AdvEstimator))
def test_a_lone_rollout_gets_zero_not_its_reward(estimator):
    assert group_advantages([0.9], estimator) == [0.0]


@settings(max_examples=300)
@given(rewards, estimators, st.booleans())
def test_advantages_are_zero_mean_per_group(r, estimator, norm):
    adv = group_advantages(r, estimator, norm)
    assert len(adv) == len(r)
    assert math.fsum(adv) == pytest.approx(0.0, abs=1e-9)
    if len(set(r)) == 1:
        assert adv == [0.0] * len(r)  # exactly zero: no signal, no rounding noise
    else:
        # better reward, larger advantage
        for a, ra in zip(adv, r, strict=True):
            for b, rb in zip(adv, r, strict=True):
                if ra > rb:
                    assert a > b


@settings(max_examples=200, deadline=None)  # a busy machine is no failure
@given(st.lists(st.tuples(st.sampled_from("abc"), st.sampled_from([0.0, 1.0, 0.5])), min_size=1, max_size=15))
def test_rollout_advantages_group_by_group_id(members):
    triples = [(f"r{i}", g, r) for i, (g, r) in enumerate(members)]
    adv = rollout_advantages(triples)
    for group in "abc":
        ids = [rid for rid, g, _ in triples if g == group]
        assert [adv[rid] for rid in ids] == pytest.approx(
            group_advantages([r for _, g, r in triples if g == group]), abs=0
        )


def test_a_rollout_listed_twice_is_an_error():
    with pytest.raises(ValueError, match="twice"):
        rollout_advantages([("r1", "g", 1.0), ("r1", "g", 0.0)])


def _row(rollout_id: str, group_id: str, reward: float, n_tokens: int = 2) -> TrainingRow:
    return TrainingRow(
        rollout_id, group_id, [1], [2] * n_tokens, [1] * n_tokens, None, [0] * n_tokens, reward
    )


def test_a_rollout_with_many_rows_casts_one_vote():
    """The same rewards give the same advantages, whether rollout a made one row or five."""
    members = [("a", "g", 1.0), ("b", "g", 0.0), ("c", "g", 0.0)]
    adv = rollout_advantages(members)
    one_row = [_row("a", "g", 1.0), _row("b", "g", 0.0), _row("c", "g", 0.0)]
    many_rows = [_row("a", "g", 1.0) for _ in range(5)] + [_row("b", "g", 0.0), _row("c", "g", 0.0)]
    assign_advantages(one_row, adv)
    assign_advantages(many_rows, adv)
    by_rollout_one = {r.rollout_id: r.advantage for r in one_row}
    assert all(r.advantage == by_rollout_one[r.rollout_id] for r in many_rows)
    assert sum(by_rollout_one.values()) == pytest.approx(0.0, abs=1e-12)
