"""Two replicas on one Postgres running a batch of rollouts while one replica is SIGKILLed twice,
or while Postgres itself restarts: nothing acknowledged is lost, no answer is a bare 5xx.
(bench/replicas.py runs the same with 300 rollouts.)"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import httpx
import pytest

from agentlightning.procs import free_port
from tests import postgres
from tests.fakes.model_server import FakeModelServer
from tests.local_postgres import LocalPostgres
from tests.server.replica_batch import Outcome, Replica, check_nothing_lost, run_batch

pytestmark = pytest.mark.process  # whole processes, waited on: not in `make test-fast`

KEY = "failure-key"
N_ROLLOUTS = 24
AGENTS = 6


def until(check: Callable[[], bool], timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)


@pytest.fixture
def fake() -> Iterator[FakeModelServer]:
    with FakeModelServer(delay=0.02) as server:  # calls in flight when a replica dies
        yield server


def start_pair(url: str, tmp_path: Path, fake: FakeModelServer) -> list[Replica]:
    tail = [f"key={KEY}", f"store.url={url}", "proxy.backoff_seconds=0.05", "proxy.max_backoff_seconds=0.1"]
    replicas = [Replica(free_port(), tail, tmp_path).start() for _ in range(2)]
    answer = httpx.post(
        f"{replicas[0].url}/api/models",
        json=[{"model": "policy", "endpoint": fake.base_url}],
        headers={"x-api-key": KEY},
    )
    assert answer.status_code == 201
    return replicas


def state(replica: Replica) -> dict[str, object]:
    return httpx.get(f"{replica.url}/proxy/state", headers={"x-api-key": KEY}, timeout=30).json()


def assert_failures_were_retryable(outcome: Outcome) -> None:
    for status, retry_after in outcome.failures:
        assert status in (429, 503) and retry_after, f"answer {status} without Retry-After"


def test_a_replica_killed_twice_mid_batch_loses_nothing(tmp_path: Path, fake: FakeModelServer) -> None:
    a, b = replicas = start_pair(postgres.new_database(), tmp_path, fake)
    urls = [r.url for r in replicas]
    try:

        def chaos(done: Callable[[], int]) -> None:
            def past(fraction: float) -> bool:
                return done() >= N_ROLLOUTS * fraction

            for fraction in (0.25, 0.5):
                until(partial(past, fraction))
                b.kill()
                b.start()
            # The trainer pauses through A: the restarted B holds calls too; drained; resumed.
            httpx.post(f"{a.url}/proxy/pause", json={"retry_after_seconds": 0.2}, headers={"x-api-key": KEY})
            assert state(b)["paused"] is True
            until(lambda: state(b)["inflight"] == 0)
            assert httpx.post(f"{b.url}/proxy/resume", headers={"x-api-key": KEY}).json()["paused"] is False

        outcome, rids = run_batch(urls, KEY, N_ROLLOUTS, AGENTS, chaos, timeout=400)
        assert b.restarts == 2
        assert outcome.finished == set(rids)  # 0 lost
        check_nothing_lost(urls, KEY, outcome, rids)
        assert_failures_were_retryable(outcome)
    finally:
        for r in replicas:
            r.stop()


def test_postgres_restarted_mid_batch_loses_nothing_and_answers_503(
    tmp_path: Path, fake: FakeModelServer
) -> None:
    postgres.require_postgres()
    pg = LocalPostgres(fsync=False).start()
    replicas: list[Replica] = []
    try:
        a, b = replicas = start_pair(pg.url(), tmp_path, fake)
        urls = [r.url for r in replicas]

        def chaos(done: Callable[[], int]) -> None:
            until(lambda: done() >= N_ROLLOUTS // 3)
            pg.kill()  # immediate shutdown: no checkpoint, crash recovery at the start
            down_since = time.monotonic()
            answer = httpx.get(f"{b.url}/api/rollouts", headers={"x-api-key": KEY}, timeout=30)
            assert answer.status_code == 503 and answer.headers["Retry-After"]
            until(lambda: time.monotonic() - down_since > 1.5, timeout=5)  # calls keep coming meanwhile
            pg.start()

        outcome, rids = run_batch(urls, KEY, N_ROLLOUTS, AGENTS, chaos, timeout=400)
        assert outcome.finished == set(rids)
        check_nothing_lost(urls, KEY, outcome, rids)
        assert_failures_were_retryable(outcome)
        assert any(status == 503 for status, _ in outcome.failures)  # the agents saw the outage
        # The change feed reconnected: a pause through A reaches B again.
        httpx.post(f"{a.url}/proxy/pause", json={"retry_after_seconds": 1}, headers={"x-api-key": KEY})
        until(lambda: state(b)["paused"] is True, timeout=10)
        httpx.post(f"{b.url}/proxy/resume", headers={"x-api-key": KEY})
        until(lambda: state(a)["paused"] is False, timeout=10)
    finally:
        for r in replicas:
            r.stop()
        pg.destroy()
