"""The fake model server answers like vLLM: shapes, token ids, log-probs, scripts and faults."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import httpx
import openai
import orjson
import pytest
from openai.types.chat import ChatCompletionMessageParam

from agentlightning.procs import ManagedProcess, free_port
from tests.fakes.model_server import (
    END,
    FakeModelServer,
    Reply,
    ToolCall,
    chat_prompt_ids,
    encode,
)


@pytest.fixture(scope="module")
def server() -> Iterator[FakeModelServer]:
    with FakeModelServer() as fake:
        yield fake


@pytest.fixture
def fake(server: FakeModelServer) -> FakeModelServer:
    server.state.reset()
    return server


def post(fake: FakeModelServer, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{fake.base_url}/{path}", json=body, timeout=10)


def sse_events(response: httpx.Response) -> list[Any]:
    out = []
    for line in response.text.splitlines():
        if line.startswith("data: "):
            payload = line[len("data: ") :]
            out.append(payload if payload == "[DONE]" else orjson.loads(payload))
    return out


USER: list[ChatCompletionMessageParam] = [{"role": "user", "content": "what is two plus two"}]


def test_chat_answer_carries_token_ids_and_logprobs(fake: FakeModelServer) -> None:
    fake.script(Reply(content="four, surely"))
    body = post(
        fake, "chat/completions", {"model": "m", "messages": USER, "return_token_ids": True, "logprobs": True}
    ).json()
    choice = body["choices"][0]
    assert body["prompt_token_ids"] == chat_prompt_ids(USER)
    assert choice["token_ids"] == [*encode("four, surely"), END]
    assert choice["message"]["content"] == "four, surely"
    assert choice["finish_reason"] == "stop"
    assert len(choice["logprobs"]["content"]) == len(choice["token_ids"])
    assert all(-2.5 <= e["logprob"] < 0 for e in choice["logprobs"]["content"])
    assert body["usage"] == {
        "prompt_tokens": len(body["prompt_token_ids"]),
        "completion_tokens": 3,
        "total_tokens": len(body["prompt_token_ids"]) + 3,
    }


def test_without_return_token_ids_there_are_none(fake: FakeModelServer) -> None:
    body = post(fake, "chat/completions", {"model": "m", "messages": USER}).json()
    assert body["prompt_token_ids"] is None
    assert body["choices"][0]["token_ids"] is None
    assert body["choices"][0]["logprobs"] is None


def test_follow_up_prompt_extends_previous_prompt_and_answer(fake: FakeModelServer) -> None:
    """Like a real chat template: the next prompt begins with prompt + answer tokens."""
    fake.script(Reply(content="let me compute", tool_calls=[ToolCall("calc", '{"expr": "2+2"}')]))
    client = openai.OpenAI(base_url=fake.base_url, api_key="k")
    first = client.chat.completions.create(model="m", messages=USER, extra_body={"return_token_ids": True})
    message = first.choices[0].message
    assert message.tool_calls is not None
    call = message.tool_calls[0]
    assert call.type == "function" and call.function.name == "calc"
    assert first.choices[0].finish_reason == "tool_calls"
    history: list[ChatCompletionMessageParam] = [
        *USER,
        cast(ChatCompletionMessageParam, message.model_dump(exclude_none=True)),
        {"role": "tool", "tool_call_id": call.id, "content": "4"},
    ]
    second = client.chat.completions.create(
        model="m", messages=history, extra_body={"return_token_ids": True}
    )
    before = (first.model_extra or {})["prompt_token_ids"] + (first.choices[0].model_extra or {})["token_ids"]
    after = (second.model_extra or {})["prompt_token_ids"]
    assert after[: len(before)] == before
    assert len(after) > len(before)


def test_completions_carry_prompt_ids_per_choice(fake: FakeModelServer) -> None:
    fake.script(Reply(content="a b c", times=2))
    body = post(
        fake,
        "completions",
        {"model": "m", "prompt": "one two", "return_token_ids": True, "logprobs": 1, "n": 2},
    ).json()
    assert "prompt_token_ids" not in body
    assert len(body["choices"]) == 2
    for i, choice in enumerate(body["choices"]):
        assert choice["index"] == i
        assert choice["prompt_token_ids"] == encode("one two")
        assert choice["token_ids"] == [*encode("a b c"), END]
        assert len(choice["logprobs"]["token_logprobs"]) == 4
    by_ids = post(fake, "completions", {"model": "m", "prompt": [7, 8, 9], "return_token_ids": True}).json()
    assert by_ids["choices"][0]["prompt_token_ids"] == [7, 8, 9]


def test_max_tokens_cuts_the_answer_without_end_token(fake: FakeModelServer) -> None:
    fake.script(Reply(content="one two three four five"))
    choice = post(fake, "completions", {"prompt": "x", "max_tokens": 2, "return_token_ids": True}).json()[
        "choices"
    ][0]
    assert choice["finish_reason"] == "length"
    assert choice["token_ids"] == encode("one two")
    assert choice["text"] == "one two"


@pytest.mark.parametrize("api", ["chat/completions", "completions"])
def test_stream_chunks_add_up_to_the_plain_answer(fake: FakeModelServer, api: str) -> None:
    reply = Reply(content="the answer is four")
    request: dict[str, Any] = {
        "model": "m",
        "return_token_ids": True,
        "logprobs": True if api.startswith("chat") else 1,
    }
    request.update({"messages": USER} if api.startswith("chat") else {"prompt": "two plus two"})
    fake.script(reply)
    plain = post(fake, api, request).json()
    fake.script(Reply(content="the answer is four"))
    events = sse_events(
        post(fake, api, {**request, "stream": True, "stream_options": {"include_usage": True}})
    )
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == plain["usage"]
    ids = [t for c in chunks for ch in c["choices"] for t in ch.get("token_ids") or []]
    assert ids == plain["choices"][0]["token_ids"]
    if api.startswith("chat"):
        assert chunks[0]["prompt_token_ids"] == plain["prompt_token_ids"]
        text = "".join(ch["delta"].get("content") or "" for c in chunks for ch in c["choices"])
        lps = [
            e["logprob"]
            for c in chunks
            for ch in c["choices"]
            if ch["logprobs"]
            for e in ch["logprobs"]["content"]
        ]
        plain_lps = [e["logprob"] for e in plain["choices"][0]["logprobs"]["content"]]
    else:
        assert chunks[0]["choices"][0]["prompt_token_ids"] == plain["choices"][0]["prompt_token_ids"]
        text = "".join(ch["text"] for c in chunks for ch in c["choices"])
        lps = [
            v
            for c in chunks
            for ch in c["choices"]
            if ch["logprobs"]
            for v in ch["logprobs"]["token_logprobs"]
        ]
        plain_lps = plain["choices"][0]["logprobs"]["token_logprobs"]
    assert text == "the answer is four"
    assert lps == plain_lps
    finishes = [ch["finish_reason"] for c in chunks for ch in c["choices"] if ch["finish_reason"]]
    assert finishes == ["stop"]


def test_stream_without_include_usage_has_no_usage_chunk(fake: FakeModelServer) -> None:
    events = sse_events(post(fake, "chat/completions", {"messages": USER, "stream": True}))
    assert all("usage" not in e for e in events[:-1])


def test_openai_sdk_streams_a_tool_call(fake: FakeModelServer) -> None:
    fake.script(
        Reply(content="", tool_calls=[ToolCall("search", '{"q": "lightning"}'), ToolCall("calc", '{"x": 1}')])
    )
    client = openai.OpenAI(base_url=fake.base_url, api_key="k")
    stream = client.chat.completions.create(model="m", messages=USER, stream=True, tools=[])
    calls: dict[int, dict[str, str]] = {}
    for chunk in stream:
        for tc in chunk.choices[0].delta.tool_calls or [] if chunk.choices else []:
            entry = calls.setdefault(tc.index, {"name": "", "arguments": ""})
            if tc.function and tc.function.name:
                entry["name"] = tc.function.name
            if tc.function and tc.function.arguments:
                entry["arguments"] += tc.function.arguments
    assert calls == {
        0: {"name": "search", "arguments": '{"q": "lightning"}'},
        1: {"name": "calc", "arguments": '{"x": 1}'},
    }


async def test_async_sdk_and_scripted_status(fake: FakeModelServer) -> None:
    fake.script(Reply(status=429), Reply(content="fine"))
    client = openai.AsyncOpenAI(base_url=fake.base_url, api_key="k", max_retries=0)
    with pytest.raises(openai.RateLimitError):
        await client.chat.completions.create(model="m", messages=USER)
    answer = await client.chat.completions.create(model="m", messages=USER)
    assert answer.choices[0].message.content == "fine"


def test_when_and_times_pick_replies(fake: FakeModelServer) -> None:
    fake.script(Reply(content="for bob", when="bob", times=2), Reply(content="anyone"))

    def ask(text: str) -> str:
        body = post(fake, "chat/completions", {"messages": [{"role": "user", "content": text}]}).json()
        return body["choices"][0]["message"]["content"]

    assert ask("hi alice") == "anyone"
    assert ask("hi bob") == "for bob"
    assert ask("bob again") == "for bob"
    assert ask("bob thrice") == "ok: bob thrice"  # script used up: the default answer
    assert fake.state.pending() == 0


def test_dropped_connections(fake: FakeModelServer) -> None:
    fake.script(Reply(drop=True))
    with pytest.raises(httpx.RemoteProtocolError):
        post(fake, "chat/completions", {"messages": USER})
    fake.script(Reply(content="a b c d e f", drop_after_chunks=3))
    lines: list[str] = []
    with pytest.raises(httpx.RemoteProtocolError):
        with httpx.stream(
            "POST", f"{fake.base_url}/chat/completions", json={"messages": USER, "stream": True}
        ) as r:
            lines.extend(line for line in r.iter_lines() if line)
    assert len(lines) == 3


def test_delay_holds_the_answer(fake: FakeModelServer) -> None:
    fake.script(Reply(delay=30))
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{fake.base_url}/chat/completions", json={"messages": USER}, timeout=0.3)


def test_gate_holds_calls_until_opened(fake: FakeModelServer) -> None:
    import concurrent.futures

    fake.script(Reply(gate="g", times=3))
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        futures = [pool.submit(post, fake, "chat/completions", {"messages": USER}) for _ in range(3)]
        fake.wait_active(3)
        assert not any(f.done() for f in futures)
        fake.open_gate("g")
        assert [f.result().status_code for f in futures] == [200, 200, 200]
    assert fake.state.max_active >= 3


def test_bad_requests_get_openai_errors(fake: FakeModelServer) -> None:
    r = httpx.post(f"{fake.base_url}/chat/completions", content=b"{nope", timeout=5)
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
    r = post(fake, "chat/completions", {"messages": []})
    assert r.status_code == 400 and "messages" in r.json()["error"]["message"]
    r = post(fake, "completions", {"prompt": {"x": 1}})
    assert r.status_code == 400 and "prompt" in r.json()["error"]["message"]


def test_strict_by_default_lenient_on_request() -> None:
    """Bodies are checked against OpenAI's request schema (400 naming the field) unless lenient."""
    body = {"messages": USER, "temperature": -1, "n": 2}
    with FakeModelServer() as strict, FakeModelServer(lenient=True) as lenient:
        r = post(strict, "chat/completions", body)
        assert r.status_code == 400 and "temperature" in r.json()["error"]["message"]
        assert len(post(lenient, "chat/completions", body).json()["choices"]) == 2


