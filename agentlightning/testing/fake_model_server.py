"""A vLLM-shaped, OpenAI-compatible model server: the test double of an inference server.

It answers `POST /v1/chat/completions` and `POST /v1/completions` like vLLM (>= 0.10.2) does:
with `return_token_ids: true` a chat answer carries the prompt's token ids at the top level
(`prompt_token_ids`) and a completion carries them per choice; every choice carries the
generated `token_ids`, and so does every streamed chunk. Log-probs have the OpenAI shapes
(`logprobs.content[].logprob` for chat, `logprobs.token_logprobs` for completions).

Tokens come from a deterministic toy tokenizer (one token per word with its leading spaces)
and a toy chat template that has the prefix property of real ones: the prompt of a follow-up
call begins with the previous prompt followed by the previous answer's token ids.

Replies are scriptable (`Reply`: content, tool calls, finish reason) and so are faults: an
HTTP status, a delay before the answer or between chunks, a connection dropped before the
answer or after N chunks, and named gates that hold a call until a test opens them.

In-process, for tests::

    with FakeModelServer() as fake:
        fake.script(Reply(content="hi"), Reply(status=503))
        ... point a client or the Gateway at fake.base_url ...

As a process, for benchmarks: `python -m agentlightning.testing.fake_model_server --port 8000 --delay 0.05`.
A process is scripted over HTTP: `POST /fake/script` (a list of Reply objects as JSON),
`GET /fake/requests`, `POST /fake/reset`, `POST /fake/gates/{name}/open`.

With `state.scale_out` (`--scale-out`) it also serves vLLM's scale-out endpoints, as
`vllm serve --enable-scale-out` does: `POST /v1/chat/completions/render` (the toy template's
prompt ids), `POST /inference/v1/generate` (the scripted answer's ids and log-probs) and
`POST /v1/chat/completions/derender` (those ids back into the chat message); without it they
answer 403, as vLLM does without the flag.

Another model can stand behind the same HTTP layer: a `Generator` answers chat and scale-out
calls in place of the toy tokenizer (`scripted_model.ScriptedChatModel` is this server with one),
while the routes, the request log and the scripted faults stay the server's.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import itertools
import re
import socket
import threading
import time
import zlib
from collections import deque
from dataclasses import dataclass, field, fields
from typing import Any, Protocol, Self

import orjson
from aiohttp import web

from agentlightning.openai_shapes import SSE_DONE, error_body, sse_event, usage

# --- toy tokenizer and chat template ---------------------------------------------------------

END = 2  # end of turn: the stop token, part of the answer's token ids like a real EOS
ROLE_TOKENS = {"system": 3, "user": 4, "assistant": 5, "tool": 6, "developer": 7}
OTHER_ROLE = 8
WORD_BASE = 100
VOCAB_SIZE = 32000
_PIECES = re.compile(r"\s*\S+|\s+")


def pieces(text: str) -> list[str]:
    """Split text into token pieces: each word with the whitespace before it."""
    return _PIECES.findall(text)


def token_id(piece: str) -> int:
    return WORD_BASE + zlib.crc32(piece.encode()) % (VOCAB_SIZE - WORD_BASE)


def encode(text: str) -> list[int]:
    return [token_id(p) for p in pieces(text)]


def token_logprob(token: int, position: int) -> float:
    """A deterministic log-prob in [-2.5, -0.0025] for the token at this answer position."""
    return -((zlib.crc32(f"{token}:{position}".encode()) % 1000) + 1) / 400


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: keep the text ones
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return str(content)


def tool_call_head(name: str) -> str:
    return f"<tool_call>{name}"


TOOL_CALL_TAIL = "</tool_call>"


def tool_call_tokens(name: str, arguments: str) -> list[int]:
    return encode(tool_call_head(name)) + encode(arguments) + encode(TOOL_CALL_TAIL)


def render_message(message: dict[str, Any]) -> list[int]:
    """A message's tokens: role, content, tool calls, end of turn."""
    ids = [ROLE_TOKENS.get(str(message.get("role")), OTHER_ROLE), *encode(_text(message.get("content")))]
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        ids += tool_call_tokens(str(function.get("name", "")), str(function.get("arguments", "")))
    ids.append(END)
    return ids


