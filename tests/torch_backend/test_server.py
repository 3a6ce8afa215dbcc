"""The built-in inference server over HTTP: vLLM's shapes, log-probs, streaming, tools, batching."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, cast

import httpx
import pytest
import torch
from openai import AsyncOpenAI, BadRequestError, NotFoundError, OpenAI
from openai.types.chat import (
    ChatCompletionMessageParam,
    ChatCompletionMessageToolCallParam,
    ChatCompletionToolParam,
)

from agentlightning.demo.task import TOOLS
from agentlightning.server.triplet import model_request_triplet
from agentlightning.torch_backend.engine import TorchEngine
from agentlightning.torch_backend.openai_backend import VERSION_HEADER, InferenceServer

from .tiny import QUESTION, TOOL_CALL_TEXT, fresh_copy

# The demo's TOOLS, as the OpenAI SDK's type.
CHAT_TOOLS: list[ChatCompletionToolParam] = [
    {"type": "function", "function": tool["function"]} for tool in TOOLS
]

pytestmark = pytest.mark.timeout(600)  # a hang guard, not a speed test: machines may be busy


def post(server: InferenceServer, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{server.base_url}{path}", json=body, timeout=60, trust_env=False)


def sse_events(server: InferenceServer, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    events = []
    with httpx.stream("POST", f"{server.base_url}{path}", json=body, timeout=60, trust_env=False) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            data = line[len("data: ") :]
            if data == "[DONE]":
                events.append({"done": True})
            else:
                events.append(json.loads(data))
    assert events[-1] == {"done": True}
    return events[:-1]


def fresh_log_probs(model: Any, prompt: list[int], response: list[int], temperature: float) -> torch.Tensor:
    """Log-probs of `response` after `prompt` from one plain forward pass (no cache, no batch)."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + response])).logits[0].float()
    scaled = logits / (temperature if temperature > 0 else 1.0)
    lp = torch.log_softmax(scaled, -1)[len(prompt) - 1 : -1]
    return lp.gather(1, torch.tensor(response).unsqueeze(1)).squeeze(1)


# --- log-probs ----------------------------------------------------------------------------------


@pytest.mark.parametrize("temperature", [1.0, 0.7, 0.0])
def test_chat_triplet_log_probs_match_a_fresh_forward_pass(
    server: InferenceServer, temperature: float
) -> None:
    """The Gateway's triplet view of our answers carries the log-probs a fresh forward pass gives."""
    body = {
        "model": "policy",
        "messages": [{"role": "user", "content": "Count to three."}],
        "max_tokens": 24,
        "temperature": temperature,
        "logprobs": True,
        "return_token_ids": True,
        "ignore_eos": True,
        "n": 3,
        "seed": 11,
    }
    r = post(server, "/chat/completions", body)
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["object"] == "chat.completion"
    assert isinstance(answer["prompt_token_ids"], list) and answer["prompt_token_ids"]
    diffs = []
    for choice in answer["choices"]:
        triplet = model_request_triplet({"response": {**answer, "choices": [choice]}})
        assert triplet["prompt_token_ids"] == answer["prompt_token_ids"]
        assert triplet["response_token_ids"] == choice["token_ids"]
        assert len(triplet["response_token_ids"]) == 24
        assert triplet["response_log_probs"] is not None
        ref = fresh_log_probs(
            server.engine.model, triplet["prompt_token_ids"], triplet["response_token_ids"], temperature
        )
        diffs.append((torch.tensor(triplet["response_log_probs"]) - ref).abs().mean().item())
    assert max(diffs) < 1e-3, diffs
    assert answer["usage"] == {
        "prompt_tokens": len(answer["prompt_token_ids"]),
        "completion_tokens": 72,
        "total_tokens": len(answer["prompt_token_ids"]) + 72,
    }


