"""Calc-X: an AutoGen AgentChat agent with the MCP calculator, trained in its own harness.

The agent is Agent Lightning v1.0's Calc-X agent, unchanged in what it does: an
`AssistantAgent` (reflect_on_tool_use) on an `OpenAIChatCompletionClient` pointed at the
Gateway's proxy, with the `mcp-server-calculator` MCP server started over stdio. It knows
nothing about training; the Controller hands it its rollout through the environment:

    AGL_OPENAI_BASE_URL  the Gateway's OpenAI proxy for this rollout
    AGL_EVENT_URL        where the reward goes (agentlightning.agent_events posts it, with retries)
    AGL_KEY              the key for both
    QUESTION, RESULT     the task (env_map: QUESTION: input.question, RESULT: input.result)

Run it by hand: `QUESTION=... RESULT=... AGL_...=... python calc_agent.py`.
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
from typing import Any

# Imported at module level: the Controller's warm process imports this module once and forks
# every rollout from it, so no rollout pays for importing AutoGen.
from autogen_agentchat.agents import AssistantAgent
from autogen_core.models import ModelInfo
from autogen_ext.models.openai import OpenAIChatCompletionClient
from autogen_ext.tools.mcp import McpWorkbench, StdioServerParams
from eval_utils import scalar_are_results_same

from agentlightning.agent_events import apost_reward

OUTPUT_FORMAT = (
    "Output the answer when you are ready. The answer should be surrounded by three sharps (`###`), "
    "in the form of ### ANSWER: <answer> ###."
)
ANSWER_PATTERN = re.compile(r"###\s*ANSWER:\s*(.+?)(\s*###|$)")
RUN_TIMEOUT_SECONDS = 300.0  # the agent's own limit; keep it under the rollout timeout
MCP_READ_TIMEOUT_SECONDS = 120.0
REL_TOL = 1e-2
# v1.0's setting: after the tool call, one more model call (without tools) to reflect on the
# result. Its prompt renders without the tool block, so it is a second training row. With 0,
# the agent instead loops with tools (up to 3 calls), and a rollout merges into one row.
REFLECT_ON_TOOL_USE = os.environ.get("CALC_X_REFLECT_ON_TOOL_USE", "1") != "0"

# The calculator runs in this interpreter (its package is one of this example's dependencies).
CALCULATOR = StdioServerParams(
    command=sys.executable,
    args=["-m", "mcp_server_calculator"],
    read_timeout_seconds=MCP_READ_TIMEOUT_SECONDS,
)


def extract_answer(text: str) -> str:
    """The answer in `### ANSWER: … ###`, else the whole text."""
    match = ANSWER_PATTERN.search(text)
    return match.group(1) if match else text


def model_client(base_url: str, key: str) -> OpenAIChatCompletionClient:
    return OpenAIChatCompletionClient(
        model="auto",  # the Gateway sets the served model's name
        base_url=base_url,
        api_key=key or "unused",
        model_info=ModelInfo(
            vision=False, function_calling=True, json_output=False, family="unknown", structured_output=False
        ),
        max_retries=6,  # the Gateway answers 429 + Retry-After while the trainer swaps weights
    )


async def solve(question: str, base_url: str, key: str) -> str:
    """Run the agent on one question; the final message's text (or "None" on timeout)."""
    client = model_client(base_url, key)
    try:
        async with McpWorkbench(server_params=CALCULATOR) as workbench:
            agent = AssistantAgent(
                name="calc",
                model_client=client,
                workbench=workbench,
                reflect_on_tool_use=REFLECT_ON_TOOL_USE,
                max_tool_iterations=1 if REFLECT_ON_TOOL_USE else 3,
            )
            task = f"{question} {OUTPUT_FORMAT}"
            result = await asyncio.wait_for(agent.run(task=task), timeout=RUN_TIMEOUT_SECONDS)
    except TimeoutError:
        return "None"
    finally:
        await client.close()
    content: Any = result.messages[-1].content if result.messages else ""
    return content if isinstance(content, str) else str(content)


class CalcAgent:
    """The rollout entry point for the Controller (`agent_class: calc_agent:CalcAgent`)."""

    def run(self) -> None:
        asyncio.run(self.arun())

    async def arun(self) -> float:
        last = await solve(
            os.environ["QUESTION"], os.environ["AGL_OPENAI_BASE_URL"], os.environ.get("AGL_KEY", "")
        )
        answer = extract_answer(last)
        value = 1.0 if scalar_are_results_same(answer, os.environ["RESULT"], REL_TOL) else 0.0
        await apost_reward(value, source="calc_x", reason=answer[:500])
        return value


if __name__ == "__main__":
    CalcAgent().run()
