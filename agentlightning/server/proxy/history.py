"""What the proxy remembers of an attempt's calls, to keep a multi-turn rollout one token sequence.

Each call of an attempt leaves a `Turn`: the chat messages it was asked (by meaning), the
prompt the server rendered for them, the prompt the model really saw and the tokens it
produced. A next call whose history repeats an earlier call's request and answer continues
that call's tokens (token_exact.py puts them back); one that does not starts a new segment,
and `classify` says why and at which token.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import orjson

ATTEMPTS = 4096  # attempts remembered (least recently used forgotten)
TURNS = 8  # calls remembered per attempt (the latest)
MAX_TOKENS = 4_000_000  # token ids held in all (~36 bytes each as Python ints): ~150 MB at most


def _arguments(raw: Any) -> Any:
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except ValueError:
            return raw.strip()
    return raw


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content.strip()
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict)).strip()
    return str(content).strip()


def meaning(message: dict[str, Any]) -> tuple[Any, ...]:
    """A message as the model means it: role, text without surrounding whitespace, tool calls
    by name and parsed arguments (key order, spacing and call ids do not matter)."""
    calls = tuple(
        (
            str((c.get("function") or {}).get("name")),
            json.dumps(_arguments((c.get("function") or {}).get("arguments")), sort_keys=True),
        )
        for c in message.get("tool_calls") or []
        if isinstance(c, dict)
    )
    return (message.get("role"), _text(message.get("content")), calls)


@dataclass
class Turn:
    messages: list[tuple[Any, ...]]  # the request's messages, by meaning
    tools: str  # the request's tools, as canonical JSON (tools_key)
    # the prompt as the server renders the request; None for a call read back from the store
    # whose prompt was continued (its rendering is not stored: token_exact.py renders it again)
    rendered: list[int] | None
    prompt: list[int]  # the prompt the model saw (rendered, or continued from an earlier turn)
    response: list[int]  # the tokens the model produced
    answer: tuple[Any, ...]  # the answer's message, by meaning
    finished: bool  # the answer ended on a stop token (not cut by max_tokens)


def tools_key(chat: dict[str, Any]) -> str:
    """The request's tools as canonical JSON (sorted keys), compared between an attempt's calls.
    orjson: json.dumps is many times slower on an agent's tool list, and this runs on every call."""
    tools = chat.get("tools") or []
    try:
        return orjson.dumps(tools, option=orjson.OPT_SORT_KEYS).decode()
    except orjson.JSONEncodeError:  # beyond orjson (integers over 64 bits): still canonical
        return json.dumps(tools, sort_keys=True)


class AttemptHistory:
    """The recent turns of recent attempts, within a token budget. Touched only from the event loop."""

    def __init__(self, max_tokens: int = MAX_TOKENS) -> None:
        self._turns: OrderedDict[tuple[str, str], list[Turn]] = OrderedDict()
        self._attempts_of: dict[str, set[str]] = {}  # rollout id -> its attempts in _turns
        self.max_tokens = max_tokens
        self.tokens = 0

    def turns(self, rollout_id: str, attempt_id: str) -> list[Turn]:
        key = (rollout_id, attempt_id)
        turns = self._turns.get(key)
        if turns is None:
            return []
        self._turns.move_to_end(key)
        return turns

    def add(self, rollout_id: str, attempt_id: str, turn: Turn) -> None:
        key = (rollout_id, attempt_id)
        turns = self._turns.get(key)
        if turns is None:
            turns = self._turns[key] = []
            self._attempts_of.setdefault(rollout_id, set()).add(attempt_id)
        self._turns.move_to_end(key)
        turns.append(turn)
        self.tokens += _size(turn)
        while len(turns) > TURNS:
            self.tokens -= _size(turns.pop(0))
        while self._turns and (len(self._turns) > ATTEMPTS or self.tokens > self.max_tokens):
            (rid, aid), dropped = self._turns.popitem(last=False)
            self.tokens -= sum(map(_size, dropped))
            self._drop_attempt(rid, aid)

    def _drop_attempt(self, rollout_id: str, attempt_id: str) -> None:
        attempts = self._attempts_of.get(rollout_id)
        if attempts is not None:
            attempts.discard(attempt_id)
            if not attempts:
                del self._attempts_of[rollout_id]

    def replace(self, rollout_id: str, attempt_id: str, turns: list[Turn]) -> None:
        """The attempt's turns as read back from the store (they include this Gateway's own)."""
        self._forget_attempt(rollout_id, attempt_id)
        for turn in turns[-TURNS:]:
            self.add(rollout_id, attempt_id, turn)

    def _forget_attempt(self, rollout_id: str, attempt_id: str) -> None:
        dropped = self._turns.pop((rollout_id, attempt_id), None)
        if dropped is not None:
            self.tokens -= sum(map(_size, dropped))
            self._drop_attempt(rollout_id, attempt_id)

    def forget(self, rollout_id: str) -> None:
        """A deleted rollout's turns: a rollout created again under its id starts afresh."""
        for attempt_id in list(self._attempts_of.get(rollout_id, ())):
            self._forget_attempt(rollout_id, attempt_id)


def _size(turn: Turn) -> int:
    rendered = 0 if turn.rendered is turn.prompt or turn.rendered is None else len(turn.rendered)
    return rendered + len(turn.prompt) + len(turn.response)


