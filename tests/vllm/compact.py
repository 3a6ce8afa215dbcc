"""The scripted model of scripted.py, made to write its tool calls compactly.

It writes `<tool_call>{"name":"calculator","arguments":{"expression":"7+5"}}</tool_call>`,
while its chat template re-renders an earlier call as `<tool_call>\\n{"name": "calculator",
"arguments": {...}}\\n</tool_call>`: the drift every real model risks. It is fitted on the
prompts it meets either way, so that greedy decoding replays the script both through the
token-exact proxy (earlier turns as the model wrote them) and through pass-through (earlier
turns as the template re-renders them). Same architecture and tokenizer as the scripted model:
its weights are loaded into the shared vLLM server in place of the scripted ones.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from agentlightning.demo.task import TOOL_NAME, TOOLS
from agentlightning.tiny_model import build_model, build_tokenizer
from agentlightning.torch_backend.vllm_server import save_weights

from .scripted import FINAL_ANSWER, MODEL, TOOL_TURNS, script_messages


def compact_call(arguments: dict[str, str]) -> str:
    return (
        "<tool_call>"
        + json.dumps({"name": TOOL_NAME, "arguments": arguments}, separators=(",", ":"))
        + "</tool_call>"
    )


def _render(tokenizer: Any, messages: list[dict[str, Any]]) -> list[int]:
    text = tokenizer.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True, tokenize=False)
    return tokenizer.encode(text, add_special_tokens=False)


def training_sequences(tokenizer: Any) -> list[tuple[list[int], list[int]]]:
    """(ids, mask of the model's own tokens): the token-exact rollout as one sequence, and each
    call's re-rendered prompt with its answer."""
    messages = script_messages()
    calls = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    eos = tokenizer.eos_token_id
    answers = [compact_call(arguments) for arguments, _ in TOOL_TURNS] + [FINAL_ANSWER]
    answer_ids = [[*tokenizer.encode(text, add_special_tokens=False), eos] for text in answers]
    prompts = [_render(tokenizer, messages[:i]) for i in calls]
    exact_ids, exact_mask = list(prompts[0]), [0] * len(prompts[0])
    sequences = []
    for k, prompt in enumerate(prompts):
        if k:  # what the template adds after the earlier answer's end of turn
            end = prompt.index(eos, len(prompts[k - 1]))
            tail = prompt[end + 1 :]
            exact_ids += tail
            exact_mask += [0] * len(tail)
        exact_ids += answer_ids[k]
        exact_mask += [1] * len(answer_ids[k])
        sequences.append((prompt + answer_ids[k], [0] * len(prompt) + [1] * len(answer_ids[k])))
    return [(exact_ids, exact_mask), *sequences]


def save_compact_weights(path: Path, seed: int = 0, max_steps: int = 3000) -> Path:
    """Fit the compact model (seconds) and save its weights where `reload_weights` reads them."""
    tokenizer = build_tokenizer()
    sequences = training_sequences(tokenizer)
    width = max(len(ids) for ids, _ in sequences)
    input_ids = torch.tensor([ids + [0] * (width - len(ids)) for ids, _ in sequences])
    labels = input_ids.clone()
    labels[torch.tensor([mask + [0] * (width - len(mask)) for _, mask in sequences]) == 0] = -100
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = build_model(MODEL, seed=seed, tokenizer=tokenizer)
            opt = torch.optim.Adam(model.parameters(), lr=1e-2)
            model.train()
            for _ in range(max_steps):
                logp = torch.log_softmax(model(input_ids=input_ids).logits[:, :-1].float(), -1)
                target = labels[:, 1:]
                keep = target != -100
                chosen = logp[keep].gather(-1, target[keep][:, None])[:, 0]
                if chosen.min().item() > -1e-3:
                    break
                loss = -chosen.mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
            else:
                raise AssertionError(f"the compact model did not converge: {chosen.min().item():.4f}")
    finally:
        torch.set_num_threads(threads)
    return save_weights(model.eval(), path)
