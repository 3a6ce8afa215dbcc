"""The demo agent: a plain multi-turn tool-calling loop on the official `openai` client.

It knows nothing about training. The Controller starts it with the rollout's environment:
`AGL_OPENAI_BASE_URL` (the Gateway's proxy for this rollout), `AGL_KEY`, `AGL_EVENT_URL`, and
`QUESTION` / `ANSWER` from the rollout input (`env_map`). It asks the model, runs the
calculator when the model calls it, sends the result back, and reports a reward of 1.0 when
the final answer is right. A typical rollout makes two model calls with a tool result between
them.

    local: {agent_class: agentlightning.demo.agent:CalcAgent,
            env_map: {QUESTION: input.question, ANSWER: input.answer}}
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

# Imported here, not in `run`: the controller's warm process imports this module once and
# forks every rollout from it, so no rollout pays for importing the openai client.
from openai import AsyncOpenAI

from agentlightning.agent_events import apost_reward
from agentlightning.demo.task import TOOL_NAME, TOOLS, calculator, reward

MAX_TURNS = 3
STEP_CREDIT = 0.5  # with STEP_REWARD set: the reward of the call whose tool call computed the answer
MAX_TOKENS = 96


async def solve(
    client: Any,
    question: str,
    model: str = "policy",
    max_turns: int = MAX_TURNS,
    tool_results: list[tuple[int, str]] | None = None,
    **create_kwargs: Any,
) -> str | None:
    """Run the tool loop with an `openai.AsyncOpenAI` client; return the final answer text.
    `tool_results` collects `(call index, tool output)` of every tool the model called."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": question}]
    for turn in range(max_turns):
        response = await client.chat.completions.create(
            model=model, messages=messages, tools=TOOLS, max_tokens=MAX_TOKENS, **create_kwargs
        )
        message = response.choices[0].message
        calls = message.tool_calls or []
        if not calls:
            return message.content
        messages.append(
            {
                "role": "assistant",
                "content": message.content,
                "tool_calls": [
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {"name": c.function.name, "arguments": c.function.arguments},
                    }
                    for c in calls
                ],
            }
        )
        for call in calls:
            output = run_tool(call.function)
            if tool_results is not None:
                tool_results.append((turn, output))
            messages.append({"role": "tool", "tool_call_id": call.id, "content": output})
    return None


def run_tool(function: Any) -> str:
    if function.name != TOOL_NAME:
        return f"error: unknown tool {function.name}"
    try:
        args = json.loads(function.arguments or "{}")
    except json.JSONDecodeError:
        return "error: arguments are not JSON"
    if not isinstance(args, dict) or not isinstance(args.get("expression"), str):
        return 'error: expected {"expression": "..."}'
    return calculator(args["expression"])


class CalcAgent:
    """The rollout entry point for the Controller's local runner (`run()` is synchronous)."""

    def run(self) -> None:
        asyncio.run(self.arun())

    def client(self, base_url: str, key: str) -> AsyncOpenAI:
        # Generous retries: the Gateway answers 429 + Retry-After while the trainer swaps weights.
        return AsyncOpenAI(base_url=base_url, api_key=key or "unused", max_retries=20, timeout=300.0)

    async def answer(self, client: AsyncOpenAI, question: str, tools: list[tuple[int, str]]) -> str | None:
        """The final answer (None: none given); a failed model call raises."""
        return await solve(client, question, model=os.environ.get("AGL_MODEL", "policy"), tool_results=tools)

    async def arun(self) -> float:
        base_url = os.environ["AGL_OPENAI_BASE_URL"]
        key = os.environ.get("AGL_KEY", "")
        question = os.environ["QUESTION"]
        expected = int(os.environ["ANSWER"])
        client = self.client(base_url, key)
        tools: list[tuple[int, str]] = []
        try:
            answer = await self.answer(client, question, tools)
        finally:
            await client.close()
        value = reward(answer, expected)
        if os.environ.get("STEP_REWARD"):  # the per-step variant: partial credit for the right tool call
            for turn, output in tools:
                if output == str(expected):
                    await apost_reward(STEP_CREDIT, call_index=turn, source="demo-step")
                    break
        await apost_reward(value, source="demo", reason=answer or "")
        return value


if __name__ == "__main__":
    CalcAgent().run()
