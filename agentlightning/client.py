"""Typed client of the API Gateway, sync (`GatewayClient`) and async (`AsyncGatewayClient`).

Every component talks to the Gateway through this module. Each operation is described once, in
`_Operations`: a function from the method's arguments to a `_Call` (method, path, body, whether
it is safe to repeat, how to read the answer). Both clients inherit that table and only differ
in how they send a call (`_run`): blocking, or awaitable. Calls are retried with exponential backoff on
connection failures (always: nothing reached the server) and, when repeating them is harmless,
on other transport errors and 5xx answers.
"""

from __future__ import annotations

import asyncio
import functools
import os
import random
import ssl
import time
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, ParamSpec, TypeVar, overload
from urllib.parse import quote

import httpx
import orjson
from pydantic import BaseModel, TypeAdapter

from agentlightning.schemas import (
    EVENT_REWARD,
    AgentToken,
    AttemptOutcome,
    AttemptOutcomeState,
    Event,
    Model,
    ProxyState,
    Rollout,
    RolloutCreate,
    RolloutDetail,
    RolloutState,
    TerminalPage,
)

# The batch route's `triplet_delta` events are read back with `expand_prompt_refs`, documented as
# part of this client (docs/long_horizon.md), into model calls' `CollectedTriplet`s; the format
# itself lives in the wire layer.
from agentlightning.wire import CollectedTriplet as CollectedTriplet
from agentlightning.wire import PromptIds as PromptIds
from agentlightning.wire import expand_prompt_refs as expand_prompt_refs

T = TypeVar("T")
P = ParamSpec("P")
LONG_POLL_HEADER = "x-agl-long-poll"

_ROLLOUTS = TypeAdapter(list[Rollout])
_EVENTS = TypeAdapter(list[Event])
_MODELS = TypeAdapter(list[Model])


# --- errors -------------------------------------------------------------------------------


class GatewayError(Exception):
    """The Gateway answered with an error. `detail` is its message."""

    def __init__(self, status_code: int, detail: str, method: str, url: str) -> None:
        super().__init__(f"{method} {url} -> {status_code}: {detail}")
        self.status_code = status_code
        self.detail = detail


class BadRequest(GatewayError):
    """400, 413 or 422: the request was malformed or invalid."""


class Unauthorized(GatewayError):
    """401 or 403: missing or wrong key."""


class NotFound(GatewayError):
    pass


class Conflict(GatewayError):
    """409: e.g. an illegal state transition."""


class ServerError(GatewayError):
    """5xx after all retries."""


class GatewayUnavailable(Exception):
    """The Gateway could not be reached after all retries."""


BatchFormat = Literal["raw", "triplet", "triplet_delta"]


def _error_class(status: int) -> type[GatewayError]:
    if status in (400, 413, 422):
        return BadRequest
    if status in (401, 403):
        return Unauthorized
    if status == 404:
        return NotFound
    if status == 409:
        return Conflict
    if status >= 500:
        return ServerError
    return GatewayError


def _detail(response: httpx.Response) -> str:
    try:
        detail = orjson.loads(response.content).get("detail", response.text)
    except (orjson.JSONDecodeError, AttributeError):
        return response.text[:2000] or response.reason_phrase
    if isinstance(detail, list):  # FastAPI validation errors: make them one readable line
        parts = []
        for err in detail:
            if isinstance(err, dict):
                loc = ".".join(str(p) for p in err.get("loc", ()))
                parts.append(f"{loc}: {err.get('msg', err)}")
            else:
                parts.append(str(err))
        return "; ".join(parts)
    return str(detail)


# --- retry policy and call descriptions ----------------------------------------------------


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 6
    backoff_seconds: float = 0.2
    max_backoff_seconds: float = 5.0
    jitter: float = 0.25
    retry_statuses: frozenset[int] = frozenset({500, 502, 503, 504})

    def delay(self, attempt: int) -> float:
        base: float = min(self.backoff_seconds * 2.0**attempt, self.max_backoff_seconds)
        return base * random.uniform(1 - self.jitter, 1 + self.jitter)


