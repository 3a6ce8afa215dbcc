"""Supervised fine-tuning data: training rows from the Gateway's records or from a file of chats.

Both sources give the `TrainingRow`s every backend trains on, with `response_mask` 1 on the
model's own tokens only, so that an SFT loss (`−Σ mask · log π(token)`) learns the model's turns
and never the prompt, tool output or user turns:

* `store_rows`: rollouts the Gateway recorded, selected (terminal state, reward threshold,
  best-of-n per prompt, a rollout-id prefix — a run's tag: the trainer names its rollouts
  `{run_id}-…`, agl-eval `ev-{key}-…` — and a time range on the first recorded event), their rows
  built by the RL path's own aggregation (`aggregation.aggregate_calls`): the exact token ids
  the model saw and produced, context between calls masked, a call that does not extend the row
  opening a new one.
* `chat_rows`: a JSONL file of OpenAI chats (`{"messages": [...], "tools": [...]}` a line),
  rendered with the model's chat template turn by turn: the prompt before each assistant turn
  as the template renders it with the generation prompt (what a server would have given the
  model), then the assistant turn (trainable, up to and including the tokenizer's end-of-turn
  token), and so on.

Bad input fails with `SFTDataError` naming the line, key or count that was wrong, before
anything trains.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentlightning.aggregation import (
    AggregationLevel,
    AggregationStats,
    RowLimits,
    aggregate_calls,
    usable_calls,
)
from agentlightning.client import GatewayClient
from agentlightning.rewards import last_reward
from agentlightning.rows import CONTEXT_VERSION, TrainingRow
from agentlightning.schemas import RolloutState

FETCH_CHUNK = 200  # rollouts per batch events request
CHAT_ROLES = ("system", "user", "assistant", "tool", "developer")


class SFTDataError(ValueError):
    """Bad SFT input: the message names what was wrong and what to do."""


# --- from the Gateway's records ------------------------------------------------------------


@dataclass
class Selection:
    """`data.select.*`: which recorded rollouts to learn from."""

    min_reward: float | None = 1.0  # keep rollouts whose reward is >= this; None: any reward
    best_of_n: int | None = None  # keep at most this many per prompt (data_id), highest reward first
    id_prefix: str = ""  # only rollouts whose id starts with this (a run's tag)
    recorded_after: float | None = None  # unix time: the rollout's first event at or after this
    recorded_before: float | None = None  # ... and before this
    include_failed: bool = False  # rollouts that ended failed too (their reward as recorded)

    def validate(self, key: str = "data.select") -> None:
        if self.min_reward is not None and not math.isfinite(self.min_reward):
            raise SFTDataError(f"{key}.min_reward must be a finite number or null, got {self.min_reward}")
        if self.best_of_n is not None and self.best_of_n < 1:
            raise SFTDataError(f"{key}.best_of_n must be >= 1 or null, got {self.best_of_n}")
        if (
            self.recorded_after is not None
            and self.recorded_before is not None
            and self.recorded_after >= self.recorded_before
        ):
            raise SFTDataError(
                f"{key}.recorded_after ({self.recorded_after}) must be before recorded_before "
                f"({self.recorded_before})"
            )


@dataclass
class SelectionCounts:
    """What the selection saw and kept, for the run's log and for the empty-selection error."""

    terminal: int = 0
    after_state_and_prefix: int = 0
    no_reward: int = 0
    in_time_range: int = 0
    above_threshold: int = 0
    kept: int = 0  # after best-of-n
    groups: int = 0
    stats: AggregationStats = field(default_factory=AggregationStats)

    def describe(self) -> str:
        return (
            f"{self.terminal} terminal rollouts on the Gateway, {self.after_state_and_prefix} in the state "
            f"and with the id prefix asked, {self.in_time_range} in the time range, "
            f"{self.above_threshold} at or above the reward threshold ({self.no_reward} with no reward), "
            f"{self.kept} kept after best-of-n over {self.groups} prompts"
        )


@dataclass
class _Candidate:
    rollout_id: str
    group_id: str
    reward: float
    events: list[dict[str, Any]]


def _first_time(events: Sequence[dict[str, Any]]) -> float | None:
    times = [e["timestamp"] for e in events if isinstance(e.get("timestamp"), int | float)]
    return min(times) if times else None


