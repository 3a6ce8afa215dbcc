"""Every agent API through the Gateway against real vLLM (`--enable-scale-out`), tokens in and
tokens out: the official `openai` SDK's Responses API, the OpenAI Agents SDK on its default
(Responses) model, the official `anthropic` SDK, and chat. Each call is recorded once; its
prompt is vLLM's render of the request (or, in a multi-turn rollout, the exact tokens of the
earlier turns followed by vLLM's render of what is new), its response ids and log-probs are
what vLLM generated; a tool loop is one training row even when the model writes its tool calls
differently from how the chat template re-renders them."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import anthropic
import httpx
import openai
import pytest
from anthropic.types import ContentBlockParam, Message, MessageParam, ToolParam
from openai.types.chat import ChatCompletionMessage, ChatCompletionMessageParam
from openai.types.responses import FunctionToolParam, Response

from agentlightning.aggregation import AggregationStats, aggregate_rollout
from agentlightning.client import GatewayClient
from agentlightning.demo.task import TOOLS
from agentlightning.schemas import Model, RolloutCreate
from agentlightning.torch_backend.vllm_server import reload_weights, reset_prefix_cache
from tests.conftest import RunningGateway, start_gateway
from tests.heavy import require
from tests.server.test_proxy import wait_for

from .compact import save_compact_weights
from .conftest import SERVED_NAME, ScriptedVLLM
from .scripted import CHAT_TOOLS, FINAL_ANSWER, QUESTION, TOOL_TURNS

pytestmark = pytest.mark.timeout(900)
KEY = "apis-key"
GREEDY = ("default_proxy.train.temperature=0.0",)  # train mode (log-probs recorded), greedy: on script
FUNCTION = TOOLS[0]["function"]
# The SDK's type requires `strict`, which the API defaults.
RESPONSES_TOOLS: list[FunctionToolParam] = [
    {  # type: ignore[typeddict-item]
        "type": "function",
        "name": FUNCTION["name"],
        "description": FUNCTION["description"],
        "parameters": FUNCTION["parameters"],
    }
]
ANTHROPIC_TOOLS: list[ToolParam] = [
    {"name": FUNCTION["name"], "description": FUNCTION["description"], "input_schema": FUNCTION["parameters"]}
]
EXAMPLES_PYTHON = Path(".venv-examples/bin/python")


def function_calls(message: ChatCompletionMessage) -> list[tuple[str, str]]:
    """(name, arguments) of each of the message's tool calls, all function calls."""
    calls = []
    for call in message.tool_calls or []:
        assert call.type == "function", call
        calls.append((call.function.name, call.function.arguments))
    return calls


def calculate(arguments: dict[str, Any]) -> str:
    return str(eval(arguments["expression"], {"__builtins__": {}}))  # "7+5", "12*2": the script's


@pytest.fixture(scope="module")
def gateways(
    tmp_path_factory: pytest.TempPathFactory, vllm_server: ScriptedVLLM
) -> Iterator[dict[str, RunningGateway]]:
    """A token-exact Gateway (the default) and a pass-through one, both in front of the server."""
    started = {
        "exact": start_gateway(tmp_path_factory.mktemp("exact"), KEY, *GREEDY),
        "pass": start_gateway(
            tmp_path_factory.mktemp("pass"), KEY, *GREEDY, "default_proxy.token_exact=false"
        ),
    }
    try:
        for gw in started.values():
            with GatewayClient(gw.url, KEY) as c:
                c.register_models([Model(model=SERVED_NAME, endpoint=vllm_server.endpoint, version=1)])
        yield started
    finally:
        for gw in started.values():
            gw.process.stop()