def test_served_model_name_rejects_other_models() -> None:
    with FakeModelServer(served_model_name="policy") as fake:
        assert post(fake, "chat/completions", {"model": "policy", "messages": USER}).status_code == 200
        r = post(fake, "chat/completions", {"model": "gpt-4", "messages": USER})
        assert r.status_code == 404 and "gpt-4" in r.json()["error"]["message"]


def test_runs_as_a_process_scripted_over_http(tmp_path: Path) -> None:
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "tests.fakes.model_server",
        "--port",
        str(port),
        "--content",
        "hello",
    ]
    proc = ManagedProcess("fake-model", argv, tmp_path / "fake.log", cwd=Path(__file__).parents[2]).start()
    try:
        url = f"http://127.0.0.1:{port}"
        proc.wait_http_ok(f"{url}/health")
        r = httpx.post(
            f"{url}/fake/script",
            json=[{"content": "scripted", "tool_calls": [{"name": "f", "arguments": "{}"}]}],
        )
        assert r.json() == {"pending": 1}
        first = httpx.post(f"{url}/v1/chat/completions", json={"messages": USER}).json()
        assert first["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "f"
        second = httpx.post(f"{url}/v1/chat/completions", json={"messages": USER}).json()
        assert second["choices"][0]["message"]["content"] == "hello"
        assert [r["body"]["messages"] for r in httpx.get(f"{url}/fake/requests").json()] == [USER, USER]
        bad = httpx.post(f"{url}/fake/script", json=[{"contnet": "typo"}])
        assert bad.status_code == 400 and "contnet" in bad.json()["error"]["message"]
    finally:
        proc.stop()


def test_gate_after_chunks_holds_a_stream_midway(fake: FakeModelServer) -> None:
    import concurrent.futures

    fake.script(Reply(content="a b c d", gate="mid", gate_after_chunks=2))
    seen: list[str] = []

    def read() -> None:
        with httpx.stream(
            "POST", f"{fake.base_url}/chat/completions", json={"messages": USER, "stream": True}
        ) as r:
            for line in r.iter_lines():
                if line:
                    seen.append(line)

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        future = pool.submit(read)
        fake.wait_active(1)
        assert not future.done()
        fake.open_gate("mid")
        future.result(timeout=10)
    assert seen[-1] == "data: [DONE]" and len(seen) == 7  # role, 4 words, end, [DONE]
