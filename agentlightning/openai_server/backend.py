"""What a model puts behind the one OpenAI-shaped HTTP server (`app.py`).

A `ModelBackend` turns one validated call into an `Answer`: a JSON body, or a stream of
chunks that the server frames as server-sent events. The server owns everything else: the
routes, reading and validating bodies, OpenAI's error shape, SSE framing, headers, cancelling a
call whose client went away, and (for the test doubles only) the `FaultHooks` that fail, delay,
drop or hold a call. A backend that also serves vLLM's scale-out endpoints (render, generate
on tokens, derender) implements `ScaleOutBackend`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from agentlightning.openai_server.requests import ChatCompletionRequest, CompletionRequest


class BadRequest(Exception):
    """Answered as OpenAI's error body with this status (400 unless said otherwise)."""

    def __init__(self, message: str, status: int = 400, kind: str = "BadRequestError") -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind


class ServerError(Exception):
    """The model failed: answered 500 in OpenAI's error shape."""


@dataclass
class Fault:
    """What a fault hook does to one call; fields left at their defaults do nothing."""

    status: int | None = None  # answer with this HTTP status and an OpenAI error body
    error_body: Any = None  # the body of that error answer, instead of the default one
    delay: float = 0.0  # seconds before the answer starts
    chunk_delay: float = 0.0  # seconds between streamed chunks
    drop: bool = False  # close the connection without answering
    drop_after_chunks: int | None = None  # streams: close the connection after this many chunks
    gate: str | None = None  # hold the call until the gate of this name is opened
    gate_after_chunks: int | None = None  # streams: hold at `gate` after this many chunks, not before


@dataclass
class Call:
    """One call as the backend sees it."""

    path: str
    body: Any  # the JSON body as sent
    # The body validated as OpenAI's request (chat and completions; None for scale-out calls and
    # when the server is lenient).
    request: ChatCompletionRequest | CompletionRequest | None = None
    fault: Fault | None = None  # what the hooks chose for this call (backends of test doubles read it)

    @property
    def api(self) -> str:
        return "chat" if self.path.endswith("/chat/completions") else "completions"


@dataclass
class Answer:
    """A JSON answer (`body`), or a stream (`chunks`: each one server-sent event, a dict as JSON or
    pre-framed bytes, as they come or, from a test double, all made at once in a list; the server
    adds `data: [DONE]`)."""

    body: Any = None
    chunks: AsyncIterator[Any] | list[Any] | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    status: int = 200


class ModelBackend(Protocol):
    """A model behind the server: chat and text completions, and its model cards."""

    async def chat(self, call: Call) -> Answer: ...

    async def completions(self, call: Call) -> Answer: ...

    def models(self) -> Answer:
        """The answer to `GET /v1/models`."""
        ...


@runtime_checkable
class ScaleOutBackend(Protocol):
    """vLLM's scale-out endpoints (`vllm serve --enable-scale-out`), each a body to an answer body."""

    scale_out: bool  # serving them now (else 403, as vLLM without the flag)

    async def render(self, call: Call) -> Any: ...

    async def generate(self, call: Call) -> Any: ...

    async def derender(self, call: Call) -> Any: ...


class FaultHooks(Protocol):
    """The test doubles' view into the server: a log of calls and a fault for each."""

    def enter(self, path: str, body: Any) -> None:
        """A call arrived (also one whose body is not JSON: `body` is then its text)."""
        ...

    def leave(self) -> None: ...

    def fault(self, call: Call) -> Fault | None:
        """What to do to this call (chat, completions and scale-out generate), or None."""
        ...

    async def wait_gate(self, name: str) -> None: ...
