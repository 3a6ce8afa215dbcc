"""A vLLM-shaped, OpenAI-compatible model server: the test double of an inference server.

It answers `POST /v1/chat/completions` and `POST /v1/completions` like vLLM (>= 0.10.2) does:
with `return_token_ids: true` a chat answer carries the prompt's token ids at the top level
(`prompt_token_ids`) and a completion carries them per choice; every choice carries the
generated `token_ids`, and so does every streamed chunk. Log-probs have the OpenAI shapes
(`logprobs.content[].logprob` for chat, `logprobs.token_logprobs` for completions).

Tokens come from a deterministic toy tokenizer (one token per word with its leading spaces)
and a toy chat template that has the prefix property of real ones: the prompt of a follow-up
call begins with the previous prompt followed by the previous answer's token ids.

Replies are scriptable (`Reply`: content, tool calls, finish reason) and so are faults (a
`Reply` is the one server's `Fault`): an HTTP status, a delay before the answer or between
chunks, a connection dropped before the answer or after N chunks, and named gates that hold a
call until a test opens them. `FakeState` holds the script, the request log and the gates; it
is the fault hook of the one OpenAI server (`agentlightning.openai_server`), and `ToyBackend`
is the model behind it. Another model can stand behind the same server with the same faults
(`scripted_model.ScriptedChatModel` is this server with its `PolicyBackend`).

Requests are validated as the torch engine's server validates them (a clear 400); `lenient=True`
passes any JSON object through to the toy model.

In-process, for tests::

    with FakeModelServer() as fake:
        fake.script(Reply(content="hi"), Reply(status=503))
        ... point a client or the Gateway at fake.base_url ...

As a process, for benchmarks (from the repository root): `python -m tests.fakes.model_server --port 8000
--delay 0.05`.
A process is scripted over HTTP: `POST /fake/script` (a list of Reply objects as JSON),
`GET /fake/requests`, `POST /fake/reset`, `POST /fake/gates/{name}/open`.

With `state.scale_out` (`--scale-out`) it also serves vLLM's scale-out endpoints, as
`vllm serve --enable-scale-out` does: `POST /v1/chat/completions/render` (the toy template's
prompt ids), `POST /inference/v1/generate` (the scripted answer's ids and log-probs, held at the reply's
`gate`; with `stream: true` one event a token, held there after `gate_after_chunks`) and
`POST /v1/chat/completions/derender` (those ids back into the chat message; with `stream: true`
one generate event into one chat chunk, as vLLM's streamed derender); without it they answer
403, as vLLM does without the flag.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import dataclasses
import io
import itertools
import re
import threading
import time
import zlib
from collections import deque
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Self

import orjson
from aiohttp import web

from agentlightning.openai_server.app import OpenAIServer, error_response, json_response, serve
from agentlightning.openai_server.app import build_app as build_openai_app
from agentlightning.openai_server.backend import Answer, BadRequest, Call, Fault, ModelBackend
from agentlightning.openai_server.shapes import SSE_DONE, sse_event, usage

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


def render_message(message: Mapping[str, Any]) -> list[int]:
    """A message's tokens: role, content, tool calls, end of turn."""
    ids = [ROLE_TOKENS.get(str(message.get("role")), OTHER_ROLE), *encode(_text(message.get("content")))]
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        ids += tool_call_tokens(str(function.get("name", "")), str(function.get("arguments", "")))
    ids.append(END)
    return ids


def chat_prompt_ids(messages: Sequence[Mapping[str, Any]]) -> list[int]:
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


@dataclass(kw_only=True)
class Reply(Fault):
    """What the server answers to one call: its content and, as a `Fault`, what goes wrong
    (status, delays, drops, gates). Fields left at their defaults behave normally."""

    content: str | None = None  # None: a default text derived from the prompt
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str | None = None  # default: stop, tool_calls, or length when max_tokens cut it
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


# --- the request log, the script and the gates -------------------------------------------


