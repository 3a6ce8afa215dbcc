"""Tokens in, tokens out, end to end against the fake model server with vLLM's scale-out
endpoints: a harness that re-serializes the model's tool call (other JSON spacing) would break
the rollout into rows on pass-through; on the token path the proxy puts back the tokens the
model wrote, every API stays one row, and a real change of history is a new segment with its
reason. Real vLLM: tests/vllm/test_agent_apis.py."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any, cast

import anthropic
import httpx
import openai
import pytest
from aiohttp import web
from anthropic.types import MessageParam, ToolParam
from openai.types.chat import (
    ChatCompletionMessageParam,
    ChatCompletionMessageToolCallParam,
    ChatCompletionToolParam,
)
from openai.types.responses import FunctionToolParam, ResponseInputParam

from agentlightning.aggregation import AggregationStats, aggregate_rollout
from agentlightning.client import GatewayClient
from agentlightning.openai_server.app import OpenAIServer
from agentlightning.openai_server.backend import BadRequest, Call
from agentlightning.schemas import Model, RolloutCreate
from agentlightning.server.proxy.token_stream import merged
from tests.conftest import RunningGateway, start_gateway
from tests.fakes.model_server import (
    END,
    FakeModelServer,
    FakeState,
    Reply,
    ToolCall,
    ToyBackend,
    build_app,
    chat_prompt_ids,
    encode,
)
from tests.server.test_proxy import wait_for

KEY = "exact-key"
# The model writes JSON with spaces; every harness below sends it back compact (the Anthropic
# route itself writes a tool_use's input compactly).
WRITTEN = '{"expr": "3*3"}'
CHAT_TOOLS: list[ChatCompletionToolParam] = [
    {"type": "function", "function": {"name": "calc", "parameters": {"type": "object"}}}
]
# The SDK's type requires `strict`, which the API defaults.
RESPONSES_TOOLS: list[FunctionToolParam] = [
    {"type": "function", "name": "calc", "parameters": {"type": "object"}}  # type: ignore[typeddict-item]
]
ANTHROPIC_TOOLS: list[ToolParam] = [{"name": "calc", "input_schema": {"type": "object"}}]
QUESTION = "what is 3*3"


def compact(arguments: str) -> str:
    return json.dumps(json.loads(arguments), separators=(",", ":"))


@pytest.fixture(scope="module")
def gateways(
    tmp_path_factory: pytest.TempPathFactory, scale_out_fake: FakeModelServer
) -> Iterator[dict[str, RunningGateway]]:
    started = {
        "exact": start_gateway(tmp_path_factory.mktemp("exact"), KEY),
        "pass": start_gateway(tmp_path_factory.mktemp("pass"), KEY, "default_proxy.token_exact=false"),
    }
    try:
        for gw in started.values():
            with GatewayClient(gw.url, KEY) as c:
                c.register_models([Model(model="policy", endpoint=scale_out_fake.base_url, version=1)])
        yield started
    finally:
        for gw in started.values():
            gw.process.stop()


class Rollout:
    def __init__(self, gw: RunningGateway, rollout_id: str | None = None) -> None:
        """A new rollout, or clients for `rollout_id` through another Gateway."""
        self.id = rollout_id or f"r-{uuid.uuid4().hex[:10]}"
        self.client = GatewayClient(gw.url, KEY)
        if rollout_id is None:
            self.client.create_rollouts([RolloutCreate(rollout_id=self.id, input={})])
        root = f"{gw.url}/proxy/rollout/{self.id}/attempt/a1/mode/train"
        self.openai = openai.OpenAI(base_url=root + "/openai/v1", api_key=KEY, max_retries=0)
        self.anthropic = anthropic.Anthropic(base_url=root + "/anthropic", api_key=KEY, max_retries=0)

    def events(self) -> list[dict[str, Any]]:
        return [e["data"] for e in self.client.get_events_json(self.id, format="raw", attempt_id="a1")]

    def rows(self) -> list[Any]:
        triplets = self.client.get_events_json(self.id, format="triplet", attempt_id="a1")
        return aggregate_rollout(triplets, self.id, "g", reward=1.0, stats=AggregationStats())


def chat_loop(rollout: Rollout, stream: bool) -> str:
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": QUESTION}]
    call = rollout.openai.chat.completions.create(model="m", messages=messages, tools=CHAT_TOOLS)
    (tool_call,) = call.choices[0].message.tool_calls or []
    assert tool_call.type == "function" and tool_call.function.arguments == WRITTEN
    resent = {**tool_call.model_dump(), "function": {"name": "calc", "arguments": compact(WRITTEN)}}
    messages += [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [cast(ChatCompletionMessageToolCallParam, resent)],
        },
        {"role": "tool", "tool_call_id": tool_call.id, "content": "9"},
    ]
    if stream:
        chunks = rollout.openai.chat.completions.create(
            model="m", messages=messages, tools=CHAT_TOOLS, stream=True
        )
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return (
        rollout.openai.chat.completions.create(model="m", messages=messages, tools=CHAT_TOOLS)
        .choices[0]
        .message.content
        or ""
    )


def responses_loop(rollout: Rollout, stream: bool) -> str:
    tools = RESPONSES_TOOLS
    first = rollout.openai.responses.create(model="m", input=QUESTION, tools=tools)
    (call,) = [item for item in first.output if item.type == "function_call"]
    items: ResponseInputParam = [
        {"role": "user", "content": QUESTION},
        {
            "type": "function_call",
            "call_id": call.call_id,
            "name": "calc",
            "arguments": compact(call.arguments),
        },
        {"type": "function_call_output", "call_id": call.call_id, "output": "9"},
    ]
    if stream:
        with rollout.openai.responses.stream(model="m", input=items, tools=tools) as events:
            return events.get_final_response().output_text
    return rollout.openai.responses.create(model="m", input=items, tools=tools).output_text


def anthropic_loop(rollout: Rollout, stream: bool) -> str:
    tools = ANTHROPIC_TOOLS
    messages: list[MessageParam] = [{"role": "user", "content": QUESTION}]
    first = rollout.anthropic.messages.create(model="m", max_tokens=50, messages=messages, tools=tools)
    (use,) = [b for b in first.content if b.type == "tool_use"]
    messages += [
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": use.id, "name": "calc", "input": use.input}],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "9"}]},
    ]
    if stream:
        with rollout.anthropic.messages.stream(
            model="m", max_tokens=50, messages=messages, tools=tools
        ) as events:
            return "".join(events.text_stream)
    message = rollout.anthropic.messages.create(model="m", max_tokens=50, messages=messages, tools=tools)
    return "".join(b.text for b in message.content if b.type == "text")


LOOPS = {"chat.completions": chat_loop, "responses": responses_loop, "anthropic.messages": anthropic_loop}
OPENING = Reply(content="hi there")  # the answer `opening` asks for: script it first


def opening(rollout: Rollout) -> list[dict[str, Any]]:
    """One finished exchange, as the history a next call sends: that call continues this turn,
    so the token path serves it with render, generate and derender (a call that continues no
    earlier turn has the server's rendering as its prompt, and goes to the chat API in one
    request)."""
    hi: list[ChatCompletionMessageParam] = [{"role": "user", "content": "say hi"}]
    answer = rollout.openai.chat.completions.create(model="m", messages=hi).choices[0].message
    assert answer.content == OPENING.content
    return [{"role": "user", "content": "say hi"}, {"role": "assistant", "content": answer.content}]


@pytest.mark.parametrize("api", list(LOOPS))
def test_a_re_serialized_tool_call_keeps_the_rollout_one_row(
    gateways: dict[str, RunningGateway], scale_out_fake: FakeModelServer, api: str
) -> None:
    for stream in (False, True):
        scale_out_fake.state.reset()
        scale_out_fake.script(
            Reply(content="", tool_calls=[ToolCall("calc", WRITTEN)]), Reply(content="it is 9")
        )
        rollout = Rollout(gateways["exact"])
        assert LOOPS[api](rollout, stream) == "it is 9"
        first, second = rollout.events()
        assert first["api"] == api and first["segment"] == {
            "continues": False,
            "token_exact": True,
            "first": True,
        }
        assert second["segment"] == {"continues": True, "token_exact": True} and second["stream"] is stream
        paths = [r["path"] for r in scale_out_fake.requests]
        steps = [p for i, p in enumerate(paths) if i == 0 or paths[i - 1] != p]
        # The first call continues nothing: the chat API serves it, one request. The second
        # continues it: render, generate on the tokens, derender.
        assert steps == [
            "/v1/chat/completions",
            "/v1/chat/completions/render",
            "/inference/v1/generate",
            "/v1/chat/completions/derender",
        ]
        # A stream, in every API, is derendered event by event (events that arrive together as
        # one: at most one request a token), then whole.
        streamed_derenders = len(paths) - 4
        if stream:
            assert 1 <= streamed_derenders <= len("it is 9".split()) + 1
        else:
            assert streamed_derenders == 0
        render, generate = scale_out_fake.requests[1]["body"], scale_out_fake.requests[2]["body"]
        # The prompt the model saw: the first call's prompt and answer as generated, then what is new.
        sequence = first["response"]["prompt_token_ids"] + first["response"]["choices"][0]["token_ids"]
        assert generate["token_ids"][: len(sequence)] == sequence
        assert generate["token_ids"] == second["response"]["prompt_token_ids"]
        rendered = chat_prompt_ids(render["messages"])
        assert rendered != generate["token_ids"]  # the re-rendered call differs from what the model wrote
        end = rendered.index(END, len(first["response"]["prompt_token_ids"]))  # the re-rendered answer's end
        assert generate["token_ids"][len(sequence) :] == rendered[end + 1 :]
        (row,) = rollout.rows()
        assert row.n_calls == 2 and row.rollout_log_probs is not None

    # Pass-through: the same loop re-rendered by the server breaks, and says where and why.
    scale_out_fake.state.reset()
    scale_out_fake.script(Reply(content="", tool_calls=[ToolCall("calc", WRITTEN)]), Reply(content="it is 9"))
    rollout = Rollout(gateways["pass"])
    assert LOOPS[api](rollout, False) == "it is 9"
    first, second = rollout.events()
    assert first["segment"] == {"continues": False, "token_exact": False, "first": True}
    broken = second["segment"]["break"]
    assert broken["reason"] == "rerendered"
    sequence = first["response"]["prompt_token_ids"] + first["response"]["choices"][0]["token_ids"]
    assert len(first["response"]["prompt_token_ids"]) < broken["index"] < len(sequence)
    assert len(rollout.rows()) == 2


@pytest.mark.parametrize("stream", [False, True])
def test_a_call_that_continues_no_turn_is_one_chat_request_recorded_as_the_token_path_would(
    gateways: dict[str, RunningGateway], scale_out_fake: FakeModelServer, stream: bool
) -> None:
    """An attempt's first call: the server's rendering is its prompt whatever the token path
    would do, so the server's chat API serves it, one request instead of render, generate and
    derender, with the same ids recorded and the attempt's history noted (the next call goes on
    from it on the token path's steps)."""
    scale_out_fake.state.reset()
    scale_out_fake.script(Reply(content="it is 9"), Reply(content="yes"))
    rollout = Rollout(gateways["exact"])
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": QUESTION}]
    if stream:
        chunks = rollout.openai.chat.completions.create(model="m", messages=messages, stream=True)
        said = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    else:
        said = (
            rollout.openai.chat.completions.create(model="m", messages=messages).choices[0].message.content
            or ""
        )
    assert said == "it is 9"
    assert [r["path"] for r in scale_out_fake.requests] == ["/v1/chat/completions"]
    (event,) = rollout.events()
    assert event["segment"] == {"continues": False, "token_exact": True, "first": True}
    assert event["response"]["prompt_token_ids"] == chat_prompt_ids([{"role": "user", "content": QUESTION}])
    assert event["response"]["choices"][0]["token_ids"] == [*encode("it is 9"), END]
    assert event["response"]["choices"][0]["logprobs"]["content"]  # train mode: the log-probs too

    messages += [{"role": "assistant", "content": said}, {"role": "user", "content": "sure?"}]
    rollout.openai.chat.completions.create(model="m", messages=messages)
    assert [r["path"] for r in scale_out_fake.requests][1:] == [
        "/v1/chat/completions/render",
        "/inference/v1/generate",
        "/v1/chat/completions/derender",
    ]
    first, second = rollout.events()
    assert second["segment"] == {"continues": True, "token_exact": True}
    sequence = first["response"]["prompt_token_ids"] + first["response"]["choices"][0]["token_ids"]
    assert second["response"]["prompt_token_ids"][: len(sequence)] == sequence
    (row,) = rollout.rows()
    assert row.n_calls == 2