def chat_prompt_ids(messages: list[dict[str, Any]]) -> list[int]:
    """The generation prompt: every message, then the assistant's role token."""
    ids: list[int] = []
    for message in messages:
        ids += render_message(message)
    ids.append(ROLE_TOKENS["assistant"])
    return ids


# MoE routes (R3), as vLLM returns them with `return_routed_experts: true` (non-streamed): per
# choice, base64 of a .npy array [tokens - 1, layers, top-k] (the last generated token is never
# fed through the model), which Agent Lightning v1.0 decodes the same way. A token's experts
# depend on its id and position only, so that a follow-up call's routes begin with an earlier
# call's, as a real model's would.
ROUTE_LAYERS = 2
ROUTE_TOPK = 2
ROUTE_EXPERTS = 64


def routes_for(ids: list[int]) -> list[list[list[int]]]:
    return [
        [
            [(t * 31 + pos + 7 * layer + 3 * k) % ROUTE_EXPERTS for k in range(ROUTE_TOPK)]
            for layer in range(ROUTE_LAYERS)
        ]
        for pos, t in enumerate(ids)
    ]


def encode_routes(routes: list[list[list[int]]]) -> str:
    import numpy as np

    buffer = io.BytesIO()
    np.save(buffer, np.asarray(routes, dtype=np.uint8).reshape(len(routes), ROUTE_LAYERS, ROUTE_TOPK))
    return base64.b64encode(buffer.getvalue()).decode()


# --- scripted replies --------------------------------------------------------------------------


@dataclass
class ToolCall:
    name: str
    arguments: str = "{}"  # a JSON string, as OpenAI sends it


@dataclass
class Reply:
    """What the server answers to one call. Fields left at their defaults behave normally."""

    content: str | None = None  # None: a default text derived from the prompt
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str | None = None  # default: stop, tool_calls, or length when max_tokens cut it
    status: int | None = None  # answer with this HTTP status and an OpenAI error body
    error_body: Any = None  # the body of that error answer, instead of the default one
    delay: float = 0.0  # seconds before the answer starts
    chunk_delay: float = 0.0  # seconds between streamed chunks
    drop: bool = False  # close the connection without answering
    drop_after_chunks: int | None = None  # streams: close the connection after this many chunks
    gate: str | None = None  # hold the call until the gate of this name is opened
    gate_after_chunks: int | None = None  # streams: hold at `gate` after this many chunks, not before
    when: str | None = None  # only for a call whose last message (or prompt) contains this text
    times: int = 1  # how many calls this reply answers

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Reply:
        known = {f.name for f in fields(cls)}
        unknown = set(raw) - known
        if unknown:
            raise ValueError(f"unknown Reply fields {sorted(unknown)}; known: {sorted(known)}")
        calls = [c if isinstance(c, ToolCall) else ToolCall(**c) for c in raw.get("tool_calls") or []]
        return cls(**{**raw, "tool_calls": calls})


@dataclass
class _Token:
    id: int
    text: str  # what this token adds to the content (or to a tool call's arguments)
    kind: str = "content"  # content | tool_start | tool_head | tool_args | tool_tail | end
    tool_index: int = -1


@dataclass
class _Answer:
    tokens: list[_Token]
    content: str
    tool_calls: list[ToolCall]
    finish_reason: str


