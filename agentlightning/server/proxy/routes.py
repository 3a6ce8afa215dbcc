"""The model proxy's routes: the agent APIs of a rollout's attempt, and pause/resume/state for
weight updates.

The agent API routes are served by `ProxyFastPath` (asgi.py) in the Gateway app; they are
declared here too, from the same table (apis.py), for the API schema and for apps that mount
this router alone.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated

from fastapi import APIRouter, Path, Request, Response

from agentlightning.log import get_logger
from agentlightning.schemas import ID_PATTERN, PauseRequest, ProxyState
from agentlightning.server.proxy.answers import error_answer
from agentlightning.server.proxy.apis import AGENT_APIS, ROOT, SERVED, AgentApi
from agentlightning.server.proxy.handler import handle_call
from agentlightning.server.state import get_state

log = get_logger("proxy")
router = APIRouter(tags=["proxy"])
PathId = Annotated[str, Path(pattern=ID_PATTERN)]


def _served(api: AgentApi) -> Callable[[str, str, str, Request], Awaitable[Response]]:
    async def call(rollout_id: PathId, attempt_id: PathId, mode: str, request: Request) -> Response:
        return await handle_call(get_state(request), request.body, rollout_id, attempt_id, mode, api.api)

    return call


for _api in AGENT_APIS:
    router.add_api_route(
        f"{ROOT}/{_api.route}",
        _served(_api),
        methods=["POST"],
        response_class=Response,
        name=_api.api.replace(".", "_"),
        description=_api.summary,
    )


def _other_path(prefix: str, api: str) -> Callable[[str], Awaitable[Response]]:
    async def other(rest: str) -> Response:
        return error_answer(
            404, f"the model proxy serves {SERVED}, not '{prefix}/{rest}'", "not_found", api=api
        )

    return other


for _prefix, _other_api in (("openai/v1", "chat.completions"), ("anthropic/v1", "anthropic.messages")):
    router.add_api_route(
        f"{ROOT}/{_prefix}/{{rest:path}}",
        _other_path(_prefix, _other_api),
        methods=["GET", "POST", "PUT", "PATCH", "DELETE"],
        include_in_schema=False,
        name=f"other_{_prefix.split('/')[0]}_paths",
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
