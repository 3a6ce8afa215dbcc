"""PostgreSQL store: several Gateway replicas on one database act as one Gateway.

asyncpg (measured against psycopg 3 on this machine: ~1.5x the single-row inserts and selects per
second) with a connection pool. Concurrent event appends of one replica share one transaction
and one multi-row insert (group commit), as the SQLite store's writer does. Every change other
replicas must see (a rollout created, patched or deleted, the model table, the proxy's pause
state) sends a NOTIFY in its own transaction, so it is delivered only once committed;
`watch()` hands them to the Gateway (server/replicas.py).

The schema is versioned (`agl_schema`) and migrated under an advisory lock, so replicas that
start together migrate once. Losing the database raises `StoreUnavailable` (a 503 with
Retry-After, never a bare 500); the pool drops its dead connections and reconnects on use.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable, Collection
from functools import partial
from typing import Any, TypeVar

import asyncpg
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
    StoreUnavailable,
    apply_patch,
    group_id_of,
    status_row,
)
from agentlightning.server.store.delta import CallDraft, CallIndex, View, bases_of, materialize
from agentlightning.server.store.runs import metric_points, run_summaries

T = TypeVar("T")
log = get_logger("store")
CHANNEL = "agl_changes"
DEAD_REPLICA_S = 600.0  # a replica row unseen this long is purged (a killed replica leaves its row)
MIGRATION_LOCK = 0x61676C  # advisory lock id: one replica migrates at a time
MAX_BATCH = 1024

# Each entry migrates from the previous version; never edit one that has shipped, add the next.
MIGRATIONS: list[str] = [
    """
    CREATE TABLE rollouts (
        seq bigserial PRIMARY KEY,                 -- creation order
        rollout_id text NOT NULL UNIQUE,
        state text NOT NULL,
        terminal_seq bigint,                       -- completion order, NULL until terminal
        data_id text,
        is_train boolean NOT NULL,
        body bytea NOT NULL                        -- the Rollout as JSON
    );
    CREATE INDEX rollouts_by_state ON rollouts(state, seq);
    CREATE UNIQUE INDEX rollouts_by_completion ON rollouts(terminal_seq) WHERE terminal_seq IS NOT NULL;
    CREATE TABLE events (
        seq bigserial PRIMARY KEY,                 -- global append order
        rollout_id text NOT NULL REFERENCES rollouts(rollout_id) ON DELETE CASCADE,
        attempt_id text NOT NULL,
        event_type text NOT NULL,
        ts double precision NOT NULL,
        data bytea NOT NULL,
        triplet bytea,
        prompt_key text,
        call bytea                                 -- a model call stored as a delta (store/delta.py)
    );
    CREATE INDEX events_by_rollout ON events(rollout_id, attempt_id, seq);
    CREATE TABLE routes (
        seq bigint PRIMARY KEY,
        rollout_id text NOT NULL REFERENCES rollouts(rollout_id) ON DELETE CASCADE,
        body bytea NOT NULL
    );
    CREATE INDEX routes_by_rollout ON routes(rollout_id);
    CREATE TABLE models (
        model text NOT NULL,
        endpoint text NOT NULL,
        version bigint NOT NULL,
        PRIMARY KEY (model, endpoint)
    );
    -- Completion order is handed out under this row's lock, held until commit: numbers commit
    -- in order, so a terminal cursor never skips one that commits late.
    CREATE TABLE counters (name text PRIMARY KEY, value bigint NOT NULL);
    INSERT INTO counters VALUES ('terminal', 0);
    CREATE TABLE proxy_state (
        id integer PRIMARY KEY CHECK (id = 1),
        paused boolean NOT NULL,
        retry_after_seconds double precision NOT NULL,
        reason text,
        epoch bigint NOT NULL                      -- + 1 at every pause and resume
    );
    INSERT INTO proxy_state VALUES (1, false, 5.0, NULL, 0);
    CREATE TABLE replicas (
        replica_id text PRIMARY KEY,
        inflight bigint NOT NULL,
        epoch_seen bigint NOT NULL,                -- the proxy_state epoch this replica applies
        seen_at timestamptz NOT NULL
    );
    """,
    # 2: the dashboard's views, shared by the replicas: status history and training runs' metrics
    """
    CREATE TABLE status_changes (
        rollout_id text NOT NULL REFERENCES rollouts(rollout_id) ON DELETE CASCADE,
        version integer NOT NULL,
        state text NOT NULL,
        at double precision NOT NULL,
        attempt_id text,
        error_message text,
        PRIMARY KEY (rollout_id, version)
    );
    CREATE INDEX status_changes_finished ON status_changes(at) WHERE state IN ('succeeded', 'failed');
    CREATE TABLE runs (run_id text PRIMARY KEY, updated_at double precision NOT NULL);
    CREATE TABLE run_points (
        run_id text NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
        step bigint NOT NULL,
        at double precision NOT NULL,
        metrics bytea NOT NULL,                    -- {name: value} as JSON
        PRIMARY KEY (run_id, step)
    );
    """,
    # 3: how each attempt ended (docs/reliability.md)
    """
    CREATE TABLE attempt_outcomes (
        rollout_id text NOT NULL REFERENCES rollouts(rollout_id) ON DELETE CASCADE,
        attempt_id text NOT NULL,
        outcome text NOT NULL,
        strength integer NOT NULL,                 -- AttemptOutcome.rank: stronger replaces weaker
        detail text,
        at double precision NOT NULL,
        PRIMARY KEY (rollout_id, attempt_id)
    );
    """,
    # 4: leased model endpoints (a trainer renews its own; a killed trainer's expire)
    """
    ALTER TABLE models ADD COLUMN lease_seconds double precision;
    ALTER TABLE models ADD COLUMN expires_at double precision;
    """,
]


class StaleBase(RuntimeError):
    """A call stored as a delta against calls that are gone (their rollout was deleted)."""


async def _check_bases(conn: asyncpg.Connection, bases: list[int]) -> None:
    """After the insert, in its transaction: the calls the new ones refer to still exist. After,
    not before: the insert found the rollout's row, so a delete of its earlier incarnation had
    committed and is seen here."""
    if bases:
        found = await conn.fetchval("SELECT count(*) FROM events WHERE seq = ANY($1::bigint[])", bases)
        if found != len(bases):
            raise StaleBase("a stored call refers to calls of a deleted rollout")


INSERT_STATUS_CHANGE = (
    "INSERT INTO status_changes(rollout_id, version, state, at, attempt_id, error_message) "
    "VALUES ($1,$2,$3,$4,$5,$6) ON CONFLICT DO NOTHING"
)


_CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    asyncio.TimeoutError,
    asyncpg.PostgresConnectionError,
    asyncpg.CannotConnectNowError,
    asyncpg.InterfaceError,
    asyncpg.AdminShutdownError,
    asyncpg.CrashShutdownError,
)


def _is_connection_error(exc: BaseException) -> bool:
    return isinstance(exc, _CONNECTION_ERRORS)


class PostgresStore(Store):
    shared = True  # other processes write to it too: caches must listen (server/replicas.py)

    def __init__(self, url: str, pool_size: int = 10) -> None:
        if pool_size < 2:
            raise ValueError(f"store.pool_size must be at least 2, got {pool_size}")
        self.url = url
        self.pool_size = pool_size
        self.replica_id = uuid.uuid4().hex[:12]
        self._pool: asyncpg.Pool | None = None
        self._calls = CallIndex()
        self._pending: list[tuple[EventRecord, asyncio.Future[int]]] = []
        self._flusher: asyncio.Task[None] | None = None
        self._watchers: list[Callable[[str, str], None]] = []
        self._listener: asyncio.Task[None] | None = None
        self._closing = False

    # --- lifecycle ------------------------------------------------------------------------

    async def open(self) -> None:
        self._closing = False
        try:
            conn = await asyncpg.connect(self.url, timeout=10)
        except Exception as exc:
            if _is_connection_error(exc):
                raise StoreUnavailable(f"cannot reach the database: {exc}") from exc
            raise
        try:
            await self._migrate(conn)
        finally:
            await conn.close()
        self._pool = await asyncpg.create_pool(
            self.url, min_size=1, max_size=self.pool_size, timeout=10, command_timeout=60
        )
        self._listener = asyncio.create_task(self._listen(), name="agl-pg-listen")

    async def _migrate(self, conn: asyncpg.Connection) -> None:
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock($1)", MIGRATION_LOCK)
            await conn.execute("CREATE TABLE IF NOT EXISTS agl_schema (version integer NOT NULL)")
            version = await conn.fetchval("SELECT max(version) FROM agl_schema") or 0
            if version > len(MIGRATIONS):
                raise RuntimeError(
                    f"the database has store schema version {version}, this Gateway knows {len(MIGRATIONS)}: "
                    "upgrade the Gateway"
                )
            for number in range(version + 1, len(MIGRATIONS) + 1):
                await conn.execute(MIGRATIONS[number - 1])
                await conn.execute("INSERT INTO agl_schema(version) VALUES ($1)", number)
                log.info("store_migrated", version=number)

    async def close(self) -> None:
        self._closing = True
        if self._flusher is not None:
            await asyncio.gather(self._flusher, return_exceptions=True)
        if self._listener is not None:
            self._listener.cancel()
            await asyncio.gather(self._listener, return_exceptions=True)
            self._listener = None
        if self._pool is not None:
            await self._pool.close()
            self._pool = None

    # --- change feed ----------------------------------------------------------------------

    def watch(self, on_change: Callable[[str, str], None]) -> None:
        """Call `on_change(kind, subject)` for each change another replica committed, and
        `("resync", "")` after the feed was lost for a while (changes may have been missed)."""
        self._watchers.append(on_change)

    def _deliver(self, kind: str, subject: str) -> None:
        for watcher in self._watchers:
            try:
                watcher(kind, subject)
            except Exception:
                log.exception("change_watcher_failed", kind=kind)

    async def _listen(self) -> None:
        """Keep one connection LISTENing; reconnect with backoff when it is lost."""
        backoff = 0.1
        first = True
        while not self._closing:
            lost = asyncio.Event()
            try:
                conn = await asyncpg.connect(self.url, timeout=10)
            except Exception as exc:
                if not _is_connection_error(exc):
                    log.exception("listen_connect_failed")
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
                continue
            try:
                conn.add_termination_listener(lambda _c, lost=lost: lost.set())
                await conn.add_listener(CHANNEL, self._on_notify)
                if not first:
                    log.info("change_feed_reconnected")
                    self._calls = CallIndex()  # a delete may have been missed
                    self._deliver("resync", "")
                first, backoff = False, 0.1
                while not lost.is_set() and not conn.is_closed():
                    try:
                        await asyncio.wait_for(lost.wait(), 1.0)
                    except TimeoutError:
                        try:  # a server that vanished without closing the socket
                            await conn.execute("SELECT 1", timeout=5)
                        except Exception:
                            break
            except Exception as exc:
                if not _is_connection_error(exc):
                    log.exception("listen_failed")
            finally:
                conn.terminate()
            if not self._closing:
                log.warning("change_feed_lost")
                self._deliver("resync", "")  # whatever changed meanwhile is unknown here

    def _on_notify(self, _conn: Any, _pid: int, _channel: str, payload: str) -> None:
        origin, _, rest = payload.partition(" ")
        if origin == self.replica_id:
            return
        kind, _, subject = rest.partition(" ")
        if kind == "delete":
            self._calls.forget(subject)
        self._deliver(kind, subject)

    async def _notify(self, conn: asyncpg.Connection, kind: str, subject: str = "") -> None:
        await conn.execute("SELECT pg_notify($1, $2)", CHANNEL, f"{self.replica_id} {kind} {subject}")

    # --- plumbing -------------------------------------------------------------------------

    async def _run(self, op: Callable[[asyncpg.Connection], Awaitable[T]], write: bool) -> T:
        """Run `op` on a pooled connection (in a transaction when `write`). A lost connection
        is retried once for reads (a pooled connection may predate a database restart); then
        StoreUnavailable."""
        if self._pool is None:
            raise RuntimeError("the store is not open")
        tries = 1 if write else 2
        for attempt in range(tries):
            try:
                async with self._pool.acquire() as conn:
                    if write:
                        async with conn.transaction():
                            return await op(conn)
                    return await op(conn)
            except Exception as exc:
                if not _is_connection_error(exc):
                    raise
                self._pool.expire_connections()
                if attempt + 1 == tries:
                    raise StoreUnavailable(
                        f"the database is unreachable: {type(exc).__name__}: {exc}"
                    ) from exc
        raise AssertionError("unreachable")

    def _read(self, op: Callable[[asyncpg.Connection], Awaitable[T]]) -> Awaitable[T]:
        return self._run(op, write=False)

    def _write(self, op: Callable[[asyncpg.Connection], Awaitable[T]]) -> Awaitable[T]:
        return self._run(op, write=True)

    # --- rollouts -------------------------------------------------------------------------

    async def create_rollouts(self, rollouts: list[Rollout]) -> list[Rollout]:
        rows = [
            (r.rollout_id, r.status.state.value, group_id_of(r), r.is_train, r.model_dump_json().encode())
            for r in rollouts
        ]

        async def op(conn: asyncpg.Connection) -> list[Rollout]:
            out = []
            for rollout, row in zip(rollouts, rows, strict=True):
                inserted = await conn.fetchval(
                    "INSERT INTO rollouts(rollout_id, state, data_id, is_train, body) VALUES ($1,$2,$3,$4,$5) "
                    "ON CONFLICT (rollout_id) DO NOTHING RETURNING seq",
                    *row,
                )
                if inserted is not None:
                    out.append(rollout)
                    await conn.execute(INSERT_STATUS_CHANGE, *status_row(rollout))
                else:
                    body = await conn.fetchval("SELECT body FROM rollouts WHERE rollout_id=$1", row[0])
                    out.append(Rollout.model_validate_json(body))
            await self._notify(conn, "rollouts")
            return out

        return await self._write(op)

    async def get_rollout(self, rollout_id: str) -> Rollout | None:
        body = await self._read(
            lambda c: c.fetchval("SELECT body FROM rollouts WHERE rollout_id=$1", rollout_id)
        )
        return Rollout.model_validate_json(body) if body is not None else None

    async def list_rollouts(self, states: Collection[RolloutState] | None, limit: int) -> list[Rollout]:
        limit = min(limit, 2**62)
        if states is None:
            rows = await self._read(
                lambda c: c.fetch("SELECT body FROM rollouts ORDER BY seq LIMIT $1", limit)
            )
        else:
            values = [s.value for s in states]
            rows = await self._read(
                lambda c: c.fetch(
                    "SELECT body FROM rollouts WHERE state = ANY($1::text[]) ORDER BY seq LIMIT $2",
                    values,
                    limit,
                )
            )
        return [Rollout.model_validate_json(r[0]) for r in rows]

    async def page_rollouts(
        self,
        states: Collection[RolloutState] | None,
        is_train: bool | None,
        search: str,
        offset: int,
        limit: int,
    ) -> tuple[int, list[Rollout]]:
        where: list[str] = ["true"]
        args: list[Any] = []
        if states is not None:
            args.append([s.value for s in states])
            where.append(f"state = ANY(${len(args)}::text[])")
        if is_train is not None:
            args.append(is_train)
            where.append(f"is_train = ${len(args)}")
        if search:
            args.append(
                "%" + search.lower().replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
            )
            n = len(args)
            where.append(f"(lower(rollout_id) LIKE ${n} OR lower(coalesce(data_id, '')) LIKE ${n})")
        condition = " AND ".join(where)
        n = len(args)

        async def query(c: asyncpg.Connection) -> tuple[int, list[bytes]]:
            total = await c.fetchval(f"SELECT count(*) FROM rollouts WHERE {condition}", *args)
            rows = await c.fetch(
                f"SELECT body FROM rollouts WHERE {condition} ORDER BY seq DESC LIMIT ${n + 1} OFFSET ${n + 2}",
                *args,
                limit,
                offset,
            )
            return total, [r[0] for r in rows]

        total, bodies = await self._read(query)
        return total, [Rollout.model_validate_json(b) for b in bodies]

    async def count_by_state(self) -> dict[str, int]:
        rows = await self._read(lambda c: c.fetch("SELECT state, count(*) FROM rollouts GROUP BY state"))
        return {r[0]: r[1] for r in rows}

    async def patch_rollout(self, rollout_id: str, patch: RolloutStatusPatch, now: float) -> Rollout:
        async def op(conn: asyncpg.Connection) -> Rollout:
            body = await conn.fetchval("SELECT body FROM rollouts WHERE rollout_id=$1 FOR UPDATE", rollout_id)
            if body is None:
                raise RolloutNotFound(rollout_id)
            current = Rollout.model_validate_json(body)
            updated = apply_patch(current, patch, now)
            terminal_seq = None
            finished = updated.status.state.is_terminal and not current.status.state.is_terminal
            if finished:
                terminal_seq = await conn.fetchval(
                    "UPDATE counters SET value = value + 1 WHERE name = 'terminal' RETURNING value"
                )
            await conn.execute(
                "UPDATE rollouts SET state=$1, body=$2, terminal_seq=coalesce($3, terminal_seq) WHERE rollout_id=$4",
                updated.status.state.value,
                updated.model_dump_json().encode(),
                terminal_seq,
                rollout_id,
            )
            if updated.status.version <= MAX_STATUS_CHANGES:
                await conn.execute(INSERT_STATUS_CHANGE, *status_row(updated))
            await self._notify(conn, "terminal" if finished else "patch", rollout_id)
            return updated

        return await self._write(op)

    async def delete_rollout(self, rollout_id: str) -> bool:
        self._calls.forget(rollout_id)

        async def op(conn: asyncpg.Connection) -> bool:
            done: str = await conn.execute("DELETE FROM rollouts WHERE rollout_id=$1", rollout_id)
            await self._notify(conn, "delete", rollout_id)
            return done != "DELETE 0"

        return await self._write(op)

    async def list_terminal(self, after: int, limit: int) -> TerminalPage:
        async def op(c: asyncpg.Connection) -> tuple[list[Any], int]:
            rows = await c.fetch(
                "SELECT terminal_seq, rollout_id, state, data_id, is_train FROM rollouts "
                "WHERE terminal_seq > $1 ORDER BY terminal_seq LIMIT $2",
                after,
                limit,
            )
            total = await c.fetchval("SELECT count(*) FROM rollouts WHERE terminal_seq IS NOT NULL")
            return rows, total

        rows, total = await self._read(op)
        items = [TerminalItem(rollout_id=r[1], state=r[2], data_id=r[3] or "", is_train=r[4]) for r in rows]
        return TerminalPage(items=items, next_after=rows[-1][0] if rows else after, total_terminal=total)

    # --- events ---------------------------------------------------------------------------

    async def append_event(self, record: EventRecord) -> int:
        pending = None
        draft = record.call
        if isinstance(draft, CallDraft):
            encoded, pending = self._calls.encode(record, draft)
        else:
            encoded = record
        try:
            seq = await self._submit(encoded)
        except StaleBase:
            # Another replica deleted the rollout and it was created again under its id before
            # this one heard of the delete: its calls are gone. Stored whole, a new chain starts.
            assert isinstance(draft, CallDraft)
            self._calls.forget(record.rollout_id)
            encoded, pending = self._calls.encode(record, draft)
            seq = await self._submit(encoded)
        if pending is not None:
            self._calls.remember(pending, seq)
        return seq

    async def _submit(self, record: EventRecord) -> int:
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._pending.append((record, future))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush())
        return await future

    async def _flush(self) -> None:
        """Insert queued appends, many in one transaction, until none are left."""
        while self._pending:
            batch, self._pending = self._pending[:MAX_BATCH], self._pending[MAX_BATCH:]
            insert = partial(self._insert_events, records=[r for r, _ in batch])
            try:
                results = await self._write(insert)
            except Exception as exc:  # nothing of this batch was committed
                for _, future in batch:
                    if not future.done():
                        future.set_exception(exc)
                continue
            for (_, future), result in zip(batch, results, strict=True):
                if future.done():
                    continue
                if isinstance(result, BaseException):
                    future.set_exception(result)
                else:
                    future.set_result(result)

    @staticmethod
    async def _insert_events(
        conn: asyncpg.Connection, records: list[EventRecord]
    ) -> list[int | BaseException]:
        seqs = sorted(
            r[0]
            for r in await conn.fetch(
                "SELECT nextval(pg_get_serial_sequence('events', 'seq')) FROM generate_series(1, $1)",
                len(records),
            )
        )
        rows = [
            (
                seq,
                r.rollout_id,
                r.attempt_id,
                r.event_type,
                r.timestamp,
                r.data,
                r.triplet,
                r.prompt_key,
                r.call,
            )
            for seq, r in zip(seqs, records, strict=True)
        ]
        insert = "INSERT INTO events(seq, rollout_id, attempt_id, event_type, ts, data, triplet, prompt_key, call) "
        bases = [sorted(bases_of(r.call)) if isinstance(r.call, bytes) else [] for r in records]
        try:
            async with conn.transaction():  # a savepoint: a missing rollout fails only its own rows
                await conn.execute(
                    insert + "SELECT * FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], "
                    "$5::float8[], $6::bytea[], $7::bytea[], $8::text[], $9::bytea[])",
                    *(list(column) for column in zip(*rows, strict=True)),
                )
                await _check_bases(conn, sorted({b for row_bases in bases for b in row_bases}))
            return list(seqs)
        except (asyncpg.ForeignKeyViolationError, StaleBase):
            pass
        results: list[int | BaseException] = []
        for row, row_bases in zip(rows, bases, strict=True):
            try:
                async with conn.transaction():
                    await conn.execute(insert + "VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9)", *row)
                    await _check_bases(conn, row_bases)
                results.append(row[0])
            except asyncpg.ForeignKeyViolationError:
                results.append(RolloutNotFound(row[1]))
            except StaleBase as exc:
                results.append(exc)
        return results

    async def list_events(
        self,
        rollout_id: str,
        attempt_id: str | None = None,
        event_type: str | None = None,
        view: View = "data",
    ) -> list[StoredEvent]:
        payload = "data, NULL::bytea" if view == "data" else "''::bytea, triplet"
        sql = f"SELECT seq, attempt_id, event_type, ts, {payload}, prompt_key, call FROM events WHERE rollout_id=$1"
        args: list[Any] = [rollout_id]
        if attempt_id is not None:
            args.append(attempt_id)
            sql += f" AND attempt_id=${len(args)}"
        if event_type is not None:
            args.append(event_type)
            sql += f" AND event_type=${len(args)}"
        if view != "data":
            sql += " AND triplet IS NOT NULL"
        sql += " ORDER BY seq"
        rows = await self._read(lambda c: c.fetch(sql, *args))
        events = [
            StoredEvent(r[0], EventRecord(rollout_id, r[1], r[2], r[3], r[4], r[5], r[6], r[7])) for r in rows
        ]
        return materialize(events, view)

    async def put_routes(self, rollout_id: str, sequence: int, routes: bytes, drop: list[int]) -> None:
        async def op(conn: asyncpg.Connection) -> None:
            if drop:
                await conn.execute("DELETE FROM routes WHERE seq = ANY($1::bigint[])", drop)
            try:
                await conn.execute(
                    "INSERT INTO routes(seq, rollout_id, body) VALUES ($1,$2,$3) "
                    "ON CONFLICT (seq) DO UPDATE SET rollout_id=excluded.rollout_id, body=excluded.body",
                    sequence,
                    rollout_id,
                    routes,
                )
            except asyncpg.ForeignKeyViolationError:
                raise RolloutNotFound(rollout_id) from None
            await self._notify(conn, "routes", rollout_id)

        await self._write(op)

    async def get_routes(self, rollout_id: str) -> dict[int, bytes]:
        rows = await self._read(
            lambda c: c.fetch("SELECT seq, body FROM routes WHERE rollout_id=$1", rollout_id)
        )
        return {r[0]: bytes(r[1]) for r in rows}

    async def record_outcome(
        self, rollout_id: str, attempt_id: str, outcome: AttemptOutcome, detail: str | None, now: float
    ) -> Outcome:
        async def op(conn: asyncpg.Connection) -> Outcome:
            try:
                # One statement: replicas reporting at once leave the strongest evidence.
                await conn.execute(
                    "INSERT INTO attempt_outcomes(rollout_id, attempt_id, outcome, strength, detail, at) "
                    "VALUES ($1,$2,$3,$4,$5,$6) ON CONFLICT (rollout_id, attempt_id) DO UPDATE SET "
                    "outcome=excluded.outcome, strength=excluded.strength, detail=excluded.detail, "
                    "at=excluded.at WHERE excluded.strength > attempt_outcomes.strength",
                    rollout_id,
                    attempt_id,
                    outcome.value,
                    outcome.rank,
                    detail,
                    now,
                )
            except asyncpg.ForeignKeyViolationError:
                raise RolloutNotFound(rollout_id) from None
            row = await conn.fetchrow(
                "SELECT outcome, detail FROM attempt_outcomes WHERE rollout_id=$1 AND attempt_id=$2",
                rollout_id,
                attempt_id,
            )
            return AttemptOutcome(row[0]), row[1]

        return await self._write(op)

    async def list_outcomes(self, rollout_ids: Collection[str]) -> dict[tuple[str, str], Outcome]:
        ids = list(rollout_ids)
        if not ids:
            return {}
        rows = await self._read(
            lambda c: c.fetch(
                "SELECT rollout_id, attempt_id, outcome, detail FROM attempt_outcomes "
                "WHERE rollout_id = ANY($1::text[])",
                ids,
            )
        )
        return {(r[0], r[1]): (AttemptOutcome(r[2]), r[3]) for r in rows}

    async def list_attempts(self, rollout_id: str) -> list[AttemptStats]:
        rows = await self._read(
            lambda c: c.fetch(
                "SELECT attempt_id, count(*), min(ts), max(ts) FROM events WHERE rollout_id=$1 "
                "GROUP BY attempt_id ORDER BY min(seq)",
                rollout_id,
            )
        )
        return [AttemptStats(r[0], r[1], r[2], r[3]) for r in rows]

    # --- models ---------------------------------------------------------------------------

    async def upsert_models(self, models: list[Model]) -> list[Model]:
        rows = [(m.model, m.endpoint, m.version, m.lease_seconds, m.expires_at) for m in models]

        async def op(conn: asyncpg.Connection) -> None:
            await conn.executemany(
                "INSERT INTO models(model, endpoint, version, lease_seconds, expires_at) VALUES ($1,$2,$3,$4,$5) "
                "ON CONFLICT (model, endpoint) DO UPDATE SET version=excluded.version, "
                "lease_seconds=excluded.lease_seconds, expires_at=excluded.expires_at",
                rows,
            )
            await self._notify(conn, "models")

        await self._write(op)
        return models

    async def list_models(self) -> list[Model]:
        rows = await self._read(
            lambda c: c.fetch("SELECT model, endpoint, version, lease_seconds, expires_at FROM models")
        )
        return [
            Model(model=r[0], endpoint=r[1], version=r[2], lease_seconds=r[3], expires_at=r[4]) for r in rows
        ]

    async def delete_models(self) -> None:
        async def op(conn: asyncpg.Connection) -> None:
            await conn.execute("DELETE FROM models")
            await self._notify(conn, "models")

        await self._write(op)

    # --- the dashboard's views --------------------------------------------------------------

    async def status_history(self, rollout_id: str) -> list[dict[str, Any]]:
        rows = await self._read(
            lambda c: c.fetch(
                "SELECT state, version, at, attempt_id, error_message FROM status_changes "
                "WHERE rollout_id=$1 ORDER BY version",
                rollout_id,
            )
        )
        return [dict(r) for r in rows]

    async def count_finished_since(self, since: float) -> int:
        n: int = await self._read(
            lambda c: c.fetchval(
                "SELECT count(*) FROM status_changes WHERE state IN ('succeeded', 'failed') AND at >= $1",
                since,
            )
        )
        return n

    async def add_run_points(self, run_id: str, points: list[MetricPoint]) -> int:
        at = time.time()
        rows = [(p.step, p.time if p.time is not None else at, orjson.dumps(p.metrics)) for p in points]

        async def op(conn: asyncpg.Connection) -> int:
            await conn.execute(
                "INSERT INTO runs(run_id, updated_at) VALUES ($1,$2) "
                "ON CONFLICT (run_id) DO UPDATE SET updated_at=excluded.updated_at",
                run_id,
                at,
            )
            for step, when, metrics in rows:
                await conn.execute("DELETE FROM run_points WHERE run_id=$1 AND step>=$2", run_id, step)
                await conn.execute("INSERT INTO run_points VALUES ($1,$2,$3,$4)", run_id, step, when, metrics)
            n: int = await conn.fetchval("SELECT count(*) FROM run_points WHERE run_id=$1", run_id)
            if n > MAX_POINTS_PER_RUN:
                await conn.execute(
                    "DELETE FROM run_points WHERE run_id=$1 AND step IN "
                    "(SELECT step FROM run_points WHERE run_id=$1 ORDER BY step LIMIT $2)",
                    run_id,
                    n - MAX_POINTS_PER_RUN,
                )
                n = MAX_POINTS_PER_RUN
            await conn.execute(
                "DELETE FROM runs WHERE run_id IN (SELECT run_id FROM runs ORDER BY updated_at DESC OFFSET $1)",
                MAX_RUNS,
            )
            return n

        return await self._write(op)

    async def list_runs(self) -> list[RunSummary]:
        async def op(c: asyncpg.Connection) -> tuple[list[Any], list[Any]]:
            runs = await c.fetch(
                "SELECT r.run_id, r.updated_at, count(p.step), max(p.step) FROM runs r "
                "LEFT JOIN run_points p ON p.run_id = r.run_id GROUP BY r.run_id ORDER BY r.updated_at DESC"
            )
            last = await c.fetch(  # each run's last points, off the (run_id, step) key: not every point
                "SELECT r.run_id, p.metrics FROM runs r CROSS JOIN LATERAL (SELECT metrics FROM run_points "
                "WHERE run_id = r.run_id ORDER BY step DESC LIMIT $1) AS p",
                RUN_KEYS_FROM,
            )
            return runs, last

        runs, last = await self._read(op)
        return run_summaries(runs, last)

    async def run_points(self, run_id: str, after_step: int = -1) -> list[MetricPoint] | None:
        async def op(c: asyncpg.Connection) -> list[Any] | None:
            if await c.fetchval("SELECT 1 FROM runs WHERE run_id=$1", run_id) is None:
                return None
            rows: list[Any] = await c.fetch(
                "SELECT step, at, metrics FROM run_points WHERE run_id=$1 AND step>$2 ORDER BY step",
                run_id,
                after_step,
            )
            return rows

        rows = await self._read(op)
        return None if rows is None else metric_points(rows)

    # --- the proxy's pause state and the replicas' in-flight counts (server/replicas.py) --

    async def set_pause(self, paused: bool, retry_after_seconds: float, reason: str | None) -> int:
        """Store the pause state for every replica; its new epoch."""

        async def op(conn: asyncpg.Connection) -> int:
            epoch: int = await conn.fetchval(
                "UPDATE proxy_state SET paused=$1, retry_after_seconds=$2, reason=$3, epoch=epoch+1 "
                "WHERE id=1 RETURNING epoch",
                paused,
                retry_after_seconds,
                reason,
            )
            await self._notify(conn, "proxy", str(epoch))
            return epoch

        return await self._write(op)

    async def get_pause(self) -> tuple[bool, float, str | None, int]:
        row = await self._read(
            lambda c: c.fetchrow(
                "SELECT paused, retry_after_seconds, reason, epoch FROM proxy_state WHERE id=1"
            )
        )
        return row[0], row[1], row[2], row[3]

    async def report_replica(self, inflight: int, epoch_seen: int) -> None:
        """This replica's heartbeat; it also purges the rows of replicas unseen for
        `DEAD_REPLICA_S` (killed ones never delete their own), so the table stays small."""

        async def op(conn: asyncpg.Connection) -> None:
            await conn.execute(
                "INSERT INTO replicas(replica_id, inflight, epoch_seen, seen_at) VALUES ($1,$2,$3,now()) "
                "ON CONFLICT (replica_id) DO UPDATE SET inflight=excluded.inflight, "
                "epoch_seen=excluded.epoch_seen, seen_at=excluded.seen_at",
                self.replica_id,
                inflight,
                epoch_seen,
            )
            await conn.execute(
                "DELETE FROM replicas WHERE seen_at < now() - make_interval(secs => $1)", DEAD_REPLICA_S
            )

        await self._write(op)

    async def remove_replica(self) -> None:
        await self._write(lambda c: c.execute("DELETE FROM replicas WHERE replica_id=$1", self.replica_id))

    async def live_replicas(self, within_seconds: float) -> list[tuple[str, int, int]]:
        """(replica id, in-flight calls, epoch applied) of replicas seen within the last seconds."""
        rows = await self._read(
            lambda c: c.fetch(
                "SELECT replica_id, inflight, epoch_seen FROM replicas "
                "WHERE seen_at > now() - make_interval(secs => $1)",
                within_seconds,
            )
        )
        return [(r[0], r[1], r[2]) for r in rows]
