"""A scripted agent for the dashboard tests: asks the model, runs the calculator tool it calls,
sends the result back, and reports reward 1 when the final answer holds the tool's result.

A question ending in "(fresh)" makes the second call start a new conversation (it drops the
history), so the trainer core cannot merge the two calls: a merge break the dashboard explains.
"""

from __future__ import annotations

import ast
import json
import operator
import os
from typing import cast

import openai
from openai.types.chat import ChatCompletionMessageParam, ChatCompletionToolParam

from tests.controller.agents import reward

TOOLS: list[ChatCompletionToolParam] = [
    {
        "type": "function",
        "function": {
            "name": "calc",
            "description": "evaluate an arithmetic expression",
            "parameters": {
                "type": "object",
                "properties": {"expr": {"type": "string"}},
                "required": ["expr"],
            },
        },
    }
]
OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def calc(expr: str) -> int:
    def value(node: ast.AST) -> int:
        if isinstance(node, ast.BinOp) and type(node.op) in OPS:
            return OPS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        raise ValueError(f"not arithmetic: {expr!r}")

    return value(ast.parse(expr, mode="eval").body)


class ToolAgent:
    def run(self) -> None:
        client = openai.OpenAI(
            base_url=os.environ["AGL_OPENAI_BASE_URL"], api_key=os.environ["AGL_KEY"], max_retries=2
        )
        question = os.environ["QUESTION"]
        messages: list[ChatCompletionMessageParam] = [
            {"role": "system", "content": "You can use the calc tool."},
            {"role": "user", "content": f"What is {question}?"},
        ]
        first = client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
        call = (first.choices[0].message.tool_calls or [])[0]
        assert call.type == "function"
        result = calc(json.loads(call.function.arguments)["expr"])
        tool_turn: list[ChatCompletionMessageParam] = [
            cast(ChatCompletionMessageParam, first.choices[0].message.model_dump(exclude_none=True)),
            {"role": "tool", "tool_call_id": call.id, "content": f"tool-result: {result}"},
        ]
        if question.endswith("(fresh)"):
            messages = [{"role": "user", "content": f"The calculator says {result}."}, tool_turn[1]]
        else:
            messages += tool_turn
        final = client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
        answer = final.choices[0].message.content or ""
        reward(1.0 if str(result) in answer else 0.0, answer=answer)
