"""A long coding-agent rollout through the token-exact Gateway: 40 Responses-API calls (Codex CLI's
shape: the whole history re-sent each call as items, the model's tool-call JSON sent back compact)
whose context grows past 32k tokens. It stays one training row, every prompt is the exact tokens
of the earlier turns plus what is new, and the store keeps about the rollout's unique tokens, not
the O(T²) that re-sent histories would cost stored whole (docs/long_horizon.md)."""

from __future__ import annotations

import json
import sqlite3
import uuid
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from agentlightning.aggregation import AggregationStats, aggregate_rollout
from agentlightning.client import GatewayClient
from agentlightning.schemas import Model, RolloutCreate
from tests.conftest import RunningGateway, start_gateway
from tests.fakes.model_server import FakeModelServer, Reply, ToolCall
from tests.postgres import store_is_postgres

KEY = "long-key"
CALLS = 40
OUTPUT_WORDS = 820  # each tool output: ~830 tokens, so the last prompt is past 32k
WRITTEN = '{"cmd": "cat part.txt"}'  # as the model writes it; the harness re-sends it compact
TOOLS = [{"type": "function", "name": "shell", "parameters": {"type": "object"}}]


@pytest.fixture(scope="module")
def gateway(
    tmp_path_factory: pytest.TempPathFactory, scale_out_fake: FakeModelServer
) -> Iterator[RunningGateway]:
    gw = start_gateway(tmp_path_factory.mktemp("long"), KEY)
    try:
        with GatewayClient(gw.url, KEY) as c:
            c.register_models([Model(model="policy", endpoint=scale_out_fake.base_url, version=1)])
        yield gw
    finally:
        gw.process.stop()


def tool_output(i: int) -> str:
    return f"part {i}: " + " ".join(f"w{i}x{j}" for j in range(OUTPUT_WORDS))


def codex_like_loop(llm: openai.OpenAI) -> str:
    """Tool call after tool call, the whole history as items each time, then a closing answer."""
    items: list[dict[str, Any]] = [{"role": "user", "content": "read every part, then summarize"}]
    for i in range(CALLS):
        response = llm.responses.create(model="policy", input=items, tools=TOOLS)  # type: ignore[arg-type]
        calls = [item for item in response.output if item.type == "function_call"]
        if not calls:
            return response.output_text
        (call,) = calls
        compact = json.dumps(json.loads(call.arguments), separators=(",", ":"))
        items += [
            {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": compact},
            {"type": "function_call_output", "call_id": call.call_id, "output": tool_output(i)},
        ]
    raise AssertionError(f"no closing answer after {CALLS} calls")


def stored_bytes(gateway: RunningGateway, rollout_id: str) -> int:
    """What the Gateway's SQLite file holds for the rollout's events (read beside the writer: WAL)."""
    with sqlite3.connect(f"file:{gateway.db_path}?mode=ro", uri=True) as db:
        (total,) = db.execute(
            "SELECT SUM(LENGTH(data) + COALESCE(LENGTH(triplet), 0) + COALESCE(LENGTH(call), 0))"
            " FROM events WHERE rollout_id = ?",
            (rollout_id,),
        ).fetchone()
    return int(total)


def test_a_40_call_rollout_past_32k_tokens_is_one_exact_row_stored_as_its_unique_tokens(
    gateway: RunningGateway, scale_out_fake: FakeModelServer
) -> None:
    scale_out_fake.state.reset()
    scale_out_fake.script(
        Reply(content="", tool_calls=[ToolCall("shell", WRITTEN)], times=CALLS - 1),
        Reply(content="all parts read"),
    )
    rollout_id = f"long-{uuid.uuid4().hex[:8]}"
    with GatewayClient(gateway.url, KEY) as client:
        client.create_rollouts([RolloutCreate(rollout_id=rollout_id, input={})])
        base = f"{gateway.url}/proxy/rollout/{rollout_id}/attempt/a1/mode/train/openai/v1"
        with openai.OpenAI(base_url=base, api_key=KEY, max_retries=0, timeout=120) as llm:
            assert codex_like_loop(llm) == "all parts read"
        events = [e["data"] for e in client.get_events_json(rollout_id, format="raw", attempt_id="a1")]
        triplets = client.get_events_json(rollout_id, format="triplet", attempt_id="a1")

    assert len(events) == CALLS
    prompts = [e["response"]["prompt_token_ids"] for e in events]
    answers = [e["response"]["choices"][0]["token_ids"] for e in events]
    assert len(prompts[-1]) > 32_000
    # Every prompt extends the previous prompt + the tokens the model wrote (not a re-rendering).
    for before, answer, after, event in zip(prompts, answers, prompts[1:], events[1:], strict=False):
        assert after[: len(before) + len(answer)] == before + answer
        assert event["segment"] == {"continues": True, "token_exact": True}

    stats = AggregationStats()
    (row,) = aggregate_rollout(triplets, rollout_id, "g", reward=1.0, stats=stats)
    assert row.n_calls == CALLS and stats.n_merge_mismatch == 0
    assert row.prompt_ids + row.response_ids == prompts[-1] + answers[-1]
    assert sum(row.response_mask) == sum(len(a) for a in answers)  # only the model's tokens train

    if store_is_postgres():
        return  # the byte count below reads the SQLite file
    # Stored whole, every call would repeat its history: the sum of all prompts, twice (the event
    # and its triplet view), as JSON. As deltas the store holds about the unique tokens: 4 bytes
    # an id, and each tool output's text twice (the Responses items and their chat form).
    unique_tokens = len(prompts[-1]) + len(answers[-1])
    whole = sum(2 * len(json.dumps(p)) for p in prompts)
    stored = stored_bytes(gateway, rollout_id)
    assert stored < whole / 8, (stored, whole)
    assert stored < 40 * unique_tokens, (stored, unique_tokens)
