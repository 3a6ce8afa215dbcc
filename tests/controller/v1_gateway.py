"""A stand-in for an Agent Lightning v1.0 Gateway: our Gateway behind a filter that removes what
v1.0 lacks. It ignores `wait_seconds` (answers at once, without the long-poll header) and
rejects the `log_path` status field (v1.0 forbids unknown fields).

    python -m tests.controller.v1_gateway port=8181 key=k store.url=sqlite:///x.db
"""

from __future__ import annotations

import sys
from typing import Any
from urllib.parse import parse_qsl, urlencode

import orjson
import uvicorn

from agentlightning.config.loader import load_cli_config
from agentlightning.server.app import create_app
from agentlightning.server.config import load_server_config

ASGIApp = Any


class V1Filter:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        query = [(k, v) for k, v in parse_qsl(scope["query_string"].decode(), True) if k != "wait_seconds"]
        scope = {**scope, "query_string": urlencode(query).encode()}
        if scope["method"] == "PATCH" and scope["path"].startswith("/api/rollouts/"):
            body = b""
            while True:
                message = await receive()
                body += message.get("body", b"")
                if not message.get("more_body"):
                    break
            try:
                status = orjson.loads(body).get("status", {})
            except (orjson.JSONDecodeError, AttributeError):
                status = {}
            if isinstance(status, dict) and "log_path" in status:
                detail = [{"loc": ["body", "status", "log_path"], "msg": "Extra inputs are not permitted"}]
                payload = orjson.dumps({"detail": detail})
                headers = [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(payload)).encode()),
                ]
                await send({"type": "http.response.start", "status": 422, "headers": headers})
                await send({"type": "http.response.body", "body": payload})
                return
            sent = False

            async def replay() -> dict[str, Any]:
                nonlocal sent
                if sent:
                    return await receive()
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}

            await self.app(scope, replay, send)
            return
        await self.app(scope, receive, send)


def main() -> None:
    config = load_server_config(load_cli_config("server", sys.argv[1:], prog="v1-gateway"))
    uvicorn.run(V1Filter(create_app(config)), host=config.host, port=config.port, log_level="warning")


if __name__ == "__main__":
    main()
