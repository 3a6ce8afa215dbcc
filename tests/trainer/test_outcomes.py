"""The outcome policy (trainer/outcomes.py): what a step trains on, by how each rollout ended.

The group of the issue: 8 rollouts of one prompt, 3 of them lost to the infrastructure (whose
naive agents reported 0), with the advantages each policy gives worked out by hand."""

from __future__ import annotations

import math
from typing import Any

import pytest

from agentlightning.config.schema import ConfigError
from agentlightning.schemas import INFRASTRUCTURE_OUTCOMES, AttemptOutcome, RolloutState
from agentlightning.trainer.batch import build_training_batch
from agentlightning.trainer.collected import CollectedRollout
from agentlightning.trainer.config import load_core_config, load_training_config
from agentlightning.trainer.loop import TrainingLoop
from agentlightning.trainer.metrics import validation_metrics
from agentlightning.trainer.outcomes import OutcomeShareExceeded, parse_outcome_policy, valid_for_validation
from tests.trainer.scripts import call_event, reward_event

OK, FAILED = RolloutState.SUCCEEDED, RolloutState.FAILED
Out = AttemptOutcome


def rollout(
    group: str, idx: int, reward: float | None, state: RolloutState = OK, outcome: Out | None = None
) -> CollectedRollout:
    prompt = [100 + idx % 3, 101, 102]
    events = [call_event(prompt, [idx + 1, idx + 2], [-0.5, -0.5], 0)]
    if reward is not None:
        events.append(reward_event(reward))
    return CollectedRollout(
        f"{group}-{idx}",
        group,
        state,
        events,
        sample_idx=int(group[1:]),
        index_in_group=idx,
        outcome=outcome,
        error_message=None if state == OK else f"{outcome} happened",
    )


def group_of_8(group: str = "g0") -> list[CollectedRollout]:
    """3 ok (1, 0, 1), 1 without a reward, 1 agent error, and 3 infrastructure failures: a 503
    after the retries whose naive agent reported 0, a sandbox killed by its memory limit, an
    OOMKilled pod."""
    return [
        rollout(group, 0, 1.0, outcome=Out.OK),
        rollout(group, 1, 0.0, outcome=Out.OK),
        rollout(group, 2, 1.0, outcome=Out.OK),
        rollout(group, 3, None, outcome=Out.NO_REWARD),
        rollout(group, 4, None, FAILED, Out.AGENT_ERROR),
        rollout(group, 5, 0.0, outcome=Out.MODEL_UNAVAILABLE),
        rollout(group, 6, None, FAILED, Out.SANDBOX_LOST),
        rollout(group, 7, None, FAILED, Out.POD_LOST),
    ]


def config(estimator: str = "grpo", n: int = 8, batch: int = 1, **agl: Any):
    return load_core_config(
        {
            "data": {"train_batch_size": batch},
            "actor_rollout_ref": {"rollout": {"n": n}, "actor": {"ppo_mini_batch_size": 1}},
            "algorithm": {"adv_estimator": estimator},
            "agentlightning": agl,
        }
    )


def advantages(rollouts: list[CollectedRollout], cfg: Any) -> dict[str, float]:
    rows = build_training_batch(rollouts, cfg).rows
    return {r.rollout_id: r.advantage for r in rows}


def approx(values: dict[str, float]) -> Any:
    return pytest.approx(values, rel=1e-5, abs=1e-6)


# --- the group of 8 with 3 infrastructure failures, policy by policy -----------------------


def test_defaults_drop_infrastructure_and_agent_errors_and_fill_a_missing_reward() -> None:
    # kept: rewards 1, 0, 1 and the fill 0 -> mean 0.5, sample std sqrt(1/3): ±0.5/0.57735
    a = 0.5 / math.sqrt(1 / 3)
    assert advantages(group_of_8(), config()) == approx({"g0-0": a, "g0-1": -a, "g0-2": a, "g0-3": -a})


def test_the_naive_treatment_would_have_trained_the_infrastructure_zeros() -> None:
    """What the typed outcomes prevent: the same group read from a Gateway that records none,
    with the old `train` treatment of failures, puts the infrastructure's zeros into the mean."""
    naive = [
        CollectedRollout(r.rollout_id, r.group_id, r.state, r.events, index_in_group=r.index_in_group)
        for r in group_of_8()
    ]
    got = advantages(naive, config(failed_rollouts="train"))
    assert set(got) == {f"g0-{i}" for i in range(8)}  # every zero trained: mean 2/8
    typed = advantages(group_of_8(), config(failed_rollouts="train"))
    assert set(typed) == {"g0-0", "g0-1", "g0-2", "g0-3", "g0-4"}  # the agent's own failure kept
    # kept: 1, 0, 1, 0 (fill), 0 (agent error, its fill) -> mean 0.4, sample std sqrt(0.3)
    s = math.sqrt(0.3)
    assert typed == approx(
        {"g0-0": 0.6 / s, "g0-1": -0.4 / s, "g0-2": 0.6 / s, "g0-3": -0.4 / s, "g0-4": -0.4 / s}
    )


