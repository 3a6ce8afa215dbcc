"""The other three examples end to end: each real agent with its real framework (plain
`openai`, OpenAI Agents SDK, LangGraph + langchain-openai), started by a real Controller for
rollouts on a real Gateway, against the scripted model (real chat template and tokenizer).

Each runs two rollouts: one answered right (reward 1), one answered wrong (reward 0)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from tests.examples.stack import EXAMPLES, RolloutResult, Stack, example_stack
from tests.fakes.scripted_model import Policy
from tests.fakes.scripted_policies import expression_for, number_in, tool_then_answer

pytestmark = pytest.mark.process


@dataclass(frozen=True)
class Example:
    name: str
    agent: str
    env_map: dict[str, str]
    tool: str
    answer: Callable[[str], str]  # the scripted final answer for a tool output
    right: dict  # a sample answered with the tool's output
    wrong: dict  # a sample answered with a wrong number
    expression: str  # what the model asks the tool for the right sample
    tool_output: str  # what the tool returns for it


def _sample(example: str, index: int) -> dict:
    return json.loads((EXAMPLES / example / "data" / "sample.jsonl").read_text().splitlines()[index])


EXAMPLE_LIST = [
    Example(
        "gsm8k",
        "gsm8k_agent:Gsm8kAgent",
        {"QUESTION": "input.question", "ANSWER": "input.answer"},
        "calculator",
        lambda out: f"She has that many left.\n#### {number_in(out)}",
        _sample("gsm8k", 0),
        _sample("gsm8k", 1),
        "24 + 18 - 35",
        "7",
    ),
    Example(
        "openai_agents",
        "agents_sdk_agent:AgentsSdkAgent",
        {"QUESTION": "input.question", "RESULT": "input.result"},
        "calculate",
        lambda out: f"ANSWER: {number_in(out)}",
        _sample("openai_agents", 0),
        _sample("openai_agents", 1),
        "17 * 24",
        "408",
    ),
    Example(
        "langgraph",
        "langgraph_agent:LangGraphAgent",
        {"QUESTION": "input.question", "RESULT": "input.result"},
        "calculate",
        lambda out: f"ANSWER: {number_in(out)}",
        _sample("langgraph", 0),
        _sample("langgraph", 1),
        "17 * 24",
        "408",
    ),
]


def policy_for(example: Example) -> Policy:
    """The right sample: the right expression. The wrong one: 1 + 1, so its answer (2) is wrong."""
    arguments = expression_for(
        {example.right["question"][:30]: example.expression, example.wrong["question"][:30]: "1 + 1"}
    )
    return tool_then_answer(example.tool, arguments, example.answer)


@pytest.fixture(scope="module", params=EXAMPLE_LIST, ids=[e.name for e in EXAMPLE_LIST])
def ran(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, examples_python: str):
    example: Example = request.param
    with example_stack(policy_for(example), example.name, tmp_path_factory.mktemp(example.name)) as stack:
        right, wrong = stack.run(example.agent, example.env_map, [example.right, example.wrong])
        yield example, stack, right, wrong


def test_reward_one_for_the_right_answer_zero_for_a_wrong_one(
    ran: tuple[Example, Stack, RolloutResult, RolloutResult],
) -> None:
    _, _, right, wrong = ran
    assert right.state == "succeeded", f"{right.error}\n{right.log}"
    assert wrong.state == "succeeded", f"{wrong.error}\n{wrong.log}"
    assert right.rewards == [1.0], right.log
    assert wrong.rewards == [0.0], wrong.log


def test_tool_call_then_answer_with_the_tool_output_in_the_prompt(
    ran: tuple[Example, Stack, RolloutResult, RolloutResult],
) -> None:
    example, _, right, _ = ran
    calls = [c["data"] for c in right.model_requests]
    assert len(calls) == 2
    first, _ = calls
    (call,) = first["response"]["choices"][0]["message"]["tool_calls"]
    assert call["function"]["name"] == example.tool
    assert json.loads(call["function"]["arguments"]) == {"expression": example.expression}
    # what the model was sent, as chat: a Responses-API harness's body is recorded beside it as `request`
    sent_first, sent_second = (c.get("chat_request") or c["request"] for c in calls)
    assert example.tool in [t["function"]["name"] for t in sent_first["tools"]]
    tool_messages = [m for m in sent_second["messages"] if m["role"] == "tool"]
    assert [m["content"] for m in tool_messages] == [example.tool_output]
    assert f"<tool_response>\n{example.tool_output}\n</tool_response>" in right.prompt_text(1)
    assert example.right["question"] in right.prompt_text(0)
    for c in calls:  # what the trainer needs was recorded
        assert c["response"]["prompt_token_ids"] and c["response"]["choices"][0]["token_ids"]


def test_rows_merge_into_one_per_rollout(ran: tuple[Example, Stack, RolloutResult, RolloutResult]) -> None:
    """These harnesses re-send the model's tool call exactly as the template renders it, so the
    second prompt extends the first call's prompt + response: one row with both answers trainable."""
    _, _, right, wrong = ran
    for result in (right, wrong):
        assert result.merge_break() is None
        (row,) = result.rows
        assert row.n_calls == 2
        first, second = (c["data"]["response"] for c in result.model_requests)
        assert row.prompt_ids == first["prompt_token_ids"]
        n1 = len(first["choices"][0]["token_ids"])
        context = len(second["prompt_token_ids"]) - len(first["prompt_token_ids"]) - n1
        assert (
            row.response_ids
            == second["prompt_token_ids"][len(row.prompt_ids) :] + second["choices"][0]["token_ids"]
        )
        assert row.response_mask == [1] * n1 + [0] * context + [1] * len(second["choices"][0]["token_ids"])
        assert row.reward == result.rewards[0]
