"""The OpenAI Responses and Anthropic Messages routes, end to end: the official `openai` and
`anthropic` SDKs talk to a real `agl-server` process, which serves each call as a chat call to
the fake vLLM-shaped model server and records it once, with its token ids and log-probs."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest
from anthropic.types import MessageParam, ToolParam
from openai.types.chat import ChatCompletionToolParam
from openai.types.responses import FunctionToolParam, ResponseInputParam

from agentlightning.client import GatewayClient
from agentlightning.schemas import Model, RolloutCreate
from tests.conftest import RunningGateway, start_gateway
from tests.fakes.model_server import FakeModelServer, Reply, ToolCall, chat_prompt_ids

KEY = "apis-key"
PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {"expr": {"type": "string"}},
    "required": ["expr"],
}
# The SDK's type requires `strict`, which the API defaults.
RESPONSES_TOOL: FunctionToolParam = {  # type: ignore[typeddict-item]
    "type": "function",
    "name": "calc",
    "description": "evaluate an arithmetic expression",
    "parameters": PARAMETERS,
}
ANTHROPIC_TOOL: ToolParam = {
    "name": "calc",
    "description": "evaluate an arithmetic expression",
    "input_schema": PARAMETERS,
}
CHAT_TOOL: ChatCompletionToolParam = {
    "type": "function",
    "function": {
        "name": "calc",
        "parameters": PARAMETERS,
        "description": "evaluate an arithmetic expression",
    },
}


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeModelServer]:
    with FakeModelServer() as server:
        yield server


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, fake: FakeModelServer) -> Iterator[RunningGateway]:
    gateway = start_gateway(
        tmp_path_factory.mktemp("apis"), KEY, "proxy.backoff_seconds=0.01", "proxy.max_backoff_seconds=0.02"
    )
    yield gateway
    gateway.process.stop()


@pytest.fixture
def client(gw: RunningGateway, fake: FakeModelServer) -> Iterator[GatewayClient]:
    fake.state.reset()
    with GatewayClient(gw.url, KEY) as c:
        c.delete_models()
        c.register_models([Model(model="policy", endpoint=fake.base_url, version=3)])
        c.resume()
        yield c


def new_rollout(client: GatewayClient) -> str:
    rollout_id = f"r-{uuid.uuid4().hex[:12]}"
    client.create_rollouts([RolloutCreate(rollout_id=rollout_id, input={"q": 1})])
    return rollout_id


def root(gw: RunningGateway, rollout_id: str, mode: str = "train") -> str:
    return f"{gw.url}/proxy/rollout/{rollout_id}/attempt/a1/mode/{mode}"


def openai_sdk(gw: RunningGateway, rollout_id: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=root(gw, rollout_id) + "/openai/v1", api_key=KEY, max_retries=0)


def anthropic_sdk(gw: RunningGateway, rollout_id: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=root(gw, rollout_id) + "/anthropic", api_key=KEY, max_retries=0)


def recorded(client: GatewayClient, rollout_id: str) -> list[dict[str, Any]]:
    return [e["data"] for e in client.get_events_json(rollout_id, format="raw", attempt_id="a1")]


def triplets(client: GatewayClient, rollout_id: str) -> list[dict[str, Any]]:
    return [e["data"] for e in client.get_events_json(rollout_id, format="triplet", attempt_id="a1")]


def upstream_calls(fake: FakeModelServer) -> list[dict[str, Any]]:
    return list(fake.state.requests)


def check_recorded_once(
    client: GatewayClient, fake: FakeModelServer, rollout_id: str, api: str
) -> dict[str, Any]:
    """One event, one upstream chat call; the triplet holds that call's tokens and log-probs."""
    (event,) = recorded(client, rollout_id)
    (call,) = upstream_calls(fake)
    assert call["path"] == "/v1/chat/completions"
    assert event["api"] == api and event["status"] == "ok" and event["server"]["version"] == 3
    assert event["chat_request"]["messages"] == call["body"]["messages"]
    (triplet,) = triplets(client, rollout_id)
    chat = event["response"]
    assert (
        triplet["prompt_token_ids"] == chat_prompt_ids(call["body"]["messages"]) == chat["prompt_token_ids"]
    )
    assert triplet["response_token_ids"] == chat["choices"][0]["token_ids"] and triplet["response_token_ids"]
    assert triplet["response_log_probs"] == [e["logprob"] for e in chat["choices"][0]["logprobs"]["content"]]
    return event


