"""Your agent: a plain tool-calling loop on the official `openai` client. It knows nothing about
training; Agent Lightning runs it once per rollout and trains the model it talks to.

The Controller starts it (`Agent().run()`) with the rollout in its environment:
  AGL_OPENAI_BASE_URL  the Gateway's OpenAI-compatible proxy for this rollout (it records every call)
  AGL_KEY              the rollout's key: the API key of the calls, and the bearer token of the reward post
  AGL_EVENT_URL        where the reward goes: POST {"event_type": "reward", "data": {"value": 1.0}}
  QUESTION, ANSWER     this task's fields, mapped from the dataset by config.yaml's `env_map`

Change the prompt, the tool, the reward: the trainer only needs the calls to go through
AGL_OPENAI_BASE_URL and one reward posted at the end.
"""

from __future__ import annotations

import ast
import json
import operator
import os
from typing import Any

import httpx
from openai import OpenAI

MAX_TURNS = 3
MAX_TOKENS = 48  # per model call: short answers keep a CPU run quick

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression with + - * and integers, e.g. 12*3.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        },
    }
]
OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def calculator(expression: str) -> str:
    """The tool: + - * on integers, nothing else (never `eval` what a model wrote)."""

    def value(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
            return int(OPERATORS[type(node.op)](value(node.left), value(node.right)))
        raise ValueError("only integers and + - *")

    try:
        return str(value(ast.parse(expression, mode="eval").body))
    except (SyntaxError, ValueError, RecursionError) as exc:
        return f"error: {exc}"


def run_tool(name: str, arguments: str) -> str:
    if name != "calculator":
        return f"error: no tool {name!r}"
    try:
        args = json.loads(arguments or "{}")
    except json.JSONDecodeError:
        return "error: the arguments are not JSON"
    if not isinstance(args, dict) or not isinstance(args.get("expression"), str):
        return 'error: expected {"expression": "..."}'
    return calculator(args["expression"])


def solve(client: OpenAI, question: str) -> str:
    """Ask the model, run the tool when it calls it, return its final answer."""
    messages: list[Any] = [
        {"role": "system", "content": "Use the calculator, then answer with the number only."},
        {"role": "user", "content": question},
    ]
    for _ in range(MAX_TURNS):
        message = (
            client.chat.completions.create(
                model=os.environ.get("AGL_MODEL", "policy"),  # the name the trainer serves its policy under
                messages=messages,
                tools=TOOLS,  # type: ignore[arg-type]  # the schema above is the API's shape
                max_tokens=MAX_TOKENS,
            )
            .choices[0]
            .message
        )
        if not message.tool_calls:
            return message.content or ""
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            function = call.function  # type: ignore[union-attr]  # custom tool calls are not offered
            output = run_tool(function.name, function.arguments)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": output})
    return ""


def reward(answer: str, expected: str) -> float:
    """1.0 when the last number of the answer is the expected one, else 0.0."""
    words = answer.replace(",", " ").split()
    numbers = [w.strip(".!?") for w in words if w.strip(".!?").lstrip("-").isdigit()]
    return 1.0 if numbers and numbers[-1] == expected else 0.0


def post_reward(value: float) -> None:
    """Report the rollout's reward. The key is required: without the header the Gateway answers 401."""
    key = os.environ.get("AGL_KEY", "")
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    body = {"event_type": "reward", "data": {"value": value}}
    with httpx.Client(timeout=30.0, trust_env=False) as http:
        http.post(os.environ["AGL_EVENT_URL"], json=body, headers=headers).raise_for_status()


class Agent:
    """What config.yaml's `agentlightning.local.agent_class: agent:Agent` names."""

    def run(self) -> None:
        # Generous retries: the Gateway answers 429 while the trainer swaps in new weights.
        client = OpenAI(
            base_url=os.environ["AGL_OPENAI_BASE_URL"],
            api_key=os.environ.get("AGL_KEY") or "unused",
            max_retries=20,
            timeout=300.0,
        )
        answer = solve(client, os.environ["QUESTION"])
        post_reward(reward(answer, os.environ["ANSWER"]))


if __name__ == "__main__":
    Agent().run()
