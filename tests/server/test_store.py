"""One behavioural suite, run against both store implementations."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from agentlightning.schemas import (
    AttemptOutcome,
    IllegalTransition,
    MetricPoint,
    Model,
    Rollout,
    RolloutMetadata,
    RolloutState,
    RolloutStatusPatch,
)
from agentlightning.server.events import UnencodableEvent, make_record, render_events
from agentlightning.server.store import (
    MemoryStore,
    RolloutNotFound,
    SqliteStore,
    Store,
    StoreLocked,
    store_from_url,
)
from agentlightning.server.store import delta as delta_mod
from agentlightning.server.store.postgres import DEAD_REPLICA_S, MIGRATIONS, PostgresStore
from tests import postgres
from tests.server.test_store_delta import long_conversation


@pytest.fixture(params=["memory", "sqlite", "postgres"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    s: Store
    if request.param == "postgres":
        s = store_from_url(postgres.new_database())
    else:
        s = MemoryStore() if request.param == "memory" else SqliteStore(tmp_path / "s.db")
    await s.open()
    yield s
    await s.close()


def rollout(rid: str, data_id: str | None = None, is_train: bool = True) -> Rollout:
    return Rollout(
        rollout_id=rid, input={"q": rid}, is_train=is_train, metadata=RolloutMetadata(data_id=data_id)
    )


def patch(**kw: Any) -> RolloutStatusPatch:
    return RolloutStatusPatch(**kw)


async def finish(store: Store, rid: str, state: str = "succeeded") -> None:
    await store.patch_rollout(rid, patch(state="running"), 1.0)
    await store.patch_rollout(rid, patch(state=state), 2.0)


async def test_create_is_idempotent_and_keeps_the_stored_rollout(store: Store) -> None:
    first = await store.create_rollouts([rollout("a"), rollout("b")])
    assert [r.rollout_id for r in first] == ["a", "b"]
    await store.patch_rollout("a", patch(state="running"), 5.0)
    again = await store.create_rollouts([Rollout(rollout_id="a", input="other"), rollout("c")])
    assert again[0].input == {"q": "a"} and again[0].status.state == RolloutState.RUNNING
    assert again[1].rollout_id == "c"
    assert [r.rollout_id for r in await store.list_rollouts(None, 100)] == ["a", "b", "c"]


async def test_list_filters_states_in_creation_order_with_limit(store: Store) -> None:
    await store.create_rollouts([rollout(f"r{i}") for i in range(6)])
    await store.patch_rollout("r1", patch(state="running"), 1.0)
    await store.patch_rollout("r4", patch(state="running"), 1.0)
    running = await store.list_rollouts({RolloutState.RUNNING}, 100)
    assert [r.rollout_id for r in running] == ["r1", "r4"]
    queuing = await store.list_rollouts({RolloutState.QUEUING}, 2)
    assert [r.rollout_id for r in queuing] == ["r0", "r2"]
    both = await store.list_rollouts({RolloutState.QUEUING, RolloutState.RUNNING}, 100)
    assert len(both) == 6


async def test_patch_bumps_version_and_enforces_transitions(store: Store) -> None:
    await store.create_rollouts([rollout("a")])
    r = await store.patch_rollout("a", patch(state="running", last_attempt_id="x1"), 10.0)
    assert r.status.version == 2 and r.status.updated_at == 10.0 and r.status.last_attempt_id == "x1"
    r = await store.patch_rollout("a", patch(k8s_job_name="job-a"), 11.0)
    assert (
        r.status.version == 3 and r.status.state == RolloutState.RUNNING and r.status.last_attempt_id == "x1"
    )
    r = await store.patch_rollout("a", patch(state="failed", error_message="boom"), 12.0)
    assert r.status.state == RolloutState.FAILED and r.status.error_message == "boom"
    with pytest.raises(IllegalTransition):
        await store.patch_rollout("a", patch(state="running"), 13.0)
    with pytest.raises(IllegalTransition):
        await store.patch_rollout("a", patch(error_message="changed"), 13.0)
    stored = await store.get_rollout("a")
    assert stored is not None and stored.status.version == 4 and stored.status.error_message == "boom"
    with pytest.raises(RolloutNotFound):
        await store.patch_rollout("missing", patch(state="running"), 1.0)


async def test_queuing_cannot_jump_to_succeeded(store: Store) -> None:
    await store.create_rollouts([rollout("a")])
    with pytest.raises(IllegalTransition, match="queuing to succeeded"):
        await store.patch_rollout("a", patch(state="succeeded"), 1.0)
    stored = await store.get_rollout("a")
    assert stored is not None and stored.status.version == 1


async def test_terminal_cursor_is_completion_order(store: Store) -> None:
    await store.create_rollouts([rollout("a", "d1"), rollout("b", "d1"), rollout("c", "d2", is_train=False)])
    await finish(store, "c")
    await finish(store, "a", "failed")
    page = await store.list_terminal(0, 10)
    assert [(i.rollout_id, i.state, i.data_id, i.is_train) for i in page.items] == [
        ("c", RolloutState.SUCCEEDED, "d2", False),
        ("a", RolloutState.FAILED, "d1", True),
    ]
    assert page.total_terminal == 2
    await finish(store, "b")
    nxt = await store.list_terminal(page.next_after, 10)
    assert [i.rollout_id for i in nxt.items] == ["b"] and nxt.total_terminal == 3
    empty = await store.list_terminal(nxt.next_after, 10)
    assert empty.items == [] and empty.next_after == nxt.next_after
    limited = await store.list_terminal(0, 2)
    assert [i.rollout_id for i in limited.items] == ["c", "a"]


async def test_delete_removes_rollout_events_and_terminal_entry(store: Store) -> None:
    await store.create_rollouts([rollout("a"), rollout("b")])
    await store.append_event(make_record("a", "t1", "reward", {"value": 1.0}, 1.0))
    await finish(store, "a")
    await finish(store, "b")
    assert await store.delete_rollout("a") is True
    assert await store.delete_rollout("a") is False
    assert await store.get_rollout("a") is None
    assert await store.list_events("a") == []
    page = await store.list_terminal(0, 10)
    assert [i.rollout_id for i in page.items] == ["b"] and page.total_terminal == 1
    with pytest.raises(RolloutNotFound):
        await store.append_event(make_record("a", "t1", "reward", {"value": 1.0}, 1.0))
    # cursors keep increasing after a delete
    await store.create_rollouts([rollout("c")])
    await finish(store, "c")
    later = await store.list_terminal(page.next_after, 10)
    assert [i.rollout_id for i in later.items] == ["c"]


async def test_status_history_is_recorded_by_create_and_patch_and_goes_with_a_delete(store: Store) -> None:
    await store.create_rollouts([rollout("a")])
    await store.patch_rollout("a", patch(state="running", last_attempt_id="t1"), 10.0)
    await store.patch_rollout("a", patch(state="failed", error_message="boom"), 20.0)
    await store.create_rollouts([rollout("a")])  # an idempotent create changes nothing
    history = await store.status_history("a")
    assert [(h["state"], h["version"], h["attempt_id"], h["error_message"]) for h in history] == [
        ("queuing", 1, None, None),
        ("running", 2, "t1", None),
        ("failed", 3, "t1", "boom"),
    ]
    assert [h["at"] for h in history[1:]] == [10.0, 20.0]
    assert await store.count_finished_since(15.0) == 1 and await store.count_finished_since(25.0) == 0
    assert await store.delete_rollout("a")
    assert await store.status_history("a") == []
    await store.create_rollouts([rollout("a")])  # the same id again: a history of its own
    assert [h["version"] for h in await store.status_history("a")] == [1]


async def test_run_points_replace_from_a_repeated_step_and_runs_list_newest_first(store: Store) -> None:
    assert await store.run_points("exp") is None and await store.list_runs() == []
    points = [MetricPoint(step=s, metrics={"reward": s / 10}) for s in (1, 2, 3)]
    assert await store.add_run_points("exp", points) == 3
    # a run resumed from its step-1 checkpoint logs step 2 again: steps 2 and 3 go
    assert await store.add_run_points("exp", [MetricPoint(step=2, metrics={"kl": 0.5}, time=7.0)]) == 2
    got = await store.run_points("exp")
    assert got is not None
    assert [(p.step, p.metrics) for p in got] == [(1, {"reward": 0.1}), (2, {"kl": 0.5})]
    assert got[1].time == 7.0 and got[0].time is not None
    assert [p.step for p in await store.run_points("exp", after_step=1) or []] == [2]
    await store.add_run_points("other", [])
    runs = await store.list_runs()
    assert [(r.run_id, r.n_points, r.last_step) for r in runs] == [("other", 0, None), ("exp", 2, 2)]
    assert runs[1].keys == ["kl", "reward"]


async def test_events_append_in_order_and_filter(store: Store) -> None:
    await store.create_rollouts([rollout("a"), rollout("b")])
    seqs = []
    for i, (attempt, kind) in enumerate([("t1", "log"), ("t1", "reward"), ("t2", "log"), ("t2", "reward")]):
        seqs.append(await store.append_event(make_record("a", attempt, kind, {"i": i, "value": i}, float(i))))
    await store.append_event(make_record("b", "t1", "log", {"i": 99}, 0.5))
    assert seqs == sorted(seqs) and len(set(seqs)) == 4
    all_a = await store.list_events("a")
    assert [orjson.loads(e.record.data)["i"] for e in all_a] == [0, 1, 2, 3]
    t2 = await store.list_events("a", attempt_id="t2")
    assert [e.record.event_type for e in t2] == ["log", "reward"]
    rewards = await store.list_events("a", event_type="reward")
    assert [orjson.loads(e.record.data)["i"] for e in rewards] == [1, 3]
    triplets = await store.list_events("a", attempt_id="t1", view="triplet")
    assert [orjson.loads(e.record.triplet) for e in triplets] == [{"value": 1}]  # type: ignore[arg-type]
    with pytest.raises(RolloutNotFound):
        await store.append_event(make_record("nope", "t1", "log", {}, 0.0))


async def test_attempts_sorted_by_first_event(store: Store) -> None:
    await store.create_rollouts([rollout("a")])
    await store.append_event(make_record("a", "second", "log", {}, 5.0))
    await store.append_event(
        make_record("a", "first", "log", {}, 1.0)
    )  # appended later: order is append order
    await store.append_event(make_record("a", "second", "log", {}, 7.0))
    attempts = await store.list_attempts("a")
    assert [(a.attempt_id, a.n_events) for a in attempts] == [("second", 2), ("first", 1)]
    assert attempts[0].first_event_at == 5.0 and attempts[0].last_event_at == 7.0


async def test_models_upsert_by_model_and_endpoint(store: Store) -> None:
    await store.upsert_models(
        [Model(model="m", endpoint="http://a/v1"), Model(model="m", endpoint="http://b/v1")]
    )
    await store.upsert_models([Model(model="m", endpoint="http://a/v1", version=3)])
    models = sorted(await store.list_models(), key=lambda m: m.endpoint)
    assert [(m.endpoint, m.version) for m in models] == [("http://a/v1", 3), ("http://b/v1", 0)]
    await store.delete_models()
    assert await store.list_models() == []


async def test_concurrent_appends_all_land(store: Store) -> None:
    await store.create_rollouts([rollout(f"r{i}") for i in range(8)])
    records = [make_record(f"r{i % 8}", "t", "log", {"n": i}, float(i)) for i in range(400)]
    seqs = await asyncio.gather(*(store.append_event(r) for r in records))
    assert len(set(seqs)) == 400
    for i in range(8):
        got = [orjson.loads(e.record.data)["n"] for e in await store.list_events(f"r{i}")]
        assert got == list(range(i, 400, 8))


async def test_one_failing_write_does_not_fail_its_batch_neighbours(store: Store) -> None:
    await store.create_rollouts([rollout("a")])
    results = await asyncio.gather(
        store.append_event(make_record("a", "t", "log", {}, 0.0)),
        store.append_event(make_record("ghost", "t", "log", {}, 0.0)),
        store.patch_rollout("a", patch(state="succeeded"), 1.0),
        store.append_event(make_record("a", "t", "log", {}, 0.0)),
        return_exceptions=True,
    )
    assert isinstance(results[0], int) and isinstance(results[3], int)
    assert isinstance(results[1], RolloutNotFound) and isinstance(results[2], IllegalTransition)
    assert len(await store.list_events("a")) == 2


def test_records_refuse_data_json_cannot_carry() -> None:
    with pytest.raises(UnencodableEvent, match="64-bit"):
        make_record("r", "a", "log", {"n": 2**70}, 0.0)
    with pytest.raises(UnencodableEvent, match="surrogates"):
        make_record("r", "a", "log", {"s": "\udb35"}, 0.0)


async def test_sqlite_persists_across_reopen_and_refuses_a_second_owner(tmp_path: Path) -> None:
    path = tmp_path / "db" / "g.db"
    s = SqliteStore(path)
    await s.open()
    await s.create_rollouts([rollout("a"), rollout("b")])
    await finish(s, "a")
    await s.append_event(make_record("b", "t", "reward", {"value": 0.5}, 1.0))
    await s.upsert_models([Model(model="m", endpoint="http://x/v1", version=2)])
    await s.add_run_points("exp", [MetricPoint(step=1, metrics={"reward": 1.0})])
    other = SqliteStore(path)
    with pytest.raises(StoreLocked, match="another process"):
        await other.open()
    await s.close()

    s2 = SqliteStore(path)
    await s2.open()
    try:
        assert {r.rollout_id for r in await s2.list_rollouts(None, 10)} == {"a", "b"}
        page = await s2.list_terminal(0, 10)
        assert [i.rollout_id for i in page.items] == ["a"]
        await finish(s2, "b")
        assert [i.rollout_id for i in (await s2.list_terminal(page.next_after, 10)).items] == ["b"]
        assert [orjson.loads(e.record.data) for e in await s2.list_events("b")] == [{"value": 0.5}]
        assert [m.version for m in await s2.list_models()] == [2]
        # the dashboard's views survive too
        assert [h["state"] for h in await s2.status_history("a")] == ["queuing", "running", "succeeded"]
        assert [p.metrics for p in await s2.run_points("exp") or []] == [{"reward": 1.0}]
    finally:
        await s2.close()


async def test_an_attempt_keeps_the_strongest_outcome_reported_and_loses_it_with_its_rollout(
    store: Store,
) -> None:
    await store.create_rollouts([rollout("a"), rollout("b")])
    ok = await store.record_outcome("a", "t1", AttemptOutcome.OK, None, 1.0)
    assert ok == (AttemptOutcome.OK, None)
    # stronger evidence replaces weaker, in whichever order it comes; weaker never replaces stronger
    lost = await store.record_outcome("a", "t1", AttemptOutcome.POD_LOST, "OOMKilled", 2.0)
    assert lost == (AttemptOutcome.POD_LOST, "OOMKilled")
    assert await store.record_outcome("a", "t1", AttemptOutcome.AGENT_ERROR, "exit 1", 3.0) == lost
    await store.record_outcome("a", "t2", AttemptOutcome.NO_REWARD, "none", 4.0)
    await store.record_outcome("b", "", AttemptOutcome.LOST, "trainer", 4.0)
    assert await store.list_outcomes(["a", "b", "nope"]) == {
        ("a", "t1"): (AttemptOutcome.POD_LOST, "OOMKilled"),
        ("a", "t2"): (AttemptOutcome.NO_REWARD, "none"),
        ("b", ""): (AttemptOutcome.LOST, "trainer"),
    }
    assert await store.list_outcomes([]) == {}
    with pytest.raises(RolloutNotFound):
        await store.record_outcome("nope", "t1", AttemptOutcome.OK, None, 1.0)
    await store.delete_rollout("a")
    assert await store.list_outcomes(["a"]) == {}


async def test_concurrent_outcome_reports_leave_the_strongest(store: Store) -> None:
    await store.create_rollouts([rollout("a")])
    await asyncio.gather(
        *(store.record_outcome("a", "t1", o, o.value, 1.0) for o in reversed(list(AttemptOutcome)))
    )
    assert await store.list_outcomes(["a"]) == {("a", "t1"): (AttemptOutcome.POD_LOST, "pod_lost")}


async def test_outcomes_are_shared_by_postgres_replicas_and_survive_a_restart() -> None:
    url = postgres.new_database()
    a, b = store_from_url(url), store_from_url(url)
    await a.open()
    await b.open()
    try:
        await a.create_rollouts([rollout("r")])
        await a.record_outcome("r", "t1", AttemptOutcome.MODEL_UNAVAILABLE, "503", 1.0)
        # the other replica's weaker evidence (the end it saw) does not replace it
        assert await b.record_outcome("r", "t1", AttemptOutcome.OK, None, 2.0) == (
            AttemptOutcome.MODEL_UNAVAILABLE,
            "503",
        )
    finally:
        await a.close()
        await b.close()
    again = store_from_url(url)
    await again.open()
    try:
        assert await again.list_outcomes(["r"]) == {("r", "t1"): (AttemptOutcome.MODEL_UNAVAILABLE, "503")}
    finally:
        await again.close()


async def test_a_version_3_sqlite_file_gets_the_outcome_table(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "g.db"
    s = SqliteStore(path)
    await s.open()
    await s.create_rollouts([rollout("a")])
    await s.close()
    conn = sqlite3.connect(path)  # the file as a Gateway of schema 3 left it
    conn.executescript("DROP TABLE attempt_outcomes; PRAGMA user_version=3;")
    conn.close()
    s = SqliteStore(path)
    await s.open()
    try:
        assert await s.list_outcomes(["a"]) == {}
        await s.record_outcome("a", "t1", AttemptOutcome.TIMEOUT, None, 1.0)
        assert await s.list_outcomes(["a"]) == {("a", "t1"): (AttemptOutcome.TIMEOUT, None)}
    finally:
        await s.close()


async def test_a_version_2_sqlite_file_gets_the_dashboard_tables(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "g.db"
    s = SqliteStore(path)
    await s.open()
    await s.create_rollouts([rollout("a")])
    await s.close()
    conn = sqlite3.connect(path)  # the file as a Gateway of schema 2 left it
    conn.executescript(
        "DROP TABLE status_changes; DROP TABLE run_points; DROP TABLE runs; PRAGMA user_version=2;"
    )
    conn.close()
    s = SqliteStore(path)
    await s.open()
    try:
        assert await s.status_history("a") == []  # what happened before is not known
        await s.patch_rollout("a", patch(state="running"), 1.0)
        assert [h["version"] for h in await s.status_history("a")] == [2]
        assert await s.add_run_points("exp", [MetricPoint(step=1, metrics={"a": 1.0})]) == 1
    finally:
        await s.close()


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"synchronous": "full"}, "store.synchronous"),
        ({"read_threads": 8}, "store.read_threads"),
        ({"wal_max_bytes": 1024}, "store.wal_max_bytes"),
    ],
)
def test_sqlite_settings_on_a_postgres_url_are_refused_naming_them(settings: dict, named: str) -> None:
    # nothing is connected: the check comes first
    with pytest.raises(ValueError, match=named.replace(".", r"\.")):
        store_from_url("postgresql://agl@127.0.0.1:1/agl", **settings)


def test_pool_size_on_a_sqlite_url_and_an_unknown_scheme_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"store\.pool_size"):
        store_from_url(f"sqlite:///{tmp_path / 'g.db'}", pool_size=4)
    with pytest.raises(ValueError, match="postgresql://"):
        store_from_url("mysql://x")


async def test_a_heartbeat_purges_the_rows_of_long_dead_replicas() -> None:
    """A killed replica never deletes its own row; the live ones purge it after DEAD_REPLICA_S."""
    s = store_from_url(postgres.new_database())
    assert isinstance(s, PostgresStore)
    await s.open()
    try:
        await s.report_replica(inflight=0, epoch_seen=0)
        killed = store_from_url(s.url)
        assert isinstance(killed, PostgresStore)
        await killed.open()
        await killed.report_replica(inflight=3, epoch_seen=0)
        await killed.close()  # as after a SIGKILL: its row stays
        assert {r[0] for r in await s.live_replicas(60)} == {s.replica_id, killed.replica_id}
        await s._write(  # its last heartbeat moved back to just over the limit
            lambda c: c.execute(
                "UPDATE replicas SET seen_at = now() - make_interval(secs => $1) WHERE replica_id = $2",
                DEAD_REPLICA_S + 1,
                killed.replica_id,
            )
        )
        await s.report_replica(inflight=0, epoch_seen=0)
        rows = await s._read(lambda c: c.fetch("SELECT replica_id FROM replicas"))
        assert [r[0] for r in rows] == [s.replica_id]
    finally:
        await s.close()


async def test_a_version_1_postgres_schema_is_migrated_to_the_dashboard_tables() -> None:
    import asyncpg

    url = postgres.new_database()
    conn = await asyncpg.connect(url)
    try:  # the database as the first Postgres Gateway left it
        await conn.execute(MIGRATIONS[0])
        await conn.execute(
            "CREATE TABLE agl_schema (version integer NOT NULL); INSERT INTO agl_schema VALUES (1)"
        )
        await conn.execute(
            "INSERT INTO rollouts(rollout_id, state, data_id, is_train, body) VALUES ($1,'queuing','',true,$2)",
            "old",
            rollout("old").model_dump_json().encode(),
        )
    finally:
        await conn.close()
    store = PostgresStore(url)
    await store.open()
    try:
        assert await store.status_history("old") == []  # what happened before is not known
        await store.patch_rollout("old", patch(state="running"), 1.0)
        assert [h["version"] for h in await store.status_history("old")] == [2]
        await store.add_run_points("exp", [MetricPoint(step=1, metrics={"a": 1.0})])
        assert [r.run_id for r in await store.list_runs()] == ["exp"]
        await store.record_outcome("old", "t1", AttemptOutcome.SANDBOX_LOST, None, 1.0)  # migration 3
        assert await store.list_outcomes(["old"]) == {("old", "t1"): (AttemptOutcome.SANDBOX_LOST, None)}
    finally:
        await store.close()


async def test_a_call_to_a_rollout_created_again_elsewhere_is_stored_whole_not_against_its_dead_calls(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Replica B remembers a rollout's calls; A deletes the rollout and creates it again under its
    id; before B hears of the delete, the same attempt id sends B a call extending the old one. It
    must not be stored as a delta against the deleted calls (its reads would fail): it is stored
    whole, and the next call extends it."""
    monkeypatch.setattr(delta_mod, "MIN_PROMPT_IDS", 0)
    a = store_from_url(postgres.new_database())
    assert isinstance(a, PostgresStore)
    b = store_from_url(a.url)
    assert isinstance(b, PostgresStore)
    for s in (a, b):
        await s.open()
    deliver = b._on_notify

    def not_heard_of_deletes(conn: Any, pid: int, channel: str, payload: str) -> None:  # B has not heard yet
        if " delete " not in payload:
            deliver(conn, pid, channel, payload)

    monkeypatch.setattr(b, "_on_notify", not_heard_of_deletes)
    first, second, third = long_conversation(3, first=40, turn=5)
    try:
        await a.create_rollouts([Rollout(rollout_id="r", input={})])
        await b.append_event(make_record("r", "a1", "model_request", first, 1.0))
        await a.delete_rollout("r")
        await a.create_rollouts([Rollout(rollout_id="r", input={})])
        seq = await b.append_event(make_record("r", "a1", "model_request", second, 2.0))
        await b.append_event(make_record("r", "a1", "model_request", third, 3.0))
        rows = await a._read(
            lambda c: c.fetch("SELECT seq, call FROM events WHERE rollout_id='r' ORDER BY seq")
        )
        assert rows[0][0] == seq
        assert [delta_mod.bases_of(bytes(r[1])) for r in rows] == [set(), {seq}]
        events = orjson.loads(render_events(await b.list_events("r", "a1")))
        assert [e["data"] for e in events] == [second, third]
    finally:
        for s in (a, b):
            await s.close()


