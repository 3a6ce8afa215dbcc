"""Several policies in one run: each policy's view of a rollout, its batch, one publish for all."""

from __future__ import annotations

from typing import Any

import pytest

from agentlightning.config.schema import ConfigError
from agentlightning.rewards import call_rewards, last_reward
from agentlightning.schemas import RolloutState
from agentlightning.trainer.batch import build_training_batch
from agentlightning.trainer.collected import CollectedRollout
from agentlightning.trainer.config import load_core_config
from agentlightning.trainer.policies import policy_events, policy_view, prefixed
from agentlightning.trainer.publish import EndpointPublisher, update_together
from tests.trainer.test_publish import RecordingClient


def call(policy: str | None, version: int, prompt: list[int], response: list[int]) -> dict[str, Any]:
    server = {"model": policy, "version": version} if policy else None
    return {
        "event_type": "model_request",
        "data": {
            "prompt_token_ids": prompt,
            "response_token_ids": response,
            "response_log_probs": [-0.5] * len(response),
            "server": server,
        },
    }


def reward(value: float, **data: Any) -> dict[str, Any]:
    return {"event_type": "reward", "data": {"value": value, **data}}


def rollout(rid: str, group: str, events: list[dict[str, Any]]) -> CollectedRollout:
    return CollectedRollout(rid, group, RolloutState.SUCCEEDED, events)


def two_role_events(planner_reward: float, coder_reward: float) -> list[dict[str, Any]]:
    return [
        call("planner", 4, [1, 2], [3]),
        call("coder", 7, [9, 9, 3], [5, 6]),
        call(None, -1, [], []),  # no endpoint: served by no policy
        call("coder", 7, [9, 9, 3, 5, 6, 8], [4]),  # extends the coder's row
        reward(planner_reward, policy="planner"),
        reward(coder_reward, policy="coder"),
    ]


def test_a_policys_view_keeps_its_calls_and_its_reward() -> None:
    events = two_role_events(1.0, 0.0)
    planner = policy_events(events, "planner")
    assert [e["data"]["server"]["model"] for e in planner if e["event_type"] == "model_request"] == [
        "planner"
    ]
    assert last_reward(planner) == 1.0
    coder = policy_events(events, "coder")
    assert [e["data"]["response_token_ids"] for e in coder if e["event_type"] == "model_request"] == [
        [5, 6],
        [4],
    ]
    assert last_reward(coder) == 0.0
    assert policy_events(events, "other") == []


def test_a_shared_reward_goes_to_every_role_unless_the_role_has_its_own() -> None:
    shared = [call("planner", 0, [1], [2]), call("coder", 0, [3], [4]), reward(0.5)]
    assert last_reward(policy_events(shared, "planner")) == 0.5
    assert last_reward(policy_events(shared, "coder")) == 0.5
    mixed = [*shared, reward(1.0, policy="coder")]
    assert last_reward(policy_events(mixed, "coder")) == 1.0, "the role's own reward wins"
    assert last_reward(policy_events(mixed, "planner")) == 0.5


def test_a_call_reward_is_renumbered_among_the_policys_calls() -> None:
    events = [
        call("planner", 0, [1], [2]),
        call("coder", 0, [3], [4]),
        call("coder", 0, [3, 4, 5], [6]),
        reward(0.25, call_index=2),  # the rollout's third call: the coder's second
        reward(0.75, call_index=0, policy="coder"),  # names the coder but a planner call: nobody's
        reward(1.0),
    ]
    assert call_rewards(policy_events(events, "coder")) == {1: 0.25}
    assert call_rewards(policy_events(events, "planner")) == {}


def test_each_policy_trains_on_its_own_rows_advantages_and_versions() -> None:
    core = load_core_config(
        {
            "agentlightning": {"policies": {"planner": {}, "coder": {}}},
            "data": {"train_batch_size": 1},
            "actor_rollout_ref": {"rollout": {"n": 2}},
        }
    )
    rollouts = [
        rollout("r0", "g", two_role_events(planner_reward=1.0, coder_reward=0.0)),
        rollout("r1", "g", two_role_events(planner_reward=0.0, coder_reward=1.0)),
    ]
    planner = build_training_batch([policy_view(r, "planner") for r in rollouts], core, 1, policy_version=4)
    coder = build_training_batch([policy_view(r, "coder") for r in rollouts], core, 1, policy_version=7)
    assert [(r.rollout_id, r.response_ids, r.model_versions) for r in planner.rows] == [
        ("r0", [3], [4]),
        ("r1", [3], [4]),
    ]
    # The coder's two calls merge into one row; the planner's call is not in it.
    assert [(r.response_ids, r.response_mask) for r in coder.rows] == [([5, 6, 8, 4], [1, 1, 0, 1])] * 2
    assert [r.reward for r in planner.rows] == [1.0, 0.0] and [r.reward for r in coder.rows] == [0.0, 1.0]
    assert planner.rows[0].advantage > 0 > planner.rows[1].advantage
    assert coder.rows[0].advantage < 0 < coder.rows[1].advantage
    assert planner.metrics["training/staleness/max"] == 0 == coder.metrics["training/staleness/max"]
    assert planner.metrics["training/n_turns"] == 2 and coder.metrics["training/n_turns"] == 4  # two rollouts
    assert prefixed("coder", {"training/reward": 0.5}) == {"policy/coder/training/reward": 0.5}


def test_policies_config() -> None:
    core = load_core_config({"agentlightning": {"policies": {"planner": None, "coder": {"path": "demo"}}}})
    assert core.agl.policy_names == ["planner", "coder"]
    assert (core.agl.policy_path("planner"), core.agl.policy_path("coder")) == (None, "demo")
    assert load_core_config({}).agl.policy_names == ["policy"], "none declared: one, as v1.0"
    for bad, says in [
        ({"a b": {}}, "agentlightning.policies.a b: a policy name"),
        ({"a": {"pth": "x"}}, "agentlightning.policies.a.pth: not a key"),
        ({"a": {"path": ""}}, "agentlightning.policies.a.path must be"),
        ({"a": 3}, "agentlightning.policies.a must be a mapping"),
    ]:
        with pytest.raises(ConfigError, match=says):
            load_core_config({"agentlightning": {"policies": bad}})


def test_several_policies_publish_under_one_pause_each_with_its_version() -> None:
    client = RecordingClient(inflight=[0])
    planner = EndpointPublisher(client, "planner")  # type: ignore[arg-type]  # the recording double
    coder = EndpointPublisher(client, "coder")  # type: ignore[arg-type]
    planner.endpoints, planner.version = ["http://a:1/v1"], 2
    coder.endpoints, coder.version = ["http://b:1/v1"], 5
    update_together([(planner, lambda: client.calls.append(("publish",)), 3), (coder, lambda: None, 5)])
    assert [c[0] for c in client.calls] == ["pause", "state", "publish", "register", "register", "resume"]
    assert [c[1] for c in client.calls if c[0] == "register"] == [
        (("planner", "http://a:1/v1", 3),),
        (("coder", "http://b:1/v1", 5),),
    ]
    # New endpoints for one policy: the table is cleared once and both registered again.
    client.calls.clear()
    update_together([(planner, lambda: ["c:2"], 4), (coder, lambda: None, 5)])
    assert [c[0] for c in client.calls] == [
        "pause",
        "state",
        "delete_models",
        "register",
        "register",
        "resume",
    ]
    with pytest.raises(ValueError, match="older"):
        update_together([(coder, lambda: None, 4)])