def test_a_compacted_history_starts_a_new_segment(
    gateways: dict[str, RunningGateway], scale_out_fake: FakeModelServer
) -> None:
    scale_out_fake.state.reset()
    scale_out_fake.script(
        Reply(content="step one"), Reply(content="step two"), Reply(content="from the summary")
    )
    rollout = Rollout(gateways["exact"])
    messages: list[ChatCompletionMessageParam] = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": QUESTION},
    ]
    for _ in range(2):
        answer = rollout.openai.chat.completions.create(model="m", messages=messages).choices[0].message
        messages += [{"role": "assistant", "content": answer.content}, {"role": "user", "content": "go on"}]
    summary: list[ChatCompletionMessageParam] = [
        messages[0],
        {"role": "user", "content": "summary: step one, step two. go on"},
    ]
    rollout.openai.chat.completions.create(model="m", messages=summary)
    events = rollout.events()
    assert [e["segment"]["continues"] for e in events] == [False, True, False]
    broken = events[2]["segment"]["break"]
    assert broken["reason"] == "history_shortened"
    assert events[2]["response"]["prompt_token_ids"] == chat_prompt_ids(summary)
    rows = rollout.rows()
    assert [row.n_calls for row in rows] == [2, 1] and all(sum(row.response_mask) for row in rows)
    metrics = httpx.get(f"{gateways['exact'].url}/metrics", headers={"Authorization": f"Bearer {KEY}"}).text
    assert 'agl_proxy_history_breaks_total{reason="history_shortened"}' in metrics