async def test_model_leases_round_trip(store: Store) -> None:
    """A leased endpoint keeps its lease and expiry in the store: every replica sees the same."""
    from agentlightning.schemas import Model

    leased = Model(model="policy", endpoint="http://h:1/v1", version=2, lease_seconds=60.0, expires_at=1060.0)
    plain = Model(model="policy", endpoint="http://h:2/v1", version=2)
    await store.upsert_models([leased, plain])
    assert sorted(await store.list_models(), key=lambda m: m.endpoint) == [leased, plain]
    renewed = leased.model_copy(update={"version": 3, "expires_at": 1100.0})
    await store.upsert_models([renewed])
    assert sorted(await store.list_models(), key=lambda m: m.endpoint) == [renewed, plain]


async def test_a_version_4_sqlite_file_gets_model_leases(tmp_path: Path) -> None:
    import sqlite3

    from agentlightning.schemas import Model

    path = tmp_path / "g.db"
    s = SqliteStore(path)
    await s.open()
    await s.upsert_models([Model(model="policy", endpoint="http://h:1/v1")])
    await s.close()
    conn = sqlite3.connect(path)  # the file as a Gateway of schema 4 left it
    conn.executescript(
        "ALTER TABLE models DROP COLUMN lease_seconds; ALTER TABLE models DROP COLUMN expires_at; "
        "PRAGMA user_version=4;"
    )
    conn.close()
    s = SqliteStore(path)
    await s.open()
    try:
        assert await s.list_models() == [Model(model="policy", endpoint="http://h:1/v1")]  # kept, no lease
        await s.upsert_models(
            [Model(model="policy", endpoint="http://h:2/v1", lease_seconds=5, expires_at=9.0)]
        )
        assert [m.expires_at for m in await s.list_models()] == [None, 9.0]
    finally:
        await s.close()
