"""The one OpenAI-shaped HTTP server: the torch engine and the test doubles each put a
`ModelBackend` behind it.

Routes: `POST /v1/chat/completions`, `POST /v1/completions`, `GET /v1/models`, `GET /health`,
and, for a `ScaleOutBackend`, vLLM's `POST /v1/chat/completions/render`,
`POST /inference/v1/generate` (streamed when the backend answers an `Answer` with chunks) and
`POST /v1/chat/completions/derender` (403 while its `scale_out` is off, as vLLM without
`--enable-scale-out`). Bodies are validated as OpenAI
requests (a clear 400 in OpenAI's error shape) unless the server is built `lenient`.

aiohttp, not FastAPI: a fault hook can drop a connection before any answer
(`request.transport.abort()`), a handler is cancelled when its client goes away (the backend
then frees what the call held, as vLLM aborts it), and a call costs less: the fake model
server is the 50 ms model of the proxy benchmark.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import socket
import threading
from typing import Any, Self

import orjson
from aiohttp import web
from pydantic import ValidationError

from agentlightning.openai_server.backend import (
    Answer,
    BadRequest,
    Call,
    Fault,
    FaultHooks,
    ModelBackend,
    ScaleOutBackend,
    ServerError,
)
from agentlightning.openai_server.requests import (
    ChatCompletionRequest,
    CompletionRequest,
    validation_message,
)
from agentlightning.openai_server.shapes import SSE_DONE, error_body, sse_event

_KINDS = {400: "BadRequestError", 403: "PermissionDeniedError", 404: "NotFoundError", 429: "RateLimitError"}


def error_response(status: int, message: str, kind: str | None = None, body: Any = None) -> web.Response:
    """OpenAI's error answer (or `body` as given)."""
    kind = kind or _KINDS.get(status, "InternalServerError" if status == 500 else "ServerError")
    payload = body if body is not None else error_body(message, status, kind)
    return web.Response(status=status, body=orjson.dumps(payload), content_type="application/json")


def json_response(payload: Any, headers: Any = None, status: int = 200) -> web.Response:
    return web.Response(
        status=status, body=orjson.dumps(payload), content_type="application/json", headers=headers
    )