def test_an_upstream_without_the_endpoints_is_passed_through(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    with FakeModelServer() as plain:  # answers 403 on the scale-out endpoints, as vLLM without the flag
        gw = start_gateway(tmp_path_factory.mktemp("plain"), KEY)
        try:
            with GatewayClient(gw.url, KEY) as c:
                c.register_models([Model(model="policy", endpoint=plain.base_url, version=1)])
            rollout = Rollout(gw)
            messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]
            for _ in range(3):
                said = rollout.openai.chat.completions.create(model="m", messages=messages).choices[0]
                messages += [
                    {"role": "assistant", "content": said.message.content},
                    {"role": "user", "content": "go on"},
                ]
            # The first call continues nothing (the chat API serves it either way); the second
            # finds render refused (a 403 the fake answers before it logs a request) and is
            # passed through, as every later call.
            assert [r["path"] for r in plain.requests] == ["/v1/chat/completions"] * 3
            assert gw.process.log_path is not None
            assert "token_path_off" in gw.process.log_path.read_text()
            events = rollout.events()
            assert [e["segment"]["token_exact"] for e in events] == [True, False, False]
            assert events[0]["response"]["prompt_token_ids"] == chat_prompt_ids(
                [{"role": "user", "content": "hi"}]
            )
        finally:
            gw.process.stop()


