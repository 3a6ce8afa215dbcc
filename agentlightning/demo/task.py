"""The demo task: one-line word problems, solved with a calculator tool.

Each problem has one number x and says in words what happens to it: "gets two more" is x+2,
"gives away three" is x-3, "ends up with twice as many" is x*2, and so on. The agent
must call the calculator with the right expression, read the tool's answer and report it.
The reward is 1.0 for the right number, else 0.0.
"""

from __future__ import annotations

import ast
import operator
import random
import re
from dataclasses import dataclass
from typing import Any

NAMES = ("Ann", "Bob", "Cy", "Dee", "Eve", "Finn", "Gus", "Ivy", "Jo", "Kim")
ITEMS = ("apples", "pens", "cards", "coins", "books", "eggs", "cups", "shells")

# What happens to the one number in the question, and its wordings: the wording alone tells
# which operation to apply ("two more" adds, "loses two" subtracts, "twice as many" multiplies).
ACTIONS: dict[str, tuple[str, ...]] = {
    "+2": ("gets two more", "finds two more"),
    "+3": ("gets three more", "finds three more"),
    "-2": ("loses two", "gives away two"),
    "-3": ("loses three", "gives away three"),
    "*2": ("doubles them", "ends up with twice as many"),
    "*3": ("triples them", "ends up with three times as many"),
}
OPS = tuple(ACTIONS)
OPERATORS = ("+", "-", "*")
QUESTION = "{name} has {x} {item} and {action}. How many {item} now?"

TOOL_NAME = "calculator"
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": TOOL_NAME,
            "description": "Evaluate an arithmetic expression with + - * and integers.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string", "description": "e.g. 12*3"}},
                "required": ["expression"],
            },
        },
    }
]


@dataclass(frozen=True)
class Problem:
    question: str
    x: int
    op: str  # one of OPS, e.g. "*2"
    answer: int

    def to_input(self, problem_id: str) -> dict[str, Any]:
        return {"id": problem_id, "question": self.question, "answer": self.answer}


def make_problem(rng: random.Random) -> Problem:
    op = rng.choice(OPS)
    x = rng.randint(3, 9)  # one digit: the model copies a single token
    action = rng.choice(ACTIONS[op])
    question = QUESTION.format(name=rng.choice(NAMES), x=x, item=rng.choice(ITEMS), action=action)
    return Problem(question, x, op, int(calculator(f"{x}{op}")))


def make_dataset(n: int, seed: int, prefix: str = "p") -> list[dict[str, Any]]:
    """`n` problems as rollout inputs `{id, question, answer}` (deterministic in `seed`)."""
    rng = random.Random(seed)
    return [make_problem(rng).to_input(f"{prefix}{seed}-{i}") for i in range(n)]


_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def calculator(expression: str) -> str:
    """The tool: integer + - * (and parentheses) only; errors come back as text, as tools do."""
    try:
        tree = ast.parse(expression.strip(), mode="eval")
        return str(_eval(tree.body))
    except Exception as exc:
        return f"error: {type(exc).__name__}"


def _eval(node: ast.AST) -> int:
    if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Mult) and abs(left * right) > 10**12:
            raise ValueError("too large")
        return _BINOPS[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_eval(node.operand)
    raise ValueError("unsupported expression")


_NUMBER = re.compile(r"-?\d+")


def reward(final_answer: str | None, expected: int) -> float:
    """1.0 when the last integer in the agent's final answer is the expected one."""
    if not final_answer:
        return 0.0
    numbers = _NUMBER.findall(final_answer)
    return 1.0 if numbers and int(numbers[-1]) == expected else 0.0
