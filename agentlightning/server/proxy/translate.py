"""What the Responses and Anthropic Messages translations share: input checks, reading a chat
answer, and server-sent events."""

from __future__ import annotations

from typing import Any

import orjson


class ApiInputError(ValueError):
    """A request the API cannot serve; the message says what is wrong (answered with a 400)."""


def as_dict(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ApiInputError(f"{where} must be an object, not {type(value).__name__}")
    return value


def as_list(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise ApiInputError(f"{where} must be a list, not {type(value).__name__}")
    return value


def ensure_calls_answered(messages: list[dict[str, Any]], item_name: str, id_name: str) -> None:
    """Every tool answer must answer a call made before it (a chat template cannot place it else)."""
    called: set[str] = set()
    for message in messages:
        for call in message.get("tool_calls") or []:
            called.add(call["id"])
        if message["role"] == "tool" and message["tool_call_id"] not in called:
            raise ApiInputError(
                f"a {item_name} answers {id_name} {message['tool_call_id']!r}, but no earlier tool call "
                "has that id: send the call before its result"
            )


def chat_function_tool(tool: dict[str, Any], i: int, schema_key: str) -> dict[str, Any]:
    """A client tool (`name`, `description`, its JSON schema under `schema_key`) as a chat tool."""
    name = tool.get("name")
    if not isinstance(name, str) or not name:
        raise ApiInputError(f"tools[{i}] needs a 'name'")
    # In OpenAI's key order: chat templates write tools with `tojson`, which keeps the order.
    function: dict[str, Any] = {"name": name}
    if tool.get("description"):
        function["description"] = tool["description"]
    function["parameters"] = tool.get(schema_key) or {"type": "object"}
    return {"type": "function", "function": function}


def chat_message(chat: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """The first choice's message and finish reason of a chat answer."""
    choices = chat.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
    message = choice.get("message")
    return (message if isinstance(message, dict) else {}), choice.get("finish_reason")


def chat_tool_calls(message: dict[str, Any]) -> list[dict[str, str]]:
    """`{id, name, arguments}` of each function call in a chat message."""
    calls = []
    for i, call in enumerate(message.get("tool_calls") or []):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict):
            continue
        calls.append(
            {
                "id": call.get("id") or f"call_{i}",
                "name": str(function.get("name") or ""),
                "arguments": str(function.get("arguments") or ""),
            }
        )
    return calls


def chat_usage(chat: dict[str, Any]) -> tuple[int, int]:
    usage = chat.get("usage")
    if not isinstance(usage, dict):
        return 0, 0
    return int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)


def sse(kind: str, data: dict[str, Any], named: bool) -> bytes:
    """One server-sent event; `named` adds the `event:` line both APIs send."""
    head = b"event: " + kind.encode() + b"\n" if named else b""
    return head + b"data: " + orjson.dumps(data) + b"\n\n"