class Rollout:
    def __init__(self, gw: RunningGateway) -> None:
        self.id = f"r-{uuid.uuid4().hex[:10]}"
        self.client = GatewayClient(gw.url, KEY)
        self.client.create_rollouts([RolloutCreate(rollout_id=self.id, input={})])
        self.root = f"{gw.url}/proxy/rollout/{self.id}/attempt/a1/mode/train"
        self.openai = openai.OpenAI(
            base_url=self.root + "/openai/v1", api_key=KEY, max_retries=0, timeout=300
        )
        self.anthropic = anthropic.Anthropic(base_url=self.root + "/anthropic", api_key=KEY, max_retries=0)

    def events(self) -> list[dict[str, Any]]:
        return [e["data"] for e in self.client.get_events_json(self.id, format="raw", attempt_id="a1")]

    def rows(self) -> tuple[list[Any], AggregationStats]:
        triplets = self.client.get_events_json(self.id, format="triplet", attempt_id="a1")
        stats = AggregationStats()
        return aggregate_rollout(triplets, self.id, "g", reward=1.0, stats=stats), stats


def vllm_render(server: ScriptedVLLM, chat: dict[str, Any]) -> list[int]:
    r = httpx.post(
        f"{server.base_url}/v1/chat/completions/render", json={**chat, "model": SERVED_NAME}, timeout=120
    )
    r.raise_for_status()
    return r.json()["token_ids"]


def vllm_generate(server: ScriptedVLLM, prompt: list[int], n: int) -> tuple[list[int], list[float]]:
    """Greedy generation on token ids, as vLLM does it for the Gateway."""
    body = {
        "model": SERVED_NAME,
        "token_ids": prompt,
        "sampling_params": {"temperature": 0.0, "max_tokens": n, "logprobs": 0},
    }
    r = httpx.post(f"{server.base_url}/inference/v1/generate", json=body, timeout=120)
    r.raise_for_status()
    choice = r.json()["choices"][0]
    return choice["token_ids"], [e["logprob"] for e in choice["logprobs"]["content"]]


def check_exact(server: ScriptedVLLM, rollout: Rollout, api: str, calls: int) -> list[dict[str, Any]]:
    """Each call recorded once, on the token-exact path; the first prompt is vLLM's render of the
    request, every later one continues the previous prompt + response; each recorded prompt,
    re-generated greedily on vLLM, gives the recorded response ids and log-probs. One row."""
    events = rollout.events()
    assert len(events) == calls and all(e["api"] == api and e["status"] == "ok" for e in events)
    triplets = [
        e["data"] for e in rollout.client.get_events_json(rollout.id, format="triplet", attempt_id="a1")
    ]
    assert events[0]["segment"] == {"continues": False, "token_exact": True, "first": True}
    sent = events[0].get("chat_request") or events[0]["request"]  # chat calls have no translation
    assert triplets[0]["prompt_token_ids"] == vllm_render(server, sent)
    sequence: list[int] = []
    for event, triplet in zip(events, triplets, strict=True):
        prompt, response = triplet["prompt_token_ids"], triplet["response_token_ids"]
        if sequence:
            assert event["segment"] == {"continues": True, "token_exact": True}
            assert prompt[: len(sequence)] == sequence
        ids, log_probs = vllm_generate(server, prompt, len(response))
        assert ids == response
        assert triplet["response_log_probs"] == pytest.approx(log_probs, abs=1e-4)
        sequence = prompt + response
    (row,), stats = rollout.rows()
    assert row.n_calls == calls and stats.n_merge_mismatch == 0
    return events


# --- the three APIs' tool loops -------------------------------------------------------------