def test_a_token_path_stream_reaches_the_agent_while_the_model_generates(
    gateways: dict[str, RunningGateway], scale_out_fake: FakeModelServer
) -> None:
    """The first chunk comes while generate is held after two tokens (at the fake's gate); the
    chunks carry the token ids; the recorded call is the one a call that is not streamed records."""
    words = "one two three four five"
    scale_out_fake.state.reset()
    scale_out_fake.script(
        OPENING, Reply(content=words, gate="held", gate_after_chunks=2), OPENING, Reply(content=words)
    )
    rollout = Rollout(gateways["exact"])
    hi = cast(list[ChatCompletionMessageParam], [*opening(rollout), {"role": "user", "content": "count"}])
    agent = rollout.openai.with_options(timeout=60)  # no first chunk before the gate opens: a failure
    stream = agent.chat.completions.create(
        model="m", messages=hi, stream=True, stream_options={"include_usage": True}, logprobs=True
    )
    chunks = iter(stream)
    first = next(chunks)
    # While generate is held after two tokens: it has not finished. (Events that arrive together
    # are derendered together.)
    assert first.choices[0].delta.content in ("one", "one two")
    scale_out_fake.open_gate("held")
    rest = list(chunks)
    text = "".join(c.choices[0].delta.content or "" for c in [first, *rest] if c.choices)
    assert text == words
    ids = [
        t
        for c in [first, *rest]
        if c.choices
        for t in (c.choices[0].model_extra or {}).get("token_ids") or []
    ]
    assert rest[-1].usage is not None and rest[-1].usage.completion_tokens == len(ids)

    other = Rollout(gateways["exact"])
    opening(other)
    other.openai.chat.completions.create(model="m", messages=hi, logprobs=True)
    (_, streamed), (_, whole) = rollout.events(), other.events()
    assert (first.model_extra or {})["prompt_token_ids"] == whole["response"]["prompt_token_ids"]
    assert streamed["segment"] == {"continues": True, "token_exact": True}
    assert streamed["status"] == "ok" and streamed["stream"] is True and not streamed["incomplete"]
    assert (
        streamed["response"]["choices"][0]["token_ids"] == ids == whole["response"]["choices"][0]["token_ids"]
    )
    for key in ("message", "logprobs", "finish_reason"):
        assert streamed["response"]["choices"][0][key] == whole["response"]["choices"][0][key]
    assert streamed["response"]["prompt_token_ids"] == whole["response"]["prompt_token_ids"]
    assert streamed["segment"] == whole["segment"]


def test_a_streamed_tool_call_reaches_the_agent_as_the_non_streamed_one(
    gateways: dict[str, RunningGateway], scale_out_fake: FakeModelServer
) -> None:
    scale_out_fake.state.reset()
    scale_out_fake.script(*[OPENING, Reply(content="", tool_calls=[ToolCall("calc", WRITTEN)])] * 2)
    answers = []
    for stream in (True, False):
        rollout = Rollout(gateways["exact"])
        messages = cast(
            list[ChatCompletionMessageParam], [*opening(rollout), {"role": "user", "content": QUESTION}]
        )
        if stream:
            chunks = list(
                rollout.openai.chat.completions.create(
                    model="m", messages=messages, tools=CHAT_TOOLS, stream=True
                )
            )
            deltas = [call for c in chunks if c.choices for call in c.choices[0].delta.tool_calls or []]
            assert len(deltas) > 2  # the arguments come in pieces, as the model writes them
            name = next(d.function.name for d in deltas if d.function and d.function.name)
            arguments = "".join(d.function.arguments or "" for d in deltas if d.function)
            assert (name, arguments) == ("calc", WRITTEN)
            assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
        else:
            rollout.openai.chat.completions.create(model="m", messages=messages, tools=CHAT_TOOLS)
        _, event = rollout.events()
        assert event["segment"] == {"continues": True, "token_exact": True}
        answers.append(event["response"]["choices"][0])
    streamed, whole = answers
    assert streamed["message"]["tool_calls"][0]["function"] == whole["message"]["tool_calls"][0]["function"]
    assert (streamed["token_ids"], streamed["finish_reason"]) == (whole["token_ids"], whole["finish_reason"])


def first_text_and_the_rest(
    rollout: Rollout, api: str, history: list[dict[str, Any]], question: str
) -> tuple[str, Any]:
    """Open a stream in `api` (the official SDK, raw events) with `history` and the user's
    `question`; the text of the first event that carries some, and an iterator over the events
    after it."""
    messages: Any = [*history, {"role": "user", "content": question}]
    if api == "anthropic.messages":
        events: Any = iter(
            rollout.anthropic.with_options(timeout=60).messages.create(
                model="m", max_tokens=50, messages=messages, stream=True
            )
        )
        kind, field = "content_block_delta", "text"
    else:
        events = iter(
            rollout.openai.with_options(timeout=60).responses.create(model="m", input=messages, stream=True)
        )
        kind, field = "response.output_text.delta", "delta"
    for event in events:
        if event.type == kind:
            text = getattr(event.delta, field) if api == "anthropic.messages" else event.delta
            return text, events
    raise AssertionError(f"the {api} stream ended without text")


