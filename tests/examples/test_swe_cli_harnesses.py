"""The coding CLIs, unchanged, end to end: Gateway + Controller + the scripted model speaking
through each CLI's own prompts and shell tool — Codex CLI (npm `@openai/codex`, its `exec_command`
tool over the Responses route) and opencode (npm `opencode-ai`, its `bash` tool over the Anthropic
Messages route); the whole CLI process in the bubblewrap sandbox, reaching only the Gateway; the
hidden tests decide the reward. Task solved -> 1, wrong fix -> 0; calls captured with token ids."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from agentlightning.sandbox import available
from examples.swe import codex_agent, opencode_agent
from tests.examples.stack import REPO, example_stack
from tests.examples.swe_engineer import SOLVED, SWE_PYTHON, WRONG, command, message_text, preface, task_of
from tests.fakes.scripted_model import tool_call_text
from tests.heavy import require

pytestmark = pytest.mark.timeout(1200)  # two harness runs, seconds of work each, minutes on a loaded machine
RUNNING = re.compile(r"Process running with session ID (\d+)")  # Codex: a command outlasted its wait
COMPACTION = "CONTEXT CHECKPOINT COMPACTION"  # Codex's request for a summary of the history
SUMMARY = "Summary for the next model: "


def done_before(messages: list[dict[str, Any]]) -> int:
    """The steps a summary in the history says were done before it (0 without one)."""
    found = [re.search(rf"{SUMMARY}(\d+) steps", message_text(m["content"])) for m in messages]
    return max((int(m.group(1)) for m in found if m), default=0)


@dataclass(frozen=True)
class Harness:
    name: str
    binary: Path
    make_target: str
    agent: str  # the rollout agent class that runs the CLI in the sandbox
    api: str  # what the Gateway records as the call's API
    shell: Callable[[str], tuple[str, dict[str, Any]]]  # command -> the CLI's shell tool call
    system_marker: str  # in the CLI's own system prompt
    result_marker: str  # in the prompt once the tool's result came back


HARNESSES = [
    Harness(
        "codex",
        codex_agent.npm_prefix() / "node_modules" / ".bin" / "codex",
        "codex",
        "examples.swe.codex_agent:CodexSweAgent",
        "responses",
        lambda command: ("exec_command", {"cmd": command, "yield_time_ms": 30000}),
        "You are a coding agent running in the Codex CLI",
        "Process exited with code 0",
    ),
    Harness(
        "opencode",
        opencode_agent.npm_prefix() / "node_modules" / ".bin" / "opencode",
        "opencode",
        "examples.swe.opencode_agent:OpencodeSweAgent",
        "anthropic.messages",
        lambda command: ("bash", {"command": command}),
        "You are opencode",
        "<tool_response>",
    ),
]


@pytest.fixture(params=HARNESSES, ids=[h.name for h in HARNESSES])
def harness(request: pytest.FixtureRequest) -> Harness:
    h: Harness = request.param
    missing = [
        m
        for m, ok in (
            ("bubblewrap", available()),
            (".venv-swe (make swe-venv)", SWE_PYTHON.exists()),
            (f".npm-{h.name} (make {h.make_target})", h.binary.exists()),
        )
        if not ok
    ]
    require(missing)
    return h


def engineer(harness: Harness) -> Callable[[list[dict[str, Any]], list[dict[str, Any]] | None], str]:
    """A deterministic 'engineer' on the CLI's shell tool: read the issue, apply a fix (the reference
    one, or a wrong edit for the WRONG task), run the visible tests, then answer in text, which ends
    the CLI's run. A command still running when Codex yields (after `yield_time_ms`) is waited for
    with `write_stdin` on its session, as Codex's tools ask."""

    def policy(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
        tool, _ = harness.shell("")
        names = [t["function"]["name"] for t in tools or []]
        results = [message_text(m["content"]) for m in messages if m["role"] == "tool"]
        turn = sum(not RUNNING.search(r) for r in results)
        # Codex compacting its history (model_auto_compact_token_limit): a call without tools asks for
        # a summary, which the next calls get instead of the turns it covers.
        if not names and COMPACTION in message_text(messages[-1]["content"]):
            return f"{SUMMARY}{turn + done_before(messages)} steps done."
        assert tool in names, names
        task = task_of(messages)
        running = RUNNING.search(results[-1]) if results else None
        if running:
            return tool_call_text("write_stdin", {"session_id": int(running.group(1)), "chars": ""})
        turn += done_before(messages)
        shell = command(task, turn)
        if shell is None:
            return "The fix is in and the visible tests pass."
        if turn == 0 and task is WRONG:  # the sandbox: the repository (and the task generator) is not there
            shell += f"; ls {REPO / 'examples' / 'swe'} 2>&1 | tail -1"
        return preface(task, turn) + tool_call_text(*harness.shell(shell))

    return policy


def _stack(harness: Harness, tmp_path: Path, scale_out: bool = False) -> Any:
    """Gateway + Controller running the CLI's agent from .venv-swe, the engineer as the model."""
    return example_stack(
        engineer(harness),
        "swe",
        tmp_path,
        f"local_runner.python={SWE_PYTHON}",
        agent_env={"PYTHONPATH": str(REPO)},
        scale_out=scale_out,
    )


def _polls(calls: list[dict[str, Any]]) -> int:
    """Codex's waits on a slow command (its Responses answers' `output`; opencode never waits)."""
    return sum("write_stdin" in str((c["data"].get("api_response") or {}).get("output", "")) for c in calls)


def test_the_cli_solves_and_fails_through_gateway_and_controller(tmp_path: Path, harness: Harness) -> None:
    with _stack(harness, tmp_path) as stack:
        solved, wrong = stack.run(
            harness.agent,
            {"TASK_ID": "input.task_id"},
            [{"task_id": SOLVED.instance_id}, {"task_id": WRONG.instance_id}],
            timeout=600,
        )
    for r in (solved, wrong):
        assert r.state == "succeeded", (r.error, r.log[-3000:])
        calls = r.model_requests
        # read, edit, test, answer (+ Codex's waits on a slow command)
        assert len(calls) == 4 + _polls(calls), r.log[-3000:]
        for call in calls:
            assert call["data"]["api"] == harness.api
            assert call["data"]["http_status"] == 200
            assert call["data"]["response"]["prompt_token_ids"]
            assert call["data"]["response"]["choices"][0]["token_ids"]
        # The CLI's own prompt reached the model, and its tool's results came back.
        assert harness.system_marker in r.prompt_text(0)
        assert harness.result_marker in r.prompt_text(1)
    assert solved.rewards == [1.0] and wrong.rewards == [0.0]
    last = len(solved.model_requests) - 1
    assert "passed" in solved.prompt_text(last)  # the visible tests ran inside the sandbox
    assert "No such file or directory" in wrong.prompt_text(1)  # the repository is not mounted
    # Bare tool calls: every call extends the previous prompt + answer token for token, one row.
    assert len(solved.rows) == 1, (solved.merge_break(), solved.stats)
    assert solved.rows[0].reward == 1.0
    # A sentence before each call: through the pass-through Gateway each turn re-renders differently
    # (the hermes parser keeps the newline before <tool_call>, the template adds its own): a row a call.
    assert len(wrong.rows) == len(wrong.model_requests) and all(row.reward == 0.0 for row in wrong.rows)
    assert "re-renders an earlier model turn" in (wrong.merge_break() or "")


def test_the_cli_makes_one_row_through_the_token_exact_gateway(tmp_path: Path, harness: Harness) -> None:
    """The same wrong-fix rollout, served on token ids (vLLM's scale-out endpoints): the Gateway puts
    back the tokens the model wrote, so the CLI's re-sent history extends the row: one row."""
    with _stack(harness, tmp_path, scale_out=True) as stack:
        (wrong,) = stack.run(
            harness.agent, {"TASK_ID": "input.task_id"}, [{"task_id": WRONG.instance_id}], timeout=600
        )
    assert wrong.state == "succeeded", (wrong.error, wrong.log[-3000:])
    calls = wrong.model_requests
    assert len(calls) == 4 + _polls(calls) and wrong.rewards == [0.0], wrong.log[-3000:]
    assert calls[0]["data"]["segment"].get("first") is True
    assert all(c["data"]["segment"].get("continues") is True for c in calls[1:]), [
        c["data"]["segment"] for c in calls
    ]
    assert len(wrong.rows) == 1, (wrong.merge_break(), wrong.stats)


def test_codex_compacting_its_own_history_gives_segments_that_are_all_trained(tmp_path: Path) -> None:
    """Codex's own context compaction (`model_auto_compact_token_limit` through SWE_CODEX_CONFIG,
    set just above its first prompt) on the token-exact Gateway: the calls before it are one
    segment; the compaction call (Codex asks for a summary without tools) and the call that resumes
    from the summary each start a new one with the reason recorded; every segment is a training row
    with its reward, none masked, and the task is still solved."""
    codex = HARNESSES[0]
    require(
        [
            m
            for m, ok in (("bubblewrap", available()), (".npm-codex (make codex)", codex.binary.exists()))
            if not ok
        ]
    )
    with example_stack(
        engineer(codex),
        "swe",
        tmp_path,
        f"local_runner.python={SWE_PYTHON}",
        agent_env={"PYTHONPATH": str(REPO), "SWE_CODEX_CONFIG": "model_auto_compact_token_limit = 15500"},
        scale_out=True,
    ) as stack:
        (solved,) = stack.run(
            codex.agent, {"TASK_ID": "input.task_id"}, [{"task_id": SOLVED.instance_id}], timeout=600
        )
    assert solved.state == "succeeded" and solved.rewards == [1.0], (solved.error, solved.log[-3000:])
    assert "context compacted" in solved.log
    calls = solved.model_requests
    compactions = [
        i
        for i, c in enumerate(calls)
        if COMPACTION in solved.prompt_text(i)[-3000:] and not c["data"]["request"].get("tools")
    ]
    assert compactions, [c["data"]["segment"] for c in calls]
    at = compactions[0]
    segments = [c["data"]["segment"] for c in calls]
    assert segments[0].get("first") and all(s["continues"] for s in segments[1:at])  # one segment up to it
    assert segments[at]["break"]["reason"] == "tools_changed"  # the summary request drops the tools
    assert (
        not segments[at + 1]["continues"] and segments[at + 1]["break"]["reason"]
    )  # resumed from the summary
    assert SUMMARY in solved.prompt_text(at + 1)
    breaks = sum(not s["continues"] for s in segments)
    assert len(solved.rows) == breaks and sum(row.n_calls for row in solved.rows) == len(calls)
    assert all(row.reward == 1.0 and sum(row.response_mask) for row in solved.rows)  # every segment trained
