"""A token-path chat call streamed to the agent while the engine generates it.

Generate (`/inference/v1/generate` with `stream: true`) sends the new token ids in an event per
engine step; the events go through vLLM's streamed derender (carrying the state the previous
request handed back: the first event at once, then the events of each `proxy.token_stream_interval_ms`
together, one request for them) and on to the agent as a chat chunk with its
`token_ids` (the first also with `prompt_token_ids`), as vLLM's own chat stream does with
`return_token_ids`, or re-spoken in the agent's API (Responses, Messages: translate.ApiStream).
When generation ends, the whole generation is derendered once, as for a call that is not
streamed (token_exact.py), so the recorded call is the same; it is recorded before the stream's
last event goes out.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import orjson
from starlette.types import Send

from agentlightning.log import get_logger
from agentlightning.schemas import Model
from agentlightning.server.proxy.answers import UpstreamStream, error_event
from agentlightning.server.proxy.capture import CallRecord
from agentlightning.server.proxy.sse import DONE, EventSplitter, event_data
from agentlightning.server.proxy.token_exact import (
    GENERATE,
    Prepared,
    TokenExact,
    generate_event_problem,
    token_logprobs,
)
from agentlightning.server.proxy.translate import ApiStream, sse
from agentlightning.server.proxy.upstream import Forwarded
from agentlightning.server.store import RolloutNotFound, Store

log = get_logger("proxy")


class ChatStream:
    """The chat stream itself (translate.ApiStream): each chunk as it is, then the usage chunk
    if the agent asked for it, and `[DONE]`."""

    def __init__(self, pass_usage: bool) -> None:
        self.pass_usage = pass_usage

    def chunk(self, chunk: dict[str, Any]) -> bytes:
        return sse("chunk", chunk, named=False)

    def finish(self, chat: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
        tail = b""
        if self.pass_usage:
            head = {k: chat.get(k) for k in ("id", "created", "model")}
            usage: dict[str, Any] = {
                **head,
                "object": "chat.completion.chunk",
                "choices": [],
                "usage": chat.get("usage"),
            }
            tail = sse("chunk", usage, named=False)
        return chat, tail + b"data: [DONE]\n\n"

    def error(self, status: int, message: str, kind: str) -> bytes:
        return error_event(status, message, kind)


class TokenStreamAnswer(UpstreamStream):
    """The agent's stream, chunk by chunk as generate's events arrive, in the agent's API
    (`events`). If the agent leaves mid-stream, generate's stream is closed (vLLM then aborts the
    request) and the call is recorded as incomplete, with the tokens generated so far."""

    def __init__(
        self,
        tokens: TokenExact,
        model: Model,
        prepared: Prepared,
        generate: Forwarded,
        record: CallRecord,
        store: Store,
        started: float,
        events: ApiStream,
        done: Callable[[], None],
        on_rollout_gone: Callable[[], None],
    ) -> None:
        super().__init__(generate.stream, record, store, started, False, done, on_rollout_gone)
        self.tokens = tokens
        self.model = model
        self.prepared = prepared
        self.events = events

    async def _pump(self, send: Send) -> bytes:
        """Send the chunks until generation ends; record the call. Returns the last bytes to send."""
        prepared = self.prepared
        ids: list[int] = []
        logprobs: list[dict[str, Any]] = []
        finish: str | None = None
        stop_reason: Any = None
        state: Any = None
        first = True
        error: str | None = None
        splitter = EventSplitter()

        def received(event: dict[str, Any]) -> None:
            """One generate event into the record: what was generated, sent to the agent or not."""
            nonlocal finish, stop_reason
            choice = event["choices"][0]
            ids.extend(choice.get("token_ids") or [])
            logprobs.extend((choice.get("logprobs") or {}).get("content") or [])
            if choice.get("finish_reason") is not None:
                finish, stop_reason = choice["finish_reason"], choice.get("stop_reason")

        async def forward(event: dict[str, Any]) -> str | None:
            """Generate's events (merged) to the agent; what failed, if anything."""
            nonlocal state, first
            choice = event["choices"][0]
            new = choice.get("token_ids") or []
            content = (choice.get("logprobs") or {}).get("content") or []
            derendered = await self.tokens.derender_event(self.model, prepared, event, state)
            if isinstance(derendered, str):
                return derendered
            chunk, state = derendered
            if not chunk["choices"]:
                chunk["choices"] = [{"index": 0, "delta": {}, "finish_reason": choice.get("finish_reason")}]
            chunk["choices"][0]["token_ids"] = new
            if content:
                chunk["choices"][0]["logprobs"] = token_logprobs(content)
            if first:
                chunk["prompt_token_ids"] = prepared.prompt
                first = False
            try:
                body = self.events.chunk(chunk)
                if body:
                    await send({"type": "http.response.body", "body": body, "more_body": True})
            except OSError:  # servers on ASGI spec 2.4 raise when the agent has gone
                self.agent_gone = True
                self.upstream.close()
            return None

        # Generate's events are held until `interval` has passed since the last chunk went out (the
        # first goes at once, the last when generation finishes): one derender request for them all.
        interval = self.tokens.upstream.config.token_stream_interval_ms / 1000
        loop = asyncio.get_running_loop()
        held: list[dict[str, Any]] = []
        sent_at = -math.inf
        read: asyncio.Future[bytes] | None = None
        try:
            while True:
                if read is None:
                    read = asyncio.ensure_future(self.upstream.content.readany())
                # While events are held, wait for more only until their time is up.
                await asyncio.wait(
                    (read,), timeout=max(0.0, sent_at + interval - loop.time()) if held else None
                )
                if read.done():
                    data = read.result()  # raises what the read raised
                    read = None
                    if not data:  # the end of generate's stream
                        break
                    events, error = self._events(splitter, data)
                    for event in events:
                        received(event)
                    held += events
                    if error is not None:
                        break
                    ended = bool(held) and held[-1]["choices"][0].get("finish_reason") is not None
                    if not held or (not ended and loop.time() < sent_at + interval):
                        continue
                if held:
                    error = await forward(merged(held))
                    held, sent_at = [], loop.time()
                if error is not None or self.agent_gone:
                    break
            if error is None and held and not self.agent_gone:  # ended without a finish reason
                error = await forward(merged(held))
        except (aiohttp.ClientError, TimeoutError) as exc:
            if not self.agent_gone:
                error = f"the inference server's {GENERATE} stream broke: {type(exc).__name__}: {exc}"
        finally:
            if read is not None:
                read.cancel()
        if self.agent_gone:
            error = "the agent disconnected mid-stream"
        elif error is None and finish is None:
            error = f"the inference server's {GENERATE} stream ended before the answer finished"
        generation = {
            "choices": [
                {
                    "index": 0,
                    "token_ids": ids,
                    "finish_reason": finish,
                    "stop_reason": stop_reason,
                    "logprobs": {"content": logprobs} if logprobs else None,
                }
            ]
        }
        response: dict[str, Any] | None = None
        tries = prepared.tries
        if error is None:  # the whole answer, derendered as a call that is not streamed
            exact = await self.tokens.answer(self.model, prepared, generation)
            if exact is None:
                error = f"{self.model.endpoint} does not serve the token path's derender step"
            else:
                response, tries = exact.response, exact.tries
                if response is None:
                    forwarded = exact.forwarded
                    error = forwarded.error or (
                        f"the token path's derender step answered {forwarded.status}: "
                        f"{forwarded.body[:1000].decode(errors='replace')}"
                    )
        if response is None:  # what was generated, as a pass-through stream's record keeps it
            response = {"choices": generation["choices"], "prompt_token_ids": prepared.prompt}
        tail = b""
        if error is None:
            answer, tail = self.events.finish(response)
            if not isinstance(self.events, ChatStream):  # a translated API's answer, as the agent got it
                self.record.data["api_response"] = answer
        self.record.finish(
            http_status=200,
            latency_ms=(time.perf_counter() - self.started) * 1000,
            model=self.model,
            tries=tries,
            response=response,
            error=error,
            incomplete=error is not None,
        )
        try:
            await self.record.save(self.store)
        except RolloutNotFound as exc:
            self.on_rollout_gone()
            return self.events.error(404, str(exc), "not_found")
        except Exception as exc:
            log.exception("stream_record_failed", rollout_id=self.record.rollout_id)
            return self.events.error(
                500, f"the call could not be recorded: {type(exc).__name__}: {exc}", "internal_error"
            )
        if error is not None:
            return self.events.error(502, error, "upstream_error")
        return tail

    def _events(self, splitter: EventSplitter, data: bytes) -> tuple[list[dict[str, Any]], str | None]:
        """Generate's events in one read of its stream, and what was wrong with the first that is
        not vLLM's (the events before it are kept)."""
        events: list[dict[str, Any]] = []
        for raw in splitter.feed(data):
            payload = event_data(raw)
            if payload is None or payload.strip() == DONE:
                continue
            try:
                event = orjson.loads(payload)
            except orjson.JSONDecodeError:
                event = None
            problem = generate_event_problem(event)
            if problem is not None:
                began = payload[:200].decode(errors="replace")
                return events, (
                    f"{self.model.endpoint} sent an event on the token path's {GENERATE} stream that "
                    f"is not vLLM's: {problem} (it began: {began})"
                )
            events.append(event)
        return events, None


def merged(events: list[dict[str, Any]]) -> dict[str, Any]:
    """Generate's events that arrived together as one: their token ids and log-probs in order,
    the last one's finish. While a derender request is out, the events that come meanwhile wait
    in the connection's buffer and go to the next derender together: one request a read, not
    one a token, when the engine outpaces the Gateway."""
    if len(events) == 1:
        return events[0]
    choices = [event["choices"][0] for event in events]
    content = [e for c in choices for e in ((c.get("logprobs") or {}).get("content") or [])]
    last = choices[-1]
    choice = {
        **choices[0],
        "token_ids": [t for c in choices for t in c.get("token_ids") or []],
        "logprobs": {"content": content} if content else None,
        "finish_reason": last.get("finish_reason"),
        "stop_reason": last.get("stop_reason"),
    }
    return {**events[-1], "choices": [choice]}
