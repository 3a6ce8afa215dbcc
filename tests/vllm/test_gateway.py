"""The Gateway in front of a real vLLM server: every kind of call is passed through and recorded
with vLLM's own token ids and log-probs, and the triplets' prompt ids are vLLM's tokenization."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam
from pydantic import BaseModel

from agentlightning.client import GatewayClient
from agentlightning.demo.task import TOOLS
from agentlightning.schemas import Model, RolloutCreate
from tests.conftest import RunningGateway

from .conftest import SERVED_NAME, ScriptedVLLM
from .scripted import CHAT_TOOLS, FINAL_ANSWER, QUESTION, TOOL_TURNS, script_messages

pytestmark = pytest.mark.timeout(600)
HELLO: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "Ann has 3 pens and finds two more. How many pens now?"}
]
# The scripted conversation up to its final answer: a prompt the model is sure about, so greedy
# decoding cannot flip between near-equal tokens from one call to the next (off-script prompts can).
FINAL_TURN = script_messages()[:-1]


@pytest.fixture(scope="module")
def client(vllm_gateway: RunningGateway, vllm_server: ScriptedVLLM) -> Iterator[GatewayClient]:
    with GatewayClient(vllm_gateway.url, vllm_gateway.key) as c:
        c.delete_models()
        c.register_models([Model(model=SERVED_NAME, endpoint=vllm_server.endpoint, version=3)])
        yield c


class Rollout:
    """A rollout on the Gateway and the proxy URL an agent gets for it."""

    def __init__(self, gateway: RunningGateway, client: GatewayClient, mode: str = "train") -> None:
        self.id = f"r-{uuid.uuid4().hex[:10]}"
        client.create_rollouts([RolloutCreate(rollout_id=self.id, input={})])
        self.client = client
        self.base = f"{gateway.url}/proxy/rollout/{self.id}/attempt/a1/mode/{mode}/openai/v1"
        self.key = gateway.key
        self.llm = openai.OpenAI(base_url=self.base, api_key=gateway.key, max_retries=0, timeout=120)

    def post(self, path: str, body: dict[str, Any]) -> httpx.Response:
        return httpx.post(
            f"{self.base}/{path}", json=body, headers={"Authorization": f"Bearer {self.key}"}, timeout=120
        )

    def events(self, n: int = 1) -> list[dict[str, Any]]:
        """The raw model_request events (a streamed call's is written as its last bytes go out)."""
        deadline = time.monotonic() + 30
        while True:
            events = [
                e
                for e in self.client.get_events_json(self.id, format="raw", attempt_id="a1")
                if e["event_type"] == "model_request"
            ]
            if len(events) >= n or time.monotonic() > deadline:
                return events

    def triplets(self) -> list[dict[str, Any]]:
        return [e["data"] for e in self.client.get_events_json(self.id, format="triplet", attempt_id="a1")]


def extra(answer: BaseModel, key: str) -> Any:
    """A field vLLM adds to an OpenAI object (`token_ids`, `prompt_token_ids`)."""
    return (answer.model_extra or {})[key]


def vllm_tokenize(server: ScriptedVLLM, body: dict[str, Any]) -> list[int]:
    """vLLM's own tokenization (its `/tokenize` route: a prompt, or chat messages + template)."""
    r = httpx.post(f"{server.base_url}/tokenize", json={"model": SERVED_NAME, **body}, timeout=60)
    r.raise_for_status()
    return r.json()["tokens"]


def test_chat_is_recorded_with_vllms_ids_and_log_probs(
    vllm_gateway: RunningGateway, client: GatewayClient, vllm_server: ScriptedVLLM
) -> None:
    rollout = Rollout(vllm_gateway, client, "train")  # train: temperature 1, log-probs asked for
    answer = rollout.llm.chat.completions.create(model="anything", messages=HELLO, max_tokens=12)
    (event,) = rollout.events()
    data = event["data"]
    assert data["http_status"] == 200 and data["status"] == "ok"
    assert data["params"]["temperature"] == 1.0 and data["request"]["model"] == "anything"
    assert data["server"] == {"model": SERVED_NAME, "endpoint": vllm_server.endpoint, "version": 3}
    response = data["response"]
    # What vLLM answered is what the agent got, and what was recorded.
    assert response["choices"][0]["message"]["content"] == answer.choices[0].message.content
    token_ids = response["choices"][0]["token_ids"]
    assert token_ids == extra(answer.choices[0], "token_ids")
    log_probs = [c["logprob"] for c in response["choices"][0]["logprobs"]["content"]]
    assert len(log_probs) == len(token_ids) and all(lp <= 0 for lp in log_probs)

    (triplet,) = rollout.triplets()
    assert triplet["prompt_token_ids"] == response["prompt_token_ids"]
    assert triplet["prompt_token_ids"] == vllm_tokenize(vllm_server, {"messages": HELLO})
    assert triplet["response_token_ids"] == token_ids
    assert triplet["response_log_probs"] == log_probs
    assert triplet["server"]["version"] == 3


def test_chat_streamed_equals_plain_at_temperature_zero(
    vllm_gateway: RunningGateway, client: GatewayClient
) -> None:
    plain = Rollout(vllm_gateway, client, "val")  # val: the Gateway sets temperature 0
    kwargs: dict[str, Any] = {"model": "m", "messages": FINAL_TURN, "tools": TOOLS, "max_tokens": 16}
    answer = plain.llm.chat.completions.create(**kwargs)
    streamed = Rollout(vllm_gateway, client, "val")
    chunks = list(
        streamed.llm.chat.completions.create(**kwargs, stream=True, stream_options={"include_usage": True})
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == answer.choices[0].message.content == FINAL_ANSWER
    assert (
        chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == answer.usage.completion_tokens
    )
    (event,) = streamed.events()
    assert event["data"]["stream"] is True and event["data"]["status"] == "ok"
    (first,), (second,) = plain.triplets(), streamed.triplets()
    assert (
        second["response_token_ids"] == first["response_token_ids"] == extra(answer.choices[0], "token_ids")
    )
    assert second["prompt_token_ids"] == first["prompt_token_ids"]
    # Validation calls carry no log-probs unless asked; asked, a stream records them too.
    logged = Rollout(vllm_gateway, client, "train")
    list(logged.llm.chat.completions.create(model="m", messages=HELLO, max_tokens=8, stream=True))
    (triplet,) = logged.triplets()
    assert len(triplet["response_log_probs"]) == len(triplet["response_token_ids"])


def test_completions_text_and_token_id_prompts(
    vllm_gateway: RunningGateway, client: GatewayClient, vllm_server: ScriptedVLLM
) -> None:
    rollout = Rollout(vllm_gateway, client, "train")
    prompt = "Bob has 4 cards and loses two."
    text = rollout.llm.completions.create(model="m", prompt=prompt, max_tokens=8)
    ids = vllm_tokenize(vllm_server, {"prompt": prompt})
    by_ids = rollout.llm.completions.create(model="m", prompt=ids[:-1], max_tokens=8)
    assert extra(text.choices[0], "prompt_token_ids") == ids
    assert extra(by_ids.choices[0], "prompt_token_ids") == ids[:-1]
    first, second = rollout.triplets()
    assert first["prompt_token_ids"] == ids and second["prompt_token_ids"] == ids[:-1]
    for triplet, answer in ((first, text), (second, by_ids)):
        choice = answer.choices[0]
        assert triplet["response_token_ids"] == extra(choice, "token_ids")
        assert choice.logprobs is not None
        assert triplet["response_log_probs"] == choice.logprobs.token_logprobs

    # Greedy, streamed and not, on the final turn's prompt as token ids (the model is sure there).
    ids = vllm_tokenize(vllm_server, {"messages": FINAL_TURN, "tools": TOOLS})
    streamed = Rollout(vllm_gateway, client, "val")
    chunks = list(streamed.llm.completions.create(model="m", prompt=ids, max_tokens=16, stream=True))
    plain = Rollout(vllm_gateway, client, "val")
    answer = plain.llm.completions.create(model="m", prompt=ids, max_tokens=16)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == answer.choices[0].text == FINAL_ANSWER
    (s,), (p,) = streamed.triplets(), plain.triplets()
    assert s["prompt_token_ids"] == p["prompt_token_ids"] == ids
    assert s["response_token_ids"] == p["response_token_ids"] == extra(answer.choices[0], "token_ids")


@pytest.mark.parametrize("stream", [False, True])
def test_hermes_tool_calls_pass_through_and_are_recorded(
    vllm_gateway: RunningGateway, client: GatewayClient, vllm_server: ScriptedVLLM, stream: bool
) -> None:
    rollout = Rollout(vllm_gateway, client, "val")
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": QUESTION}]
    expected_args = json.dumps(TOOL_TURNS[0][0])
    if stream:
        chunks = list(
            rollout.llm.chat.completions.create(
                model="m",
                messages=messages,
                tools=CHAT_TOOLS,
                max_tokens=64,
                stream=True,
            )
        )
        deltas = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
        name = "".join(d.function.name or "" for d in deltas if d.function)
        arguments = "".join(d.function.arguments or "" for d in deltas if d.function)
        finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        assert finish == ["tool_calls"]
    else:
        answer = rollout.llm.chat.completions.create(
            model="m", messages=messages, tools=CHAT_TOOLS, max_tokens=64
        )
        assert answer.choices[0].finish_reason == "tool_calls"
        (call,) = answer.choices[0].message.tool_calls or []
        assert call.type == "function"
        name, arguments = call.function.name, call.function.arguments
        assert call.id  # vLLM's chat path names it chatcmpl-tool-…, its derender a bare hex id
    assert (name, arguments) == ("calculator", expected_args)

    (event,) = rollout.events()
    message = event["data"]["response"]["choices"][0]["message"]
    (recorded,) = message["tool_calls"]
    assert recorded["function"] == {"name": "calculator", "arguments": expected_args}
    if not stream:
        assert recorded["id"] == call.id  # the agent got the call the Gateway recorded
    (triplet,) = rollout.triplets()
    assert triplet["prompt_token_ids"] == vllm_tokenize(vllm_server, {"messages": messages, "tools": TOOLS})
    tokenizer_text = httpx.post(
        f"{vllm_server.base_url}/detokenize",
        json={"model": SERVED_NAME, "tokens": triplet["response_token_ids"]},
        timeout=60,
    ).json()["prompt"]
    assert (
        tokenizer_text
        == f'<tool_call>\n{{"name": "calculator", "arguments": {expected_args}}}\n</tool_call><|im_end|>'
    )


def test_n_greater_than_one_records_every_choice(vllm_gateway: RunningGateway, client: GatewayClient) -> None:
    rollout = Rollout(vllm_gateway, client, "train")
    answer = rollout.llm.chat.completions.create(model="m", messages=HELLO, max_tokens=10, n=3)
    assert len(answer.choices) == 3
    (event,) = rollout.events()
    choices = event["data"]["response"]["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2]
    for recorded, got in zip(choices, answer.choices, strict=True):
        assert recorded["token_ids"] == extra(got, "token_ids")
        assert len(recorded["logprobs"]["content"]) == len(recorded["token_ids"])
    (triplet,) = rollout.triplets()  # the triplet view trains on the first choice
    assert triplet["response_token_ids"] == choices[0]["token_ids"]


def test_upstream_error_passes_through_and_is_recorded(
    vllm_gateway: RunningGateway, client: GatewayClient
) -> None:
    rollout = Rollout(vllm_gateway, client, "train")
    # Longer than the server's max_model_len (1024): vLLM refuses with 400, not retryable.
    r = rollout.post("completions", {"model": "m", "prompt": [5] * 1100, "max_tokens": 4})
    assert r.status_code == 400, r.text
    assert "1024" in r.text  # vLLM's own message, passed through
    (event,) = rollout.events()
    data = event["data"]
    assert data["http_status"] == 400 and data["status"] == "error" and data["retries"] == 0
    (triplet,) = rollout.triplets()
    assert triplet["http_status"] == 400 and triplet["status"] == "error"