@pytest.mark.parametrize("path", ["exact", "pass"])
@pytest.mark.parametrize("api", ["responses", "anthropic.messages"])
def test_a_responses_or_messages_stream_streams_as_the_model_generates(
    gateways: dict[str, RunningGateway], scale_out_fake: FakeModelServer, api: str, path: str
) -> None:
    """The Responses and Messages APIs stream in their own event format while the model is held
    after two tokens (generate on the token path, the chat stream on pass-through); the recorded
    call is the one a call that is not streamed records, and the answer recorded carries the ids
    the agent was sent."""
    words = "one two three four five"
    scale_out_fake.state.reset()
    scale_out_fake.script(
        OPENING, Reply(content=words, gate="held", gate_after_chunks=2), OPENING, Reply(content=words)
    )
    rollout = Rollout(gateways[path])
    history = opening(rollout)  # the streamed call goes on from it: the token path's steps serve it
    first, rest = first_text_and_the_rest(rollout, api, history, "count")
    assert first in ("one", "one two")  # while generate is held after two tokens: not finished
    scale_out_fake.open_gate("held")
    events = list(rest)
    if api == "anthropic.messages":
        text = first + "".join(e.delta.text for e in events if e.type == "content_block_delta")
        assert [e.type for e in events][-2:] == ["message_delta", "message_stop"]
        assert events[-2].delta.stop_reason == "end_turn" and events[-2].usage.output_tokens > 0
    else:
        text = first + "".join(e.delta for e in events if e.type == "response.output_text.delta")
        assert events[-1].type == "response.completed"
        assert events[-1].response.output_text == words
    assert text == words

    other = Rollout(gateways[path])
    again: Any = [*opening(other), {"role": "user", "content": "count"}]
    if api == "anthropic.messages":
        other.anthropic.messages.create(model="m", max_tokens=50, messages=again)
    else:
        other.openai.responses.create(model="m", input=again)
    (_, streamed), (_, whole) = rollout.events(), other.events()
    assert streamed["segment"]["token_exact"] is (path == "exact")
    assert streamed["status"] == "ok" and streamed["stream"] is True and not streamed["incomplete"]
    for key in ("token_ids", "message", "logprobs", "finish_reason"):
        assert streamed["response"]["choices"][0][key] == whole["response"]["choices"][0][key]
    assert streamed["response"]["prompt_token_ids"] == whole["response"]["prompt_token_ids"]
    assert streamed["segment"] == whole["segment"]
    final = events[-1].response if api == "responses" else None
    if final is not None:  # the response the agent completed with is the one recorded
        assert streamed["api_response"]["id"] == final.id
        assert [i["id"] for i in streamed["api_response"]["output"]] == [i.id for i in final.output]


@pytest.mark.parametrize("goes_on", [False, True], ids=["chat-api", "token-steps"])
@pytest.mark.parametrize("api", ["responses", "anthropic.messages"])
def test_a_streamed_tool_call_in_responses_or_messages_comes_in_pieces_with_the_recorded_id(
    gateways: dict[str, RunningGateway], scale_out_fake: FakeModelServer, api: str, goes_on: bool
) -> None:
    """On the token path, an attempt's first call (the server's chat stream, re-spoken) and a
    call that goes on from it (generate and the streamed derender)."""
    scale_out_fake.state.reset()
    tool_reply = Reply(content="", tool_calls=[ToolCall("calc", WRITTEN)])
    scale_out_fake.script(*([OPENING, tool_reply] if goes_on else [tool_reply]))
    rollout = Rollout(gateways["exact"])
    history: Any = opening(rollout) if goes_on else []
    if api == "anthropic.messages":
        question: list[MessageParam] = [*history, {"role": "user", "content": QUESTION}]
        with rollout.anthropic.messages.stream(
            model="m", max_tokens=50, messages=question, tools=ANTHROPIC_TOOLS
        ) as s:
            pieces = sum(e.type == "input_json" for e in s)
            message = s.get_final_message()
        (use,) = [b for b in message.content if b.type == "tool_use"]
        called = (use.id, use.name, use.input)
        assert message.stop_reason == "tool_use"
    else:
        items: ResponseInputParam = [*history, {"role": "user", "content": QUESTION}]
        with rollout.openai.responses.stream(model="m", input=items, tools=RESPONSES_TOOLS) as r:
            pieces = sum(e.type == "response.function_call_arguments.delta" for e in r)
            response = r.get_final_response()
        (call,) = [i for i in response.output if i.type == "function_call"]
        called = (call.call_id, call.name, json.loads(call.arguments))
    assert pieces >= 2  # the arguments come in pieces, as the model writes them
    assert called[1:] == ("calc", json.loads(WRITTEN))
    event = rollout.events()[-1]
    assert event["segment"]["continues"] is goes_on and event["segment"]["token_exact"] is True
    recorded = event["api_response"]
    if api == "anthropic.messages":
        (block,) = [b for b in recorded["content"] if b["type"] == "tool_use"]
        assert (block["id"], block["name"], block["input"]) == called
    else:
        (item,) = [i for i in recorded["output"] if i["type"] == "function_call"]
        assert (item["call_id"], item["name"], json.loads(item["arguments"])) == called


