"""The demo's tokenizer, template, task, warm-up and agent."""

from __future__ import annotations

import json
import random
import tomllib
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

import pytest

from agentlightning.client import GatewayClient
from agentlightning.demo.agent import CalcAgent
from agentlightning.demo.task import ACTIONS, TOOLS, calculator, make_dataset, make_problem, reward
from agentlightning.demo.warmup import (
    WarmupConfig,
    demonstration,
    make_examples,
    render,
    tokenizer_json,
    warmup,
)
from agentlightning.tiny_model import CHAT_TEMPLATE, TOKENIZER_FILE, TinyModelConfig, build_model, save_tiny
from agentlightning.torch_backend.models import load_model
from agentlightning.torch_backend.openai_backend import InferenceServer
from agentlightning.torch_backend.protocol import parse_tool_calls

from .tiny import QUESTION

pytestmark = pytest.mark.timeout(600)  # a hang guard, not a speed test: machines may be busy


def test_the_shipped_tokenizer_is_what_training_on_the_demos_conversations_gives() -> None:
    """Trained again (deterministic), the tokenizer is the shipped file byte for byte: a change to
    the demo's conversations or to the recipe shows here, not as a silent drift."""
    assert tokenizer_json() == TOKENIZER_FILE.read_text(encoding="utf-8"), (
        "the demo's conversations no longer give the shipped tokenizer: if that is meant, write "
        "agentlightning.demo.warmup.tokenizer_json() to agentlightning/tiny_model/tokenizer.json"
    )


def test_the_tokenizer_file_is_package_data() -> None:
    """A wheel carries it: pyproject's package-data names it (only .py files go in otherwise)."""
    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    patterns = pyproject["tool"]["setuptools"]["package-data"]["agentlightning"]
    shipped = TOKENIZER_FILE.relative_to(TOKENIZER_FILE.parents[1]).as_posix()
    assert any(fnmatch(shipped, pattern) for pattern in patterns)


def test_tokenizer_is_lossless_and_splits_digits(tokenizer: Any) -> None:
    for text in (
        "Ann has 7 apples.",
        "émoji 🚀 and\ttabs\n",
        '{"a": [1, 22, 333]}',
        "<tool_call>x</tool_call>",
    ):
        assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text
    pieces = tokenizer.convert_ids_to_tokens(tokenizer.encode("x 1234", add_special_tokens=False))
    assert pieces[-4:] == ["1", "2", "3", "4"]
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.chat_template == CHAT_TEMPLATE


def test_re_rendering_a_parsed_tool_call_reproduces_the_generated_ids(tokenizer: Any) -> None:
    """What the server parses out of a generated turn, the template renders back byte for byte."""
    rng = random.Random(0)
    for _ in range(50):
        question, turn1, result, _ = demonstration(rng)
        messages: list[dict[str, Any]] = [{"role": "user", "content": question}]
        prompt1 = tokenizer.encode(
            tokenizer.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True, tokenize=False),
            add_special_tokens=False,
        )
        generated = tokenizer.encode(turn1, add_special_tokens=False)  # what the model emits, EOS included
        text = tokenizer.decode(generated, skip_special_tokens=True)
        parsed = parse_tool_calls(text)
        assert parsed is not None
        content, calls = parsed
        messages += [
            {"role": "assistant", "content": content, "tool_calls": calls},
            {"role": "tool", "tool_call_id": calls[0]["id"], "content": result},
        ]
        prompt2 = tokenizer.encode(
            tokenizer.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True, tokenize=False),
            add_special_tokens=False,
        )
        assert prompt2[: len(prompt1) + len(generated)] == prompt1 + generated


def test_template_renders_tools_content_and_several_calls(tokenizer: Any) -> None:
    calls = [
        {"type": "function", "function": {"name": "a", "arguments": '{"x": 1}'}},
        {"type": "function", "function": {"name": "b", "arguments": {"y": [2]}}},
    ]
    text = tokenizer.apply_chat_template(
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "Let me see.", "tool_calls": calls},
            {"role": "tool", "content": "ok"},
        ],
        tools=TOOLS,
        tokenize=False,
    )
    assert text == (
        "<|im_start|>system\nBe brief.\nTools: calculator(expression)<|im_end|>\n"
        "<|im_start|>user\nhi<|im_end|>\n"
        '<|im_start|>assistant\nLet me see.<tool_call>\n{"name": "a", "arguments": {"x": 1}}\n</tool_call>\n'
        '<tool_call>\n{"name": "b", "arguments": {"y": [2]}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\nok\n</tool_response><|im_end|>\n"
    )
    parsed = parse_tool_calls('Let me see.<tool_call>\n{"name": "a", "arguments": {"x": 1}}\n</tool_call>')
    assert (
        parsed is not None
        and parsed[0] == "Let me see."
        and parsed[1][0]["function"]["arguments"] == '{"x": 1}'
    )
    assert parse_tool_calls("<tool_call>{not json}</tool_call>") is None
    assert parse_tool_calls("no call here") is None
    unclosed = parse_tool_calls('<tool_call>{"name": "a", "arguments": {}}')
    assert unclosed is not None and unclosed[0] is None and unclosed[1][0]["function"]["name"] == "a"


