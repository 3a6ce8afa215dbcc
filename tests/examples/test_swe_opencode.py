"""opencode (npm `opencode-ai`, MIT), unchanged, end to end over the Anthropic Messages API: Gateway +
Controller + the scripted model speaking through opencode's own prompts and its `bash` tool; the whole
opencode process in the bubblewrap sandbox, reaching only the Gateway; the hidden tests decide the
reward. Task solved -> 1, wrong fix -> 0; calls captured with token ids."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from agentlightning.sandbox import available
from agentlightning.testing.example_stack import REPO, example_stack
from agentlightning.testing.scripted_model import tool_call_text
from examples.swe.bank import make_task
from examples.swe.opencode_agent import npm_prefix

pytestmark = pytest.mark.timeout(1200)  # two harness runs, seconds of work each, minutes on a loaded machine
SWE_PYTHON = REPO / ".venv-swe" / "bin" / "python"
OPENCODE = npm_prefix() / "node_modules" / ".bin" / "opencode"
SOLVED, WRONG = make_task(3, 0), make_task(4, 0)


def _need() -> None:
    missing = [
        m
        for m, ok in (
            ("bubblewrap", available()),
            (".venv-swe (make swe-venv)", SWE_PYTHON.exists()),
            (".npm-opencode (make opencode)", OPENCODE.exists()),
        )
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


def opencode_policy(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
    """A deterministic 'engineer' using opencode's `bash` tool: read the issue, apply a fix (the
    reference one, or a wrong edit for the WRONG task), run the visible tests, then answer in text,
    which ends `opencode run`."""
    names = [t["function"]["name"] for t in tools or []]
    assert "bash" in names, names
    users = "\n".join(_text(m["content"]) for m in messages if m["role"] == "user")
    task = SOLVED if SOLVED.problem_statement.splitlines()[0] in users else WRONG
    module = task.patch.splitlines()[0].split("a/", 1)[1]
    turn = sum(m["role"] == "tool" for m in messages)
    if turn == 0:
        command = f"cat ISSUE.md && grep -n 'def ' {module}"
        if task is WRONG:  # the sandbox: the repository (and the task generator) is not there
            command += f"; ls {REPO / 'examples' / 'swe'} 2>&1 | tail -1"
    elif turn == 1 and task is SOLVED:
        command = f"patch -p1 <<'EOF'\n{task.patch}EOF"
    elif turn == 1:
        command = f"sed -i 's/return /return None or /' {module}"  # looks busy, fixes nothing
    elif turn == 2:
        command = "python -m pytest -q tests 2>&1 | tail -3"
    else:
        return "The fix is in and the visible tests pass."
    # The WRONG task's turns start with a sentence before the call; the SOLVED task's do not.
    preface = f"Step {turn + 1}.\n" if task is WRONG else ""
    return preface + tool_call_text("bash", {"command": command})


def test_opencode_solves_and_fails_through_gateway_and_controller(tmp_path: Path) -> None:
    _need()
    with example_stack(
        opencode_policy,
        "swe",
        tmp_path,
        f"local_runner.python={SWE_PYTHON}",
        agent_env={"PYTHONPATH": str(REPO)},
    ) as stack:
        solved, wrong = stack.run(
            "examples.swe.opencode_agent:OpencodeSweAgent",
            {"TASK_ID": "input.task_id"},
            [{"task_id": SOLVED.instance_id}, {"task_id": WRONG.instance_id}],
            timeout=600,
        )
    for r in (solved, wrong):
        assert r.state == "succeeded", (r.error, r.log[-3000:])
        calls = r.model_requests
        assert len(calls) == 4, r.log[-3000:]  # read, edit, test, answer
        for call in calls:
            assert call["data"]["api"] == "anthropic.messages"
            assert call["data"]["http_status"] == 200
            assert call["data"]["response"]["prompt_token_ids"]
            assert call["data"]["response"]["choices"][0]["token_ids"]
        # opencode's own prompt reached the model, and its tool's results came back.
        assert "You are opencode" in r.prompt_text(0)
        assert "<tool_response>" in r.prompt_text(1)
    assert solved.rewards == [1.0] and wrong.rewards == [0.0]
    assert "passed" in solved.prompt_text(3)  # the visible tests ran inside the sandbox
    assert "No such file or directory" in wrong.prompt_text(1)  # the repository is not mounted
    # Bare tool calls: every call extends the previous prompt + answer token for token, one row.
    assert len(solved.rows) == 1, (solved.merge_break(), solved.stats)
    assert solved.rows[0].reward == 1.0
    # A sentence before each call: through the pass-through Gateway each turn re-renders differently
    # (the hermes parser keeps the newline before <tool_call>, the template adds its own): a row a call.
    assert len(wrong.rows) == 4 and all(row.reward == 0.0 for row in wrong.rows)
    assert "re-renders an earlier model turn" in (wrong.merge_break() or "")


def test_opencode_one_row_through_the_token_exact_gateway(tmp_path: Path) -> None:
    """The same wrong-fix rollout, served on token ids (vLLM's scale-out endpoints): the Gateway puts
    back the tokens the model wrote, so opencode's re-sent history extends the row: one row."""
    _need()
    with example_stack(
        opencode_policy,
        "swe",
        tmp_path,
        f"local_runner.python={SWE_PYTHON}",
        agent_env={"PYTHONPATH": str(REPO)},
        scale_out=True,
    ) as stack:
        (wrong,) = stack.run(
            "examples.swe.opencode_agent:OpencodeSweAgent",
            {"TASK_ID": "input.task_id"},
            [{"task_id": WRONG.instance_id}],
            timeout=600,
        )
    assert wrong.state == "succeeded", (wrong.error, wrong.log[-3000:])
    calls = wrong.model_requests
    assert len(calls) == 4 and wrong.rewards == [0.0], wrong.log[-3000:]
    assert calls[0]["data"]["segment"].get("first") is True
    assert all(c["data"]["segment"].get("continues") is True for c in calls[1:]), [
        c["data"]["segment"] for c in calls
    ]
    assert len(wrong.rows) == 1, (wrong.merge_break(), wrong.stats)
