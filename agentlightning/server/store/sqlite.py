"""SQLite store: the default. One file, WAL journal, durable across a crash of the Gateway.

Writes go to one writer thread that commits whatever has queued up in one transaction
(group commit): an event append costs one row insert, and many concurrent appends share one
commit. WAL checkpoints (copying the log into the database file, with its fsync) run on a
background thread instead of inside a writer's commit. Reads run on a small pool of threads
with their own connections; in WAL mode they never wait for the writer. A write is acknowledged only after its transaction committed, so
what the Gateway acknowledged survives a SIGKILL (with `synchronous=full`, a power cut too).
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Collection
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import orjson

from agentlightning.log import get_logger
from agentlightning.schemas import (
    AttemptOutcome,
    MetricPoint,
    Model,
    Rollout,
    RolloutState,
    RolloutStatusPatch,
    RunSummary,
    TerminalItem,
    TerminalPage,
)
from agentlightning.server.store.base import (
    MAX_POINTS_PER_RUN,
    MAX_RUNS,
    MAX_STATUS_CHANGES,
    RUN_KEYS_FROM,
    AttemptStats,
    EventRecord,
    Outcome,
    RolloutNotFound,
    Store,
    StoredEvent,
    apply_patch,
    group_id_of,
    status_row,
)
from agentlightning.server.store.delta import CallDraft, CallIndex, View, materialize
from agentlightning.server.store.runs import metric_points, run_summaries

T = TypeVar("T")
# 2: events.call (model calls stored as deltas, store/delta.py); 3: status_changes, runs, run_points;
# 4: attempt_outcomes
SCHEMA_VERSION = 5
MAX_BATCH = 1024
CHECKPOINT_INTERVAL_S = 0.5
CHECKPOINT_BUSY_MS = 1000  # longest a TRUNCATE checkpoint holds writers back
CHECKPOINT_WARN_EVERY_S = 60.0
WAL_MAX_BYTES = 64 * 1024 * 1024
log = get_logger("store")

SCHEMA = """
CREATE TABLE IF NOT EXISTS rollouts (
    seq INTEGER PRIMARY KEY,                 -- creation order
    rollout_id TEXT NOT NULL UNIQUE,
    state TEXT NOT NULL,
    terminal_seq INTEGER,                    -- completion order, NULL until terminal
    data_id TEXT,
    is_train INTEGER NOT NULL,
    body BLOB NOT NULL                       -- the Rollout as JSON
);
CREATE INDEX IF NOT EXISTS rollouts_by_state ON rollouts(state, seq);
CREATE UNIQUE INDEX IF NOT EXISTS rollouts_by_completion ON rollouts(terminal_seq)
    WHERE terminal_seq IS NOT NULL;
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY,                 -- global append order
    rollout_id TEXT NOT NULL REFERENCES rollouts(rollout_id) ON DELETE CASCADE,
    attempt_id TEXT NOT NULL,
    event_type TEXT NOT NULL,
    ts REAL NOT NULL,
    data BLOB NOT NULL,
    triplet BLOB,
    prompt_key TEXT,
    call BLOB                                -- a model call stored as a delta (store/delta.py)
);
CREATE INDEX IF NOT EXISTS events_by_rollout ON events(rollout_id, attempt_id, seq);
CREATE TABLE IF NOT EXISTS routes (         -- MoE routes (R3) of a model call, dropped once superseded
    seq INTEGER PRIMARY KEY,                 -- the call's event
    rollout_id TEXT NOT NULL REFERENCES rollouts(rollout_id) ON DELETE CASCADE,
    body BLOB NOT NULL                       -- the routed_experts as JSON
);
CREATE INDEX IF NOT EXISTS routes_by_rollout ON routes(rollout_id);
CREATE TABLE IF NOT EXISTS models (
    model TEXT NOT NULL,
    endpoint TEXT NOT NULL,
    version INTEGER NOT NULL,
    lease_seconds REAL,                      -- a leased endpoint expires unless registered again
    expires_at REAL,
    PRIMARY KEY (model, endpoint)
);
CREATE TABLE IF NOT EXISTS status_changes (  -- the dashboard's status history of each rollout
    rollout_id TEXT NOT NULL REFERENCES rollouts(rollout_id) ON DELETE CASCADE,
    version INTEGER NOT NULL,
    state TEXT NOT NULL,
    at REAL NOT NULL,
    attempt_id TEXT,
    error_message TEXT,
    PRIMARY KEY (rollout_id, version)
);
CREATE INDEX IF NOT EXISTS status_changes_finished ON status_changes(at)
    WHERE state IN ('succeeded', 'failed');