def select_rollouts(client: GatewayClient, selection: Selection, counts: SelectionCounts) -> list[_Candidate]:
    """The recorded rollouts `selection` keeps, with their triplet events, in a stable order."""
    selection.validate()
    states = {RolloutState.SUCCEEDED.value} | (
        {RolloutState.FAILED.value} if selection.include_failed else set()
    )
    items: list[tuple[str, str]] = []  # (rollout_id, data_id)
    after = 0
    while True:
        page = client.terminal(after=after, limit=1000)
        if not page.items:
            break
        counts.terminal += len(page.items)
        for item in page.items:
            if RolloutState(item.state).value in states and item.rollout_id.startswith(selection.id_prefix):
                items.append((item.rollout_id, item.data_id or item.rollout_id))
        after = page.next_after
    counts.after_state_and_prefix = len(items)
    candidates: list[_Candidate] = []
    for start in range(0, len(items), FETCH_CHUNK):
        chunk = items[start : start + FETCH_CHUNK]
        answers = client.get_events_batch([rid for rid, _ in chunk], format="triplet")
        for (rid, group), answer in zip(chunk, answers, strict=True):
            if not answer.get("found"):
                continue
            events = answer["events"]
            first = _first_time(events)
            if selection.recorded_after is not None and (first is None or first < selection.recorded_after):
                continue
            if selection.recorded_before is not None and (
                first is None or first >= selection.recorded_before
            ):
                continue
            counts.in_time_range += 1
            reward = last_reward(events)
            if reward is None:
                counts.no_reward += 1
                if selection.min_reward is not None:
                    continue
                reward = 0.0
            if selection.min_reward is not None and reward < selection.min_reward:
                continue
            counts.above_threshold += 1
            candidates.append(_Candidate(rid, group, reward, events))
    by_group: dict[str, list[_Candidate]] = defaultdict(list)
    for c in candidates:
        by_group[c.group_id].append(c)
    kept: list[_Candidate] = []
    for group in sorted(by_group):
        ranked = sorted(by_group[group], key=lambda c: (-c.reward, c.rollout_id))
        kept += ranked[: selection.best_of_n] if selection.best_of_n is not None else ranked
    counts.groups = len(by_group)
    counts.kept = len(kept)
    return kept


def store_rows(
    client: GatewayClient,
    selection: Selection,
    level: AggregationLevel = AggregationLevel.TRAJECTORY,
    limits: RowLimits | None = None,
    counts: SelectionCounts | None = None,
) -> list[TrainingRow]:
    """The training rows of the recorded rollouts `selection` keeps; SFTDataError when none is
    left, saying at which filter they were lost."""
    counts = counts if counts is not None else SelectionCounts()
    rows: list[TrainingRow] = []
    for c in select_rollouts(client, selection, counts):
        calls = usable_calls(c.events, counts.stats)
        rows += aggregate_calls(
            calls, c.rollout_id, c.group_id, c.reward, level, limits or RowLimits(), counts.stats
        )
    if not rows:
        raise SFTDataError(
            f"the selection holds nothing to train on: {counts.describe()}, {counts.stats.n_rows} rows with "
            "model tokens. Loosen data.select (min_reward, id_prefix, recorded_after/before) or check "
            "data.gateway.url"
        )
    return rows


# --- from a file of chats -------------------------------------------------------------------


