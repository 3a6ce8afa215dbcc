"""An evaluation's rollouts in the Gateway's store: named, created, waited for, read back.

Each rollout's id is fixed by what it measures: `ev-{key}-t{task}-s{sample}`, `key` a hash of the
policy's source and the settings that change a rollout's outcome (tasks, agent, temperature,
engine). A restart on the same store therefore finds every finished rollout under its id and
creates only the missing ones; a rollout left queued or running by a crash is deleted and
created again (its agent died with the crash).
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from agentlightning.client import GatewayClient
from agentlightning.rewards import last_reward
from agentlightning.schemas import EVENT_MODEL_REQUEST, RolloutConfig, RolloutCreate, RolloutState

CHUNK = 200  # rollouts per batch read or create


def run_key(policy_source: str, settings: dict[str, Any]) -> str:
    """12 hex digits naming (policy, settings): the rollouts' id prefix."""
    blob = json.dumps({"policy": policy_source, **settings}, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


def rollout_id(key: str, task: int, sample: int) -> str:
    return f"ev-{key}-t{task}-s{sample}"


@dataclass(frozen=True)
class RolloutResult:
    task: int
    sample: int
    state: str  # succeeded | failed
    reward: float  # 0.0 where the rollout failed or posted no reward
    has_reward: bool
    calls: int
    prompt_tokens: int
    completion_tokens: int


def _chunks(items: Sequence[str]) -> list[Sequence[str]]:
    return [items[i : i + CHUNK] for i in range(0, len(items), CHUNK)]


def states(client: GatewayClient, ids: Sequence[str]) -> dict[str, RolloutState]:
    """The state of each id the store has (ids it lacks are left out)."""
    out: dict[str, RolloutState] = {}
    for chunk in _chunks(ids):
        # Only reward events come back with it: a cheap read of the rollouts' states.
        for item in client.get_events_batch(chunk, format="raw", event_type="reward"):
            if item["found"]:
                out[item["rollout_id"]] = RolloutState(item["state"])
    return out


def drop_unfinished(client: GatewayClient, ids: Sequence[str]) -> int:
    """Delete the rollouts of `ids` a crash left queued or running; how many."""
    stale = [i for i, s in states(client, ids).items() if not s.is_terminal]
    for chunk in _chunks(stale):
        client.delete_rollouts(chunk)
    return len(stale)


def create(
    client: GatewayClient,
    wanted: dict[str, tuple[int, int]],
    tasks: Sequence[dict[str, Any]],
    config: RolloutConfig,
    policy: str,
) -> None:
    """Create the rollouts `wanted` ({id: (task, sample)}) as validation rollouts."""
    specs = [
        RolloutCreate(
            rollout_id=rid,
            input=tasks[task],
            is_train=False,
            config=config,
            metadata={"data_id": f"{rid.rsplit('-s', 1)[0]}", "eval_policy": policy, "sample": sample},  # type: ignore[arg-type]  # validated into RolloutMetadata
        )
        for rid, (task, sample) in wanted.items()
    ]
    for start in range(0, len(specs), CHUNK):
        client.create_rollouts(specs[start : start + CHUNK])


def wait(
    client: GatewayClient,
    pending: set[str],
    progress: Callable[[int], None],
    alive: Callable[[], None],
) -> None:
    """Until every rollout of `pending` is terminal: `progress(done)` as they finish, `alive()`
    (raises when a service died) between long-polls."""
    left = set(pending)
    after = 0
    while left:
        page = client.long_poll_terminal(after, wait_seconds=2.0).value
        after = page.next_after
        before = len(left)
        left.difference_update(item.rollout_id for item in page.items)
        if len(left) != before:
            progress(len(pending) - len(left))
        if not page.items:
            alive()


def read(client: GatewayClient, ids: dict[str, tuple[int, int]]) -> list[RolloutResult]:
    """Every rollout of `ids` ({id: (task, sample)}), all terminal, with its reward and usage."""
    out: list[RolloutResult] = []
    for chunk in _chunks(list(ids)):
        for item in client.get_events_batch(chunk, format="raw"):
            if not item["found"] or not RolloutState(item["state"]).is_terminal:
                raise RuntimeError(f"rollout {item['rollout_id']} is not finished in the store")
            events = item["events"]
            reward = last_reward(events)
            calls = [e["data"] for e in events if e.get("event_type") == EVENT_MODEL_REQUEST]
            usage = [c.get("usage") or {} for c in calls]
            task, sample = ids[item["rollout_id"]]
            out.append(
                RolloutResult(
                    task=task,
                    sample=sample,
                    state=str(item["state"]),
                    reward=reward if reward is not None and item["state"] == RolloutState.SUCCEEDED else 0.0,
                    has_reward=reward is not None,
                    calls=len(calls),
                    prompt_tokens=sum(int(u.get("prompt_tokens") or 0) for u in usage),
                    completion_tokens=sum(int(u.get("completion_tokens") or 0) for u in usage),
                )
            )
    return out


class Progress:
    """One line per policy on screen, rewritten in place on a terminal, else every 10 %."""

    def __init__(self, label: str, total: int, resumed: int) -> None:
        self.label = label
        self.total = total
        self.resumed = resumed
        self.started = time.monotonic()
        self.tty = sys.stdout.isatty()
        self.last_tenth = -1

    def __call__(self, done_now: int) -> None:
        done = self.resumed + done_now
        line = (
            f"  {self.label}: {done}/{self.total} rollouts done ({self.resumed} found finished), "
            f"{time.monotonic() - self.started:.0f} s"
        )
        if self.tty:
            print("\r" + line, end="\n" if done == self.total else "", flush=True)
        elif (tenth := 10 * done // max(1, self.total)) != self.last_tenth:
            self.last_tenth = tenth
            print(line, flush=True)
