"""The model proxy, end to end: the official OpenAI SDK talks to a real `agl-server` process,
which forwards to the fake vLLM-shaped model server and records every call."""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import openai
import orjson
import pytest
from openai.types.chat import ChatCompletionMessageParam, ChatCompletionToolParam

from agentlightning.client import GatewayClient
from agentlightning.schemas import Model, RolloutCreate
from tests.conftest import RunningGateway, start_gateway
from tests.fakes.model_server import (
    END,
    FakeModelServer,
    Reply,
    ToolCall,
    chat_prompt_ids,
    encode,
)

KEY = "proxy-key"
USER: list[ChatCompletionMessageParam] = [{"role": "user", "content": "what is two plus two"}]
TOOLS: list[ChatCompletionToolParam] = [
    {
        "type": "function",
        "function": {
            "name": "calc",
            "parameters": {"type": "object", "properties": {"expr": {"type": "string"}}},
        },
    }
]
FAST_RETRIES = ("proxy.backoff_seconds=0.01", "proxy.max_backoff_seconds=0.02")


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeModelServer]:
    with FakeModelServer() as server:
        yield server


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, fake: FakeModelServer) -> Iterator[RunningGateway]:
    gateway = start_gateway(tmp_path_factory.mktemp("proxy"), KEY, *FAST_RETRIES)
    yield gateway
    gateway.process.stop()


@pytest.fixture
def client(gw: RunningGateway, fake: FakeModelServer) -> Iterator[GatewayClient]:
    fake.state.reset()
    with GatewayClient(gw.url, KEY) as c:
        c.delete_models()
        c.register_models([Model(model="policy", endpoint=fake.base_url, version=7)])
        c.resume()
        yield c


def new_rollout(client: GatewayClient) -> str:
    rollout_id = f"r-{uuid.uuid4().hex[:12]}"
    client.create_rollouts([RolloutCreate(rollout_id=rollout_id, input={"q": 1})])
    return rollout_id


def base_url(gw: RunningGateway, rollout_id: str, mode: str = "train", attempt: str = "a1") -> str:
    return f"{gw.url}/proxy/rollout/{rollout_id}/attempt/{attempt}/mode/{mode}/openai/v1"


def sdk(gw: RunningGateway, rollout_id: str, mode: str = "train") -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url(gw, rollout_id, mode), api_key=KEY, max_retries=0)


def events(client: GatewayClient, rollout_id: str) -> list[dict[str, Any]]:
    return [e["data"] for e in client.get_events_json(rollout_id, format="raw", attempt_id="a1")]


def triplets(client: GatewayClient, rollout_id: str) -> list[dict[str, Any]]:
    return [e["data"] for e in client.get_events_json(rollout_id, format="triplet", attempt_id="a1")]


def post(gw: RunningGateway, rollout_id: str, path: str, body: Any, **kw: Any) -> httpx.Response:
    return httpx.post(
        f"{base_url(gw, rollout_id, **kw)}/{path}", json=body, headers={"x-api-key": KEY}, timeout=30
    )


# --- capture -------------------------------------------------------------------------------


def test_sync_chat_is_recorded_token_for_token(
    gw: RunningGateway, client: GatewayClient, fake: FakeModelServer
) -> None:
    rollout_id = new_rollout(client)
    fake.script(Reply(content="four, of course"))
    answer = sdk(gw, rollout_id).chat.completions.create(model="gpt-anything", messages=USER, temperature=0.3)
    assert answer.choices[0].message.content == "four, of course"

    # Recorded before the answer came back: visible at once, no waiting.
    (data,) = events(client, rollout_id)
    sent = answer.model_dump(exclude_unset=True)
    assert data["response"]["prompt_token_ids"] == chat_prompt_ids(USER) == sent["prompt_token_ids"]
    assert data["response"]["choices"][0]["token_ids"] == [*encode("four, of course"), END]
    assert data["request"]["messages"] == USER and data["request"]["model"] == "gpt-anything"
    assert data["params"] == {
        "model": "policy",
        "temperature": 1.0,
        "return_token_ids": True,
        "logprobs": True,
    }
    assert data["server"] == {"model": "policy", "endpoint": fake.base_url, "version": 7}
    assert (data["http_status"], data["status"], data["error"], data["retries"]) == (200, "ok", None, 0)
    assert data["usage"] == sent["usage"] and data["finish_reason"] == "stop"
    assert (data["api"], data["mode"], data["stream"], data["incomplete"]) == (
        "chat.completions",
        "train",
        False,
        False,
    )
    assert data["latency_ms"] > 0

    (triplet,) = triplets(client, rollout_id)
    upstream = fake.requests[-1]["body"]
    assert upstream["model"] == "policy" and upstream["temperature"] == 1.0 and upstream["logprobs"] is True
    assert triplet["prompt_token_ids"] == sent["prompt_token_ids"]
    assert triplet["response_token_ids"] == sent["choices"][0]["token_ids"]
    assert triplet["response_log_probs"] == [e["logprob"] for e in sent["choices"][0]["logprobs"]["content"]]
    assert triplet["server"] == {"model": "policy", "version": 7}


