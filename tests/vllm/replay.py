"""A tiny Qwen2 that replays recorded model calls in real vLLM: any harness's conversation.

`tests/vllm/scripted.py` fits one conversation the test writes out. A harness's conversation
(its system prompt, tools, the tool results of its sandbox) is known only by running it, and its
prompts run to thousands of tokens (a coding CLI's: 30k). So: run the harness once against the
scripted model (`tests/fakes/scripted_model.py`) with a `Recorder`, which keeps each call's
prompt ids (as the Gateway sent them) and answer ids in the scripted model's tokenizer; then fit a tiny
Qwen2 with that tokenizer and chat template until greedy decoding chooses every recorded answer
token with probability > 0.999, and serve it with vLLM. The harness run again against vLLM then
plays the same conversation, and every check (render, re-generation, streams, tool parsing) is
vLLM's own.

The model has one layer, and its attention a sliding window: what it computes at a position
depends on the last `window` tokens and nothing before. The window is the shortest that tells
every two recorded calls with different answers apart (a harness's task can sit thousands of
tokens before the end of its first prompt), so a replay in which something further back differs
(a date in a system prompt) still plays. With one layer, the logits at the answer's positions are
computed exactly from their windows alone (`_answer_logits`): fitting costs the answer's length
times the window, where a full forward of a 30k-token prompt would cost its square.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from transformers.models.qwen2.modeling_qwen2 import rotate_half

from agentlightning.tiny_model import TinyModelConfig, build_model, save_tiny
from tests.fakes.scripted_model import build_tokenizer, decode

MODEL = TinyModelConfig(
    hidden_size=256,  # its MLP does the remembering; it runs on the answers' tokens only
    intermediate_size=1024,
    num_hidden_layers=1,
    num_attention_heads=4,  # head size 64
    num_key_value_heads=1,
    max_position_embeddings=32768,  # a coding CLI's prompt and the answer it asks room for
    tie_word_embeddings=False,
)
MARGIN = math.log(0.95)  # fitted: every recorded answer token at least this log-probability
WINDOW_STEP = 256  # windows are multiples of this
MAX_WINDOW = 16384


@dataclass(frozen=True)
class Call:
    """One model call: the prompt's ids as the server renders them and the answer's (with its end of turn)."""

    prompt: tuple[int, ...]
    answer: tuple[int, ...]
    source: str = ""  # who made it, for errors: a harness's name and the call's number


class Recorder:
    """A scripted model's `record`: keeps every call it answers, as its token ids."""

    def __init__(self, name: str = "") -> None:
        self.name = name
        self.calls: list[Call] = []

    def __call__(self, prompt: list[int], answer: list[int]) -> None:
        self.calls.append(Call(tuple(prompt), tuple(answer), f"{self.name} call {len(self.calls) + 1}"))


class ReplayConflict(ValueError):
    """Two recorded calls no window tells apart want different answers."""


def _common_suffix(a: Sequence[int], b: Sequence[int]) -> int:
    n, m = 0, min(len(a), len(b))
    while n < m and a[-1 - n] == b[-1 - n]:
        n += 1
    return n