def test_responses_create_with_a_function_tool_and_its_result(
    gw: RunningGateway, client: GatewayClient, fake: FakeModelServer
) -> None:
    rollout_id = new_rollout(client)
    fake.script(Reply(tool_calls=[ToolCall("calc", '{"expr": "2+2"}')]))
    response = openai_sdk(gw, rollout_id).responses.create(
        model="anything", instructions="be brief", input="what is 2+2", tools=[RESPONSES_TOOL]
    )
    (call,) = [item for item in response.output if item.type == "function_call"]
    assert (call.name, call.arguments) == ("calc", '{"expr": "2+2"}')
    event = check_recorded_once(client, fake, rollout_id, "responses")
    assert event["api_response"]["output"][-1]["call_id"] == call.call_id
    (sent,) = upstream_calls(fake)
    assert sent["body"]["tools"] == [CHAT_TOOL] and sent["body"]["logprobs"] is True
    assert sent["body"]["messages"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "what is 2+2"},
    ]

    # The next turn sends the whole history back, with the tool's output.
    fake.state.reset()
    fake.script(Reply(content="it is 4"))
    history: ResponseInputParam = [
        {"role": "user", "content": "what is 2+2"},
        {"type": "function_call", "call_id": call.call_id, "name": "calc", "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "4"},
    ]
    answer = openai_sdk(gw, rollout_id).responses.create(model="m", input=history, tools=[RESPONSES_TOOL])
    assert answer.output_text == "it is 4" and answer.status == "completed"
    assert answer.usage is not None and answer.usage.output_tokens == len(
        recorded(client, rollout_id)[1]["response"]["choices"][0]["token_ids"]
    )
    (sent,) = upstream_calls(fake)
    assert sent["body"]["messages"][1:] == [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call.call_id,
                    "type": "function",
                    "function": {"name": "calc", "arguments": call.arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call.call_id, "content": "4"},
    ]


def test_responses_stream_gives_the_same_answer_and_one_record(
    gw: RunningGateway, client: GatewayClient, fake: FakeModelServer
) -> None:
    rollout_id = new_rollout(client)
    fake.script(Reply(content="a streamed answer"))
    with openai_sdk(gw, rollout_id).responses.stream(model="m", input="hello") as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert final.output_text == "a streamed answer"
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert "response.output_text.delta" in kinds
    event = check_recorded_once(client, fake, rollout_id, "responses")
    assert event["stream"] is True


def test_anthropic_messages_create_and_stream_with_tool_use(
    gw: RunningGateway, client: GatewayClient, fake: FakeModelServer
) -> None:
    rollout_id = new_rollout(client)
    fake.script(Reply(tool_calls=[ToolCall("calc", '{"expr": "3*3"}')]))
    message = anthropic_sdk(gw, rollout_id).messages.create(
        model="anything",
        max_tokens=64,
        system=[{"type": "text", "text": "you calculate"}],
        messages=[{"role": "user", "content": "what is 3*3"}],
        tools=[ANTHROPIC_TOOL],
    )
    assert message.stop_reason == "tool_use"
    (use,) = [block for block in message.content if block.type == "tool_use"]
    assert use.type == "tool_use" and use.name == "calc" and use.input == {"expr": "3*3"}
    check_recorded_once(client, fake, rollout_id, "anthropic.messages")

    fake.state.reset()
    rollout_id = new_rollout(client)
    fake.script(Reply(content="nine"))
    history: list[MessageParam] = [
        {"role": "user", "content": "what is 3*3"},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": use.id, "name": "calc", "input": use.input}],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "9"}]},
    ]
    with anthropic_sdk(gw, rollout_id).messages.stream(
        model="m", max_tokens=64, system="you calculate", messages=history, tools=[ANTHROPIC_TOOL]
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "nine" and final.stop_reason == "end_turn"
    assert final.usage.output_tokens > 0
    event = check_recorded_once(client, fake, rollout_id, "anthropic.messages")
    assert event["chat_request"]["messages"][2:] == [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": use.id,
                    "type": "function",
                    "function": {"name": "calc", "arguments": '{"expr":"3*3"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": use.id, "content": "9"},
    ]


def test_an_anthropic_system_message_among_the_turns_stays_in_its_place(
    gw: RunningGateway, client: GatewayClient, fake: FakeModelServer
) -> None:
    """Claude Code sends its agent list (2.1.197) or environment (2.1.332) as a `system` message after
    the first user turn: it becomes a chat system message in the same place, not a 400."""
    rollout_id = new_rollout(client)
    fake.script(Reply(content="ok"))
    answer = httpx.post(
        root(gw, rollout_id) + "/anthropic/v1/messages",
        json={
            "model": "m",
            "max_tokens": 16,
            "system": [{"type": "text", "text": "you code"}],
            "messages": [
                {"role": "user", "content": "fix it"},
                {
                    "role": "system",
                    "content": [{"type": "text", "text": "agents: "}, {"type": "text", "text": "one"}],
                },
            ],
        },
        headers={"x-api-key": KEY},
    )
    assert answer.status_code == 200, answer.text
    event = check_recorded_once(client, fake, rollout_id, "anthropic.messages")
    assert event["chat_request"]["messages"] == [
        {"role": "system", "content": "you code"},
        {"role": "user", "content": "fix it"},
        {"role": "system", "content": "agents: one"},
    ]


ANTHROPIC_BAD = [
    (b"{not json", "not valid JSON"),
    (b"[1]", "JSON object"),
    (b'{"messages": [{"role": "user", "content": "hi"}]}', "max_tokens"),
    (b'{"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "video"}]}]}', "'video'"),
    (
        b'{"max_tokens": 5, "messages": [{"role": "user", "content": '
        b'[{"type": "tool_result", "tool_use_id": "nope", "content": "1"}]}]}',
        "no earlier tool call",
    ),
    (b'{"max_tokens": 5, "messages": [{"role": "robot", "content": "hi"}]}', "role"),
    (b'{"max_tokens": 5, "messages": "hi"}', "must be a list"),
    (
        b'{"max_tokens": 5, "messages": [{"role": "user", "content": "hi"}, '
        b'{"role": "system", "content": [{"type": "image"}]}]}',
        "only text blocks are allowed in a system message",
    ),
]
RESPONSES_BAD = [
    (b"{not json", "not valid JSON"),
    (b'{"model": "m"}', "'input' is required"),
    (b'{"input": [{"type": "web_search_call"}]}', "'web_search_call'"),
    (
        b'{"input": [{"type": "function_call_output", "call_id": "c9", "output": "1"}]}',
        "no earlier tool call",
    ),
    (b'{"input": "hi", "previous_response_id": "resp_1"}', "Send the whole history"),
    (b'{"input": "hi", "tools": [{"type": "web_search"}]}', "only function tools"),
    (b'{"input": [{"role": "user", "content": [{"type": "input_audio"}]}]}', "'input_audio'"),
]


@pytest.mark.parametrize(("body", "says"), ANTHROPIC_BAD)
def test_bad_anthropic_requests_get_a_400_in_anthropic_shape(
    gw: RunningGateway, client: GatewayClient, fake: FakeModelServer, body: bytes, says: str
) -> None:
    rollout_id = new_rollout(client)
    answer = httpx.post(
        root(gw, rollout_id) + "/anthropic/v1/messages", content=body, headers={"x-api-key": KEY}
    )
    assert answer.status_code == 400, answer.text
    error = answer.json()
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert says in error["error"]["message"]
    assert upstream_calls(fake) == [] and recorded(client, rollout_id) == []


@pytest.mark.parametrize(("body", "says"), RESPONSES_BAD)
def test_bad_responses_requests_get_a_400_in_openai_shape(
    gw: RunningGateway, client: GatewayClient, fake: FakeModelServer, body: bytes, says: str
) -> None:
    rollout_id = new_rollout(client)
    answer = httpx.post(
        root(gw, rollout_id) + "/openai/v1/responses",
        content=body,
        headers={"authorization": f"Bearer {KEY}"},
    )
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["type"] == "invalid_request_error" and says in error["message"]
    assert upstream_calls(fake) == [] and recorded(client, rollout_id) == []


def test_the_sdks_see_their_own_errors_for_pause_and_upstream_refusals(
    gw: RunningGateway, client: GatewayClient, fake: FakeModelServer
) -> None:
    rollout_id = new_rollout(client)
    client.pause(retry_after_seconds=3)
    with pytest.raises(anthropic.RateLimitError) as paused:
        anthropic_sdk(gw, rollout_id).messages.create(
            model="m", max_tokens=8, messages=[{"role": "user", "content": "hi"}]
        )
    assert paused.value.response.json()["error"]["type"] == "rate_limit_error"
    assert paused.value.response.headers["x-agl-paused"] == "true"
    with pytest.raises(openai.RateLimitError):
        openai_sdk(gw, rollout_id).responses.create(model="m", input="hi")
    client.resume()

    # The model server refuses (e.g. a prompt too long): the agent gets that 4xx, in its API's shape.
    fake.script(Reply(status=400, error_body={"error": {"message": "prompt too long"}}))
    with pytest.raises(anthropic.BadRequestError) as refused:
        anthropic_sdk(gw, rollout_id).messages.create(
            model="m", max_tokens=8, messages=[{"role": "user", "content": "hi"}]
        )
    assert "prompt too long" in refused.value.response.json()["error"]["message"]
    (event,) = recorded(client, rollout_id)
    assert event["status"] == "error" and event["http_status"] == 400

    unknown = httpx.post(root(gw, rollout_id) + "/anthropic/v1/complete", json={}, headers={"x-api-key": KEY})
    assert unknown.status_code == 404 and unknown.json()["error"]["type"] == "not_found_error"