def _answer(reply: Reply, default_content: str, max_tokens: int | None) -> _Answer:
    content = reply.content if reply.content is not None else default_content
    tokens = [_Token(token_id(p), p) for p in pieces(content)]
    finish = "stop"
    if reply.tool_calls:
        finish = "tool_calls"
        for i, call in enumerate(reply.tool_calls):
            head = [_Token(t, "", "tool_head", i) for t in encode(tool_call_head(call.name))]
            head[0].kind = "tool_start"
            tokens += head
            tokens += [_Token(token_id(p), p, "tool_args", i) for p in pieces(call.arguments)]
            tokens += [_Token(t, "", "tool_tail", i) for t in encode(TOOL_CALL_TAIL)]
    elif max_tokens is not None and len(tokens) >= max_tokens:
        tokens = tokens[:max_tokens]
        content = "".join(t.text for t in tokens)
        finish = "length"
    if finish != "length":
        tokens.append(_Token(END, "", "end"))
    return _Answer(tokens, content, reply.tool_calls, reply.finish_reason or finish)


# --- another model behind the same HTTP layer ------------------------------------------------


class Generator(Protocol):
    """A model that answers instead of the toy one (e.g. `scripted_model.PolicyGenerator`): non-streamed
    chat and vLLM's scale-out calls, each a request body to an answer body. The server keeps the
    routes, the request log and the scripted faults; a generator's exception answers 400."""

    def chat(self, body: dict[str, Any]) -> dict[str, Any]: ...

    def render(self, body: dict[str, Any]) -> dict[str, Any]: ...

    def generate(self, body: dict[str, Any]) -> dict[str, Any]: ...

    def derender(self, body: dict[str, Any]) -> dict[str, Any]: ...


# --- server state ----------------------------------------------------------------------------


class FakeState:
    """The script, the request log and the gates. Shared by the server's loop and test threads."""

    def __init__(
        self,
        delay: float = 0.0,
        default_content: str | None = None,
        served_model_name: str | None = None,
        generator: Generator | None = None,
    ) -> None:
        self.delay = delay
        self.generator = generator
        self.errors: list[str] = []  # the generator's failures (each answered 400)
        self.default_content = default_content
        self.served_model_name = served_model_name
        # Routes on every non-streamed answer, asked or not: vLLM 0.32 serving with
        # `enable_return_routed_experts` (its OpenAI API has no per-request switch).
        self.routes_always = False
        # vLLM's scale-out endpoints (`--enable-scale-out`): render, generate on tokens, derender.
        self.scale_out = False
        self.generated: dict[tuple[int, ...], tuple[_Answer, str]] = {}  # for derender: ids → answer, id
        self._lock = threading.Lock()
        self._script: list[Reply] = []
        self.requests: deque[dict[str, Any]] = deque(maxlen=10000)
        self._active = 0
        self.max_active = 0
        self.total = 0
        self._changed = threading.Condition(self._lock)
        self._gates: dict[str, asyncio.Event] = {}
        self._opened: set[str] = set()
        self.loop: asyncio.AbstractEventLoop | None = None

    def script(self, *replies: Reply) -> None:
        with self._lock:
            self._script.extend(replies)

    def reset(self) -> None:
        with self._lock:
            self._script.clear()
            self.requests.clear()
            self.max_active = self._active
            self.total = 0
            self._opened.clear()

    def take(self, key_text: str) -> Reply:
        with self._lock:
            for i, reply in enumerate(self._script):
                if reply.when is None or reply.when in key_text:
                    reply.times -= 1
                    if reply.times <= 0:
                        del self._script[i]
                    return reply
        return Reply()

    def pending(self) -> int:
        with self._lock:
            return sum(r.times for r in self._script)

    def enter(self, path: str, body: Any) -> None:
        with self._lock:
            self.requests.append({"path": path, "body": body})
            self._active += 1
            self.total += 1
            self.max_active = max(self.max_active, self._active)
            self._changed.notify_all()

    def leave(self) -> None:
        with self._lock:
            self._active -= 1
            self._changed.notify_all()

    @property
    def active(self) -> int:
        return self._active

    def wait_active(self, n: int, timeout: float = 10.0) -> None:
        """Block until at least `n` calls are inside the server (e.g. held at a gate)."""
        with self._changed:
            if not self._changed.wait_for(lambda: self._active >= n, timeout):
                raise TimeoutError(f"{self._active} calls in the fake model server, waited for {n}")

    def gate_event(self, name: str) -> asyncio.Event:
        event = self._gates.get(name)
        if event is None:
            event = self._gates[name] = asyncio.Event()
            if name in self._opened:
                event.set()
        return event

    def open_gate(self, name: str) -> None:
        """Release every call held at this gate, and let later ones through. Thread-safe."""

        def release() -> None:
            self._opened.add(name)
            self.gate_event(name).set()

        if self.loop is None:
            release()
        else:
            self.loop.call_soon_threadsafe(release)


