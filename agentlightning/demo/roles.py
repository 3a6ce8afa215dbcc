"""The two-role demo agent (`agl-demo roles=true`): two policies trained in one run.

The demo's conversation split between two roles, each a policy of its own (docs/policies.md):
the **planner** reads the question and calls the calculator — it chooses the operation — and
the **writer** reads the tool's result and writes the answer. Each call names its role in the
`model` field; the Gateway sends it to that policy and records the policy's version. Rewards:

* the planner's (`policy: planner`): 1.0 when its tool call computed the right number;
* the writer's (`policy: writer`): 1.0 when its answer reports the tool's result, right or wrong
  (its own job, whatever the planner chose);
* shared (no policy): 1.0 when the final answer is right — the task's reward, `val/reward`.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from openai import AsyncOpenAI

from agentlightning.agent_events import apost_reward
from agentlightning.demo.agent import MAX_TOKENS, run_tool
from agentlightning.demo.task import TOOLS, reward

PLANNER = "planner"
WRITER = "writer"


async def solve_in_two_roles(client: Any, question: str) -> tuple[str | None, str | None]:
    """(the tool's result, the final answer): the planner calls the calculator, the writer answers."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": question}]
    first = await client.chat.completions.create(
        model=PLANNER, messages=messages, tools=TOOLS, max_tokens=MAX_TOKENS
    )
    message = first.choices[0].message
    calls = message.tool_calls or []
    if not calls:
        return None, message.content  # the planner answered itself: no tool, no writer
    call = calls[0]
    result = run_tool(call.function)
    messages += [
        {
            "role": "assistant",
            "content": message.content,
            "tool_calls": [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.function.name, "arguments": call.function.arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call.id, "content": result},
    ]
    second = await client.chat.completions.create(
        model=WRITER, messages=messages, tools=TOOLS, max_tokens=MAX_TOKENS
    )
    reply = second.choices[0].message
    return result, None if reply.tool_calls else reply.content


def role_rewards(result: str | None, answer: str | None, expected: int) -> dict[str | None, float]:
    """Each role's reward and the shared one (key None), as the module docstring says."""
    planner = 1.0 if result == str(expected) else 0.0
    writer = reward(answer, int(result)) if result is not None and result.lstrip("-").isdigit() else 0.0
    return {None: reward(answer, expected), PLANNER: planner, WRITER: writer}


class TwoRoleAgent:
    """The rollout entry point for the Controller's local runner (`run()` is synchronous)."""

    def run(self) -> None:
        asyncio.run(self.arun())

    async def arun(self) -> dict[str | None, float]:
        key = os.environ.get("AGL_KEY", "")
        expected = int(os.environ["ANSWER"])
        client = AsyncOpenAI(
            base_url=os.environ["AGL_OPENAI_BASE_URL"], api_key=key or "unused", max_retries=20, timeout=300.0
        )
        try:
            result, answer = await solve_in_two_roles(client, os.environ["QUESTION"])
        finally:
            await client.close()
        rewards = role_rewards(result, answer, expected)
        for policy, value in rewards.items():
            await apost_reward(value, source="demo-roles", **({} if policy is None else {"policy": policy}))
        return rewards


if __name__ == "__main__":
    TwoRoleAgent().run()
