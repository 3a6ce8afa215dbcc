"""The OpenAI Responses API over chat completions.

A Responses request becomes the chat request that means the same (instructions and input
items as messages, function tools as chat tools), the inference server answers it as chat
(with token ids and log-probs, recorded as for any chat call), and the chat answer becomes a
Responses `response` object, or its event stream.

Stateless only: this Gateway keeps no responses, so `previous_response_id`, `conversation`
and item references get a 400 that says to send the whole history in `input` (as the OpenAI
Agents SDK and Codex CLI do by default). `store` is accepted and answered as `false`.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

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

_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
_INPUT_TEXT_PARTS = frozenset({"input_text", "output_text", "text", "refusal"})
_IGNORED_ITEMS = frozenset({"reasoning"})  # the model's own reasoning: not replayed to a chat template


def _new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def _text_of(content: Any, where: str) -> str | list[dict[str, Any]]:
    """A message's content as chat content: text, or parts when it holds images."""
    if isinstance(content, str):
        return content
    parts = as_list(content, where)
    texts: list[str] = []
    chat_parts: list[dict[str, Any]] = []
    for i, part in enumerate(parts):
        part = as_dict(part, f"{where}[{i}]")
        kind = part.get("type")
        if kind in _INPUT_TEXT_PARTS:
            text = part.get("text", part.get("refusal"))
            if not isinstance(text, str):
                raise ApiInputError(f"{where}[{i}] ({kind}) needs a string 'text'")
            texts.append(text)
            chat_parts.append({"type": "text", "text": text})
        elif kind == "input_image":
            url = part.get("image_url")
            if not isinstance(url, str):
                raise ApiInputError(
                    f"{where}[{i}] (input_image) needs an 'image_url' (file_id is not supported)"
                )
            chat_parts.append({"type": "image_url", "image_url": {"url": url}})
        else:
            raise ApiInputError(
                f"{where}[{i}] has unsupported content type {kind!r}: use input_text, output_text or input_image"
            )
    if len(chat_parts) == len(texts):
        return "".join(texts)
    return chat_parts


def to_chat(body: dict[str, Any]) -> dict[str, Any]:
    """The chat completions request that means the same as a Responses request."""
    for key in ("previous_response_id", "conversation"):
        if body.get(key) is not None:
            raise ApiInputError(
                f"'{key}' is not supported: this Gateway keeps no responses. Send the whole history in "
                "'input' (earlier messages, function_call and function_call_output items) instead"
            )
    if body.get("background") is True:
        raise ApiInputError("'background' responses are not supported: call without it")
    messages: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise ApiInputError("'instructions' must be a string")
        messages.append({"role": "system", "content": instructions})
    raw_input = body.get("input")
    if isinstance(raw_input, str):
        messages.append({"role": "user", "content": raw_input})
    elif raw_input is None:
        raise ApiInputError("'input' is required: a string or a list of input items")
    else:
        for i, item in enumerate(as_list(raw_input, "input")):
            _add_item(messages, as_dict(item, f"input[{i}]"), f"input[{i}]")
    if not messages:
        raise ApiInputError("'input' is empty: send at least one message")
    ensure_calls_answered(messages, "function_call_output", "call_id")

    chat: dict[str, Any] = {"messages": messages}
    tools = body.get("tools")
    if tools:
        chat["tools"] = [_tool(as_dict(t, f"tools[{i}]"), i) for i, t in enumerate(as_list(tools, "tools"))]
    choice = body.get("tool_choice")
    if choice is not None:
        chat["tool_choice"] = _tool_choice(choice)
    if body.get("parallel_tool_calls") is not None:
        chat["parallel_tool_calls"] = body["parallel_tool_calls"]
    max_tokens = body.get("max_output_tokens")
    if max_tokens is not None:
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            raise ApiInputError("'max_output_tokens' must be a positive integer")
        chat["max_tokens"] = max_tokens
    if body.get("top_p") is not None:
        chat["top_p"] = body["top_p"]
    response_format = _response_format(body.get("text"))
    if response_format is not None:
        chat["response_format"] = response_format
    return chat


