"""Checks the doctor asks the model server itself, on a sample of recorded calls (greedy, so the
answers are comparable):

- render: the server's own token ids for the call's chat request vs the recorded prompt;
- regenerate: greedy generation from the recorded prompt ids (`/completions` on token ids) vs the
  recorded answer ids;
- stream: the same request streamed and not streamed, the same answer ids and tool calls.

Every answer is read as vLLM gives it with `return_token_ids` (our torch engine does the same).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

import httpx

# What the doctor sets on every probe: greedy, token ids back, nothing the answer would not need.
_GREEDY = {"temperature": 0.0, "top_p": 1.0, "return_token_ids": True, "stream": False, "n": 1}
_DROPPED = ("logprobs", "top_logprobs", "stream_options", "seed", "user", "store", "metadata")


class ServerUnreachable(Exception):
    """The model server did not answer: the message says where and how."""


@dataclass
class Probe:
    """One check on one recorded call. `ok` None: the server could not be asked (why in `note`)."""

    check: str  # render | regenerate | stream
    rollout_id: str
    call: int
    ok: bool | None
    first_difference: int | None = None  # token index where the two sequences part
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first index where `a` and `b` differ (the shorter one's length if one is a prefix), None if equal."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def chat_body(call: dict[str, Any], model: str) -> dict[str, Any] | None:
    """The chat request the Gateway sent upstream for a recorded call (None for completions)."""
    if call.get("api") == "completions":
        return None
    sent = call.get("chat_request")
    if not isinstance(sent, dict):
        request, params = call.get("request"), call.get("params")
        if not isinstance(request, dict):
            return None
        sent = {**request, **(params if isinstance(params, dict) else {})}
    body = {k: v for k, v in sent.items() if k not in _DROPPED}
    return {**body, **_GREEDY, "model": model}


def recorded_ids(call: dict[str, Any]) -> tuple[list[int], list[int]] | None:
    """(prompt ids, answer ids) the Gateway recorded for a call, None when it has none."""
    response = call.get("response")
    if not isinstance(response, dict):
        return None
    choices = response.get("choices")
    prompt = response.get("prompt_token_ids")
    answer = choices[0].get("token_ids") if isinstance(choices, list) and choices else None
    if isinstance(prompt, list) and prompt and isinstance(answer, list) and answer:
        return prompt, answer
    return None


class ServerProbe:
    """The model server's OpenAI base URL (`…/v1`), asked with httpx."""

    def __init__(self, base_url: str, model: str, api_key: str = "", timeout: float = 300.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.Client(timeout=timeout, headers=headers, trust_env=False)

    def close(self) -> None:
        self.http.close()

    def _post(self, route: str, body: dict[str, Any]) -> httpx.Response:
        try:
            return self.http.post(f"{self.base_url}/{route}", json=body)
        except httpx.HTTPError as exc:
            raise ServerUnreachable(f"POST {self.base_url}/{route}: {type(exc).__name__}: {exc}") from None

    def serves_token_endpoints(self) -> bool:
        """Whether the server renders a chat request as vLLM's scale-out endpoints do (`vllm serve
        --enable-scale-out`): the Gateway serves calls that go on from an earlier turn on them."""
        body = {"model": self.model, "messages": [{"role": "user", "content": "hi"}]}
        try:
            answer = self._post("chat/completions/render", body)
            rendered = answer.json() if answer.status_code == 200 else None
        except (ServerUnreachable, ValueError):
            return False
        ids = rendered.get("token_ids") if isinstance(rendered, dict) else None
        return isinstance(ids, list) and bool(ids)

    def render(self, rollout_id: str, n: int, call: dict[str, Any]) -> Probe:
        ids, body = recorded_ids(call), chat_body(call, self.model)
        if ids is None or body is None:
            return Probe("render", rollout_id, n, None, note="no recorded chat request with token ids")
        response = self._post("chat/completions", {**body, "max_tokens": 1})
        if response.status_code != 200:
            return Probe("render", rollout_id, n, None, note=_refused(response))
        rendered = response.json().get("prompt_token_ids")
        if not isinstance(rendered, list):
            return Probe("render", rollout_id, n, None, note="the server returns no prompt_token_ids")
        at = first_difference(rendered, ids[0])
        return Probe("render", rollout_id, n, at is None, at)

    def regenerate(self, rollout_id: str, n: int, call: dict[str, Any]) -> Probe:
        ids = recorded_ids(call)
        if ids is None:
            return Probe("regenerate", rollout_id, n, None, note="no recorded token ids")
        prompt, answer = ids
        body = {
            "model": self.model,
            "prompt": prompt,
            "max_tokens": len(answer),
            "temperature": 0.0,
            "return_token_ids": True,
            "skip_special_tokens": False,
        }
        response = self._post("completions", body)
        if response.status_code != 200:
            return Probe(
                "regenerate", rollout_id, n, None, note=f"completions on token ids: {_refused(response)}"
            )
        choices = response.json().get("choices") or [{}]
        again = choices[0].get("token_ids")
        if not isinstance(again, list):
            return Probe("regenerate", rollout_id, n, None, note="the server returns no token_ids")
        at = first_difference(again, answer)
        # A stop token may end one and not be reported by the other: equal up to it is equal.
        if at is not None and at == min(len(again), len(answer)) and abs(len(again) - len(answer)) == 1:
            at = None
        return Probe("regenerate", rollout_id, n, at is None, at)

    def stream(self, rollout_id: str, n: int, call: dict[str, Any]) -> Probe:
        body = chat_body(call, self.model)
        if body is None:
            return Probe("stream", rollout_id, n, None, note="not a chat call")
        whole = self._post("chat/completions", body)
        if whole.status_code != 200:
            return Probe("stream", rollout_id, n, None, note=_refused(whole))
        choice = (whole.json().get("choices") or [{}])[0]
        try:
            streamed = self._stream({**body, "stream": True})
        except ValueError as exc:
            return Probe("stream", rollout_id, n, None, note=str(exc))
        if isinstance(streamed, httpx.Response):
            return Probe("stream", rollout_id, n, None, note=_refused(streamed))
        ids, content, calls = streamed
        at = first_difference(ids, choice.get("token_ids") or [])
        if at is not None:
            return Probe("stream", rollout_id, n, False, at, "streamed answer ids differ")
        message = choice.get("message") or {}
        if _tool_calls(message.get("tool_calls") or []) != calls:
            return Probe("stream", rollout_id, n, False, None, "streamed tool calls differ")
        if (message.get("content") or "") != content:
            return Probe("stream", rollout_id, n, False, None, "streamed text differs")
        return Probe("stream", rollout_id, n, True)

    def _stream(self, body: dict[str, Any]) -> tuple[list[int], str, list[tuple[str, Any]]] | httpx.Response:
        """(answer ids, text, tool calls) assembled from a streamed chat answer."""
        ids: list[int] = []
        text: list[str] = []
        calls: dict[int, dict[str, str]] = {}
        try:
            with self.http.stream("POST", f"{self.base_url}/chat/completions", json=body) as response:
                if response.status_code != 200:
                    response.read()
                    return response
                for line in response.iter_lines():
                    if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                        continue
                    chunk = json.loads(line[5:])
                    if "error" in chunk:
                        raise ValueError(f"the stream answered an error: {chunk['error']}")
                    for choice in chunk.get("choices") or []:
                        ids += choice.get("token_ids") or []
                        delta = choice.get("delta") or {}
                        text.append(delta.get("content") or "")
                        for part in delta.get("tool_calls") or []:
                            slot = calls.setdefault(int(part.get("index", 0)), {"name": "", "arguments": ""})
                            function = part.get("function") or {}
                            slot["name"] += function.get("name") or ""
                            slot["arguments"] += function.get("arguments") or ""
        except httpx.HTTPError as exc:
            raise ServerUnreachable(f"streamed POST {self.base_url}/chat/completions: {exc}") from None
        assembled = [{"function": calls[i]} for i in sorted(calls)]
        return ids, "".join(text), _tool_calls(assembled)


def _tool_calls(calls: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    """(name, parsed arguments) of each call: what a harness acts on."""
    out: list[tuple[str, Any]] = []
    for call in calls:
        function = call.get("function") or {}
        try:
            arguments = json.loads(function.get("arguments") or "{}")
        except json.JSONDecodeError:
            arguments = function.get("arguments")
        out.append((function.get("name") or "", arguments))
    return out


def _refused(response: httpx.Response) -> str:
    return f"the server answered {response.status_code}: {response.text[:200]}"
