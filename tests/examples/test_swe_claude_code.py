"""Claude Code (npm `@anthropic-ai/claude-code`, pinned), unchanged, end to end: Gateway + Controller +
the scripted engineer speaking through Claude Code's own system prompt and `Bash` tool over the
Anthropic Messages route; the whole CLI process in the bubblewrap sandbox, reaching only the Gateway;
the hidden tests decide the reward. On the token-exact Gateway (vLLM's scale-out endpoints) the
solved rollout's tool loop is one training row; a wrong fix gives 0."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agentlightning.sandbox import available
from examples.swe import claude_agent
from tests.examples.stack import REPO, example_stack
from tests.examples.swe_engineer import SOLVED, SWE_PYTHON, WRONG, command, message_text, task_of
from tests.fakes.scripted_model import tool_call_text
from tests.heavy import require

pytestmark = [pytest.mark.process, pytest.mark.timeout(900)]
BINARY = claude_agent.npm_prefix() / "node_modules" / ".bin" / "claude"
AGENT = "examples.swe.claude_agent:ClaudeSweAgent"
SYSTEM_MARKER = "built on Anthropic's Claude Agent SDK"  # Claude Code's own system prompt (print mode)
MAX_TOKENS = 3000  # SWE_CLAUDE_MAX_OUTPUT_TOKENS: what a small served context leaves for the answer
AGENT_ENV = {"PYTHONPATH": str(REPO), "SWE_CLAUDE_MAX_OUTPUT_TOKENS": str(MAX_TOKENS)}


@pytest.fixture(autouse=True)
def _claude_code() -> None:
    require_claude_code()


def require_claude_code() -> None:
    """Skips (fails on CI) without what Claude Code runs on here."""
    require(
        [
            m
            for m, ok in (
                ("bubblewrap", available()),
                (".venv-swe (make swe-venv)", SWE_PYTHON.exists()),
                (".npm-claude (make claude)", BINARY.exists()),
            )
            if not ok
        ]
    )


def engineer() -> Callable[[list[dict[str, Any]], list[dict[str, Any]] | None], str]:
    """Read the issue, apply a fix (the reference one, or a wrong edit for WRONG), run the visible
    tests, each a bare call of Claude Code's `Bash` tool; then answer in text, which ends its run."""

    def policy(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
        names = [t["function"]["name"] for t in tools or []]
        assert "Bash" in names, names
        turn = sum(m["role"] == "tool" for m in messages)
        shell = command(task_of(messages), turn)
        if shell is None:
            return "The fix is in and the visible tests pass."
        return tool_call_text("Bash", {"command": shell, "description": f"step {turn + 1}"})

    return policy


def _run(tmp_path: Path, tasks: list[Any]) -> list[Any]:
    with example_stack(
        engineer(),
        "swe",
        tmp_path,
        f"local_runner.python={SWE_PYTHON}",
        agent_env=AGENT_ENV,
        scale_out=True,
    ) as stack:
        return stack.run(
            AGENT, {"TASK_ID": "input.task_id"}, [{"task_id": t.instance_id} for t in tasks], timeout=600
        )


def test_claude_code_solves_in_one_row_and_a_wrong_fix_gets_zero(tmp_path: Path) -> None:
    solved, wrong = _run(tmp_path, [SOLVED, WRONG])
    for r in (solved, wrong):
        assert r.state == "succeeded", (r.error, r.log[-3000:])
        calls = r.model_requests
        answers = [(c["data"]["http_status"], c["data"].get("error")) for c in calls]
        assert len(calls) == 4, (answers, r.log[-3000:])  # read, fix, test, answer
        for call in calls:
            assert call["data"]["api"] == "anthropic.messages"
            assert call["data"]["http_status"] == 200
            assert call["data"]["response"]["prompt_token_ids"]
            assert call["data"]["response"]["choices"][0]["token_ids"]
    assert solved.rewards == [1.0] and wrong.rewards == [0.0]
    assert "passed" in solved.prompt_text(3)  # the visible tests ran inside the sandbox
    # Token-exact: every call extends the previous prompt + answer token for token: one row.
    segments = [c["data"]["segment"] for c in solved.model_requests]
    assert segments[0].get("first") and all(s.get("continues") for s in segments[1:]), segments
    assert len(solved.rows) == 1, (solved.merge_break(), solved.stats)
    assert solved.rows[0].reward == 1.0 and solved.rows[0].n_calls == 4
    assert all(row.reward == 0.0 for row in wrong.rows)


def test_claude_codes_own_prompt_and_tools_reach_the_model(tmp_path: Path) -> None:
    (wrong,) = _run(tmp_path, [WRONG])
    assert wrong.state == "succeeded" and wrong.rewards == [0.0], (wrong.error, wrong.log[-3000:])
    assert wrong.model_requests, wrong.log[-3000:]
    request = wrong.model_requests[0]["data"]["request"]
    system = request["system"]
    system_text = system if isinstance(system, str) else message_text(system)
    assert SYSTEM_MARKER in system_text and len(system_text) > 2000, system_text[:500]
    names = {t["name"] for t in request["tools"]}
    assert {"Bash", "Read", "Edit", "Write"} <= names, names
    assert len(request["tools"]) >= 8 and all(t.get("input_schema") for t in request["tools"])
    assert SYSTEM_MARKER in wrong.prompt_text(0)  # rendered into the tokens the model saw
    # Its environment comes as a `system` message after the task: kept in place, not refused.
    assert any(m["role"] == "system" for m in request["messages"][1:]), [
        m["role"] for m in request["messages"]
    ]
    assert "Primary working directory: /workspace" in wrong.prompt_text(0)
    print(f"claude code: {len(system_text)} chars of system prompt, {len(request['tools'])} tools")
    # Claude Code asks for 32000 tokens of every model; the harness asks for what the context leaves.
    assert all(c["data"]["request"]["max_tokens"] == MAX_TOKENS for c in wrong.model_requests)