def test_val_mode_and_completions_rewrites(
    gw: RunningGateway, client: GatewayClient, fake: FakeModelServer
) -> None:
    rollout_id = new_rollout(client)
    sdk(gw, rollout_id, "val").chat.completions.create(model="m", messages=USER, temperature=0.9)
    val = fake.requests[-1]["body"]
    assert (
        val["temperature"] == 0.7 and val["return_token_ids"] is True and "logprobs" not in val
    )  # v1.0 default

    completion = sdk(gw, rollout_id).completions.create(model="m", prompt="two plus two is")
    upstream = fake.requests[-1]["body"]
    assert upstream["logprobs"] == 1 and upstream["prompt"] == "two plus two is"
    sdk(gw, rollout_id).completions.create(model="m", prompt="again", logprobs=3)
    assert fake.requests[-1]["body"]["logprobs"] == 3  # the agent's own count is kept

    data = events(client, rollout_id)
    assert [d["api"] for d in data] == ["chat.completions", "completions", "completions"]
    assert [d["mode"] for d in data] == ["val", "train", "train"]
    tri = triplets(client, rollout_id)[1]
    choice = completion.model_dump(exclude_unset=True)["choices"][0]
    assert tri["prompt_token_ids"] == choice["prompt_token_ids"] == encode("two plus two is")
    assert tri["response_token_ids"] == choice["token_ids"]
    assert tri["response_log_probs"] == choice["logprobs"]["token_logprobs"]


async def test_async_stream_records_the_same_triplet_as_a_plain_call(
    gw: RunningGateway, client: GatewayClient, fake: FakeModelServer
) -> None:
    streamed, plain = new_rollout(client), new_rollout(client)
    fake.script(Reply(content="the answer is four", times=2))
    agent = openai.AsyncOpenAI(base_url=base_url(gw, streamed), api_key=KEY, max_retries=0)
    text = ""
    async for chunk in await agent.chat.completions.create(model="m", messages=USER, stream=True):
        assert chunk.choices, "the usage chunk the agent did not ask for is not passed on"
        text += chunk.choices[0].delta.content or ""
    assert text == "the answer is four"
    plain_agent = openai.AsyncOpenAI(base_url=base_url(gw, plain), api_key=KEY, max_retries=0)
    await plain_agent.chat.completions.create(model="m", messages=USER)

    assert fake.requests[-2]["body"]["stream_options"] == {"include_usage": True}
    (s,), (p,) = events(client, streamed), events(client, plain)
    assert triplets(client, streamed) == triplets(client, plain)
    assert s["stream"] is True and s["incomplete"] is False and s["status"] == "ok"
    assert s["usage"] == p["usage"] and s["finish_reason"] == p["finish_reason"] == "stop"
    for key in ("prompt_token_ids", "usage", "object"):
        assert s["response"][key] == p["response"][key]
    s_choice, p_choice = s["response"]["choices"][0], p["response"]["choices"][0]
    for key in ("message", "token_ids", "logprobs", "finish_reason"):
        assert s_choice[key] == p_choice[key], key