def _check_chat(line: Any, where: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """The messages and tools of one JSONL line, or SFTDataError saying why it is not a chat."""
    if not isinstance(line, dict) or not isinstance(line.get("messages"), list) or not line["messages"]:
        raise SFTDataError(
            f"{where}: not a chat: expected an object with a non-empty `messages` list (OpenAI chat "
            f'format: {{"messages": [{{"role": "user", "content": ...}}, ...], "tools": [...]}})'
        )
    messages = line["messages"]
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in CHAT_ROLES:
            raise SFTDataError(
                f"{where}: messages[{i}] is not a chat message: it needs a `role` among {', '.join(CHAT_ROLES)}"
            )
        content = m.get("content")
        if content is not None and not isinstance(content, str | list):
            raise SFTDataError(f"{where}: messages[{i}].content must be a string, a list of parts or null")
        if m["role"] == "assistant" and not content and not m.get("tool_calls"):
            raise SFTDataError(
                f"{where}: messages[{i}] is an assistant turn with neither content nor tool_calls"
            )
    if not any(m["role"] == "assistant" for m in messages):
        raise SFTDataError(f"{where}: the chat has no assistant turn: nothing to learn from")
    if messages[0]["role"] == "assistant":
        raise SFTDataError(f"{where}: the chat opens with an assistant turn: it needs a prompt before it")
    tools = line.get("tools")
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
        raise SFTDataError(f"{where}: `tools` must be a list of tool objects (OpenAI format)")
    return messages, tools


def _render(tokenizer: Any, messages: list[dict[str, Any]], tools: Any, generation_prompt: bool) -> str:
    text = tokenizer.apply_chat_template(
        messages, tools=tools, add_generation_prompt=generation_prompt, tokenize=False
    )
    return str(text)


def render_chat(
    tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, where: str = "chat"
) -> tuple[list[int], list[int]]:
    """(token ids, mask) of a whole chat: 1 on each assistant turn's tokens up to and including
    its end-of-turn token (`tokenizer.eos_token` where the turn has it), 0 elsewhere."""
    pieces: list[tuple[str, int]] = []
    done = ""  # the text rendered so far
    eos = getattr(tokenizer, "eos_token", None)
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        prompt = _render(tokenizer, messages[:i], tools, True) if i else ""
        whole = _render(tokenizer, messages[: i + 1], tools, False)
        if not (prompt.startswith(done) and whole.startswith(prompt)):
            raise SFTDataError(
                f"{where}: the model's chat template does not render messages[{i}] after the turns before it "
                "(a template that rewrites earlier turns cannot give token-exact rows)"
            )
        turn = whole[len(prompt) :]
        end = turn.rfind(eos) + len(eos) if eos and eos in turn else len(turn)
        pieces += [(prompt[len(done) :], 0), (turn[:end], 1)]
        done = prompt + turn[:end]
    full = _render(tokenizer, messages, tools, False)
    if full.startswith(done):
        pieces.append((full[len(done) :], 0))
    ids: list[int] = []
    mask: list[int] = []
    for text, trainable in pieces:
        if text:
            piece = tokenizer.encode(text, add_special_tokens=False)
            ids += piece
            mask += [trainable] * len(piece)
    return ids, mask


def chat_rows(path: str | Path, tokenizer: Any, max_length: int | None = None) -> list[TrainingRow]:
    """The rows of a JSONL file of chats; every line is checked before any is rendered. A row's
    prompt is its tokens before the first assistant turn (the rest is the response, masked)."""
    p = Path(path)
    if not p.is_file():
        raise SFTDataError(f"data.chats_file: {path} is not a file")
    chats: list[tuple[str, list[dict[str, Any]], list[dict[str, Any]] | None]] = []
    for n, text in enumerate(p.read_text().splitlines(), 1):
        if not text.strip():
            continue
        where = f"{path} line {n}"
        try:
            line = json.loads(text)
        except json.JSONDecodeError as exc:
            raise SFTDataError(f"{where}: not valid JSON: {exc}") from None
        chats.append((where, *_check_chat(line, where)))
    if not chats:
        raise SFTDataError(f"data.chats_file: {path} holds no chats")
    if getattr(tokenizer, "chat_template", None) is None:
        raise SFTDataError("the model's tokenizer has no chat template: chats cannot be rendered for it")
    rows: list[TrainingRow] = []
    for i, (where, messages, tools) in enumerate(chats):
        ids, mask = render_chat(tokenizer, messages, tools, where)
        if max_length is not None and len(ids) > max_length:
            raise SFTDataError(
                f"{where}: the chat renders to {len(ids)} tokens, over data.max_length={max_length}: "
                "raise it or shorten the chat"
            )
        first = mask.index(1)
        response = ids[first:]
        rows.append(
            TrainingRow(
                rollout_id=f"chat-{i}",
                group_id=f"chat-{i}",
                prompt_ids=ids[:first],
                response_ids=response,
                response_mask=mask[first:],
                rollout_log_probs=None,
                model_versions=[CONTEXT_VERSION] * len(response),
                reward=1.0,
            )
        )
    return rows