def test_completions_triplet_log_probs_match_and_token_prompts(server: InferenceServer) -> None:
    tok = server.engine.tokenizer
    prompt_ids = tok.encode("Once upon a time", add_special_tokens=False)
    other_ids = tok.encode("Hello", add_special_tokens=False)
    body = {
        "model": "policy",
        "prompt": [prompt_ids, other_ids],
        "max_tokens": 16,
        "temperature": 1.0,
        "logprobs": 2,
        "return_token_ids": True,
        "ignore_eos": True,
    }
    r = post(server, "/completions", body)
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["object"] == "text_completion"
    assert [c["index"] for c in answer["choices"]] == [0, 1]
    assert answer["choices"][0]["prompt_token_ids"] == prompt_ids
    assert answer["choices"][1]["prompt_token_ids"] == other_ids
    for choice in answer["choices"]:
        triplet = model_request_triplet({"response": {**answer, "choices": [choice]}})
        assert triplet["prompt_token_ids"] == choice["prompt_token_ids"]
        ref = fresh_log_probs(server.engine.model, choice["prompt_token_ids"], choice["token_ids"], 1.0)
        assert (torch.tensor(triplet["response_log_probs"]) - ref).abs().mean().item() < 1e-3
        lp = choice["logprobs"]
        assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == 16
        assert all(len(t) <= 2 for t in lp["top_logprobs"])
        assert choice["text"] == tok.decode(choice["token_ids"], skip_special_tokens=True)
    # A text prompt is tokenized by the server, and gives what its token ids give.
    greedy = {
        "model": "policy",
        "max_tokens": 8,
        "temperature": 0,
        "return_token_ids": True,
        "ignore_eos": True,
    }
    by_text = post(server, "/completions", {**greedy, "prompt": "Hello"}).json()["choices"][0]
    by_ids = post(server, "/completions", {**greedy, "prompt": other_ids}).json()["choices"][0]
    assert by_text["prompt_token_ids"] == other_ids and by_text["token_ids"] == by_ids["token_ids"]


# --- streaming ----------------------------------------------------------------------------------


def test_stream_and_non_stream_give_identical_tokens_at_temperature_zero(server: InferenceServer) -> None:
    base = {
        "model": "policy",
        "messages": [{"role": "user", "content": "Tell me a story."}],
        "max_tokens": 30,
        "temperature": 0,
        "return_token_ids": True,
        "logprobs": True,
        "ignore_eos": True,
    }
    plain = post(server, "/chat/completions", base).json()
    events = sse_events(
        server, "/chat/completions", {**base, "stream": True, "stream_options": {"include_usage": True}}
    )
    assert events[0]["prompt_token_ids"] == plain["prompt_token_ids"]
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    token_ids = [t for e in events for c in e["choices"] for t in c.get("token_ids", [])]
    content = "".join(c["delta"].get("content") or "" for e in events for c in e["choices"])
    lps = [
        x["logprob"]
        for e in events
        for c in e["choices"]
        if c.get("logprobs")
        for x in c["logprobs"]["content"]
    ]
    assert token_ids == plain["choices"][0]["token_ids"]
    assert content == plain["choices"][0]["message"]["content"]
    assert lps == pytest.approx([x["logprob"] for x in plain["choices"][0]["logprobs"]["content"]], abs=1e-5)
    finishes = [c["finish_reason"] for e in events for c in e["choices"] if c.get("finish_reason")]
    assert finishes == ["length"]
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 30

    comp = {"model": "policy", "prompt": "abc", "max_tokens": 20, "temperature": 0, "return_token_ids": True}
    comp_plain = post(server, "/completions", {**comp, "ignore_eos": True}).json()
    comp_events = sse_events(server, "/completions", {**comp, "ignore_eos": True, "stream": True})
    assert [t for e in comp_events for c in e["choices"] for t in c["token_ids"]] == comp_plain["choices"][0][
        "token_ids"
    ]
    assert "".join(c["text"] for e in comp_events for c in e["choices"]) == comp_plain["choices"][0]["text"]
    assert comp_events[0]["choices"][0]["prompt_token_ids"] == comp_plain["choices"][0]["prompt_token_ids"]