@dataclass(frozen=True)
class Polled(Generic[T]):
    """The answer of a long-poll read. `long_polled` is False when the Gateway answered at once
    because it does not support long-polls (Agent Lightning v1.0): sleep before asking again."""

    value: T
    long_polled: bool


@dataclass
class _Call(Generic[T]):
    method: str
    path: str
    parse: Callable[[httpx.Response], T]
    idempotent: bool
    params: list[tuple[str, Any]] = field(default_factory=list)
    body: Any = None
    extra_timeout: float = 0.0


def _json_body(value: Any) -> bytes:
    def default(obj: Any) -> Any:
        if isinstance(obj, BaseModel):
            return obj.model_dump(mode="json", exclude_unset=True)
        raise TypeError(f"cannot send {type(obj).__name__} as JSON")

    return orjson.dumps(value, default=default)


def _model(cls: type[BaseModel]) -> Callable[[httpx.Response], Any]:
    return lambda r: cls.model_validate_json(r.content)


def tls_verify() -> ssl.SSLContext | bool:
    """How an https Gateway's certificate is checked: against $SSL_CERT_FILE when set (a private
    CA, as OpenAI's SDK and most clients read it), else the system's CAs. Proxy variables are
    not read (trust_env=False), so this one is read here."""
    cafile = os.environ.get("SSL_CERT_FILE")
    return ssl.create_default_context(cafile=cafile) if cafile else True


def _seg(value: str) -> str:
    """An id as one URL path segment."""
    return quote(value, safe="")


class _Operation(Generic[P, T]):
    """One Gateway operation: `build` turns the method's arguments into the request (`_Call`).

    Read on a `GatewayClient` it is a blocking method returning `T`; on an `AsyncGatewayClient`
    the same method returning an awaitable of `T`: each client's `_run` sends the call, so the
    two clients cannot disagree on what an operation sends or how its answer is read."""

    def __init__(self, build: Callable[P, _Call[T]]) -> None:
        self.build = build

    @overload
    def __get__(self, client: None, owner: type[Any]) -> _Operation[P, T]: ...

    @overload
    def __get__(self, client: GatewayClient, owner: type[Any]) -> Callable[P, T]: ...

    @overload
    def __get__(
        self, client: AsyncGatewayClient, owner: type[Any]
    ) -> Callable[P, Coroutine[Any, Any, T]]: ...

    def __get__(self, client: GatewayClient | AsyncGatewayClient | None, owner: type[Any]) -> Any:
        if client is None:
            return self
        build = self.build

        def method(*args: P.args, **kwargs: P.kwargs) -> Any:
            return client._run(build(*args, **kwargs))

        return functools.update_wrapper(method, build)  # its name, docstring and signature


def _polled(parse: Callable[[httpx.Response], T]) -> Callable[[httpx.Response], Polled[T]]:
    return lambda r: Polled(parse(r), LONG_POLL_HEADER in r.headers)


def _rollouts_call(
    states: Sequence[RolloutState | str] | None,
    limit: int,
    wait_seconds: float,
    parse: Callable[[httpx.Response], T],
) -> _Call[T]:
    params: list[tuple[str, Any]] = [("state_in", RolloutState(s).value) for s in states or ()]
    params.append(("limit", limit))
    if wait_seconds > 0:
        params.append(("wait_seconds", wait_seconds))
    return _Call("GET", "/api/rollouts", parse, True, params=params, extra_timeout=wait_seconds)


def _terminal_call(
    after: int, limit: int, wait_seconds: float, parse: Callable[[httpx.Response], T]
) -> _Call[T]:
    params: list[tuple[str, Any]] = [("after", after), ("limit", limit)]
    if wait_seconds > 0:
        params.append(("wait_seconds", wait_seconds))
    return _Call("GET", "/api/rollouts/terminal", parse, True, params=params, extra_timeout=wait_seconds)


