"""Stream assembly: streamed chunks become the answer a plain call returns, byte boundaries aside."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from agentlightning.server.proxy.sse import DONE, EventSplitter, StreamAssembler, event_data, parse_event
from agentlightning.server.triplet import model_request_triplet
from tests.fakes.model_server import Reply, ToolCall, _answer, _Call


def fake_call(api: str, **body: Any) -> tuple[_Call, dict[str, Any]]:
    base: dict[str, Any] = {
        "model": "policy",
        "return_token_ids": True,
        "logprobs": True if api == "chat" else 1,
    }
    base.update(
        {"messages": [{"role": "user", "content": "hi there"}]} if api == "chat" else {"prompt": "hi there"}
    )
    base.update(body)
    return _Call(api, base), base


def stream_bytes(call: _Call, replies: list[Reply]) -> bytes:
    answers = [_answer(r, "unused", call.max_tokens) for r in replies]
    return b"".join(call.chunks(answers))


def assemble(api: str, data: bytes, cut: int) -> StreamAssembler:
    assembler = StreamAssembler("chat.completions" if api == "chat" else "completions")
    splitter = EventSplitter()
    for start in range(0, len(data), cut):
        for event in splitter.feed(data[start : start + cut]):
            payload = event_data(event)
            if payload is not None and payload != DONE:
                assembler.add(parse_event(payload))
    assert splitter.rest() == b""
    return assembler


@pytest.mark.parametrize("cut", [1, 7, 10_000])
@pytest.mark.parametrize("api", ["chat", "completions"])
def test_assembled_stream_equals_the_plain_answer(api: str, cut: int) -> None:
    reply = Reply(content="the answer is four")
    call, _ = fake_call(api, stream=True, stream_options={"include_usage": True})
    assembled = assemble(api, stream_bytes(call, [reply]), cut).response()
    plain = call.response([_answer(reply, "unused", None)])
    if api == "chat":  # completions' text_offset and top_logprobs are per chunk, the rest equal
        assert assembled["choices"] == plain["choices"]
    for key in ("usage", "model", "id", "object"):
        assert assembled[key] == plain[key], key
    got, want = assembled["choices"][0], plain["choices"][0]
    for key in ("token_ids", "finish_reason", "index"):
        assert got[key] == want[key], key
    if api == "chat":
        assert got["message"] == want["message"]
        assert got["logprobs"] == want["logprobs"]
        assert assembled["prompt_token_ids"] == plain["prompt_token_ids"]
    else:
        assert got["text"] == want["text"] and got["prompt_token_ids"] == want["prompt_token_ids"]
        assert got["logprobs"]["token_logprobs"] == want["logprobs"]["token_logprobs"]
        assert got["logprobs"]["tokens"] == want["logprobs"]["tokens"]
    assert model_request_triplet({"response": assembled}) == model_request_triplet({"response": plain})


def test_tool_calls_and_several_choices_interleaved() -> None:
    reply = Reply(
        content="let me see", tool_calls=[ToolCall("calc", '{"x": 1}'), ToolCall("search", '{"q": "y"}')]
    )
    call, _ = fake_call("chat", stream=True, n=2)
    data = stream_bytes(call, [reply, reply])
    assembled = assemble("chat", data, 13).response()
    plain = call.response([_answer(reply, "unused", None), _answer(reply, "unused", None)])
    assert len(assembled["choices"]) == 2
    for got, want in zip(assembled["choices"], plain["choices"], strict=True):
        assert got["message"]["content"] == "let me see"
        assert [t["function"] for t in got["message"]["tool_calls"]] == [
            t["function"] for t in want["message"]["tool_calls"]
        ]
        assert [t["id"] for t in got["message"]["tool_calls"]] == [
            t["id"] for t in want["message"]["tool_calls"]
        ]
        assert got["token_ids"] == want["token_ids"] and got["finish_reason"] == "tool_calls"


def test_splitter_handles_crlf_comments_and_multiline_data() -> None:
    splitter = EventSplitter()
    events = splitter.feed(b': keep-alive\r\n\r\ndata: {"a":\ndata: 1}\n\ndata: [DONE]\n\npartial')
    assert [event_data(e) for e in events] == [None, b'{"a":\n1}', b"[DONE]"]
    assert orjson.loads(event_data(events[1]) or b"") == {"a": 1}
    assert splitter.rest() == b"partial"


def test_a_cut_stream_keeps_what_arrived_and_errors_are_kept() -> None:
    call, _ = fake_call("chat", stream=True)
    data = stream_bytes(call, [Reply(content="one two three")])
    events = EventSplitter().feed(data)
    assembler = StreamAssembler("chat.completions")
    for event in events[:3]:  # role chunk, "one", " two"
        assembler.add(parse_event(event_data(event) or b""))
    choice = assembler.response()["choices"][0]
    assert choice["message"]["content"] == "one two" and choice["finish_reason"] is None
    assert len(choice["token_ids"]) == 2 and len(choice["logprobs"]["content"]) == 2
    assembler.add({"error": {"message": "engine died", "code": 500}})
    assert assembler.error == {"message": "engine died", "code": 500}
    assert parse_event(b"not json") is None