CREATE TABLE IF NOT EXISTS runs (run_id TEXT PRIMARY KEY, updated_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS run_points (      -- training runs' metrics, one row a step
    run_id TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
    step INTEGER NOT NULL,
    at REAL NOT NULL,
    metrics BLOB NOT NULL,                   -- {name: value} as JSON
    PRIMARY KEY (run_id, step)
);
CREATE TABLE IF NOT EXISTS attempt_outcomes (  -- how each attempt ended (docs/reliability.md)
    rollout_id TEXT NOT NULL REFERENCES rollouts(rollout_id) ON DELETE CASCADE,
    attempt_id TEXT NOT NULL,
    outcome TEXT NOT NULL,
    strength INTEGER NOT NULL,               -- AttemptOutcome.rank: stronger evidence replaces weaker
    detail TEXT,
    at REAL NOT NULL,
    PRIMARY KEY (rollout_id, attempt_id)
);
"""
# Evidence replaces what an attempt holds only when stronger: one statement, so atomic.
UPSERT_OUTCOME = (
    "INSERT INTO attempt_outcomes(rollout_id, attempt_id, outcome, strength, detail, at) VALUES (?,?,?,?,?,?) "
    "ON CONFLICT(rollout_id, attempt_id) DO UPDATE SET outcome=excluded.outcome, "
    "strength=excluded.strength, detail=excluded.detail, at=excluded.at "
    "WHERE excluded.strength > attempt_outcomes.strength"
)
INSERT_STATUS_CHANGE = (
    "INSERT OR IGNORE INTO status_changes(rollout_id, version, state, at, attempt_id, error_message) "
    "VALUES (?,?,?,?,?,?)"
)


class StoreLocked(RuntimeError):
    pass


EVENT_COLUMNS = "seq, rollout_id, attempt_id, event_type, ts, data, triplet, prompt_key, call"
INSERT_EVENT = f"INSERT INTO events({EVENT_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?)"
EVENTS_PER_STATEMENT = 100  # 900 parameters: under any SQLite's limit (999)
IDS_PER_STATEMENT = 900


class _Writer(threading.Thread):
    """Runs write operations in batches, one transaction per batch.

    Event appends, the hot path, are queued as rows rather than callables, so that a run of
    them is inserted with one multi-row statement and their sequence numbers are assigned here.
    Every statement releases and re-takes the GIL, and while the event loop is busy re-taking
    it waits for the loop's thread; one statement per run of appends waits once, not per row.
    """

    def __init__(self, connect: Callable[[], sqlite3.Connection], next_seq: int) -> None:
        super().__init__(name="agl-sqlite-writer", daemon=True)
        self._connect = connect
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._next_seq = next_seq
        self.failure: BaseException | None = None

    def submit(
        self, op: Callable[[sqlite3.Connection], T] | tuple[Any, ...], savepoint: bool
    ) -> asyncio.Future[T]:
        """`op` is a function of the connection, or an event row (without its sequence)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        if self.failure is not None or not self.is_alive():
            future.set_exception(RuntimeError(f"the store's writer has stopped: {self.failure}"))
            return future
        self._queue.put((op, savepoint, future, loop))
        return future

    def stop(self) -> None:
        self._queue.put(None)

    def run(self) -> None:
        try:
            conn = self._connect()
        except BaseException as exc:  # reported to every later submit
            self.failure = exc
            return
        try:
            while True:
                item = self._queue.get()
                if item is None:
                    return
                batch = [item]
                while len(batch) < MAX_BATCH:
                    try:
                        nxt = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if nxt is None:
                        self._queue.put(None)  # finish this batch, then stop
                        break
                    batch.append(nxt)
                self._run_batch(conn, batch)
        finally:
            conn.close()

    def _run_batch(self, conn: sqlite3.Connection, batch: list[Any]) -> None:
        results: list[tuple[Any, BaseException | None]] = []
        next_seq = self._next_seq
        try:
            conn.execute("BEGIN IMMEDIATE")
            rows: list[tuple[Any, ...]] = []
            for op, savepoint, _, _ in batch:
                if isinstance(op, tuple):
                    rows.append(op)
                    continue
                if rows:
                    next_seq = self._insert_events(conn, rows, next_seq, results)
                    rows = []
                results.append(self._run_op(conn, op, savepoint))
            if rows:
                next_seq = self._insert_events(conn, rows, next_seq, results)
            conn.execute("COMMIT")
            self._next_seq = next_seq
        except Exception as failure:  # the whole transaction failed: nothing is acknowledged
            if conn.in_transaction:
                conn.rollback()
            results = [(None, failure)] * len(batch)
        by_loop: dict[asyncio.AbstractEventLoop, list[Any]] = {}
        for (_, _, future, loop), (value, exc) in zip(batch, results, strict=True):
            by_loop.setdefault(loop, []).append((future, value, exc))
        for loop, loop_results in by_loop.items():
            try:
                loop.call_soon_threadsafe(_settle, loop_results)
            except RuntimeError:  # that loop is closed; nobody waits any more
                pass

    @staticmethod
    def _run_op(
        conn: sqlite3.Connection, op: Callable[[sqlite3.Connection], Any], savepoint: bool
    ) -> tuple[Any, BaseException | None]:
        if savepoint:
            conn.execute("SAVEPOINT op")
        try:
            value = op(conn)
        except Exception as exc:
            if savepoint:
                conn.execute("ROLLBACK TO op")
                conn.execute("RELEASE op")
            return None, exc
        if savepoint:
            conn.execute("RELEASE op")
        return value, None

    @staticmethod
    def _insert_events(
        conn: sqlite3.Connection,
        rows: list[tuple[Any, ...]],
        next_seq: int,
        results: list[tuple[Any, BaseException | None]],
    ) -> int:
        for start in range(0, len(rows), EVENTS_PER_STATEMENT):
            chunk = rows[start : start + EVENTS_PER_STATEMENT]
            params = [v for i, row in enumerate(chunk) for v in (next_seq + i, *row)]
            marks = ",".join(["(?,?,?,?,?,?,?,?,?)"] * len(chunk))
            try:
                conn.execute(f"INSERT INTO events({EVENT_COLUMNS}) VALUES {marks}", params)
            except sqlite3.IntegrityError:
                # Some row names a rollout that does not exist (the statement inserted nothing):
                # redo them one by one.
                for row in chunk:
                    try:
                        conn.execute(INSERT_EVENT, (next_seq, *row))
                    except sqlite3.IntegrityError:
                        results.append((None, RolloutNotFound(row[0])))
                    else:
                        results.append((next_seq, None))
                        next_seq += 1
            else:
                results.extend((next_seq + i, None) for i in range(len(chunk)))
                next_seq += len(chunk)
        return next_seq


class _Checkpointer(threading.Thread):
    """Folds the WAL into the database file in the background, off the writers' path.

    A PASSIVE checkpoint never waits, but under continuous writes it never catches up with
    the writer either, and SQLite restarts the WAL from its beginning only after a checkpoint
    that copied all of it: the file would grow for ever. So once the WAL passes `max_bytes`
    a TRUNCATE checkpoint holds new writers back for a moment (at most `busy_ms`), copies the
    rest and empties the file. A checkpoint that cannot finish (a reader still on an old
    snapshot) or fails is logged, and the next round tries again: this thread never stops
    before the store closes.
    """

    def __init__(
        self,
        connect: Callable[[], sqlite3.Connection],
        wal_path: Path,
        max_bytes: int,
        interval_s: float = CHECKPOINT_INTERVAL_S,
        busy_ms: int = CHECKPOINT_BUSY_MS,
    ) -> None:
        super().__init__(name="agl-sqlite-checkpoint", daemon=True)
        self._connect = connect
        self._wal_path = wal_path
        self._max_bytes = max_bytes
        self._interval_s = interval_s
        self._busy_ms = busy_ms
        self._stop_event = threading.Event()
        self._conn: sqlite3.Connection | None = None
        self.failures = 0  # checkpoints in a row that did not finish: read by tests and logs
        self.truncations = 0  # WAL files emptied
        self._last_warning = 0.0

    def stop(self) -> None:
        self._stop_event.set()

    def wal_bytes(self) -> int:
        try:
            return self._wal_path.stat().st_size
        except FileNotFoundError:
            return 0

    def run(self) -> None:
        try:
            while not self._stop_event.wait(self._interval_s):
                self._round(truncate=self.wal_bytes() > self._max_bytes)
            self._round(truncate=True)  # leave an empty WAL behind
        finally:
            if self._conn is not None:
                self._conn.close()

    def _round(self, truncate: bool) -> None:
        mode = "TRUNCATE" if truncate else "PASSIVE"
        try:
            if self._conn is None:
                self._conn = self._connect()
                self._conn.execute(f"PRAGMA busy_timeout={self._busy_ms}")
            busy, wal_frames, copied = self._conn.execute(f"PRAGMA wal_checkpoint({mode})").fetchone()
        except sqlite3.Error as exc:
            if self._conn is not None:  # start afresh: the connection may be what is broken
                self._conn.close()
                self._conn = None
            self._failed(mode, f"{type(exc).__name__}: {exc}")
            return
        # A PASSIVE checkpoint that is behind is normal under load; a TRUNCATE one must finish.
        if truncate and (busy or wal_frames != 0):
            self._failed(mode, f"blocked by a reader or writer ({copied} of {wal_frames} frames copied)")
            return
        if truncate:
            self.truncations += 1
        if self.failures:
            log.info("wal_checkpoint_recovered", after_failures=self.failures, wal_bytes=self.wal_bytes())
        self.failures = 0

    def _failed(self, mode: str, reason: str) -> None:
        self.failures += 1
        now = time.monotonic()
        if self.failures == 1 or now - self._last_warning >= CHECKPOINT_WARN_EVERY_S:
            self._last_warning = now
            log.warning(
                "wal_checkpoint_failed",
                mode=mode,
                reason=reason,
                failures_in_a_row=self.failures,
                wal_bytes=self.wal_bytes(),
                path=str(self._wal_path),
            )


def _settle(results: list[tuple[asyncio.Future[Any], Any, BaseException | None]]) -> None:
    for future, value, exc in results:
        if future.done():
            continue
        if exc is None:
            future.set_result(value)
        else:
            future.set_exception(exc)


class SqliteStore(Store):
    def __init__(
        self,
        path: str | os.PathLike[str],
        synchronous: str = "normal",
        read_threads: int = 4,
        wal_max_bytes: int = WAL_MAX_BYTES,
    ) -> None:
        self.path = Path(path)
        if synchronous.lower() not in ("normal", "full"):
            raise ValueError(f"store.synchronous must be 'normal' or 'full', got {synchronous!r}")
        if wal_max_bytes <= 0:
            raise ValueError(f"store.wal_max_bytes must be positive, got {wal_max_bytes}")
        self.wal_max_bytes = wal_max_bytes
        self._synchronous = synchronous.upper()
        self._read_threads = read_threads
        self._writer: _Writer | None = None
        self._checkpointer: _Checkpointer | None = None
        self._readers: ThreadPoolExecutor | None = None
        self._reader_local = threading.local()
        self._reader_conns: list[sqlite3.Connection] = []
        self._lock_fd: int | None = None
        self._next_terminal = 1  # touched only by the writer thread after open()
        self._calls = CallIndex()  # touched only on the event loop

    # --- lifecycle ------------------------------------------------------------------------

    def _connect(self, readonly: bool = False) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=30)
        conn.execute("PRAGMA foreign_keys=ON")
        conn.execute(f"PRAGMA synchronous={self._synchronous}")
        conn.execute("PRAGMA wal_autocheckpoint=0")  # the checkpointer thread does it
        # When the WAL restarts from its beginning, cut the file back to this size.
        conn.execute(f"PRAGMA journal_size_limit={self.wal_max_bytes}")
        # Some builds (Debian's) zero every freed page on delete; FAST only overwrites in place.
        conn.execute("PRAGMA secure_delete=FAST")
        if readonly:
            conn.execute("PRAGMA query_only=ON")
        return conn

    async def open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock_fd = os.open(f"{self.path}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            self._lock_fd = None
            raise StoreLocked(
                f"another process (an agl-server?) is using the store {self.path}; "
                "stop it or set store.url to another file"
            ) from None
        init = self._connect()
        try:
            version = init.execute("PRAGMA user_version").fetchone()[0]
            has_tables = init.execute("SELECT count(*) FROM sqlite_master WHERE name='rollouts'").fetchone()[
                0
            ]
            if has_tables and version not in (1, 2, 3, 4, SCHEMA_VERSION):
                raise RuntimeError(
                    f"{self.path} has store schema version {version}, this Gateway needs {SCHEMA_VERSION}"
                )
            init.execute("PRAGMA journal_mode=WAL")
            if has_tables and version == 1:  # its events stay as they are: stored whole
                init.execute("ALTER TABLE events ADD COLUMN call BLOB")
            model_columns = {r[1] for r in init.execute("PRAGMA table_info(models)")}
            if has_tables and "expires_at" not in model_columns:  # schema 4 and before: no leases
                init.execute("ALTER TABLE models ADD COLUMN lease_seconds REAL")
                init.execute("ALTER TABLE models ADD COLUMN expires_at REAL")
            init.executescript(SCHEMA)
            init.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            last = init.execute("SELECT max(terminal_seq) FROM rollouts").fetchone()[0]
            self._next_terminal = (last or 0) + 1
            last_event = init.execute("SELECT max(seq) FROM events").fetchone()[0]
        finally:
            init.close()
        self._writer = _Writer(self._connect, next_seq=(last_event or 0) + 1)
        self._writer.start()
        self._checkpointer = _Checkpointer(self._connect, Path(f"{self.path}-wal"), self.wal_max_bytes)
        self._checkpointer.start()
        self._readers = ThreadPoolExecutor(
            max_workers=self._read_threads, thread_name_prefix="agl-sqlite-read"
        )

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.stop()
            await asyncio.to_thread(self._writer.join)
            self._writer = None
        if self._checkpointer is not None:
            self._checkpointer.stop()
            await asyncio.to_thread(self._checkpointer.join)
            self._checkpointer = None
        if self._readers is not None:
            self._readers.shutdown(wait=True)
            self._readers = None
        for conn in self._reader_conns:
            conn.close()
        self._reader_conns.clear()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    # --- plumbing -------------------------------------------------------------------------

    def _write(
        self, op: Callable[[sqlite3.Connection], T] | tuple[Any, ...], savepoint: bool = True
    ) -> asyncio.Future[T]:
        if self._writer is None:
            raise RuntimeError("the store is not open")
        return self._writer.submit(op, savepoint)

    def _reader(self) -> sqlite3.Connection:
        conn = getattr(self._reader_local, "conn", None)
        if conn is None:
            conn = self._connect(readonly=True)
            self._reader_local.conn = conn
            self._reader_conns.append(conn)
        return conn

    async def _read(self, op: Callable[[sqlite3.Connection], T]) -> T:
        if self._readers is None:
            raise RuntimeError("the store is not open")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._readers, lambda: op(self._reader()))

    # --- rollouts -------------------------------------------------------------------------

    async def create_rollouts(self, rollouts: list[Rollout]) -> list[Rollout]:
        rows = [
            (
                r.rollout_id,
                r.status.state.value,
                group_id_of(r),
                int(r.is_train),
                r.model_dump_json().encode(),
            )
            for r in rollouts
        ]

        def op(conn: sqlite3.Connection) -> list[Rollout]:
            out = []
            for rollout, row in zip(rollouts, rows, strict=True):
                cur = conn.execute(
                    "INSERT INTO rollouts(rollout_id, state, data_id, is_train, body) VALUES (?,?,?,?,?) "
                    "ON CONFLICT(rollout_id) DO NOTHING",
                    row,
                )
                if cur.rowcount:
                    out.append(rollout)
                    conn.execute(INSERT_STATUS_CHANGE, status_row(rollout))
                else:
                    body = conn.execute("SELECT body FROM rollouts WHERE rollout_id=?", (row[0],)).fetchone()[
                        0
                    ]
                    out.append(Rollout.model_validate_json(body))
            return out

        return await self._write(op)

    async def get_rollout(self, rollout_id: str) -> Rollout | None:
        row = await self._read(
            lambda c: c.execute("SELECT body FROM rollouts WHERE rollout_id=?", (rollout_id,)).fetchone()
        )
        return Rollout.model_validate_json(row[0]) if row else None

    async def list_rollouts(self, states: Collection[RolloutState] | None, limit: int) -> list[Rollout]:
        args: list[int | str]
        if states is None:
            sql, args = "SELECT body FROM rollouts ORDER BY seq LIMIT ?", [limit]
        else:
            marks = ",".join("?" * len(states))
            sql = f"SELECT body FROM rollouts WHERE state IN ({marks}) ORDER BY seq LIMIT ?"
            args = [s.value for s in states] + [limit]
        rows = await self._read(lambda c: c.execute(sql, args).fetchall())
        return [Rollout.model_validate_json(r[0]) for r in rows]

    async def page_rollouts(
        self,
        states: Collection[RolloutState] | None,
        is_train: bool | None,
        search: str,
        offset: int,
        limit: int,
    ) -> tuple[int, list[Rollout]]:
        where: list[str] = ["1"]
        args: list[int | str] = []
        if states is not None:
            where.append(f"state IN ({','.join('?' * len(states))})")
            args += [s.value for s in states]
        if is_train is not None:
            where.append("is_train=?")
            args.append(int(is_train))
        if search:
            pattern = "%" + search.lower().replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
            where.append(
                "(lower(rollout_id) LIKE ? ESCAPE '\\' OR lower(coalesce(data_id, '')) LIKE ? ESCAPE '\\')"
            )
            args += [pattern, pattern]
        condition = " AND ".join(where)

        def query(c: sqlite3.Connection) -> tuple[int, list[bytes]]:
            total = c.execute(f"SELECT count(*) FROM rollouts WHERE {condition}", args).fetchone()[0]
            rows = c.execute(
                f"SELECT body FROM rollouts WHERE {condition} ORDER BY seq DESC LIMIT ? OFFSET ?",
                [*args, limit, offset],
            ).fetchall()
            return total, [r[0] for r in rows]

        total, bodies = await self._read(query)
        return total, [Rollout.model_validate_json(b) for b in bodies]

    async def count_by_state(self) -> dict[str, int]:
        rows = await self._read(
            lambda c: c.execute("SELECT state, count(*) FROM rollouts GROUP BY state").fetchall()
        )
        return {state: n for state, n in rows}

    async def patch_rollout(self, rollout_id: str, patch: RolloutStatusPatch, now: float) -> Rollout:
        def op(conn: sqlite3.Connection) -> Rollout:
            row = conn.execute("SELECT body FROM rollouts WHERE rollout_id=?", (rollout_id,)).fetchone()
            if row is None:
                raise RolloutNotFound(rollout_id)
            current = Rollout.model_validate_json(row[0])
            updated = apply_patch(current, patch, now)
            terminal_seq = None
            if updated.status.state.is_terminal and not current.status.state.is_terminal:
                terminal_seq = self._next_terminal
                self._next_terminal += 1
            conn.execute(
                "UPDATE rollouts SET state=?, body=?, terminal_seq=coalesce(?, terminal_seq) WHERE rollout_id=?",
                (updated.status.state.value, updated.model_dump_json().encode(), terminal_seq, rollout_id),
            )
            if updated.status.version <= MAX_STATUS_CHANGES:
                conn.execute(INSERT_STATUS_CHANGE, status_row(updated))
            return updated

        return await self._write(op, savepoint=False)

    async def delete_rollout(self, rollout_id: str) -> bool:
        self._calls.forget(rollout_id)  # before the delete is queued: later appends land after it

        def op(conn: sqlite3.Connection) -> bool:
            return conn.execute("DELETE FROM rollouts WHERE rollout_id=?", (rollout_id,)).rowcount > 0

        return await self._write(op)

    async def list_terminal(self, after: int, limit: int) -> TerminalPage:
        def op(conn: sqlite3.Connection) -> tuple[list[Any], int]:
            rows = conn.execute(
                "SELECT terminal_seq, rollout_id, state, data_id, is_train FROM rollouts "
                "WHERE terminal_seq > ? ORDER BY terminal_seq LIMIT ?",
                (after, limit),
            ).fetchall()
            total = conn.execute("SELECT count(*) FROM rollouts WHERE terminal_seq IS NOT NULL").fetchone()[0]
            return rows, total

        rows, total = await self._read(op)
        items = [
            TerminalItem(rollout_id=r[1], state=r[2], data_id=r[3] or "", is_train=bool(r[4])) for r in rows
        ]
        return TerminalPage(items=items, next_after=rows[-1][0] if rows else after, total_terminal=total)

    # --- events ---------------------------------------------------------------------------

    async def append_event(self, record: EventRecord) -> int:
        pending = None
        if isinstance(record.call, CallDraft):
            record, pending = self._calls.encode(record, record.call)
        row = (
            record.rollout_id,
            record.attempt_id,
            record.event_type,
            record.timestamp,
            record.data,
            record.triplet,
            record.prompt_key,
            record.call,
        )
        seq: int = await self._write(row)  # an event row: the writer answers its sequence number
        if pending is not None:
            self._calls.remember(pending, seq)
        return seq

    async def list_events(
        self,
        rollout_id: str,
        attempt_id: str | None = None,
        event_type: str | None = None,
        view: View = "data",
    ) -> list[StoredEvent]:
        payload = "data, NULL" if view == "data" else "x'', triplet"
        sql = f"SELECT seq, attempt_id, event_type, ts, {payload}, prompt_key, call FROM events WHERE rollout_id=?"
        args: list[Any] = [rollout_id]
        if attempt_id is not None:
            sql += " AND attempt_id=?"
            args.append(attempt_id)
        if event_type is not None:
            sql += " AND event_type=?"
            args.append(event_type)
        if view != "data":
            sql += " AND triplet IS NOT NULL"
        sql += " ORDER BY seq"

        def op(c: sqlite3.Connection) -> list[StoredEvent]:
            rows = c.execute(sql, args).fetchall()
            events = [
                StoredEvent(r[0], EventRecord(rollout_id, r[1], r[2], r[3], r[4], r[5], r[6], r[7]))
                for r in rows
            ]
            return materialize(events, view)

        return await self._read(op)

    async def put_routes(self, rollout_id: str, sequence: int, routes: bytes, drop: list[int]) -> None:
        def op(conn: sqlite3.Connection) -> None:
            if drop:
                marks = ",".join("?" * len(drop))
                conn.execute(f"DELETE FROM routes WHERE seq IN ({marks})", drop)
            try:
                conn.execute(
                    "INSERT OR REPLACE INTO routes(seq, rollout_id, body) VALUES (?,?,?)",
                    (sequence, rollout_id, routes),
                )
            except sqlite3.IntegrityError:
                raise RolloutNotFound(rollout_id) from None

        await self._write(op, savepoint=True)

    async def get_routes(self, rollout_id: str) -> dict[int, bytes]:
        def op(c: sqlite3.Connection) -> dict[int, bytes]:
            rows = c.execute("SELECT seq, body FROM routes WHERE rollout_id=?", (rollout_id,)).fetchall()
            return {seq: bytes(body) for seq, body in rows}

        return await self._read(op)

    async def list_attempts(self, rollout_id: str) -> list[AttemptStats]:
        rows = await self._read(
            lambda c: c.execute(
                "SELECT attempt_id, count(*), min(ts), max(ts) FROM events WHERE rollout_id=? "
                "GROUP BY attempt_id ORDER BY min(seq)",
                (rollout_id,),
            ).fetchall()
        )
        return [AttemptStats(*r) for r in rows]

    async def record_outcome(
        self, rollout_id: str, attempt_id: str, outcome: AttemptOutcome, detail: str | None, now: float
    ) -> Outcome:
        def op(conn: sqlite3.Connection) -> Outcome:
            try:
                conn.execute(
                    UPSERT_OUTCOME, (rollout_id, attempt_id, outcome.value, outcome.rank, detail, now)
                )
            except sqlite3.IntegrityError:
                raise RolloutNotFound(rollout_id) from None
            held, held_detail = conn.execute(
                "SELECT outcome, detail FROM attempt_outcomes WHERE rollout_id=? AND attempt_id=?",
                (rollout_id, attempt_id),
            ).fetchone()
            return AttemptOutcome(held), held_detail

        return await self._write(op, savepoint=True)

    async def list_outcomes(self, rollout_ids: Collection[str]) -> dict[tuple[str, str], Outcome]:
        ids = list(rollout_ids)

        def op(c: sqlite3.Connection) -> list[Any]:
            rows: list[Any] = []
            for start in range(0, len(ids), IDS_PER_STATEMENT):
                chunk = ids[start : start + IDS_PER_STATEMENT]
                rows += c.execute(
                    "SELECT rollout_id, attempt_id, outcome, detail FROM attempt_outcomes "
                    f"WHERE rollout_id IN ({','.join('?' * len(chunk))})",
                    chunk,
                ).fetchall()
            return rows

        rows = await self._read(op) if ids else []
        return {(r[0], r[1]): (AttemptOutcome(r[2]), r[3]) for r in rows}

    # --- models ---------------------------------------------------------------------------

    async def upsert_models(self, models: list[Model]) -> list[Model]:
        rows = [(m.model, m.endpoint, m.version, m.lease_seconds, m.expires_at) for m in models]

        def op(conn: sqlite3.Connection) -> None:
            conn.executemany(
                "INSERT INTO models(model, endpoint, version, lease_seconds, expires_at) VALUES (?,?,?,?,?) "
                "ON CONFLICT(model, endpoint) DO UPDATE SET version=excluded.version, "
                "lease_seconds=excluded.lease_seconds, expires_at=excluded.expires_at",
                rows,
            )

        await self._write(op)
        return models

    async def list_models(self) -> list[Model]:
        rows = await self._read(
            lambda c: c.execute(
                "SELECT model, endpoint, version, lease_seconds, expires_at FROM models"
            ).fetchall()
        )
        return [
            Model(model=r[0], endpoint=r[1], version=r[2], lease_seconds=r[3], expires_at=r[4]) for r in rows
        ]

    async def delete_models(self) -> None:
        await self._write(lambda conn: conn.execute("DELETE FROM models") and None)

    # --- the dashboard's views --------------------------------------------------------------

    async def status_history(self, rollout_id: str) -> list[dict[str, Any]]:
        rows = await self._read(
            lambda c: c.execute(
                "SELECT state, version, at, attempt_id, error_message FROM status_changes "
                "WHERE rollout_id=? ORDER BY version",
                (rollout_id,),
            ).fetchall()
        )
        keys = ("state", "version", "at", "attempt_id", "error_message")
        return [dict(zip(keys, row, strict=True)) for row in rows]

    async def count_finished_since(self, since: float) -> int:
        n: int = await self._read(
            lambda c: c.execute(
                "SELECT count(*) FROM status_changes WHERE state IN ('succeeded', 'failed') AND at >= ?",
                (since,),
            ).fetchone()[0]
        )
        return n

    async def add_run_points(self, run_id: str, points: list[MetricPoint]) -> int:
        at = time.time()
        rows = [(p.step, p.time if p.time is not None else at, orjson.dumps(p.metrics)) for p in points]

        def op(conn: sqlite3.Connection) -> int:
            conn.execute(
                "INSERT INTO runs(run_id, updated_at) VALUES (?,?) "
                "ON CONFLICT(run_id) DO UPDATE SET updated_at=excluded.updated_at",
                (run_id, at),
            )
            for step, when, metrics in rows:
                conn.execute("DELETE FROM run_points WHERE run_id=? AND step>=?", (run_id, step))
                conn.execute("INSERT INTO run_points VALUES (?,?,?,?)", (run_id, step, when, metrics))
            n: int = conn.execute("SELECT count(*) FROM run_points WHERE run_id=?", (run_id,)).fetchone()[0]
            if n > MAX_POINTS_PER_RUN:
                conn.execute(
                    "DELETE FROM run_points WHERE run_id=? AND step IN "
                    "(SELECT step FROM run_points WHERE run_id=? ORDER BY step LIMIT ?)",
                    (run_id, run_id, n - MAX_POINTS_PER_RUN),
                )
                n = MAX_POINTS_PER_RUN
            conn.execute(
                "DELETE FROM runs WHERE run_id IN "
                "(SELECT run_id FROM runs ORDER BY updated_at DESC LIMIT -1 OFFSET ?)",
                (MAX_RUNS,),
            )
            return n

        return await self._write(op)

    async def list_runs(self) -> list[RunSummary]:
        def op(c: sqlite3.Connection) -> tuple[list[Any], list[Any]]:
            runs = c.execute(
                "SELECT r.run_id, r.updated_at, count(p.step), max(p.step) FROM runs r "
                "LEFT JOIN run_points p ON p.run_id = r.run_id GROUP BY r.run_id ORDER BY r.updated_at DESC"
            ).fetchall()
            last = [  # each run's last points, off the (run_id, step) key: not a scan of every point
                (run_id, metrics)
                for run_id, *_ in runs
                for (metrics,) in c.execute(
                    "SELECT metrics FROM run_points WHERE run_id=? ORDER BY step DESC LIMIT ?",
                    (run_id, RUN_KEYS_FROM),
                )
            ]
            return runs, last

        runs, last = await self._read(op)
        return run_summaries(runs, last)

    async def run_points(self, run_id: str, after_step: int = -1) -> list[MetricPoint] | None:
        def op(c: sqlite3.Connection) -> list[Any] | None:
            if c.execute("SELECT 1 FROM runs WHERE run_id=?", (run_id,)).fetchone() is None:
                return None
            return c.execute(
                "SELECT step, at, metrics FROM run_points WHERE run_id=? AND step>? ORDER BY step",
                (run_id, after_step),
            ).fetchall()

        rows = await self._read(op)
        return None if rows is None else metric_points(rows)
