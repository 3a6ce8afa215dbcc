"""A batch of rollouts run by agents spread over several Gateway replicas, while replicas or the
database are killed and restarted: what every acknowledged write must survive.

Each agent (a thread) runs one rollout: running, two model calls, a reward event carrying a
unique id, succeeded. It talks to "its" replica (rollout index modulo replicas) and, when that
one is unreachable or answers 503, retries on the next one after the Retry-After (a client-side
list of URLs). It records every write the Gateway acknowledged, and every answer that was not a
success, so that the caller can check that none is lost and that no failure was a bare 5xx.

Used by tests/server/test_replica_failures.py (a small batch) and bench/replicas.py (300).
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from agentlightning.launch import Service, start_gateway

RETRYABLE = {429, 502, 503}  # 429: paused for a weight update


@dataclass
class Replica:
    """One agl-server process on a fixed port, so that a restart keeps its URL."""

    port: int
    overrides: list[str]
    log_dir: Path
    process: Service | None = None
    restarts: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Replica:
        log = self.log_dir / f"replica-{self.port}-{self.restarts}.log"
        self.process = start_gateway(
            *self.overrides, port=self.port, log_path=log, name=f"agl-server:{self.port}", ready_timeout=180
        )
        return self

    def kill(self) -> None:
        """SIGKILL: no shutdown of any kind."""
        assert self.process is not None
        self.process.kill()
        self.restarts += 1

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()


@dataclass
class Outcome:
    acknowledged: dict[str, list[str]] = field(default_factory=dict)  # rollout -> acked event ids
    failures: list[tuple[int, str]] = field(default_factory=list)  # (status, retry-after) not 2xx
    finished: set[str] = field(default_factory=set)
    retries: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


class Agent:
    def __init__(self, urls: list[str], first: int, key: str, outcome: Outcome, deadline: float) -> None:
        self.urls = urls
        self.turn = first
        self.headers = {"x-api-key": key}
        self.outcome = outcome
        self.deadline = deadline

    def request(self, method: str, path: str, json: Any = None) -> httpx.Response:
        """The answer of whichever replica answers, retrying unreachable ones and 503s."""
        while True:
            url = self.urls[self.turn % len(self.urls)]
            try:
                answer = httpx.request(method, url + path, json=json, headers=self.headers, timeout=30)
            except httpx.TransportError:
                answer = None
            if answer is not None and answer.status_code not in RETRYABLE:
                return answer
            with self.outcome.lock:
                self.outcome.retries += 1
                if answer is not None:
                    self.outcome.failures.append((answer.status_code, answer.headers.get("retry-after", "")))
            if time.monotonic() > self.deadline:
                raise TimeoutError(f"{method} {path}: no replica answered before the deadline")
            self.turn += 1  # the next replica
            wait = float(answer.headers.get("retry-after", "0.2")) if answer is not None else 0.2
            time.sleep(min(wait, 0.5))  # capped: the test's batch must not sit idle

    def set_state(self, rid: str, state: str, extra: dict[str, Any] | None = None) -> None:
        answer = self.request("PATCH", f"/api/rollouts/{rid}", {"status": {"state": state, **(extra or {})}})
        if answer.status_code == 409:  # a retried PATCH whose first try committed: already there
            current = self.request("GET", f"/api/rollouts/{rid}").json()["rollout"]["status"]["state"]
            assert current == state, f"{rid}: {state} refused while {current}"
            return
        assert answer.status_code == 200, answer.text

    def run(self, rid: str) -> None:
        self.set_state(rid, "running", {"last_attempt_id": "a1"})
        base = f"/proxy/rollout/{rid}/attempt/a1/mode/train/openai/v1/chat/completions"
        for turn in range(2):
            body = {"model": "m", "messages": [{"role": "user", "content": f"{rid} turn {turn}"}]}
            answer = self.request("POST", base, body)
            assert answer.status_code == 200, answer.text
        event_id = uuid.uuid4().hex
        answer = self.request(
            "POST",
            f"/api/rollouts/{rid}/attempt/a1/events",
            {"event_type": "reward", "data": {"value": 1.0, "event_id": event_id}},
        )
        assert answer.status_code == 200, answer.text
        with self.outcome.lock:
            self.outcome.acknowledged.setdefault(rid, []).append(event_id)
        self.set_state(rid, "succeeded")
        with self.outcome.lock:
            self.outcome.finished.add(rid)


def run_batch(
    urls: list[str],
    key: str,
    n_rollouts: int,
    agents: int,
    during: Callable[[Callable[[], int]], None] | None = None,
    timeout: float = 600.0,
) -> tuple[Outcome, list[str]]:
    """Create the rollouts, run them with `agents` threads; `during(done)` runs alongside (the
    chaos), given a function that says how many rollouts have finished."""
    outcome = Outcome()
    deadline = time.monotonic() + timeout
    creator = Agent(urls, 0, key, outcome, deadline)
    rids = [f"b-{uuid.uuid4().hex[:10]}" for _ in range(n_rollouts)]
    for start in range(0, n_rollouts, 100):
        specs = [{"rollout_id": rid, "input": {"i": i}} for i, rid in enumerate(rids[start : start + 100])]
        assert creator.request("POST", "/api/rollouts", specs).status_code == 201
    chaos_error: list[BaseException] = []

    def chaos() -> None:
        try:
            if during is not None:
                during(lambda: len(outcome.finished))
        except BaseException as exc:
            chaos_error.append(exc)

    chaos_thread = threading.Thread(target=chaos, daemon=True)
    chaos_thread.start()
    with concurrent.futures.ThreadPoolExecutor(agents) as pool:
        futures = [pool.submit(Agent(urls, i, key, outcome, deadline).run, rid) for i, rid in enumerate(rids)]
        for f in futures:
            f.result()
    chaos_thread.join(timeout=max(deadline - time.monotonic(), 1))
    if chaos_error:
        raise chaos_error[0]
    return outcome, rids


def check_nothing_lost(urls: list[str], key: str, outcome: Outcome, rids: list[str]) -> dict[str, int]:
    """Every rollout succeeded and every acknowledged event is stored, read through each replica."""
    counts = {"rollouts": len(rids), "duplicates": 0}
    for i, rid in enumerate(rids):
        url = urls[i % len(urls)]
        headers = {"x-api-key": key}
        rollout = httpx.get(f"{url}/api/rollouts/{rid}", headers=headers, timeout=30).json()["rollout"]
        assert rollout["status"]["state"] == "succeeded", (rid, rollout["status"])
        events = httpx.get(f"{url}/api/rollouts/{rid}/events", headers=headers, timeout=30).json()
        stored = [e["data"].get("event_id") for e in events if e["event_type"] == "reward"]
        for event_id in outcome.acknowledged[rid]:
            assert event_id in stored, f"{rid}: acknowledged event {event_id} is missing"
        calls = [e for e in events if e["event_type"] == "model_request"]
        assert len(calls) >= 2, f"{rid}: {len(calls)} model calls recorded, 2 were answered"
        counts["duplicates"] += len(stored) - len(set(stored)) + len(calls) - 2
    return counts
