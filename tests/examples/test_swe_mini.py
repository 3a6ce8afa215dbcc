"""mini-swe-agent, unchanged, end to end: Gateway + Controller + the scripted model speaking through
mini-swe-agent's own prompts and bash tool; every command in the bubblewrap sandbox; the hidden
tests decide the reward. Task solved -> 1, wrong fix -> 0; calls captured with token ids."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agentlightning.sandbox import available
from tests.examples.stack import REPO, example_stack
from tests.examples.swe_engineer import SOLVED, SWE_PYTHON, WRONG, command, preface, task_of
from tests.fakes.scripted_model import tool_call_text
from tests.heavy import require

pytestmark = pytest.mark.timeout(1200)  # two harness runs, each ~10 s of work, minutes on a loaded machine


def swe_policy(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
    """The engineer (swe_engineer.py) through mini's bash tool; it submits after the tests."""
    assert tools and tools[0]["function"]["name"] == "bash", tools
    task = task_of(messages)
    turn = sum(m["role"] == "tool" for m in messages)
    shell = command(task, turn) or "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
    return preface(task, turn) + tool_call_text("bash", {"command": shell})


def test_mini_swe_agent_solves_and_fails_through_gateway_and_controller(tmp_path: Path) -> None:
    require(
        [
            m
            for m, ok in (("bubblewrap", available()), (".venv-swe (make swe-venv)", SWE_PYTHON.exists()))
            if not ok
        ]
    )
    with example_stack(
        swe_policy,
        "swe",
        tmp_path,
        f"local_runner.python={SWE_PYTHON}",
        agent_env={"PYTHONPATH": str(REPO), "SWE_STEP_LIMIT": "8"},
    ) as stack:
        solved, wrong = stack.run(
            "examples.swe.mini_agent:MiniSweAgent",
            {"TASK_ID": "input.task_id"},
            [{"task_id": SOLVED.instance_id}, {"task_id": WRONG.instance_id}],
            timeout=600,
        )
    for r in (solved, wrong):
        assert r.state == "succeeded", (r.error, r.log[-3000:])
        calls = r.model_requests
        assert len(calls) == 4, r.log[-3000:]  # read, edit, test, submit
        for call in calls:
            assert call["data"]["response"]["prompt_token_ids"]
            assert call["data"]["response"]["choices"][0]["token_ids"]
        # mini-swe-agent's own prompt reached the model, and the tool results came back.
        assert "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT" in r.prompt_text(0)
        assert "returncode" in r.prompt_text(3)
    assert solved.rewards == [1.0] and wrong.rewards == [0.0]
    assert "passed" in solved.prompt_text(3)  # the visible tests ran inside the sandbox
    # Bare tool calls: the four calls extend one another token for token, one training row.
    assert len(solved.rows) == 1, (solved.merge_break(), solved.stats)
    assert solved.rows[0].reward == 1.0
    # Reasoning text before the call: the hermes parser keeps its trailing newline in `content`, so
    # the template re-renders "text\n" + "\n<tool_call>" and every turn starts a new segment
    # (through the pass-through Gateway).
    assert len(wrong.rows) == 4 and all(row.reward == 0.0 for row in wrong.rows)
    assert "re-renders an earlier model turn" in (wrong.merge_break() or "")
