from __future__ import annotations

import struct
from pathlib import Path

import pytest

from agentlightning.aggregation import AggregationLevel
from agentlightning.config.schema import ConfigError
from agentlightning.rewards import last_reward, reward_value, to_float32
from agentlightning.trainer.config import (
    AdvEstimator,
    FailedRolloutPolicy,
    core_config_keys,
    load_core_config,
)
from tests.trainer.scripts import call_event, reward_event

# --- rewards -------------------------------------------------------------------------------


def test_last_reward_event_wins():
    events = [reward_event(0.1), call_event([1], [2], None, 0), reward_event(0.75)]
    assert last_reward(events) == 0.75


def test_no_reward_is_none():
    assert last_reward([call_event([1], [2], None, 0)]) is None
    assert last_reward([]) is None


def test_rewards_are_float32_not_bfloat16():
    value = last_reward([reward_event(0.7)])
    assert value is not None
    assert value == struct.unpack("<f", struct.pack("<f", 0.7))[0]
    assert value != 0.69921875  # what a bfloat16 round trip (v1.0) gives
    assert abs(value - 0.7) < 1e-7


@pytest.mark.parametrize("bad", [True, "1.0", None, float("nan"), float("inf"), 1e39, [1.0]])
def test_unusable_reward_values_are_ignored(bad):
    assert reward_value({"value": bad}) is None
    assert last_reward([reward_event(0.5), reward_event(bad)]) == 0.5


def test_integer_reward_is_accepted():
    assert last_reward([reward_event(1)]) == 1.0
    assert to_float32(1.0) == 1.0


# --- config --------------------------------------------------------------------------------


def test_defaults():
    c = load_core_config({})
    assert c.train_batch_size == 8 and c.rollout_n == 4 and c.ppo_mini_batch_size == 8
    assert c.adv_estimator == AdvEstimator.GRPO and c.norm_adv_by_std_in_grpo
    assert c.agl.trace_aggregator.level == AggregationLevel.TRAJECTORY
    assert c.agl.failed_rollouts == FailedRolloutPolicy.DROP
    assert c.prompt_limit is None and c.response_limit is None


def test_verl_style_config_is_read():
    c = load_core_config(
        {
            "data": {"train_batch_size": 16, "max_prompt_length": 100, "max_response_length": 200},
            "actor_rollout_ref": {
                "rollout": {"n": 8, "val_kwargs": {"n": 2}},
                "actor": {"ppo_mini_batch_size": 4},
            },
            "algorithm": {"adv_estimator": "rloo", "norm_adv_by_std_in_grpo": False},
            "agentlightning": {
                "trace_aggregator": {"level": "transition"},
                "failed_rollouts": "train",
                "max_ppo_update_times": 2,
            },
            "trainer": {"total_epochs": 3},  # a backend's keys elsewhere are none of the core's business
        }
    )
    assert (c.train_batch_size, c.rollout_n, c.val_rollout_n, c.ppo_mini_batch_size) == (16, 8, 2, 4)
    assert c.adv_estimator == AdvEstimator.RLOO and not c.norm_adv_by_std_in_grpo
    assert c.agl.trace_aggregator.level == AggregationLevel.TRANSITION
    assert c.agl.failed_rollouts == FailedRolloutPolicy.TRAIN and c.agl.max_ppo_update_times == 2
    assert (c.prompt_limit, c.response_limit) == (100, 200)


def test_trajectory_limits_fall_back_to_the_data_limits():
    base = {"data": {"max_prompt_length": 100, "max_response_length": 200}}
    assert (load_core_config(base).prompt_limit, load_core_config(base).response_limit) == (100, 200)
    c = load_core_config(
        {**base, "agentlightning": {"trace_aggregator": {"trajectory_max_response_length": 4096}}}
    )
    assert (c.prompt_limit, c.response_limit) == (100, 4096)


@pytest.mark.parametrize(
    ("cfg", "key"),
    [
        ({"agentlightning": {"trace_aggregator": {"levl": "x"}}}, "agentlightning.trace_aggregator.levl"),
        ({"agentlightning": {"trace_aggregator": {"level": "x"}}}, "agentlightning.trace_aggregator.level"),
        ({"agentlightning": {"rollout_timeout_seconds": "abc"}}, "agentlightning.rollout_timeout_seconds"),
        ({"agentlightning": {"rollout_timeout_seconds": 0}}, "agentlightning.rollout_timeout_seconds"),
        ({"agentlightning": {"reward_filna_value": 1}}, "agentlightning.reward_filna_value"),
        ({"agentlightning": {"failed_rollouts": "keep"}}, "agentlightning.failed_rollouts"),
        ({"agentlightning": {"max_ppo_update_times": 0}}, "agentlightning.max_ppo_update_times"),
        ({"agentlightning": {"fetch_concurrency": 0}}, "agentlightning.fetch_concurrency"),
        ({"agentlightning": {"model_name": ""}}, "agentlightning.model_name"),
        ({"agentlightning": 3}, "agentlightning"),
        ({"data": {"train_batch_size": 0}}, "data.train_batch_size"),
        ({"data": {"max_prompt_length": "long"}}, "data.max_prompt_length"),
        ({"actor_rollout_ref": {"rollout": {"n": 0}}}, "actor_rollout_ref.rollout.n"),
        ({"algorithm": {"adv_estimator": "gae"}}, "algorithm.adv_estimator"),
        ({"algorithm": {"norm_adv_by_std_in_grpo": "yes"}}, "algorithm.norm_adv_by_std_in_grpo"),
        (
            {"agentlightning": {"async_rollout": {"enabled": True, "async_train_batch_size": 8}}},
            "agentlightning.async_rollout.async_train_batch_size",
        ),
    ],
)
def test_bad_settings_fail_naming_the_key(cfg, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_core_config(cfg)


def test_backend_keys_in_the_agentlightning_block_are_left_to_the_backend():
    with pytest.raises(ConfigError):
        load_core_config({"agentlightning": {"demo": {"steps": 3}}})
    c = load_core_config({"agentlightning": {"demo": {"steps": 3}, "seed": 5}}, backend_keys={"demo"})
    assert c.agl.seed == 5


def test_job_template_is_read_from_its_path(tmp_path: Path):
    template = tmp_path / "job.yaml.j2"
    template.write_text("kind: Job\n")
    c = load_core_config({"agentlightning": {"k8s": {"job_template_path": str(template)}}})
    assert c.job_template() == "kind: Job\n"
    missing = load_core_config({"agentlightning": {"k8s": {"job_template_path": str(tmp_path / "nope")}}})
    with pytest.raises(ConfigError, match="job_template_path"):
        missing.job_template()


def test_every_key_is_listed():
    keys = core_config_keys()
    assert "agentlightning.trace_aggregator.trajectory_max_prompt_length" in keys
    assert "agentlightning.async_rollout.async_train_batch_size" in keys
    assert "actor_rollout_ref.actor.ppo_mini_batch_size" in keys
    assert len(keys) == len(set(keys))
