"""From a rollout's recorded model calls to training rows.

`trajectory` (default): walk the calls in order. The first call opens a row: its prompt is
the row's prompt, its response the first trainable tokens. A later call whose prompt begins
with exactly the row's tokens so far (prompt + response) extends the row: the tokens in
between (tool output, user turns) are appended as context — masked, log-prob 0, version -1 —
then its response as trainable tokens. Any other call closes the row and opens a new one (a
merge mismatch). `transition`: every call is its own row.

A closed row whose prompt exceeds the prompt limit is dropped; a response longer than the
response limit is truncated; a row left without trainable tokens is skipped. Each is counted.
Calls that failed (`status == "error"`, HTTP status >= 400) or carry no prompt or response
tokens are skipped and counted; they never break a merge.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields
from enum import StrEnum
from typing import Any

from agentlightning.rows import CONTEXT_VERSION, TrainingRow
from agentlightning.schemas import EVENT_MODEL_REQUEST
from agentlightning.wire import CollectedTriplet, PromptIds


class AggregationLevel(StrEnum):
    """`agentlightning.trace_aggregator.level`."""

    TRAJECTORY = "trajectory"
    TRANSITION = "transition"


@dataclass(slots=True)
class Call:
    """One usable model call, as the triplet view gives it."""

    prompt_ids: list[int] | PromptIds  # PromptIds: collected in the triplet_delta format
    response_ids: list[int]
    log_probs: list[float] | None
    version: int
    routes: Any = None  # MoE routes (R3) as the Gateway recorded them (`routed_experts`), if any
    index: int = -1  # position among the rollout's recorded calls (what a reward's call_index names)


@dataclass(slots=True)
class AggregationStats:
    n_calls: int = 0  # usable calls
    n_calls_error: int = 0  # failed calls (error status or HTTP >= 400)
    n_calls_no_tokens: int = 0  # calls without prompt or response token ids
    n_calls_no_log_probs: int = 0  # usable calls whose log-probs the server did not report
    n_rows: int = 0  # rows emitted
    n_dropped_prompt_too_long: int = 0
    n_truncated: int = 0
    n_skipped_empty: int = 0
    n_merge_mismatch: int = 0  # trajectory: times a call could not extend the open row
    n_unmerged_rollouts: int = 0  # trajectory: rollouts that made more than one row
    n_rollouts_no_calls: int = 0  # rollouts without a single usable call

    def add(self, other: AggregationStats) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


def usable_calls(events: Iterable[dict[str, Any]], stats: AggregationStats) -> list[Call]:
    """The model calls of a rollout that can be trained on, in order; counts the others."""
    calls: list[Call] = []
    recorded = -1
    for event in events:
        if event.get("event_type") != EVENT_MODEL_REQUEST:
            continue
        recorded += 1
        # As the Gateway writes it, but read unvalidated: each value is checked below.
        data: CollectedTriplet | None = event.get("data")
        if not isinstance(data, dict):
            stats.n_calls_no_tokens += 1
            continue
        http_status = data.get("http_status")
        if data.get("status") == "error" or (
            isinstance(http_status, int) and not isinstance(http_status, bool) and http_status >= 400
        ):
            stats.n_calls_error += 1
            continue
        prompt = data.get("prompt_token_ids")
        response = data.get("response_token_ids")
        if not (isinstance(prompt, list | PromptIds) and prompt and isinstance(response, list) and response):
            stats.n_calls_no_tokens += 1
            continue
        log_probs = data.get("response_log_probs")
        if not isinstance(log_probs, list) or len(log_probs) != len(response):
            log_probs = None
            stats.n_calls_no_log_probs += 1
        server = data.get("server")
        version = server.get("version") if isinstance(server, dict) else None
        if not isinstance(version, int) or isinstance(version, bool):
            version = CONTEXT_VERSION
        calls.append(Call(prompt, response, log_probs, version, data.get("routed_experts"), recorded))
    stats.n_calls += len(calls)
    return calls


class _OpenRow:
    """A row being built: the first call's prompt, then responses and context in between."""

    __slots__ = (
        "last_prompt",
        "last_response",
        "log_probs",
        "mask",
        "n_calls",
        "prompt",
        "response",
        "routes",
        "seq_len",
        "turn_index",
        "versions",
    )

    def __init__(self, call: Call, turn_index: int) -> None:
        p = call.prompt_ids
        self.prompt: list[int] = p.whole() if isinstance(p, PromptIds) else p
        self.response: list[int] = list(call.response_ids)
        self.mask: list[int] = [1] * len(call.response_ids)
        self.versions: list[int] = [call.version] * len(call.response_ids)
        self.log_probs: list[float] | None = list(call.log_probs) if call.log_probs is not None else None
        self.seq_len = len(self.prompt) + len(self.response)
        self.turn_index = turn_index
        self.n_calls = 1
        self.last_prompt, self.last_response = call.prompt_ids, call.response_ids  # the last call merged
        # The last merged call's routes cover the whole row: its prompt + response is the row.
        self.routes = call.routes

    def extends(self, call: Call) -> bool:
        """Whether the call's prompt begins with exactly this row's tokens so far."""
        p = call.prompt_ids
        if isinstance(p, PromptIds) and p.base is self.last_prompt and p.shared == len(p.base):
            # The last merged call's whole prompt, which is this row's tokens up to there, then
            # new ids: only that call's response is left to compare.
            return len(p) >= self.seq_len and p[p.shared : self.seq_len] == self.last_response
        n_prompt = len(self.prompt)
        return (
            len(p) >= self.seq_len
            and p[:n_prompt] == self.prompt
            and p[n_prompt : self.seq_len] == self.response
        )

    def extend(self, call: Call) -> None:
        context = call.prompt_ids[self.seq_len :]
        n_ctx, n_resp = len(context), len(call.response_ids)
        self.response += context
        self.response += call.response_ids
        self.mask += [0] * n_ctx
        self.mask += [1] * n_resp
        self.versions += [CONTEXT_VERSION] * n_ctx
        self.versions += [call.version] * n_resp
        if self.log_probs is not None:
            if call.log_probs is None:
                self.log_probs = None
            else:
                self.log_probs += [0.0] * n_ctx
                self.log_probs += call.log_probs
        self.seq_len = len(call.prompt_ids) + n_resp
        self.n_calls += 1
        self.last_prompt, self.last_response = call.prompt_ids, call.response_ids
        self.routes = call.routes