# --- the HTTP app ----------------------------------------------------------------------------

_ids = itertools.count(1)


def _error(status: int, message: str, body: Any = None) -> web.Response:
    kind = {400: "BadRequestError", 404: "NotFoundError", 429: "RateLimitError"}.get(status, "ServerError")
    payload = body if body is not None else error_body(message, status, kind)
    return web.Response(status=status, body=orjson.dumps(payload), content_type="application/json")


def _chat_logprob_entry(token: _Token, position: int, top: int) -> dict[str, Any]:
    lp = token_logprob(token.id, position)
    text = token.text if token.text else f"<{token.id}>"
    entry: dict[str, Any] = {"token": text, "logprob": lp, "bytes": list(text.encode())}
    entry["top_logprobs"] = [{"token": text, "logprob": lp, "bytes": list(text.encode())}][:top]
    return entry


def _tool_call_json(call: ToolCall, call_id: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}


class _Call:
    """One parsed request: what to generate and how to shape the answer."""

    def __init__(self, api: str, body: dict[str, Any], routes_always: bool = False) -> None:
        self.api = api
        self.body = body
        self.model = body.get("model")
        self.stream = bool(body.get("stream"))
        self.token_ids = bool(body.get("return_token_ids"))
        asked = routes_always or body.get("return_routed_experts") is True
        self.routed_experts = asked and not self.stream  # vLLM 0.32 returns none in streams
        self.n = int(body.get("n") or 1)
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        self.max_tokens = int(max_tokens) if max_tokens is not None else None
        options = body.get("stream_options") or {}
        self.include_usage = bool(options.get("include_usage"))
        if api == "chat":
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                raise ValueError("'messages' must be a non-empty list")
            self.prompt_ids = chat_prompt_ids(messages)
            self.key_text = _text(messages[-1].get("content")) if isinstance(messages[-1], dict) else ""
            self.logprobs = bool(body.get("logprobs"))
            self.top = int(body.get("top_logprobs") or 0)
        else:
            prompt = body.get("prompt")
            if isinstance(prompt, str):
                self.prompt_ids = encode(prompt)
                self.key_text = prompt
            elif isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
                self.prompt_ids = list(prompt)
                self.key_text = ""
            else:
                raise ValueError("'prompt' must be a string or a non-empty list of token ids")
            lp = body.get("logprobs")
            self.logprobs = lp is not None and lp is not False
            self.top = int(lp) if lp is not None and self.logprobs else 0
        self.id = f"{'chatcmpl' if api == 'chat' else 'cmpl'}-{next(_ids)}"
        self.created = int(time.time())

    def default_content(self, state: FakeState) -> str:
        if state.default_content is not None:
            return state.default_content
        words = self.key_text.split()[:8]
        return "ok: " + " ".join(words) if words else "ok"

    # non-streamed answers

    def response(self, answers: list[_Answer]) -> dict[str, Any]:
        choices = [self._choice(i, a) for i, a in enumerate(answers)]
        out: dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion" if self.api == "chat" else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
            "usage": usage(len(self.prompt_ids), sum(len(a.tokens) for a in answers)),
        }
        if self.api == "chat":
            out["prompt_logprobs"] = None
            out["prompt_token_ids"] = self.prompt_ids if self.token_ids else None
        return out

    def _choice(self, index: int, answer: _Answer) -> dict[str, Any]:
        ids = [t.id for t in answer.tokens]
        choice: dict[str, Any] = {"index": index}
        if self.api == "chat":
            calls = [_tool_call_json(c, f"call_{self.id}_{i}") for i, c in enumerate(answer.tool_calls)]
            choice["message"] = {
                "role": "assistant",
                "content": answer.content if (answer.content or not calls) else None,
                "tool_calls": calls,
            }
            choice["logprobs"] = (
                {"content": [_chat_logprob_entry(t, p, self.top) for p, t in enumerate(answer.tokens)]}
                if self.logprobs
                else None
            )
        else:
            choice["text"] = answer.content
            choice["logprobs"] = self._completion_logprobs(answer.tokens, 0) if self.logprobs else None
            choice["prompt_token_ids"] = self.prompt_ids if self.token_ids else None
        choice["finish_reason"] = answer.finish_reason
        choice["stop_reason"] = None
        choice["token_ids"] = ids if self.token_ids else None
        if self.routed_experts:
            choice["routed_experts"] = encode_routes(routes_for(self.prompt_ids + ids)[:-1])
        return choice

    def _completion_logprobs(self, tokens: list[_Token], start: int) -> dict[str, Any]:
        texts = [t.text for t in tokens]
        lps = [token_logprob(t.id, start + i) for i, t in enumerate(tokens)]
        offsets = list(itertools.accumulate([0, *map(len, texts[:-1])])) if texts else []
        return {
            "text_offset": offsets,
            "token_logprobs": lps,
            "tokens": texts,
            "top_logprobs": [{tx: lp} for tx, lp in zip(texts, lps, strict=True)] if self.top else None,
        }

    # streamed answers

    def chunks(self, answers: list[_Answer]) -> list[bytes]:
        """Every SSE event of the answer, choices interleaved token by token."""
        per_choice = [self._choice_chunks(i, a) for i, a in enumerate(answers)]
        events: list[dict[str, Any]] = []
        for row in itertools.zip_longest(*per_choice):
            events.extend(c for c in row if c is not None)
        if self.include_usage:
            events.append(
                self._chunk([], usage=usage(len(self.prompt_ids), sum(len(a.tokens) for a in answers)))
            )
        return [*map(sse_event, events), SSE_DONE]

    def _chunk(self, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        out = {
            "id": self.id,
            "object": "chat.completion.chunk" if self.api == "chat" else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }
        out.update(extra)
        return out

    def _choice_chunks(self, index: int, answer: _Answer) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if self.api == "chat":
            first = {
                "index": index,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": None,
                "finish_reason": None,
            }
            extra = {"prompt_token_ids": self.prompt_ids} if self.token_ids and index == 0 else {}
            out.append(self._chunk([first], **extra))
        n = len(answer.tokens)
        for pos, token in enumerate(answer.tokens):
            last = pos == n - 1
            choice: dict[str, Any] = {"index": index}
            if self.api == "chat":
                choice["delta"] = self._delta(token, f"call_{self.id}_{token.tool_index}", answer)
                choice["logprobs"] = (
                    {"content": [_chat_logprob_entry(token, pos, self.top)]} if self.logprobs else None
                )
            else:
                choice["text"] = token.text
                choice["logprobs"] = self._completion_logprobs([token], pos) if self.logprobs else None
                if pos == 0 and self.token_ids:
                    choice["prompt_token_ids"] = self.prompt_ids
            choice["finish_reason"] = answer.finish_reason if last else None
            choice["stop_reason"] = None
            if self.token_ids:
                choice["token_ids"] = [token.id]
            out.append(self._chunk([choice]))
        return out

    @staticmethod
    def _delta(token: _Token, call_id: str, answer: _Answer) -> dict[str, Any]:
        if token.kind == "content":
            return {"content": token.text}
        if token.kind == "end":
            return {}
        i = token.tool_index
        if token.kind == "tool_start":  # like vLLM: id and name once, in the first delta of a call
            function = {"name": answer.tool_calls[i].name, "arguments": ""}
            return {"tool_calls": [{"index": i, "id": call_id, "type": "function", "function": function}]}
        if token.kind == "tool_args":
            return {"tool_calls": [{"index": i, "function": {"arguments": token.text}}]}
        return {"tool_calls": [{"index": i, "function": {"arguments": ""}}]}


def build_app(state: FakeState) -> web.Application:
    async def completions(request: web.Request) -> web.StreamResponse:
        api = "chat" if request.path.endswith("/chat/completions") else "completions"
        raw = await request.read()
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            state.enter(request.path, raw.decode(errors="replace"))
            state.leave()
            return _error(400, f"request body is not valid JSON: {exc}")
        state.enter(request.path, body)
        try:
            return await _serve(request, api, body)
        finally:
            state.leave()

    async def _serve(request: web.Request, api: str, body: Any) -> web.StreamResponse:
        if not isinstance(body, dict):
            return _error(400, "request body must be a JSON object")
        if state.generator is not None:
            messages = body.get("messages")
            last = messages[-1] if isinstance(messages, list) and messages else None
            key_text = _text(last.get("content")) if isinstance(last, dict) else ""
            fault = await _fault(request, state.take(key_text))
            return fault if fault is not None else await _generated(state.generator, api, body)
        try:
            call = _Call(api, body, state.routes_always)
        except (ValueError, TypeError) as exc:
            return _error(400, str(exc))
        reply = state.take(call.key_text)
        fault = await _fault(request, reply)
        if fault is not None:
            return fault
        if state.served_model_name is not None and call.model != state.served_model_name:
            return _error(404, f"The model `{call.model}` does not exist.")
        answers = [_answer(reply, call.default_content(state), call.max_tokens) for _ in range(call.n)]
        if not call.stream:
            return web.Response(body=orjson.dumps(call.response(answers)), content_type="application/json")
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        for i, chunk in enumerate(call.chunks(answers)):
            if reply.drop_after_chunks is not None and i >= reply.drop_after_chunks:
                assert request.transport is not None
                request.transport.abort()
                return response
            if reply.chunk_delay and i:
                await asyncio.sleep(reply.chunk_delay)
            if reply.gate is not None and i == reply.gate_after_chunks:
                await state.gate_event(reply.gate).wait()
            await response.write(chunk)
        await response.write_eof()
        return response

    async def _fault(request: web.Request, reply: Reply) -> web.Response | None:
        """What a scripted reply does before any answer: hold at a gate, wait, drop, fail."""
        if reply.gate is not None and reply.gate_after_chunks is None:
            await state.gate_event(reply.gate).wait()
        delay = reply.delay or state.delay
        if delay:
            await asyncio.sleep(delay)
        if reply.drop:
            assert request.transport is not None
            request.transport.abort()
            return web.Response()
        if reply.status is not None:
            return _error(reply.status, f"scripted error {reply.status}", reply.error_body)
        return None

    async def _generated(generator: Generator, api: str, body: dict[str, Any]) -> web.Response:
        try:
            if api != "chat":
                raise ValueError("this model serves chat completions only")
            if body.get("stream"):
                raise ValueError("this model does not stream")
            answer = await asyncio.to_thread(generator.chat, body)
        except Exception as exc:  # a bad request or a generator's bug: answer 400, keep the reason
            state.errors.append(f"{type(exc).__name__}: {exc}")
            return _error(400, f"{type(exc).__name__}: {exc}")
        return _json(answer)

    async def models(request: web.Request) -> web.Response:
        name = state.served_model_name or "fake"
        payload = {"object": "list", "data": [{"id": name, "object": "model", "owned_by": "fake"}]}
        return web.json_response(payload, dumps=lambda v: orjson.dumps(v).decode())

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="")

    async def script(request: web.Request) -> web.Response:
        try:
            raw = orjson.loads(await request.read())
            replies = [Reply.from_dict(r) for r in (raw if isinstance(raw, list) else [raw])]
        except (orjson.JSONDecodeError, TypeError, ValueError) as exc:
            return _error(400, f"a script is a list of Reply objects: {exc}")
        state.script(*replies)
        return web.json_response({"pending": state.pending()})

    async def requests(request: web.Request) -> web.Response:
        return web.Response(body=orjson.dumps(list(state.requests)), content_type="application/json")

    async def reset(request: web.Request) -> web.Response:
        state.reset()
        return web.json_response({"status": "ok"})

    async def open_gate(request: web.Request) -> web.Response:
        state.open_gate(request.match_info["name"])
        return web.json_response({"status": "ok"})

    # --- vLLM's scale-out endpoints (only with state.scale_out; else 403, as vLLM without the flag)

    async def scale_out(request: web.Request) -> web.Response:
        if not state.scale_out:  # not logged: the Gateway's capability check, not a call
            return _error(403, "Scale-out endpoints are disabled")
        raw = await request.read()
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            return _error(400, f"request body is not valid JSON: {exc}")
        state.enter(request.path, body)
        try:
            if state.generator is not None:
                return await _scale_out_generated(state.generator, request.path, body)
            if request.path.endswith("/render"):
                return _json(_render(body))
            if request.path.endswith("/derender"):
                return _json(_derender(body))
            return _json(await _generate(body))
        except (ValueError, TypeError, KeyError) as exc:
            return _error(400, str(exc))
        finally:
            state.leave()

    async def _scale_out_generated(generator: Generator, path: str, body: Any) -> web.Response:
        step = generator.render if path.endswith("/render") else None
        step = step or (generator.derender if path.endswith("/derender") else generator.generate)
        try:
            return _json(await asyncio.to_thread(step, body))
        except Exception as exc:  # a bad request or a generator's bug: answer 400, keep the reason
            state.errors.append(f"{type(exc).__name__}: {exc}")
            return _error(400, str(exc))

    def _render(body: dict[str, Any]) -> dict[str, Any]:
        call = _Call("chat", body)
        sampling = {"max_tokens": call.max_tokens, "logprobs": 0 if call.logprobs else None}
        return {
            "request_id": call.id,
            "token_ids": call.prompt_ids,
            "sampling_params": sampling,
            "model": call.model,
        }

    async def _generate(body: dict[str, Any]) -> dict[str, Any]:
        prompt = body["token_ids"]
        if not isinstance(prompt, list) or not prompt:
            raise ValueError("'token_ids' must be a non-empty list")
        sampling = body.get("sampling_params") or {}
        reply = state.take("")
        delay = reply.delay or state.delay
        if delay:
            await asyncio.sleep(delay)
        answer = _answer(reply, state.default_content or "ok", sampling.get("max_tokens"))
        ids = [t.id for t in answer.tokens]
        request_id = f"gen-{next(_ids)}"
        if len(state.generated) > 10000:
            state.generated.clear()
        state.generated[tuple(ids)] = (answer, request_id)
        if answer.finish_reason == "stop":  # the Gateway derenders without the stopping token, as for vLLM
            state.generated[tuple(ids[:-1])] = (answer, request_id)
        logprobs = None
        if sampling.get("logprobs") is not None:
            logprobs = {
                "content": [{"token_id": t, "logprob": token_logprob(t, p)} for p, t in enumerate(ids)]
            }
        choice = {"index": 0, "token_ids": ids, "finish_reason": answer.finish_reason, "logprobs": logprobs}
        return {"request_id": request_id, "choices": [choice], "usage": usage(len(prompt), len(ids))}

    def _derender(body: dict[str, Any]) -> dict[str, Any]:
        generated = body["generate_response"]["choices"][0]
        answer, request_id = state.generated[tuple(generated["token_ids"])]
        calls = [_tool_call_json(c, f"call_{request_id}_{i}") for i, c in enumerate(answer.tool_calls)]
        message = {
            "role": "assistant",
            "content": answer.content if (answer.content or not calls) else None,
            "tool_calls": calls,
        }
        return {
            "id": f"chatcmpl-{request_id}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model"),
            "choices": [
                {"index": 0, "message": message, "finish_reason": answer.finish_reason, "logprobs": None}
            ],
            "usage": usage(int(body.get("prompt_tokens") or 0), len(answer.tokens)),
        }

    def _json(payload: dict[str, Any]) -> web.Response:
        return web.Response(body=orjson.dumps(payload), content_type="application/json")

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/v1/chat/completions/render", scale_out)
    app.router.add_post("/v1/chat/completions/derender", scale_out)
    app.router.add_post("/inference/v1/generate", scale_out)
    app.router.add_post("/v1/chat/completions", completions)
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_post("/fake/script", script)
    app.router.add_get("/fake/requests", requests)
    app.router.add_post("/fake/reset", reset)
    app.router.add_post("/fake/gates/{name}/open", open_gate)
    return app


