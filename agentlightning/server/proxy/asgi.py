"""The proxy's hot path as plain ASGI, in front of FastAPI's router.

Every agent call goes through here, thousands per second. FastAPI's routing, dependency
solving and exception layers cost more CPU per call than the proxying itself (profiled
under `bench/proxy.py`), so the call routes are matched with one regex and handled
directly; everything else, including malformed proxy URLs, falls through to the app.
This middleware sits inside auth and the body limit, so both still apply.
"""

from __future__ import annotations

import re

from starlette.types import ASGIApp, Receive, Scope, Send

from agentlightning.log import get_logger
from agentlightning.server.proxy.answers import error_answer
from agentlightning.server.proxy.apis import BY_ROUTE, ROUTES
from agentlightning.server.proxy.handler import handle_call
from agentlightning.server.state import GatewayState
from agentlightning.server.store import StoreUnavailable

log = get_logger("proxy")
_ID = r"([^/\s]{1,256})"
HOT_PATH = re.compile(rf"^/proxy/rollout/{_ID}/attempt/{_ID}/mode/([^/]+)/({ROUTES})$")


class ProxyFastPath:
    def __init__(self, app: ASGIApp, state: GatewayState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        match = (
            HOT_PATH.match(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        )
        if match is None:
            await self.app(scope, receive, send)
            return

        async def read_body() -> bytes:
            chunks = []
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    break
                chunks.append(message.get("body", b""))
                if not message.get("more_body", False):
                    break
            return b"".join(chunks)

        rollout_id, attempt_id, mode, route = match.groups()
        api = BY_ROUTE[route].api
        try:
            response = await handle_call(self.state, read_body, rollout_id, attempt_id, mode, api)
        except StoreUnavailable as exc:  # a shared database restarting: the agent retries
            response = error_answer(
                503, str(exc), "store_unavailable", {"Retry-After": str(StoreUnavailable.retry_after_seconds)}
            )
        except Exception as exc:
            log.exception("proxy_call_failed", rollout_id=rollout_id, path=scope["path"])
            response = error_answer(
                500, f"internal error: {type(exc).__name__}: {exc}", "internal_error", api=api
            )
        await response(scope, receive, send)
