"""The two-role demo (`agl-demo roles=true`, docs/policies.md): each role's reward, how the agent
reports them, and the warm-up's wrong answers (none by default: the one-policy demo's
demonstrations unchanged)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from agentlightning.client import GatewayClient
from agentlightning.demo import roles
from agentlightning.demo.roles import PLANNER, WRITER, TwoRoleAgent, role_rewards
from agentlightning.demo.warmup import demonstration


def test_each_role_is_rewarded_for_its_own_job() -> None:
    # Right operation, answer reported: everyone's right.
    assert role_rewards("14", "The answer is 14.", 14) == {None: 1.0, PLANNER: 1.0, WRITER: 1.0}
    # Wrong operation, but the writer reported the tool's result: the writer did its job.
    assert role_rewards("9", "The answer is 9.", 14) == {None: 0.0, PLANNER: 0.0, WRITER: 1.0}
    # Right operation, the writer said another number.
    assert role_rewards("14", "The answer is 7.", 14) == {None: 0.0, PLANNER: 1.0, WRITER: 0.0}
    # No tool call (the planner answered itself), or a tool error: the writer had nothing to report.
    assert role_rewards(None, "14", 14) == {None: 1.0, PLANNER: 0.0, WRITER: 0.0}
    assert role_rewards("error: ValueError", None, 14) == {None: 0.0, PLANNER: 0.0, WRITER: 0.0}
    assert role_rewards("-2", "it is -2", -2)[WRITER] == 1.0


def test_the_agent_posts_the_shared_reward_and_each_roles_own(
    gateway: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Against a real Gateway, the conversation itself stubbed: the planner's tool computed 9 (a
    wrong operation), the writer reported it."""

    async def conversation(client: Any, question: str) -> tuple[str | None, str | None]:
        return "9", "The answer is 9."

    monkeypatch.setattr(roles, "solve_in_two_roles", conversation)
    client = GatewayClient(gateway.url, key=gateway.key)
    (rollout,) = client.create_rollouts([{"input": {"question": "q", "answer": 14}, "rollout_id": "r1"}])
    monkeypatch.setenv("AGL_OPENAI_BASE_URL", "http://127.0.0.1:9/v1")  # not called
    monkeypatch.setenv("AGL_EVENT_URL", f"{gateway.url}/api/rollouts/r1/attempt/a1/events")
    monkeypatch.setenv("AGL_KEY", gateway.key)
    monkeypatch.setenv("QUESTION", "q")
    monkeypatch.setenv("ANSWER", "14")
    TwoRoleAgent().run()
    events = client.get_events(rollout.rollout_id)
    client.close()
    assert [(e.event_type, e.data.get("policy"), e.data["value"]) for e in events] == [
        ("reward", None, 0.0),
        ("reward", PLANNER, 0.0),
        ("reward", WRITER, 1.0),
    ]
    assert all(e.data["source"] == "demo-roles" for e in events)


def test_wrong_answers_in_the_warm_up_only_when_asked() -> None:
    def draws(*args: float) -> list[tuple[str, str, str, str]]:
        rng = random.Random(3)
        return [demonstration(rng, *args) for _ in range(20)]

    assert draws() == draws(0.35, 0.0), "the default draws nothing more: the one-policy demo is unchanged"
    for question, _, _, answer in draws(1.0, 1.0):
        x = next(w for w in question.split() if w.isdigit())
        assert answer == f"The answer is {x}.<|im_end|>"
