"""The parts of an OpenAI-shaped answer that every model behind the server builds alike.

The torch engine's backend (`torch_backend/openai_backend.py`) and the test doubles
(`tests/fakes/model_server.py`, `tests/fakes/scripted_model.py`) answer with the same error body,
the same usage block and the same server-sent-event framing; they are written here once. The
rest of their answers is each backend's: each double copies the shape of the server it stands
in for (vLLM streaming tool-call deltas token by token, vLLM on Qwen2.5 with
`reasoning_content`), the torch engine answers from its own step outputs.
"""

from __future__ import annotations

from typing import Any

import orjson

SSE_DONE = b"data: [DONE]\n\n"
"""The last event of an OpenAI stream."""


def sse_event(obj: Any) -> bytes:
    """One server-sent event carrying `obj` as JSON."""
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def error_body(
    message: str, code: int, kind: str = "BadRequestError", param: str | None = None
) -> dict[str, Any]:
    """OpenAI's error object, as vLLM sends it: `{"error": {message, type, param, code}}`."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
