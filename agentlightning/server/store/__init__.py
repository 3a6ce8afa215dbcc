"""The Gateway's storage: `open_store(url)` picks the implementation from `store.url`."""

from __future__ import annotations

from agentlightning.server.store.base import EventRecord, RolloutNotFound, Store, StoredEvent
from agentlightning.server.store.memory import MemoryStore
from agentlightning.server.store.sqlite import WAL_MAX_BYTES, SqliteStore, StoreLocked

__all__ = [
    "EventRecord",
    "MemoryStore",
    "RolloutNotFound",
    "SqliteStore",
    "Store",
    "StoreLocked",
    "StoredEvent",
    "store_from_url",
]


def store_from_url(
    url: str, synchronous: str = "normal", read_threads: int = 4, wal_max_bytes: int = WAL_MAX_BYTES
) -> Store:
    """`memory://` or `sqlite:///relative/path.db` / `sqlite:////absolute/path.db` (SQLAlchemy style)."""
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
    raise ValueError(f"store.url must be 'memory://' or 'sqlite:///path/to/file.db', got {url!r}")
