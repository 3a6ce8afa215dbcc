"""What the Responses and Anthropic Messages translations share: input checks, reading a chat
answer, and server-sent events: a chat stream re-spoken in the agent's API as it arrives."""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol

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


class ApiStream(Protocol):
    """A chat stream re-spoken as the agent's API streams, chunk by chunk as the engine writes it.

    `chunk` gives the events for one chat chunk's delta (text, reasoning, tool calls); `finish`
    the last events, built from the whole chat answer, with the API's answer to record (its ids
    those the agent was sent); `error` an error event in the API's shape, for a stream that broke.
    """

    def chunk(self, chunk: dict[str, Any]) -> bytes: ...

    def finish(self, chat: dict[str, Any]) -> tuple[dict[str, Any], bytes]: ...

    def error(self, status: int, message: str, kind: str) -> bytes: ...


class Translation(Protocol):
    """An agent API served as chat (openai_responses.py, anthropic_messages.py, each a module of
    these three): its request as the chat request that means the same, the chat answer back in
    the API, and a chat stream re-spoken in it."""

    def to_chat(self, body: dict[str, Any]) -> dict[str, Any]: ...

    def from_chat(self, chat: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]: ...

    def Stream(self, request: dict[str, Any], input_tokens: int | None) -> ApiStream: ...


class CallDelta(NamedTuple):
    """A piece of a streamed tool call: its position among the answer's calls; id and name on its first piece."""

    position: int
    id: str | None
    name: str | None
    arguments: str


def chunk_deltas(chunk: dict[str, Any]) -> tuple[str, str, list[CallDelta]]:
    """The reasoning, text and tool-call deltas of a chat chunk's first choice."""
    choices = chunk.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
    delta = choice.get("delta")
    delta = delta if isinstance(delta, dict) else {}
    reasoning = delta.get("reasoning_content") or delta.get("reasoning")
    text = delta.get("content")
    calls = []
    for i, call in enumerate(delta.get("tool_calls") or []):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict):
            continue
        index = call.get("index")
        calls.append(
            CallDelta(
                index if isinstance(index, int) else i,
                call.get("id") or None,
                function.get("name") or None,
                str(function.get("arguments") or ""),
            )
        )
    return (reasoning if isinstance(reasoning, str) else "", text if isinstance(text, str) else "", calls)


def whole_stream(stream: ApiStream, chat: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
    """A finished chat answer streamed in one go: the whole message as one chunk, then the end."""
    message, _ = chat_message(chat)
    delta = {key: message.get(key) for key in ("content", "reasoning_content", "reasoning")}
    delta["tool_calls"] = [{**call, "index": i} for i, call in enumerate(message.get("tool_calls") or [])]
    head = stream.chunk({"choices": [{"index": 0, "delta": delta}]})
    answer, tail = stream.finish(chat)
    return answer, head + tail