class FakeState:
    """The script, the request log and the gates: the server's fault hooks (`FaultHooks`) and the
    toy model's settings. Shared by the server's loop and test threads."""

    def __init__(
        self,
        delay: float = 0.0,
        default_content: str | None = None,
        served_model_name: str | None = None,
    ) -> None:
        self.delay = delay
        self.default_content = default_content
        self.served_model_name = served_model_name
        # Routes on every non-streamed answer, asked or not: vLLM 0.32 serving with
        # `enable_return_routed_experts` (its OpenAI API has no per-request switch).
        self.routes_always = False
        # vLLM's scale-out endpoints (`--enable-scale-out`): render, generate on tokens, derender.
        self.scale_out = False
        self.generated: dict[tuple[int, ...], tuple[_Answer, str]] = {}  # for derender: ids → answer, id
        self.streamed: dict[str, _Answer] = {}  # for streamed derender: generate's request id → answer
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
            # An opened gate holds again after a reset (a call still waiting at a closed one stays).
            self._gates = {name: gate for name, gate in self._gates.items() if not gate.is_set()}

    def take(self, key_text: str) -> Reply:
        """The next scripted reply for a call keyed by this text (its `delay` defaulted to the
        server's), else a plain one."""
        with self._lock:
            for i, reply in enumerate(self._script):
                if reply.when is None or reply.when in key_text:
                    reply.times -= 1
                    if reply.times <= 0:
                        del self._script[i]
                    if self.delay and not reply.delay:
                        return dataclasses.replace(reply, delay=self.delay)
                    return reply
        return Reply(delay=self.delay)

    def fault(self, call: Call) -> Reply:
        """The hook: this call's reply, by the text of its last message (chat) or its prompt."""
        return self.take(key_text(call.body))

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

    async def wait_gate(self, name: str) -> None:
        await self.gate_event(name).wait()

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


# --- the toy model ---------------------------------------------------------------------------

_ids = itertools.count(1)


def key_text(body: dict[str, Any]) -> str:
    """What a scripted reply's `when` is matched against: the last message's text, or the prompt."""
    messages = body.get("messages")
    if isinstance(messages, list):
        last = messages[-1] if messages else None
        return _text(last.get("content")) if isinstance(last, dict) else ""
    prompt = body.get("prompt")
    return prompt if isinstance(prompt, str) else ""


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
            self.logprobs = bool(body.get("logprobs"))
            self.top = int(body.get("top_logprobs") or 0)
        else:
            prompt = body.get("prompt")
            if isinstance(prompt, str):
                self.prompt_ids = encode(prompt)
            elif isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
                self.prompt_ids = list(prompt)
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
        words = key_text(self.body).split()[:8]
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


