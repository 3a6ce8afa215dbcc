"""The SQLite store's coalesced event appends, which carry the proxy's records under load."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from agentlightning.schemas import Rollout
from agentlightning.server.events import make_record
from agentlightning.server.store import RolloutNotFound
from agentlightning.server.store.base import EventRecord
from agentlightning.server.store.sqlite import SqliteStore


def record(rollout_id: str, i: int) -> EventRecord:
    return make_record(rollout_id, "a1", "model_request", {"i": i, "response": None}, float(i))


async def test_concurrent_appends_get_unique_ordered_sequences_and_survive_reopen(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "g.db")
    await store.open()
    await store.create_rollouts([Rollout(rollout_id=f"r{k}") for k in range(5)])
    # 1000 appends at once: the writer coalesces them into multi-row statements, and one
    # append for a missing rollout among them fails alone.
    appends = [store.append_event(record(f"r{i % 5}", i)) for i in range(1000)]
    appends.insert(500, store.append_event(record("missing", -1)))
    results = await asyncio.gather(*appends, return_exceptions=True)
    missing = results.pop(500)
    assert isinstance(missing, RolloutNotFound) and missing.rollout_id == "missing"
    sequences = [s for s in results if isinstance(s, int)]
    assert sequences == results
    assert len(set(sequences)) == 1000
    assert sequences == sorted(sequences), "sequence follows the order of the appends"
    await store.close()

    reopened = SqliteStore(tmp_path / "g.db")
    await reopened.open()
    try:
        events = await reopened.list_events("r3")
        assert [e.sequence for e in events] == [s for i, s in enumerate(sequences) if i % 5 == 3]
        assert len(events) == 200
        later = await reopened.append_event(record("r0", 1000))
        assert later > max(sequences)
    finally:
        await reopened.close()


async def test_a_lone_append_for_a_missing_rollout_fails(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "g.db")
    await store.open()
    try:
        with pytest.raises(RolloutNotFound):
            await store.append_event(record("nope", 0))
        await store.create_rollouts([Rollout(rollout_id="r")])
        assert await store.append_event(record("r", 1)) == 1
    finally:
        await store.close()