def test_streamed_tool_call(gw: RunningGateway, client: GatewayClient, fake: FakeModelServer) -> None:
    rollout_id = new_rollout(client)
    call = ToolCall("calc", '{"expr": "2+2"}')
    fake.script(Reply(content="", tool_calls=[call]), Reply(content="", tool_calls=[call]))
    stream = sdk(gw, rollout_id).chat.completions.create(
        model="m", messages=USER, tools=TOOLS, stream=True, stream_options={"include_usage": True}
    )
    arguments, name, usage = "", "", None
    for chunk in stream:
        usage = chunk.usage or usage
        for tc in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            name += tc.function.name or "" if tc.function else ""
            arguments += tc.function.arguments or "" if tc.function else ""
    assert (name, arguments) == ("calc", '{"expr": "2+2"}')
    assert usage is not None, "asked for by the agent: passed on"
    plain = sdk(gw, rollout_id, "train").chat.completions.create(
        model="m", messages=[*USER, {"role": "user", "content": "x"}], tools=TOOLS
    )

    streamed, plain_data = events(client, rollout_id)
    message = streamed["response"]["choices"][0]["message"]
    assert message["tool_calls"] == [
        {
            "id": message["tool_calls"][0]["id"],
            "type": "function",
            "function": {"name": "calc", "arguments": '{"expr": "2+2"}'},
        }
    ]
    assert streamed["finish_reason"] == "tool_calls"
    assert plain.choices[0].message.tool_calls is not None
    assert (
        streamed["response"]["choices"][0]["token_ids"] == plain_data["response"]["choices"][0]["token_ids"]
    )
    n_tokens = len(streamed["response"]["choices"][0]["token_ids"])
    assert streamed["usage"]["completion_tokens"] == usage.completion_tokens == n_tokens


def test_streamed_completions_match_plain(
    gw: RunningGateway, client: GatewayClient, fake: FakeModelServer
) -> None:
    streamed, plain = new_rollout(client), new_rollout(client)
    fake.script(Reply(content="one two three", times=2))
    text = "".join(
        c.choices[0].text
        for c in sdk(gw, streamed).completions.create(model="m", prompt="count", stream=True)
    )
    assert text == "one two three"
    sdk(gw, plain).completions.create(model="m", prompt="count")
    assert triplets(client, streamed) == triplets(client, plain)
    tri = triplets(client, streamed)[0]
    assert tri["prompt_token_ids"] == encode("count") and tri["response_token_ids"] == [
        *encode("one two three"),
        END,
    ]
    assert tri["response_log_probs"] is not None and len(tri["response_log_probs"]) == 4


# --- retries and errors --------------------------------------------------------------------


@pytest.mark.parametrize("status", [408, 409, 429, 500, 503])
def test_retryable_statuses_are_retried(
    gw: RunningGateway, client: GatewayClient, fake: FakeModelServer, status: int
) -> None:
    rollout_id = new_rollout(client)
    fake.script(Reply(status=status, times=2), Reply(content="third time lucky"))
    answer = sdk(gw, rollout_id).chat.completions.create(model="m", messages=USER)
    assert answer.choices[0].message.content == "third time lucky"
    assert fake.state.total == 3
    (data,) = events(client, rollout_id)
    assert (data["retries"], data["status"], data["http_status"]) == (2, "ok", 200)


def test_dropped_connections_are_retried(
    gw: RunningGateway, client: GatewayClient, fake: FakeModelServer
) -> None:
    rollout_id = new_rollout(client)
    fake.script(Reply(drop=True), Reply(content="back"))
    assert (
        sdk(gw, rollout_id).chat.completions.create(model="m", messages=USER).choices[0].message.content
        == "back"
    )
    assert events(client, rollout_id)[0]["retries"] == 1


