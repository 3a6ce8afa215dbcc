"""Plays controller and agent against a real Gateway: starts rollouts, records calls, finishes them.

Model calls are posted as raw `model_request` events shaped like the proxy's (the Gateway
computes their triplet view), so these tests need no proxy and no model.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any, Self

from agentlightning.client import GatewayClient
from agentlightning.schemas import Rollout, RolloutState


def raw_call(
    prompt: list[int], response: list[int], log_probs: list[float] | None, version: int = 0, **extra: Any
) -> dict[str, Any]:
    """The data of a `model_request` event as the proxy records a chat completion."""
    choice: dict[str, Any] = {"index": 0, "token_ids": response, "finish_reason": "stop"}
    if log_probs is not None:
        choice["logprobs"] = {
            "content": [{"token": f"t{t}", "logprob": lp} for t, lp in zip(response, log_probs, strict=True)]
        }
    data: dict[str, Any] = {
        "api": "chat.completions",
        "request": {"messages": [{"role": "user", "content": "hi"}]},
        "response": {"prompt_token_ids": prompt, "choices": [choice]},
        "server": {"model": "policy", "endpoint": "http://127.0.0.1:1/v1", "version": version},
        "http_status": 200,
        "status": "ok",
    }
    data.update(extra)
    return data


def two_turn_calls(seed: int, version: int = 0) -> list[dict[str, Any]]:
    """A tool-calling conversation: call, tool output, call."""
    p1 = [1, 2, seed]
    r1 = [10 + seed, 11]
    tool = [90, 91]
    r2 = [12 + seed]
    return [
        raw_call(p1, r1, [-0.5, -0.25], version),
        raw_call(p1 + r1 + tool, r2, [-0.125], version),
    ]


def finish(
    client: GatewayClient,
    rollout_id: str,
    calls: list[dict[str, Any]],
    reward: float | None,
    state: RolloutState = RolloutState.SUCCEEDED,
    attempt_id: str = "a1",
    error_message: str | None = None,
) -> None:
    client.patch_rollout(rollout_id, state=RolloutState.RUNNING, last_attempt_id=attempt_id)
    for data in calls:
        client.post_event(rollout_id, attempt_id, "model_request", data)
    if reward is not None:
        client.post_reward(rollout_id, attempt_id, reward)
    status: dict[str, Any] = {"state": state}
    if error_message is not None:
        status["error_message"] = error_message
    client.patch_rollout(rollout_id, **status)


Plan = Callable[[Rollout], tuple[list[dict[str, Any]], float | None, RolloutState] | None]


class _DriverThread:
    """A background thread with its own Gateway client; the first error it met is raised on exit."""

    def __init__(self, url: str, key: str) -> None:
        self.client = GatewayClient(url, key)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.errors: list[BaseException] = []

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        self.client.close()
        if self.errors:
            raise self.errors[0]

    def _run(self) -> None:
        try:
            self._loop()
        except BaseException as exc:  # reported on exit
            self.errors.append(exc)

    def _loop(self) -> None:
        raise NotImplementedError


class Driver(_DriverThread):
    """A thread that finishes queued rollouts as a plan says (None: leave it alone)."""

    def __init__(self, url: str, key: str, plan: Plan) -> None:
        super().__init__(url, key)
        self.plan = plan
        self.finished: list[str] = []
        self._seen: set[str] = set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            polled = self.client.long_poll_rollouts([RolloutState.QUEUING], wait_seconds=0.5)
            for rollout in polled.value:
                if rollout.rollout_id in self._seen:
                    continue
                self._seen.add(rollout.rollout_id)
                action = self.plan(rollout)
                if action is not None:
                    calls, reward, state = action
                    finish(self.client, rollout.rollout_id, calls, reward, state)
                    self.finished.append(rollout.rollout_id)


class OrderedDriver(_DriverThread):
    """Finishes rollouts in exactly the order of its queue of (predicate, action) commands."""

    def __init__(self, url: str, key: str) -> None:
        super().__init__(url, key)
        self.commands: queue.Queue[
            tuple[Callable[[Rollout], bool], Callable[[GatewayClient, Rollout], None]]
        ] = queue.Queue()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                match, act = self.commands.get(timeout=0.1)
            except queue.Empty:
                continue
            deadline = time.monotonic() + 30
            while not self._stop.is_set():
                candidates = [r for r in self.client.list_rollouts([RolloutState.QUEUING]) if match(r)]
                if candidates:
                    act(self.client, candidates[0])
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError("no queued rollout matched a driver command")
                time.sleep(0.02)
