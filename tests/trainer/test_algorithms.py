"""The core's side of each algorithm, against hand computations on one fixed batch: advantages
(GRPO, Dr.GRPO, RLOO, REINFORCE++ and its baseline variant), loss weights of every
`loss_agg_mode`, DAPO's filtering of all-equal groups, and bounded staleness."""

from __future__ import annotations

import math

import pytest
from structlog.testing import capture_logs

from agentlightning.config.schema import ConfigError
from agentlightning.rows import TrainingRow
from agentlightning.schemas import RolloutState
from agentlightning.trainer.advantage import rollout_advantages
from agentlightning.trainer.batch import build_training_batch, collect_training_batch
from agentlightning.trainer.collected import CollectedRollout
from agentlightning.trainer.config import AdvEstimator, CoreConfig, load_core_config
from agentlightning.trainer.shaping import set_loss_weights
from agentlightning.trainer.staleness import rollout_staleness, split_stale_groups
from tests.trainer.scripts import call_event, reward_event

# Group a: rewards 1, 0, 0, 1; group b: 1, 1, 1 (all equal).
MEMBERS = [("a0", "a", 1.0), ("a1", "a", 0.0), ("a2", "a", 0.0), ("a3", "a", 1.0)] + [
    (f"b{i}", "b", 1.0) for i in range(3)
]


def test_grpo_and_dr_grpo_advantages_by_hand() -> None:
    # mean 0.5, sample std sqrt(4 · 0.25 / 3) = 0.57735
    grpo = rollout_advantages(MEMBERS, AdvEstimator.GRPO)
    a = 0.5 / (math.sqrt(1 / 3) + 1e-6)  # ε = 1e-6
    assert [grpo[k] for k in ("a0", "a1", "a2", "a3")] == pytest.approx([a, -a, -a, a], rel=1e-12)
    assert a == pytest.approx(0.866024, abs=1e-6)
    assert [grpo[f"b{i}"] for i in range(3)] == [0.0, 0.0, 0.0]
    dr = rollout_advantages(MEMBERS, AdvEstimator.GRPO, norm_by_std=False)  # Dr.GRPO: no std
    assert [dr[k] for k in ("a0", "a1", "a2", "a3")] == [0.5, -0.5, -0.5, 0.5]


def test_rloo_advantages_by_hand() -> None:
    rloo = rollout_advantages(MEMBERS, AdvEstimator.RLOO)
    # 1 − (0 + 0 + 1)/3 and 0 − (1 + 0 + 1)/3
    assert [rloo[k] for k in ("a0", "a1", "a2", "a3")] == pytest.approx([2 / 3, -2 / 3, -2 / 3, 2 / 3])
    assert rloo["b0"] == 0.0


def test_reinforce_plus_plus_whitens_over_the_batch_by_hand() -> None:
    adv = rollout_advantages(MEMBERS, AdvEstimator.REINFORCE_PLUS_PLUS)
    # 7 rewards, five 1s and two 0s: mean 5/7, sample std sqrt((5·(2/7)² + 2·(5/7)²)/6) = 0.48795
    std = math.sqrt((5 * (2 / 7) ** 2 + 2 * (5 / 7) ** 2) / 6)
    assert adv["a0"] == pytest.approx((2 / 7) / (std + 1e-6), rel=1e-12)
    assert adv["a1"] == pytest.approx(-(5 / 7) / (std + 1e-6), rel=1e-12)
    assert adv["b0"] == pytest.approx(
        (2 / 7) / (std + 1e-6), rel=1e-12
    )  # no group baseline: an all-1 group is pushed up
    assert adv["a0"] == pytest.approx(0.585540, abs=1e-5)


def test_reinforce_plus_plus_baseline_centres_per_group_then_whitens() -> None:
    adv = rollout_advantages(MEMBERS, AdvEstimator.REINFORCE_PLUS_PLUS_BASELINE)
    # centred: ±0.5 (group a), 0 (group b); over the 7: mean 0, std sqrt(4 · 0.25 / 6) = 0.408248
    a = 0.5 / (math.sqrt(1 / 6) + 1e-6)
    assert [adv[k] for k in ("a0", "a1")] == pytest.approx([a, -a], rel=1e-12)
    assert a == pytest.approx(1.224741, abs=1e-6)
    assert [adv[f"b{i}"] for i in range(3)] == [0.0, 0.0, 0.0]


def _row(rid: str, n_trainable: int, n_context: int = 0) -> TrainingRow:
    n = n_trainable + n_context
    return TrainingRow(rid, "g", [1], [5] * n, [1] * n_trainable + [0] * n_context, None, [0] * n, 0.0, 0.0)