def test_streams_are_retried_before_they_start(
    gw: RunningGateway, client: GatewayClient, fake: FakeModelServer
) -> None:
    rollout_id = new_rollout(client)
    fake.script(Reply(status=503), Reply(content="streamed anyway"))
    chunks = list(sdk(gw, rollout_id).chat.completions.create(model="m", messages=USER, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "streamed anyway"
    (data,) = events(client, rollout_id)
    assert data["retries"] == 1 and data["status"] == "ok"


@pytest.mark.parametrize("fault", ["status", "drop"])
def test_retries_used_up_give_502(
    gw: RunningGateway, client: GatewayClient, fake: FakeModelServer, fault: str
) -> None:
    rollout_id = new_rollout(client)
    fake.script(Reply(status=503, times=6) if fault == "status" else Reply(drop=True, times=6))
    with pytest.raises(openai.APIStatusError) as err:
        sdk(gw, rollout_id).chat.completions.create(model="m", messages=USER)
    assert err.value.status_code == 502
    assert "after 6 tries" in err.value.message
    assert fake.state.total == 6
    (data,) = events(client, rollout_id)
    assert (data["http_status"], data["status"], data["retries"]) == (502, "error", 5)
    assert data["server"]["endpoint"] == fake.base_url and "after 6 tries" in data["error"]
    assert triplets(client, rollout_id)[0]["status"] == "error"


def test_timeouts_give_504(tmp_path: Path, fake: FakeModelServer) -> None:
    fake.state.reset()
    gw = start_gateway(tmp_path, KEY, *FAST_RETRIES, "proxy.read_timeout_seconds=0.2", "proxy.max_tries=2")
    try:
        with GatewayClient(gw.url, KEY) as client:
            client.register_models([Model(model="policy", endpoint=fake.base_url)])
            rollout_id = new_rollout(client)
            fake.script(Reply(gate="never", times=2))
            with pytest.raises(openai.APIStatusError) as err:
                sdk(gw, rollout_id).chat.completions.create(model="m", messages=USER)
            assert err.value.status_code == 504
            (data,) = events(client, rollout_id)
            assert (data["http_status"], data["status"], data["retries"]) == (504, "error", 1)
            assert "did not answer in time" in data["error"]
    finally:
        gw.process.stop()
        fake.open_gate("never")


def test_non_retryable_errors_pass_through(
    gw: RunningGateway, client: GatewayClient, fake: FakeModelServer
) -> None:
    rollout_id = new_rollout(client)
    body = {
        "error": {"message": "maximum context length is 4096 tokens", "type": "BadRequestError", "code": 400}
    }
    fake.script(Reply(status=400, error_body=body))
    r = post(gw, rollout_id, "chat/completions", {"messages": USER})
    assert (r.status_code, r.json()) == (400, body)
    assert fake.state.total == 1
    (data,) = events(client, rollout_id)
    assert (data["http_status"], data["status"], data["retries"]) == (400, "error", 0)
    assert "maximum context length" in data["error"] and data["response"] is None


def test_bad_calls_get_clear_errors(gw: RunningGateway, client: GatewayClient, fake: FakeModelServer) -> None:
    rollout_id = new_rollout(client)
    r = post(gw, "no-such-rollout", "chat/completions", {"messages": USER})
    assert r.status_code == 404 and "no-such-rollout" in r.json()["detail"]
    r = post(gw, rollout_id, "chat/completions", {"messages": USER}, mode="eval")
    assert r.status_code == 404 and "train or val" in r.json()["error"]["message"]
    r = post(gw, rollout_id, "embeddings", {"input": "x"})
    assert r.status_code == 404 and "embeddings" in r.json()["detail"]
    r = httpx.post(
        f"{base_url(gw, rollout_id)}/chat/completions", content=b"{oops", headers={"x-api-key": KEY}
    )
    assert r.status_code == 400 and "not valid JSON" in r.json()["detail"]
    r = post(gw, rollout_id, "chat/completions", [1, 2])
    assert r.status_code == 400 and "JSON object" in r.json()["detail"]
    r = httpx.post(f"{base_url(gw, rollout_id)}/chat/completions", json={"messages": USER})
    assert r.status_code == 401
    assert fake.state.total == 0, "none of these reached the model"
    assert events(client, rollout_id) == []


def test_no_registered_endpoint_gives_503(
    gw: RunningGateway, client: GatewayClient, fake: FakeModelServer
) -> None:
    rollout_id = new_rollout(client)
    client.delete_models()
    r = post(gw, rollout_id, "chat/completions", {"messages": USER})
    assert r.status_code == 503 and "POST /api/models" in r.json()["detail"]
    (data,) = events(client, rollout_id)
    assert (data["http_status"], data["status"], data["server"]) == (503, "error", None)


# --- routing -------------------------------------------------------------------------------


def test_sticky_endpoint_and_recorded_version(
    gw: RunningGateway, client: GatewayClient, fake: FakeModelServer
) -> None:
    with FakeModelServer() as other:
        endpoints = sorted([fake.base_url, other.base_url])
        client.register_models([Model(model="policy", endpoint=other.base_url, version=7)])
        rollouts = [new_rollout(client) for _ in range(6)]
        for rollout_id in rollouts:
            for _ in range(2):
                sdk(gw, rollout_id).chat.completions.create(model="m", messages=USER)
        for rollout_id in rollouts:
            expected = endpoints[int.from_bytes(hashlib.sha256(rollout_id.encode()).digest()[:8], "big") % 2]
            assert [d["server"]["endpoint"] for d in events(client, rollout_id)] == [expected, expected]
        assert fake.state.total + other.state.total == 12
        # A weight update re-registers the servers with a new version: later calls record it.
        client.register_models([Model(model="policy", endpoint=e, version=8) for e in endpoints])
        sdk(gw, rollouts[0]).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "after update"}]
        )
        assert [d["server"]["version"] for d in events(client, rollouts[0])] == [7, 7, 8]
        client.delete_models()


