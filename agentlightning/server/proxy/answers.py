"""The answer stage: what the agent gets back, in its API. A whole answer (`answer_for`: from
what the dispatch stage brought back, translated back for Responses and Messages, the call's
record finished), an error, or the pass-through event stream (`StreamAnswer`; the token path's
stream is token_stream.py's).

Each holds a `done` callback that runs after its last byte was sent (or the agent left), so
the in-flight count covers a call until the agent has all of it.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import orjson
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from agentlightning.log import get_logger
from agentlightning.server.config import DefaultProxyConfig
from agentlightning.server.proxy.anthropic_messages import error_body as anthropic_error_body
from agentlightning.server.proxy.apis import Api
from agentlightning.server.proxy.capture import CallRecord
from agentlightning.server.proxy.experts import pop_routed_experts
from agentlightning.server.proxy.rewrite import ProxyRequest, wants_usage_chunk
from agentlightning.server.proxy.sse import DONE, EventSplitter, StreamAssembler, event_data, parse_event
from agentlightning.server.proxy.token_exact import ExactCall, chat_stream
from agentlightning.server.proxy.translate import ApiStream, chat_usage, whole_stream
from agentlightning.server.proxy.upstream import Forwarded
from agentlightning.server.store import RolloutNotFound, Store

log = get_logger("proxy")


def error_body(status: int, message: str, kind: str, api: str = "chat.completions") -> bytes:
    """An error in the shape of the agent's API: OpenAI's (also carrying the Gateway's `detail`)
    or, on the Anthropic route, Anthropic's `{type: error, error: {type, message}}`."""
    if api == "anthropic.messages":
        return anthropic_error_body(status, message)
    return orjson.dumps({"detail": message, "error": {"message": message, "type": kind, "code": status}})


class Answer(Response):
    """A whole answer; runs `done` once it was sent."""

    def __init__(
        self,
        body: bytes,
        status: int,
        media_type: str = "application/json",
        headers: dict[str, str] | None = None,
        done: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(body, status, headers, media_type)
        self.done = done

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            if self.done is not None:
                self.done()


def error_answer(
    status: int, message: str, kind: str, headers: dict[str, str] | None = None, api: str = "chat.completions"
) -> Answer:
    return Answer(error_body(status, message, kind, api), status, headers=headers)


def paused_answer(retry_after_seconds: float, reason: str | None, api: str = "chat.completions") -> Answer:
    message = "the model proxy is paused for a weight update; retry later"
    if reason:
        message += f" ({reason})"
    headers = {
        "Retry-After": str(max(math.ceil(retry_after_seconds), 0)),
        "retry-after-ms": str(int(retry_after_seconds * 1000)),  # read first by the OpenAI SDKs
        "X-Agl-Paused": "true",
    }
    return error_answer(429, message, "paused", headers, api)


STREAM_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


class UpstreamStream(Response):
    """An upstream event stream turned into the agent's, recorded before its last event: the
    agent leaving closes the upstream call (vLLM then aborts the request); `_pump` forwards the
    events, records the call and returns the last bytes to send."""

    def __init__(
        self,
        upstream: aiohttp.ClientResponse | None,
        record: CallRecord,
        store: Store,
        started: float,
        pass_usage: bool,
        done: Callable[[], None],
        on_rollout_gone: Callable[[], None],
    ) -> None:
        super().__init__(status_code=200)
        assert upstream is not None
        self.upstream: aiohttp.ClientResponse = upstream
        self.record = record
        self.store = store
        self.started = started
        self.pass_usage = pass_usage
        self.done = done
        self.on_rollout_gone = on_rollout_gone
        self.agent_gone = False

    async def _watch(self, receive: Receive) -> None:
        while True:
            try:
                message = await receive()
            except OSError:  # some servers raise instead of sending http.disconnect
                message = {"type": "http.disconnect"}
            if message["type"] == "http.disconnect":
                self.agent_gone = True
                self.upstream.close()  # stops the pump's read at once
                return

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        watcher = asyncio.create_task(self._watch(receive))
        try:
            await send({"type": "http.response.start", "status": 200, "headers": STREAM_HEADERS})
            tail = await self._pump(send)
            watcher.cancel()
            if not self.agent_gone:
                await send({"type": "http.response.body", "body": tail, "more_body": False})
        finally:
            watcher.cancel()
            self.upstream.close()
            self.done()

    async def _pump(self, send: Send) -> bytes:
        raise NotImplementedError


class StreamAnswer(UpstreamStream):
    """Passes the upstream's server-sent events to the agent as they arrive (or, for a translated
    API, each chat chunk re-spoken in it: `events`), assembles them, and records the call before
    the stream's last event (`data: [DONE]`) goes out.

    If the agent leaves mid-stream the upstream call is closed (vLLM then aborts the request)
    and what arrived so far is recorded, marked incomplete.
    """

    def __init__(
        self,
        forwarded: Forwarded,
        record: CallRecord,
        store: Store,
        started: float,
        pass_usage: bool,
        done: Callable[[], None],
        on_rollout_gone: Callable[[], None],
        events: ApiStream | None = None,
    ) -> None:
        super().__init__(forwarded.stream, record, store, started, pass_usage, done, on_rollout_gone)
        self.forwarded = forwarded
        self.events = events

    async def _pump(self, send: Send) -> bytes:
        """Forward events until the upstream ends; record the call. Returns the last bytes to send."""
        events = self.events
        assembler = StreamAssembler("chat.completions" if events is not None else self.record.data["api"])
        splitter = EventSplitter()
        done_event = b"data: [DONE]\n\n"
        saw_done = False
        error: str | None = None

        async def forward(event: bytes) -> None:
            nonlocal saw_done, done_event
            payload = event_data(event)
            if payload is not None:
                if payload.strip() == DONE:
                    saw_done, done_event = True, event
                    return
                chunk = parse_event(payload)
                assembler.add(chunk)
                if events is not None:  # the chunk in the agent's API; an error event is said at the end
                    ok = isinstance(chunk, dict) and chunk.get("error") is None
                    event = events.chunk(chunk) if ok else b""
                    if not event:
                        return
                elif not self.pass_usage and _usage_only(chunk):
                    return
            try:
                await send({"type": "http.response.body", "body": event, "more_body": True})
            except OSError:  # servers on ASGI spec 2.4 raise when the agent has gone
                self.agent_gone = True
                self.upstream.close()

        try:
            async for data in self.upstream.content.iter_any():
                for event in splitter.feed(data):
                    await forward(event)
                    if self.agent_gone:
                        break
            rest = splitter.rest()
            if rest.strip():
                await forward(rest + b"\n\n")
        except (aiohttp.ClientError, TimeoutError) as exc:
            if not self.agent_gone:
                error = f"the inference server's stream broke: {type(exc).__name__}: {exc}"
        complete = saw_done or bool(
            assembler.choices and all(c.finish_reason for c in assembler.choices.values())
        )
        if self.agent_gone:
            error = "the agent disconnected mid-stream"
        elif error is None and assembler.error is not None:
            error = f"the inference server sent an error: {orjson.dumps(assembler.error).decode()}"
        elif error is None and not complete:
            error = "the inference server's stream ended before the answer finished"
        tail = done_event
        if events is not None and error is None:
            answer, tail = events.finish(assembler.response())
            self.record.data["api_response"] = answer
        self.record.finish(
            http_status=200,
            latency_ms=(time.perf_counter() - self.started) * 1000,
            model=self.forwarded.model,
            tries=self.forwarded.tries,
            response=assembler.response(),
            error=error,
            incomplete=not complete or self.agent_gone,
        )
        say = events.error if events is not None else error_event
        try:
            await self.record.save(self.store)
        except RolloutNotFound as exc:
            self.on_rollout_gone()
            return say(404, str(exc), "not_found")
        except Exception as exc:
            log.exception("stream_record_failed", rollout_id=self.record.rollout_id)
            return say(500, f"the call could not be recorded: {type(exc).__name__}: {exc}", "internal_error")
        if error is not None and (assembler.error is None or events is not None):
            # (a chat stream's upstream error event was passed on already)
            return say(502, error, "upstream_error")
        return tail


def _usage_only(chunk: Any) -> bool:
    return isinstance(chunk, dict) and chunk.get("choices") == [] and chunk.get("usage") is not None


def error_event(status: int, message: str, kind: str) -> bytes:
    return b"data: " + orjson.dumps({"error": {"message": message, "type": kind, "code": status}}) + b"\n\n"


def answer_for(
    request: ProxyRequest,
    record: CallRecord,
    forwarded: Forwarded,
    exact: ExactCall | None,
    api: Api,
    mode: str,
    config: DefaultProxyConfig,
    started: float,
) -> tuple[Answer, object]:
    """The answer stage: the agent's answer in its API from what came back, and the call's
    record finished; with vLLM's MoE routes when it sent them on a train-mode call (kept apart:
    experts.py)."""
    body, translation, stream = request.body, request.translation, request.stream
    latency_ms = (time.perf_counter() - started) * 1000
    status = forwarded.status
    routes = None
    if forwarded.error == "no_endpoint":
        message = (
            f"no inference server is registered for model '{request.model_name}': "
            "register one with POST /api/models (the trainer does this when it starts)"
        )
        answer = error_answer(503, message, "no_endpoint", api=api)
        record.finish(http_status=503, latency_ms=latency_ms, model=None, tries=0, error=message)
    elif forwarded.error is not None:  # retries used up
        kind = "upstream_timeout" if status == 504 else "upstream_error"
        answer = error_answer(status, forwarded.error, kind, api=api)
        record.finish(
            http_status=status,
            latency_ms=latency_ms,
            model=forwarded.model,
            tries=forwarded.tries,
            error=forwarded.error,
        )
        log.warning("upstream_failed", rollout_id=record.rollout_id, status=status, error=forwarded.error)
    else:  # the upstream's answer, passed through as it is
        answer = Answer(forwarded.body, status, forwarded.content_type)
        response = None
        error = None
        if exact is not None and exact.response is not None:
            response = exact.response
            if translation is None:
                answer = (
                    Answer(chat_stream(response, wants_usage_chunk(body)), 200, "text/event-stream")
                    if stream
                    else Answer(orjson.dumps(response), 200)
                )
        elif 200 <= status < 300:
            try:
                response = orjson.loads(forwarded.body)
            except orjson.JSONDecodeError:
                error = f"the inference server answered {status} with a body that is not JSON"
            if config.include_routed_experts and isinstance(response, dict):
                # vLLM (0.32: `enable_return_routed_experts` server-side) returns routes on every
                # answer: never the agent's to see (as v1.0); kept for train-mode calls only.
                routes = pop_routed_experts(response)
                answer = Answer(orjson.dumps(response), status, forwarded.content_type)
                if mode != "train":
                    routes = None
        else:
            error = (
                f"the inference server answered {status}: {forwarded.body[:1000].decode(errors='replace')}"
            )
            if translation is not None:  # in the agent's API's error shape, with the server's status
                answer = error_answer(status, error, "upstream_error", api=api)
        if translation is not None and error is not None and 200 <= status < 300:
            answer = error_answer(502, error, "upstream_error", api=api)
        elif translation is not None and isinstance(response, dict):
            if stream:
                events = translation.Stream(body, chat_usage(response)[0])
                api_response, streamed = whole_stream(events, response)
                answer = Answer(streamed, status, "text/event-stream")
            else:
                api_response = translation.from_chat(response, body)
                answer = Answer(orjson.dumps(api_response), status)
            record.data["api_response"] = api_response
        record.finish(
            http_status=status,
            latency_ms=latency_ms,
            model=forwarded.model,
            tries=forwarded.tries,
            response=response,
            error=error,
        )
    return answer, routes
