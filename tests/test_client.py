"""The typed client: retries only where repeating is harmless, errors that carry the server's message."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from agentlightning.client import (
    AsyncGatewayClient,
    BadRequest,
    Conflict,
    GatewayClient,
    GatewayUnavailable,
    NotFound,
    RetryPolicy,
    ServerError,
    Unauthorized,
)
from agentlightning.schemas import Event, Rollout, RolloutState
from tests.conftest import RunningGateway

FAST = RetryPolicy(attempts=4, backoff_seconds=0.001, max_backoff_seconds=0.002)


class Script:
    """A mock transport answering from a list of outcomes: a status code or an exception."""

    def __init__(self, *outcomes: int | Exception, body: bytes = b"[]") -> None:
        self.outcomes = list(outcomes)
        self.body = body
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        outcome = self.outcomes.pop(0) if len(self.outcomes) > 1 else self.outcomes[0]
        if isinstance(outcome, Exception):
            raise outcome
        body = self.body if outcome < 400 else b'{"detail": "scripted failure"}'
        return httpx.Response(outcome, content=body, headers={"content-type": "application/json"})


def client(script: Script) -> GatewayClient:
    return GatewayClient("http://gw", key="k", retry=FAST, transport=httpx.MockTransport(script))


def test_idempotent_reads_retry_on_5xx_then_succeed() -> None:
    script = Script(503, 502, 200)
    assert client(script).list_rollouts() == []
    assert len(script.requests) == 3
    assert script.requests[0].headers["authorization"] == "Bearer k"


def test_retries_give_up_with_the_server_message() -> None:
    script = Script(500)
    with pytest.raises(ServerError, match="scripted failure") as err:
        client(script).list_rollouts()
    assert err.value.status_code == 500 and len(script.requests) == FAST.attempts


def test_non_idempotent_calls_are_not_repeated_on_5xx_or_read_errors() -> None:
    for outcome in (503, httpx.ReadTimeout("slow")):
        script = Script(outcome, 200, body=b"{}")
        with pytest.raises((ServerError, GatewayUnavailable)):
            client(script).post_event("r", "a", "log", {})
        assert len(script.requests) == 1
        script = Script(outcome, 200, body=b"{}")
        with pytest.raises((ServerError, GatewayUnavailable)):
            client(script).patch_rollout("r", state=RolloutState.RUNNING)
        assert len(script.requests) == 1


def test_connection_refused_is_retried_for_every_call() -> None:
    event = b'{"event_type":"log","rollout_id":"r","attempt_id":"a","timestamp":1.0,"data":{}}'
    script = Script(httpx.ConnectError("refused"), 200, body=event)
    assert client(script).post_event("r", "a", "log", {}).event_type == "log"
    assert len(script.requests) == 2


def test_create_is_retried_only_with_preassigned_ids() -> None:
    script = Script(503, 200)
    with pytest.raises(ServerError):
        client(script).create_rollouts([{"input": 1}])
    assert len(script.requests) == 1
    script = Script(503, 200)
    assert client(script).create_rollouts([{"input": 1, "rollout_id": "x"}]) == []
    assert len(script.requests) == 2


def test_unreachable_gateway_raises_gateway_unavailable() -> None:
    with pytest.raises(GatewayUnavailable, match="did not answer after 4 tries"):
        client(Script(httpx.ConnectError("refused"))).health()


@pytest.mark.parametrize(
    ("status", "error"),
    [(400, BadRequest), (401, Unauthorized), (404, NotFound), (409, Conflict), (422, BadRequest)],
)
def test_error_classes(status: int, error: type[Exception]) -> None:
    with pytest.raises(error, match="scripted failure"):
        client(Script(status)).list_rollouts()


def test_ids_are_sent_as_one_path_segment() -> None:
    script = Script(204)
    client(script).delete_rollout("a b/c?d")
    assert script.requests[0].url.raw_path == b"/api/rollouts/a%20b%2Fc%3Fd"


def test_against_a_real_gateway(gateway: RunningGateway) -> None:
    with GatewayClient(gateway.url, key=gateway.key) as c:
        c.create_rollouts(
            [{"rollout_id": "r1", "input": {"q": "2+2"}, "metadata": {"data_id": "d1", "tag": "x"}}]
        )
        with pytest.raises(BadRequest, match=r"status\.colour"):
            c.patch_rollout("r1", colour="red")
        with pytest.raises(Conflict, match="queuing to succeeded"):
            c.patch_rollout("r1", state="succeeded")
        c.patch_rollout("r1", state="running", last_attempt_id="a1")
        c.post_reward("r1", "a1", 0.75, reason="close")
        c.patch_rollout("r1", state=RolloutState.SUCCEEDED)
        page = c.terminal()
        assert [(i.rollout_id, i.data_id) for i in page.items] == [("r1", "d1")]
        [triplet] = c.get_events_json("r1")
        assert triplet["data"] == {"value": 0.75, "reason": "close"}
        assert c.get_rollout("r1").rollout.metadata.model_extra == {"tag": "x"}
        c.register_models([{"model": "policy", "endpoint": "http://m/v1", "version": 2}])
        assert [m.version for m in c.list_models()] == [2]
        c.delete_rollout("r1")
        with pytest.raises(NotFound):
            c.get_rollout("r1")


def test_async_client_against_a_real_gateway(gateway_factory: Callable[..., RunningGateway]) -> None:
    gw = gateway_factory()

    async def run() -> None:
        async with AsyncGatewayClient(gw.url, key=gw.key) as c:
            await c.create_rollouts([{"rollout_id": f"r{i}"} for i in range(10)])
            polled = await c.long_poll_rollouts(["queuing"], wait_seconds=5)
            assert polled.long_polled and len(polled.value) == 10
            await asyncio.gather(*(c.patch_rollout(f"r{i}", state="running") for i in range(10)))
            empty = await c.long_poll_rollouts(["queuing"], wait_seconds=0.2)
            assert empty.value == [] and empty.long_polled
            waiter = asyncio.create_task(c.long_poll_terminal(0, wait_seconds=10))
            await asyncio.sleep(0.1)
            await c.patch_rollout("r3", state="failed", error_message="x")
            page = (await waiter).value
            assert [i.rollout_id for i in page.items] == ["r3"]

    asyncio.run(run())


_ROLLOUT = Rollout(rollout_id="r1", input={"q": 1}).model_dump_json().encode()
_EVENT = Event(
    event_type="reward", rollout_id="r", attempt_id="a", timestamp=1.0, data={"value": 1}
).model_dump_json()
_PAGE = b'{"items": [{"rollout_id": "r", "state": "succeeded"}], "next_after": 3, "total_terminal": 1}'
_PROXY = b'{"paused": true, "retry_after_seconds": 2.0, "reason": "update", "inflight": 0}'
_MODELS = b'[{"model": "m", "endpoint": "http://e:1/v1", "version": 2}]'
_DETAIL = b'{"rollout": ' + _ROLLOUT + b', "attempts": ["a"]}'
# Every operation of the clients: the arguments to call it with and what the Gateway answers.
OPERATIONS: dict[str, tuple[tuple[Any, ...], dict[str, Any], bytes]] = {
    "create_rollouts": (([{"rollout_id": "r1", "input": {"q": 1}}],), {}, b"[" + _ROLLOUT + b"]"),
    "list_rollouts": ((["running", RolloutState.QUEUING],), {"limit": 7}, b"[" + _ROLLOUT + b"]"),
    "long_poll_rollouts": ((None, 2.5), {}, b"[]"),
    "terminal": ((), {"after": 4}, _PAGE),
    "long_poll_terminal": ((4, 1.5), {"limit": 9}, _PAGE),
    "get_rollout": (("r/1",), {}, _DETAIL),
    "patch_rollout": (("r 1",), {"state": RolloutState.RUNNING, "last_attempt_id": "a"}, _ROLLOUT),
    "report_outcome": (
        ("r 1", None, "pod_lost"),
        {"detail": "OOMKilled"},
        b'{"rollout_id": "r 1", "attempt_id": "", "outcome": "pod_lost", "detail": "OOMKilled"}',
    ),
    "delete_rollout": (("r 1",), {}, b""),
    "delete_rollouts": ((["a", "b"],), {}, b'{"deleted": 1}'),
    "mint_agent_token": (("r", "a"), {}, b'{"token": "t", "rollout_id": "r", "attempt_id": "a"}'),
    "post_event": (("r", "a", "log", {"x": [1, 2]}), {}, _EVENT.encode()),
    "post_reward": (("r", "a", 0.5), {"source": "test"}, _EVENT.encode()),
    "get_events": (("r",), {"event_type": "reward", "format": "triplet"}, b"[" + _EVENT.encode() + b"]"),
    "get_events_json": (("r",), {"attempt_id": "a"}, b"[" + _EVENT.encode() + b"]"),
    "get_events_batch": ((["r"],), {"format": "triplet_delta", "event_type": "model_request"}, b"[]"),
    "register_models": (([{"model": "m", "endpoint": "http://e:1/v1", "version": 2}],), {}, _MODELS),
    "list_models": ((), {}, _MODELS),
    "delete_models": ((), {}, b'{"status": "ok"}'),
    "pause": ((), {"retry_after_seconds": 2.0, "reason": "update"}, _PROXY),
    "resume": ((), {}, _PROXY),
    "proxy_state": ((), {}, _PROXY),
    "health": ((), {}, b'{"status": "ok"}'),
    "post_run_metrics": (("run 1", [{"step": 1, "metrics": {"loss": 0.5}}]), {}, b""),
}


def _public(cls: type) -> set[str]:
    return {name for name in dir(cls) if not name.startswith("_")}


def test_the_sync_and_async_clients_have_the_same_operations_doing_the_same() -> None:
    """Both clients expose the same operations, with the same signatures, sending the same requests
    and reading the answers the same way; a new operation must be added to OPERATIONS."""
    assert _public(GatewayClient) - {"close"} == _public(AsyncGatewayClient) - {"aclose"} == set(OPERATIONS)
    sent: list[tuple[str, str, bytes]] = []
    reply = {"body": b""}

    def gateway(request: httpx.Request) -> httpx.Response:
        sent.append((request.method, str(request.url), request.read()))
        return httpx.Response(200, content=reply["body"], headers={"x-agl-long-poll": "1"})

    sync = GatewayClient("http://gw", key="k", transport=httpx.MockTransport(gateway))
    aio = AsyncGatewayClient("http://gw", key="k", transport=httpx.MockTransport(gateway))
    for name, (args, kwargs, reply["body"]) in OPERATIONS.items():
        sync_method, async_method = getattr(sync, name), getattr(aio, name)
        assert inspect.signature(sync_method) == inspect.signature(async_method), name
        sent.clear()
        got = sync_method(*args, **kwargs)
        awaitable = async_method(*args, **kwargs)
        assert inspect.iscoroutine(awaitable), name
        assert asyncio.run(awaitable) == got, name
        assert len(sent) == 2 and sent[0] == sent[1], (name, sent)
    sync.close()
    asyncio.run(aio.aclose())