@dataclass(frozen=True, slots=True)
class RowLimits:
    max_prompt_length: int | None = None
    max_response_length: int | None = None


def _close(
    row: _OpenRow,
    rollout_id: str,
    group_id: str,
    reward: float,
    limits: RowLimits,
    stats: AggregationStats,
    out: list[TrainingRow],
) -> None:
    if limits.max_prompt_length is not None and len(row.prompt) > limits.max_prompt_length:
        stats.n_dropped_prompt_too_long += 1
        return
    response, mask, versions, log_probs = row.response, row.mask, row.versions, row.log_probs
    truncated = False
    limit = limits.max_response_length
    if limit is not None and len(response) > limit:
        response, mask, versions = response[:limit], mask[:limit], versions[:limit]
        log_probs = log_probs[:limit] if log_probs is not None else None
        truncated = True
        stats.n_truncated += 1
    if 1 not in mask:
        stats.n_skipped_empty += 1
        return
    stats.n_rows += 1
    out.append(
        TrainingRow(
            rollout_id=rollout_id,
            group_id=group_id,
            prompt_ids=list(row.prompt),
            response_ids=response,
            response_mask=mask,
            rollout_log_probs=log_probs,
            model_versions=versions,
            reward=reward,
            turn_index=row.turn_index,
            n_calls=row.n_calls,
            truncated=truncated,
            routed_experts=row.routes,
        )
    )


def aggregate_calls(
    calls: list[Call],
    rollout_id: str,
    group_id: str,
    reward: float,
    level: AggregationLevel,
    limits: RowLimits,
    stats: AggregationStats,
) -> list[TrainingRow]:
    """The training rows of one rollout's usable calls."""
    out: list[TrainingRow] = []
    if not calls:
        stats.n_rollouts_no_calls += 1
        return out
    if level == AggregationLevel.TRANSITION:
        for i, call in enumerate(calls):
            _close(_OpenRow(call, i), rollout_id, group_id, reward, limits, stats, out)
        return out
    row = _OpenRow(calls[0], 0)
    n_opened = 1
    for i in range(1, len(calls)):
        call = calls[i]
        if row.extends(call):
            row.extend(call)
            continue
        stats.n_merge_mismatch += 1
        _close(row, rollout_id, group_id, reward, limits, stats, out)
        row = _OpenRow(call, i)
        n_opened += 1
    _close(row, rollout_id, group_id, reward, limits, stats, out)
    if n_opened > 1:
        stats.n_unmerged_rollouts += 1
    return out


def aggregate_rollout(
    events: Iterable[dict[str, Any]],
    rollout_id: str,
    group_id: str,
    reward: float,
    level: AggregationLevel = AggregationLevel.TRAJECTORY,
    limits: RowLimits = RowLimits(),
    stats: AggregationStats | None = None,
) -> list[TrainingRow]:
    """The training rows of one rollout's triplet events (`format=triplet`)."""
    stats = stats if stats is not None else AggregationStats()
    return aggregate_calls(usable_calls(events, stats), rollout_id, group_id, reward, level, limits, stats)
