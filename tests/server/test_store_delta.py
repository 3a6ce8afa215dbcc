"""Model calls stored as deltas: every read returns exactly what plain (whole) storage returned.

Random multi-turn histories — interleaved conversations, edits of earlier context, tool outputs,
retries, calls that extend nothing, failed calls in between, completions calls, the shapes of the
chat, Responses and Anthropic routes' events, several attempts, deletes and re-creations — are appended to both stores with delta storage and to a
reference store given the same events whole; every view of every attempt must be
byte-for-byte the reference's, and the collection format must expand to the triplet view.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import sqlite3
import struct
import tempfile
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentlightning.aggregation import AggregationLevel, aggregate_rollout
from agentlightning.client import PromptIds, expand_prompt_refs
from agentlightning.schemas import Rollout
from agentlightning.server.events import appended_event, make_record, render_events
from agentlightning.server.store import MemoryStore, SqliteStore, Store
from agentlightning.server.store import delta as delta_mod
from agentlightning.server.store import sqlite as sqlite_mod
from agentlightning.server.store.base import StoredEvent
from agentlightning.server.store.delta import PH_MESSAGES, CallIndex

ATTEMPTS = ("a1", "a2", "a3")
TOKEN = st.integers(0, 40)  # a small vocabulary: accidental shared prefixes happen
PLACEHOLDERS = [PH_MESSAGES, "\x00agl:token_ids", "\x00agl:input", "\x00agl:chat_messages"]
TEXT = st.text(alphabet='ab\n"\\é\x00', max_size=6) | st.sampled_from(PLACEHOLDERS)
SHAPES = ("chat.completions", "responses", "anthropic.messages")


class Conversation:
    def __init__(self, prompt: list[int]) -> None:
        self.prompt = prompt
        self.messages: list[dict[str, Any]] = [{"role": "user", "content": "start"}]


def chat_call(
    prompt: list[int],
    messages: list[Any],
    response: list[int],
    log_probs: list[Any],
    api: str = "chat.completions",
) -> dict:
    """A recorded call of the route `api`: a Responses call records its `input` items and the chat
    form of them, an Anthropic call its messages and their chat form (both re-sent whole)."""
    chat_request = {"model": "m", "messages": messages, "tools": []}
    recorded: dict[str, Any] = {"request": chat_request}
    if api == "responses":
        recorded = {
            "request": {"model": "m", "input": [*messages, {"type": "x"}]},
            "chat_request": chat_request,
        }
    elif api == "anthropic.messages":
        recorded = {"request": {"model": "m", "messages": messages[1:]}, "chat_request": chat_request}
    return {
        "api": api,
        "mode": "train",
        **recorded,
        "params": {"model": "policy", "temperature": 1.0},
        "response": {
            "id": "x",
            "prompt_token_ids": prompt,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "r"},
                    "token_ids": response,
                    "logprobs": {"content": [{"token": "t", "logprob": lp} for lp in log_probs]},
                }
            ],
            "usage": {"prompt_tokens": len(prompt)},
        },
        "server": {"model": "policy", "endpoint": "http://e", "version": 3},
        "http_status": 200,
        "status": "ok",
    }


def completions_call(prompt: list[int], response: list[int], log_probs: list[Any]) -> dict:
    return {
        "api": "completions",
        "request": {"model": "m", "prompt": "text"},
        "response": {
            "choices": [
                {
                    "text": "out",
                    "prompt_token_ids": prompt,
                    "token_ids": response,
                    "logprobs": {"token_logprobs": log_probs},
                },
                {"text": "second", "prompt_token_ids": prompt, "token_ids": response},
            ]
        },
        "server": None,
    }


@st.composite
def histories(draw: st.DrawFn) -> list[tuple[Any, ...]]:
    """A list of (op, ...) steps for rollouts 'r0' and 'r1'."""
    convs = [Conversation(draw(st.lists(TOKEN, min_size=1, max_size=12))) for _ in range(3)]
    steps: list[tuple[Any, ...]] = []
    for _ in range(draw(st.integers(1, 28))):
        rollout = draw(st.sampled_from(["r0", "r1"]))
        attempt = draw(st.sampled_from(ATTEMPTS))
        op = draw(
            st.sampled_from(
                [
                    "extend",
                    "extend",
                    "extend",
                    "edit",
                    "fresh",
                    "retry",
                    "fail",
                    "completions",
                    "reward",
                    "other",
                    "delete",
                    "odd",
                ]
            )
        )
        c = convs[draw(st.integers(0, 2))]
        if op == "reward":
            steps.append(("event", rollout, attempt, "reward", {"value": draw(st.floats(-1, 1))}))
            continue
        if op == "other":
            steps.append(("event", rollout, attempt, "log", {"text": draw(TEXT)}))
            continue
        if op == "delete":
            steps.append(("delete", rollout))
            continue
        if op == "edit" and len(c.prompt) > 1:  # rewrite the context from some point on
            cut = draw(st.integers(0, len(c.prompt) - 1))
            c.prompt = c.prompt[:cut] + draw(st.lists(TOKEN, max_size=6))
            if c.messages:
                c.messages[draw(st.integers(0, len(c.messages) - 1))] = {
                    "role": "user",
                    "content": draw(TEXT),
                }
        elif op == "fresh":
            c.prompt = draw(st.lists(TOKEN, min_size=0, max_size=10))
            c.messages = [{"role": "system", "content": draw(TEXT)}]
        response = draw(st.lists(TOKEN, max_size=5))
        log_probs: list[Any] = draw(
            st.lists(
                st.floats(-20, 0) | st.sampled_from([0, -0.0, math.nan, None]),
                min_size=len(response),
                max_size=len(response),
            )
            | st.just([])
        )
        if op == "fail":
            data: dict[str, Any] = {
                "api": "chat.completions",
                "request": {"messages": list(c.messages)},
                "response": None,
                "http_status": 502,
                "status": "error",
                "error": "upstream failed",
            }
        elif op == "completions":
            data = completions_call(list(c.prompt), response, log_probs)
        elif op == "odd":  # ids beyond uint32, or no messages at all: stored whole
            data = chat_call([*c.prompt, draw(st.sampled_from([-1, 2**32, 2**40]))], [], response, log_probs)
            del data["request"]["messages"]
        else:
            data = chat_call(
                list(c.prompt), list(c.messages), response, log_probs, draw(st.sampled_from(SHAPES))
            )
        steps.append(("event", rollout, attempt, "model_request", data))
        if op in ("extend", "edit", "fresh", "completions"):  # the next call carries this one's turn
            c.prompt = c.prompt + response + draw(st.lists(TOKEN, max_size=8))
            c.messages = [
                *c.messages,
                {"role": "assistant", "content": draw(TEXT)},
                {"role": "tool", "content": draw(TEXT)},
            ]
    return steps


async def replay(steps: list[tuple[Any, ...]], stores: list[Store], reference: Store) -> list[bytes]:
    """Run the steps against the stores (delta) and the reference (whole); the POST answers."""
    answers = []
    for s in [*stores, reference]:
        await s.create_rollouts([Rollout(rollout_id=r, input={}) for r in ("r0", "r1")])
    for t, step in enumerate(steps):
        if step[0] == "delete":
            for s in [*stores, reference]:
                await s.delete_rollout(step[1])
                await s.create_rollouts([Rollout(rollout_id=step[1], input={})])
            continue
        _, rollout, attempt, event_type, data = step
        plain = make_record(rollout, attempt, event_type, data, float(t), delta=False)
        ref_seq = await reference.append_event(plain)
        for s in stores:
            record = make_record(rollout, attempt, event_type, data, float(t))
            seq = await s.append_event(record)
            assert seq == ref_seq
            answers.append(appended_event(seq, record))
        assert answers[-1] == appended_event(ref_seq, plain)
    return answers


async def assert_same_reads(store: Store, reference: Store) -> None:
    for rollout in ("r0", "r1"):
        for attempt in (None, *ATTEMPTS):
            for event_type in (None, "model_request", "reward"):
                for view in ("data", "triplet"):
                    mine = await store.list_events(rollout, attempt, event_type, view=view)
                    theirs = await reference.list_events(rollout, attempt, event_type, view=view)
                    assert render_events(mine, view) == render_events(theirs, view), (rollout, attempt, view)
            if attempt is None:
                continue
            packed = render_events(
                await store.list_events(rollout, attempt, view="triplet_delta"), "triplet_delta"
            )
            whole = render_events(await reference.list_events(rollout, attempt, view="triplet"), "triplet")
            assert orjson.dumps(expand_prompt_refs(orjson.loads(packed))) == whole
            # lazy prompts (what the trainer keeps) read the same, and aggregate to the same rows
            lazy = expand_prompt_refs(orjson.loads(packed), lazy=True)
            expected = orjson.loads(whole)
            assert lazy == expected
            for level in AggregationLevel:
                assert aggregate_rollout(lazy, rollout, "g", 1.0, level) == aggregate_rollout(
                    expected, rollout, "g", 1.0, level
                )


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    steps=histories(),
    block=st.sampled_from([2, 3, 1024]),
    index_size=st.sampled_from([1, 64]),
    min_prompt=st.sampled_from([0, 0, 6]),
)
def test_every_read_matches_plain_storage(
    steps: list[tuple[Any, ...]],
    block: int,
    index_size: int,
    min_prompt: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(delta_mod, "BLOCK", block)  # small blocks: partial prefixes are shared too
    monkeypatch.setattr(delta_mod, "MIN_PROMPT_IDS", min_prompt)  # short prompts: whole, or not

    async def run() -> None:
        with tempfile.TemporaryDirectory() as tmp:
            memory = MemoryStore()
            sqlite = SqliteStore(Path(tmp) / "s.db")
            reference = MemoryStore()
            for s in (memory, sqlite, reference):
                await s.open()
            memory._calls = CallIndex(index_size)
            sqlite._calls = CallIndex(index_size)
            try:
                await replay(steps, [memory, sqlite], reference)
                await assert_same_reads(memory, reference)
                await assert_same_reads(sqlite, reference)
            finally:
                for s in (memory, sqlite, reference):
                    await s.close()

    asyncio.run(run())


def long_conversation(turns: int, first: int = 500, turn: int = 60) -> list[dict[str, Any]]:
    prompt = list(range(1000, 1000 + first))
    messages: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
    out = []
    for t in range(turns):
        response = [7 + t] * turn
        out.append(chat_call(list(prompt), list(messages), response, [-0.5] * turn))
        prompt = prompt + response + [5] * turn
        messages = [
            *messages,
            {"role": "assistant", "content": f"a{t}"},
            {"role": "tool", "content": "out" * 20},
        ]
    return out


async def test_a_long_rollout_stores_each_token_about_once(tmp_path: Path) -> None:
    """30 calls whose contexts grow to ~4.5k tokens: the stored calls hold every prompt id once
    (4 bytes), not the ~80k ids the calls repeat between them."""
    store = MemoryStore()
    await store.open()
    await store.create_rollouts([Rollout(rollout_id="r", input={})])
    calls = long_conversation(30, first=1000)
    for t, data in enumerate(calls):
        await store.append_event(make_record("r", "a", "model_request", data, float(t)))
    stored = store._events["r"]
    suffix_ids = sum(len(delta_mod._decode(e.record.call).tokens.suffix) for e in stored) // 4
    unique = 1000 + 29 * 120  # the first prompt, then each turn's response and tool output
    assert suffix_ids == unique
    repeated = sum(len(c["response"]["prompt_token_ids"]) for c in calls)
    assert repeated > 15 * unique
    # reads rebuild them whole
    events = orjson.loads(render_events(await store.list_events("r", "a")))
    assert [e["data"] for e in events] == calls
    # the trainer's view: each later prompt a lazy reference, merged into one row
    packed = render_events(await store.list_events("r", "a", view="triplet_delta"), "triplet_delta")
    lazy = expand_prompt_refs(orjson.loads(packed), lazy=True)
    prompts = [e["data"]["prompt_token_ids"] for e in lazy]
    assert type(prompts[0]) is list and all(isinstance(p, PromptIds) for p in prompts[1:])
    assert sum(len(p.suffix) for p in prompts[1:]) == 29 * 120
    (row,) = aggregate_rollout(lazy, "r", "g", 1.0)
    assert row.n_calls == 30 and row.prompt_ids == list(range(1000, 2000))


async def test_a_restarted_sqlite_store_reads_old_deltas_and_starts_a_new_chain(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(delta_mod, "MIN_PROMPT_IDS", 0)
    calls = long_conversation(6, first=50, turn=5)
    store = SqliteStore(tmp_path / "s.db")
    await store.open()
    await store.create_rollouts([Rollout(rollout_id="r", input={})])
    for t, data in enumerate(calls[:3]):
        await store.append_event(make_record("r", "a", "model_request", data, float(t)))
    await store.close()
    store = SqliteStore(tmp_path / "s.db")
    await store.open()
    try:
        for t, data in enumerate(calls[3:], 3):
            await store.append_event(make_record("r", "a", "model_request", data, float(t)))
        events = orjson.loads(render_events(await store.list_events("r", "a")))
        assert [e["data"] for e in events] == calls
    finally:
        await store.close()


def test_the_index_is_bounded_and_forgets_deleted_rollouts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(delta_mod, "MIN_PROMPT_IDS", 0)
    index = CallIndex(max_attempts=2)
    record = make_record("r", "a", "model_request", chat_call([1, 2, 3], [], [4], [-1.0]), 0.0)
    for i, (rid, aid) in enumerate([("r", "a"), ("r", "b"), ("s", "a")]):
        _, pending = index.encode(record, record.call)
        pending.key = (rid, aid)
        index.remember(pending, i + 1)
    assert len(index) == 2
    index.forget("s")
    assert len(index) == 1
    _, stale = index.encode(record, record.call)  # encoded before a delete: not remembered after it
    index.forget("x")
    index.remember(stale, 9)
    assert len(index) == 1


async def test_a_version_1_database_is_upgraded_and_reads_as_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(delta_mod, "MIN_PROMPT_IDS", 0)
    calls = long_conversation(4, first=20, turn=3)
    path = tmp_path / "s.db"
    store = SqliteStore(path)
    await store.open()
    await store.create_rollouts([Rollout(rollout_id="r", input={})])
    for t, data in enumerate(calls[:2]):  # stored whole, as schema 1 stored every event
        await store.append_event(make_record("r", "a", "model_request", data, float(t), delta=False))
    await store.close()
    conn = sqlite3.connect(path)
    conn.execute("ALTER TABLE events DROP COLUMN call")
    conn.execute("PRAGMA user_version=1")
    conn.commit()
    conn.close()
    store = SqliteStore(path)
    await store.open()
    try:
        for t, data in enumerate(calls[2:], 2):
            await store.append_event(make_record("r", "a", "model_request", data, float(t)))
        events = orjson.loads(render_events(await store.list_events("r", "a")))
        assert [e["data"] for e in events] == calls
    finally:
        await store.close()
    conn = sqlite3.connect(path)
    assert (
        conn.execute("PRAGMA user_version").fetchone()[0] == sqlite_mod.SCHEMA_VERSION
    )  # upgraded to today's
    assert conn.execute("SELECT count(call) FROM events").fetchone()[0] == 2
    conn.close()


def format_1_blob(
    flags: int,
    tok: tuple[int, int],
    msg: tuple[int, int],
    suffix: list[int],
    response: list[int],
    messages: list[bytes],
) -> bytes:
    """A call as the Gateway stored it before format 2 (one list: `request.messages`, in the header)."""
    head = delta_mod._HEADER_V2.pack(1, flags, *tok, *msg, 4 * len(suffix), 4 * len(response), 0)
    return b"".join((head, *(struct.pack("<I", i) for i in suffix + response), b"\n".join(messages)))


def test_calls_stored_in_format_1_read_as_before() -> None:
    first, second = long_conversation(2, first=6, turn=2)
    stored = []
    for seq, data, tok, msg, suffix, new in (
        (1, first, (0, 0), (0, 0), first["response"]["prompt_token_ids"], first["request"]["messages"]),
        (
            2,
            second,
            (1, 6),
            (1, 1),
            second["response"]["prompt_token_ids"][6:],
            second["request"]["messages"][1:],
        ),
    ):
        residual = orjson.loads(orjson.dumps(data))
        residual["request"]["messages"] = PH_MESSAGES
        residual["response"]["prompt_token_ids"] = "\x00agl:prompt_token_ids"
        residual["response"]["choices"][0]["token_ids"] = "\x00agl:token_ids"
        flags = delta_mod.F_PROMPT | delta_mod.F_MESSAGES | delta_mod.F_RESPONSE
        blob = format_1_blob(
            flags,
            tok,
            msg,
            suffix,
            data["response"]["choices"][0]["token_ids"],
            [orjson.dumps(m) for m in new],
        )
        record = make_record("r", "a", "model_request", data, float(seq), delta=False)
        stored.append(StoredEvent(seq, dataclasses.replace(record, data=orjson.dumps(residual), call=blob)))
    whole = delta_mod.materialize(stored, "data")
    assert [orjson.loads(e.record.data) for e in whole] == [first, second]


def as_format_2(blob: bytes) -> bytes:
    """A call stored in format 3 as the Gateway stored it in format 2: the prompt's base, shared
    ids and list lengths in a fixed header, log-probs said by a flag."""
    d = delta_mod._decode(blob)
    t = d.tokens
    lp = bytes(t.log_probs) if t.log_probs is not None else b""
    flags = d.flags | (delta_mod.F_LOGPROBS if t.log_probs is not None else 0)
    head = delta_mod._HEADER_V2.pack(
        2, flags, t.ref or 0, t.shared, 0, 0, len(t.suffix), len(t.response), len(lp)
    )
    slots = [d.slots[k] for k in sorted(d.slots)]
    return b"".join(
        (
            head,
            *(delta_mod._SLOT_HEADER.pack(s.base, s.shared, len(s.new)) for s in slots),
            t.suffix,
            t.response,
            lp,
            *(s.new for s in slots),
        )
    )


async def test_calls_stored_in_format_2_read_as_before() -> None:
    """Rows written before the tokens became one `TokenDelta` (format 3) read the same in every view."""
    store = MemoryStore()
    await store.open()
    for api in SHAPES:
        await store.create_rollouts([Rollout(rollout_id=api, input={})])
        calls = [
            chat_call(c["response"]["prompt_token_ids"], c["request"]["messages"], [7] * 60, [-0.5] * 60, api)
            for c in long_conversation(4, first=1000)
        ]
        calls[-1]["response"]["choices"][0]["logprobs"] = None  # a call whose log-probs were not reported
        for t, data in enumerate(calls):
            await store.append_event(make_record(api, "a", "model_request", data, float(t)))
        stored = store._events[api]
        old = [
            StoredEvent(e.sequence, dataclasses.replace(e.record, call=as_format_2(e.record.call)))
            for e in stored
        ]
        assert all(e.record.call[0] == 2 for e in old) and delta_mod.bases_of(old[-1].record.call)
        assert len(delta_mod._decode(old[-1].record.call).slots) == (1 if api == "chat.completions" else 2)
        for view in ("data", "triplet", "triplet_delta"):
            assert delta_mod.materialize(old, view) == delta_mod.materialize(stored, view)
        triplets = [orjson.loads(e.record.triplet or b"") for e in delta_mod.materialize(old, "triplet")]
        assert triplets[-1]["response_log_probs"] is None and triplets[0]["response_log_probs"] == [-0.5] * 60


async def test_a_long_responses_or_anthropic_rollout_is_stored_as_compactly_as_chat() -> None:
    """A Responses-API agent (Codex CLI) re-sends its whole history as `input` items, an Anthropic
    one as messages, and the proxy records their chat form too: every such list is a delta, so
    30 calls cost about what the chat route's calls cost, not the O(T²) of re-sent histories."""
    store = MemoryStore()
    await store.open()
    chat = long_conversation(30, first=1000)
    kept = {}
    for api in SHAPES:
        await store.create_rollouts([Rollout(rollout_id=api, input={})])
        calls = [
            chat_call(
                c["response"]["prompt_token_ids"],
                c["request"]["messages"],
                c["response"]["choices"][0]["token_ids"],
                [-0.5] * 60,
                api,
            )
            for c in chat
        ]
        for t, data in enumerate(calls):
            await store.append_event(make_record(api, "a", "model_request", data, float(t)))
        kept[api] = sum(len(e.record.data) + len(e.record.call or b"") for e in store._events[api])
        events = orjson.loads(render_events(await store.list_events(api, "a")))
        assert [e["data"] for e in events] == calls
    whole = sum(len(orjson.dumps(c)) for c in chat)
    assert kept["chat.completions"] < whole / 3, (kept, whole)
    assert kept["responses"] < 1.3 * kept["chat.completions"], kept
    assert kept["anthropic.messages"] < 1.3 * kept["chat.completions"], kept
