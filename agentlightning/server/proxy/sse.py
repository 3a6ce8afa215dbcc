"""Server-sent events: split a byte stream into events, and assemble streamed chunks into the
answer a non-streamed call would have returned (content, tool calls, token ids, log-probs,
usage, finish reason), so that a streamed call's record reads exactly like a plain one's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import orjson

_EVENT_END = re.compile(rb"\r\n\r\n|\n\n|\r\r")
DONE = b"[DONE]"


class EventSplitter:
    """Cuts a byte stream into whole SSE events (each with its terminating blank line)."""

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, data: bytes) -> list[bytes]:
        buffer = self._buffer + data if self._buffer else data
        events = []
        start = 0
        for match in _EVENT_END.finditer(buffer):
            events.append(buffer[start : match.end()])
            start = match.end()
        self._buffer = buffer[start:]
        return events

    def rest(self) -> bytes:
        """What is left unterminated at the end of the stream."""
        rest, self._buffer = self._buffer, b""
        return rest


def event_data(event: bytes) -> bytes | None:
    """The joined `data:` lines of one event, None when it has none (a comment, a keep-alive)."""
    lines = [line for line in event.splitlines() if line.startswith(b"data:")]
    if not lines:
        return None
    parts = [line[6:] if line.startswith(b"data: ") else line[5:] for line in lines]
    return b"\n".join(parts)


@dataclass
class _ToolCall:
    id: str | None = None
    type: str = "function"
    name: str = ""
    arguments: list[str] = field(default_factory=list)


@dataclass
class _Choice:
    role: str = "assistant"
    content: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    tool_calls: dict[int, _ToolCall] = field(default_factory=dict)
    token_ids: list[int] = field(default_factory=list)
    prompt_token_ids: list[int] | None = None
    logprobs: list[Any] = field(default_factory=list)  # chat: content entries
    token_logprobs: list[Any] = field(default_factory=list)  # completions
    tokens: list[Any] = field(default_factory=list)
    top_logprobs: list[Any] = field(default_factory=list)
    text_offset: list[Any] = field(default_factory=list)
    has_logprobs: bool = False
    has_token_ids: bool = False
    finish_reason: str | None = None
    stop_reason: Any = None


class StreamAssembler:
    """Accumulates the chunks of one streamed chat or completions answer."""

    def __init__(self, api: str) -> None:
        self.chat = api == "chat.completions"
        self.head: dict[str, Any] = {}
        self.choices: dict[int, _Choice] = {}
        self.prompt_token_ids: list[int] | None = None
        self.usage: dict[str, Any] | None = None
        self.error: Any = None
        self.done = False
        self.chunks = 0

    def add(self, chunk: Any) -> None:
        if not isinstance(chunk, dict):
            return
        self.chunks += 1
        if not self.head:
            self.head = {
                k: chunk.get(k) for k in ("id", "created", "model", "system_fingerprint") if k in chunk
            }
        if chunk.get("error") is not None:
            self.error = chunk["error"]
        if chunk.get("usage") is not None:
            self.usage = chunk["usage"]
        if isinstance(chunk.get("prompt_token_ids"), list):
            self.prompt_token_ids = chunk["prompt_token_ids"]
        for raw in chunk.get("choices") or []:
            if isinstance(raw, dict):
                self._add_choice(raw)

    def _add_choice(self, raw: dict[str, Any]) -> None:
        index = raw.get("index", 0)
        choice = self.choices.get(index)
        if choice is None:
            choice = self.choices[index] = _Choice()
        ids = raw.get("token_ids")
        if isinstance(ids, list):
            choice.token_ids.extend(ids)
            choice.has_token_ids = True
        if isinstance(raw.get("prompt_token_ids"), list):
            choice.prompt_token_ids = raw["prompt_token_ids"]
        if raw.get("finish_reason") is not None:
            choice.finish_reason = raw["finish_reason"]
        if raw.get("stop_reason") is not None:
            choice.stop_reason = raw["stop_reason"]
        logprobs = raw.get("logprobs")
        if self.chat:
            delta = raw.get("delta") or {}
            if delta.get("role"):
                choice.role = delta["role"]
            if delta.get("content"):
                choice.content.append(delta["content"])
            reasoning = delta.get("reasoning_content") or delta.get("reasoning")
            if reasoning:
                choice.reasoning.append(reasoning)
            for call in delta.get("tool_calls") or []:
                self._add_tool_call(choice, call)
            if isinstance(logprobs, dict) and isinstance(logprobs.get("content"), list):
                choice.logprobs.extend(logprobs["content"])
                choice.has_logprobs = True
        else:
            if raw.get("text"):
                choice.content.append(raw["text"])
            if isinstance(logprobs, dict):
                choice.has_logprobs = True
                choice.tokens.extend(logprobs.get("tokens") or [])
                choice.token_logprobs.extend(logprobs.get("token_logprobs") or [])
                choice.top_logprobs.extend(logprobs.get("top_logprobs") or [])
                choice.text_offset.extend(logprobs.get("text_offset") or [])

    @staticmethod
    def _add_tool_call(choice: _Choice, raw: Any) -> None:
        if not isinstance(raw, dict):
            return
        index = raw.get("index", len(choice.tool_calls))
        call = choice.tool_calls.get(index)
        if call is None:
            call = choice.tool_calls[index] = _ToolCall()
        if raw.get("id"):
            call.id = raw["id"]
        if raw.get("type"):
            call.type = raw["type"]
        function = raw.get("function") or {}
        if function.get("name"):
            call.name += function["name"]
        if function.get("arguments"):
            call.arguments.append(function["arguments"])

    def response(self) -> dict[str, Any]:
        """The answer in the non-streamed shape (chat.completion or text_completion)."""
        out: dict[str, Any] = {
            "id": self.head.get("id"),
            "object": "chat.completion" if self.chat else "text_completion",
            "created": self.head.get("created"),
            "model": self.head.get("model"),
            "choices": [self._choice(i, c) for i, c in sorted(self.choices.items())],
            "usage": self.usage,
        }
        if self.head.get("system_fingerprint") is not None:
            out["system_fingerprint"] = self.head["system_fingerprint"]
        if self.chat:
            out["prompt_token_ids"] = self.prompt_token_ids
        return out

    def _choice(self, index: int, c: _Choice) -> dict[str, Any]:
        out: dict[str, Any] = {"index": index}
        if self.chat:
            calls = [
                {"id": t.id, "type": t.type, "function": {"name": t.name, "arguments": "".join(t.arguments)}}
                for _, t in sorted(c.tool_calls.items())
            ]
            text = "".join(c.content)
            message: dict[str, Any] = {
                "role": c.role,
                "content": text if text or not calls else None,
                "tool_calls": calls,
            }
            if c.reasoning:
                message["reasoning_content"] = "".join(c.reasoning)
            out["message"] = message
            out["logprobs"] = {"content": c.logprobs} if c.has_logprobs else None
        else:
            out["text"] = "".join(c.content)
            out["logprobs"] = (
                {
                    "text_offset": c.text_offset,
                    "token_logprobs": c.token_logprobs,
                    "tokens": c.tokens,
                    "top_logprobs": c.top_logprobs or None,
                }
                if c.has_logprobs
                else None
            )
            out["prompt_token_ids"] = c.prompt_token_ids
        out["finish_reason"] = c.finish_reason
        out["stop_reason"] = c.stop_reason
        out["token_ids"] = c.token_ids if c.has_token_ids else None
        return out


def parse_event(payload: bytes) -> Any:
    """The JSON of an event's data, or None when it is not JSON."""
    try:
        return orjson.loads(payload)
    except orjson.JSONDecodeError:
        return None