def responses_loop(rollout: Rollout, stream_last: bool = False) -> str:
    """The scripted tool loop through `responses.create` (and `responses.stream` for the last call)."""
    items: list[Any] = [{"role": "user", "content": QUESTION}]
    for turn in range(len(TOOL_TURNS) + 1):
        response: Response
        if stream_last and turn == len(TOOL_TURNS):
            with rollout.openai.responses.stream(model="m", input=items, tools=RESPONSES_TOOLS) as stream:
                response = stream.get_final_response()
        else:
            response = rollout.openai.responses.create(model="m", input=items, tools=RESPONSES_TOOLS)
        calls = [item for item in response.output if item.type == "function_call"]
        if not calls:
            return response.output_text
        for call in calls:
            items.append(
                {
                    "type": "function_call",
                    "call_id": call.call_id,
                    "name": call.name,
                    "arguments": call.arguments,
                }
            )
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": call.call_id,
                    "output": calculate(json.loads(call.arguments)),
                }
            )
    raise AssertionError("the model did not stop calling tools")


def anthropic_loop(rollout: Rollout, stream_last: bool = False, max_tokens: int = 200) -> str:
    messages: list[MessageParam] = [{"role": "user", "content": QUESTION}]
    for turn in range(len(TOOL_TURNS) + 1):
        # timeout: the SDK refuses a non-streamed call whose max_tokens may take long
        message: Message
        if stream_last and turn == len(TOOL_TURNS):
            with rollout.anthropic.messages.stream(
                model="m", max_tokens=max_tokens, messages=messages, tools=ANTHROPIC_TOOLS, timeout=300
            ) as stream:
                message = stream.get_final_message()
        else:
            message = rollout.anthropic.messages.create(
                model="m", max_tokens=max_tokens, messages=messages, tools=ANTHROPIC_TOOLS, timeout=300
            )
        uses = [block for block in message.content if block.type == "tool_use"]
        if not uses:
            assert message.stop_reason == "end_turn"
            return "".join(block.text for block in message.content if block.type == "text")
        assert message.stop_reason == "tool_use"
        content = [block.model_dump() for block in message.content]
        messages.append({"role": "assistant", "content": cast(list[ContentBlockParam], content)})
        messages.append(
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": u.id, "content": calculate(u.input)} for u in uses
                ],
            }
        )
    raise AssertionError("the model did not stop calling tools")


def chat_loop(rollout: Rollout, stream_last: bool = False) -> str:
    """The scripted tool loop through `chat.completions.create` (streamed for the last call)."""
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": QUESTION}]
    for turn in range(len(TOOL_TURNS) + 1):
        if stream_last and turn == len(TOOL_TURNS):
            chunks = list(
                rollout.openai.chat.completions.create(
                    model="m", messages=messages, tools=CHAT_TOOLS, stream=True
                )
            )
            extras = [c.choices[0].model_extra or {} for c in chunks if c.choices]
            ids = [t for extra in extras for t in extra.get("token_ids") or []]
            # streamed: every chunk carries its token ids (made from a whole answer, the finish
            # chunk would carry none)
            assert extras and all(extra.get("token_ids") is not None for extra in extras)
            assert rollout.events()[-1]["response"]["choices"][0]["token_ids"] == ids
            return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        answer = rollout.openai.chat.completions.create(model="m", messages=messages, tools=CHAT_TOOLS)
        message = answer.choices[0].message
        if not message.tool_calls:
            return message.content or ""
        messages.append(cast(ChatCompletionMessageParam, message.model_dump(exclude_none=True)))
        for call in message.tool_calls:
            assert call.type == "function"
            arguments = json.loads(call.function.arguments)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": calculate(arguments)})
    raise AssertionError("the model did not stop calling tools")


LOOPS: dict[str, Callable[..., str]] = {
    "responses": responses_loop,
    "anthropic.messages": anthropic_loop,
    "chat.completions": chat_loop,
}


@pytest.mark.parametrize("path", ["exact", "pass"])
def test_max_tokens_past_the_served_context_is_fitted_not_refused(
    gateways: dict[str, RunningGateway], vllm_server: ScriptedVLLM, path: str
) -> None:
    """Claude Code asks every model for max_tokens 32000, past this server's whole context (1024):
    vLLM answers with what the context leaves after the prompt, on both paths, streamed too; no
    400 ends the harness's run."""
    rollout = Rollout(gateways[path])
    assert anthropic_loop(rollout, stream_last=True, max_tokens=32000) == FINAL_ANSWER
    events = rollout.events()
    assert [e["http_status"] for e in events] == [200, 200, 200]
    for e in events:
        prompt, answer = e["response"]["prompt_token_ids"], e["response"]["choices"][0]["token_ids"]
        assert e["request"]["max_tokens"] == 32000 and len(prompt) + len(answer) <= 1024