def test_a_call_goes_to_the_policy_its_model_field_names(
    gw: RunningGateway, client: GatewayClient, fake: FakeModelServer
) -> None:
    """Several policies in one run (docs/policies.md): a call naming a registered model goes to
    it and records its version; any other name goes to the configured model, as in v1.0."""
    with FakeModelServer() as planner:
        client.register_models([Model(model="planner", endpoint=planner.base_url, version=3)])
        rollout_id = new_rollout(client)
        for name in ("planner", "policy", "gpt-4o", "planner"):
            sdk(gw, rollout_id).chat.completions.create(model=name, messages=USER)
        served = [(d["server"]["model"], d["server"]["version"]) for d in events(client, rollout_id)]
        assert served == [("planner", 3), ("policy", 7), ("policy", 7), ("planner", 3)]
        assert [r["body"]["model"] for r in planner.requests] == ["planner", "planner"]
        assert [r["body"]["model"] for r in fake.requests] == ["policy", "policy"]
        # The Anthropic Messages API names its model the same way.
        r = httpx.post(
            base_url(gw, rollout_id).removesuffix("/openai/v1") + "/anthropic/v1/messages",
            json={"model": "planner", "max_tokens": 8, "messages": USER},
            headers={"x-api-key": KEY},
            timeout=30,
        )
        assert r.status_code == 200, r.text
        assert events(client, rollout_id)[-1]["server"]["model"] == "planner"
        client.delete_models()


async def test_the_pool_does_not_cap_concurrency(
    gw: RunningGateway, client: GatewayClient, fake: FakeModelServer
) -> None:
    rollout_id = new_rollout(client)
    n = 300
    fake.script(Reply(gate="crowd", times=n))
    url = f"{base_url(gw, rollout_id)}/chat/completions"
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0), headers={"x-api-key": KEY}
    ) as session:

        async def call() -> int:
            async with session.post(url, json={"messages": USER}) as r:
                await r.read()
                return r.status

        tasks = [asyncio.create_task(call()) for _ in range(n)]
        await asyncio.to_thread(fake.wait_active, n, 30)
        assert client.proxy_state().inflight == n
        fake.open_gate("crowd")
        assert await asyncio.gather(*tasks) == [200] * n
    assert len(events(client, rollout_id)) == n
    assert client.proxy_state().inflight == 0


# --- pause and drain -----------------------------------------------------------------------


def test_pause_drains_calls_in_flight(
    gw: RunningGateway, client: GatewayClient, fake: FakeModelServer
) -> None:
    rollout_id = new_rollout(client)
    fake.script(Reply(gate="update", times=3))
    agent = sdk(gw, rollout_id)
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        calls = [pool.submit(agent.chat.completions.create, model="m", messages=USER) for _ in range(3)]
        fake.wait_active(3)
        state = client.pause(retry_after_seconds=2.5, reason="weight update")
        assert (state.paused, state.inflight, state.reason) == (True, 3, "weight update")

        r = post(gw, rollout_id, "chat/completions", {"messages": USER})
        assert r.status_code == 429
        assert r.headers["Retry-After"] == "3" and r.headers["retry-after-ms"] == "2500"
        assert r.headers["X-Agl-Paused"] == "true" and "weight update" in r.json()["detail"]
        assert fake.state.total == 3, "a paused call does not reach the model"

        fake.open_gate("update")
        assert all(c.result(timeout=30).choices for c in calls)
    assert client.proxy_state().inflight == 0
    assert len(events(client, rollout_id)) == 3, "calls in flight when paused finish and are recorded"
    state = client.resume()
    assert (state.paused, state.inflight) == (False, 0)
    assert post(gw, rollout_id, "chat/completions", {"messages": USER}).status_code == 200


def test_a_stream_counts_until_its_last_byte(
    gw: RunningGateway, client: GatewayClient, fake: FakeModelServer
) -> None:
    rollout_id = new_rollout(client)
    fake.script(Reply(content="a b c d e", gate="midway", gate_after_chunks=3))
    received: list[str] = []
    with httpx.stream(
        "POST",
        f"{base_url(gw, rollout_id)}/chat/completions",
        json={"messages": USER, "stream": True},
        headers={"x-api-key": KEY},
    ) as r:
        lines = r.iter_lines()
        while len(received) < 3:
            line = next(lines)
            if line:
                received.append(line)
        assert client.proxy_state().inflight == 1
        fake.open_gate("midway")
        received.extend(line for line in lines if line)
    assert received[-1] == "data: [DONE]"
    assert wait_for(lambda: client.proxy_state().inflight == 0)


