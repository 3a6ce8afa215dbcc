"""The Anthropic Messages API over chat completions.

A Messages request becomes the chat request that means the same (`system` as the system
message, `tool_use` blocks as tool calls, `tool_result` blocks as tool messages, tools with
`input_schema` as function tools); the inference server answers it as chat (token ids and
log-probs recorded as for any chat call) and the chat answer becomes a Messages `message`,
or its event stream.
"""

from __future__ import annotations

import uuid
from typing import Any

import orjson

from agentlightning.server.proxy.translate import (
    ApiInputError,
    as_dict,
    as_list,
    chat_function_tool,
    chat_message,
    chat_tool_calls,
    chat_usage,
    chunk_deltas,
    ensure_calls_answered,
    sse,
)

# Anthropic's error types by HTTP status (https://docs.anthropic.com/en/api/errors).
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}
_SKIPPED_BLOCKS = frozenset({"redacted_thinking"})


def error_body(status: int, message: str) -> bytes:
    kind = ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return orjson.dumps({"type": "error", "error": {"type": kind, "message": message}})


def _blocks(content: Any, where: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [as_dict(b, f"{where}[{i}]") for i, b in enumerate(as_list(content, where))]


def _text(block: dict[str, Any], where: str) -> str:
    text = block.get("text")
    if not isinstance(text, str):
        raise ApiInputError(f"{where} (text) needs a string 'text'")
    return text


def _image(block: dict[str, Any], where: str) -> dict[str, Any]:
    source = as_dict(block.get("source"), f"{where}.source")
    if source.get("type") == "base64":
        url = f"data:{source.get('media_type', 'image/png')};base64,{source.get('data', '')}"
    elif source.get("type") == "url":
        url = str(source.get("url"))
    else:
        raise ApiInputError(f"{where}.source.type must be base64 or url")
    return {"type": "image_url", "image_url": {"url": url}}


def _system_text(content: Any, where: str) -> str:
    blocks = _blocks(content, where)
    for i, block in enumerate(blocks):
        if block.get("type") != "text":
            raise ApiInputError(f"{where}[{i}]: only text blocks are allowed in a system message")
    return "".join(_text(b, where) for b in blocks)


def _tool_result_text(block: dict[str, Any], where: str) -> str:
    content = block.get("content", "")
    if isinstance(content, str):
        text = content
    else:
        parts = []
        for i, part in enumerate(_blocks(content, f"{where}.content")):
            if part.get("type") != "text":
                raise ApiInputError(f"{where}.content[{i}]: only text is supported in a tool_result")
            parts.append(_text(part, f"{where}.content[{i}]"))
        text = "\n".join(parts)
    return text


def _content(texts: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    if all(p["type"] == "text" for p in texts):
        return "".join(p["text"] for p in texts)
    return texts


def to_chat(body: dict[str, Any]) -> dict[str, Any]:
    """The chat completions request that means the same as a Messages request."""
    max_tokens = body.get("max_tokens")
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise ApiInputError("max_tokens: a positive integer is required")
    messages: list[dict[str, Any]] = []
    system = body.get("system")
    if system is not None:
        messages.append({"role": "system", "content": _system_text(system, "system")})
    raw = as_list(body.get("messages"), "messages")
    if not raw:
        raise ApiInputError("messages: at least one message is required")
    for i, message in enumerate(raw):
        message = as_dict(message, f"messages[{i}]")
        role = message.get("role")
        if role == "system":
            # A system message among the turns (Claude Code sends its agent list and environment so)
            # stays in its place, as a chat system message.
            messages.append(
                {"role": "system", "content": _system_text(message.get("content"), f"messages[{i}].content")}
            )
            continue
        if role not in ("user", "assistant"):
            raise ApiInputError(f"messages[{i}].role must be user, assistant or system")
        _add_message(
            messages, role, _blocks(message.get("content"), f"messages[{i}].content"), f"messages[{i}]"
        )
    ensure_calls_answered(messages, "tool_result", "tool_use_id")

    chat: dict[str, Any] = {"messages": messages, "max_tokens": max_tokens}
    tools = body.get("tools")
    if tools:
        chat["tools"] = [_tool(as_dict(t, f"tools[{i}]"), i) for i, t in enumerate(as_list(tools, "tools"))]
    choice = body.get("tool_choice")
    if choice is not None:
        _tool_choice(chat, as_dict(choice, "tool_choice"))
    stop = body.get("stop_sequences")
    if stop:
        chat["stop"] = [str(s) for s in as_list(stop, "stop_sequences")]
    for key in ("top_p", "top_k"):
        if body.get(key) is not None:
            chat[key] = body[key]
    return chat


def _add_message(messages: list[dict[str, Any]], role: str, blocks: list[dict[str, Any]], where: str) -> None:
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    reasoning: list[str] = []
    for i, block in enumerate(blocks):
        at = f"{where}.content[{i}]"
        kind = block.get("type")
        if kind == "text":
            parts.append({"type": "text", "text": _text(block, at)})
        elif kind == "image" and role == "user":
            parts.append(_image(block, at))
        elif kind == "tool_use" and role == "assistant":
            call_id, name, arguments = block.get("id"), block.get("name"), block.get("input", {})
            if not isinstance(call_id, str) or not isinstance(name, str) or not isinstance(arguments, dict):
                raise ApiInputError(f"{at} (tool_use) needs a string 'id' and 'name' and an object 'input'")
            calls.append(
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": name, "arguments": orjson.dumps(arguments).decode()},
                }
            )
        elif kind == "tool_result" and role == "user":
            call_id = block.get("tool_use_id")
            if not isinstance(call_id, str):
                raise ApiInputError(f"{at} (tool_result) needs a string 'tool_use_id'")
            # Tool results come first in a user turn (Anthropic requires it) and become tool messages.
            messages.append(
                {"role": "tool", "tool_call_id": call_id, "content": _tool_result_text(block, at)}
            )
        elif kind == "thinking" and role == "assistant":
            reasoning.append(str(block.get("thinking") or ""))
        elif kind in _SKIPPED_BLOCKS:
            continue
        else:
            raise ApiInputError(
                f"{at}: block type {kind!r} is not supported in a {role} message "
                "(user: text, image, tool_result; assistant: text, tool_use, thinking)"
            )
    if role == "assistant":
        message: dict[str, Any] = {"role": "assistant", "content": _content(parts) if parts else None}
        if calls:
            message["tool_calls"] = calls
        if reasoning:
            message["reasoning_content"] = "".join(reasoning)
        messages.append(message)
    elif parts:
        messages.append({"role": "user", "content": _content(parts)})


def _tool(tool: dict[str, Any], i: int) -> dict[str, Any]:
    if tool.get("type") not in (None, "custom"):
        raise ApiInputError(
            f"tools[{i}] has type {tool.get('type')!r}: only client tools (name, input_schema) are supported"
        )
    return chat_function_tool(tool, i, "input_schema")


def _tool_choice(chat: dict[str, Any], choice: dict[str, Any]) -> None:
    kind = choice.get("type")
    if kind == "auto":
        chat["tool_choice"] = "auto"
    elif kind == "any":
        chat["tool_choice"] = "required"
    elif kind == "none":
        chat["tool_choice"] = "none"
    elif kind == "tool" and isinstance(choice.get("name"), str):
        chat["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    else:
        raise ApiInputError("tool_choice.type must be auto, any, none or tool (with a name)")
    if choice.get("disable_parallel_tool_use") is True:
        chat["parallel_tool_calls"] = False


def from_chat(chat: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]:
    """The Messages `message` for a chat answer to the request `to_chat` made."""
    message, finish_reason = chat_message(chat)
    content: list[dict[str, Any]] = []
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if isinstance(reasoning, str) and reasoning:
        content.append({"type": "thinking", "thinking": reasoning, "signature": ""})
    text = message.get("content")
    if isinstance(text, str) and text:
        content.append({"type": "text", "text": text})
    calls = chat_tool_calls(message)
    for call in calls:
        try:
            arguments = orjson.loads(call["arguments"] or "{}")
        except orjson.JSONDecodeError:
            arguments = None
        content.append(
            {
                "type": "tool_use",
                "id": call["id"],
                "name": call["name"],
                # Anthropic's input is an object; arguments that are not one are kept as text.
                "input": arguments if isinstance(arguments, dict) else {"arguments": call["arguments"]},
            }
        )
    stop_reason = STOP_REASONS.get(finish_reason or "stop", "end_turn")
    if calls:
        stop_reason = "tool_use"
    stop_sequence = None
    matched = _stop_sequence(chat)
    if matched is not None and stop_reason == "end_turn" and matched in (request.get("stop_sequences") or []):
        stop_reason, stop_sequence = "stop_sequence", matched
    prompt_tokens, completion_tokens = chat_usage(chat)
    return {
        "id": f"msg_{uuid.uuid4().hex}",
        "type": "message",
        "role": "assistant",
        "model": request.get("model") or chat.get("model"),
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": stop_sequence,
        "usage": {
            "input_tokens": prompt_tokens,
            "output_tokens": completion_tokens,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        },
    }


def _stop_sequence(chat: dict[str, Any]) -> str | None:
    choices = chat.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        reason = choices[0].get("stop_reason")
        if isinstance(reason, str):
            return reason
    return None


class MessageStream:
    """A chat stream as the Messages API streams: `message_start`, then a content block per
    thinking, text and tool use (started, its deltas as they come, stopped), then `message_delta`
    with the stop reason and `message_stop` (translate.ApiStream)."""

    def __init__(self, request: dict[str, Any], input_tokens: int | None) -> None:
        self.request = request
        self.input_tokens = input_tokens  # None: the prompt's ids on the first chunk say it
        self.id = f"msg_{uuid.uuid4().hex}"
        self.started = False
        self.index = -1  # the open content block's index
        self.open: str | int | None = None  # "thinking", "text", or the open tool call's chat index
        self.tool_ids: list[str] = []  # the tool_use ids the agent was sent, in order

    def chunk(self, chunk: dict[str, Any]) -> bytes:
        reasoning, text, calls = chunk_deltas(chunk)
        if self.input_tokens is None and isinstance(chunk.get("prompt_token_ids"), list):
            self.input_tokens = len(chunk["prompt_token_ids"])
        events = self._begin(chunk.get("model"))
        if reasoning:
            self._block(events, "thinking", {"type": "thinking", "thinking": "", "signature": ""})
            events.append(("content_block_delta", {"index": self.index, "delta": {"type": "thinking_delta", "thinking": reasoning}}))  # fmt: skip
        if text:
            self._block(events, "text", {"type": "text", "text": ""})
            events.append(("content_block_delta", {"index": self.index, "delta": {"type": "text_delta", "text": text}}))  # fmt: skip
        for call in calls:
            if self.open != call.position:
                tool_id = call.id or f"toolu_{uuid.uuid4().hex}"
                self.tool_ids.append(tool_id)
                start = {"type": "tool_use", "id": tool_id, "name": call.name or "", "input": {}}
                self._block(events, call.position, start)
            if call.arguments:
                delta = {"type": "input_json_delta", "partial_json": call.arguments}
                events.append(("content_block_delta", {"index": self.index, "delta": delta}))
        return _encode(events)

    def finish(self, chat: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
        message = from_chat(chat, self.request)
        message["id"] = self.id
        uses = [block for block in message["content"] if block["type"] == "tool_use"]
        for block, sent in zip(uses, self.tool_ids, strict=False):  # the ids the agent was sent
            block["id"] = sent
        if self.input_tokens is None:
            self.input_tokens = message["usage"]["input_tokens"]
        events = self._begin(message["model"])
        self._close(events)
        end = {"stop_reason": message["stop_reason"], "stop_sequence": message["stop_sequence"]}
        events.append(("message_delta", {"delta": end, "usage": {"output_tokens": message["usage"]["output_tokens"]}}))  # fmt: skip
        events.append(("message_stop", {}))
        return message, _encode(events)

    def error(self, status: int, message: str, kind: str) -> bytes:
        return sse("error", orjson.loads(error_body(status, message)), named=True)

    def _begin(self, model: Any) -> list[tuple[str, dict[str, Any]]]:
        if self.started:
            return []
        self.started = True
        head = {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.request.get("model") or model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {
                "input_tokens": self.input_tokens or 0,
                "output_tokens": 0,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
            },
        }
        return [("message_start", {"message": head})]

    def _block(
        self, events: list[tuple[str, dict[str, Any]]], kind: str | int, start: dict[str, Any]
    ) -> None:
        if self.open == kind:
            return
        self._close(events)
        self.index += 1
        self.open = kind
        events.append(("content_block_start", {"index": self.index, "content_block": start}))

    def _close(self, events: list[tuple[str, dict[str, Any]]]) -> None:
        if self.open is not None:
            events.append(("content_block_stop", {"index": self.index}))
            self.open = None


def _encode(events: list[tuple[str, dict[str, Any]]]) -> bytes:
    return b"".join(sse(kind, {"type": kind, **data}, named=True) for kind, data in events)


Stream = MessageStream  # translate.Translation's stream
