"""A LangGraph tool-calling agent on `langchain-openai`, trained in its own harness.

A ReAct graph from `langgraph.prebuilt.create_react_agent` with a `@tool` function and a
`ChatOpenAI` model pointed at the Gateway (`AGL_OPENAI_BASE_URL`, `AGL_KEY`). The agent calls
`calculate`, then answers `ANSWER: <number>`; the reward is 1.0 when the number equals
`RESULT`. Environment: `AGL_OPENAI_BASE_URL`, `AGL_EVENT_URL`, `AGL_KEY`, `QUESTION`,
`RESULT` (env_map `QUESTION: input.question`, `RESULT: input.result`).
"""

from __future__ import annotations

import ast
import asyncio
import operator
import os
import re
from typing import Any

from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.prebuilt import create_react_agent

from agentlightning.agent_events import apost_reward

SYSTEM = (
    "You solve arithmetic questions. Always compute with the calculate tool, then reply 'ANSWER: <number>'."
)
RECURSION_LIMIT = 12  # graph steps: model, tools, model, ... (a few tool rounds at most)
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


@tool
def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression with + - * / and parentheses, e.g. (3 + 4) * 12."""
    try:
        result = evaluate(expression)
    except (SyntaxError, ValueError, ZeroDivisionError, OverflowError) as exc:
        return f"error: {exc}"
    return str(int(result)) if float(result).is_integer() else f"{result:.6g}"


def reward(final_text: str, result: str) -> float:
    found = _ANSWER.findall(final_text or "")
    try:
        return 1.0 if found and abs(float(found[-1]) - float(result)) < 1e-6 else 0.0
    except ValueError:
        return 0.0


def build_graph(base_url: str, key: str) -> Any:
    model = ChatOpenAI(model="policy", base_url=base_url, api_key=key or "unused", max_retries=6, timeout=300)
    return create_react_agent(model, [calculate], prompt=SYSTEM)


class LangGraphAgent:
    """The rollout entry point (`agent_class: langgraph_agent:LangGraphAgent`)."""

    def run(self) -> None:
        asyncio.run(self.arun())

    async def arun(self) -> float:
        graph = build_graph(os.environ["AGL_OPENAI_BASE_URL"], os.environ.get("AGL_KEY", ""))
        state = await graph.ainvoke(
            {"messages": [("user", os.environ["QUESTION"])]}, {"recursion_limit": RECURSION_LIMIT}
        )
        content = state["messages"][-1].content
        text = content if isinstance(content, str) else str(content)
        value = reward(text, os.environ["RESULT"])
        await apost_reward(value, source="langgraph", reason=text[:500])
        return value


if __name__ == "__main__":
    LangGraphAgent().run()
