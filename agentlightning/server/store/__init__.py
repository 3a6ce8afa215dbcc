"""The Gateway's storage: `open_store(url)` picks the implementation from `store.url`."""

from __future__ import annotations

from agentlightning.server.store.base import (
    EventRecord,
    RolloutNotFound,
    Store,
    StoredEvent,
    StoreUnavailable,
)
from agentlightning.server.store.memory import MemoryStore
from agentlightning.server.store.sqlite import WAL_MAX_BYTES, SqliteStore, StoreLocked

__all__ = [
    "EventRecord",
    "MemoryStore",
    "RolloutNotFound",
    "SqliteStore",
    "Store",
    "StoreLocked",
    "StoreUnavailable",
    "StoredEvent",
    "store_from_url",
]


def store_from_url(
    url: str,
    synchronous: str = "normal",
    read_threads: int = 4,
    wal_max_bytes: int = WAL_MAX_BYTES,
    pool_size: int = 0,
) -> Store:
    """`memory://`, `sqlite:///relative/path.db` / `sqlite:////absolute/path.db` (SQLAlchemy style),
    or `postgresql://user:password@host:port/database` (the `postgres` extra; replicas share it).
    `pool_size` is the Postgres connection pool's size (0: its default); SQLite's settings
    (`synchronous`, `read_threads`, `wal_max_bytes`) do not apply to Postgres."""
    if url.startswith(("postgresql://", "postgres://")):
        # A setting that would do nothing is refused, naming it (they tune SQLite's file only).
        sqlite_only = {
            "synchronous": (synchronous, "normal"),
            "read_threads": (read_threads, 4),
            "wal_max_bytes": (wal_max_bytes, WAL_MAX_BYTES),
        }
        for name, (value, default) in sqlite_only.items():
            if value != default:
                raise ValueError(f"store.{name} applies to a sqlite:/// store.url only, not to Postgres")
        try:
            from agentlightning.server.store.postgres import PostgresStore
        except ImportError as exc:
            raise ValueError(
                f"store.url={url.split('@')[-1]!r} needs the postgres extra: pip install 'agentlightning[postgres]'"
            ) from exc
        return PostgresStore(url, pool_size=pool_size or 10)
    if pool_size:
        raise ValueError("store.pool_size applies to a postgresql:// store.url only")
    if url == "memory://":
        return MemoryStore()
    prefix = "sqlite:///"
    if url.startswith(prefix) and len(url) > len(prefix):
        return SqliteStore(
            url[len(prefix) :],
            synchronous=synchronous,
            read_threads=read_threads,
            wal_max_bytes=wal_max_bytes,
        )
    raise ValueError(
        f"store.url must be 'memory://', 'sqlite:///path/to/file.db' or 'postgresql://…', got {url!r}"
    )