@pytest.mark.parametrize("api", ["responses", "anthropic.messages", "chat.completions"])
def test_sdk_tool_loop_is_recorded_exactly_as_vllm_generated(
    gateways: dict[str, RunningGateway], vllm_server: ScriptedVLLM, api: str
) -> None:
    rollout = Rollout(gateways["exact"])
    assert LOOPS[api](rollout, stream_last=True) == FINAL_ANSWER
    events = check_exact(vllm_server, rollout, api, calls=3)
    assert [e["stream"] for e in events] == [False, False, True]
    first = events[0]["response"]["choices"][0]["message"]["tool_calls"][0]["function"]
    assert (first["name"], json.loads(first["arguments"])) == (FUNCTION["name"], TOOL_TURNS[0][0])


def test_a_long_token_path_stream_from_vllm_comes_while_generating_and_is_its_record(
    gateways: dict[str, RunningGateway], vllm_server: ScriptedVLLM
) -> None:
    """A long answer (512 tokens, the end-of-text token ignored) streamed on the token path from
    vLLM's generate stream: every chunk carries its token ids (a whole-answer fallback would end
    with a chunk that carries none), the answer comes in many chunks and they add up to the
    recorded answer; the first chunk comes while later tokens are still being generated: an agent
    that leaves after it leaves an incomplete record, cut short, that starts with what it was
    sent. The streamed call goes on from the script's first turn (a call that continues none is
    vLLM's own chat stream).

    How long the first chunk takes is timed by bench/stream_ttfb.py (docs/gateway.md), not here.
    The fake's gates show the streaming step by step (tests/server/test_proxy_token_exact.py)."""

    def long_answer(rollout: Rollout, max_tokens: int) -> Any:
        messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": QUESTION}]
        first = rollout.openai.chat.completions.create(model="m", messages=messages, tools=CHAT_TOOLS)
        (call,) = first.choices[0].message.tool_calls or []
        assert call.type == "function"
        function = {"name": call.function.name, "arguments": call.function.arguments}
        said: Any = {
            "role": "assistant",
            "tool_calls": [{"id": call.id, "type": "function", "function": function}],
        }
        messages += [
            said,
            {"role": "tool", "tool_call_id": call.id, "content": TOOL_TURNS[0][1]},
        ]
        return rollout.openai.chat.completions.create(
            model="m",
            messages=messages,
            tools=CHAT_TOOLS,
            max_tokens=max_tokens,
            stream=True,
            extra_body={"ignore_eos": True},
        )

    def token_ids(chunk: Any) -> list[int] | None:
        return (chunk.choices[0].model_extra or {}).get("token_ids") if chunk.choices else None

    whole = Rollout(gateways["exact"])
    chunks = [c for c in long_answer(whole, 512) if c.choices]
    assert all(token_ids(c) is not None for c in chunks)
    ids = [t for c in chunks for t in token_ids(c) or []]
    assert len(ids) == 512
    assert len(chunks) > 2  # as generated: the first chunk and the last are not the whole answer
    _, event = whole.events()
    assert event["segment"] == {"continues": True, "token_exact": True}
    assert event["status"] == "ok" and event["stream"] is True and not event["incomplete"]
    assert event["response"]["choices"][0]["token_ids"] == ids

    left = Rollout(gateways["exact"])
    stream = long_answer(left, 512)
    sent = next(got for c in stream if (got := token_ids(c)))
    stream.close()  # the agent leaves after its first chunk
    assert wait_for(lambda: len(left.events()) == 2)
    _, event = left.events()
    generated = event["response"]["choices"][0]["token_ids"]
    assert event["incomplete"] and "disconnected" in event["error"]
    assert generated[: len(sent)] == sent and len(generated) < 512


