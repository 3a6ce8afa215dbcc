"""Agents of bench/controller.py: one model call through the Gateway's proxy, one reward.

`TrivialAgent` uses only the standard library; `OpenAIAgent` (in controller_openai_agent.py)
imports the `openai` package, which costs about half a second per fresh interpreter.
"""

from __future__ import annotations

import json
import os
import time
import urllib.request


def post(url: str, body: dict) -> dict:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {os.environ['AGL_KEY']}"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


def reward(value: float, started: float, **extra: object) -> None:
    post(
        os.environ["AGL_EVENT_URL"],
        {"event_type": "reward", "data": {"value": value, "started": started, **extra}},
    )


class TrivialAgent:
    def run(self) -> None:
        started = time.time()
        answer = post(
            os.environ["AGL_OPENAI_BASE_URL"] + "/chat/completions",
            {
                "model": "policy",
                "messages": [{"role": "user", "content": os.environ.get("QUESTION", "2+2?")}],
            },
        )
        reward(1.0 if answer["choices"][0]["message"]["content"] else 0.0, started)
