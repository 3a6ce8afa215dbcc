"""The torch engine behind the one OpenAI server (`agentlightning.openai_server`), shaped like vLLM.

`EngineBackend` answers chat and text completions from a `TorchEngine` (continuous batching,
CPU or CUDA); the routes, validation, SSE framing and disconnects are the server's. The trainer
runs it in its own process (`InferenceServer(...).start()`, a background thread) and publishes
new weights with `InferenceServer.publish()`; the version served is in `/v1/models` and in the
`X-Model-Version` header of every answer. As its own process: `agl-torch-server`
(`server_cli.py`); model loading is in `models.py`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from agentlightning.log import get_logger
from agentlightning.openai_server.app import OpenAIServer, build_app
from agentlightning.openai_server.backend import Answer, BadRequest, Call, ServerError
from agentlightning.openai_server.requests import ChatCompletionRequest, CompletionRequest
from agentlightning.openai_server.shapes import error_body, usage
from agentlightning.torch_backend.engine import (
    RequestStream,
    SamplingParams,
    StepOutput,
    TorchEngine,
)
from agentlightning.torch_backend.protocol import (
    StreamedToolCalls,
    TokenText,
    flatten_content,
    new_id,
    now,
    parse_tool_calls,
    sampling_params,
    tool_choice_error,
    unsupported,
)

log = get_logger("torch_server")
VERSION_HEADER = "X-Model-Version"
_Events = AsyncIterator[tuple[int, StepOutput]]


def _versioned(version: int) -> dict[str, str]:
    return {VERSION_HEADER: str(version)}


@dataclass
class _Choice:
    """What one sequence produced, gathered from its step outputs."""

    outs: list[StepOutput] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    error: str | None = None
    # Streaming bookkeeping.
    text: str = ""
    sent: int = 0  # characters of `text` sent (completions)

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


class EngineBackend:
    """The torch engine as the server's `ModelBackend`: tokenize, generate, and shape the answer."""

    def __init__(self, engine: TorchEngine, model_name: str) -> None:
        self.engine = engine
        self.model_name = model_name
        self.tokenizer = engine.tokenizer
        self.token_text = TokenText(engine.tokenizer)

    # --- chat ---------------------------------------------------------------------------------

    async def chat(self, call: Call) -> Answer:
        req = call.request
        assert isinstance(req, ChatCompletionRequest), "the server validates the body (not lenient)"
        self._check_common(req)
        if (msg := tool_choice_error(req)) is not None:
            raise BadRequest(msg)
        prompt_ids = self._render_chat(req)
        max_tokens = req.max_completion_tokens or req.max_tokens
        max_tokens = self._max_tokens(prompt_ids, max_tokens)
        k = (req.top_logprobs or 0) if req.logprobs else 0
        params = self._params(req, max_tokens, k)
        stream = self._add([prompt_ids], params, req.n)
        if req.stream:
            return await self._streamed(stream, lambda ev: self._chat_stream(req, prompt_ids, stream, ev))
        choices = await self._collect(stream, req.n)
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
                "token_ids": ch.token_ids if req.return_token_ids else None,
            }
            body_choices.append(choice)
        body: dict[str, Any] = {
            "id": new_id("chatcmpl"),
            "object": "chat.completion",
            "created": now(),
            "model": self.model_name,
            "choices": body_choices,
            "usage": usage(len(prompt_ids), sum(len(c.outs) for c in choices)),
            "prompt_logprobs": None,
            "prompt_token_ids": prompt_ids if req.return_token_ids else None,
        }
        return Answer(body, headers=_versioned(version))

    async def _chat_stream(
        self, req: ChatCompletionRequest, prompt_ids: list[int], stream: RequestStream, events: _Events
    ) -> AsyncIterator[dict[str, Any]]:
        rid, created = new_id("chatcmpl"), now()
        k = (req.top_logprobs or 0) if req.logprobs else 0
        choices = [_Choice() for _ in range(req.n)]
        # Tool calls as vLLM streams them: each call's id and name, then its arguments.
        tools = [StreamedToolCalls() if req.parse_tools() else None for _ in range(req.n)]

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
                yield chunk(first, **extra)
            async for index, out in events:
                ch = choices[index]
                ch.add(out)
                if out.error is not None:
                    yield error_body(out.error, 500, "InternalServerError")
                    continue
                if out.token_id < 0:
                    continue
                parser = tools[index]
                delta: dict[str, Any] = {}
                if parser is None:
                    if out.text_delta:
                        delta["content"] = out.text_delta
                else:
                    delta = parser.feed(out.text_delta or "")
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
                yield chunk(body)
                if out.finish_reason is not None:
                    yield chunk(self._final_chat_delta(ch, index, parser))
            if req.include_usage:
                total = sum(len(c.outs) for c in choices)
                yield (
                    {
                        "id": rid,
                        "object": "chat.completion.chunk",
                        "created": created,
                        "model": self.model_name,
                        "choices": [],
                        "usage": usage(len(prompt_ids), total),
                    }
                )
        finally:
            stream.cancel()

    def _final_chat_delta(self, ch: _Choice, index: int, parser: StreamedToolCalls | None) -> dict[str, Any]:
        delta: dict[str, Any] = {}
        finish = ch.finish_reason
        if parser is not None:
            delta, called = parser.finish()
            finish = "tool_calls" if called else finish
        return {
            "index": index,
            "delta": delta,
            "logprobs": None,
            "finish_reason": finish,
            "stop_reason": ch.stop_reason,
        }

    # --- completions --------------------------------------------------------------------------

    async def completions(self, call: Call) -> Answer:
        req = call.request
        assert isinstance(req, CompletionRequest), "the server validates the body (not lenient)"
        self._check_common(req)
        if req.echo:
            raise BadRequest("echo is not supported by the built-in torch server")
        if req.suffix:
            raise BadRequest("suffix is not supported by the built-in torch server")
        if req.prompt_logprobs:
            raise BadRequest(
                "prompt_logprobs > 0 (alternatives per prompt token) is not supported by the built-in torch "
                "server: ask prompt_logprobs=0 (each prompt token's own log-prob)"
            )
        if req.prompt_logprobs is not None and req.stream:
            raise BadRequest("prompt_logprobs with stream is not supported by the built-in torch server")
        try:
            raw_prompts = req.prompts()
        except ValueError as exc:
            raise BadRequest(str(exc)) from None
        prompts: list[list[int]] = []
        for p in raw_prompts:
            if isinstance(p, str):
                prompts.append(self.tokenizer.encode(p, add_special_tokens=True))
            elif isinstance(p, list) and all(isinstance(t, int) for t in p):
                prompts.append(list(p))
            else:
                raise BadRequest("prompt must be a string, a list of strings, or token ids")
        # Without max_tokens each prompt may fill the context; all share one setting, so the least room.
        rooms = [self._max_tokens(p, req.max_tokens) for p in prompts]
        max_tokens = req.max_tokens if req.max_tokens is not None else min(rooms)
        k = req.logprobs or 0
        params = self._params(req, max_tokens, k)
        stream = self._add(prompts, params, req.n)
        if req.stream:
            return await self._streamed(stream, lambda ev: self._completion_stream(req, prompts, stream, ev))
        choices = await self._collect(stream, len(prompts) * req.n)
        version = self._version(choices)
        scored = (
            await asyncio.to_thread(self.engine.score, prompts) if req.prompt_logprobs is not None else None
        )
        body_choices = []
        for index, ch in enumerate(choices):
            text = self._text(ch, params)
            choice: dict[str, Any] = {
                "index": index,
                "text": text,
                "prompt_logprobs": self._prompt_logprobs(prompts[index // req.n], scored[index // req.n])
                if scored is not None
                else None,
                "logprobs": self.token_text.completion_logprobs(ch.outs, k)
                if req.logprobs is not None
                else None,
                "finish_reason": ch.finish_reason,
                "stop_reason": ch.stop_reason,
                "prompt_token_ids": prompts[index // req.n] if req.return_token_ids else None,
                "token_ids": ch.token_ids if req.return_token_ids else None,
            }
            body_choices.append(choice)
        body = {
            "id": new_id("cmpl"),
            "object": "text_completion",
            "created": now(),
            "model": self.model_name,
            "choices": body_choices,
            "usage": usage(sum(len(p) for p in prompts) * req.n, sum(len(c.outs) for c in choices)),
        }
        return Answer(body, headers=_versioned(version))

    def _prompt_logprobs(self, prompt: list[int], scores: list[float]) -> list[dict[str, Any] | None]:
        """vLLM's shape: None for the first token, then `{token_id: {logprob, rank, decoded_token}}`."""
        entries: list[dict[str, Any] | None] = [None]
        for token, lp in zip(prompt[1:], scores, strict=True):
            text = self.tokenizer.decode([token])
            entries.append({str(token): {"logprob": lp, "rank": None, "decoded_token": text}})
        return entries

    async def _completion_stream(
        self, req: CompletionRequest, prompts: list[list[int]], stream: RequestStream, events: _Events
    ) -> AsyncIterator[dict[str, Any]]:
        rid, created = new_id("cmpl"), now()
        k = req.logprobs or 0
        choices = [_Choice() for _ in range(len(prompts) * req.n)]
        first_chunk = [True] * len(choices)
        try:
            async for index, out in events:
                ch = choices[index]
                ch.add(out)
                if out.error is not None:
                    yield error_body(out.error, 500, "InternalServerError")
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
                yield (
                    {
                        "id": rid,
                        "object": "text_completion",
                        "created": created,
                        "model": self.model_name,
                        "choices": [body],
                    }
                )
            if req.include_usage:
                yield (
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
        finally:
            stream.cancel()

    # --- shared -------------------------------------------------------------------------------

    def models(self) -> Answer:
        card = {
            "id": self.model_name,
            "object": "model",
            "created": now(),
            "owned_by": "agentlightning",
            "root": self.model_name,
            "parent": None,
            "max_model_len": self.engine.max_model_len,
            "version": self.engine.version,
        }
        return Answer({"object": "list", "data": [card]}, headers=_versioned(self.engine.version))

    def _check_common(self, req: ChatCompletionRequest | CompletionRequest) -> None:
        if req.model is not None and req.model != self.model_name:
            raise BadRequest(f"The model `{req.model}` does not exist.", 404, "NotFoundError")
        if (msg := unsupported(req)) is not None:
            raise BadRequest(msg)

    def _params(
        self, req: ChatCompletionRequest | CompletionRequest, max_tokens: int, k: int
    ) -> SamplingParams:
        try:
            return sampling_params(req, max_tokens, k)
        except ValueError as exc:
            raise BadRequest(str(exc)) from None

    def _add(self, prompts: list[list[int]], params: SamplingParams, n: int) -> RequestStream:
        try:
            return self.engine.add_request(prompts, params, n)
        except ValueError as exc:
            raise BadRequest(str(exc)) from None

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
            raise BadRequest(f"could not apply the chat template to these messages: {exc}") from None
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _max_tokens(self, prompt_ids: Sequence[int], max_tokens: int | None) -> int:
        try:
            return self.engine.check_prompt(prompt_ids, max_tokens)
        except ValueError as exc:
            raise BadRequest(str(exc)) from None

    def _text(self, ch: _Choice, params: SamplingParams) -> str:
        # Sequences with stop strings were detokenized (and cut at the stop) by the engine.
        if params.stop or params.detokenize:
            return ch.text
        return self.engine.decode_output(ch.token_ids, ch.finish_reason, ch.stop_reason)

    async def _streamed(
        self, stream: RequestStream, events_to_chunks: Callable[[_Events], AsyncIterator[dict[str, Any]]]
    ) -> Answer:
        events, version = await self._start(stream)
        return Answer(chunks=events_to_chunks(events), headers=_versioned(version))

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
            raise ServerError(first[1].error)

        async def replay() -> AsyncIterator[tuple[int, StepOutput]]:
            yield first
            async for item in events:
                yield item

        return replay(), first[1].version

    async def _collect(self, stream: RequestStream, count: int) -> list[_Choice]:
        choices = [_Choice() for _ in range(count)]
        # A client that goes away (an agent killed at its timeout) cancels this call (the server
        # does), which frees its rows, as in vLLM.
        try:
            async for index, out in stream:
                choices[index].add(out)
        finally:
            stream.cancel()
        errors = [c.error for c in choices if c.error]
        if errors:
            raise ServerError(errors[0])
        return choices

    def _version(self, choices: list[_Choice]) -> int:
        for c in choices:
            if c.outs:
                return c.outs[-1].version
        return self.engine.version


class InferenceServer(OpenAIServer):
    """The one OpenAI server over the engine, in a background thread of the calling process.
    The engine's lifetime is the caller's."""

    def __init__(
        self, engine: TorchEngine, model_name: str = "policy", host: str = "127.0.0.1", port: int = 0
    ) -> None:
        self.engine = engine
        self.model_name = model_name
        super().__init__(build_app(EngineBackend(engine, model_name)), host, port)

    @property
    def version(self) -> int:
        return self.engine.version

    def publish(
        self, weights: Mapping[str, torch.Tensor] | torch.nn.Module, version: int | None = None
    ) -> int:
        """Swap in new weights between requests (see `TorchEngine.publish`); returns the new version."""
        return self.engine.publish(weights, version)