def test_responses_stream_with_a_function_tool(
    gateways: dict[str, RunningGateway], vllm_server: ScriptedVLLM
) -> None:
    rollout = Rollout(gateways["exact"])
    with rollout.openai.responses.stream(model="m", input=QUESTION, tools=RESPONSES_TOOLS) as stream:
        kinds = [event.type for event in stream]
        response = stream.get_final_response()
    (call,) = [item for item in response.output if item.type == "function_call"]
    assert json.loads(call.arguments) == TOOL_TURNS[0][0]
    assert "response.function_call_arguments.done" in kinds and kinds[-1] == "response.completed"
    check_exact(vllm_server, rollout, "responses", calls=1)


AGENTS_SDK_SCRIPT = """
import json, sys
from agents import Agent, FunctionTool, Runner

spec = json.loads(sys.argv[1])

async def calculator(ctx, arguments):
    return str(eval(json.loads(arguments)["expression"], {"__builtins__": {}}))

tool = FunctionTool(
    name=spec["name"], description=spec["description"], params_json_schema=spec["parameters"],
    on_invoke_tool=calculator, strict_json_schema=False,
)
agent = Agent(name="calc", tools=[tool], model="policy")  # the SDK's default model: Responses
print(json.dumps(Runner.run_sync(agent, sys.argv[2]).final_output))
"""


