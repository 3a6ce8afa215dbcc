"""OpenAI request/response shapes as vLLM's OpenAI-compatible server speaks them.

Requests are validated with pydantic (unknown fields are accepted and ignored, as vLLM does);
answers are plain dicts built to vLLM's layout, including its `return_token_ids` extension:
`prompt_token_ids` at the top level of chat answers and per choice for completions, and
`token_ids` per choice (and per stream chunk). Tool calls use the Hermes form
`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, parsed like vLLM's `hermes` parser.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from agentlightning.torch_backend.engine import SamplingParams, StepOutput

# JSON has no -inf; vLLM reports this floor instead.
LOGPROB_FLOOR = -9999.0
TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"
_TOOL_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", re.DOTALL)


class StreamOptions(BaseModel):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class _Common(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str | None = None
    n: int = Field(default=1, ge=1, le=128)
    temperature: float | None = Field(default=None, ge=0.0, le=100.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    return_token_ids: bool = False
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    presence_penalty: float | None = 0.0
    frequency_penalty: float | None = 0.0
    repetition_penalty: float | None = None

    @field_validator("top_k")
    @classmethod
    def _top_k(cls, v: int | None) -> int | None:
        if v is not None and (v == 0 or v < -1):
            raise ValueError("top_k must be -1 (off) or a positive integer")
        return v

    def unsupported(self) -> str | None:
        """A message naming a requested feature this server does not implement, else None."""
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name) not in (None, 0, 0.0):
                return f"{name} is not supported by the built-in torch server; leave it at 0"
        if self.repetition_penalty not in (None, 1, 1.0):
            return "repetition_penalty is not supported by the built-in torch server; leave it at 1"
        return None

    def sampling(self, max_tokens: int, top_logprobs: int) -> SamplingParams:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=-1 if self.top_k is None else self.top_k,
            seed=self.seed,
            stop=tuple(stops),
            stop_token_ids=tuple(self.stop_token_ids or ()),
            ignore_eos=self.ignore_eos,
            include_stop_str_in_output=self.include_stop_str_in_output,
            top_logprobs=top_logprobs,
            detokenize=self.stream,
        )


class ChatCompletionRequest(_Common):
    messages: list[dict[str, Any]] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None

    def parse_tools(self) -> bool:
        """Whether to parse tool calls out of the output (tools given and tool_choice allows)."""
        return bool(self.tools) and self.tool_choice in (None, "auto")

    def tool_choice_error(self) -> str | None:
        if self.tool_choice in (None, "auto", "none"):
            return None
        return (
            f"tool_choice={json.dumps(self.tool_choice)} is not supported by the built-in torch server "
            "(it needs guided decoding); use 'auto' or 'none'"
        )


class CompletionRequest(_Common):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(default=16, ge=1)
    logprobs: int | None = Field(default=None, ge=0, le=20)
    echo: bool = False
    suffix: str | None = None

    def prompts(self) -> list[str | list[int]]:
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if not p:
            raise ValueError("prompt must not be empty")
        if all(isinstance(x, int) for x in p):
            return [list(p)]  # type: ignore[arg-type]  # all ints: one prompt of token ids
        return list(p)  # type: ignore[arg-type]  # a batch: strings or id lists, as the schema allows


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
