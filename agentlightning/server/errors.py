"""Every failure a client can cause becomes a 4xx that says what was wrong."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exception_handlers import request_validation_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agentlightning.log import get_logger
from agentlightning.schemas import IllegalTransition
from agentlightning.server.store import RolloutNotFound, StoreUnavailable

log = get_logger("gateway")


async def _validation(request: Request, exc: RequestValidationError) -> Response:
    for error in exc.errors():
        if error.get("type") == "json_invalid":
            where = error.get("ctx", {}).get("error", "")
            # 422 as v1.0 (FastAPI's answer there), with a readable message.
            return JSONResponse({"detail": f"request body is not valid JSON: {where}".rstrip(": ")}, 422)
    return await request_validation_exception_handler(request, exc)


async def _not_found(request: Request, exc: RolloutNotFound) -> Response:
    return JSONResponse({"detail": str(exc)}, 404)


async def _conflict(request: Request, exc: IllegalTransition) -> Response:
    return JSONResponse({"detail": str(exc)}, 409)


async def _unexpected(request: Request, exc: Exception) -> Response:
    log.exception("unhandled_error", method=request.method, path=request.url.path)
    return JSONResponse({"detail": f"internal error: {type(exc).__name__}: {exc}"}, 500)


def unavailable_response(exc: StoreUnavailable) -> Response:
    seconds = str(exc.retry_after_seconds)
    return JSONResponse(
        {"detail": f"the Gateway's store is unavailable, retry in {seconds} s: {exc}"},
        503,
        headers={"Retry-After": seconds},
    )


class StoreUnavailableMiddleware:
    """A store that cannot be reached (a shared database restarting) answers 503 with Retry-After
    from wherever it was noticed (auth, the proxy, a route), never a bare 500."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except StoreUnavailable as exc:
            if started or scope["type"] != "http":
                raise
            log.warning("store_unavailable", method=scope["method"], path=scope["path"], error=str(exc))
            await unavailable_response(exc)(scope, receive, send)


def install_error_handlers(app: FastAPI) -> None:
    # Starlette types a handler's exception as plain Exception; ours take the subclass they handle.
    app.add_exception_handler(RequestValidationError, _validation)  # type: ignore[arg-type]
    app.add_exception_handler(RolloutNotFound, _not_found)  # type: ignore[arg-type]
    app.add_exception_handler(IllegalTransition, _conflict)  # type: ignore[arg-type]
    app.add_exception_handler(Exception, _unexpected)
