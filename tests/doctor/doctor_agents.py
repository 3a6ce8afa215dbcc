"""Small agents built to fail one check of `agl-doctor` each (run by the Controller, cwd here).

`DOCTOR_MODE` (the doctor's `--env`) picks the fault: `loop` (none: a tool loop that reports its
reward), `stream` (the same loop, streamed), `compact` (the conversation rewritten before the
second call), `no_reward` (never reports one), `crash` (raises after its first call), `bypass` (asks the model at `DOCTOR_UPSTREAM`,
not through the Gateway). The model answers `calculate` with a tool call, then `ANSWER: n`.
"""

from __future__ import annotations

import json
import os
from typing import Any

import httpx

SYSTEM = "Use the calculator, then answer as 'ANSWER: <number>'."
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculate",
            "description": "Evaluate an arithmetic expression.",
            "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
        },
    }
]


def calculate(expression: str) -> str:
    allowed = set("0123456789+-*/(). ")
    if not set(expression) <= allowed:
        return "error: numbers and + - * / only"
    return str(eval(expression))  # only digits and operators pass the check above


def _streamed(http: httpx.Client, url: str, body: dict[str, Any]) -> dict[str, Any]:
    """A streamed chat answer assembled into a message."""
    text = ""
    calls: dict[int, dict[str, Any]] = {}
    with http.stream("POST", url, json={**body, "stream": True}) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                continue
            for choice in json.loads(line[5:]).get("choices") or []:
                delta = choice.get("delta") or {}
                text += delta.get("content") or ""
                for part in delta.get("tool_calls") or []:
                    slot = calls.setdefault(
                        part["index"],
                        {"id": "", "type": "function", "function": {"name": "", "arguments": ""}},
                    )
                    slot["id"] += part.get("id") or ""
                    slot["function"]["name"] += (part.get("function") or {}).get("name") or ""
                    slot["function"]["arguments"] += (part.get("function") or {}).get("arguments") or ""
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return message


class DoctorAgent:
    def run(self) -> None:
        mode = os.environ.get("DOCTOR_MODE", "loop")
        key = os.environ.get("AGL_KEY", "")
        base = os.environ["DOCTOR_UPSTREAM"] if mode == "bypass" else os.environ["AGL_OPENAI_BASE_URL"]
        url = f"{base}/chat/completions"
        question = os.environ["QUESTION"]
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": question},
        ]
        answer = ""
        with httpx.Client(timeout=120.0, trust_env=False, headers={"Authorization": f"Bearer {key}"}) as http:
            for _ in range(3):
                body = {"model": "policy", "messages": messages, "tools": TOOLS, "max_tokens": 64}
                if mode == "stream":
                    message = _streamed(http, url, body)
                else:
                    response = http.post(url, json=body)
                    response.raise_for_status()
                    message = response.json()["choices"][0]["message"]
                if mode == "crash":
                    raise RuntimeError("the harness crashed after its first call")
                calls = message.get("tool_calls") or []
                if not calls:
                    answer = message.get("content") or ""
                    break
                messages.append(
                    {"role": "assistant", "content": message.get("content") or "", "tool_calls": calls}
                )
                for call in calls:
                    output = calculate(json.loads(call["function"]["arguments"])["expression"])
                    messages.append({"role": "tool", "tool_call_id": call["id"], "content": output})
                if mode == "compact":
                    # A compaction: the turns so far replaced by a summary of them.
                    messages = [
                        {"role": "system", "content": SYSTEM},
                        {"role": "user", "content": f"{question}\nSo far: the calculator said {output}."},
                    ]
            if mode != "no_reward":
                value = 1.0 if answer.strip().endswith(os.environ["ANSWER"]) else 0.0
                event = {"event_type": "reward", "data": {"value": value}}
                http.post(os.environ["AGL_EVENT_URL"], json=event).raise_for_status()
