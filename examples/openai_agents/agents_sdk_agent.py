"""An OpenAI Agents SDK agent with a function tool, trained in its own harness.

`Agent` + `Runner.run` as any Agents SDK user writes them, on the SDK's default model (the
OpenAI Responses API, which the Gateway serves). The only training-specific lines point the
SDK's default client at the Gateway (`AGL_OPENAI_BASE_URL` / `AGL_KEY`; the Controller also sets
`OPENAI_BASE_URL` / `OPENAI_API_KEY`, which the SDK reads by itself) and turn tracing off (it
would upload traces to OpenAI). The task is arithmetic: the agent calls `calculate`, then answers
`ANSWER: <number>`; the reward is 1.0 when the number equals `RESULT`.

Environment: `AGL_OPENAI_BASE_URL`, `AGL_EVENT_URL`, `AGL_KEY`, `QUESTION`, `RESULT`
(env_map `QUESTION: input.question`, `RESULT: input.result`).
"""

from __future__ import annotations

import ast
import asyncio
import operator
import os
import re
from typing import Any

from agents import (
    Agent,
    ModelSettings,
    Runner,
    function_tool,
    set_default_openai_client,
    set_tracing_disabled,
)
from openai import AsyncOpenAI

from agentlightning.agent_events import apost_reward

INSTRUCTIONS = (
    "You solve arithmetic questions. Always compute with the calculate tool, then reply 'ANSWER: <number>'."
)
MAX_TURNS = 6
_ANSWER = re.compile(r"ANSWER:\s*(-?\d+(?:\.\d+)?)")
_OPS: dict[type, Any] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.USub: operator.neg,
}


def evaluate(expression: str) -> float:
    """+ - * / on numbers only: safe on the model's text."""

    def value(node: ast.AST) -> float:
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, (int, float))
            and not isinstance(node.value, bool)
        ):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.operand))
        raise ValueError("only numbers and + - * / ( ) are allowed")

    if len(expression) > 200:
        raise ValueError("expression too long")
    return value(ast.parse(expression, mode="eval").body)


@function_tool
def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression with + - * / and parentheses.

    Args:
        expression: the expression, e.g. (3 + 4) * 12.
    """
    try:
        result = evaluate(expression)
    except (SyntaxError, ValueError, ZeroDivisionError, OverflowError) as exc:
        return f"error: {exc}"
    return str(int(result)) if float(result).is_integer() else f"{result:.6g}"


def reward(final_output: str, result: str) -> float:
    found = _ANSWER.findall(final_output or "")
    try:
        return 1.0 if found and abs(float(found[-1]) - float(result)) < 1e-6 else 0.0
    except ValueError:
        return 0.0


def build_agent() -> Agent:
    return Agent(
        name="calculator",
        instructions=INSTRUCTIONS,
        tools=[calculate],
        model="policy",  # the SDK's default model class: Responses API
        model_settings=ModelSettings(max_tokens=1024),
    )


class AgentsSdkAgent:
    """The rollout entry point (`agent_class: agents_sdk_agent:AgentsSdkAgent`)."""

    def run(self) -> None:
        asyncio.run(self.arun())

    async def arun(self) -> float:
        set_tracing_disabled(True)
        client = AsyncOpenAI(
            base_url=os.environ["AGL_OPENAI_BASE_URL"],
            api_key=os.environ.get("AGL_KEY") or "unused",
            max_retries=6,
            timeout=300.0,
        )
        set_default_openai_client(client, use_for_tracing=False)
        try:
            result = await Runner.run(build_agent(), os.environ["QUESTION"], max_turns=MAX_TURNS)
            output = str(result.final_output)
        finally:
            await client.close()
        value = reward(output, os.environ["RESULT"])
        await apost_reward(value, source="openai_agents", reason=output[:500])
        return value


if __name__ == "__main__":
    AgentsSdkAgent().run()
