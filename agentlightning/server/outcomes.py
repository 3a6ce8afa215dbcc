"""How an attempt ended, from the Gateway's own records (docs/reliability.md).

Two sources here: the proxy's record of a model call that failed for the agent (`call_outcome`:
the engine unavailable after the retries, or a prompt the engine refused for its length), and
the rollout's end (`finish_attempt`: a reward recorded or not). The Controller and the trainer
add theirs through `PUT /api/rollouts/{id}/attempts/{attempt}/outcome`. The store keeps the
strongest evidence per attempt, so the order in which replicas record it does not matter.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from typing import Any

import orjson

from agentlightning.rewards import last_reward
from agentlightning.schemas import EVENT_REWARD, MAX_OUTCOME_DETAIL, AttemptOutcome, Rollout, RolloutState
from agentlightning.server.proxy.upstream import is_retryable
from agentlightning.server.store import RolloutNotFound, Store
from agentlightning.server.store.base import Outcome

# What engines answer (400) to a prompt over their context: vLLM's messages (before and since
# 0.10) and the torch engine's (torch_backend/engine.py).
CONTEXT_OVERFLOW = re.compile(
    r"maximum context length|maximum model length|is too long and exceeds limit|max_model_len",
    re.IGNORECASE,
)


def call_outcome(call: Mapping[str, Any]) -> AttemptOutcome | None:
    """The outcome a failed model call (a `model_request` event's data) is evidence of, if any:
    `model_unavailable` when the proxy's retries were used up on 5xx, 408/409/429, timeouts or
    connection errors, or no engine was registered; `context_overflow` when the engine refused
    the prompt's length."""
    if call.get("status") != "error" or call.get("incomplete"):
        return None  # a stream cut short may be the agent's own disconnect: no evidence
    status = call.get("http_status") or 0
    if is_retryable(status):
        return AttemptOutcome.MODEL_UNAVAILABLE
    if status == 400 and CONTEXT_OVERFLOW.search(call.get("error") or ""):
        return AttemptOutcome.CONTEXT_OVERFLOW
    return None


async def record_call_outcome(
    store: Store, rollout_id: str, attempt_id: str, call: Mapping[str, Any]
) -> None:
    outcome = call_outcome(call)
    if outcome is not None:
        detail = f"model call answered {call.get('http_status')}: {call.get('error') or ''}"
        await store.record_outcome(rollout_id, attempt_id, outcome, detail[:MAX_OUTCOME_DETAIL], time.time())


def attempt_key(rollout: Rollout) -> str:
    """The attempt a rollout's outcome belongs to: its last one ("" before any started)."""
    return rollout.status.last_attempt_id or ""


async def finish_attempt(store: Store, rollout: Rollout) -> Outcome | None:
    """At the rollout's terminal state, the weakest evidence of its last attempt: `ok` (a
    reward recorded), `no_reward`, or `agent_error` for a failure nobody explained. Stronger
    evidence already recorded (the proxy's, the Controller's) stays. None: the rollout is gone."""
    state = rollout.status.state
    attempt_id = attempt_key(rollout)
    if state == RolloutState.FAILED:
        outcome, detail = AttemptOutcome.AGENT_ERROR, rollout.status.error_message
    else:
        events = await store.list_events(rollout.rollout_id, attempt_id or None, EVENT_REWARD)
        rewards = [{"event_type": EVENT_REWARD, "data": orjson.loads(e.record.data)} for e in events]
        if last_reward(rewards) is None:
            outcome, detail = AttemptOutcome.NO_REWARD, "finished without a reward event"
        else:
            outcome, detail = AttemptOutcome.OK, None
    try:
        return await store.record_outcome(
            rollout.rollout_id, attempt_id, outcome, (detail or "")[:MAX_OUTCOME_DETAIL] or None, time.time()
        )
    except RolloutNotFound:
        return None
