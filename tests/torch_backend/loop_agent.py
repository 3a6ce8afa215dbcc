"""A two-call chat agent for the training-loop tests: it asks, sends a 'tool' result back, asks
again, and reports a reward that varies with what the (random, untrained) model wrote — so that
GRPO groups have different rewards and every step really updates the policy."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import httpx
import openai
from openai.types.chat import ChatCompletionMessageParam

if TYPE_CHECKING:
    from anthropic.types import MessageParam


def _client() -> openai.OpenAI:
    return openai.OpenAI(
        base_url=os.environ["AGL_OPENAI_BASE_URL"], api_key=os.environ["AGL_KEY"], max_retries=10
    )


def _reward(data: dict[str, object]) -> None:
    httpx.post(
        os.environ["AGL_EVENT_URL"],
        json={"event_type": "reward", "data": data},
        headers={"Authorization": f"Bearer {os.environ['AGL_KEY']}"},
        timeout=30,
    ).raise_for_status()


class TwoCallAgent:
    def run(self) -> None:
        client = _client()
        messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": os.environ["QUESTION"]}]
        first = client.chat.completions.create(model="policy", messages=messages, max_tokens=6)
        content = first.choices[0].message.content or ""
        messages += [{"role": "assistant", "content": content}, {"role": "user", "content": "result: 4"}]
        client.chat.completions.create(model="policy", messages=messages, max_tokens=6)
        _reward({"value": float(len(content) % 2)})


class TwoRoleAgent:
    """Two policies (docs/policies.md): `planner` asks first, `coder` answers after it; each role
    gets its own reward, varying with what its own policy wrote, and one shared reward."""

    def run(self) -> None:
        client = _client()
        messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": os.environ["QUESTION"]}]
        first = client.chat.completions.create(model="planner", messages=messages, max_tokens=6)
        plan = first.choices[0].message.content or ""
        messages += [{"role": "assistant", "content": plan}, {"role": "user", "content": "now answer"}]
        second = client.chat.completions.create(model="coder", messages=messages, max_tokens=6)
        answer = second.choices[0].message.content or ""
        _reward({"value": 0.5})
        _reward({"value": float(len(plan) % 2), "policy": "planner"})
        _reward({"value": float(len(answer) % 3 == 0), "policy": "coder"})


class NoRewardAgent:
    """Calls the model and ends well, but never reports a reward (a forgotten post, a wrong key)."""

    def run(self) -> None:
        messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": os.environ["QUESTION"]}]
        _client().chat.completions.create(model="policy", messages=messages, max_tokens=4)


class MessagesAgent:
    """TwoCallAgent on the Anthropic Messages API (the official SDK): its calls are recorded on the
    token path as chat calls are, so every algorithm, distillation included, trains on them."""

    def run(self) -> None:
        import anthropic

        client = anthropic.Anthropic(
            base_url=os.environ["AGL_ANTHROPIC_BASE_URL"], api_key=os.environ["AGL_KEY"], max_retries=10
        )
        messages: list[MessageParam] = [{"role": "user", "content": os.environ["QUESTION"]}]
        first = client.messages.create(model="policy", messages=messages, max_tokens=6)
        content = "".join(b.text for b in first.content if b.type == "text")
        messages += [{"role": "assistant", "content": content}, {"role": "user", "content": "result: 4"}]
        client.messages.create(model="policy", messages=messages, max_tokens=6)
        _reward({"value": float(len(content) % 2)})