# --- running it ------------------------------------------------------------------------------


class FakeModelServer:
    """The fake server on a loopback port, in a background thread with its own event loop."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        delay: float = 0.0,
        default_content: str | None = None,
        served_model_name: str | None = None,
        generator: Generator | None = None,
    ) -> None:
        self.host = host
        self.state = FakeState(delay, default_content, served_model_name, generator)
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, port))
        self.port: int = self._sock.getsockname()[1]
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._failure: BaseException | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        """The OpenAI base URL, as registered with the Gateway."""
        return f"{self.url}/v1"

    def script(self, *replies: Reply) -> None:
        self.state.script(*replies)

    @property
    def requests(self) -> list[dict[str, Any]]:
        return list(self.state.requests)

    def open_gate(self, name: str) -> None:
        self.state.open_gate(name)

    def wait_active(self, n: int, timeout: float = 10.0) -> None:
        self.state.wait_active(n, timeout)

    def start(self) -> Self:
        self._thread = threading.Thread(target=self._run, name="fake-model-server", daemon=True)
        self._thread.start()
        self._ready.wait(10)
        if self._failure is not None:
            raise RuntimeError(f"the fake model server did not start: {self._failure}")
        return self

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self.state.loop = loop
        try:
            loop.run_until_complete(self._serve())
        except BaseException as exc:  # reported by start()
            self._failure = exc
            self._ready.set()
        finally:
            loop.close()

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        # A call whose client went away is cancelled, as vLLM aborts it.
        runner = web.AppRunner(
            build_app(self.state),
            access_log=None,
            handle_signals=False,
            handler_cancellation=True,
            shutdown_timeout=1.0,
        )
        await runner.setup()
        site = web.SockSite(runner, self._sock, backlog=4096)
        await site.start()
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            await runner.cleanup()

    def stop(self) -> None:
        loop, stop = self.state.loop, self._stop
        if loop is not None and stop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(stop.set)
        if self._thread is not None:
            self._thread.join(10)
        self._sock.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="vLLM-shaped fake OpenAI-compatible model server")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--delay", type=float, default=0.0, help="seconds before every answer")
    parser.add_argument("--content", default=None, help="the default answer text")
    parser.add_argument("--served-model-name", default=None, help="answer 404 to other model names")
    parser.add_argument("--scale-out", action="store_true", help="serve render / generate / derender")
    args = parser.parse_args(argv)
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    state = FakeState(args.delay, args.content, args.served_model_name)
    state.scale_out = args.scale_out
    web.run_app(
        build_app(state),
        host=args.host,
        port=args.port,
        access_log=None,
        print=None,
        backlog=4096,
        handler_cancellation=True,
        shutdown_timeout=1.0,
    )


if __name__ == "__main__":
    main()