def _add_item(messages: list[dict[str, Any]], item: dict[str, Any], where: str) -> None:
    kind = item.get("type", "message" if "role" in item else None)
    if kind == "message":
        role = _ROLES.get(item.get("role"))  # type: ignore[arg-type]  # a missing or odd role maps to None
        if role is None:
            raise ApiInputError(f"{where}: role must be one of user, assistant, system, developer")
        messages.append({"role": role, "content": _text_of(item.get("content", ""), f"{where}.content")})
    elif kind == "function_call":
        call_id, name, arguments = item.get("call_id"), item.get("name"), item.get("arguments", "")
        if not isinstance(call_id, str) or not isinstance(name, str) or not isinstance(arguments, str):
            raise ApiInputError(f"{where} (function_call) needs string 'call_id', 'name' and 'arguments'")
        call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
        last = messages[-1] if messages else None
        if last is not None and last["role"] == "assistant":  # one assistant turn: text, then its calls
            last.setdefault("tool_calls", []).append(call)
        else:
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
    elif kind == "function_call_output":
        call_id, output = item.get("call_id"), item.get("output")
        if not isinstance(call_id, str):
            raise ApiInputError(f"{where} (function_call_output) needs a string 'call_id'")
        if not isinstance(output, str):
            output = _text_of(output, f"{where}.output")
            if not isinstance(output, str):
                raise ApiInputError(f"{where}.output: only text outputs are supported")
        messages.append({"role": "tool", "tool_call_id": call_id, "content": output})
    elif kind in _IGNORED_ITEMS:
        return
    elif kind == "item_reference":
        raise ApiInputError(
            f"{where}: item references are not supported (this Gateway keeps no items); send the item itself"
        )
    else:
        raise ApiInputError(
            f"{where} has unsupported type {kind!r}: use message, function_call or function_call_output"
        )


def _tool(tool: dict[str, Any], i: int) -> dict[str, Any]:
    if tool.get("type") != "function":
        raise ApiInputError(
            f"tools[{i}] has type {tool.get('type')!r}: only function tools are supported "
            "(hosted tools such as web_search run at OpenAI, not on this model)"
        )
    return chat_function_tool(tool, i, "parameters")


def _tool_choice(choice: Any) -> Any:
    if choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise ApiInputError("'tool_choice' must be auto, none, required or {type: function, name}")


def _response_format(text: Any) -> dict[str, Any] | None:
    if text is None:
        return None
    fmt = as_dict(text, "text").get("format")
    if fmt is None:
        return None
    fmt = as_dict(fmt, "text.format")
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        schema = {"name": fmt.get("name", "response"), "schema": fmt.get("schema") or {}}
        if fmt.get("strict") is not None:
            schema["strict"] = fmt["strict"]
        return {"type": "json_schema", "json_schema": schema}
    raise ApiInputError(f"text.format.type {kind!r} is not supported: use text, json_object or json_schema")


def from_chat(chat: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]:
    """The Responses `response` object for a chat answer to the request `to_chat` made."""
    message, finish_reason = chat_message(chat)
    output: list[dict[str, Any]] = []
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if isinstance(reasoning, str) and reasoning:
        output.append(
            {
                "type": "reasoning",
                "id": _new_id("rs"),
                "summary": [],
                "content": [{"type": "reasoning_text", "text": reasoning}],
            }
        )
    text = message.get("content")
    if isinstance(text, str) and text:
        output.append(
            {
                "type": "message",
                "id": _new_id("msg"),
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}],
            }
        )
    for call in chat_tool_calls(message):
        output.append(
            {
                "type": "function_call",
                "id": _new_id("fc"),
                "call_id": call["id"],
                "name": call["name"],
                "arguments": call["arguments"],
                "status": "completed",
            }
        )
    usage = chat_usage(chat)
    truncated = finish_reason == "length"
    return {
        "id": _new_id("resp"),
        "object": "response",
        "created_at": int(chat.get("created") or time.time()),
        "status": "incomplete" if truncated else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if truncated else None,
        "error": None,
        "model": request.get("model") or chat.get("model"),
        "instructions": request.get("instructions"),
        "output": output,
        "parallel_tool_calls": request.get("parallel_tool_calls", True),
        "tool_choice": request.get("tool_choice", "auto"),
        "tools": request.get("tools") or [],
        "temperature": request.get("temperature"),
        "top_p": request.get("top_p"),
        "max_output_tokens": request.get("max_output_tokens"),
        "previous_response_id": None,
        "reasoning": {"effort": None, "summary": None},
        "store": False,
        "text": request.get("text") or {"format": {"type": "text"}},
        "truncation": "disabled",
        "metadata": request.get("metadata") or {},
        "usage": {
            "input_tokens": usage[0],
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": usage[1],
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage[0] + usage[1],
        },
    }


