"""What the torch engine's answers are made of, as vLLM's server makes them.

Requests (validated by the server, `openai_server/requests.py`) become the engine's
`SamplingParams`; answers are plain dicts built to vLLM's layout, including its
`return_token_ids` extension: `prompt_token_ids` at the top level of chat answers and per
choice for completions, and `token_ids` per choice (and per stream chunk). Tool calls use the
Hermes form `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, parsed like vLLM's
`hermes` parser, and streamed like it: a call's id and name once the name is complete, its
arguments when the call closes.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from typing import Any, Literal

from agentlightning.openai_server.requests import ChatCompletionRequest, CompletionRequest
from agentlightning.torch_backend.engine import SamplingParams, StepOutput

# JSON has no -inf; vLLM reports this floor instead.
LOGPROB_FLOOR = -9999.0
TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"
_TOOL_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", re.DOTALL)


def sampling_params(
    req: ChatCompletionRequest | CompletionRequest, max_tokens: int, top_logprobs: int
) -> SamplingParams:
    stops = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=1.0 if req.temperature is None else req.temperature,
        top_p=1.0 if req.top_p is None else req.top_p,
        top_k=-1 if req.top_k is None else req.top_k,
        seed=req.seed,
        stop=tuple(stops),
        stop_token_ids=tuple(req.stop_token_ids or ()),
        ignore_eos=req.ignore_eos,
        include_stop_str_in_output=req.include_stop_str_in_output,
        top_logprobs=top_logprobs,
        detokenize=req.stream,
    )


def unsupported(req: ChatCompletionRequest | CompletionRequest) -> str | None:
    """A message naming a requested feature this server does not implement, else None."""
    for name in ("presence_penalty", "frequency_penalty"):
        if getattr(req, name) not in (None, 0, 0.0):
            return f"{name} is not supported by the built-in torch server; leave it at 0"
    if req.repetition_penalty not in (None, 1, 1.0):
        return "repetition_penalty is not supported by the built-in torch server; leave it at 1"
    return None


def tool_choice_error(req: ChatCompletionRequest) -> str | None:
    if req.tool_choice in (None, "auto", "none"):
        return None
    return (
        f"tool_choice={json.dumps(req.tool_choice)} is not supported by the built-in torch server "
        "(it needs guided decoding); use 'auto' or 'none'"
    )


def flatten_content(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI content parts (`[{"type": "text", "text": ...}]`) become plain strings for the template."""
    out = []
    for m in messages:
        if not isinstance(m, dict) or "role" not in m:
            raise ValueError("every message needs a 'role'")
        content = m.get("content")
        if isinstance(content, list):
            texts = []
            for part in content:
                if isinstance(part, dict) and part.get("type") == "text":
                    texts.append(str(part.get("text", "")))
                else:
                    raise ValueError("only text content parts are supported by the built-in torch server")
            m = {**m, "content": "".join(texts)}
        elif content is None and m["role"] != "assistant":
            m = {**m, "content": ""}
        out.append(m)
    return out


def parse_tool_calls(text: str) -> tuple[str | None, list[dict[str, Any]]] | None:
    """Hermes tool calls in `text` → (content before them or None, OpenAI tool_calls); None if none.

    Like vLLM's hermes parser: any unparsable call makes the whole text plain content, and text
    after the last call is dropped. Arguments are re-serialised with `json.dumps` (canonical).
    """
    start = text.find(TOOL_CALL_START)
    if start < 0:
        return None
    calls = []
    for closed, unclosed in _TOOL_CALL_RE.findall(text):
        raw = (closed or unclosed).strip()
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError:
            return None
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return None
        calls.append(
            {
                "id": f"chatcmpl-tool-{uuid.uuid4().hex[:24]}",
                "type": "function",
                "function": {
                    "name": obj["name"],
                    "arguments": json.dumps(obj.get("arguments", {}), ensure_ascii=False),
                },
            }
        )
    content = text[:start]
    return (content or None), calls


def hold_back_tool_prefix(text: str) -> int:
    """Characters at the end of `text` that could begin `<tool_call>` (held back while streaming)."""
    for k in range(min(len(TOOL_CALL_START) - 1, len(text)), 0, -1):
        if TOOL_CALL_START.startswith(text[-k:]):
            return k
    return 0


_NAME_RE = re.compile(r'^\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"')


