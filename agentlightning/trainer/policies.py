"""Several policies in one run: each rollout seen through one policy's eyes.

A run that declares `agentlightning.policies` serves each policy under its own model name; the
Gateway records with every call the model (policy) and version that served it
(`server.model`, `server.version`). The core trains each policy on its own calls: a policy's
view of a rollout keeps only the calls its model served, and the rows, advantages, shaping and
staleness of that policy are computed from the views exactly as for a one-policy run.

Rewards: a reward event naming a policy (`data.policy`) is that role's; one naming none is
shared by every role. A policy's rollout reward is the last reward event naming it, or, when
none does, the last shared one. A per-call reward (`call_index`, among all the rollout's
recorded calls) goes to the policy whose call it names, renumbered among that policy's calls.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any

from agentlightning.rewards import call_index
from agentlightning.schemas import EVENT_MODEL_REQUEST, EVENT_REWARD
from agentlightning.trainer.collected import CollectedRollout


def call_policy(data: Any) -> str | None:
    """The model (policy) that served a recorded call; None when none did (e.g. no endpoint)."""
    server = data.get("server") if isinstance(data, dict) else None
    model = server.get("model") if isinstance(server, dict) else None
    return model if isinstance(model, str) else None


def reward_policy(data: Any) -> str | None:
    """The policy a reward event names (`data.policy`); None for a reward shared by all."""
    policy = data.get("policy") if isinstance(data, dict) else None
    return policy if isinstance(policy, str) and policy else None


def policy_events(events: Iterable[dict[str, Any]], policy: str) -> list[dict[str, Any]]:
    """The events of a rollout that concern `policy`: its calls, and the rewards it gets."""
    events = list(events)
    local: dict[int, int] = {}  # the rollout's call index -> index among this policy's calls
    recorded = 0
    own_reward = False
    for event in events:
        kind = event.get("event_type")
        if kind == EVENT_MODEL_REQUEST:
            if call_policy(event.get("data")) == policy:
                local[recorded] = len(local)
            recorded += 1
        elif kind == EVENT_REWARD and reward_policy(event.get("data")) == policy:
            own_reward = own_reward or call_index(event.get("data")) is None
    out: list[dict[str, Any]] = []
    recorded = 0
    for event in events:
        kind = event.get("event_type")
        data = event.get("data")
        if kind == EVENT_MODEL_REQUEST:
            if recorded in local:
                out.append(event)
            recorded += 1
        elif kind == EVENT_REWARD:
            named = reward_policy(data)
            index = call_index(data)
            if index is not None and isinstance(data, dict):  # one call's reward: its policy's
                if index in local and named in (None, policy):
                    out.append({**event, "data": {**data, "call_index": local[index]}})
            elif named == policy or (named is None and not own_reward):
                out.append(event)
        else:
            out.append(event)
    return out


def policy_view(rollout: CollectedRollout, policy: str) -> CollectedRollout:
    """The rollout as `policy` trains on it (see `policy_events`)."""
    return replace(rollout, events=policy_events(rollout.events, policy))


def policy_views(rollouts: Sequence[CollectedRollout], policy: str) -> list[CollectedRollout]:
    return [policy_view(r, policy) for r in rollouts]


def shared_view(rollout: CollectedRollout) -> CollectedRollout:
    """The rollout without its roles' own rewards: what the run's unprefixed metrics read."""
    kept = [
        e
        for e in rollout.events
        if e.get("event_type") != EVENT_REWARD or reward_policy(e.get("data")) is None
    ]
    return replace(rollout, events=kept)


def prefixed(policy: str, metrics: dict[str, float]) -> dict[str, float]:
    """A policy's metrics under `policy/NAME/` (the dashboard draws one curve per policy)."""
    return {f"policy/{policy}/{key}": value for key, value in metrics.items()}
