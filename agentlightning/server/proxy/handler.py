"""One proxied model call, in stages: check, parse, rewrite, dispatch, answer, record.

An agent's base URL is `{gateway}/proxy/rollout/{id}/attempt/{aid}/mode/{train|val}/openai/v1`
(the APIs: apis.py). Each call is rewritten (rewrite.py; Responses and Messages translated to
chat), dispatched to the token path (token_exact.py, token_stream.py) or forwarded to the
rollout's inference server with retries (upstream.py), answered in the agent's API, and
recorded as one `model_request` event before the agent gets the answer (capture.py; for a
stream, before its last event: responses.py, token_stream.py).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.responses import Response

from agentlightning.log import get_logger
from agentlightning.schemas import Model
from agentlightning.server.config import DefaultProxyConfig
from agentlightning.server.proxy import anthropic_messages, openai_responses
from agentlightning.server.proxy.apis import BY_API, Api
from agentlightning.server.proxy.capture import CallRecord
from agentlightning.server.proxy.context import LIMIT_KEYS, fit_max_tokens
from agentlightning.server.proxy.experts import pop_routed_experts
from agentlightning.server.proxy.responses import Answer, StreamAnswer, error_answer, paused_answer
from agentlightning.server.proxy.rewrite import pick_endpoint, rewrite, served_model, wants_usage_chunk
from agentlightning.server.proxy.token_exact import ExactCall, chat_stream, messages_of
from agentlightning.server.proxy.token_stream import ChatStream, TokenStreamAnswer
from agentlightning.server.proxy.translate import ApiInputError, chat_usage, whole_stream
from agentlightning.server.proxy.upstream import Forwarded
from agentlightning.server.state import GatewayState
from agentlightning.server.store import RolloutNotFound
from agentlightning.server.triplet import model_request_triplet

log = get_logger("proxy")
MODES = ("train", "val")
TRANSLATIONS = {"responses": openai_responses, "anthropic.messages": anthropic_messages}


async def handle_call(
    state: GatewayState,
    read_body: Callable[[], Awaitable[bytes]],
    rollout_id: str,
    attempt_id: str,
    mode: str,
    api: Api,
) -> Response:
    """The answer to one agent call. The in-flight count covers it until its last byte is sent."""
    if mode not in MODES:
        return error_answer(
            404, f"unknown mode '{mode}' in the proxy URL: use train or val", "not_found", api=api
        )
    runtime = state.proxy
    if runtime.paused:
        if state.metrics is not None:
            state.metrics.paused_answer(mode)
        return paused_answer(runtime.retry_after_seconds, runtime.reason, api)
    # Counted from here, with no await since the pause check: a drain cannot miss this call.
    runtime.inflight += 1
    handed_over = False
    try:
        response = await _call(state, read_body, rollout_id, attempt_id, mode, api)
        # An answer with a `done` callback ends the count itself, after its last byte.
        handed_over = getattr(response, "done", None) is not None
        return response
    finally:
        if not handed_over:
            runtime.inflight -= 1


@dataclass
class ProxyRequest:
    """An agent's call after the rewrite stage: what goes upstream, and to which endpoint."""

    body: dict[str, Any]  # the agent's request, as sent
    upstream_body: dict[str, Any]  # the chat request for a translated API; else the agent's body
    params: dict[str, Any]  # what the proxy sets on it (rewrite.py)
    model_name: str
    model: Model | None
    translation: Any  # openai_responses or anthropic_messages; None for the OpenAI APIs themselves
    stream: bool