def test_a_set_reward_for_agent_errors_and_dropping_missing_rewards() -> None:
    cfg = config(outcomes={"agent_error": {"action": "reward", "reward": -1.0}, "no_reward": "drop"})
    # kept: 1, 0, 1, -1 -> mean 0.25, centred .75 -.25 .75 -1.25, sample var 2.75/3
    s = math.sqrt(2.75 / 3)
    assert advantages(group_of_8(), cfg) == approx(
        {"g0-0": 0.75 / s, "g0-1": -0.25 / s, "g0-2": 0.75 / s, "g0-4": -1.25 / s}
    )
    rows = build_training_batch(group_of_8(), cfg).rows
    assert {r.rollout_id: r.reward for r in rows}["g0-4"] == -1.0


def test_a_group_left_with_fewer_than_min_group_is_dropped_whole() -> None:
    batch = build_training_batch(
        group_of_8() + group_of_8("g1")[:3], config(batch=2, outcomes={"min_group": 5})
    )
    assert {r.group_id for r in batch.rows} == {"g1"}  # g0 kept 4 of 8 < 5; g1 lost none
    assert batch.metrics["training/n_groups_dropped/too_few_valid"] == 1
    assert batch.metrics["training/n_rollouts_dropped_with_group"] == 4
    # at min_group 4 it stays
    kept = build_training_batch(group_of_8(), config(outcomes={"min_group": 4})).rows
    assert {r.rollout_id for r in kept} == {"g0-0", "g0-1", "g0-2", "g0-3"}


def test_fail_stops_the_run_when_the_share_passes_max_share_and_drops_below_it() -> None:
    with pytest.raises(OutcomeShareExceeded, match=r"1 of 8 rollouts ended as no_reward.*max_share=0.1"):
        build_training_batch(
            group_of_8(), config(outcomes={"no_reward": {"action": "fail", "max_share": 0.1}})
        )
    # 1/8 is under 0.2: the rollout is dropped and the step trains on 1, 0, 1
    got = advantages(group_of_8(), config(outcomes={"no_reward": {"action": "fail", "max_share": 0.2}}))
    s = math.sqrt(1 / 3)
    assert got == approx({"g0-0": (1 / 3) / s, "g0-1": (-2 / 3) / s, "g0-2": (1 / 3) / s})


def test_the_counts_per_outcome_are_metrics() -> None:
    m = build_training_batch(group_of_8(), config()).metrics
    assert {k: v for k, v in m.items() if k.startswith("rollout/outcome/")} == {
        "rollout/outcome/ok": 3,
        "rollout/outcome/no_reward": 1,
        "rollout/outcome/agent_error": 1,
        "rollout/outcome/context_overflow": 0,
        "rollout/outcome/timeout": 0,
        "rollout/outcome/lost": 0,
        "rollout/outcome/model_unavailable": 1,
        "rollout/outcome/sandbox_lost": 1,
        "rollout/outcome/pod_lost": 1,
    }
    assert m["training/n_rollouts_dropped_infrastructure"] == 3
    assert m["training/n_rollouts_dropped_failed"] == 3  # the agent error, the sandbox, the pod


def test_without_recorded_outcomes_they_are_derived_and_the_trainers_loss_is_lost() -> None:
    """A v1.0 Gateway records none: failed is the agent's error, the trainer's own giving up is
    lost (infrastructure), and a finished rollout is ok or no_reward by its events."""
    lost = rollout("g0", 0, 1.0, FAILED)
    lost.lost = True
    rows = [lost, rollout("g0", 1, 1.0), rollout("g0", 2, 0.0), rollout("g0", 3, None, FAILED)]
    m = build_training_batch(rows, config(n=4)).metrics
    assert (m["rollout/outcome/lost"], m["rollout/outcome/agent_error"], m["rollout/outcome/ok"]) == (1, 1, 2)


# --- every estimator sees only the valid rollouts ----------------------------------------------

ESTIMATORS = [
    ("grpo", {}),
    ("grpo", {"norm_adv_by_std_in_grpo": False}),  # Dr.GRPO
    ("rloo", {}),
    ("mean", {}),
    ("reinforce_plus_plus", {}),
    ("reinforce_plus_plus_baseline", {}),
]


def valid_only(rollouts: list[CollectedRollout]) -> list[CollectedRollout]:
    return [r for r in rollouts if r.outcome not in INFRASTRUCTURE_OUTCOMES]


