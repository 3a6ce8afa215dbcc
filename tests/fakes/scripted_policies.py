"""The scripted model's policies for the examples: call the tool once, then answer from its output."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from tests.fakes.scripted_model import Policy, tool_call_text


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "\n".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content or ""


def tool_then_answer(
    tool: str,
    arguments_for: Callable[[str], dict[str, Any]],
    answer_for: Callable[[str], str],
    preface: str = "",
    compact: bool = False,
) -> Policy:
    """First call (no tool result yet): call `tool` with arguments made from the first user
    message; once a tool result is in the conversation: answer with `answer_for(tool output)`."""

    def policy(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
        results = [_text(m.get("content")) for m in messages if m.get("role") == "tool"]
        if results:
            return answer_for(results[-1])
        question = next(_text(m.get("content")) for m in messages if m.get("role") == "user")
        return preface + tool_call_text(tool, arguments_for(question), compact)

    return policy


def expression_for(table: dict[str, str]) -> Callable[[str], dict[str, Any]]:
    """The calculator's arguments for a question: the first table key the question contains."""

    def arguments(question: str) -> dict[str, Any]:
        for key, expression in table.items():
            if key in question:
                return {"expression": expression}
        raise KeyError(f"no scripted expression for {question[:80]!r}")

    return arguments


def number_in(text: str) -> str:
    """The last number in a tool's output ('12.0', 'Result: 15' -> '15')."""
    numbers: list[str] = re.findall(r"-?\d+(?:\.\d+)?", text)
    if not numbers:
        raise ValueError(f"no number in tool output {text[:80]!r}")
    value = numbers[-1]
    return value.removesuffix(".0")