async def _call(
    state: GatewayState,
    read_body: Callable[[], Awaitable[bytes]],
    rollout_id: str,
    attempt_id: str,
    mode: str,
    api: Api,
) -> Response:
    """The stages, each once: check the rollout, parse, rewrite, dispatch (a fault, the token path
    or the upstream), answer in the agent's API, record."""
    timestamp = time.time()
    started = time.perf_counter()
    runtime = state.proxy
    upstream_s: float | None = None
    record: CallRecord | None = None
    metrics = state.metrics

    def done() -> None:
        runtime.inflight -= 1
        if metrics is not None and record is not None:  # after the answer's last byte
            d = record.data
            metrics.observe_call(
                mode, d["http_status"] or 0, time.perf_counter() - started, upstream_s, d["retries"]
            )
            broken = (d.get("segment") or {}).get("break")
            if broken is not None:
                metrics.history_break(broken["reason"])

    def rollout_gone() -> None:
        runtime.forget(rollout_id)

    if not runtime.is_known(rollout_id):
        forgotten = runtime.forgotten
        if await state.store.get_rollout(rollout_id) is None:
            return error_answer(404, str(RolloutNotFound(rollout_id)), "not_found", api=api)
        runtime.remember(rollout_id, forgotten)
    raw = await read_body()
    body = _parse(raw, api)
    if isinstance(body, Answer):
        return body
    request = await _rewrite(state, body, api, mode, rollout_id)
    if isinstance(request, Answer):
        return request
    record = CallRecord(rollout_id, attempt_id, timestamp, api, mode, body, request.params, request.stream)
    if request.translation is not None:
        record.data["chat_request"] = request.upstream_body

    dispatched = await _dispatch(state, request, record, raw, api, mode, started, done, rollout_gone)
    upstream_s = time.perf_counter() - started
    if isinstance(dispatched, Response):  # a stream: it records the call itself, before its end
        return dispatched
    forwarded, exact = dispatched

    answer, routes = _answer(
        request, record, forwarded, exact, api, mode, state.config.default_proxy, started
    )
    try:
        if routes is None:
            await record.save(state.store)
        else:
            await _save_with_routes(state, record, routes)
    except RolloutNotFound as exc:
        rollout_gone()
        return error_answer(404, str(exc), "not_found", api=api)
    answer.done = done
    return answer


