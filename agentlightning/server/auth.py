"""Shared-key auth: `Authorization: Bearer KEY` or `x-api-key: KEY`, compared in constant time."""

from __future__ import annotations

import hmac

import orjson
from starlette.types import ASGIApp, Receive, Scope, Send

OPEN_PATHS = frozenset({"/healthz"})
# The dashboard's static page: no data in it; its API calls carry the key.
OPEN_PREFIX = "/ui/"


class KeyAuthMiddleware:
    def __init__(self, app: ASGIApp, key: str) -> None:
        self.app = app
        self._key = key.encode()

    def _authorized(self, scope: Scope) -> bool:
        for name, value in scope["headers"]:
            if name == b"authorization":
                scheme, _, token = value.partition(b" ")
                if scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self._key):
                    return True
            elif name == b"x-api-key" and hmac.compare_digest(value.strip(), self._key):
                return True
        return False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or not self._key
            or scope["path"] in OPEN_PATHS
            or (scope["path"] + "/").startswith(OPEN_PREFIX)
            or self._authorized(scope)
        ):
            await self.app(scope, receive, send)
            return
        body = orjson.dumps(
            {"detail": "missing or wrong key: send 'Authorization: Bearer KEY' or 'x-api-key: KEY'"}
        )
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"www-authenticate", b"Bearer"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
