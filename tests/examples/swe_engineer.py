"""The scripted 'engineer' the SWE harness tests share: which task a conversation is about, and the
shell command of each turn — read the issue, apply a fix (the reference one for SOLVED, an edit that
fixes nothing for WRONG), run the visible tests; each harness wraps them in its own tool call."""

from __future__ import annotations

from typing import Any

from examples.swe.bank import make_task
from examples.swe.task import Task
from tests.examples.stack import REPO

SWE_PYTHON = REPO / ".venv-swe" / "bin" / "python"
SOLVED, WRONG = make_task(3, 0), make_task(4, 0)


def message_text(content: Any) -> str:
    """A message's text, whether a string or a list of content parts."""
    if isinstance(content, list):
        return "\n".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content or ""


def task_of(messages: list[dict[str, Any]]) -> Task:
    users = "\n".join(message_text(m["content"]) for m in messages if m["role"] == "user")
    return SOLVED if SOLVED.problem_statement.splitlines()[0] in users else WRONG


def command(task: Task, turn: int) -> str | None:
    """The shell command of `turn` (0: read, 1: fix, 2: test); None once the work is done."""
    module = task.patch.splitlines()[0].split("a/", 1)[1]
    if turn == 0:
        return f"cat ISSUE.md && grep -n 'def ' {module}"
    if turn == 1 and task is SOLVED:
        return f"patch -p1 <<'EOF'\n{task.patch}EOF"
    if turn == 1:
        return f"sed -i 's/return /return None or /' {module}"  # looks busy, fixes nothing
    if turn == 2:
        # The summary without its timing: two runs of a task then give the same conversation
        # (what a model fitted to replay a recorded run, tests/vllm/replay.py, must see again).
        return "python -m pytest -q tests 2>&1 | tail -3 | sed -E 's/ in [0-9.]+s//'"
    return None


def preface(task: Task, turn: int) -> str:
    """The WRONG task's turns start with a sentence before the call (as mini's prompt asks for
    reasoning); the SOLVED task's are bare tool calls."""
    return f"Step {turn + 1}.\n" if task is WRONG else ""
