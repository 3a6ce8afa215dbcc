"""ScienceWorld end to end: the real agent (plain `openai` client) and the real simulator (a JVM
per rollout), started by a real Controller for rollouts on a real Gateway, against the scripted
model. The simulator scores every action sequence itself: the right one for a task scores 100
(reward 1), focusing on a non-living thing fails the task (-100, reward 0). The scripted model
tells the rollouts apart by the room each variation starts in."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.examples.stack import EXAMPLES, RolloutResult, Stack, example_stack

pytestmark = [
    pytest.mark.process,
    pytest.mark.timeout(900),
    pytest.mark.usefixtures("java"),
]  # JVMs on a busy 2-core machine

AGENT = "sw_agent:ScienceWorldAgent"
ENV_MAP = {
    "TASK_NAME": "input.task_name",
    "VARIATION_IDX": "input.variation_idx",
    "SIMPLIFICATION": "input.simplification",
    "SCIENCE_WORLD_MAX_TOTAL_TOKENS": "input.max_total_tokens",
}
# find-living-thing: "find a living thing, focus on it, move it to the <colour> box in the kitchen".
RIGHT = [
    "open door to outside",
    "go to outside",
    "focus on dove",
    "pick up dove",
    "go to kitchen",
    "move dove to blue box",
]
WRONG = ["focus on picture"]  # a picture is not alive: the simulator fails the task
SCRIPTS: dict[str, list[str]] = {
    "the kitchen": RIGHT,  # variation 2 starts in the kitchen
    "the hallway": WRONG,  # variation 0
    "the art studio": [],  # variation 1: look around until the turns run out
    "the workshop": [],  # variation 5: look around until the token budget runs out
}
HANG_ROOM = "the greenhouse"  # variation 6: the model never answers; the rollout times out
RELEASE = threading.Event()


def _room(messages: list[dict[str, Any]]) -> str:
    first = next(m["content"] for m in messages if m["role"] == "user")
    return (
        first.split("This room is called ", 1)[1].split(".", 1)[0] if "This room is called " in first else ""
    )


def policy(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
    room = _room(messages)
    if room == HANG_ROOM:
        RELEASE.wait(120)
    script = SCRIPTS.get(room, [])
    turn = sum(1 for m in messages if m["role"] == "assistant")
    action = script[turn] if turn < len(script) else "look around"
    return f"I will act now.\nACTION: {action}"


def _task(variation: int, max_total_tokens: int = 200_000) -> dict[str, Any]:
    return {
        "task_name": "find-living-thing",
        "variation_idx": variation,
        "simplification": "easy",
        "max_total_tokens": max_total_tokens,
    }


def _event(result: RolloutResult, event_type: str) -> dict[str, Any]:
    found = [e["data"] for e in result.events if e["event_type"] == event_type]
    assert len(found) == 1, (event_type, result.state, result.error, result.log[-3000:])
    return found[0]


def _jvm_alive(pid: int, ticks: int | None) -> bool:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()
    except OSError:
        return False
    return fields[0] not in "ZX" and (ticks is None or int(fields[19]) == ticks)


def _wait_jvm_gone(environment: dict[str, Any], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while _jvm_alive(environment["jvm_pid"], environment["jvm_start_ticks"]):
        if time.monotonic() > deadline:
            raise AssertionError(f"the JVM {environment['jvm_pid']} is still running")
        time.sleep(0.1)


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory, examples_python: str):
    RELEASE.clear()
    with example_stack(policy, "science_world", tmp_path_factory.mktemp("science_world")) as stack:
        results = stack.run(AGENT, ENV_MAP, [_task(2), _task(0), _task(1), _task(5, max_total_tokens=3000)])
        yield stack, dict(zip(("right", "wrong", "thirty", "tokens"), results, strict=True))
        RELEASE.set()


def test_right_actions_score_one_wrong_actions_score_zero(
    ran: tuple[Stack, dict[str, RolloutResult]],
) -> None:
    _, results = ran
    right, wrong = results["right"], results["wrong"]
    for result in (right, wrong):
        assert result.state == "succeeded", f"{result.error}\n{result.log[-3000:]}"
    assert right.rewards == [1.0], right.log[-3000:]
    assert _event(right, "episode")["actions"] == RIGHT
    assert _event(right, "episode")["ended_by"] == "completed"
    assert wrong.rewards == [0.0], wrong.log[-3000:]
    assert _event(wrong, "episode")["actions"] == WRONG
    assert _event(wrong, "episode")["ended_by"] == "failed"
    assert _event(wrong, "episode")["score"] == -100


def test_every_call_recorded_with_token_ids_and_the_simulators_observations(
    ran: tuple[Stack, dict[str, RolloutResult]],
) -> None:
    _, results = ran
    right = results["right"]
    calls = [c["data"] for c in right.model_requests]
    assert len(calls) == len(RIGHT)
    for call in calls:
        assert call["response"]["prompt_token_ids"] and call["response"]["choices"][0]["token_ids"]
    first = right.prompt_text(0)
    assert "Your task is to find a(n) living thing" in first and "This room is called the kitchen" in first
    # what the simulator answered to each action is in the next prompt
    assert "You move to the outside." in right.prompt_text(2)
    assert "You focus on the dove egg." in right.prompt_text(3)
    assert "You move the dove to the inventory." in right.prompt_text(4)


def test_a_thirty_turn_rollout_runs_and_stays_one_row(ran: tuple[Stack, dict[str, RolloutResult]]) -> None:
    _, results = ran
    thirty = results["thirty"]
    assert thirty.state == "succeeded", f"{thirty.error}\n{thirty.log[-3000:]}"
    episode = _event(thirty, "episode")
    assert episode["turns"] == 30 and episode["env_steps"] == 30 and episode["ended_by"] == "max_turns"
    assert len(thirty.model_requests) == 30
    assert thirty.merge_break() is None
    (row,) = thirty.rows
    assert row.n_calls == 30
    assert sum(row.response_mask) == sum(
        len(c["data"]["response"]["choices"][0]["token_ids"]) for c in thirty.model_requests
    )
    assert thirty.rewards == [episode["score"] / 100] and episode["score"] < 100  # no progress past the start


def test_the_token_budget_ends_the_episode(ran: tuple[Stack, dict[str, RolloutResult]]) -> None:
    _, results = ran
    tokens = results["tokens"]
    assert tokens.state == "succeeded", f"{tokens.error}\n{tokens.log[-3000:]}"
    episode = _event(tokens, "episode")
    assert episode["ended_by"] == "token_limit" and episode["turns"] < 30
    last = tokens.model_requests[-1]["data"]["response"]["usage"]["total_tokens"]
    before = tokens.model_requests[-2]["data"]["response"]["usage"]["total_tokens"]
    assert before < 3000 <= last


def test_every_jvm_is_gone_after_its_rollout(ran: tuple[Stack, dict[str, RolloutResult]]) -> None:
    _, results = ran
    pids = set()
    for result in results.values():
        environment = _event(result, "environment")
        pids.add(environment["jvm_pid"])
        _wait_jvm_gone(environment, timeout=5)
    assert len(pids) == len(results)  # one JVM per rollout


def test_a_timed_out_rollouts_jvm_is_gone(ran: tuple[Stack, dict[str, RolloutResult]]) -> None:
    """The model never answers: the Controller kills the agent at the rollout's timeout, and its
    JVM goes with the agent's process group."""
    stack, _ = ran
    (hung,) = stack.run(AGENT, ENV_MAP, [_task(6)], timeout=45)
    RELEASE.set()
    assert hung.state == "failed"
    assert not hung.rewards
    _wait_jvm_gone(_event(hung, "environment"))


def test_the_jvm_dies_with_its_agent_process_alone(tmp_path: Path, examples_python: str) -> None:
    """SIGKILL to the agent's process only (not its group): the JVM notices its stdin close and exits."""
    code = (
        "import json, sys, time\n"
        "from sw_env import ScienceWorldSession\n"
        "s = ScienceWorldSession('find-living-thing', 0).start()\n"
        "print(json.dumps({'jvm_pid': s.jvm_pid, 'jvm_start_ticks': s.jvm_ticks}), flush=True)\n"
        "time.sleep(600)\n"
    )
    proc = subprocess.Popen(
        [examples_python, "-c", code],
        cwd=EXAMPLES / "science_world",
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        environment = json.loads(proc.stdout.readline())
        assert _jvm_alive(environment["jvm_pid"], environment["jvm_start_ticks"])
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        _wait_jvm_gone(environment)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