# --- streams that break --------------------------------------------------------------------


def test_agent_disconnecting_mid_stream_leaves_an_incomplete_event(
    gw: RunningGateway, client: GatewayClient, fake: FakeModelServer
) -> None:
    rollout_id = new_rollout(client)
    fake.script(Reply(content="one two three four five", gate="stalled", gate_after_chunks=3))
    with httpx.stream(
        "POST",
        f"{base_url(gw, rollout_id)}/chat/completions",
        json={"messages": USER, "stream": True},
        headers={"x-api-key": KEY},
    ) as r:
        got = 0
        for line in r.iter_lines():
            got += bool(line)
            if got == 3:
                break  # the agent goes away mid-answer
    assert wait_for(lambda: len(events(client, rollout_id)) == 1)
    (data,) = events(client, rollout_id)
    assert (data["incomplete"], data["status"], data["stream"]) == (True, "error", True)
    assert "disconnected" in data["error"]
    assert data["response"]["choices"][0]["token_ids"] == encode("one two")  # what came before the stall
    assert data["response"]["prompt_token_ids"] == chat_prompt_ids(USER)
    assert wait_for(lambda: fake.state.active == 0), "the upstream call was closed (vLLM aborts it)"
    assert client.proxy_state().inflight == 0
    fake.open_gate("stalled")


def test_upstream_breaking_mid_stream_is_reported_and_recorded(
    gw: RunningGateway, client: GatewayClient, fake: FakeModelServer
) -> None:
    rollout_id = new_rollout(client)
    fake.script(Reply(content="one two three four", drop_after_chunks=3))
    r = post(gw, rollout_id, "chat/completions", {"messages": USER, "stream": True})
    payloads = [orjson.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
    assert payloads[-1]["error"]["code"] == 502 and "broke" in payloads[-1]["error"]["message"]
    assert "[DONE]" not in r.text
    (data,) = events(client, rollout_id)
    assert (data["incomplete"], data["status"], data["http_status"]) == (True, "error", 200)
    assert data["response"]["choices"][0]["token_ids"] == encode("one two")


def wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


def test_agent_leaving_a_plain_call_still_records_it(
    gw: RunningGateway, client: GatewayClient, fake: FakeModelServer
) -> None:
    rollout_id = new_rollout(client)
    fake.script(Reply(content="late answer", gate="slow"))
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            f"{base_url(gw, rollout_id)}/chat/completions",
            json={"messages": USER},
            headers={"x-api-key": KEY},
            timeout=0.5,
        )
    assert client.proxy_state().inflight == 1
    fake.open_gate("slow")
    assert wait_for(lambda: len(events(client, rollout_id)) == 1)
    assert events(client, rollout_id)[0]["status"] == "ok"
    assert wait_for(lambda: client.proxy_state().inflight == 0)


def test_a_deleted_rollout_gets_404(gw: RunningGateway, client: GatewayClient, fake: FakeModelServer) -> None:
    rollout_id = new_rollout(client)
    assert post(gw, rollout_id, "chat/completions", {"messages": USER}).status_code == 200
    client.delete_rollout(rollout_id)
    # The proxy remembers rollouts it has seen (no store read per call); a delete forgets it,
    # so the very next call is refused without reaching the model.
    r = post(gw, rollout_id, "chat/completions", {"messages": USER})
    assert r.status_code == 404 and rollout_id in r.json()["detail"]
    assert post(gw, rollout_id, "chat/completions", {"messages": USER}).status_code == 404
    assert fake.state.total == 1, "a deleted rollout's calls must not reach the model"


def test_a_rollout_deleted_in_a_batch_gets_404_without_reaching_the_model(
    gw: RunningGateway, client: GatewayClient, fake: FakeModelServer
) -> None:
    kept, deleted = new_rollout(client), new_rollout(client)
    for rid in (kept, deleted):
        assert post(gw, rid, "chat/completions", {"messages": USER}).status_code == 200
    assert client.delete_rollouts([deleted]) == 1
    r = post(gw, deleted, "chat/completions", {"messages": USER})
    assert r.status_code == 404 and deleted in r.json()["detail"]
    assert post(gw, kept, "chat/completions", {"messages": USER}).status_code == 200
    assert fake.state.total == 3
