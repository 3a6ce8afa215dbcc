"""Scripted multi-turn rollouts for the trainer tests, with the rows they must become.

A script is a list of steps. A `Turn` is one model call: `context` tokens appended to the
conversation so far (tool output, user turns), then the model's `response`. A turn with
`break_kind` set does not extend the conversation: its prompt differs from it (one token
edited, or cut short and continued differently), so it must open a new row. `Bad` steps are
calls that must be skipped (errors, missing tokens) and never break a merge.

The expected rows come from the script itself, not from the code under test.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st

VOCAB = 40  # small, so that accidental prefix matches are likely


@dataclass
class Turn:
    context: list[int]
    response: list[int]
    log_probs: list[float] | None
    version: int
    break_kind: str | None = None  # None, "edit" or "cut"
    break_at: int = 0  # where the break happens (modulo the conversation length)


@dataclass
class Bad:
    kind: str  # "error", "http", "no_response", "no_prompt"


@dataclass
class ExpectedRow:
    prompt: list[int]
    response: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    log_probs: list[float] | None = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    calls: list[tuple[list[int], list[int]]] = field(default_factory=list)  # (prompt, response) per call


def call_event(
    prompt: list[int],
    response: list[int],
    log_probs: list[float] | None,
    version: int | None,
    **extra: Any,
) -> dict[str, Any]:
    """A model_request event in the triplet format."""
    data: dict[str, Any] = {
        "prompt_token_ids": prompt,
        "response_token_ids": response,
        "response_log_probs": log_probs,
        "server": {"model": "policy", "version": version} if version is not None else None,
    }
    data.update(extra)
    return {
        "event_type": "model_request",
        "rollout_id": "r",
        "attempt_id": "a",
        "timestamp": 0.0,
        "data": data,
    }


def reward_event(value: Any) -> dict[str, Any]:
    return {
        "event_type": "reward",
        "rollout_id": "r",
        "attempt_id": "a",
        "timestamp": 0.0,
        "data": {"value": value},
    }


def _broken_prompt(history: list[int], turn: Turn) -> list[int]:
    """A prompt that certainly does not begin with `history`."""
    k = turn.break_at % len(history)
    if turn.break_kind == "edit":
        changed = list(history)
        changed[k] = (changed[k] + 1) % VOCAB
        return changed + turn.context
    # cut: the first k tokens, then a token that differs from history[k]
    return [*history[:k], (history[k] + 1) % VOCAB, *turn.context]


def render(
    first_prompt: list[int], steps: list[Turn | Bad]
) -> tuple[list[dict[str, Any]], list[ExpectedRow]]:
    """The triplet events of a script and the trajectory rows it must aggregate to."""
    events: list[dict[str, Any]] = []
    rows: list[ExpectedRow] = []
    history: list[int] = []
    for step in steps:
        if isinstance(step, Bad):
            p = history or first_prompt
            if step.kind == "error":
                events.append(call_event(p, [1, 2], None, 0, status="error", error="boom"))
            elif step.kind == "http":
                events.append(call_event(p, [1, 2], None, 0, http_status=500))
            elif step.kind == "no_response":
                events.append(call_event(p, [], None, 0))
            else:
                events.append(call_event([], [1, 2], None, 0))
            continue
        turn = step
        if not rows:
            prompt = list(first_prompt) + turn.context
            rows.append(ExpectedRow(prompt=prompt))
        elif turn.break_kind is not None:
            prompt = _broken_prompt(history, turn)
            rows.append(ExpectedRow(prompt=prompt))
        else:
            prompt = history + turn.context
            row = rows[-1]
            row.response += turn.context
            row.mask += [0] * len(turn.context)
            row.versions += [-1] * len(turn.context)
            if row.log_probs is not None:
                row.log_probs += [0.0] * len(turn.context)
        row = rows[-1]
        row.response += turn.response
        row.mask += [1] * len(turn.response)
        row.versions += [turn.version] * len(turn.response)
        if row.log_probs is not None:
            row.log_probs = row.log_probs + turn.log_probs if turn.log_probs is not None else None
        row.calls.append((prompt, list(turn.response)))
        events.append(call_event(prompt, list(turn.response), turn.log_probs, turn.version))
        history = prompt + turn.response
    return events, rows


tokens = st.lists(st.integers(0, VOCAB - 1), min_size=0, max_size=6)
nonempty_tokens = st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=6)


@st.composite
def turns(draw: st.DrawFn, first: bool = False) -> Turn:
    response = draw(nonempty_tokens)
    has_lp = draw(st.booleans()) if draw(st.integers(0, 4)) == 0 else True
    log_probs = [-(i + 1) / 8 for i in range(len(response))] if has_lp else None
    return Turn(
        context=draw(tokens),
        response=response,
        log_probs=log_probs,
        version=draw(st.integers(0, 3)),
        break_kind=None if first else draw(st.sampled_from([None, None, None, "edit", "cut"])),
        break_at=draw(st.integers(0, 50)),
    )


@st.composite
def scripts(draw: st.DrawFn, max_turns: int = 8) -> tuple[list[int], list[Turn | Bad]]:
    first_prompt = draw(nonempty_tokens)
    n = draw(st.integers(1, max_turns))
    steps: list[Turn | Bad] = []
    for i in range(n):
        if draw(st.integers(0, 6)) == 0:
            steps.append(Bad(draw(st.sampled_from(["error", "http", "no_response", "no_prompt"]))))
        steps.append(draw(turns(first=i == 0)))
    return first_prompt, steps