@pytest.mark.parametrize(("estimator", "algorithm"), ESTIMATORS)
def test_every_estimator_sees_only_valid_rollouts(estimator: str, algorithm: dict[str, Any]) -> None:
    """The advantages with 3 infrastructure failures in the group are exactly those of the group
    without them, and differ from those computed with their zeros in (so the check can fail)."""

    def cfg(**agl: Any) -> Any:
        c = config(estimator, batch=2, **agl)
        if algorithm:
            c = load_core_config(
                {
                    "data": {"train_batch_size": 2},
                    "actor_rollout_ref": {"rollout": {"n": 8}, "actor": {"ppo_mini_batch_size": 1}},
                    "algorithm": {"adv_estimator": estimator, **algorithm},
                    "agentlightning": agl,
                }
            )
        return c

    both = group_of_8("g0") + [rollout("g1", i, float(i % 2), outcome=Out.OK) for i in range(4)]
    got = advantages(both, cfg())
    assert got == approx(advantages(valid_only(both), cfg()))
    assert not {"g0-5", "g0-6", "g0-7"} & set(got)
    poisoned = [
        CollectedRollout(r.rollout_id, r.group_id, OK, r.events, index_in_group=r.index_in_group)
        for r in both
    ]
    assert advantages(poisoned, cfg())["g0-0"] != pytest.approx(got["g0-0"], rel=1e-3)


def test_step_advantages_and_dynamic_sampling_see_only_valid_rollouts() -> None:
    base = {
        "data": {"train_batch_size": 1},
        "actor_rollout_ref": {"rollout": {"n": 8}, "actor": {"ppo_mini_batch_size": 1}},
    }
    step = load_core_config(
        {**base, "agentlightning": {"advantage_mode": "step", "trace_aggregator": {"level": "transition"}}}
    )
    assert advantages(group_of_8(), step) == approx(advantages(valid_only(group_of_8()), step))
    # DAPO: the infrastructure's zeros would have given an all-ones group its signal
    ones = [rollout("g0", i, 1.0, outcome=Out.OK) for i in range(5)] + group_of_8()[5:]
    dapo = load_core_config({**base, "algorithm": {"filter_groups": {"enable": True}}})
    batch = build_training_batch(ones, dapo)
    assert batch.rows == [] and batch.metrics["training/n_groups_filtered/same_reward"] == 1


# --- bad input: refused at start-up, naming it --------------------------------------------------


@pytest.mark.parametrize(
    ("outcomes", "named"),
    [
        ({"vanished": "drop"}, r"agentlightning\.outcomes\.vanished: not an outcome with a policy"),
        (
            {"pod_lost": "reward"},
            r"agentlightning\.outcomes\.pod_lost: pod_lost is an infrastructure failure",
        ),
        ({"ok": "drop"}, r"agentlightning\.outcomes\.ok: ok rollouts are trained as they are"),
        (
            {"agent_error": "retrain"},
            r"agentlightning\.outcomes\.agent_error\.action: unknown action 'retrain'",
        ),
        (
            {"agent_error": {"action": "drop", "reward": 0}},
            r"agent_error\.reward applies to action=reward only",
        ),
        ({"no_reward": {"action": "reward"}}, r"no_reward\.reward: action=reward needs a finite number"),
        (
            {"no_reward": {"action": "fail", "max_share": 2}},
            r"no_reward\.max_share must be a number in \[0, 1\)",
        ),
        ({"no_reward": {"action": "drop", "why": 1}}, r"no_reward\.why: not a key of an outcome's rule"),
        ({"min_group": 0}, r"agentlightning\.outcomes\.min_group must be an integer >= 1"),
    ],
)
def test_bad_rules_are_refused_naming_them(outcomes: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        parse_outcome_policy(outcomes, "drop")


def test_the_loop_refuses_a_bad_rule_before_anything_starts() -> None:
    cfg = {
        "data": {"train_batch_size": 1},
        "actor_rollout_ref": {"rollout": {"n": 2}},
        "agentlightning": {"outcomes": {"sandbox_lost": "keep"}},
    }
    settings = load_training_config(cfg)

    class NeverStarted:
        def __getattr__(self, name: str) -> Any:
            raise AssertionError(f"the backend was used ({name}) before the config was checked")

    with pytest.raises(ConfigError, match=r"agentlightning\.outcomes\.sandbox_lost"):
        TrainingLoop(cfg, settings, NeverStarted(), train_dataset=[{"q": 1}])


def test_a_validation_measures_the_policy_not_the_infrastructure() -> None:
    val = group_of_8()
    valid, counts = valid_for_validation(val)
    assert [r.rollout_id for r in valid] == [f"g0-{i}" for i in range(5)]
    assert counts["val/outcome/model_unavailable"] == 1 and counts["val/outcome/ok"] == 3
    # 1, 0, 1 and two fills of 0 over 5, not over 8 with the 503's 0 and two more fills
    assert validation_metrics(valid)["val/reward"] == pytest.approx(2 / 5)
    assert validation_metrics(val)["val/reward"] == pytest.approx(2 / 8)
