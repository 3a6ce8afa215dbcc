"""What the proxy rewrites, and where it routes."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from agentlightning.schemas import Model
from agentlightning.server.config import DefaultProxyConfig, ModeConfig
from agentlightning.server.proxy.rewrite import pick_endpoint, rewrite, served_model, wants_usage_chunk

CONFIG = DefaultProxyConfig(model_name="policy", train=ModeConfig(0.7), val=ModeConfig(0.0))


def test_train_chat_sets_model_temperature_token_ids_and_logprobs() -> None:
    body = {"model": "gpt-4o", "temperature": 0.1, "messages": []}
    assert rewrite(body, "chat.completions", "train", CONFIG) == {
        "model": "policy",
        "temperature": 0.7,
        "return_token_ids": True,
        "logprobs": True,
    }
    assert body == {"model": "gpt-4o", "temperature": 0.1, "messages": []}, "the agent's body is kept as sent"


def test_val_mode_leaves_logprobs_alone() -> None:
    assert rewrite({"logprobs": False}, "chat.completions", "val", CONFIG) == {
        "model": "policy",
        "temperature": 0.0,
        "return_token_ids": True,
    }


def test_no_logprobs_when_not_configured() -> None:
    config = DefaultProxyConfig(include_log_probs=False)
    assert "logprobs" not in rewrite({}, "chat.completions", "train", config)


@pytest.mark.parametrize(("asked", "sent"), [(None, 1), (True, 1), (-1, 1), (0, None), (5, None)])
def test_completions_logprobs_is_a_count(asked: Any, sent: Any) -> None:
    body = {} if asked is None else {"logprobs": asked}
    params = rewrite(body, "completions", "train", CONFIG)
    assert params.get("logprobs") == sent  # None: the agent's own count stays


def test_streams_ask_for_usage_keeping_the_agents_options() -> None:
    body = {"stream": True, "stream_options": {"continuous_usage_stats": True}}
    assert rewrite(body, "chat.completions", "train", CONFIG)["stream_options"] == {
        "continuous_usage_stats": True,
        "include_usage": True,
    }
    assert not wants_usage_chunk(body)
    assert wants_usage_chunk({"stream": True, "stream_options": {"include_usage": True}})
    assert "stream_options" not in rewrite({"stream": False}, "chat.completions", "train", CONFIG)


def test_sticky_pick_is_sha256_over_sorted_endpoints() -> None:
    endpoints = [Model(model="policy", endpoint=f"http://h{i}:8000/v1") for i in range(5)]
    assert pick_endpoint([], "r1") is None
    for rollout_id in ("r1", "r2", "rollout-ä", "x" * 256):
        index = int.from_bytes(hashlib.sha256(rollout_id.encode()).digest()[:8], "big") % 5
        assert pick_endpoint(endpoints, rollout_id) is endpoints[index]
    picks = {pick_endpoint(endpoints, f"r{i}").endpoint for i in range(200)}  # type: ignore[union-attr]
    assert len(picks) == 5, "rollouts spread over every server"


def test_served_model_is_the_named_policy_when_registered() -> None:
    registered = {"planner", "coder"}.__contains__
    assert served_model({"model": "planner"}, CONFIG, registered) == "planner"
    assert served_model({"model": "gpt-4o"}, CONFIG, registered) == "policy", "unknown names: as v1.0"
    assert served_model({"model": 3}, CONFIG, registered) == "policy"
    assert served_model({}, CONFIG, registered) == "policy"
    assert rewrite({"model": "planner"}, "chat.completions", "val", CONFIG, "planner")["model"] == "planner"
