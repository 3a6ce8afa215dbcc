"""Calc-X end to end: the real AutoGen agent with the real MCP calculator (a subprocess speaking
MCP over stdio), started by a real Controller for rollouts on a real Gateway, against a
scripted model that renders prompts with a real chat template and tokenizer."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.examples.stack import Stack, example_stack
from tests.fakes.scripted_model import Policy
from tests.fakes.scripted_policies import expression_for, number_in, tool_then_answer

pytestmark = pytest.mark.process

ENV_MAP = {"QUESTION": "input.question", "RESULT": "input.result"}
AGENT = "calc_agent:CalcAgent"
SAMPLE = Path(__file__).resolve().parents[2] / "examples" / "calc_x" / "data" / "sample.jsonl"
ROWS = {r["id"]: r for r in map(json.loads, SAMPLE.read_text().splitlines())}
# Sample rows: a fraction answer (2/3, the calculator says 0.666…) and a plain one, both computed
# right; and one where the model asks the calculator the wrong thing (90 * 4 = 360 is the
# reference; 90 / 4 = 22.5 is not) and so answers wrong.
FRACTION = ROWS["ape210k__00384263"]
DEGREES = ROWS["ape210k__00469689"]
CAKE = ROWS["ape210k__00352031"]
EXPRESSIONS = expression_for(
    {"6.6 minus x": "(6.6 - 5.6) / (3/2)", "right angle": "90 - 75", "piece of cake on the left": "90 / 4"}
)


def scripted_policy() -> Policy:
    return tool_then_answer("calculate", EXPRESSIONS, lambda out: f"### ANSWER: {number_in(out)} ###")


@pytest.fixture(scope="module")
def calc_x(tmp_path_factory: pytest.TempPathFactory, examples_python: str) -> Iterator[Stack]:
    with example_stack(
        scripted_policy(), "calc_x", tmp_path_factory.mktemp("calc_x"), maximum_size=3
    ) as stack:
        stack.run(AGENT, ENV_MAP, [FRACTION, DEGREES, CAKE])
        yield stack


def test_right_answers_get_reward_one_a_wrong_one_zero(calc_x: Stack) -> None:
    for result in calc_x.results:
        assert result.state == "succeeded", result.error
    assert [r.rewards for r in calc_x.results] == [[1.0], [1.0], [0.0]], calc_x.results[2].log
    assert (
        "### ANSWER: 22.5 ###"
        in calc_x.results[2].model_requests[-1]["data"]["response"]["choices"][0]["message"]["content"]
    )


def test_the_agent_calls_the_mcp_calculator_then_answers(calc_x: Stack) -> None:
    fraction = calc_x.results[0]
    calls = fraction.model_requests
    assert len(calls) == 2  # the tool call, then AutoGen's reflection on the tool's output
    first, second = (c["data"] for c in calls)
    assert first["response"]["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "calculate"
    assert first["request"]["tools"][0]["function"]["name"] == "calculate"
    # The MCP calculator really ran: its output is in the second call, as the tool message
    # and, rendered by the chat template, in the prompt's token ids.
    tool_messages = [m for m in second["request"]["messages"] if m["role"] == "tool"]
    assert [m["content"] for m in tool_messages] == ["0.6666666666666666"]
    assert "<tool_response>\n0.6666666666666666\n</tool_response>" in fraction.prompt_text(1)
    assert FRACTION["question"] in fraction.prompt_text(0)
    assert "### ANSWER: <answer> ###" in fraction.prompt_text(0)


def test_rows_from_autogen_calls(calc_x: Stack) -> None:
    """AutoGen's reflection call carries no `tools`: the template renders another system prompt,
    so the second call cannot extend the first and each call becomes its own row."""
    for result in calc_x.results:
        assert result.stats.n_calls == 2
        assert len(result.rows) == 2
        assert [r.n_calls for r in result.rows] == [1, 1]
        assert "sent without `tools`" in (result.merge_break() or "")
        calls = [c["data"]["response"] for c in result.model_requests]
        for row, call in zip(result.rows, calls, strict=True):
            assert row.prompt_ids == call["prompt_token_ids"]
            assert row.response_ids == call["choices"][0]["token_ids"]
            assert all(m == 1 for m in row.response_mask)
            assert row.reward == result.rewards[0]
