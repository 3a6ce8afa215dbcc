"""The ScienceWorld agent's own logic, without a JVM: reading the model's action, the options
from the environment (bad values refused with the variable's name), v1.0's variation split."""

from __future__ import annotations

import sys

import pytest

from tests.examples.stack import EXAMPLES

sys.path.insert(0, str(EXAMPLES / "science_world"))

from sw_agent import Episode, Options, parse_action
from sw_data import v1_split
from sw_env import ScienceWorldSession


@pytest.mark.parametrize(
    ("reply", "action"),
    [
        ("ACTION: open door to kitchen", "open door to kitchen"),
        ("I should look first.\nACTION: look around  ", "look around"),
        ("action: `focus on dove`", "focus on dove"),
        ("ACTION: go to hallway\nACTION: go to kitchen", "go to kitchen"),  # the last one counts
        ("ACTION: 0", "0"),  # a choice among numbered options
        ("open door to kitchen", None),
        ("ACTION:   ", None),
        ("", None),
        (None, None),
    ],
)
def test_parse_action(reply: str | None, action: str | None) -> None:
    assert parse_action(reply) == action


def test_a_long_action_is_cut() -> None:
    assert parse_action("ACTION: " + "x" * 1000) == "x" * 200


def test_options_defaults_are_v1s() -> None:
    options = Options.from_env({})
    assert (options.max_turns, options.env_step_limit, options.max_tokens) == (30, 100, 256)
    assert options.max_total_tokens == 4096 + 8192  # train_sw_agent.py's prompt + response lengths


def test_options_from_the_environment() -> None:
    options = Options.from_env(
        {
            "SCIENCE_WORLD_MAX_TURNS": "5",
            "SCIENCE_WORLD_MAX_TOTAL_TOKENS": "900",
            "SCIENCE_WORLD_JAVA_OPTIONS": "",
        }
    )
    assert (options.max_turns, options.max_total_tokens, options.java_options) == (5, 900, "")


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"SCIENCE_WORLD_MAX_TURNS": "many"}, "SCIENCE_WORLD_MAX_TURNS='many': expected an integer"),
        ({"SCIENCE_WORLD_MAX_TURNS": "0"}, "SCIENCE_WORLD_MAX_TURNS=0: must be at least 1"),
        ({"SCIENCE_WORLD_MAX_TOKENS": "-3"}, "SCIENCE_WORLD_MAX_TOKENS=-3: must be at least 1"),
    ],
)
def test_bad_options_are_refused_by_name(env: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Options.from_env(env)


@pytest.mark.parametrize(("score", "reward"), [(100, 1.0), (83, 0.83), (0, 0.0), (-100, 0.0)])
def test_reward_is_the_score_over_100_clipped(score: int, reward: float) -> None:
    assert Episode(score=score).reward == pytest.approx(reward)


def test_v1_split_keeps_the_last_fifth_of_each_tasks_variations_for_validation() -> None:
    train, val = v1_split({"boil": 30, "find-plant": 300, "mix": 3}, variations_per_task=50, val_fraction=0.2)
    assert (train["boil"], val["boil"]) == (list(range(24)), list(range(24, 30)))
    assert (train["find-plant"], val["find-plant"]) == (list(range(40)), list(range(40, 50)))
    assert (train["mix"], val["mix"]) == ([0, 1], [2])  # at least one for validation


def test_v1_split_refuses_a_task_left_without_training_variations() -> None:
    with pytest.raises(ValueError, match="none left for training"):
        v1_split({"one": 1}, variations_per_task=50, val_fraction=0.2)


def test_an_unknown_simplification_is_refused_before_a_jvm_starts() -> None:
    with pytest.raises(ValueError, match="unknown simplification 'hard'"):
        ScienceWorldSession("boil", 0, simplification="hard")