def test_openai_agents_sdk_on_its_default_model(
    gateways: dict[str, RunningGateway], vllm_server: ScriptedVLLM, tmp_path: Path
) -> None:
    require([] if EXAMPLES_PYTHON.exists() else [".venv-examples (the OpenAI Agents SDK)"])
    rollout = Rollout(gateways["exact"])
    env = {
        "PATH": os.environ.get("PATH", ""),
        "OPENAI_BASE_URL": rollout.root + "/openai/v1",  # what the Controller sets (conventional_env)
        "OPENAI_API_KEY": KEY,
        "OPENAI_AGENTS_DISABLE_TRACING": "1",
    }
    done = subprocess.run(
        [str(EXAMPLES_PYTHON), "-c", AGENTS_SDK_SCRIPT, json.dumps(FUNCTION), QUESTION],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == FINAL_ANSWER
    check_exact(vllm_server, rollout, "responses", calls=3)


# --- drift: a model that writes its tool calls compactly -------------------------------------


@pytest.fixture(scope="module")
def compact_model(vllm_server: ScriptedVLLM, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The compact writer's weights in the shared server; the scripted weights put back after."""
    reload_weights(vllm_server.base_url, save_compact_weights(tmp_path_factory.mktemp("compact")))
    reset_prefix_cache(vllm_server.base_url)
    try:
        yield
    finally:
        reload_weights(vllm_server.base_url, vllm_server.model_dir)
        reset_prefix_cache(vllm_server.base_url)


@pytest.mark.parametrize("api", ["chat.completions", "responses", "anthropic.messages"])
def test_compact_tool_calls_stay_one_row_token_exact_and_break_with_a_reason_in_pass_through(
    gateways: dict[str, RunningGateway], vllm_server: ScriptedVLLM, compact_model: None, api: str
) -> None:
    rollout = Rollout(gateways["exact"])
    assert LOOPS[api](rollout) == FINAL_ANSWER
    events = check_exact(vllm_server, rollout, api, calls=3)
    written = vllm_generate(vllm_server, events[0]["response"]["prompt_token_ids"], 64)[0]
    assert (
        b"<tool_call>{"
        in httpx.post(  # the model really writes compactly
            f"{vllm_server.base_url}/detokenize", json={"model": SERVED_NAME, "tokens": written}, timeout=60
        ).content
    )

    # Pass-through: vLLM re-renders the compact call with the template's newlines and spaces.
    rollout = Rollout(gateways["pass"])
    assert LOOPS[api](rollout) == FINAL_ANSWER
    events = rollout.events()
    assert events[0]["segment"] == {"continues": False, "token_exact": False, "first": True}
    broken = events[1]["segment"]
    assert broken["continues"] is False and broken["break"]["reason"] == "rerendered"
    previous = events[0]["response"]
    sequence = previous["prompt_token_ids"] + previous["choices"][0]["token_ids"]
    index = broken["break"]["index"]
    assert len(previous["prompt_token_ids"]) < index < len(sequence)  # inside the model's own answer
    assert events[1]["response"]["prompt_token_ids"][:index] == sequence[:index]
    assert events[1]["response"]["prompt_token_ids"][index] != sequence[index]
    rows, stats = rollout.rows()
    assert len(rows) == 3 and stats.n_merge_mismatch == 2


def test_a_compacted_history_is_a_new_segment_with_its_reason(
    gateways: dict[str, RunningGateway], vllm_server: ScriptedVLLM
) -> None:
    rollout = Rollout(gateways["exact"])
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": QUESTION}]
    for arguments, result in TOOL_TURNS:
        message = (
            rollout.openai.chat.completions.create(model="m", messages=messages, tools=CHAT_TOOLS)
            .choices[0]
            .message
        )
        (call,) = message.tool_calls or []
        assert call.type == "function" and json.loads(call.function.arguments) == arguments
        messages += [
            cast(ChatCompletionMessageParam, message.model_dump(exclude_none=True)),
            {"role": "tool", "tool_call_id": call.id, "content": result},
        ]
    assert (
        rollout.openai.chat.completions.create(model="m", messages=messages, tools=CHAT_TOOLS)
        .choices[0]
        .message.content
        == FINAL_ANSWER
    )
    # The agent summarizes its history and goes on from the summary.
    summary: list[ChatCompletionMessageParam] = [
        {"role": "user", "content": f"{QUESTION} (So far: 7+5 is 12 and 12*2 is 24.)"}
    ]
    rollout.openai.chat.completions.create(model="m", messages=summary, tools=CHAT_TOOLS, max_tokens=16)
    events = rollout.events()
    assert [e["segment"]["continues"] for e in events] == [False, True, True, False]
    assert events[3]["segment"]["break"]["reason"] == "history_shortened"
    assert events[3]["response"]["prompt_token_ids"] == vllm_render(
        vllm_server, {"messages": summary, "tools": TOOLS}
    )
    rows, _ = rollout.rows()
    assert [row.n_calls for row in rows] == [3, 1]
    assert all(sum(row.response_mask) > 0 for row in rows)  # both segments are trained
    metrics = httpx.get(f"{gateways['exact'].url}/metrics", headers={"Authorization": f"Bearer {KEY}"}).text
    assert 'agl_proxy_history_breaks_total{reason="history_shortened"}' in metrics


def test_derender_parses_what_chat_parses(
    gateways: dict[str, RunningGateway], vllm_server: ScriptedVLLM
) -> None:
    """The token-exact answer reads like vLLM's own chat answer to the same request."""
    rollout = Rollout(gateways["exact"])
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": QUESTION}]
    ours = rollout.openai.chat.completions.create(
        model="m", messages=messages, tools=CHAT_TOOLS, temperature=0
    ).choices[0]
    direct = (
        openai.OpenAI(base_url=vllm_server.endpoint, api_key="x", max_retries=0)
        .chat.completions.create(model=SERVED_NAME, messages=messages, tools=CHAT_TOOLS, temperature=0)
        .choices[0]
    )
    assert ours.finish_reason == direct.finish_reason == "tool_calls"
    assert ours.message.content == direct.message.content
    assert function_calls(ours.message) == function_calls(direct.message)
