"""The packed wire formats (agentlightning/wire.py): what is encoded decodes to what it was, and
what the Gateway writes is what the client reads."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import httpx
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentlightning.client import AsyncGatewayClient
from agentlightning.server.app import create_app
from agentlightning.server.store import delta as delta_mod
from agentlightning.wire import (
    PromptIds,
    TokenDelta,
    bytes_to_floats,
    bytes_to_ids,
    expand_prompt_refs,
    floats_to_bytes,
    ids_to_bytes,
)

U32 = st.integers(0, 2**32 - 1)
LOG_PROB = st.floats(allow_nan=False, allow_infinity=False)  # any finite float64, -0.0 included
TAIL = st.fixed_dictionaries(
    {},
    optional={
        "server": st.fixed_dictionaries({"model": st.text(max_size=4), "version": st.integers(0, 9)}),
        "http_status": st.sampled_from([200, 502]),
        "status": st.sampled_from(["ok", "error"]),
        "error": st.text(max_size=6),
    },
)


@given(ids=st.lists(st.integers(-1, 2**32) | U32, max_size=40))
def test_ids_round_trip_as_uint32_and_refuse_what_does_not_fit(ids: list[int]) -> None:
    raw = ids_to_bytes(ids)
    if all(0 <= i < 2**32 for i in ids):
        assert raw is not None and len(raw) == 4 * len(ids) and bytes_to_ids(raw) == ids
    else:
        assert raw is None


@given(values=st.lists(LOG_PROB, max_size=40))
def test_log_probs_round_trip_exactly_as_float64(values: list[float]) -> None:
    raw = floats_to_bytes(values)
    assert len(raw) == 8 * len(values)
    assert [v.hex() for v in bytes_to_floats(raw)] == [v.hex() for v in values]  # bit for bit


@given(
    ref=st.none() | st.integers(0, 2**63 - 1),
    suffix=st.lists(U32, max_size=20),
    response=st.lists(U32, max_size=20),
    log_probs=st.none() | st.lists(LOG_PROB, max_size=20),
    before=st.binary(max_size=8),
    after=st.binary(max_size=8),
)
def test_a_token_delta_packs_and_unpacks_to_itself_in_binary_and_in_json(
    ref: int | None,
    suffix: list[int],
    response: list[int],
    log_probs: list[float] | None,
    before: bytes,
    after: bytes,
) -> None:
    """The store keeps `pack()`'s bytes among its own (`before`, `after`), the collection format
    sends `to_json`: both give back the same delta."""
    raw_suffix, raw_response = ids_to_bytes(suffix), ids_to_bytes(response)
    assert raw_suffix is not None and raw_response is not None
    lp = floats_to_bytes(log_probs) if log_probs is not None else None
    delta = TokenDelta(ref, 7 if ref is not None else 0, raw_suffix, raw_response, lp)
    packed = delta.pack()
    got, end = TokenDelta.unpack(before + packed + after, len(before))
    assert end == len(before) + len(packed)
    assert (got.ref, got.shared, bytes(got.suffix), bytes(got.response)) == (
        ref,
        delta.shared,
        raw_suffix,
        raw_response,
    )
    assert (bytes(got.log_probs) if got.log_probs is not None else None) == lp
    data = orjson.loads(delta.to_json(b'{"server":null}'))
    assert TokenDelta.from_json(data) == delta and data == {"server": None}  # the delta's keys taken out
    assert got.response_ids() == response
    assert [v.hex() for v in got.log_prob_values() or []] == [v.hex() for v in log_probs or []]


@st.composite
def packed_answers(draw: st.DrawFn) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Events of one `triplet_delta` answer — calls packed (referring to earlier calls' prompts,
    chains of references included), calls left in the triplet form, rewards — and the `triplet`
    view they stand for."""
    answer: list[dict[str, Any]] = []
    expected: list[dict[str, Any]] = []
    prompts: list[tuple[int, list[int]]] = []  # (index in the answer, whole prompt) of the calls
    for j in range(draw(st.integers(1, 10))):
        kind = draw(st.sampled_from(["packed", "packed", "packed", "whole", "reward"]))
        if kind == "reward":
            data = {"value": draw(LOG_PROB)}
            answer.append({"event_type": "reward", "data": dict(data)})
            expected.append({"event_type": "reward", "data": data})
            continue
        suffix = draw(st.lists(U32, max_size=8))
        ref: tuple[int, int] | None = None
        prompt = suffix
        if kind == "packed" and prompts and draw(st.booleans()):
            i, base = draw(st.sampled_from(prompts))
            ref = (i, draw(st.integers(0, len(base))))
            prompt = base[: ref[1]] + suffix
        response = draw(st.lists(U32, max_size=6))
        log_probs = draw(st.none() | st.lists(LOG_PROB, min_size=len(response), max_size=len(response)))
        tail = draw(TAIL)
        triplet = {
            "prompt_token_ids": prompt,
            "response_token_ids": response,
            "response_log_probs": log_probs,
            **tail,
        }
        if kind == "packed":
            lp = floats_to_bytes(log_probs) if log_probs is not None else None
            raw_suffix, raw_response = ids_to_bytes(suffix), ids_to_bytes(response)
            assert raw_suffix is not None and raw_response is not None
            at, shared = ref if ref is not None else (None, 0)
            delta = TokenDelta(at, shared, raw_suffix, raw_response, lp)
            packed = delta.to_json(orjson.dumps(tail))
            answer.append({"event_type": "model_request", "data": orjson.loads(packed)})
        else:
            answer.append({"event_type": "model_request", "data": orjson.loads(orjson.dumps(triplet))})
        expected.append({"event_type": "model_request", "data": triplet})
        prompts.append((j, prompt))
    return answer, expected


