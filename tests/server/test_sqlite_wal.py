"""The SQLite store's WAL stays bounded, and its checkpointer outlives failing checkpoints."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from agentlightning.schemas import Rollout
from agentlightning.server.store import SqliteStore
from agentlightning.server.store.base import EventRecord
from agentlightning.server.store.sqlite import _Checkpointer

LIMIT = 256 * 1024
WAIT_S = 120.0  # generous: the machine may be busy


async def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


def wal_size(db: Path) -> int:
    wal = Path(f"{db}-wal")
    return wal.stat().st_size if wal.exists() else 0


async def append_events(store: SqliteStore, rollout_id: str, n: int, size: int = 8192) -> None:
    for i in range(n):
        await store.append_event(EventRecord(rollout_id, "a1", "reward", float(i), b"x" * size))


async def test_wal_is_emptied_after_continuous_writes(tmp_path: Path) -> None:
    db = tmp_path / "g.db"
    store = SqliteStore(db, wal_max_bytes=LIMIT)
    await store.open()
    try:
        await store.create_rollouts([Rollout(rollout_id="r", input={})])
        # ~4 MB in concurrent appends and deletes: many times the limit
        for round_ in range(4):
            await store.create_rollouts([Rollout(rollout_id=f"d{round_}", input={})])
            await asyncio.gather(append_events(store, "r", 60), append_events(store, f"d{round_}", 60))
            await store.delete_rollout(f"d{round_}")
        await wait_for(lambda: wal_size(db) <= LIMIT, "the WAL to shrink under its limit")
        assert len(await store.list_events("r")) == 240
    finally:
        await store.close()
    assert wal_size(db) == 0


async def test_checkpointer_survives_a_reader_holding_the_wal_and_resets_it_after(tmp_path: Path) -> None:
    db = tmp_path / "g.db"
    store = SqliteStore(db, wal_max_bytes=LIMIT)
    await store.open()
    checkpointer = store._checkpointer
    assert checkpointer is not None
    reader = sqlite3.connect(db, isolation_level=None)
    try:
        await store.create_rollouts([Rollout(rollout_id="r", input={})])
        await append_events(store, "r", 10)
        # A reader on an old snapshot: no checkpoint can copy the frames written after it.
        reader.execute("BEGIN")
        assert reader.execute("SELECT count(*) FROM events").fetchone()[0] == 10
        with capture_logs() as logs:
            await append_events(store, "r", 60)  # ~500 KB: past the limit
            await wait_for(lambda: checkpointer.failures >= 2, "two failed checkpoints")
        assert checkpointer.is_alive()
        warnings = [e for e in logs if e["event"] == "wal_checkpoint_failed"]
        assert warnings and warnings[0]["log_level"] == "warning" and warnings[0]["mode"] == "TRUNCATE"
        assert wal_size(db) > LIMIT
        # Writes go on meanwhile.
        await append_events(store, "r", 5)
        assert reader.execute("SELECT count(*) FROM events").fetchone()[0] == 10  # still its snapshot

        reader.execute("COMMIT")
        # The checkpointer thread empties the WAL, then counts: wait for both (a busy machine can
        # show the emptied file before the thread has reset its failure count).
        await wait_for(
            lambda: wal_size(db) == 0 and checkpointer.failures == 0,
            "the WAL to be emptied and the checkpointer recovered once the reader went",
        )
        assert checkpointer.truncations >= 1
        assert len(await store.list_events("r")) == 75
    finally:
        reader.close()
        await store.close()


class _BrokenCheckpoints(sqlite3.Connection):
    """A connection whose first checkpoints fail with an error, as a full disk or an I/O error would."""

    fail_left = 3

    def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:
        if sql.startswith("PRAGMA wal_checkpoint") and _BrokenCheckpoints.fail_left > 0:
            _BrokenCheckpoints.fail_left -= 1
            raise sqlite3.OperationalError("disk I/O error")
        return super().execute(sql, *args)


def test_checkpointer_logs_a_checkpoint_error_and_goes_on(tmp_path: Path) -> None:
    db = tmp_path / "g.db"
    setup = sqlite3.connect(db, isolation_level=None)
    setup.execute("PRAGMA journal_mode=WAL")
    setup.execute("PRAGMA wal_autocheckpoint=0")
    setup.execute("CREATE TABLE t(x BLOB)")
    for _ in range(50):
        setup.execute("INSERT INTO t VALUES (?)", (b"y" * 10_000,))
    assert wal_size(db) > 100_000

    connects: list[int] = []

    def connect() -> sqlite3.Connection:
        connects.append(1)
        return sqlite3.connect(db, isolation_level=None, check_same_thread=False, factory=_BrokenCheckpoints)

    checkpointer = _Checkpointer(connect, Path(f"{db}-wal"), max_bytes=50_000, interval_s=0.01)
    with capture_logs() as logs:
        checkpointer.start()
        try:
            deadline = time.monotonic() + WAIT_S
            while wal_size(db) != 0:
                assert time.monotonic() < deadline, "the WAL was never emptied"
                assert checkpointer.is_alive()
                time.sleep(0.01)
        finally:
            checkpointer.stop()
            checkpointer.join(WAIT_S)
    setup.close()
    assert not checkpointer.is_alive()
    errors = [e for e in logs if e["event"] == "wal_checkpoint_failed"]
    assert errors and "disk I/O error" in errors[0]["reason"]
    assert any(e["event"] == "wal_checkpoint_recovered" for e in logs)
    assert len(connects) >= 2  # a failed connection is replaced by a fresh one


@pytest.mark.parametrize("bad", [0, -1])
def test_wal_max_bytes_must_be_positive(tmp_path: Path, bad: int) -> None:
    with pytest.raises(ValueError, match="wal_max_bytes"):
        SqliteStore(tmp_path / "g.db", wal_max_bytes=bad)
