"""The inference server behind a real Gateway process, as the trainer uses it: the triplets the
Gateway records carry the server's exact token ids and log-probs that a fresh forward pass of
the same weights reproduces, and streamed and non-streamed answers are the same tokens."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import openai
import pytest
import torch
from openai.types.chat import ChatCompletionMessageParam

from agentlightning.client import GatewayClient
from agentlightning.schemas import Model, RolloutCreate
from agentlightning.torch_backend.openai_backend import InferenceServer
from tests.conftest import RunningGateway

from .test_server import fresh_log_probs

pytestmark = pytest.mark.timeout(600)  # a hang guard, not a speed test: machines may be busy
QUESTION: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "Ann has 7 apples and gets 5 more. How many apples now?"}
]


def question(n: int) -> list[ChatCompletionMessageParam]:
    return [{"role": "user", "content": f"Ann has {n} apples and gets 2 more. How many apples now?"}]


@pytest.fixture
def gateway(gateway_factory: Callable[..., RunningGateway]) -> RunningGateway:
    return gateway_factory("default_proxy.val.temperature=0.0")  # greedy val calls (the default is 0.7)


@pytest.fixture
def client(gateway: RunningGateway, server: InferenceServer) -> Iterator[GatewayClient]:
    with GatewayClient(gateway.url, gateway.key) as c:
        c.register_models([Model(model="policy", endpoint=server.base_url, version=server.version)])
        yield c


def agent(gateway: RunningGateway, client: GatewayClient, mode: str) -> tuple[str, openai.OpenAI]:
    """A new rollout and an openai client pointed at its proxy URL, as the Controller sets it up."""
    rollout_id = f"r-{uuid.uuid4().hex[:10]}"
    client.create_rollouts([RolloutCreate(rollout_id=rollout_id, input={})])
    base = f"{gateway.url}/proxy/rollout/{rollout_id}/attempt/a1/mode/{mode}/openai/v1"
    return rollout_id, openai.OpenAI(base_url=base, api_key=gateway.key, max_retries=0)


def triplets(client: GatewayClient, rollout_id: str) -> list[dict[str, Any]]:
    return [e["data"] for e in client.get_events_json(rollout_id, format="triplet", attempt_id="a1")]


def test_recorded_log_probs_match_a_fresh_forward_pass(
    gateway: RunningGateway, client: GatewayClient, server: InferenceServer
) -> None:
    rollout_id, llm = agent(gateway, client, "train")  # train mode: temperature 1.0, log-probs asked for
    # Different prompts: of calls with identical prompt ids the triplet view keeps the last (a retry).
    answers = [
        llm.chat.completions.create(model="anything", messages=question(n), max_tokens=20) for n in (3, 4, 5)
    ]
    recorded = triplets(client, rollout_id)
    assert len(recorded) == 3
    for answer, call in zip(answers, recorded, strict=True):
        assert call["response_token_ids"] and call["response_log_probs"] is not None
        text = server.engine.tokenizer.decode(call["response_token_ids"], skip_special_tokens=True)
        assert text.strip() == (answer.choices[0].message.content or "").strip()
        ref = fresh_log_probs(server.engine.model, call["prompt_token_ids"], call["response_token_ids"], 1.0)
        diff = (torch.tensor(call["response_log_probs"]) - ref).abs().mean().item()
        assert diff < 1e-3, diff


def test_streamed_and_plain_answers_are_the_same_tokens_at_temperature_zero(
    gateway: RunningGateway, client: GatewayClient
) -> None:
    plain_id, llm = agent(gateway, client, "val")  # val mode: this Gateway sets temperature 0
    plain = llm.chat.completions.create(model="anything", messages=QUESTION, max_tokens=24)
    streamed_id, llm = agent(gateway, client, "val")
    chunks = llm.chat.completions.create(model="anything", messages=QUESTION, max_tokens=24, stream=True)
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == plain.choices[0].message.content
    (first,) = triplets(client, plain_id)
    deadline = time.monotonic() + 10  # a stream's event is written as its last bytes go out
    while not (recorded := triplets(client, streamed_id)) and time.monotonic() < deadline:
        time.sleep(0.02)
    (second,) = recorded
    assert first["response_token_ids"] == second["response_token_ids"] and first["response_token_ids"]
    assert first["prompt_token_ids"] == second["prompt_token_ids"]