def test_a_token_path_stream_sends_the_first_tokens_at_once_and_the_rest_each_interval(
    tmp_path_factory: pytest.TempPathFactory, scale_out_fake: FakeModelServer
) -> None:
    """`proxy.token_stream_interval_ms`: the first events go to derender and the agent at once,
    later ones wait until the interval since the last chunk is up (here, longer than the whole
    answer: until generation finishes), one derender request for them all."""
    words = " ".join(f"w{i}" for i in range(20))
    gw = start_gateway(tmp_path_factory.mktemp("interval"), KEY, "proxy.token_stream_interval_ms=600000")
    try:
        with GatewayClient(gw.url, KEY) as c:
            c.register_models([Model(model="policy", endpoint=scale_out_fake.base_url, version=1)])
        scale_out_fake.state.reset()
        scale_out_fake.script(OPENING, Reply(content=words, gate="later", gate_after_chunks=2))
        rollout = Rollout(gw)
        messages: Any = [*opening(rollout), {"role": "user", "content": "count"}]
        chunks = iter(
            rollout.openai.with_options(timeout=60).chat.completions.create(
                model="m", messages=messages, stream=True
            )
        )
        first = next(chunks)  # while generate is held after two tokens
        assert first.choices[0].delta.content in ("w0", "w0 w1")
        scale_out_fake.open_gate("later")
        rest = [c for c in chunks if c.choices]
        text = "".join(c.choices[0].delta.content or "" for c in [first, *rest])
        assert text == words
        derenders = [r["body"] for r in scale_out_fake.requests if r["path"].endswith("/derender")]
        streamed = [b for b in derenders if b.get("stream")]
        # the first read (one or both tokens before the hold), then the rest at the finish; and
        # the whole answer once more, for the record
        assert len(streamed) == 2 and len(derenders) == 3
        assert len(streamed[-1]["generate_chunk"]["choices"][0]["token_ids"]) >= 18
        _, event = rollout.events()
        assert event["response"]["choices"][0]["message"]["content"] == words
    finally:
        gw.process.stop()


def test_generate_events_that_arrive_together_go_to_derender_as_one() -> None:
    def event(ids: list[int], finish: str | None = None) -> dict[str, Any]:
        content = [{"token_id": t, "logprob": -0.5} for t in ids]
        choice = {"index": 0, "token_ids": ids, "logprobs": {"content": content}, "finish_reason": finish}
        return {"request_id": "g", "choices": [choice]}

    one = merged([event([7, 8]), event([9]), event([2], "stop")])
    assert one["request_id"] == "g"
    (choice,) = one["choices"]
    assert choice["token_ids"] == [7, 8, 9, 2] and choice["finish_reason"] == "stop"
    assert [e["token_id"] for e in choice["logprobs"]["content"]] == [7, 8, 9, 2]
    assert merged([event([5])]) == event([5])


def test_an_agent_leaving_a_token_path_stream_closes_generate_and_leaves_an_incomplete_event(
    gateways: dict[str, RunningGateway], scale_out_fake: FakeModelServer
) -> None:
    scale_out_fake.state.reset()
    scale_out_fake.script(OPENING, Reply(content="one two three four five", gate="left", gate_after_chunks=2))
    rollout = Rollout(gateways["exact"])
    url = (
        f"{gateways['exact'].url}/proxy/rollout/{rollout.id}/attempt/a1/mode/train/openai/v1/chat/completions"
    )
    messages = [*opening(rollout), {"role": "user", "content": "count"}]
    body = {"model": "m", "messages": messages, "stream": True}
    with httpx.stream("POST", url, json=body, headers={"Authorization": f"Bearer {KEY}"}, timeout=60) as r:
        for line in r.iter_lines():
            if line:
                break  # the agent goes away after its first chunk, while generate is held
    assert wait_for(lambda: len(rollout.events()) == 2)
    _, event = rollout.events()
    assert event["segment"] == {"continues": True, "token_exact": True}  # generate was streaming it
    assert (event["incomplete"], event["status"], event["stream"]) == (True, "error", True)
    assert "disconnected" in event["error"]
    assert event["response"]["choices"][0]["token_ids"] == encode("one two")  # what came before the hold
    assert wait_for(lambda: scale_out_fake.state.active == 0), "generate was closed (vLLM aborts it)"
    scale_out_fake.open_gate("left")


class WholeGenerate(ToyBackend):
    """The toy model with vLLM's token endpoints, whose generate answers whole even when asked
    for a stream (an engine without generate streaming)."""

    async def generate(self, call: Call) -> Any:
        return await super().generate(Call(call.path, {**call.body, "stream": False}))


def test_a_token_path_stream_from_a_generate_that_does_not_stream(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    state = FakeState()
    state.scale_out = True
    with OpenAIServer(build_app(state, WholeGenerate(state))) as upstream:
        gw = start_gateway(tmp_path_factory.mktemp("whole-generate"), KEY)
        try:
            with GatewayClient(gw.url, KEY) as c:
                c.register_models([Model(model="policy", endpoint=upstream.base_url, version=1)])
            rollout = Rollout(gw)
            state.script(OPENING, Reply(content="all at once"))
            messages: Any = [*opening(rollout), {"role": "user", "content": "and now?"}]
            chunks = list(rollout.openai.chat.completions.create(model="m", messages=messages, stream=True))
            assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "all at once"
            assert [r["path"] for r in state.requests] == [
                "/v1/chat/completions",  # the opening
                "/v1/chat/completions/render",
                "/inference/v1/generate",
                "/v1/chat/completions/derender",
            ]
            _, event = rollout.events()
            assert event["status"] == "ok" and event["segment"] == {"continues": True, "token_exact": True}
        finally:
            gw.process.stop()


def catch_all_server(paths: list[str], token_ids: bool = False) -> OpenAIServer:
    """A simple fake OpenAI server, as a new user writes one: every POST, whatever its path, answers
    200 with the same chat completion (its paths are appended to `paths`); with `token_ids`, one
    that also returns the prompt's and the answer's token ids, as vLLM's chat API does."""
    completion: dict[str, Any] = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "hello"}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
    }
    if token_ids:
        completion["prompt_token_ids"] = [11, 12, 13]
        completion["choices"][0]["token_ids"] = [14, END]

    async def answer(request: web.Request) -> web.Response:
        paths.append(request.path)
        return web.json_response(completion)

    app = web.Application()
    app.router.add_post("/{path:.*}", answer)
    return OpenAIServer(app)