def build_app(
    backend: ModelBackend, hooks: FaultHooks | None = None, lenient: bool = False
) -> web.Application:
    """The app over `backend`; a caller may add routes before it runs (the fake's `/fake/*`)."""

    async def completions(request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            if hooks is not None:
                hooks.enter(request.path, raw.decode(errors="replace"))
                hooks.leave()
            return error_response(400, f"request body is not valid JSON: {exc}")
        if hooks is None:
            return await _serve(request, Call(request.path, body))
        hooks.enter(request.path, body)
        try:
            return await _serve(request, Call(request.path, body))
        finally:
            hooks.leave()

    async def _serve(request: web.Request, call: Call) -> web.StreamResponse:
        if not isinstance(call.body, dict):
            return error_response(400, "request body must be a JSON object")
        chat = call.api == "chat"
        if not lenient:
            try:
                schema = ChatCompletionRequest if chat else CompletionRequest
                call.request = schema.model_validate(call.body)
            except ValidationError as exc:
                return error_response(400, validation_message(exc))
        if hooks is not None:
            call.fault = hooks.fault(call)
            if call.fault is not None and (failed := await _before(request, call.fault)) is not None:
                return failed
        try:
            answer = await (backend.chat(call) if chat else backend.completions(call))
        except BadRequest as exc:
            return error_response(exc.status, str(exc), exc.kind)
        except ServerError as exc:
            return error_response(500, str(exc), "InternalServerError")
        return await _respond(request, answer, call.fault)

    async def _before(request: web.Request, fault: Fault) -> web.Response | None:
        """What a fault does before any answer: hold at a gate, wait, drop, fail."""
        if fault.gate is not None and fault.gate_after_chunks is None:
            assert hooks is not None
            await hooks.wait_gate(fault.gate)
        if fault.delay:
            await asyncio.sleep(fault.delay)
        if fault.drop:
            assert request.transport is not None
            request.transport.abort()
            return web.Response()
        if fault.status is not None:
            return error_response(fault.status, f"scripted error {fault.status}", body=fault.error_body)
        return None

    async def _respond(request: web.Request, answer: Answer, fault: Fault | None) -> web.StreamResponse:
        if answer.chunks is None:
            return json_response(answer.body, answer.headers, answer.status)
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", **answer.headers}
        )
        chunks = answer.chunks
        sent = 0

        async def send(chunk: Any) -> bool:
            """Write one chunk, faults first; False when a fault dropped the connection."""
            nonlocal sent
            if fault is not None:
                if fault.drop_after_chunks is not None and sent >= fault.drop_after_chunks:
                    assert request.transport is not None
                    request.transport.abort()
                    return False
                if fault.chunk_delay and sent:
                    await asyncio.sleep(fault.chunk_delay)
                if fault.gate is not None and sent == fault.gate_after_chunks:
                    assert hooks is not None
                    await hooks.wait_gate(fault.gate)
            await response.write(chunk if isinstance(chunk, bytes) else sse_event(chunk))
            sent += 1
            return True

        try:
            await response.prepare(request)
            if isinstance(chunks, list):  # made at once (the test doubles): no generator per chunk
                for chunk in chunks:
                    if not await send(chunk):
                        return response
            else:
                async for chunk in chunks:
                    if not await send(chunk):
                        return response
            if await send(SSE_DONE):
                await response.write_eof()
        finally:
            # Closing the chunks frees what the backend holds for them (the engine's rows).
            aclose = getattr(chunks, "aclose", None)
            if aclose is not None:
                await aclose()
        return response

    async def models(request: web.Request) -> web.Response:
        answer = backend.models()
        return json_response(answer.body, answer.headers, answer.status)

    async def health(request: web.Request) -> web.Response:
        return web.Response()

    async def scale_out(request: web.Request) -> web.StreamResponse:
        if not isinstance(backend, ScaleOutBackend) or not backend.scale_out:
            return error_response(403, "Scale-out endpoints are disabled")  # a capability check: not logged
        raw = await request.read()
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            return error_response(400, f"request body is not valid JSON: {exc}")
        if hooks is not None:
            hooks.enter(request.path, body)
        call = Call(request.path, body)
        try:
            if request.path.endswith("/render"):
                result = await backend.render(call)
            elif request.path.endswith("/derender"):
                result = await backend.derender(call)
            else:
                result = await backend.generate(call)
            if isinstance(result, Answer):  # generate with `stream: true`: its events
                return await _respond(request, result, None)
            return json_response(result)
        except BadRequest as exc:
            return error_response(exc.status, str(exc), exc.kind)
        except (ValueError, TypeError, KeyError) as exc:
            return error_response(400, str(exc))
        finally:
            if hooks is not None:
                hooks.leave()

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/v1/chat/completions/render", scale_out)
    app.router.add_post("/v1/chat/completions/derender", scale_out)
    app.router.add_post("/inference/v1/generate", scale_out)
    app.router.add_post("/v1/chat/completions", completions)
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    return app


# --- running it ------------------------------------------------------------------------------


class OpenAIServer:
    """An app on a loopback port, in a background thread with its own event loop.

    `url` is the server's root, `base_url` the OpenAI base URL (`…/v1`), as registered with the
    Gateway and handed to an OpenAI client."""

    def __init__(self, app: web.Application, host: str = "127.0.0.1", port: int = 0) -> None:
        self.app = app
        self.host = host
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, port))
        self.port: int = self._sock.getsockname()[1]
        self.loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._failure: BaseException | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    def start(self, timeout: float = 30.0) -> Self:
        self._thread = threading.Thread(target=self._run, name="agl-openai-server", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise TimeoutError(f"the OpenAI server did not start within {timeout}s")
        if self._failure is not None:
            raise RuntimeError(f"the OpenAI server did not start: {self._failure}")
        return self

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self.loop = loop
        try:
            loop.run_until_complete(self._serve())
        except BaseException as exc:  # reported by start()
            self._failure = exc
            self._ready.set()
        finally:
            loop.close()

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        runner = web.AppRunner(
            self.app, access_log=None, handle_signals=False, handler_cancellation=True, shutdown_timeout=1.0
        )
        await runner.setup()
        site = web.SockSite(runner, self._sock, backlog=4096)
        await site.start()
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            await runner.cleanup()

    def stop(self, timeout: float = 10.0) -> None:
        loop, stop = self.loop, self._stop
        if loop is not None and stop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(stop.set)
        if self._thread is not None:
            self._thread.join(timeout)
        self._sock.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve(app: web.Application, host: str, port: int) -> None:
    """Run `app` as this process's server until Ctrl-C or SIGTERM (uvloop when installed)."""
    with contextlib.suppress(ImportError):
        import uvloop

        uvloop.install()
    # What start-up made (modules, pydantic's validators) lives as long as the process: kept out
    # of the garbage collector's scans, which every call's allocations would otherwise trigger.
    gc.freeze()
    web.run_app(
        app,
        host=host,
        port=port,
        access_log=None,
        print=None,
        backlog=4096,
        handler_cancellation=True,
        shutdown_timeout=1.0,
    )