class StreamedToolCalls:
    """One choice's Hermes tool calls as deltas, token by token (vLLM's streaming hermes parser):
    content until `<tool_call>` (holding back what may begin one); then, per call, its id, type and
    name as soon as the name is complete, and its arguments (as the non-streamed answer writes
    them) when the call closes. `finish` ends the choice: the rest of the content if the text is no
    valid tool call after all, else the calls not yet closed."""

    def __init__(self) -> None:
        self.text = ""
        self.sent = 0  # characters of content sent
        self.named = 0  # calls whose id and name were sent
        self.closed = 0  # calls whose arguments were sent
        self.ids: list[str] = []

    def feed(self, text_delta: str) -> dict[str, Any]:
        self.text += text_delta
        delta: dict[str, Any] = {}
        start = self.text.find(TOOL_CALL_START)
        safe = start if start >= 0 else len(self.text) - hold_back_tool_prefix(self.text)
        if safe > self.sent:
            delta["content"] = self.text[self.sent : safe]
            self.sent = safe
        if start >= 0:
            calls = self._calls(final=False)
            if calls:
                delta["tool_calls"] = calls
        return delta

    def finish(self) -> tuple[dict[str, Any], bool]:
        """The last delta, and whether the choice called tools."""
        parsed = parse_tool_calls(self.text)
        if parsed is None:
            rest = self.text[self.sent :]
            self.sent = len(self.text)
            return ({"content": rest} if rest else {}), False
        calls = self._calls(final=True)
        return ({"tool_calls": calls} if calls else {}), True

    def _calls(self, final: bool) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for i, (closed, unclosed) in enumerate(_TOOL_CALL_RE.findall(self.text)):
            raw = closed or unclosed
            done = bool(closed) or final
            if i >= self.named:
                if i > self.named:
                    break
                whole = _parse_call(raw) if done else None
                named = _NAME_RE.match(raw)
                if whole is not None:
                    name = whole["name"]
                elif named is not None:
                    name = json.loads(f'"{named[1]}"')  # the name as JSON wrote it, escapes and all
                else:
                    break
                self.ids.append(f"chatcmpl-tool-{uuid.uuid4().hex[:24]}")
                function = {"name": name, "arguments": ""}
                out.append({"index": i, "id": self.ids[i], "type": "function", "function": function})
                self.named += 1
            if i == self.closed and done:
                whole = _parse_call(raw)
                if whole is None:
                    break
                arguments = json.dumps(whole.get("arguments", {}), ensure_ascii=False)
                if out and out[-1]["index"] == i:
                    out[-1]["function"]["arguments"] = arguments
                else:
                    out.append({"index": i, "function": {"arguments": arguments}})
                self.closed += 1
        return out


def _parse_call(raw: str) -> dict[str, Any] | None:
    try:
        obj = json.loads(raw.strip())
    except json.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) and isinstance(obj.get("name"), str) else None


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


def _lp(value: float) -> float:
    return max(value, LOGPROB_FLOOR)


class TokenText:
    """Token strings and bytes for log-prob entries, cached per id."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._cache: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        text = self._cache.get(token_id)
        if text is None:
            text = self.tokenizer.decode([token_id], skip_special_tokens=False)
            self._cache[token_id] = text
        return text

    def chat_entry(self, out: StepOutput, with_top: bool) -> dict[str, Any]:
        tok = self(out.token_id)
        entry: dict[str, Any] = {
            "token": tok,
            "logprob": _lp(out.logprob),
            "bytes": list(tok.encode("utf-8")),
            "top_logprobs": [],
        }
        if with_top and out.top_logprobs:
            entry["top_logprobs"] = [
                {"token": self(t), "logprob": _lp(v), "bytes": list(self(t).encode("utf-8"))}
                for t, v in out.top_logprobs
            ]
        return entry

    def completion_logprobs(self, outs: list[StepOutput], k: int, text_start: int = 0) -> dict[str, Any]:
        tokens = [self(o.token_id) for o in outs]
        offsets, pos = [], text_start
        for t in tokens:
            offsets.append(pos)
            pos += len(t)
        return {
            "text_offset": offsets,
            "token_logprobs": [_lp(o.logprob) for o in outs],
            "tokens": tokens,
            "top_logprobs": [{self(t): _lp(v) for t, v in (o.top_logprobs or [])} for o in outs]
            if k
            else None,
        }


FinishReason = Literal["stop", "length", "tool_calls", "abort"]