def answered(turns: list[Turn], messages: list[tuple[Any, ...]]) -> Turn | None:
    """The turn that wrote the request's last assistant message: its request is exactly what
    comes before that message, and the message is its answer. None when there is none."""
    last = next((i for i in range(len(messages) - 1, -1, -1) if messages[i][0] == "assistant"), None)
    if last is None:
        return None
    for turn in reversed(turns):
        if len(turn.messages) == last and messages[last] == turn.answer and messages[:last] == turn.messages:
            return turn
    return None


def knows(turns: list[Turn], messages: list[tuple[Any, ...]]) -> bool:
    """Whether every answer the request repeats is one of these turns: a request without an
    assistant message repeats none; one whose last answer came from a call this Gateway did not
    serve (another replica, before a restart, forgotten) needs the attempt's calls read back."""
    return answered(turns, messages) is not None or not any(m[0] == "assistant" for m in messages)


def continuation(turns: list[Turn], messages: list[tuple[Any, ...]], rendered: list[int]) -> list[int] | None:
    """The prompt the model saw, continued: the latest earlier turn whose request and answer
    this history repeats gives its exact prompt + response, followed by what this request
    adds (rendered). None when no turn is repeated."""
    found = _continued(turns, messages, rendered)
    return None if found is None else found[0]


def _repeats(turn: Turn, messages: list[tuple[Any, ...]]) -> bool:
    """Whether the messages go on from the turn's request and its finished answer (by meaning):
    the first condition for continuing its tokens."""
    n = len(turn.messages)
    if not turn.finished or not turn.response or turn.rendered is None or len(messages) <= n:
        return False
    return messages[:n] == turn.messages and messages[n] == turn.answer


def continuable(turns: list[Turn], messages: list[tuple[Any, ...]]) -> bool:
    """Whether any turn's tokens may be continued by this request. When none is, the prompt is
    the server's own rendering of the request (`prompt_and_segment`), and vLLM's chat API with
    `return_token_ids` serves the call token-exact in one request (dispatch.py)."""
    return any(_repeats(turn, messages) for turn in turns)


def _continued(
    turns: list[Turn], messages: list[tuple[Any, ...]], rendered: list[int]
) -> tuple[list[int], Turn] | None:
    """`continuation`'s prompt and the turn it continues."""
    for turn in reversed(turns):
        if not _repeats(turn, messages):
            continue
        assert turn.rendered is not None  # _repeats checked it
        if rendered[: len(turn.rendered)] != turn.rendered:
            continue
        # The answer ends on the stop token the template also closes the turn with: what the
        # template writes after it (turn separator, the new messages, the next generation
        # prompt) follows the model's own tokens.
        try:
            end = rendered.index(turn.response[-1], len(turn.rendered))
        except ValueError:
            continue
        return turn.prompt + turn.response + rendered[end + 1 :], turn
    return None


def prompt_and_segment(
    turns: list[Turn], messages: list[tuple[Any, ...]], tools: str, rendered: list[int]
) -> tuple[list[int], dict[str, Any]]:
    """The prompt to generate on (an earlier turn's exact tokens continued, else the server's
    rendering) and the call's segment record. A call that continues an earlier turn but not the
    latest (the agent dropped or changed the latest answer and went on from before it: a branch)
    keeps its exact tokens and records the break from the latest turn too: the rollout's row
    breaks there."""
    found = _continued(turns, messages, rendered)
    if found is not None:
        prompt, turn = found
        segment: dict[str, Any] = {"continues": True, "token_exact": True}
        if turn is not turns[-1]:  # a branch (continuing the latest turn needs no other compare)
            branched = classify(turns, messages, tools, prompt)
            if branched is not None:
                segment["break"] = branched
        return prompt, segment
    return rendered, segment_of(turns, messages, tools, rendered, token_exact=True)


def segment_of(
    turns: list[Turn], messages: list[tuple[Any, ...]], tools: str, prompt: list[int], token_exact: bool
) -> dict[str, Any]:
    """The segment record of a call whose prompt is the server's own rendering: the attempt's
    first, a continuation of the latest turn (the rendering itself extends it), or a break."""
    if not turns:
        return {"continues": False, "token_exact": token_exact, "first": True}
    broken = classify(turns, messages, tools, prompt)
    if broken is None:
        return {"continues": True, "token_exact": token_exact}
    return {"continues": False, "token_exact": token_exact, "break": broken}


def first_difference(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def classify(
    turns: list[Turn], messages: list[tuple[Any, ...]], tools: str, prompt: list[int]
) -> dict[str, Any] | None:
    """Why and where `prompt` does not continue the attempt's latest turn; None when it does
    (or when it is the attempt's first call)."""
    if not turns:
        return None
    last = turns[-1]
    sequence = last.prompt + last.response
    if prompt[: len(sequence)] == sequence:
        return None
    n = len(last.messages)
    if tools != last.tools:
        reason = "tools_changed"
    elif messages[:1] != last.messages[:1] and last.messages[:1] and last.messages[0][0] == "system":
        reason = "system_changed"
    elif len(messages) <= n:
        reason = "history_shortened"  # e.g. the agent summarized (compacted) its history
    elif messages[:1] != last.messages[:1]:
        reason = "history_changed"
    elif messages[:n] != last.messages:
        reason = "history_edited"
    elif messages[n] != last.answer:
        reason = "answer_edited"
    elif not last.finished:
        reason = "answer_unfinished"
    else:
        reason = "rerendered"  # same history by meaning, other tokens: the template's re-rendering
    return {"reason": reason, "index": first_difference(prompt, sequence)}
