"""GSM8K: a math agent on the plain `openai` client with a calculator tool.

A multi-turn tool loop (no framework): the model may call `calculator`, sees its result, and
ends with `#### <answer>` as GSM8K solutions do. The reward is 1.0 when that number equals
the number after `####` in the data set's `answer`. Environment (set by the Controller):
`AGL_OPENAI_BASE_URL`, `AGL_EVENT_URL`, `AGL_KEY`, and `QUESTION` / `ANSWER` (env_map
`QUESTION: input.question`, `ANSWER: input.answer`).
"""

from __future__ import annotations

import ast
import asyncio
import json
import operator
import os
import re
from typing import Any, cast

from openai import AsyncOpenAI
from openai.types.chat import ChatCompletionMessageParam, ChatCompletionToolParam

from agentlightning.agent_events import apost_reward

SYSTEM = (
    "Solve the math word problem. Use the calculator for arithmetic. "
    "End your reply with the final answer as '#### <number>'."
)
TOOLS: list[ChatCompletionToolParam] = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression (+ - * / and parentheses).",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string", "description": "e.g. (48 / 2) + 48"}},
                "required": ["expression"],
            },
        },
    }
]
MAX_TURNS = 5
MAX_TOKENS = 1024
_FINAL = re.compile(r"####\s*\$?\s*(-?[\d,]*\.?\d+)")
_OPS: dict[type, Any] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}


def calculator(expression: str) -> str:
    """+ - * / on numbers only (no names, no powers): safe on the model's text."""

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
        return "error: expression too long"
    try:
        result = value(ast.parse(expression.replace(",", ""), mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError, OverflowError) as exc:
        return f"error: {exc}"
    return str(int(result)) if float(result).is_integer() else f"{result:.6g}"


def final_number(text: str | None) -> float | None:
    """The number after the last `####`, or None."""
    found = _FINAL.findall(text or "")
    if not found:
        return None
    try:
        return float(found[-1].replace(",", ""))
    except ValueError:
        return None


def reward(reply: str | None, reference_answer: str) -> float:
    got, want = final_number(reply), final_number(reference_answer)
    return 1.0 if got is not None and want is not None and abs(got - want) < 1e-6 else 0.0


async def solve(client: AsyncOpenAI, question: str) -> str | None:
    messages: list[ChatCompletionMessageParam] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": question},
    ]
    for _ in range(MAX_TURNS):
        response = await client.chat.completions.create(
            model="policy", messages=messages, tools=TOOLS, max_tokens=MAX_TOKENS
        )
        message = response.choices[0].message
        if not message.tool_calls:
            return message.content
        assistant = message.model_dump(exclude_none=True, include={"role", "content", "tool_calls"})
        messages.append(cast(ChatCompletionMessageParam, assistant))
        for call in message.tool_calls:
            if call.type != "function":  # only function tools are offered
                messages.append(
                    {"role": "tool", "tool_call_id": call.id, "content": "error: not a function tool"}
                )
                continue
            try:
                args = json.loads(call.function.arguments or "{}")
                output = calculator(str(args["expression"]))
            except (json.JSONDecodeError, KeyError, TypeError):
                output = 'error: expected {"expression": "..."}'
            messages.append({"role": "tool", "tool_call_id": call.id, "content": output})
    return None


class Gsm8kAgent:
    """The rollout entry point (`agent_class: gsm8k_agent:Gsm8kAgent`)."""

    def run(self) -> None:
        asyncio.run(self.arun())

    async def arun(self) -> float:
        client = AsyncOpenAI(
            base_url=os.environ["AGL_OPENAI_BASE_URL"],
            api_key=os.environ.get("AGL_KEY") or "unused",
            max_retries=6,
            timeout=300.0,
        )
        try:
            reply = await solve(client, os.environ["QUESTION"])
        finally:
            await client.close()
        value = reward(reply, os.environ["ANSWER"])
        await apost_reward(value, source="gsm8k", reason=(reply or "")[:500])
        return value


if __name__ == "__main__":
    Gsm8kAgent().run()