def _parse(raw: bytes, api: Api) -> dict[str, Any] | Answer:
    """The agent's request body, or the 400 that says why it is not one."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        return error_answer(400, f"request body is not valid JSON: {exc}", "invalid_request_error", api=api)
    if not isinstance(body, dict):
        return error_answer(
            400,
            "request body must be a JSON object (a request of the API called)",
            "invalid_request_error",
            api=api,
        )
    return body


async def _rewrite(
    state: GatewayState, body: dict[str, Any], api: Api, mode: str, rollout_id: str
) -> ProxyRequest | Answer:
    """The request as it goes upstream: translated to chat (Responses, Messages), the proxy's
    parameters set, its endpoint picked, `max_tokens` fitted to the served context."""
    config = state.config.default_proxy
    stream = body.get("stream") is True
    translation = TRANSLATIONS.get(api)
    # The policy the agent names (a run with several), else the configured model.
    model_name = served_model(body, config, lambda name: bool(state.models.endpoints(name)))
    if translation is None:
        upstream_body = body
        params = rewrite(body, api, mode, config, model_name)
    else:
        # Served as a chat call, a stream's chunks re-spoken in the agent's API as they come.
        try:
            upstream_body = translation.to_chat(body)
        except ApiInputError as exc:
            return error_answer(400, str(exc), "invalid_request_error", api=api)
        if stream:
            upstream_body["stream"] = True
        params = rewrite(upstream_body, "chat.completions", mode, config, model_name)
    model = pick_endpoint(state.models.endpoints(model_name), rollout_id)
    if model is not None and any(key in upstream_body for key in LIMIT_KEYS):
        fit_max_tokens(upstream_body, params, await state.proxy.context.of(model.endpoint, params["model"]))
    return ProxyRequest(body, upstream_body, params, model_name, model, translation, stream)


async def _dispatch(
    state: GatewayState,
    request: ProxyRequest,
    record: CallRecord,
    raw: bytes,
    api: Api,
    mode: str,
    started: float,
    done: Callable[[], None],
    rollout_gone: Callable[[], None],
) -> Response | tuple[Forwarded, ExactCall | None]:
    """Where the call is served: a scripted fault, the token path (a stream answered as the engine
    generates), or the upstream itself. A stream is its own answer; else what came back."""
    runtime, model, body = state.proxy, request.model, request.body
    rollout_id, attempt_id = record.rollout_id, record.attempt_id
    upstream_body, params, translation = request.upstream_body, request.params, request.translation
    exact = None
    struck = runtime.faults is not None and runtime.faults.strikes(mode, rollout_id, attempt_id, raw)
    if state.config.default_proxy.token_exact and api != "completions" and not struck:
        if model is not None and runtime.tokens.serves(model.endpoint) is not False:
            if request.stream:  # streamed as the engine generates (token_stream.py), in the agent's API
                started_stream = await runtime.tokens.stream(
                    state.store, model, upstream_body, params, rollout_id, attempt_id
                )
                if isinstance(started_stream, tuple):
                    prepared, generate = started_stream
                    record.data["segment"] = prepared.segment
                    events = (
                        ChatStream(wants_usage_chunk(body))
                        if translation is None
                        else translation.Stream(body, len(prepared.prompt))
                    )
                    return TokenStreamAnswer(
                        runtime.tokens,
                        model,
                        prepared,
                        generate,
                        record,
                        state.store,
                        started,
                        events,
                        done,
                        rollout_gone,
                    )
                exact = started_stream
            else:
                exact = await runtime.tokens.call(
                    state.store, model, upstream_body, params, rollout_id, attempt_id
                )
    if struck:
        assert runtime.faults is not None
        return runtime.faults.failure(), None
    if exact is not None:
        forwarded = exact.forwarded
        forwarded.tries = exact.tries
        record.data["segment"] = exact.segment
        return forwarded, exact
    if api != "completions":  # the attempt's earlier calls, to say where this one's prompt breaks off
        messages = messages_of(upstream_body)
        await runtime.tokens.recall(state.store, rollout_id, attempt_id, messages, None)
        record.before_save = lambda saved, call: runtime.tokens.observe(saved, call, upstream_body, messages)
    forwarded = await runtime.upstream.forward(
        lambda: pick_endpoint(state.models.endpoints(request.model_name), rollout_id),
        BY_API[api].upstream,
        orjson.dumps({**upstream_body, **params}),
        request.stream,
    )
    if forwarded.stream is not None:
        events = None if translation is None else translation.Stream(body, None)
        return StreamAnswer(
            forwarded, record, state.store, started, wants_usage_chunk(body), done, rollout_gone, events
        )
    return forwarded, None


def _answer(
    request: ProxyRequest,
    record: CallRecord,
    forwarded: Forwarded,
    exact: ExactCall | None,
    api: Api,
    mode: str,
    config: DefaultProxyConfig,
    started: float,
) -> tuple[Answer, object]:
    """The agent's answer in its API, and the call's record finished; with vLLM's MoE routes
    when it sent them on a train-mode call (kept apart: proxy/experts.py)."""
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


async def _save_with_routes(state: GatewayState, record: CallRecord, routes: object) -> None:
    """Record the call, then its routes apart (proxy/experts.py), dropping those it supersedes."""
    encoded = orjson.dumps(routes)  # parsed from JSON just before: it encodes
    del record.data["routed_experts"]  # reads splice the stored routes in (events.render_events)
    sequence = await record.save(state.store)
    if record.data.get("status") == "error":
        return
    triplet = model_request_triplet(record.data)
    await state.proxy.routes.load(state.store, record.rollout_id, record.attempt_id)
    drop = state.proxy.routes.supersede(
        record.rollout_id,
        record.attempt_id,
        sequence,
        triplet["prompt_token_ids"],
        triplet["response_token_ids"],
    )
    await state.store.put_routes(record.rollout_id, sequence, encoded, drop)
