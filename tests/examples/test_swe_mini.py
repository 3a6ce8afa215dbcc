"""mini-swe-agent, unchanged, end to end: Gateway + Controller + the scripted model speaking through
mini-swe-agent's own prompts and bash tool; every command in the bubblewrap sandbox; the hidden
tests decide the reward. Task solved -> 1, wrong fix -> 0; calls captured with token ids."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from agentlightning.sandbox import available
from agentlightning.testing.example_stack import REPO, example_stack
from agentlightning.testing.scripted_model import tool_call_text
from examples.swe.bank import make_task

pytestmark = pytest.mark.timeout(1200)  # two harness runs, each ~10 s of work, minutes on a loaded machine
SWE_PYTHON = REPO / ".venv-swe" / "bin" / "python"
SOLVED, WRONG = make_task(3, 0), make_task(4, 0)


def _need() -> None:
    missing = [
        m
        for m, ok in (("bubblewrap", available()), (".venv-swe (make swe-venv)", SWE_PYTHON.exists()))
        if not ok
    ]
    if missing:
        if os.environ.get("CI"):
            pytest.fail(f"required on CI: {missing}")
        pytest.skip(f"missing: {missing}")


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "\n".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content or ""


def swe_policy(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
    """A deterministic 'engineer': read the issue, apply a fix (the reference one, or a wrong edit for
    the WRONG task), run the visible tests, submit: one bash tool call per turn, as mini asks."""
    assert tools and tools[0]["function"]["name"] == "bash", tools
    task_text = _text(next(m["content"] for m in messages if m["role"] == "user"))
    task = SOLVED if SOLVED.problem_statement.splitlines()[0] in task_text else WRONG
    module = task.patch.splitlines()[0].split("a/", 1)[1]
    turn = sum(m["role"] == "tool" for m in messages)
    if turn == 0:
        command = f"cat ISSUE.md && grep -n 'def ' {module}"
    elif turn == 1 and task is SOLVED:
        command = f"patch -p1 <<'EOF'\n{task.patch}EOF"
    elif turn == 1:
        command = f"sed -i 's/return /return None or /' {module}"  # looks busy, fixes nothing
    elif turn == 2:
        command = "python -m pytest -q tests 2>&1 | tail -3"
    else:
        command = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
    # The WRONG task's turns start with reasoning text, as mini's prompt asks; the SOLVED task's do not.
    preface = f"Step {turn + 1}.\n" if task is WRONG else ""
    return preface + tool_call_text("bash", {"command": command})


def test_mini_swe_agent_solves_and_fails_through_gateway_and_controller(tmp_path: Path) -> None:
    _need()
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
