"""One proxied model call through its stages, each once, each in a file of its own:

1. check: the mode, the pause, the rollout (here);
2. parse: the agent's JSON body (here);
3. rewrite: the proxy's parameters set, Responses and Messages translated to chat, the
   endpoint picked (rewrite.py; the translations: openai_responses.py, anthropic_messages.py);
4. dispatch: a scripted fault, the token path or the inference server itself (dispatch.py:
   token_exact.py, token_stream.py, upstream.py);
5. answer: back in the agent's API (answers.py);
6. record: one `model_request` event, saved before the agent gets the answer (capture.py; MoE
   routes apart: experts.py). A stream records itself before its last event.

An agent's base URL is `{gateway}/proxy/rollout/{id}/attempt/{aid}/mode/{train|val}/openai/v1`
(the APIs and their routes, declared once: apis.py).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from starlette.responses import Response

from agentlightning.server.proxy.answers import Answer, answer_for, error_answer, paused_answer
from agentlightning.server.proxy.apis import Api
from agentlightning.server.proxy.capture import CallRecord
from agentlightning.server.proxy.dispatch import dispatch
from agentlightning.server.proxy.rewrite import rewrite_call
from agentlightning.server.proxy.translate import ApiInputError
from agentlightning.server.state import GatewayState
from agentlightning.server.store import RolloutNotFound

MODES = ("train", "val")


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


async def _call(
    state: GatewayState,
    read_body: Callable[[], Awaitable[bytes]],
    rollout_id: str,
    attempt_id: str,
    mode: str,
    api: Api,
) -> Response:
    """The stages, each once: check the rollout, parse, rewrite, dispatch, answer, record."""
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
    try:
        request = await rewrite_call(state, body, api, mode, rollout_id)
    except ApiInputError as exc:
        return error_answer(400, str(exc), "invalid_request_error", api=api)
    record = CallRecord(rollout_id, attempt_id, timestamp, api, mode, body, request.params, request.stream)
    if request.translation is not None:
        record.data["chat_request"] = request.upstream_body

    dispatched = await dispatch(state, request, record, raw, api, mode, started, done, rollout_gone)
    upstream_s = time.perf_counter() - started
    if isinstance(dispatched, Response):  # a stream: it records the call itself, before its end
        return dispatched
    forwarded, exact = dispatched

    answer, routes = answer_for(
        request, record, forwarded, exact, api, mode, state.config.default_proxy, started
    )
    try:
        if routes is None:
            await record.save(state.store)
        else:
            await runtime.routes.save(state.store, record, routes)
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
