"""The model proxy's routes: OpenAI calls of a rollout, and pause/resume/state for weight updates.

An agent's base URL is `{gateway}/proxy/rollout/{id}/attempt/{aid}/mode/{train|val}/openai/v1`.
Each call is rewritten (see rewrite.py), forwarded to the rollout's inference server with
retries (upstream.py), and recorded as one `model_request` event before the agent gets the
answer (capture.py; for a stream, before its last event).
"""

from __future__ import annotations

import time
from typing import Annotated

import orjson
from fastapi import APIRouter, Path, Request, Response

from agentlightning.log import get_logger
from agentlightning.schemas import ID_PATTERN, PauseRequest, ProxyState
from agentlightning.server.proxy.capture import CallRecord
from agentlightning.server.proxy.responses import Answer, StreamAnswer, error_answer, paused_answer
from agentlightning.server.proxy.rewrite import Api, pick_endpoint, rewrite, wants_usage_chunk
from agentlightning.server.proxy.runtime import ProxyRuntime
from agentlightning.server.state import GatewayState, get_state
from agentlightning.server.store import RolloutNotFound

log = get_logger("proxy")
router = APIRouter(tags=["proxy"])
BASE = "/proxy/rollout/{rollout_id}/attempt/{attempt_id}/mode/{mode}/openai/v1"
PathId = Annotated[str, Path(pattern=ID_PATTERN)]
MODES = ("train", "val")
UPSTREAM_PATHS: dict[Api, str] = {"chat.completions": "/chat/completions", "completions": "/completions"}


@router.post(BASE + "/chat/completions", response_class=Response)
async def chat_completions(rollout_id: PathId, attempt_id: PathId, mode: str, request: Request) -> Response:
    """OpenAI chat completions, streamed or not, for one attempt of a rollout."""
    return await _proxy(request, rollout_id, attempt_id, mode, "chat.completions")


@router.post(BASE + "/completions", response_class=Response)
async def completions(rollout_id: PathId, attempt_id: PathId, mode: str, request: Request) -> Response:
    """OpenAI (legacy) completions, streamed or not, for one attempt of a rollout."""
    return await _proxy(request, rollout_id, attempt_id, mode, "completions")


@router.api_route(
    BASE + "/{rest:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE"], include_in_schema=False
)
async def other_paths(rest: str) -> Response:
    return error_answer(
        404,
        f"the model proxy serves POST .../openai/v1/chat/completions and .../completions, not '{rest}'",
        "not_found",
    )


async def _proxy(request: Request, rollout_id: str, attempt_id: str, mode: str, api: Api) -> Response:
    if mode not in MODES:
        return error_answer(404, f"unknown mode '{mode}' in the proxy URL: use train or val", "not_found")
    state = get_state(request)
    runtime = state.proxy
    if runtime.paused:
        return paused_answer(runtime.retry_after_seconds, runtime.reason)
    # Counted from here, with no await since the pause check: a drain cannot miss this call.
    runtime.inflight += 1
    handed_over = False
    try:
        response = await _call(request, state, runtime, rollout_id, attempt_id, mode, api)
        # An answer with a `done` callback ends the count itself, after its last byte.
        handed_over = getattr(response, "done", None) is not None
        return response
    finally:
        if not handed_over:
            runtime.inflight -= 1


async def _call(
    request: Request,
    state: GatewayState,
    runtime: ProxyRuntime,
    rollout_id: str,
    attempt_id: str,
    mode: str,
    api: Api,
) -> Response:
    timestamp = time.time()
    started = time.perf_counter()

    def done() -> None:
        runtime.inflight -= 1

    if not runtime.is_known(rollout_id):
        if await state.store.get_rollout(rollout_id) is None:
            return error_answer(404, str(RolloutNotFound(rollout_id)), "not_found")
        runtime.remember(rollout_id)
    try:
        body = orjson.loads(await request.body())
    except orjson.JSONDecodeError as exc:
        return error_answer(400, f"request body is not valid JSON: {exc}", "invalid_request_error")
    if not isinstance(body, dict):
        return error_answer(
            400, "request body must be a JSON object (an OpenAI request)", "invalid_request_error"
        )

    config = state.config.default_proxy
    params = rewrite(body, api, mode, config)
    stream = body.get("stream") is True
    record = CallRecord(rollout_id, attempt_id, timestamp, api, mode, body, params, stream)
    forwarded = await runtime.upstream.forward(
        lambda: pick_endpoint(state.models.endpoints(config.model_name), rollout_id),
        UPSTREAM_PATHS[api],
        orjson.dumps({**body, **params}),
        stream,
    )

    def rollout_gone() -> None:
        runtime.forget(rollout_id)

    if forwarded.stream is not None:
        return StreamAnswer(
            forwarded, record, state.store, started, wants_usage_chunk(body), done, rollout_gone
        )

    latency_ms = (time.perf_counter() - started) * 1000
    status = forwarded.status
    if forwarded.error == "no_endpoint":
        message = (
            f"no inference server is registered for model '{config.model_name}': "
            "register one with POST /api/models (the trainer does this when it starts)"
        )
        answer = error_answer(503, message, "no_endpoint")
        record.finish(http_status=503, latency_ms=latency_ms, model=None, tries=0, error=message)
    elif forwarded.error is not None:  # retries used up
        kind = "upstream_timeout" if status == 504 else "upstream_error"
        answer = error_answer(status, forwarded.error, kind)
        record.finish(
            http_status=status,
            latency_ms=latency_ms,
            model=forwarded.model,
            tries=forwarded.tries,
            error=forwarded.error,
        )
        log.warning("upstream_failed", rollout_id=rollout_id, status=status, error=forwarded.error)
    else:  # the upstream's answer, passed through as it is
        answer = Answer(forwarded.body, status, forwarded.content_type)
        response = None
        error = None
        if 200 <= status < 300:
            try:
                response = orjson.loads(forwarded.body)
            except orjson.JSONDecodeError:
                error = f"the inference server answered {status} with a body that is not JSON"
        else:
            error = (
                f"the inference server answered {status}: {forwarded.body[:1000].decode(errors='replace')}"
            )
        record.finish(
            http_status=status,
            latency_ms=latency_ms,
            model=forwarded.model,
            tries=forwarded.tries,
            response=response,
            error=error,
        )
    try:
        await record.save(state.store)
    except RolloutNotFound as exc:
        rollout_gone()
        return error_answer(404, str(exc), "not_found")
    answer.done = done
    return answer


@router.post("/proxy/pause", response_model=ProxyState)
async def pause(body: PauseRequest, request: Request) -> ProxyState:
    """New calls get 429 with Retry-After until resumed; calls in flight finish (watch `inflight`)."""
    runtime = get_state(request).proxy
    runtime.pause(body.retry_after_seconds, body.reason)
    log.info("proxy_paused", reason=body.reason, inflight=runtime.inflight)
    return runtime.state()


@router.post("/proxy/resume", response_model=ProxyState)
async def resume(request: Request) -> ProxyState:
    runtime = get_state(request).proxy
    runtime.resume()
    log.info("proxy_resumed", inflight=runtime.inflight)
    return runtime.state()


@router.get("/proxy/state", response_model=ProxyState)
async def proxy_state(request: Request) -> ProxyState:
    return get_state(request).proxy.state()