def test_task_calculator_and_reward() -> None:
    rng = random.Random(3)
    for _ in range(100):
        p = make_problem(rng)
        assert str(p.x) in p.question and any(w in p.question for w in ACTIONS[p.op])
        assert int(calculator(f"{p.x}{p.op}")) == p.answer
    assert calculator("2*(3+4)") == "14" and calculator("-5+2") == "-3"
    assert calculator("__import__('os')").startswith("error")
    assert calculator("9**99").startswith("error") and calculator("1/2").startswith("error")
    assert reward("The answer is 12.", 12) == 1.0 and reward("12 or 13", 12) == 0.0
    assert reward(None, 1) == 0.0 and reward("none", 1) == 0.0 and reward("-3", -3) == 1.0
    data = make_dataset(5, seed=1)
    assert data == make_dataset(5, seed=1) and {"id", "question", "answer"} <= set(data[0])


def test_warmup_examples_mask_exactly_the_model_turns(tokenizer: Any) -> None:
    rng = random.Random(1)
    question, turn1, result, turn2 = demonstration(rng)
    ids, mask = render(tokenizer, question, turn1, result, turn2)
    trained = tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m], skip_special_tokens=False)
    assert trained == turn1 + turn2
    assert turn2 == f"The answer is {result}.<|im_end|>"
    expression = json.loads(turn1.split("\n")[1])["arguments"]["expression"]
    assert calculator(expression) == result
    # The demonstrator is naive: with correct_op_prob=0 it adds on every problem.
    naive = random.Random(2)
    ops = {
        json.loads(demonstration(naive, 0.0)[1].split("\n")[1])["arguments"]["expression"][1]
        for _ in range(30)
    }
    assert ops == {"+"}


def test_short_warmup_lowers_the_loss(tokenizer: Any) -> None:
    model = build_model(TinyModelConfig(hidden_size=32, intermediate_size=64), seed=0, tokenizer=tokenizer)
    first = warmup(model, tokenizer, WarmupConfig(steps=1, batch_size=8, seed=1))["warmup/loss"]
    later = warmup(model, tokenizer, WarmupConfig(steps=40, batch_size=8, seed=2))["warmup/loss"]
    assert later < first / 2
    assert len(make_examples(tokenizer, 3, seed=0)) == 3


def test_saved_demo_model_loads_back(tmp_path: Any, tiny_model: Any, tokenizer: Any) -> None:
    import torch

    path = save_tiny(tmp_path / "m", tiny_model, tokenizer)
    model, tok = load_model(str(path), torch.device("cpu"), torch.float32)
    assert tok.get_vocab() == tokenizer.get_vocab() and tok.chat_template == CHAT_TEMPLATE
    ids = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        assert torch.allclose(model(ids).logits, tiny_model(ids).logits, atol=1e-6)


def test_agent_solves_with_two_calls_and_posts_its_reward(
    tool_server: InferenceServer, gateway: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real agent, with the official openai client, against the real server and Gateway."""
    client = GatewayClient(gateway.url, key=gateway.key)
    (rollout,) = client.create_rollouts([{"input": {"question": QUESTION, "answer": 12}, "rollout_id": "r1"}])
    monkeypatch.setenv("AGL_OPENAI_BASE_URL", tool_server.base_url)  # no proxy on this branch: direct
    monkeypatch.setenv("AGL_EVENT_URL", f"{gateway.url}/api/rollouts/r1/attempt/a1/events")
    monkeypatch.setenv("AGL_KEY", gateway.key)
    monkeypatch.setenv("QUESTION", QUESTION)
    monkeypatch.setenv("ANSWER", "12")
    admitted = tool_server.engine.stats.admitted
    CalcAgent().run()
    # Two model calls: the tool call, then the answer after the tool result.
    assert tool_server.engine.stats.admitted - admitted == 2
    events = client.get_events(rollout.rollout_id)
    assert [e.event_type for e in events] == ["reward"]
    assert events[0].data["value"] == 1.0 and events[0].data["reason"] == "The answer is 12."
    client.close()


def test_the_step_reward_variant_credits_the_call_with_the_right_tool_call(
    tool_server: InferenceServer, gateway: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = GatewayClient(gateway.url, key=gateway.key)
    (rollout,) = client.create_rollouts([{"input": {"question": QUESTION, "answer": 12}, "rollout_id": "r2"}])
    monkeypatch.setenv("AGL_OPENAI_BASE_URL", tool_server.base_url)
    monkeypatch.setenv("AGL_EVENT_URL", f"{gateway.url}/api/rollouts/r2/attempt/a1/events")
    monkeypatch.setenv("AGL_KEY", gateway.key)
    monkeypatch.setenv("QUESTION", QUESTION)
    monkeypatch.setenv("ANSWER", "12")
    monkeypatch.setenv("STEP_REWARD", "1")
    CalcAgent().run()
    events = client.get_events(rollout.rollout_id)
    assert [e.event_type for e in events] == ["reward", "reward"]
    # the first call's tool call computed 12: partial credit for call 0, then the outcome
    assert events[0].data["call_index"] == 0 and events[0].data["value"] == 0.5
    assert events[1].data["value"] == 1.0 and "call_index" not in events[1].data
    client.close()