def _events_call(
    rollout_id: str,
    event_type: str | None,
    format: Literal["raw", "triplet"],
    attempt_id: str | None,
    parse: Callable[[httpx.Response], T],
) -> _Call[T]:
    params: list[tuple[str, Any]] = [("format", format)]
    if event_type:
        params.append(("event_type", event_type))
    if attempt_id:
        params.append(("attempt_id", attempt_id))
    return _Call("GET", f"/api/rollouts/{_seg(rollout_id)}/events", parse, True, params=params)


def _rollouts(r: httpx.Response) -> list[Rollout]:
    return _ROLLOUTS.validate_json(r.content)


def _terminal_page(r: httpx.Response) -> TerminalPage:
    return TerminalPage.model_validate_json(r.content)


def _json(r: httpx.Response) -> Any:
    return orjson.loads(r.content)


def _nothing(r: httpx.Response) -> None:
    return None


class _Operations:
    """Every Gateway operation, described once: the client's methods (see `_Operation`)."""

    # rollouts
    @_Operation
    def create_rollouts(specs: Iterable[RolloutCreate | Mapping[str, Any]]) -> _Call[list[Rollout]]:
        body = [s if isinstance(s, RolloutCreate) else RolloutCreate.model_validate(s) for s in specs]
        # Safe to repeat only when every id is pre-assigned (creating an existing id is a no-op).
        idempotent = all(s.rollout_id for s in body)
        return _Call("POST", "/api/rollouts", _rollouts, idempotent, body=body)

    @_Operation
    def list_rollouts(
        states: Sequence[RolloutState | str] | None = None, limit: int = 500
    ) -> _Call[list[Rollout]]:
        return _rollouts_call(states, limit, 0, _rollouts)

    @_Operation
    def long_poll_rollouts(
        states: Sequence[RolloutState | str] | None, wait_seconds: float, limit: int = 500
    ) -> _Call[Polled[list[Rollout]]]:
        return _rollouts_call(states, limit, wait_seconds, _polled(_rollouts))

    @_Operation
    def terminal(after: int = 0, limit: int = 1000) -> _Call[TerminalPage]:
        return _terminal_call(after, limit, 0, _terminal_page)

    @_Operation
    def long_poll_terminal(after: int, wait_seconds: float, limit: int = 1000) -> _Call[Polled[TerminalPage]]:
        return _terminal_call(after, limit, wait_seconds, _polled(_terminal_page))

    @_Operation
    def get_rollout(rollout_id: str) -> _Call[RolloutDetail]:
        return _Call("GET", f"/api/rollouts/{_seg(rollout_id)}", _model(RolloutDetail), True)

    @_Operation
    def patch_rollout(rollout_id: str, **status: Any) -> _Call[Rollout]:
        body = {"status": {k: (v.value if isinstance(v, RolloutState) else v) for k, v in status.items()}}
        # Not repeatable: a second identical state change is an illegal transition.
        return _Call("PATCH", f"/api/rollouts/{_seg(rollout_id)}", _model(Rollout), False, body=body)

    @_Operation
    def report_outcome(
        rollout_id: str, attempt_id: str | None, outcome: AttemptOutcome | str, detail: str | None = None
    ) -> _Call[AttemptOutcomeState]:
        """Evidence of how an attempt ended (controller or admin key; not in v1.0: NotFound there).
        `attempt_id` None: a rollout that never started an attempt. Repeatable: the attempt keeps
        the strongest evidence reported, whatever the order (docs/reliability.md)."""
        body = {"outcome": AttemptOutcome(outcome).value, "detail": detail}
        path = f"/api/rollouts/{_seg(rollout_id)}/attempts/{_seg(attempt_id or '-')}/outcome"
        return _Call("PUT", path, _model(AttemptOutcomeState), True, body=body)

    @_Operation
    def delete_rollout(rollout_id: str) -> _Call[None]:
        return _Call("DELETE", f"/api/rollouts/{_seg(rollout_id)}", _nothing, True)

    @_Operation
    def delete_rollouts(rollout_ids: Sequence[str]) -> _Call[int]:
        """Delete many rollouts in one request (up to 1000; batch route, not in v1.0); how many existed."""
        body = {"rollout_ids": list(rollout_ids)}
        return _Call("POST", "/api/rollouts/batch/delete", lambda r: _json(r)["deleted"], True, body=body)

    @_Operation
    def mint_agent_token(rollout_id: str, attempt_id: str) -> _Call[AgentToken]:
        """The token of one attempt (controller or admin key; not in v1.0: NotFound there)."""
        body = {"rollout_id": rollout_id, "attempt_id": attempt_id}
        return _Call("POST", "/api/agent-tokens", _model(AgentToken), True, body=body)

    # events
    @_Operation
    def post_event(
        rollout_id: str, attempt_id: str, event_type: str, data: Mapping[str, Any]
    ) -> _Call[Event]:
        path = f"/api/rollouts/{_seg(rollout_id)}/attempt/{_seg(attempt_id)}/events"
        return _Call("POST", path, _model(Event), False, body={"event_type": event_type, "data": data})

    @_Operation
    def post_reward(rollout_id: str, attempt_id: str, value: float, **extra: Any) -> _Call[Event]:
        data = {"value": value, **extra}
        return _Operations.post_event.build(rollout_id, attempt_id, EVENT_REWARD, data)

    @_Operation
    def get_events(
        rollout_id: str,
        event_type: str | None = None,
        format: Literal["raw", "triplet"] = "raw",
        attempt_id: str | None = None,
    ) -> _Call[list[Event]]:
        return _events_call(
            rollout_id, event_type, format, attempt_id, lambda r: _EVENTS.validate_json(r.content)
        )

    @_Operation
    def get_events_json(
        rollout_id: str, format: Literal["raw", "triplet"] = "triplet", attempt_id: str | None = None
    ) -> _Call[list[dict[str, Any]]]:
        """Events as plain dicts: the fast path for bulk training-data reads."""
        return _events_call(rollout_id, None, format, attempt_id, _json)

    @_Operation
    def get_events_batch(
        rollout_ids: Sequence[str], format: BatchFormat = "triplet", event_type: str | None = None
    ) -> _Call[list[dict[str, Any]]]:
        """The last attempt's events of up to 1000 rollouts in one request, as plain dicts
        `{rollout_id, found, state, error_message, events}` (batch route, not in v1.0).
        `triplet_delta` events carry prompt references: see `expand_prompt_refs`."""
        body: dict[str, Any] = {"rollout_ids": list(rollout_ids), "format": format}
        if event_type:
            body["event_type"] = event_type
        # A read: safe to repeat.
        return _Call("POST", "/api/rollouts/batch/events", _json, True, body=body)

    # models
    @_Operation
    def register_models(models: Iterable[Model | Mapping[str, Any]]) -> _Call[list[Model]]:
        body = [m if isinstance(m, Model) else Model.model_validate(m) for m in models]
        return _Call("POST", "/api/models", lambda r: _MODELS.validate_json(r.content), True, body=body)

    @_Operation
    def list_models() -> _Call[list[Model]]:
        return _Call("GET", "/api/models", lambda r: _MODELS.validate_json(r.content), True)

    @_Operation
    def delete_models() -> _Call[None]:
        return _Call("DELETE", "/api/models", _nothing, True)

    # proxy control
    @_Operation
    def pause(retry_after_seconds: float = 5.0, reason: str | None = None) -> _Call[ProxyState]:
        body = {"retry_after_seconds": retry_after_seconds, "reason": reason}
        return _Call("POST", "/proxy/pause", _model(ProxyState), True, body=body)

    @_Operation
    def resume() -> _Call[ProxyState]:
        return _Call("POST", "/proxy/resume", _model(ProxyState), True)

    @_Operation
    def proxy_state() -> _Call[ProxyState]:
        return _Call("GET", "/proxy/state", _model(ProxyState), True)

    @_Operation
    def health() -> _Call[bool]:
        return _Call("GET", "/healthz", lambda r: True, True)

    # training runs' metrics (an addition over v1.0: the dashboard's training page)
    @_Operation
    def post_run_metrics(run_id: str, points: Iterable[Mapping[str, Any]]) -> _Call[None]:
        """Post training-step metrics `[{step, metrics: {name: value}, time?}]` for the dashboard."""
        # Idempotent: a step posted again replaces the stored one.
        return _Call("POST", f"/api/runs/{_seg(run_id)}/metrics", _nothing, True, body=list(points))