@settings(max_examples=60, deadline=None)
@given(
    case=packed_answers(), slices=st.lists(st.tuples(st.integers(-12, 40), st.integers(-12, 40)), max_size=4)
)
def test_triplet_delta_decodes_to_the_triplet_view(
    case: tuple[list[dict[str, Any]], list[dict[str, Any]]], slices: list[tuple[int, int]]
) -> None:
    answer, expected = case
    lazy_answer = orjson.loads(orjson.dumps(answer))
    # the whole view: the same JSON, key order included, as the `triplet` route sends
    assert orjson.dumps(expand_prompt_refs(answer)) == orjson.dumps(expected)
    # the lazy view reads like the list it stands for
    lazy = expand_prompt_refs(lazy_answer, lazy=True)
    assert lazy == expected
    for got, want in zip(lazy, expected, strict=True):
        p = got["data"].get("prompt_token_ids")
        if not isinstance(p, PromptIds):
            continue
        whole = want["data"]["prompt_token_ids"]
        assert len(p) == len(whole) and list(p) == whole and p.whole() == whole
        assert [p[k] for k in range(-len(whole), len(whole))] == whole + whole
        for a, b in slices:
            assert p[a:b] == whole[a:b]


def test_a_reference_to_a_later_event_is_refused() -> None:
    packed = orjson.loads(TokenDelta(1, 0, b"", b"", None).to_json(b"{}"))
    with pytest.raises(ValueError, match="not an earlier event"):
        expand_prompt_refs([{"event_type": "model_request", "data": packed}, {"data": {}}])


@st.composite
def conversations(draw: st.DrawFn) -> tuple[list[tuple[str, dict[str, Any]]], bool]:
    """Events of one attempt — calls extending, retrying or restarting a conversation, rewards —
    and whether a call surely refers to an earlier one (it extends the previous call's whole
    prompt, and no retry takes an earlier call out of the answer)."""
    prompt = draw(st.lists(st.integers(0, 30), min_size=1, max_size=8))
    events: list[tuple[str, dict[str, Any]]] = []
    extending = refers = retried = False
    for _ in range(draw(st.integers(1, 8))):
        op = draw(st.sampled_from(["extend", "extend", "retry", "restart", "reward"]))
        if op == "reward":
            events.append(("reward", {"value": draw(st.floats(-1, 1))}))
            continue
        if op == "restart":
            prompt = draw(st.lists(st.integers(0, 30), min_size=1, max_size=8))
        refers |= extending and op != "restart"
        retried |= op == "retry"
        response = draw(st.lists(st.integers(0, 30), min_size=1, max_size=4))
        log_probs = draw(st.lists(st.floats(-5, 0), min_size=len(response), max_size=len(response)))
        choice = {
            "token_ids": response,
            "logprobs": {"content": [{"token": "t", "logprob": lp} for lp in log_probs]},
        }
        data = {
            "request": {"messages": [{"role": "user", "content": "go"}]},
            "response": {"prompt_token_ids": list(prompt), "choices": [choice]},
            "server": {"model": "policy", "version": 1},
        }
        events.append(("model_request", data))
        extending = op != "retry"
        if extending:
            prompt = prompt + response + draw(st.lists(st.integers(0, 30), max_size=4))
    return events, refers and not retried


def test_what_the_gateway_writes_the_client_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the Gateway's app and the client: the `triplet_delta` batch answer, decoded, is the
    `triplet` batch answer. One Gateway for all examples, a rollout each."""
    monkeypatch.setattr(delta_mod, "MIN_PROMPT_IDS", 0)  # split every call, however short
    monkeypatch.setattr(delta_mod, "BLOCK", 2)  # share partial prefixes too
    app = create_app({"store": {"url": "memory://"}})
    lifespan = app.router.lifespan_context(app)
    client = AsyncGatewayClient("http://gateway", transport=httpx.ASGITransport(app=app))
    rollout_ids = (f"r{i}" for i in itertools.count())

    async def check(events: list[tuple[str, dict[str, Any]]], refers: bool) -> None:
        rid = next(rollout_ids)
        await client.create_rollouts([{"rollout_id": rid, "input": {}}])
        await client.patch_rollout(rid, state="running", last_attempt_id="a")
        for event_type, data in events:
            await client.post_event(rid, "a", event_type, data)
        (packed,) = await client.get_events_batch([rid], format="triplet_delta")
        (whole,) = await client.get_events_batch([rid], format="triplet")
        if refers:  # the Gateway did pack calls as references
            assert any(e["data"].get("prompt_ref") for e in packed["events"])
        assert expand_prompt_refs(packed["events"]) == whole["events"]

    with asyncio.Runner() as runner:  # one event loop: the Gateway stays open between examples
        runner.run(lifespan.__aenter__())
        try:

            @settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
            @given(case=conversations())
            def every_conversation(case: tuple[list[tuple[str, dict[str, Any]]], bool]) -> None:
                runner.run(check(*case))

            every_conversation()
        finally:
            runner.run(client.aclose())
            runner.run(lifespan.__aexit__(None, None, None))
