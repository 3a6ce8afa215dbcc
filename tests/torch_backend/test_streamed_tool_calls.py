"""Hermes tool calls streamed as vLLM streams them: name first, arguments at the close, and the
deltas add up to the non-streamed answer."""

from __future__ import annotations

import json
from typing import Any

from agentlightning.torch_backend.protocol import StreamedToolCalls, parse_tool_calls

CALLS = (
    'Let me see. <tool_call>\n{"name": "calculator", "arguments": {"expression": "7+5"}}\n</tool_call>'
    '<tool_call>{"arguments":{"x":1},"name":"lookup"}</tool_call> trailing text is dropped'
)


def stream(text: str, step: int) -> tuple[list[dict[str, Any]], bool]:
    parser = StreamedToolCalls()
    deltas = [parser.feed(text[i : i + step]) for i in range(0, len(text), step)]
    last, called = parser.finish()
    return [*deltas, last], called


def assemble(deltas: list[dict[str, Any]]) -> tuple[str, dict[int, dict[str, str]]]:
    content = ""
    calls: dict[int, dict[str, str]] = {}
    for d in deltas:
        content += d.get("content", "")
        for tc in d.get("tool_calls", []):
            call = calls.setdefault(tc["index"], {"name": "", "arguments": ""})
            call["name"] += tc.get("function", {}).get("name", "")
            call["arguments"] += tc.get("function", {}).get("arguments", "")
    return content, calls


def test_deltas_add_up_to_the_non_streamed_parse_at_any_chunking() -> None:
    parsed = parse_tool_calls(CALLS)
    assert parsed is not None
    content, calls = parsed
    for step in (1, 2, 5, 13, len(CALLS)):
        deltas, called = stream(CALLS, step)
        assert called
        streamed_content, streamed_calls = assemble(deltas)
        assert streamed_content == content
        assert [streamed_calls[i] for i in sorted(streamed_calls)] == [c["function"] for c in calls]


def test_the_name_goes_out_before_the_call_closes() -> None:
    text = '<tool_call>{"name": "calculator", "arguments": {"expression": "1+1"}}</tool_call>'
    parser = StreamedToolCalls()
    name_at = args_at = None
    for i, ch in enumerate(text):
        for tc in parser.feed(ch).get("tool_calls", []):
            if tc.get("function", {}).get("name"):
                name_at = i
                assert tc["id"].startswith("chatcmpl-tool-") and tc["type"] == "function"
            if tc.get("function", {}).get("arguments"):
                args_at = i
                assert json.loads(tc["function"]["arguments"]) == {"expression": "1+1"}
    assert name_at is not None and args_at is not None
    assert name_at < text.index("arguments") and args_at == len(text) - 1


def test_text_that_is_no_valid_call_ends_as_content() -> None:
    text = "a <tool_call>{not json"
    deltas, called = stream(text, 3)
    assert not called
    assert assemble(deltas) == (text, {})