def window_for(calls: Sequence[Call]) -> int:
    """The shortest window (a multiple of WINDOW_STEP) whose last tokens of a prompt tell apart
    every two calls that want different answers. Raises `ReplayConflict` when none does."""
    need = 1
    for i, a in enumerate(calls):
        for b in calls[i + 1 :]:
            if a.answer == b.answer:
                continue
            same = _common_suffix(a.prompt, b.prompt)
            if same == min(len(a.prompt), len(b.prompt)) or same >= MAX_WINDOW:
                raise ReplayConflict(
                    f"{a.source} and {b.source} end their prompts with the same {same} tokens "
                    f"(…{decode(list(a.prompt[-same:]))[-300:]!r}) and want different answers "
                    f"({decode(list(a.answer))[:200]!r}, {decode(list(b.answer))[:200]!r}): no window up "
                    f"to {MAX_WINDOW} tokens tells them apart"
                )
            need = max(need, same + 1)
    return -(-need // WINDOW_STEP) * WINDOW_STEP


@dataclass(frozen=True)
class _Item:
    start: int  # the first position of `ids` in the whole sequence
    ids: tuple[int, ...]  # the window before the answer, then the answer
    answer: int  # the answer's length


def _items(calls: Sequence[Call], window: int) -> list[_Item]:
    """What fitting sees, once per distinct call: the answer and the window its first token sees."""
    out: dict[tuple[tuple[int, ...], tuple[int, ...]], _Item] = {}
    for call in calls:
        start = max(0, len(call.prompt) - window)
        key = (call.prompt[start:], call.answer)
        out.setdefault(key, _Item(start, (*key[0], *call.answer), len(call.answer)))
    return list(out.values())


def _answer_logits(
    model: Any, ids: torch.Tensor, queries: torch.Tensor, constants: tuple[torch.Tensor, ...]
) -> torch.Tensor:
    """The logits of the one-layer Qwen2 `model` at the positions `queries` (indices into each
    row of `ids`, [rows, n]), computed from the keys alone: what its full forward gives there
    (a test checks it). `constants`: `_constants(model, positions, queries)`, with `positions`
    each token's position in its sequence ([rows, length]; negative: padding).

    Before the rotary embedding a key and a value depend on their token alone (one layer): they
    are computed once per vocabulary entry and looked up."""
    core, config = model.model, model.config
    (layer,) = core.layers
    attn = layer.self_attn
    rows, length = ids.shape
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    dim = config.hidden_size // heads
    table = core.embed_tokens.weight
    normed = layer.input_layernorm(table)
    keys = attn.k_proj(normed)[ids].view(rows, length, kv_heads, dim).transpose(1, 2)
    values = attn.v_proj(normed)[ids].view(rows, length, kv_heads, dim).transpose(1, 2)
    cos, sin, bias = constants
    keys = keys * cos[:, None] + rotate_half(keys) * sin[:, None]
    asked = ids.gather(1, queries)  # the tokens at the queries
    n = queries.shape[1]
    q = attn.q_proj(normed[asked]).view(rows, n, heads, dim).transpose(1, 2)

    def at_queries(t: torch.Tensor) -> torch.Tensor:
        return t.gather(1, queries[..., None].expand(-1, -1, t.shape[-1]))

    q = q * at_queries(cos)[:, None] + rotate_half(q) * at_queries(sin)[:, None]
    # Grouped-query attention: each key/value head serves `groups` query heads, side by side.
    groups = heads // kv_heads
    q = q.reshape(rows, kv_heads, groups * n, dim)
    mixed = torch.nn.functional.scaled_dot_product_attention(q, keys, values, attn_mask=bias)
    mixed = mixed.view(rows, heads, n, dim).transpose(1, 2).reshape(rows, n, heads * dim)
    out = table[asked] + attn.o_proj(mixed)
    out = out + layer.mlp(layer.post_attention_layernorm(out))
    return model.lm_head(core.norm(out))


def _constants(model: Any, positions: torch.Tensor, queries: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """What `_answer_logits` needs that fitting does not change: the rotary embedding's (cos, sin)
    at `positions`, and the attention's additive mask ([rows, 1, groups × queries, length]: the
    causal window, padding out)."""
    with torch.no_grad():
        cos, sin = model.model.rotary_emb(model.model.embed_tokens.weight[:1], positions.clamp(min=0))
    query_pos = positions.gather(1, queries)[:, :, None]
    key_pos = positions[:, None, :]
    window = model.config.sliding_window or positions.shape[1]
    seen = (key_pos >= 0) & (key_pos <= query_pos) & (key_pos > query_pos - window)
    bias = torch.zeros(seen.shape).masked_fill(~seen, float("-inf"))[:, None]
    groups = model.config.num_attention_heads // model.config.num_key_value_heads
    bias = bias.repeat(1, 1, groups, 1)  # the query heads of a key/value head side by side
    return cos, sin, bias


def _batches(items: list[_Item], budget: int = 4_000_000) -> list[list[_Item]]:
    """Items of like length together, each batch's padded keys × queries within `budget`."""
    items = sorted(items, key=lambda i: len(i.ids))
    batches: list[list[_Item]] = []
    for item in items:
        if batches:
            batch = [*batches[-1], item]
            if len(batch) * len(item.ids) * max(i.answer for i in batch) <= budget:
                batches[-1] = batch
                continue
        batches.append([item])
    return batches


def _tensors(batch: list[_Item], pad: int) -> tuple[torch.Tensor, ...]:
    """(ids, positions, queries, targets, target mask) of a batch, right-padded."""
    length, n = max(len(i.ids) for i in batch), max(i.answer for i in batch)
    ids = torch.full((len(batch), length), pad)
    positions = torch.full((len(batch), length), -1)
    queries = torch.zeros((len(batch), n), dtype=torch.long)
    targets = torch.full((len(batch), n), pad)
    mask = torch.zeros((len(batch), n), dtype=torch.bool)
    for row, item in enumerate(batch):
        size, first = len(item.ids), len(item.ids) - item.answer  # the answer's first index
        ids[row, :size] = torch.tensor(item.ids)
        positions[row, :size] = torch.arange(item.start, item.start + size)
        # The logits at index i choose token i + 1: from the prompt's last token to the answer's last but one.
        queries[row, : item.answer] = torch.arange(first - 1, size - 1)
        targets[row, : item.answer] = torch.tensor(item.ids[first:])
        mask[row, : item.answer] = True
    return ids, positions, queries, targets, mask


def fit(calls: Iterable[Call], seed: int = 0, max_steps: int = 2000, say: Any = None) -> Any:
    """A one-layer Qwen2 whose greedy answer to each recorded prompt is the recorded answer, by
    a margin (every answer token with probability > 0.95: the runner-up's logit at least 2.9
    lower), its window from `window_for`."""
    calls = list(calls)
    tokenizer = build_tokenizer()
    window = window_for(calls)
    items = _items(calls, window)
    padded = [_tensors(b, tokenizer.pad_token_id) for b in _batches(items)]
    if say is not None:
        say(f"replay model: {len(items)} distinct calls, window {window} tokens, {len(padded)} batches")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = build_model(replace(MODEL, sliding_window=window), seed=seed, tokenizer=tokenizer)
        batches = [(ids, q, t, m, _constants(model, pos, q)) for ids, pos, q, t, m in padded]
        opt = torch.optim.Adam(model.parameters(), lr=3e-3)
        model.train()
        for step in range(max_steps):
            opt.zero_grad()
            worst = 0.0
            for ids, queries, targets, mask, constants in batches:
                logits = _answer_logits(model, ids, queries, constants)
                logp = torch.log_softmax(logits.float(), -1)
                chosen = logp.gather(-1, targets[..., None])[..., 0][mask]
                worst = min(worst, chosen.min().item())
                (-chosen.sum() / len(items)).backward()
            if worst > MARGIN:
                break
            if say is not None and step % 100 == 0:
                say(f"replay model: step {step}, worst answer token log-prob {worst:.3f}")
            opt.step()
        else:
            raise AssertionError(f"the replay model did not converge: worst log-prob {worst:.4f}")
    if say is not None:
        say(f"replay model: fitted in {step} steps, worst answer token log-prob {worst:.3f}")
    return model.eval()


def save_replay_model(path: Path, calls: Iterable[Call], say: Any = None) -> Path:
    return save_tiny(path, fit(calls, say=say), build_tokenizer())
