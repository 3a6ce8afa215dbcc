"""A tiny Qwen2 that plays one scripted tool-using conversation, deterministically, in real vLLM.

Random tiny weights cannot produce a valid tool call. This model is made deterministic by
construction: the demo tokenizer (a Hermes chat template, `<tool_call>` marker tokens), a
Qwen2 sized for vLLM's CPU attention (head size 32, untied output head), and weights fitted
here, in seconds, until every assistant token of SCRIPT is chosen with probability > 0.999.
Greedy decoding (the Gateway's validation mode) then replays the script token for token in
any engine that computes the same forward pass — vLLM included — through its chat template
and its Hermes tool-call parser.

The script: a question that needs two calculator calls, the tool answers, a final answer.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from openai.types.chat import ChatCompletionToolParam

from agentlightning.demo.task import TOOLS
from agentlightning.tiny_model import TinyModelConfig, build_model, build_tokenizer, save_tiny

MODEL = TinyModelConfig(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=2,  # head size 32: vLLM's CPU attention rejects 16
    num_key_value_heads=1,
    max_position_embeddings=1024,
    tie_word_embeddings=False,
)
QUESTION = "Ann has 7 apples and gets 5 more, then doubles them. How many apples now?"
# (arguments of each tool call, the tool's answer); then the final answer.
TOOL_TURNS = [({"expression": "7+5"}, "12"), ({"expression": "12*2"}, "24")]
FINAL_ANSWER = "Ann has 24 apples now."
# The demo's TOOLS, as the OpenAI SDK's type.
CHAT_TOOLS: list[ChatCompletionToolParam] = [
    {"type": "function", "function": tool["function"]} for tool in TOOLS
]


def tool_call_message(arguments: dict[str, str], call_id: str) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": call_id,
                "type": "function",
                # vLLM's Hermes parser returns the arguments as json.dumps of the parsed object.
                "function": {"name": "calculator", "arguments": json.dumps(arguments)},
            }
        ],
    }


def script_messages() -> list[dict[str, Any]]:
    """The whole conversation, as the agent's message list would be at the end."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": QUESTION}]
    for i, (arguments, result) in enumerate(TOOL_TURNS):
        messages.append(tool_call_message(arguments, f"call{i}"))
        messages.append({"role": "tool", "tool_call_id": f"call{i}", "content": result})
    messages.append({"role": "assistant", "content": FINAL_ANSWER})
    return messages


def _assistant_spans(tokenizer: Any, messages: list[dict[str, Any]]) -> tuple[list[int], list[int]]:
    """Token ids of the whole conversation and a 0/1 mask of the assistant turns' tokens (with
    their end-of-turn), rendered the way the server renders each call's prompt."""
    ids: list[int] = []
    mask: list[int] = []
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        prompt = tokenizer.apply_chat_template(
            messages[:i], tools=TOOLS, add_generation_prompt=True, tokenize=False
        )
        prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
        with_turn = tokenizer.apply_chat_template(messages[: i + 1], tools=TOOLS, tokenize=False)
        turn_ids = tokenizer.encode(with_turn, add_special_tokens=False)
        assert turn_ids[: len(prompt_ids)] == prompt_ids, "the template does not render turn by turn"
        assert prompt_ids[: len(ids)] == ids, "a later prompt does not extend the earlier one"
        mask += [0] * (len(prompt_ids) - len(ids))
        ids = list(prompt_ids)
        # The turn as generated: up to and including <|im_end|>, not the newline after it.
        end = turn_ids.index(tokenizer.eos_token_id, len(prompt_ids)) + 1
        mask += [1] * (end - len(prompt_ids))
        ids += turn_ids[len(prompt_ids) : end]
    return ids, mask


def build_scripted_model(seed: int = 0, max_steps: int = 1500) -> tuple[Any, Any]:
    """(model, tokenizer): fitted until every scripted assistant token has probability > 0.999."""
    tokenizer = build_tokenizer()
    ids, mask = _assistant_spans(tokenizer, script_messages())
    input_ids = torch.tensor([ids])
    labels = input_ids.clone()
    labels[0, torch.tensor(mask) == 0] = -100
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a 130k-parameter model: more threads only fight (10x slower when busy)
    try:
        model = _fit(tokenizer, input_ids, labels, seed, max_steps)
    finally:
        torch.set_num_threads(threads)
    return model, tokenizer


def _fit(tokenizer: Any, input_ids: torch.Tensor, labels: torch.Tensor, seed: int, max_steps: int) -> Any:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = build_model(MODEL, seed=seed, tokenizer=tokenizer)
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        model.train()
        for _ in range(max_steps):
            logits = model(input_ids=input_ids).logits[0, :-1]
            logp = torch.log_softmax(logits.float(), -1)
            target = labels[0, 1:]
            keep = target != -100
            chosen = logp[keep].gather(-1, target[keep, None])[:, 0]
            if chosen.min().item() > -1e-3:
                break
            loss = -chosen.mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        else:
            raise AssertionError(
                f"the scripted model did not converge: min log-prob {chosen.min().item():.4f}"
            )
    return model.eval()


def save_scripted_model(path: Path, seed: int = 0) -> Path:
    model, tokenizer = build_scripted_model(seed)
    return save_tiny(path, model, tokenizer)