@pytest.mark.parametrize(
    ("mode", "length", "expected"),
    [
        # r1 has two rows (3 and 1 trainable tokens, T=4), r2 one row (T=2): R=2, N=6
        ("seq-mean-token-mean", None, [1 / 8, 1 / 8, 1 / 4]),
        ("token-mean", None, [1 / 6, 1 / 6, 1 / 6]),
        ("seq-mean-token-sum", None, [1 / 2, 1 / 2, 1 / 2]),
        ("seq-mean-token-sum-norm", 10, [1 / 20, 1 / 20, 1 / 20]),
    ],
)
def test_loss_weights_of_every_aggregation_by_hand(
    mode: str, length: int | None, expected: list[float]
) -> None:
    rows = [_row("r1", 3, 2), _row("r1", 1), _row("r2", 2)]
    set_loss_weights(rows, mode, length)
    assert [r.loss_weight for r in rows] == pytest.approx(expected)


def _rollout(group: str, idx: int, reward: float, versions: tuple[int, ...] = (0,)) -> CollectedRollout:
    events = []
    prompt = [100, 101]
    for turn, version in enumerate(versions):
        response = [turn + 1, turn + 2]
        events.append(call_event(prompt, response, [-0.5, -0.5], version))
        prompt = prompt + response + [50]
    events.append(reward_event(reward))
    return CollectedRollout(f"{group}-{idx}", group, RolloutState.SUCCEEDED, events, index_in_group=idx)


def _config(**extra: object) -> CoreConfig:
    cfg: dict = {
        "data": {"train_batch_size": 2},
        "actor_rollout_ref": {"rollout": {"n": 2}, "actor": {"ppo_mini_batch_size": 1}},
    }
    for key, value in extra.items():
        node = cfg
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return load_core_config(cfg)


def test_dapo_filter_groups_drops_all_equal_groups_counted() -> None:
    rollouts = [
        _rollout("g0", 0, 1.0),
        _rollout("g0", 1, 0.0),
        _rollout("g1", 0, 1.0),
        _rollout("g1", 1, 1.0),
    ]
    plain = build_training_batch(rollouts, _config(), step=1)
    assert {r.group_id for r in plain.rows} == {"g0", "g1"}  # the all-equal group trains with advantage 0
    assert plain.metrics["training/n_zero_adv_groups"] == 1
    dapo = build_training_batch(rollouts, _config(**{"algorithm.filter_groups.enable": True}), step=1)
    assert {r.group_id for r in dapo.rows} == {"g0"}
    assert dapo.metrics["training/n_groups_filtered/same_reward"] == 1
    assert dapo.metrics["training/n_sample_filtered/same_reward"] == 2


def test_token_mean_weights_reach_the_batch() -> None:
    rollouts = [_rollout("g0", 0, 1.0, (0, 0)), _rollout("g0", 1, 0.0)]  # 4 and 2 trainable tokens
    cfg = _config(**{"actor_rollout_ref.actor.loss_agg_mode": "token-mean"})
    (mb,) = build_training_batch(rollouts, cfg, step=1).minibatches()
    assert [r.loss_weight for r in mb] == pytest.approx([1 / 6, 1 / 6])


def test_staleness_is_measured_on_each_calls_version() -> None:
    assert rollout_staleness(_rollout("g", 0, 1.0, (2, 5)), policy_version=6) == 4  # the oldest call
    assert rollout_staleness(_rollout("g", 0, 1.0, (6,)), policy_version=6) == 0


def test_max_staleness_drops_whole_groups_counted() -> None:
    rollouts = [
        _rollout("g0", 0, 1.0, (5,)),
        _rollout("g0", 1, 0.0, (2,)),  # 4 behind version 6: its whole group goes
        _rollout("g1", 0, 1.0, (5,)),
        _rollout("g1", 1, 0.0, (3, 6)),
    ]
    fresh, stale = split_stale_groups(rollouts, 6, max_staleness=3)
    assert [r.rollout_id for r in stale] == ["g0-0", "g0-1"]
    assert [r.rollout_id for r in fresh] == ["g1-0", "g1-1"]
    batch = build_training_batch(
        rollouts, _config(**{"agentlightning.max_staleness": 3}), step=7, policy_version=6
    )
    assert {r.group_id for r in batch.rows} == {"g1"}
    assert batch.metrics["training/staleness/n_groups_dropped"] == 1
    assert batch.metrics["training/staleness/n_rollouts_dropped"] == 2
    unbounded = build_training_batch(rollouts, _config(), step=7, policy_version=6)
    assert {r.group_id for r in unbounded.rows} == {"g0", "g1"}


@pytest.mark.parametrize(
    ("key", "value", "names"),
    [
        ("actor_rollout_ref.actor.loss_agg_mode", "seq-mean-token-max", "loss_agg_mode"),
        ("actor_rollout_ref.actor.loss_agg_mode", "seq-mean-token-sum-norm", "loss_scale_factor"),
        ("algorithm.adv_estimator", "reinforce", "adv_estimator"),
        ("algorithm.filter_groups.enable", "yes", "filter_groups.enable"),
        ("algorithm.filter_groups.metric", "acc_v2", "filter_groups.metric"),
        ("agentlightning.max_staleness", -1, "max_staleness"),
        ("agentlightning.stale_policy", "wait", "async_rollout.enabled"),
    ],
)
def test_bad_algorithm_settings_fail_naming_the_key(key: str, value: object, names: str) -> None:
    extra = {key: value}
    if key == "agentlightning.stale_policy":
        extra["agentlightning.max_staleness"] = 2
    with pytest.raises(ConfigError, match=names.replace(".", r"\.")):
        _config(**extra)