class ResponseStream:
    """A chat stream as the Responses API streams: `response.created`, then an output item per
    reasoning, message and function call (added, its deltas as they come, done), then
    `response.completed` (or `.incomplete`) with the whole response (translate.ApiStream)."""

    def __init__(self, request: dict[str, Any], input_tokens: int | None) -> None:
        del input_tokens  # Responses streams give the usage at the end only, in the whole response
        self.request = request
        self.id = _new_id("resp")
        self.created = int(time.time())
        self.sequence = 0
        self.started = False
        self.items: list[dict[str, Any]] = []  # by output index, as the agent was sent them
        self.open: str | int | None = None  # "reasoning", "message", or the open tool call's chat index
        self.text = ""  # the open item's text or arguments so far

    def chunk(self, chunk: dict[str, Any]) -> bytes:
        reasoning, text, calls = chunk_deltas(chunk)
        events = self._begin()
        if reasoning:
            self._item(
                events, "reasoning", {"type": "reasoning", "id": _new_id("rs"), "summary": [], "content": []}
            )
            events.append(("response.reasoning_text.delta", {**self._where(), "content_index": 0, "delta": reasoning}))  # fmt: skip
            self.text += reasoning
        if text:
            if self.open != "message":
                item = {"type": "message", "id": _new_id("msg"), "status": "in_progress", "role": "assistant", "content": []}  # fmt: skip
                self._item(events, "message", item)
                events.append(("response.content_part.added", {**self._where(), "content_index": 0, "part": _text_part("")}))  # fmt: skip
            events.append(("response.output_text.delta", {**self._where(), "content_index": 0, "delta": text, "logprobs": []}))  # fmt: skip
            self.text += text
        for call in calls:
            if self.open != call.position:
                item = {
                    "type": "function_call",
                    "id": _new_id("fc"),
                    "call_id": call.id or f"call_{call.position}",
                    "name": call.name or "",
                    "arguments": "",
                    "status": "in_progress",
                }
                self._item(events, call.position, item)
            if call.arguments:
                events.append(("response.function_call_arguments.delta", {**self._where(), "delta": call.arguments}))  # fmt: skip
                self.text += call.arguments
        return self._encode(events)

    def finish(self, chat: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
        response = from_chat(chat, self.request)
        response["id"], response["created_at"] = self.id, self.created
        sent = {
            kind: [i for i in self.items if i["type"] == kind] for kind in {i["type"] for i in self.items}
        }
        for item in response["output"]:  # the ids the agent was sent, the nth item of a type to the nth
            if sent.get(item["type"]):
                streamed = sent[item["type"]].pop(0)
                item["id"] = streamed["id"]
                if "call_id" in streamed:
                    item["call_id"] = streamed["call_id"]
        events = self._begin()
        self._close(events)
        last = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
        events.append((last, {"response": response}))
        return response, self._encode(events)

    def error(self, status: int, message: str, kind: str) -> bytes:
        failed = {**self._head(), "status": "failed", "error": {"code": kind, "message": message}}
        return self._encode([("response.failed", {"response": failed})])

    def _head(self) -> dict[str, Any]:
        empty = from_chat({"created": self.created}, self.request)
        return {**empty, "id": self.id, "status": "in_progress", "output": [], "usage": None}

    def _begin(self) -> list[tuple[str, dict[str, Any]]]:
        if self.started:
            return []
        self.started = True
        head = self._head()
        return [("response.created", {"response": head}), ("response.in_progress", {"response": head})]

    def _where(self) -> dict[str, Any]:
        return {"item_id": self.items[-1]["id"], "output_index": len(self.items) - 1}

    def _item(self, events: list[tuple[str, dict[str, Any]]], kind: str | int, item: dict[str, Any]) -> None:
        if self.open == kind:
            return
        self._close(events)
        self.open = kind
        self.items.append(item)
        events.append(("response.output_item.added", {"output_index": len(self.items) - 1, "item": item}))

    def _close(self, events: list[tuple[str, dict[str, Any]]]) -> None:
        """The open item's done events, with all it was sent."""
        if self.open is None:
            return
        item, where, text = self.items[-1], self._where(), self.text
        if item["type"] == "reasoning":
            item = {**item, "content": [{"type": "reasoning_text", "text": text}]}
            events.append(("response.reasoning_text.done", {**where, "content_index": 0, "text": text}))
        elif item["type"] == "message":
            item = {**item, "status": "completed", "content": [_text_part(text)]}
            events.append(("response.output_text.done", {**where, "content_index": 0, "text": text, "logprobs": []}))  # fmt: skip
            events.append(("response.content_part.done", {**where, "content_index": 0, "part": _text_part(text)}))  # fmt: skip
        else:
            item = {**item, "arguments": text, "status": "completed"}
            events.append(("response.function_call_arguments.done", {**where, "arguments": text, "name": item["name"]}))  # fmt: skip
        self.items[-1] = item
        events.append(("response.output_item.done", {"output_index": len(self.items) - 1, "item": item}))
        self.open, self.text = None, ""

    def _encode(self, events: list[tuple[str, dict[str, Any]]]) -> bytes:
        out = []
        for kind, data in events:
            out.append(sse(kind, {"type": kind, "sequence_number": self.sequence, **data}, named=True))
            self.sequence += 1
        return b"".join(out)


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


Stream = ResponseStream  # translate.Translation's stream
