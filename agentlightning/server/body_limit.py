"""Reject request bodies over `max_body_bytes` with 413 before the app reads them."""

from __future__ import annotations

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = None
        for name, value in scope["headers"]:
            if name == b"content-length":
                length = int(value) if value.isdigit() else -1
                break
        if length is not None and (length < 0 or length > self.max_bytes):
            await self._reject(send, length)
            return
        if length is None and scope["method"] in ("POST", "PUT", "PATCH"):
            # No declared length (chunked): read up to the limit, then replay to the app.
            chunks: list[bytes] = []
            size = 0
            more = True
            while more:
                message = await receive()
                if message["type"] == "http.disconnect":
                    return
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > self.max_bytes:
                    await self._reject(send, size)
                    return
                chunks.append(chunk)
                more = message.get("more_body", False)
            body = b"".join(chunks)
            replayed = False

            async def replay() -> Message:
                nonlocal replayed
                if replayed:
                    return await receive()
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}

            await self.app(scope, replay, send)
            return
        await self.app(scope, receive, send)

    async def _reject(self, send: Send, size: int) -> None:
        detail = (
            f"request body is too large ({size} bytes); the limit is {self.max_bytes} bytes (server key max_body_bytes)"
            if size >= 0
            else "invalid Content-Length header"
        )
        body = orjson.dumps({"detail": detail})
        await send(
            {
                "type": "http.response.start",
                "status": 413 if size >= 0 else 400,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