@pytest.mark.parametrize("token_ids", [False, True], ids=["plain", "with-token-ids"])
def test_an_upstream_that_answers_any_path_is_passed_through(
    tmp_path_factory: pytest.TempPathFactory, token_ids: bool
) -> None:
    """A 200 on the render path is not vLLM's render unless its body is: such an upstream is
    served by pass-through (the Gateway says so once, in a warning, when a call that goes on from
    an earlier one tried the token path), every API's call succeeds and is recorded. Without
    token ids there is no turn to go on from: render is never asked."""
    paths: list[str] = []
    with catch_all_server(paths, token_ids) as upstream:
        gw = start_gateway(tmp_path_factory.mktemp("catch-all"), KEY)
        try:
            with GatewayClient(gw.url, KEY) as c:
                c.register_models([Model(model="policy", endpoint=upstream.base_url, version=1)])
            rollout = Rollout(gw)
            messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]
            for _ in range(2):
                answer = rollout.openai.chat.completions.create(model="m", messages=messages)
                assert answer.choices[0].message.content == "hello"
                messages += [{"role": "assistant", "content": "hello"}, {"role": "user", "content": "again"}]
            assert rollout.openai.responses.create(model="m", input="hi").output_text == "hello"
            message = rollout.anthropic.messages.create(
                model="m", max_tokens=16, messages=[{"role": "user", "content": "hi"}]
            )
            block = message.content[0]
            assert block.type == "text" and block.text == "hello"
            # render tried once, by the call that goes on from the first, found not to be vLLM's;
            # then every call passed through
            tried = ["/v1/chat/completions/render"] if token_ids else []
            assert paths == ["/v1/chat/completions", *tried] + ["/v1/chat/completions"] * 3
            events = rollout.events()
            assert [(e["status"], e["http_status"]) for e in events] == [("ok", 200)] * 4
            assert [e["api"] for e in events] == [
                "chat.completions",
                "chat.completions",
                "responses",
                "anthropic.messages",
            ]
            assert gw.process.log_path is not None
            warnings = [
                line for line in gw.process.log_path.read_text().splitlines() if "token_path_off" in line
            ]
            assert len(warnings) == int(token_ids)
            if token_ids:
                assert upstream.base_url in warnings[0] and "not vLLM's answer: no 'token_ids'" in warnings[0]
        finally:
            gw.process.stop()


GARBAGE = {"id": "x", "object": "text_completion", "choices": [{"index": 0, "text": "garbage"}]}


class BrokenStep(ToyBackend):
    """The toy model with vLLM's token endpoints, one of which answers 200 with another body
    (`garbage`) or is not there (`missing`: 404, as behind a proxy that forwards only /v1)."""

    def __init__(self, state: FakeState, step: str, fault: str = "garbage") -> None:
        super().__init__(state)
        self.step, self.fault = step, fault

    def _broken(self) -> dict[str, Any]:
        if self.fault == "missing":
            raise BadRequest("Not Found", 404, "NotFoundError")
        return GARBAGE

    async def generate(self, call: Call) -> Any:
        return self._broken() if self.step == "generate" else await super().generate(call)

    async def derender(self, call: Call) -> dict[str, Any]:
        return self._broken() if self.step == "derender" else await super().derender(call)


@pytest.mark.parametrize(
    ("step", "path", "problem"),
    [
        ("generate", "/inference/v1/generate", "no 'choices[0].token_ids'"),
        ("derender", "/chat/completions/derender", "no 'choices[0].message'"),
    ],
)
def test_a_malformed_token_step_is_a_502_naming_it(
    tmp_path_factory: pytest.TempPathFactory, step: str, path: str, problem: str
) -> None:
    state = FakeState()
    state.scale_out = True
    with OpenAIServer(build_app(state, BrokenStep(state, step))) as upstream:
        gw = start_gateway(tmp_path_factory.mktemp(f"garbage-{step}"), KEY)
        try:
            with GatewayClient(gw.url, KEY) as c:
                c.register_models([Model(model="policy", endpoint=upstream.base_url, version=1)])
            rollout = Rollout(gw)
            state.script(OPENING)
            messages: Any = [*opening(rollout), {"role": "user", "content": "and?"}]
            with pytest.raises(openai.APIStatusError) as raised:
                rollout.openai.chat.completions.create(model="m", messages=messages)
            assert raised.value.status_code == 502
            message = raised.value.message
            assert path in message and problem in message and "garbage" in message
            _, event = rollout.events()
            assert event["status"] == "error" and event["http_status"] == 502
            assert path in event["error"] and problem in event["error"]
        finally:
            gw.process.stop()


