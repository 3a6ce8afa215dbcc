"""The built-in OpenAI-compatible inference server, shaped like vLLM's.

Routes: `POST /v1/chat/completions`, `POST /v1/completions`, `GET /v1/models`, `GET /health`.
Generation runs in a `TorchEngine` (continuous batching, CPU or CUDA). The trainer runs the
server in its own process (`InferenceServer(...).start()`, a uvicorn thread) and publishes new
weights with `InferenceServer.publish()`; the version served is in `/v1/models` and in the
`X-Model-Version` header of every answer. As its own process: `agl-torch-server`
(`server_cli.py`); model loading is in `models.py`.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
import torch
import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse

from agentlightning import __version__
from agentlightning.log import get_logger
from agentlightning.openai_server.shapes import SSE_DONE, error_body, sse_event, usage
from agentlightning.torch_backend.engine import (
    EngineError,
    RequestStream,
    SamplingParams,
    StepOutput,
    TorchEngine,
)
from agentlightning.torch_backend.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    TokenText,
    flatten_content,
    hold_back_tool_prefix,
    new_id,
    now,
    parse_tool_calls,
)

log = get_logger("torch_server")
VERSION_HEADER = "X-Model-Version"
_Events = AsyncIterator[tuple[int, StepOutput]]


class _BadRequest(Exception):
    def __init__(self, message: str, code: int = 400, kind: str = "BadRequestError") -> None:
        super().__init__(message)
        self.code = code
        self.kind = kind


def _json(body: Any, status: int = 200, version: int | None = None) -> Response:
    headers = {VERSION_HEADER: str(version)} if version is not None else None
    return Response(orjson.dumps(body), status_code=status, media_type="application/json", headers=headers)


@dataclass
class _Choice:
    """What one sequence produced, gathered from its step outputs."""

    outs: list[StepOutput] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    error: str | None = None
    # Streaming bookkeeping.
    text: str = ""
    sent: int = 0  # characters of `text` sent as content

    def add(self, out: StepOutput) -> None:
        if out.token_id >= 0:
            self.outs.append(out)
        if out.text_delta:
            self.text += out.text_delta
        if out.finish_reason is not None:
            self.finish_reason = out.finish_reason
            self.stop_reason = out.stop_reason
            self.error = out.error

    @property
    def token_ids(self) -> list[int]:
        return [o.token_id for o in self.outs]


class OpenAIServing:
    """Request handling shared by the routes: tokenize, generate, and shape the answer."""

    def __init__(self, engine: TorchEngine, model_name: str) -> None:
        self.engine = engine
        self.model_name = model_name
        self.tokenizer = engine.tokenizer
        self.token_text = TokenText(engine.tokenizer)

    # --- chat ---------------------------------------------------------------------------------

    async def chat(self, req: ChatCompletionRequest, request: Request | None = None) -> Response:
        self._check_common(req)
        if (msg := req.tool_choice_error()) is not None:
            raise _BadRequest(msg)
        prompt_ids = self._render_chat(req)
        max_tokens = req.max_completion_tokens or req.max_tokens
        max_tokens = self._max_tokens(prompt_ids, max_tokens)
        k = (req.top_logprobs or 0) if req.logprobs else 0
        params = req.sampling(max_tokens, k)
        stream = self.engine.add_request([prompt_ids], params, req.n)
        if req.stream:
            return await self._streamed(stream, lambda ev: self._chat_stream(req, prompt_ids, stream, ev))
        choices = await self._collect(stream, req.n, request)
        version = self._version(choices)
        body_choices = []
        for i, ch in enumerate(choices):
            text = self._text(ch, params)
            message: dict[str, Any] = {"role": "assistant", "content": text, "tool_calls": []}
            finish = ch.finish_reason
            if req.parse_tools() and (parsed := parse_tool_calls(text)) is not None:
                message["content"], message["tool_calls"] = parsed
                finish = "tool_calls"
            choice: dict[str, Any] = {
                "index": i,
                "message": message,
                "logprobs": {"content": [self.token_text.chat_entry(o, k > 0) for o in ch.outs]}
                if req.logprobs
                else None,
                "finish_reason": finish,
                "stop_reason": ch.stop_reason,
            }
            if req.return_token_ids:
                choice["token_ids"] = ch.token_ids
            body_choices.append(choice)
        body: dict[str, Any] = {
            "id": new_id("chatcmpl"),
            "object": "chat.completion",
            "created": now(),
            "model": self.model_name,
            "choices": body_choices,
            "usage": usage(len(prompt_ids), sum(len(c.outs) for c in choices)),
            "system_fingerprint": None,
        }
        if req.return_token_ids:
            body["prompt_token_ids"] = prompt_ids
        return _json(body, version=version)

    async def _chat_stream(
        self, req: ChatCompletionRequest, prompt_ids: list[int], stream: RequestStream, events: _Events
    ) -> AsyncIterator[bytes]:
        rid, created = new_id("chatcmpl"), now()
        parse_tools = req.parse_tools()
        k = (req.top_logprobs or 0) if req.logprobs else 0
        choices = [_Choice() for _ in range(req.n)]

        def chunk(choice: dict[str, Any], **extra: Any) -> dict[str, Any]:
            return {
                "id": rid,
                "object": "chat.completion.chunk",
                "created": created,
                "model": self.model_name,
                "choices": [choice],
                **extra,
            }

        try:
            for i in range(req.n):
                first = {
                    "index": i,
                    "delta": {"role": "assistant", "content": ""},
                    "logprobs": None,
                    "finish_reason": None,
                }
                extra = {"prompt_token_ids": prompt_ids} if req.return_token_ids and i == 0 else {}
                yield sse_event(chunk(first, **extra))
            async for index, out in events:
                ch = choices[index]
                ch.add(out)
                if out.error is not None:
                    yield sse_event(error_body(out.error, 500, "InternalServerError"))
                    continue
                if out.token_id < 0:
                    continue
                # Content goes out as it comes, except what may be (the start of) a tool call.
                delta: dict[str, Any] = {}
                if parse_tools:
                    start = ch.text.find("<tool_call>")
                    safe = start if start >= 0 else len(ch.text) - hold_back_tool_prefix(ch.text)
                else:
                    safe = len(ch.text)
                if safe > ch.sent:
                    delta["content"] = ch.text[ch.sent : safe]
                    ch.sent = safe
                body: dict[str, Any] = {
                    "index": index,
                    "delta": delta,
                    "logprobs": {"content": [self.token_text.chat_entry(out, k > 0)]}
                    if req.logprobs
                    else None,
                    "finish_reason": None,
                }
                if req.return_token_ids:
                    body["token_ids"] = [out.token_id]
                yield sse_event(chunk(body))
                if out.finish_reason is not None:
                    yield sse_event(chunk(self._final_chat_delta(ch, index, parse_tools)))
            if req.stream_options and req.stream_options.include_usage:
                total = sum(len(c.outs) for c in choices)
                yield sse_event(
                    {
                        "id": rid,
                        "object": "chat.completion.chunk",
                        "created": created,
                        "model": self.model_name,
                        "choices": [],
                        "usage": usage(len(prompt_ids), total),
                    }
                )
            yield SSE_DONE
        finally:
            stream.cancel()

    def _final_chat_delta(self, ch: _Choice, index: int, parse_tools: bool) -> dict[str, Any]:
        delta: dict[str, Any] = {}
        finish = ch.finish_reason
        parsed = parse_tool_calls(ch.text) if parse_tools else None
        if parsed is not None:
            content, calls = parsed
            rest = (content or "")[ch.sent :]
            if rest:
                delta["content"] = rest
            delta["tool_calls"] = [{"index": j, **call} for j, call in enumerate(calls)]
            finish = "tool_calls"
        elif ch.sent < len(ch.text):
            delta["content"] = ch.text[ch.sent :]
            ch.sent = len(ch.text)
        return {
            "index": index,
            "delta": delta,
            "logprobs": None,
            "finish_reason": finish,
            "stop_reason": ch.stop_reason,
        }

    # --- completions --------------------------------------------------------------------------

    async def completions(self, req: CompletionRequest, request: Request | None = None) -> Response:
        self._check_common(req)
        if req.echo:
            raise _BadRequest("echo is not supported by the built-in torch server")
        if req.suffix:
            raise _BadRequest("suffix is not supported by the built-in torch server")
        try:
            raw_prompts = req.prompts()
        except ValueError as exc:
            raise _BadRequest(str(exc)) from None
        prompts: list[list[int]] = []
        for p in raw_prompts:
            if isinstance(p, str):
                prompts.append(self.tokenizer.encode(p, add_special_tokens=True))
            elif isinstance(p, list) and all(isinstance(t, int) for t in p):
                prompts.append(list(p))
            else:
                raise _BadRequest("prompt must be a string, a list of strings, or token ids")
        # Without max_tokens each prompt may fill the context; all share one setting, so the least room.
        rooms = [self._max_tokens(p, req.max_tokens) for p in prompts]
        max_tokens = req.max_tokens if req.max_tokens is not None else min(rooms)
        k = req.logprobs or 0
        params = req.sampling(max_tokens, k)
        stream = self.engine.add_request(prompts, params, req.n)
        if req.stream:
            return await self._streamed(stream, lambda ev: self._completion_stream(req, prompts, stream, ev))
        choices = await self._collect(stream, len(prompts) * req.n, request)
        version = self._version(choices)
        body_choices = []
        for index, ch in enumerate(choices):
            text = self._text(ch, params)
            choice: dict[str, Any] = {
                "index": index,
                "text": text,
                "logprobs": self.token_text.completion_logprobs(ch.outs, k)
                if req.logprobs is not None
                else None,
                "finish_reason": ch.finish_reason,
                "stop_reason": ch.stop_reason,
            }
            if req.return_token_ids:
                choice["prompt_token_ids"] = prompts[index // req.n]
                choice["token_ids"] = ch.token_ids
            body_choices.append(choice)
        body = {
            "id": new_id("cmpl"),
            "object": "text_completion",
            "created": now(),
            "model": self.model_name,
            "choices": body_choices,
            "usage": usage(sum(len(p) for p in prompts) * req.n, sum(len(c.outs) for c in choices)),
            "system_fingerprint": None,
        }
        return _json(body, version=version)

    async def _completion_stream(
        self, req: CompletionRequest, prompts: list[list[int]], stream: RequestStream, events: _Events
    ) -> AsyncIterator[bytes]:
        rid, created = new_id("cmpl"), now()
        k = req.logprobs or 0
        choices = [_Choice() for _ in range(len(prompts) * req.n)]
        first_chunk = [True] * len(choices)
        try:
            async for index, out in events:
                ch = choices[index]
                ch.add(out)
                if out.error is not None:
                    yield sse_event(error_body(out.error, 500, "InternalServerError"))
                    continue
                if out.token_id < 0 and out.finish_reason is None:
                    continue
                body: dict[str, Any] = {
                    "index": index,
                    "text": out.text_delta or "",
                    "logprobs": self.token_text.completion_logprobs([out], k, ch.sent)
                    if req.logprobs is not None and out.token_id >= 0
                    else None,
                    "finish_reason": out.finish_reason if out.finish_reason != "abort" else "abort",
                    "stop_reason": out.stop_reason,
                }
                ch.sent += len(out.text_delta or "")
                if req.return_token_ids:
                    body["token_ids"] = [out.token_id] if out.token_id >= 0 else []
                    if first_chunk[index]:
                        body["prompt_token_ids"] = prompts[index // req.n]
                first_chunk[index] = False
                yield sse_event(
                    {
                        "id": rid,
                        "object": "text_completion",
                        "created": created,
                        "model": self.model_name,
                        "choices": [body],
                    }
                )
            if req.stream_options and req.stream_options.include_usage:
                yield sse_event(
                    {
                        "id": rid,
                        "object": "text_completion",
                        "created": created,
                        "model": self.model_name,
                        "choices": [],
                        "usage": usage(
                            sum(len(p) for p in prompts) * req.n, sum(len(c.outs) for c in choices)
                        ),
                    }
                )
            yield SSE_DONE
        finally:
            stream.cancel()

    # --- shared -------------------------------------------------------------------------------

    def _check_common(self, req: ChatCompletionRequest | CompletionRequest) -> None:
        if req.model is not None and req.model != self.model_name:
            raise _BadRequest(f"The model `{req.model}` does not exist.", 404, "NotFoundError")
        if (msg := req.unsupported()) is not None:
            raise _BadRequest(msg)

    def _render_chat(self, req: ChatCompletionRequest) -> list[int]:
        try:
            messages = flatten_content(req.messages)
            text = self.tokenizer.apply_chat_template(
                messages,
                tools=req.tools,
                tokenize=False,
                add_generation_prompt=req.add_generation_prompt and not req.continue_final_message,
                continue_final_message=req.continue_final_message,
                **(req.chat_template_kwargs or {}),
            )
        except Exception as exc:
            raise _BadRequest(f"could not apply the chat template to these messages: {exc}") from None
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _max_tokens(self, prompt_ids: Sequence[int], max_tokens: int | None) -> int:
        try:
            return self.engine.check_prompt(prompt_ids, max_tokens)
        except ValueError as exc:
            raise _BadRequest(str(exc)) from None

    def _text(self, ch: _Choice, params: SamplingParams) -> str:
        # Sequences with stop strings were detokenized (and cut at the stop) by the engine.
        if params.stop or params.detokenize:
            return ch.text
        return self.engine.decode_output(ch.token_ids, ch.finish_reason, ch.stop_reason)

    async def _streamed(
        self, stream: RequestStream, events_to_sse: Callable[[_Events], AsyncIterator[bytes]]
    ) -> Response:
        events, version = await self._start(stream)
        return StreamingResponse(
            events_to_sse(events), media_type="text/event-stream", headers={VERSION_HEADER: str(version)}
        )

    async def _start(self, stream: RequestStream) -> tuple[_Events, int]:
        """Wait for the first output, so that the headers carry the version that serves the stream
        and a failure before any token is a plain error answer instead of a broken stream."""
        events = stream.__aiter__()
        try:
            first = await anext(events)
        except BaseException:
            stream.cancel()
            raise
        if first[1].error is not None:
            stream.cancel()
            raise EngineError(first[1].error)

        async def replay() -> AsyncIterator[tuple[int, StepOutput]]:
            yield first
            async for item in events:
                yield item

        return replay(), first[1].version

    async def _collect(self, stream: RequestStream, count: int, request: Request | None) -> list[_Choice]:
        choices = [_Choice() for _ in range(count)]
        # A client that goes away (an agent killed at its timeout) frees its rows, as in vLLM.
        watcher = asyncio.create_task(_cancel_on_disconnect(request, stream)) if request is not None else None
        try:
            async for index, out in stream:
                choices[index].add(out)
        finally:
            stream.cancel()
            if watcher is not None:
                watcher.cancel()
        errors = [c.error for c in choices if c.error]
        if errors:
            raise EngineError(errors[0])
        return choices

    def _version(self, choices: list[_Choice]) -> int:
        for c in choices:
            if c.outs:
                return c.outs[-1].version
        return self.engine.version


async def _cancel_on_disconnect(request: Request, stream: RequestStream) -> None:
    # The body has been read: the next ASGI message is the disconnect, whenever it comes.
    while (await request.receive())["type"] != "http.disconnect":
        pass
    stream.cancel()


def create_app(engine: TorchEngine, model_name: str = "policy") -> FastAPI:
    """The OpenAI-compatible ASGI app over `engine`. The engine's lifetime is the caller's."""
    serving = OpenAIServing(engine, model_name)
    app = FastAPI(title="Agent Lightning torch inference server", version=__version__)
    app.state.serving = serving

    @app.exception_handler(_BadRequest)
    async def _bad(request: Request, exc: _BadRequest) -> Response:
        return JSONResponse(error_body(str(exc), exc.code, exc.kind), exc.code)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> Response:
        parts = []
        for e in exc.errors():
            where = ".".join(str(x) for x in e.get("loc", ()) if x != "body")
            parts.append(f"{where}: {e.get('msg')}" if where else str(e.get("msg")))
        return JSONResponse(error_body("; ".join(parts) or "invalid request", 400), 400)

    @app.exception_handler(EngineError)
    async def _engine(request: Request, exc: EngineError) -> Response:
        return JSONResponse(error_body(str(exc), 500, "InternalServerError"), 500)

    @app.exception_handler(ValueError)
    async def _value(request: Request, exc: ValueError) -> Response:
        return JSONResponse(error_body(str(exc), 400), 400)

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/v1/models")
    async def models() -> Response:
        card = {
            "id": model_name,
            "object": "model",
            "created": now(),
            "owned_by": "agentlightning",
            "root": model_name,
            "parent": None,
            "max_model_len": engine.max_model_len,
            "version": engine.version,
        }
        return _json({"object": "list", "data": [card]}, version=engine.version)

    @app.post("/v1/chat/completions")
    async def chat(req: ChatCompletionRequest, request: Request) -> Response:
        return await serving.chat(req, request)

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest, request: Request) -> Response:
        return await serving.completions(req, request)

    return app


class InferenceServer:
    """The app served by uvicorn in a background thread of the calling process."""

    def __init__(
        self,
        engine: TorchEngine,
        model_name: str = "policy",
        host: str = "127.0.0.1",
        port: int = 0,
        log_level: str = "warning",
    ) -> None:
        self.engine = engine
        self.model_name = model_name
        self.host = host
        self.app = create_app(engine, model_name)
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, port))
        self.port: int = self._sock.getsockname()[1]
        config = uvicorn.Config(
            self.app, log_level=log_level, access_log=False, timeout_keep_alive=75, lifespan="off"
        )
        self._server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def endpoint(self) -> str:
        """What to register with the Gateway: the OpenAI base URL."""
        return f"{self.base_url}/v1"

    @property
    def version(self) -> int:
        return self.engine.version

    def start(self, timeout: float = 30.0) -> InferenceServer:
        # uvicorn installs no signal handlers outside the main thread: Ctrl-C stays the caller's.
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, name="agl-torch-server", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._server.started:
                return self
            if not self._thread.is_alive():
                raise RuntimeError("the inference server thread exited during start-up")
            time.sleep(0.01)
        raise TimeoutError(f"the inference server did not start within {timeout}s")

    def publish(
        self, weights: Mapping[str, torch.Tensor] | torch.nn.Module, version: int | None = None
    ) -> int:
        """Swap in new weights between requests (see `TorchEngine.publish`); returns the new version."""
        return self.engine.publish(weights, version)

    def stop(self, timeout: float = 10.0) -> None:
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)
        self._sock.close()

    def __enter__(self) -> InferenceServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