class ToyBackend:
    """The toy model behind the one server: answers from the toy tokenizer and the script."""

    def __init__(self, state: FakeState) -> None:
        self.state = state

    @property
    def scale_out(self) -> bool:
        return self.state.scale_out

    async def chat(self, call: Call) -> Answer:
        return self._answer(call)

    async def completions(self, call: Call) -> Answer:
        return self._answer(call)

    def _answer(self, call: Call) -> Answer:
        state = self.state
        try:
            toy = _Call(call.api, call.body, state.routes_always)
        except (ValueError, TypeError) as exc:
            raise BadRequest(str(exc)) from None
        if state.served_model_name is not None and toy.model != state.served_model_name:
            raise BadRequest(f"The model `{toy.model}` does not exist.", 404, "NotFoundError")
        reply = call.fault if isinstance(call.fault, Reply) else Reply()
        answers = [_answer(reply, toy.default_content(state), toy.max_tokens) for _ in range(toy.n)]
        if not toy.stream:
            return Answer(toy.response(answers))
        # The last chunk, [DONE], is the server's.
        return Answer(chunks=toy.chunks(answers)[:-1])

    def models(self) -> Answer:
        name = self.state.served_model_name or "fake"
        return Answer({"object": "list", "data": [{"id": name, "object": "model", "owned_by": "fake"}]})

    # vLLM's scale-out endpoints

    async def render(self, call: Call) -> dict[str, Any]:
        toy = _Call("chat", call.body)
        sampling = {"max_tokens": toy.max_tokens, "logprobs": 0 if toy.logprobs else None}
        return {
            "request_id": toy.id,
            "token_ids": toy.prompt_ids,
            "sampling_params": sampling,
            "model": toy.model,
        }

    async def generate(self, call: Call) -> dict[str, Any] | Answer:
        body, state = call.body, self.state
        prompt = body["token_ids"]
        if not isinstance(prompt, list) or not prompt:
            raise ValueError("'token_ids' must be a non-empty list")
        sampling = body.get("sampling_params") or {}
        reply = state.take("")
        if reply.delay:
            await asyncio.sleep(reply.delay)
        answer = _answer(reply, state.default_content or "ok", sampling.get("max_tokens"))
        ids = [t.id for t in answer.tokens]
        request_id = f"gen-{next(_ids)}"
        if len(state.generated) > 10000:
            state.generated.clear()
            state.streamed.clear()
        state.generated[tuple(ids)] = (answer, request_id)
        if answer.finish_reason == "stop":  # the Gateway derenders without the stopping token, as for vLLM
            state.generated[tuple(ids[:-1])] = (answer, request_id)
        with_logprobs = sampling.get("logprobs") is not None
        if body.get("stream") is True:
            state.streamed[request_id] = answer
            return Answer(chunks=self._generate_chunks(reply, answer, request_id, with_logprobs))
        if reply.gate is not None:  # the whole answer waits for the gate, wherever a stream would
            await state.wait_gate(reply.gate)
        logprobs = None
        if with_logprobs:
            logprobs = {
                "content": [{"token_id": t, "logprob": token_logprob(t, p)} for p, t in enumerate(ids)]
            }
        choice = {"index": 0, "token_ids": ids, "finish_reason": answer.finish_reason, "logprobs": logprobs}
        return {"request_id": request_id, "choices": [choice], "usage": usage(len(prompt), len(ids))}

    async def _generate_chunks(
        self, reply: Reply, answer: _Answer, request_id: str, with_logprobs: bool
    ) -> AsyncIterator[dict[str, Any]]:
        """Generate's events, one token each (as vLLM's engine steps), held at the reply's gate
        after `gate_after_chunks` of them."""
        last = len(answer.tokens) - 1
        for position, token in enumerate(answer.tokens):
            if reply.gate is not None and position == reply.gate_after_chunks:
                await self.state.wait_gate(reply.gate)
            logprobs = None
            if with_logprobs:
                logprobs = {"content": [{"token_id": token.id, "logprob": token_logprob(token.id, position)}]}
            choice = {
                "index": 0,
                "token_ids": [token.id],
                "logprobs": logprobs,
                "finish_reason": answer.finish_reason if position == last else None,
            }
            yield {"request_id": request_id, "choices": [choice]}

    def _derender_chunk(self, body: dict[str, Any]) -> dict[str, Any]:
        """Streamed derender: one generate event → one chat chunk and the state for the next
        (here: the tokens seen so far)."""
        chunk = body["generate_chunk"]
        request_id = chunk["request_id"]
        answer = self.state.streamed[request_id]
        seen = int((body.get("stream_state") or {}).get("seen", 0))
        choice = chunk["choices"][0]
        ids = choice.get("token_ids") or []
        if [t.id for t in answer.tokens[seen : seen + len(ids)]] != ids:
            raise BadRequest(f"tokens {ids} are not the stream's next ones")
        delta: dict[str, Any] = {"role": "assistant"} if seen == 0 else {}
        for token in answer.tokens[seen : seen + len(ids)]:
            piece = _Call._delta(token, f"call_{request_id}_{token.tool_index}", answer)
            if "content" in piece:
                delta["content"] = delta.get("content", "") + piece["content"]
            delta.setdefault("tool_calls", []).extend(piece.get("tool_calls", []))
        if not delta.get("tool_calls"):
            delta.pop("tool_calls", None)
        out = {
            "id": f"chatcmpl-{request_id}",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": body.get("model"),
            "choices": [{"index": 0, "delta": delta, "finish_reason": choice.get("finish_reason")}],
        }
        return {"chunk": out, "stream_state": {"seen": seen + len(ids)}}

    async def derender(self, call: Call) -> dict[str, Any]:
        body = call.body
        if body.get("stream") is True:
            return self._derender_chunk(body)
        generated = body["generate_response"]["choices"][0]
        answer, request_id = self.state.generated[tuple(generated["token_ids"])]
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


