"""Failed rollouts and missing rewards said on the console (trainer/failures.py): the first
distinct messages with their counts, the exception of an agent that raised, a stop when every
rollout failed, a hint when no rollout reported a reward."""

from __future__ import annotations

import pytest

from agentlightning.schemas import RolloutState
from agentlightning.trainer.collected import CollectedRollout
from agentlightning.trainer.failures import AllRolloutsFailed, check_rollouts, failure_line, no_reward_line

RAISED = (
    "agent exited with code 1; last output:\nTraceback (most recent call last):\n"
    "  File \"agent.py\", line 3, in <module>\nModuleNotFoundError: No module named 'my_agnet'\n"
    "earlier attempts:\nattempt 1: agent exited with code 1"
)
REWARD = {"event_type": "reward", "data": {"value": 1.0}}


def rollout(
    n: int, failed: bool = False, message: str | None = None, reward: bool = True
) -> CollectedRollout:
    return CollectedRollout(
        rollout_id=f"r{n}",
        group_id="g",
        state=RolloutState.FAILED if failed else RolloutState.SUCCEEDED,
        events=[REWARD] if reward and not failed else [],
        error_message=message,
    )


def test_failures_are_counted_by_message_with_the_exception_of_an_agent_that_raised() -> None:
    rollouts = [
        rollout(0),
        rollout(1, True, RAISED),
        rollout(2, True, RAISED),
        rollout(3, True, "timed out after 600s"),
    ]
    line = failure_line(rollouts, "step 3")
    assert line == (
        'step 3: 3 of 4 rollouts failed: "agent exited with code 1; last output: … ModuleNotFoundError: '
        "No module named 'my_agnet'\" (×2); 'timed out after 600s'"
    )
    assert failure_line([rollout(0)], "step 3") is None
    assert "failed, no message recorded" in (failure_line([rollout(0, True)], "x") or "")


def test_more_distinct_messages_than_shown_are_counted() -> None:
    line = failure_line([rollout(i, True, f"error {i}") for i in range(5)], "v") or ""
    assert line.endswith("; and 3 other message(s)")


def test_every_rollout_failed_stops_the_run_unless_told_not_to() -> None:
    failed = [rollout(i, True, RAISED) for i in range(4)]
    with pytest.raises(AllRolloutsFailed, match=r"(?s)4 of 4 rollouts failed.*stop_when_all_rollouts_fail"):
        check_rollouts(failed, "step 1", stop_when_all_fail=True)
    lines = check_rollouts(failed, "step 1", stop_when_all_fail=False)
    assert len(lines) == 1 and lines[0].startswith("step 1: 4 of 4 rollouts failed")
    assert check_rollouts([], "step 1", stop_when_all_fail=True) == []


def test_no_reward_at_all_is_said_with_how_to_report_one() -> None:
    silent = [rollout(i, reward=False) for i in range(3)]
    line = no_reward_line(silent, "step 0 validation") or ""
    assert line.startswith("step 0 validation: none of the 3 finished rollouts reported a reward")
    assert "Authorization: Bearer $AGL_KEY" in line
    assert no_reward_line([*silent, rollout(9)], "x") is None  # one reward: rewards do arrive
    assert no_reward_line([rollout(0, True, "boom")], "x") is None  # failures are said by failure_line
