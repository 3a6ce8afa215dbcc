"""What a harness's recorded rollouts say about it: read from the Gateway's events, no I/O.

One `PathReport` per way the Gateway served the calls (the token path, pass-through): the APIs
and features the harness used, calls per rollout, prompt and answer lengths, the training rows
the trainer core makes of each rollout (`agentlightning.aggregation`, the same walk training
uses) and every segment break the Gateway recorded, with its reason and token index.
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from agentlightning.aggregation import AggregationStats, aggregate_rollout
from agentlightning.model_call import CallTriplet
from agentlightning.rewards import last_reward
from agentlightning.schemas import EVENT_MODEL_REQUEST

TOKEN_PATH = "token path"
PASS_THROUGH = "pass-through"


@dataclass
class RecordedRollout:
    """One rollout as the Gateway's store has it: its events in the raw and the triplet view."""

    rollout_id: str
    state: str  # succeeded | failed
    error: str | None
    events: list[dict[str, Any]]  # format=raw
    triplets: list[dict[str, Any]]  # format=triplet

    @property
    def calls(self) -> list[dict[str, Any]]:
        """The payloads of its recorded model calls, in order."""
        return [
            e["data"]
            for e in self.events
            if e.get("event_type") == EVENT_MODEL_REQUEST and isinstance(e.get("data"), dict)
        ]


@dataclass
class Break:
    """A call whose prompt does not extend the previous call's prompt + answer."""

    rollout_id: str
    call: int  # the call's position in its rollout, from 0
    reason: str  # the Gateway's `segment.break.reason`
    index: int | None  # the token where the prompt stops extending the row


@dataclass
class Spread:
    """min / mean / max of a count over calls or rollouts."""

    min: float
    mean: float
    max: float

    @classmethod
    def of(cls, values: list[float]) -> Spread | None:
        return cls(min(values), statistics.fmean(values), max(values)) if values else None

    def __str__(self) -> str:
        if self.min == self.max:
            return f"{self.min:g}"
        return f"{self.mean:.1f} ({self.min:g}–{self.max:g})"


@dataclass
class PathReport:
    path: str  # TOKEN_PATH | PASS_THROUGH
    rollouts: int
    succeeded: int
    failures: list[str]  # "rollout id: error" of each failed rollout
    apis: dict[str, int]  # api -> calls
    features: list[str]  # streaming, tools, parallel tool calls, reasoning
    calls_per_rollout: Spread | None
    prompt_tokens: Spread | None
    response_tokens: Spread | None
    rows_per_rollout: Spread | None
    breaks: list[Break]
    token_exact_calls: int  # calls the Gateway served on token ids (the rest were passed through)
    calls_without_tokens: int  # recorded calls with no prompt or answer token ids
    calls_failed: int  # calls that answered an error (HTTP >= 400)
    calls_without_log_probs: int
    rewards: list[float]  # the reward of each rollout that reported one
    rollouts_without_reward: int  # succeeded rollouts that reported none
    total_calls: int = 0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class _Features:
    seen: set[str] = field(default_factory=set)

    def note(self, call: dict[str, Any]) -> None:
        request = call.get("request") if isinstance(call.get("request"), dict) else {}
        assert isinstance(request, dict)
        if call.get("stream") or request.get("stream"):
            self.seen.add("streaming")
        if request.get("tools"):
            self.seen.add("tools")
        message = _message(call)
        calls = message.get("tool_calls") or []
        if calls:
            self.seen.add("tool calls")
        if len(calls) > 1:
            self.seen.add("parallel tool calls")
        if message.get("reasoning_content") or message.get("reasoning"):
            self.seen.add("reasoning")


def _message(call: dict[str, Any]) -> dict[str, Any]:
    """The chat answer's first message (every API is recorded as chat)."""
    response = call.get("response")
    choices = response.get("choices") if isinstance(response, dict) else None
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        message = choices[0].get("message")
        if isinstance(message, dict):
            return message
    return {}


def break_of(call: dict[str, Any]) -> tuple[str, int | None] | None:
    """(reason, token index) of the call's recorded segment break, None when it continues."""
    segment = call.get("segment")
    if not isinstance(segment, dict):
        return None
    broken = segment.get("break")
    if not isinstance(broken, dict):
        return None
    index = broken.get("index")
    return str(broken.get("reason", "history_changed")), index if isinstance(index, int) else None


def analyze(path: str, rollouts: list[RecordedRollout]) -> PathReport:
    features = _Features()
    apis: Counter[str] = Counter()
    calls_per: list[float] = []
    rows_per: list[float] = []
    prompts: list[float] = []
    answers: list[float] = []
    breaks: list[Break] = []
    failures: list[str] = []
    rewards: list[float] = []
    without_reward = token_exact = 0
    stats = AggregationStats()
    for rollout in rollouts:
        calls = rollout.calls
        calls_per.append(len(calls))
        if rollout.state != "succeeded":
            failures.append(f"{rollout.rollout_id}: {rollout.error or 'failed'}")
        reward = last_reward(rollout.events)
        if reward is not None:
            rewards.append(reward)
        elif rollout.state == "succeeded":
            without_reward += 1
        for n, call in enumerate(calls):
            apis[str(call.get("api", "chat.completions"))] += 1
            features.note(call)
            segment = call.get("segment")
            if isinstance(segment, dict) and segment.get("token_exact") is not False:
                token_exact += 1
            found = break_of(call)
            if found is not None:
                breaks.append(Break(rollout.rollout_id, n, *found))
        for event in rollout.triplets:
            triplet: CallTriplet[list[int]] | None = event.get("data")  # unvalidated: checked here
            if event.get("event_type") != EVENT_MODEL_REQUEST or not isinstance(triplet, dict):
                continue
            if isinstance(triplet.get("prompt_token_ids"), list) and triplet.get("response_token_ids"):
                prompts.append(len(triplet["prompt_token_ids"]))
                answers.append(len(triplet["response_token_ids"]))
        if calls:
            rows = aggregate_rollout(
                rollout.triplets, rollout.rollout_id, "doctor", reward or 0.0, stats=stats
            )
            rows_per.append(len(rows))
    return PathReport(
        path=path,
        rollouts=len(rollouts),
        succeeded=sum(r.state == "succeeded" for r in rollouts),
        failures=failures,
        apis=dict(apis),
        features=sorted(features.seen),
        calls_per_rollout=Spread.of(calls_per),
        prompt_tokens=Spread.of(prompts),
        response_tokens=Spread.of(answers),
        rows_per_rollout=Spread.of(rows_per),
        breaks=breaks,
        token_exact_calls=token_exact,
        calls_without_tokens=stats.n_calls_no_tokens,
        calls_failed=stats.n_calls_error,
        calls_without_log_probs=stats.n_calls_no_log_probs,
        rewards=rewards,
        rollouts_without_reward=without_reward,
        total_calls=sum(int(c) for c in calls_per),
    )