def test_v1_loss_agg_mode_token_sum_reads_as_the_per_rollout_mean() -> None:
    # v1.0's per_rollout_mean loss ran verl's token-sum over the per-rollout weights
    cfg = _config(**{"actor_rollout_ref.actor.loss_agg_mode": "token-sum"})
    assert cfg.loss_agg_mode == "seq-mean-token-mean"


def _no_more() -> tuple[list[CollectedRollout], dict[str, float]]:
    return [], {}


def test_what_a_step_leaves_out_is_said_once() -> None:
    no_lp = CollectedRollout(
        "g1-1",
        "g1",
        RolloutState.SUCCEEDED,
        [call_event([100, 101], [1, 2], None, 0), reward_event(1.0)],
        index_in_group=1,
    )
    rollouts = [_rollout("g0", 0, 1.0), _rollout("g0", 1, 0.0), _rollout("g1", 0, 1.0), no_lp]
    with capture_logs() as logs:
        build_training_batch(rollouts, _config(), step=3)
    assert logs == []  # a build is not a step: the step's line is collect_training_batch's
    with capture_logs() as logs:
        collect_training_batch(rollouts, _no_more, _config(), 3, {})
    (said,) = [e for e in logs if e["event"] == "batch_left_out"]
    assert said["step"] == 3
    assert said["groups_all_equal_trained_with_zero_advantage"] == 1
    assert said["calls_without_log_probs"] == 1
    with capture_logs() as logs:
        collect_training_batch([], _no_more, _config(), 4, {})
    assert [e["event"] for e in logs] == ["batch_empty_nothing_to_train"]


DAPO = {"algorithm.filter_groups.enable": True}


def test_dapo_top_up_says_the_step_once_and_not_empty_when_it_trains() -> None:
    # The first batch has no signal (both groups all equal): its build is empty, but the step is
    # not — the top-up collects until 2 groups with signal are left. One line, for the final batch.
    first = [_rollout("g0", 0, 1.0), _rollout("g0", 1, 1.0), _rollout("g1", 0, 0.0), _rollout("g1", 1, 0.0)]
    more = [
        [_rollout("g2", 0, 1.0), _rollout("g2", 1, 0.0), _rollout("g3", 0, 1.0), _rollout("g3", 1, 1.0)],
        [_rollout("g4", 0, 0.0), _rollout("g4", 1, 1.0), _rollout("g5", 0, 0.0), _rollout("g5", 1, 0.0)],
    ]
    calls: list[int] = []

    def collect() -> tuple[list[CollectedRollout], dict[str, float]]:
        calls.append(1)
        return more.pop(0), {"timing/collect_s": 2.0}

    metrics = {"timing/collect_s": 1.0}
    with capture_logs() as logs:
        batch = collect_training_batch(first, collect, _config(**DAPO), 5, metrics)
    assert len(calls) == 2
    assert {r.group_id for r in batch.rows} == {"g2", "g4"}
    assert metrics["training/n_generated_batches"] == 3
    assert metrics["timing/collect_s"] == 5.0
    assert batch.metrics["training/n_groups_filtered/same_reward"] == 4
    assert [(e["event"], e["step"], e.get("groups_all_equal_filtered")) for e in logs] == [
        ("batch_left_out", 5, 4)
    ]


@pytest.mark.parametrize("max_batches", [0, 2])
def test_dapo_step_with_no_signal_at_all_is_said_empty_once(max_batches: int) -> None:
    # Every batch all-equal: the data run out (0: no limit) or the cap of 2 batches is reached.
    def batch(n: int) -> list[CollectedRollout]:
        return [_rollout(f"g{n}", 0, 1.0), _rollout(f"g{n}", 1, 1.0)]

    more = [batch(1)]

    def collect() -> tuple[list[CollectedRollout], dict[str, float]]:
        return (more.pop(0) if more else []), {}

    cfg = _config(**DAPO, **{"algorithm.filter_groups.max_num_gen_batches": max_batches})
    with capture_logs() as logs:
        result = collect_training_batch(batch(0), collect, cfg, 2, {})
    assert result.empty
    empty = [e for e in logs if e["event"] == "batch_empty_nothing_to_train"]
    assert [(e["step"], e["groups_all_equal_filtered"]) for e in empty] == [(2, 2)]
    assert [e["event"] for e in logs if e["event"] != "batch_empty_nothing_to_train"] == (
        ["filter_groups_batch_not_full"] if max_batches else []
    )