# --- the server ------------------------------------------------------------------------------


def build_app(
    state: FakeState, backend: ModelBackend | None = None, lenient: bool = False
) -> web.Application:
    """The one OpenAI server over `backend` (default: the toy model) with `state` as its fault
    hooks, and the routes that script it over HTTP."""
    app = build_openai_app(backend or ToyBackend(state), hooks=state, lenient=lenient)

    async def script(request: web.Request) -> web.Response:
        try:
            raw = orjson.loads(await request.read())
            replies = [Reply.from_dict(r) for r in (raw if isinstance(raw, list) else [raw])]
        except (orjson.JSONDecodeError, TypeError, ValueError) as exc:
            return error_response(400, f"a script is a list of Reply objects: {exc}")
        state.script(*replies)
        return json_response({"pending": state.pending()})

    async def requests(request: web.Request) -> web.Response:
        return json_response(list(state.requests))

    async def reset(request: web.Request) -> web.Response:
        state.reset()
        return json_response({"status": "ok"})

    async def open_gate(request: web.Request) -> web.Response:
        state.open_gate(request.match_info["name"])
        return json_response({"status": "ok"})

    app.router.add_post("/fake/script", script)
    app.router.add_get("/fake/requests", requests)
    app.router.add_post("/fake/reset", reset)
    app.router.add_post("/fake/gates/{name}/open", open_gate)
    return app


class FakeModelServer(OpenAIServer):
    """The fake server on a loopback port, in a background thread with its own event loop.

    `backend` puts another model behind it (`scripted_model.PolicyBackend`); `lenient` passes
    bodies that OpenAI's request schema would refuse through to the model."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        delay: float = 0.0,
        default_content: str | None = None,
        served_model_name: str | None = None,
        backend: ModelBackend | None = None,
        lenient: bool = False,
    ) -> None:
        self.state = FakeState(delay, default_content, served_model_name)
        super().__init__(build_app(self.state, backend, lenient), host, port)

    def script(self, *replies: Reply) -> None:
        self.state.script(*replies)

    @property
    def requests(self) -> list[dict[str, Any]]:
        return list(self.state.requests)

    def open_gate(self, name: str) -> None:
        self.state.open_gate(name)

    def wait_active(self, n: int, timeout: float = 10.0) -> None:
        self.state.wait_active(n, timeout)

    def start(self, timeout: float = 30.0) -> Self:
        super().start(timeout)
        self.state.loop = self.loop  # gates opened from other threads are set on the server's loop
        return self


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="vLLM-shaped fake OpenAI-compatible model server")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--delay", type=float, default=0.0, help="seconds before every answer")
    parser.add_argument("--content", default=None, help="the default answer text")
    parser.add_argument("--served-model-name", default=None, help="answer 404 to other model names")
    parser.add_argument("--scale-out", action="store_true", help="serve render / generate / derender")
    parser.add_argument("--lenient", action="store_true", help="skip OpenAI's request schema")
    args = parser.parse_args(argv)
    state = FakeState(args.delay, args.content, args.served_model_name)
    state.scale_out = args.scale_out
    serve(build_app(state, lenient=args.lenient), args.host, args.port)


if __name__ == "__main__":
    main()