@pytest.mark.parametrize("step", ["generate", "derender"])
def test_an_upstream_missing_a_token_step_is_passed_through(
    tmp_path_factory: pytest.TempPathFactory, step: str
) -> None:
    """Render served but generate or derender not (404): the call that found it and the next are
    passed through (the first, continuing nothing, went to the chat API in any case)."""
    state = FakeState()
    state.scale_out = True
    with OpenAIServer(build_app(state, BrokenStep(state, step, "missing"))) as upstream:
        gw = start_gateway(tmp_path_factory.mktemp(f"missing-{step}"), KEY)
        try:
            with GatewayClient(gw.url, KEY) as c:
                c.register_models([Model(model="policy", endpoint=upstream.base_url, version=1)])
            rollout = Rollout(gw)
            state.script(OPENING, Reply(content="one"), Reply(content="two"))
            messages: Any = opening(rollout)
            for _ in range(2):
                messages += [{"role": "user", "content": "go on"}]
                said = rollout.openai.chat.completions.create(model="m", messages=messages).choices[0]
                messages += [{"role": "assistant", "content": said.message.content}]
            chats = [r["path"] for r in state.requests if r["path"] == "/v1/chat/completions"]
            assert len(chats) == 3 and sum(r["path"].endswith("/render") for r in state.requests) == 1
            events = rollout.events()
            assert [(e["status"], e["segment"]["token_exact"]) for e in events] == [
                ("ok", True),
                ("ok", False),
                ("ok", False),
            ]
        finally:
            gw.process.stop()


def send_back_compact(messages: list[dict[str, Any]], message: dict[str, Any]) -> None:
    """Append the model's tool calls to `messages` as harnesses send them back: the arguments
    re-serialized compact, each call answered "9"."""
    for call in message.get("tool_calls") or []:
        function = {"name": call["function"]["name"], "arguments": compact(call["function"]["arguments"])}
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [{**call, "function": function}]},
            {"role": "tool", "tool_call_id": call["id"], "content": "9"},
        ]


def tool_loop_call(rollout: Rollout, messages: list[dict[str, Any]]) -> Any:
    """One call of a chat tool loop that sends the model's tool calls back compact (`messages`:
    the JSON the SDK sends)."""
    sent = cast(list[ChatCompletionMessageParam], messages)
    message = (
        rollout.openai.chat.completions.create(model="m", messages=sent, tools=CHAT_TOOLS).choices[0].message
    )
    send_back_compact(messages, message.model_dump())
    return message


@pytest.mark.parametrize("token_exact", [True, False])
def test_a_restarted_gateway_reads_the_attempt_back_and_keeps_its_segment(
    tmp_path_factory: pytest.TempPathFactory, scale_out_fake: FakeModelServer, token_exact: bool
) -> None:
    """The proxy's history of an attempt is in memory: a Gateway restarted mid-rollout (or another
    replica, or one that forgot the attempt) reads the attempt's calls back from the store when a
    request repeats an answer it did not record, so the rollout stays one segment on the token
    path (the continued call's prompt rendered again) and a pass-through break is still named."""
    scale_out_fake.state.reset()
    scale_out_fake.script(
        Reply(content="", tool_calls=[ToolCall("calc", WRITTEN)]),
        Reply(content="", tool_calls=[ToolCall("calc", '{"expr": "9+1"}')]),
        Reply(content="it is 10"),
    )
    tmp = tmp_path_factory.mktemp("restart")
    overrides = () if token_exact else ("default_proxy.token_exact=false",)
    gw = start_gateway(tmp, KEY, *overrides)
    try:
        with GatewayClient(gw.url, KEY) as c:
            c.register_models([Model(model="policy", endpoint=scale_out_fake.base_url, version=1)])
        rollout = Rollout(gw)
        messages: list[dict[str, Any]] = [{"role": "user", "content": QUESTION}]
        tool_loop_call(rollout, messages)
        tool_loop_call(rollout, messages)
        gw.process.stop()
        gw = start_gateway(tmp, KEY, *overrides, db_path=gw.db_path)  # same store, empty memory
        rollout = Rollout(gw, rollout.id)
        scale_out_fake.state.requests.clear()
        assert tool_loop_call(rollout, messages).content == "it is 10"
        events = rollout.events()
        if not token_exact:
            assert [e["segment"].get("break", {}).get("reason") for e in events] == [
                None,
                "rerendered",
                "rerendered",
            ]
            return
        assert [e["segment"] for e in events] == [
            {"continues": False, "token_exact": True, "first": True},
            {"continues": True, "token_exact": True},
            {"continues": True, "token_exact": True},
        ]
        # The third call: its own render, the second call's request rendered again, generate, derender.
        paths = [r["path"] for r in scale_out_fake.requests]
        assert paths == ["/v1/chat/completions/render"] * 2 + [
            "/inference/v1/generate",
            "/v1/chat/completions/derender",
        ]
        second = events[1]["response"]
        sequence = second["prompt_token_ids"] + second["choices"][0]["token_ids"]
        assert scale_out_fake.requests[2]["body"]["token_ids"][: len(sequence)] == sequence
        (row,) = rollout.rows()
        assert row.n_calls == 3
    finally:
        gw.process.stop()
