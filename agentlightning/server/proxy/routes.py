"""The model proxy's routes: OpenAI calls of a rollout, and pause/resume/state for weight updates.

The two call routes are served by `ProxyFastPath` (asgi.py) in the Gateway app; they are
declared here too, for the API schema and for apps that mount this router alone.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Request, Response

from agentlightning.log import get_logger
from agentlightning.schemas import ID_PATTERN, PauseRequest, ProxyState
from agentlightning.server.proxy.handler import handle_call
from agentlightning.server.proxy.responses import error_answer
from agentlightning.server.state import get_state

log = get_logger("proxy")
router = APIRouter(tags=["proxy"])
ROOT = "/proxy/rollout/{rollout_id}/attempt/{attempt_id}/mode/{mode}"
BASE = ROOT + "/openai/v1"
ANTHROPIC_BASE = ROOT + "/anthropic/v1"
PathId = Annotated[str, Path(pattern=ID_PATTERN)]


@router.post(BASE + "/chat/completions", response_class=Response)
async def chat_completions(rollout_id: PathId, attempt_id: PathId, mode: str, request: Request) -> Response:
    """OpenAI chat completions, streamed or not, for one attempt of a rollout."""
    return await handle_call(
        get_state(request), request.body, rollout_id, attempt_id, mode, "chat.completions"
    )


@router.post(BASE + "/completions", response_class=Response)
async def completions(rollout_id: PathId, attempt_id: PathId, mode: str, request: Request) -> Response:
    """OpenAI (legacy) completions, streamed or not, for one attempt of a rollout."""
    return await handle_call(get_state(request), request.body, rollout_id, attempt_id, mode, "completions")


@router.post(BASE + "/responses", response_class=Response)
async def responses(rollout_id: PathId, attempt_id: PathId, mode: str, request: Request) -> Response:
    """OpenAI Responses API (stateless), streamed or not, served as a chat call and recorded as one."""
    return await handle_call(get_state(request), request.body, rollout_id, attempt_id, mode, "responses")


@router.post(ANTHROPIC_BASE + "/messages", response_class=Response)
async def anthropic_messages(rollout_id: PathId, attempt_id: PathId, mode: str, request: Request) -> Response:
    """Anthropic Messages API, streamed or not, served as a chat call and recorded as one."""
    return await handle_call(
        get_state(request), request.body, rollout_id, attempt_id, mode, "anthropic.messages"
    )


_SERVED = "POST .../openai/v1/chat/completions, .../completions, .../responses and .../anthropic/v1/messages"


@router.api_route(
    BASE + "/{rest:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE"], include_in_schema=False
)
async def other_paths(rest: str) -> Response:
    return error_answer(404, f"the model proxy serves {_SERVED}, not 'openai/v1/{rest}'", "not_found")


@router.api_route(
    ANTHROPIC_BASE + "/{rest:path}",
    methods=["GET", "POST", "PUT", "PATCH", "DELETE"],
    include_in_schema=False,
)
async def other_anthropic_paths(rest: str) -> Response:
    return error_answer(
        404,
        f"the model proxy serves {_SERVED}, not 'anthropic/v1/{rest}'",
        "not_found",
        api="anthropic.messages",
    )


@router.post("/proxy/pause", response_model=ProxyState)
async def pause(body: PauseRequest, request: Request) -> ProxyState:
    """New calls get 429 with Retry-After until resumed; calls in flight finish (watch `inflight`)."""
    state = get_state(request)
    runtime = state.proxy
    if state.replicas is not None:  # every replica's pause, and their calls in flight
        answer = await state.replicas.pause(body.retry_after_seconds, body.reason)
        log.info("proxy_paused", reason=body.reason, inflight=answer.inflight)
        return answer
    runtime.pause(body.retry_after_seconds, body.reason)
    log.info("proxy_paused", reason=body.reason, inflight=runtime.inflight)
    return runtime.state()


@router.post("/proxy/resume", response_model=ProxyState)
async def resume(request: Request) -> ProxyState:
    state = get_state(request)
    runtime = state.proxy
    if state.replicas is not None:
        answer = await state.replicas.resume()
        log.info("proxy_resumed", inflight=answer.inflight)
        return answer
    runtime.resume()
    log.info("proxy_resumed", inflight=runtime.inflight)
    return runtime.state()


@router.get("/proxy/state", response_model=ProxyState)
async def proxy_state(request: Request) -> ProxyState:
    state = get_state(request)
    if state.replicas is not None:
        return await state.replicas.proxy_state()
    return state.proxy.state()
