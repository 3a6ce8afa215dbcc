"""Supervised warm-up of the demo policy on generated, deliberately imperfect demonstrations.

A randomly initialised model cannot even produce a tool call, so RL would have nothing to
improve. So the warm-up imitates a *naive* agent: it always follows the protocol (calls the
calculator with the question's number and the amount its wording names, two or three, then
reports the tool's answer) but adds too often: on subtract and multiply problems it uses the
right operation only 35% of the time and adds otherwise. After the warm-up the policy answers
greedily right only on addition problems (about a third of them) and right about 55% of the
time when sampling; which operation each wording means is left for RL to learn from the reward.
The demo says so in its output.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from agentlightning.demo.task import TOOL_NAME, TOOLS, calculator, make_problem
from agentlightning.tiny_model import bpe_json, byte_tokenizer

# The recipe of the tiny model's shipped tokenizer (`tokenizer_json`).
TOKENIZER_VOCAB_SIZE = 512
TOKENIZER_CORPUS_SIZE = 2000
TOKENIZER_CORPUS_SEED = 1234


@dataclass
class WarmupConfig:
    steps: int = 800
    batch_size: int = 16
    lr: float = 1e-2
    weight_decay: float = 0.0
    seed: int = 0
    # The demonstrator is a naive agent that adds: right on "more" problems, and on the others
    # it uses the right operation (- or *) with this probability, else +.
    correct_op_prob: float = 0.35
    # The two-role demo (demo/roles.py): the demonstrator's answer turn reports the question's
    # number instead of the tool's result this often, so that the writer has something to learn.
    wrong_answer_prob: float = 0.0


def demonstration(
    rng: random.Random, correct_op_prob: float = 0.35, wrong_answer_prob: float = 0.0
) -> tuple[str, str, str, str]:
    """One problem's conversation: (question, tool-call turn, tool result, answer turn)."""
    problem = make_problem(rng)
    right = problem.op[0]
    operator = right if right == "+" or rng.random() < correct_op_prob else "+"
    expression = f"{problem.x}{operator}{problem.op[1:]}"
    result = calculator(expression)
    call = json.dumps({"name": TOOL_NAME, "arguments": {"expression": expression}})
    turn1 = f"<tool_call>\n{call}\n</tool_call><|im_end|>"
    said = result
    if wrong_answer_prob and rng.random() < wrong_answer_prob:  # no draw at 0: the default unchanged
        said = str(problem.x)
    turn2 = f"The answer is {said}.<|im_end|>"
    return problem.question, turn1, result, turn2


def render(
    tokenizer: Any, question: str, turn1: str, tool_result: str, turn2: str
) -> tuple[list[int], list[int]]:
    """Token ids of the whole conversation and its loss mask (1 on the model's own turns)."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": question}]
    prompt1 = tokenizer.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True, tokenize=False)
    call = json.loads(turn1.split("\n")[1])
    messages += [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_0",
                    "type": "function",
                    "function": {"name": call["name"], "arguments": json.dumps(call["arguments"])},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_0", "content": tool_result},
    ]
    prompt2 = tokenizer.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True, tokenize=False)
    assert prompt2.startswith(prompt1 + turn1), "the chat template does not re-render the tool call exactly"
    middle = prompt2[len(prompt1 + turn1) :]
    ids: list[int] = []
    mask: list[int] = []
    for text, trainable in ((prompt1, 0), (turn1, 1), (middle, 0), (turn2, 1)):
        piece = tokenizer.encode(text, add_special_tokens=False)
        ids += piece
        mask += [trainable] * len(piece)
    return ids, mask


def conversation_text(tokenizer: Any, question: str, turn1: str, tool_result: str, turn2: str) -> str:
    ids, _ = render(tokenizer, question, turn1, tool_result, turn2)
    return tokenizer.decode(ids, skip_special_tokens=False)


def corpus(tokenizer: Any, n: int, seed: int) -> list[str]:
    """Whole, correct conversations as text (to train the demo tokenizer on).

    Independent of the warm-up's settings, so that tuning the demonstrator never changes the
    tokenizer.
    """
    rng = random.Random(seed)
    return [conversation_text(tokenizer, *demonstration(rng, correct_op_prob=1.0)) for _ in range(n)]


def tokenizer_json() -> str:
    """The tiny model's tokenizer trained afresh on these conversations (deterministic): exactly
    `agentlightning.tiny_model.TOKENIZER_FILE`, which a test checks. After a change to the
    conversations, write this to that file."""
    texts = corpus(byte_tokenizer(), TOKENIZER_CORPUS_SIZE, TOKENIZER_CORPUS_SEED)
    return bpe_json(texts, TOKENIZER_VOCAB_SIZE)


def make_examples(
    tokenizer: Any, n: int, seed: int, correct_op_prob: float = 0.35, wrong_answer_prob: float = 0.0
) -> list[tuple[list[int], list[int]]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        question, turn1, result, turn2 = demonstration(rng, correct_op_prob, wrong_answer_prob)
        out.append(render(tokenizer, question, turn1, result, turn2))
    return out


def warmup(model: Any, tokenizer: Any, config: WarmupConfig | None = None) -> dict[str, float]:
    """Train `model` in place with cross-entropy on the demonstrations' model turns."""
    config = config or WarmupConfig()
    examples = make_examples(
        tokenizer,
        config.steps * config.batch_size,
        config.seed,
        config.correct_op_prob,
        config.wrong_answer_prob,
    )
    return sft(model, tokenizer, examples, config.steps, config.batch_size, config.lr, config.weight_decay)


def sft(
    model: Any,
    tokenizer: Any,
    examples: Sequence[tuple[list[int], list[int]]],
    steps: int,
    batch_size: int,
    lr: float,
    weight_decay: float = 0.0,
) -> dict[str, float]:
    """Cross-entropy on the masked tokens of `examples` ((ids, mask) pairs, taken in order,
    `batch_size` a step, cycling), in place: the warm-up's loop, shared with other tiny policies
    (examples/swe/tiny_policy.py)."""
    device = next(model.parameters()).device
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    # Short ramp-up, constant, then a decay over the last fifth (copying is learned mid-way).
    tail = max(1, steps // 5)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / 20) * max(0.05, min(1.0, (steps - s) / tail))
    )
    model.train()
    t0 = time.perf_counter()
    losses: list[float] = []
    for step in range(steps):
        start = (step * batch_size) % max(len(examples), 1)
        batch = list(examples[start : start + batch_size])
        ids, attn, labels = _collate(batch, tokenizer.pad_token_id)
        ids, attn, labels = ids.to(device), attn.to(device), labels.to(device)
        logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1].float()
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=-100
        )
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
    model.eval()
    last = losses[-20:]
    return {"warmup/loss": sum(last) / max(len(last), 1), "warmup/time_s": time.perf_counter() - t0}


def _collate(
    batch: Sequence[tuple[list[int], list[int]]], pad_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    width = max(len(ids) for ids, _ in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(batch), width), dtype=torch.long)
    labels = torch.full((len(batch), width), -100, dtype=torch.long)
    for i, (seq, mask) in enumerate(batch):
        n = len(seq)
        ids[i, :n] = torch.tensor(seq)
        attn[i, :n] = 1
        labels[i, :n] = torch.tensor([t if m else -100 for t, m in zip(seq, mask, strict=True)])
    return ids, attn, labels