async def test_openai_sdk_streams_and_assembles(server: InferenceServer) -> None:
    client = AsyncOpenAI(base_url=server.base_url, api_key="x", max_retries=0)
    stream = await client.chat.completions.create(
        model="policy",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=10,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    pieces, usage = [], None
    async for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for c in chunk.choices:
            pieces.append(c.delta.content or "")
    plain = await client.chat.completions.create(
        model="policy",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=10,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert "".join(pieces) == plain.choices[0].message.content
    assert usage is not None and usage.completion_tokens == 10
    await client.close()


# --- tool calls ---------------------------------------------------------------------------------


def test_tool_call_round_trip_reproduces_the_first_calls_tokens(tool_server: InferenceServer) -> None:
    """A Hermes tool call comes back as OpenAI tool_calls; re-rendering it gives the same ids."""
    client = OpenAI(base_url=tool_server.base_url, api_key="x", max_retries=0)
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": QUESTION}]
    first = client.chat.completions.create(
        model="policy",
        messages=messages,
        tools=CHAT_TOOLS,
        temperature=0,
        max_tokens=96,
        extra_body={"return_token_ids": True},
    )
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    (call,) = choice.message.tool_calls or []
    assert call.type == "function" and call.function.name == "calculator"
    assert json.loads(call.function.arguments) == {"expression": "7+5"}
    extra = first.model_extra or {}
    prompt1, response1 = extra["prompt_token_ids"], (choice.model_extra or {})["token_ids"]
    tok = tool_server.engine.tokenizer
    assert tok.decode(response1, skip_special_tokens=False) == TOOL_CALL_TEXT + "<|im_end|>"
    messages += [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [cast(ChatCompletionMessageToolCallParam, call.model_dump())],
        },
        {"role": "tool", "tool_call_id": call.id, "content": "12"},
    ]
    second = client.chat.completions.create(
        model="policy",
        messages=messages,
        tools=CHAT_TOOLS,
        temperature=0,
        max_tokens=32,
        extra_body={"return_token_ids": True},
    )
    prompt2 = (second.model_extra or {})["prompt_token_ids"]
    assert prompt2[: len(prompt1) + len(response1)] == prompt1 + response1
    assert second.choices[0].message.content == "The answer is 12."
    assert second.choices[0].finish_reason == "stop"
    assert second.choices[0].message.tool_calls == []


def test_streamed_tool_call_is_assembled_by_the_sdk(tool_server: InferenceServer) -> None:
    client = OpenAI(base_url=tool_server.base_url, api_key="x", max_retries=0)
    stream = client.chat.completions.create(
        model="policy",
        messages=[{"role": "user", "content": QUESTION}],
        tools=CHAT_TOOLS,
        temperature=0,
        max_tokens=96,
        stream=True,
        extra_body={"return_token_ids": True},
    )
    content, finish, ids = "", None, []
    calls: dict[int, dict[str, str]] = {}
    for chunk in stream:
        for c in chunk.choices:
            content += c.delta.content or ""
            ids += (c.model_extra or {}).get("token_ids", [])
            for tc in c.delta.tool_calls or []:
                assert tc.function is not None
                calls.setdefault(tc.index, {"name": "", "arguments": ""})
                calls[tc.index]["name"] += tc.function.name or ""
                calls[tc.index]["arguments"] += tc.function.arguments or ""
            finish = c.finish_reason or finish
    assert content == ""  # the tool-call text is not streamed as content
    assert finish == "tool_calls"
    assert calls == {0: {"name": "calculator", "arguments": '{"expression": "7+5"}'}}
    tok = tool_server.engine.tokenizer
    assert tok.decode(ids, skip_special_tokens=False) == TOOL_CALL_TEXT + "<|im_end|>"


def test_tool_choice_none_leaves_text_alone(tool_server: InferenceServer) -> None:
    r = post(
        tool_server,
        "/chat/completions",
        {
            "model": "policy",
            "messages": [{"role": "user", "content": QUESTION}],
            "tools": TOOLS,
            "tool_choice": "none",
            "temperature": 0,
            "max_tokens": 96,
        },
    ).json()
    assert r["choices"][0]["message"]["content"] == TOOL_CALL_TEXT
    assert r["choices"][0]["message"]["tool_calls"] == []
    assert r["choices"][0]["finish_reason"] == "stop"


# --- batching, sampling options -----------------------------------------------------------------


async def test_concurrent_requests_are_batched_and_answers_do_not_change(server: InferenceServer) -> None:
    prompts = [f"prompt number {i} " * (1 + i % 3) for i in range(8)]
    body = {
        "model": "policy",
        "max_tokens": 40,
        "temperature": 0,
        "return_token_ids": True,
        "ignore_eos": True,
    }
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60, trust_env=False) as http:
        solo = []
        for p in prompts:
            r = await http.post("/completions", json={**body, "prompt": p})
            solo.append(r.json()["choices"][0]["token_ids"])
        before = list(server.engine.stats.batch_sizes)
        answers = await asyncio.gather(
            *(http.post("/completions", json={**body, "prompt": p}) for p in prompts)
        )
    together = [a.json()["choices"][0]["token_ids"] for a in answers]
    assert together == solo
    sizes = list(server.engine.stats.batch_sizes)[len(before) :]
    # 8 requests x 40 tokens took far fewer than 320 decode steps: they shared forward passes.
    assert max(sizes) >= 4, sizes
    assert len(sizes) < 8 * 40 / 2


