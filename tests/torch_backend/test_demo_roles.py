"""The two-role demo (`agl-demo roles=true`, docs/policies.md): each role's reward, and the
warm-up's wrong answers (none by default: the one-policy demo's demonstrations unchanged)."""

from __future__ import annotations

import random

from agentlightning.demo.roles import PLANNER, WRITER, role_rewards
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


def test_wrong_answers_in_the_warm_up_only_when_asked() -> None:
    def draws(*args: float) -> list[tuple[str, str, str, str]]:
        rng = random.Random(3)
        return [demonstration(rng, *args) for _ in range(20)]

    assert draws() == draws(0.35, 0.0), "the default draws nothing more: the one-policy demo is unchanged"
    for question, _, _, answer in draws(1.0, 1.0):
        x = next(w for w in question.split() if w.isdigit())
        assert answer == f"The answer is {x}.<|im_end|>"