class _ClientBase(_Operations):
    def __init__(self, base_url: str, key: str, timeout: float, retry: RetryPolicy) -> None:
        self.base_url = base_url.rstrip("/")
        self.key = key
        self.timeout = timeout
        self.retry = retry
        self._headers = {"Authorization": f"Bearer {key}"} if key else {}

    def _send_args(self, call: _Call[Any]) -> dict[str, Any]:
        headers = dict(self._headers)
        content = None
        if call.body is not None:
            content = _json_body(call.body)
            headers["Content-Type"] = "application/json"
        return {
            "method": call.method,
            "url": self.base_url + call.path,
            "params": call.params,
            "content": content,
            "headers": headers,
            "timeout": self.timeout + call.extra_timeout,
        }

    def _should_retry(
        self, call: _Call[Any], attempt: int, error: Exception | None, status: int | None
    ) -> bool:
        if attempt + 1 >= self.retry.attempts:
            return False
        if isinstance(error, httpx.ConnectError | httpx.ConnectTimeout):
            return True  # the request never reached the Gateway
        if not call.idempotent:
            return False
        return error is not None or status in self.retry.retry_statuses

    def _result(self, call: _Call[T], response: httpx.Response) -> T:
        if response.status_code >= 400:
            raise _error_class(response.status_code)(
                response.status_code, _detail(response), call.method, self.base_url + call.path
            )
        return call.parse(response)

    def _unavailable(self, call: _Call[Any], error: Exception) -> GatewayUnavailable:
        return GatewayUnavailable(
            f"{call.method} {self.base_url}{call.path}: the Gateway did not answer after "
            f"{self.retry.attempts} tries: {type(error).__name__}: {error}"
        )


