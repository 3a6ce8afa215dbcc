"""A multi-turn tool-calling agent on the official `openai` client, through the Gateway and real
vLLM: its three calls become ONE trajectory row whose context tokens are exactly the tool
output as vLLM's chat template renders it."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import httpx
import pytest
from openai import AsyncOpenAI

from agentlightning.aggregation import AggregationStats, aggregate_rollout
from agentlightning.client import GatewayClient
from agentlightning.demo.agent import solve
from agentlightning.demo.task import TOOLS
from agentlightning.schemas import Model, RolloutCreate
from tests.conftest import RunningGateway

from .conftest import SERVED_NAME, ScriptedVLLM
from .scripted import FINAL_ANSWER, QUESTION, TOOL_TURNS, script_messages

pytestmark = pytest.mark.timeout(600)


def vllm_chat_tokens(server: ScriptedVLLM, messages: list[dict[str, Any]]) -> list[int]:
    """vLLM's rendering of a conversation (its chat template, the tools, a generation prompt)."""
    r = httpx.post(
        f"{server.base_url}/tokenize",
        json={"model": SERVED_NAME, "messages": messages, "tools": TOOLS, "add_generation_prompt": True},
        timeout=60,
    )
    r.raise_for_status()
    return r.json()["tokens"]


def detokenize(server: ScriptedVLLM, ids: list[int]) -> str:
    r = httpx.post(f"{server.base_url}/detokenize", json={"model": SERVED_NAME, "tokens": ids}, timeout=60)
    r.raise_for_status()
    return r.json()["prompt"]


def test_tool_calling_agent_becomes_one_row_with_vllms_tool_output_as_context(
    vllm_gateway: RunningGateway, vllm_server: ScriptedVLLM
) -> None:
    rollout_id = f"agent-{uuid.uuid4().hex[:8]}"
    with GatewayClient(vllm_gateway.url, vllm_gateway.key) as client:
        client.delete_models()
        client.register_models([Model(model=SERVED_NAME, endpoint=vllm_server.endpoint, version=0)])
        client.create_rollouts([RolloutCreate(rollout_id=rollout_id, input={})])
        base = f"{vllm_gateway.url}/proxy/rollout/{rollout_id}/attempt/a1/mode/val/openai/v1"

        async def run() -> str | None:
            llm = AsyncOpenAI(base_url=base, api_key=vllm_gateway.key, max_retries=2, timeout=120)
            try:  # the demo's agent loop; greedy (validation mode) replays the scripted conversation
                return await solve(llm, QUESTION, logprobs=True)
            finally:
                await llm.close()

        answer = asyncio.run(run())
        triplets = client.get_events_json(rollout_id, format="triplet", attempt_id="a1")
    assert answer == FINAL_ANSWER

    stats = AggregationStats()
    (row,) = aggregate_rollout(triplets, rollout_id, "g", reward=1.0, stats=stats)
    assert row.n_calls == 3 and stats.n_merge_mismatch == 0 and row.rollout_log_probs is not None

    # The row, rebuilt from vLLM's own renderings of the conversation at each call.
    messages = script_messages()
    calls = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    prompts = [vllm_chat_tokens(vllm_server, messages[:i]) for i in calls]
    assert row.prompt_ids == prompts[0]
    full = row.prompt_ids + row.response_ids
    spans: list[tuple[int, list[int]]] = []  # (mask value, tokens) runs of the response
    for token, mask in zip(row.response_ids, row.response_mask, strict=True):
        if spans and spans[-1][0] == mask:
            spans[-1][1].append(token)
        else:
            spans.append((mask, [token]))
    assert [m for m, _ in spans] == [1, 0, 1, 0, 1]
    (_, turn1), (_, context1), (_, turn2), (_, context2), (_, turn3) = spans
    # Each call's prompt as vLLM rendered it is exactly the row so far: context is what lies between.
    assert full[: len(prompts[1])] == prompts[1] and full[: len(prompts[2])] == prompts[2]
    assert prompts[1] == prompts[0] + turn1 + context1
    assert prompts[2] == prompts[1] + turn2 + context2
    for context, (_, result) in zip((context1, context2), TOOL_TURNS, strict=True):
        text = detokenize(vllm_server, context)
        assert (
            text
            == f"\n<|im_start|>user\n<tool_response>\n{result}\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
        )
    assert detokenize(vllm_server, turn3) == FINAL_ANSWER + "<|im_end|>"
    # Trainable tokens carry vLLM's log-probs (near 0: the scripted model is sure); context 0.0.
    for lp, mask in zip(row.rollout_log_probs, row.response_mask, strict=True):
        assert (mask == 0 and lp == 0.0) or (mask == 1 and -0.01 < lp <= 0.0)