def test_n_seed_stop_and_length(server: InferenceServer) -> None:
    body = {
        "model": "policy",
        "prompt": "xyz",
        "max_tokens": 12,
        "temperature": 1.0,
        "n": 4,
        "seed": 5,
        "return_token_ids": True,
        "ignore_eos": True,
    }
    a = post(server, "/completions", body).json()
    b = post(server, "/completions", body).json()
    ids_a = [c["token_ids"] for c in a["choices"]]
    assert ids_a == [c["token_ids"] for c in b["choices"]]  # seeded: reproducible
    assert len({tuple(x) for x in ids_a}) > 1  # the n samples differ from each other
    assert all(c["finish_reason"] == "length" for c in a["choices"])

    greedy = post(server, "/completions", {**body, "n": 1, "temperature": 0, "max_tokens": 30}).json()
    text = greedy["choices"][0]["text"]
    stop = text[5:7]
    cut = post(
        server, "/completions", {**body, "n": 1, "temperature": 0, "max_tokens": 30, "stop": [stop]}
    ).json()
    choice = cut["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["stop_reason"] == stop
    assert choice["text"] == text[: text.find(stop)]
    assert choice["token_ids"] == greedy["choices"][0]["token_ids"][: len(choice["token_ids"])]


def test_top_p_tiny_is_greedy(server: InferenceServer) -> None:
    body = {
        "model": "policy",
        "prompt": "hello",
        "max_tokens": 15,
        "return_token_ids": True,
        "ignore_eos": True,
    }
    greedy = post(server, "/completions", {**body, "temperature": 0}).json()["choices"][0]["token_ids"]
    nucleus = post(server, "/completions", {**body, "temperature": 1.0, "top_p": 1e-6, "seed": 3}).json()
    assert nucleus["choices"][0]["token_ids"] == greedy
    topk = post(server, "/completions", {**body, "temperature": 1.0, "top_k": 1}).json()
    assert topk["choices"][0]["token_ids"] == greedy


# --- models, versions, errors --------------------------------------------------------------------


def test_models_lists_the_served_model_with_its_version(server: InferenceServer) -> None:
    r = httpx.get(f"{server.base_url}/models", trust_env=False)
    assert r.status_code == 200
    (card,) = r.json()["data"]
    assert card["id"] == "policy" and card["object"] == "model"
    assert card["version"] == server.version == int(r.headers[VERSION_HEADER])
    assert card["max_model_len"] == 512
    assert httpx.get(f"{server.url}/health", trust_env=False).status_code == 200


def test_bad_requests_get_clear_4xx(server: InferenceServer) -> None:
    client = OpenAI(base_url=server.base_url, api_key="x", max_retries=0)
    with pytest.raises(NotFoundError, match="does not exist"):
        client.chat.completions.create(model="other", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(BadRequestError, match="maximum context length"):
        client.completions.create(model="policy", prompt="x" * 600, max_tokens=5)
    with pytest.raises(BadRequestError, match="maximum context length"):
        client.completions.create(model="policy", prompt="x", max_tokens=1000)
    with pytest.raises(BadRequestError, match="temperature"):
        client.completions.create(model="policy", prompt="x", temperature=-1)
    with pytest.raises(BadRequestError, match="tool_choice"):
        client.chat.completions.create(
            model="policy",
            messages=[{"role": "user", "content": "x"}],
            tools=CHAT_TOOLS,
            tool_choice="required",
        )
    with pytest.raises(BadRequestError, match="presence_penalty"):
        client.completions.create(model="policy", prompt="x", presence_penalty=0.5)
    r = post(server, "/completions", {"model": "policy", "prompt": [10**7]})
    assert r.status_code == 400 and "out of range" in r.json()["error"]["message"]
    r = httpx.post(f"{server.base_url}/chat/completions", content=b"{not json", trust_env=False)
    assert r.status_code == 400
    r = post(server, "/chat/completions", {"model": "policy", "messages": []})
    assert r.status_code == 400 and "messages" in r.json()["error"]["message"]


def test_a_client_that_goes_away_frees_its_rows(tiny_model: Any, tokenizer: Any) -> None:
    """An agent killed mid-call must not keep the engine generating its 480 tokens."""
    engine = TorchEngine(fresh_copy(tiny_model, tokenizer), tokenizer)
    real_forward = engine.model.forward

    def slow(*args: Any, **kwargs: Any) -> Any:
        time.sleep(0.005)  # 480 tokens now take at least 2.4 s
        return real_forward(*args, **kwargs)

    engine.model.forward = slow
    server = InferenceServer(engine, "policy").start()
    try:
        body = {"model": "policy", "prompt": "x", "max_tokens": 480, "ignore_eos": True}
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{server.base_url}/completions", json=body, timeout=0.3, trust_env=False)
        for _ in range(300):  # the row is gone well before the 480 tokens would have been made
            if engine.stats.steps > 0 and not engine._rows:
                break
            time.sleep(0.01)
        assert not engine._rows
        assert engine.stats.generated_tokens < 300
    finally:
        server.stop()
        engine.close()
