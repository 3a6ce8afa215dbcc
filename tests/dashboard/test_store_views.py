"""The store's dashboard queries, the same answers from SQLite (its own SQL) and memory (the default)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agentlightning.schemas import RolloutState
from agentlightning.server.store import MemoryStore, SqliteStore, Store
from tests.server.test_store import finish, rollout


@pytest.fixture(params=["memory", "sqlite"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    s: Store = MemoryStore() if request.param == "memory" else SqliteStore(tmp_path / "s.db")
    await s.open()
    yield s
    await s.close()


async def test_page_rollouts_filters_searches_and_pages_newest_first(store: Store) -> None:
    await store.create_rollouts(
        [
            rollout("r_1", "math-A"),
            rollout("r%2", "math-B", is_train=False),
            rollout("R-3", "code-a"),
            rollout("x-4", None),
            rollout("x-5", "MATH-c"),
        ]
    )
    await finish(store, "r_1")
    await finish(store, "R-3", "failed")

    async def ids(states=None, is_train=None, search="", offset=0, limit=10) -> tuple[int, list[str]]:
        total, page = await store.page_rollouts(states, is_train, search, offset, limit)
        return total, [r.rollout_id for r in page]

    assert await ids() == (5, ["x-5", "x-4", "R-3", "r%2", "r_1"])
    assert await ids(offset=1, limit=2) == (5, ["x-4", "R-3"])
    assert await ids(states={RolloutState.SUCCEEDED, RolloutState.FAILED}) == (2, ["R-3", "r_1"])
    assert await ids(is_train=False) == (1, ["r%2"])
    assert await ids(is_train=True, search="math") == (2, ["x-5", "r_1"])  # data id, any case
    assert await ids(search="r-") == (1, ["R-3"])  # rollout id, any case
    assert await ids(search="_") == (1, ["r_1"])  # LIKE's wildcards are plain characters here
    assert await ids(search="%") == (1, ["r%2"])
    assert await ids(search="nothing") == (0, [])
    assert await store.count_by_state() == {"queuing": 3, "succeeded": 1, "failed": 1}
