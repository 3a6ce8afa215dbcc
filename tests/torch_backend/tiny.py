"""Tiny models for the torch backend's tests, built (and, for tool calls, trained) in the test."""

from __future__ import annotations

import json
import warnings
from typing import Any

import torch

from agentlightning.demo.task import TOOLS
from agentlightning.tiny_model import TinyModelConfig, build_model

warnings.filterwarnings("ignore", category=FutureWarning)
TINY = TinyModelConfig(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    max_position_embeddings=512,
)

QUESTION = "Ann has 7 apples and gets 5 more. How many apples now?"
TOOL_CALL_TEXT = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "7+5"}}\n</tool_call>'


def fresh_copy(model: Any, tokenizer: Any, seed: int = 1) -> Any:
    copy = build_model(TINY, seed=seed, tokenizer=tokenizer)
    copy.load_state_dict(model.state_dict())
    return copy


def train_tool_model(tokenizer: Any) -> Any:
    """A tiny model trained (here, in a second or two) to answer QUESTION with a tool call.

    Overfitting one conversation is enough to make the server produce a real Hermes tool call,
    and then a final answer after the tool result, at temperature 0.
    """
    torch.manual_seed(0)
    model = build_model(TINY, seed=2, tokenizer=tokenizer)
    messages: list[dict[str, Any]] = [{"role": "user", "content": QUESTION}]
    p1 = tokenizer.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True, tokenize=False)
    messages += [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c",
                    "type": "function",
                    "function": {"name": "calculator", "arguments": json.dumps({"expression": "7+5"})},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c", "content": "12"},
    ]
    p2 = tokenizer.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True, tokenize=False)
    full = p2 + "The answer is 12.<|im_end|>"
    ids = torch.tensor([tokenizer.encode(full, add_special_tokens=False)])
    start = len(tokenizer.encode(p1, add_special_tokens=False))
    labels = ids.clone()
    labels[:, :start] = -100
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(300):
        loss = model(input_ids=ids, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        if loss.item() < 1e-3:
            break
    return model.eval()