class GatewayClient(_ClientBase):
    """Blocking client. Use as a context manager or call close()."""

    def __init__(
        self,
        base_url: str,
        key: str = "",
        timeout: float = 30.0,
        retry: RetryPolicy | None = None,
        max_connections: int = 64,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        super().__init__(base_url, key, timeout, retry or RetryPolicy())
        self._http = httpx.Client(
            limits=httpx.Limits(max_connections=max_connections),
            trust_env=False,
            transport=transport,
            verify=tls_verify(),
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> GatewayClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self, call: _Call[T]) -> T:
        attempt = 0
        while True:
            try:
                response = self._http.request(**self._send_args(call))
            except httpx.TransportError as exc:
                if not self._should_retry(call, attempt, exc, None):
                    raise self._unavailable(call, exc) from exc
            else:
                if not self._should_retry(call, attempt, None, response.status_code):
                    return self._result(call, response)
            time.sleep(self.retry.delay(attempt))
            attempt += 1


class AsyncGatewayClient(_ClientBase):
    """The same operations as GatewayClient, awaitable."""

    def __init__(
        self,
        base_url: str,
        key: str = "",
        timeout: float = 30.0,
        retry: RetryPolicy | None = None,
        max_connections: int = 64,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        super().__init__(base_url, key, timeout, retry or RetryPolicy())
        self._http = httpx.AsyncClient(
            limits=httpx.Limits(max_connections=max_connections),
            trust_env=False,
            transport=transport,
            verify=tls_verify(),
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncGatewayClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _run(self, call: _Call[T]) -> T:
        attempt = 0
        while True:
            try:
                response = await self._http.request(**self._send_args(call))
            except httpx.TransportError as exc:
                if not self._should_retry(call, attempt, exc, None):
                    raise self._unavailable(call, exc) from exc
            else:
                if not self._should_retry(call, attempt, None, response.status_code):
                    return self._result(call, response)
            await asyncio.sleep(self.retry.delay(attempt))
            attempt += 1
